// MLA decode on sm_90a: the fp8 "score_pv" main loop (template parameter mainloop = score_pv;
// decode.mainloop_for picks it for fp8 works of 64 or 128 rows at page_size >= 64 with no mask, and
// tile_pairs for the other fp8 shapes above 32 rows). docs/DESIGN.md §9.5 has its design and
// measurements. It reuses tile_pairs' stages, producer, QK chunks and epilogue.
//
// 512 threads, four warpgroups with distinct roles:
//   warps 8..11 (threads 256..383) the scorer: QK of every tile (64 rows x 64 keys, three
//                                  promoted chunks of 6 k-steps) into the fp32 S slot of the
//                                  tile's parity; nothing else, so its next QK starts at once
//   warps 0..7  (threads 0..255)   two PV warpgroups. PV warpgroup w runs the online softmax of
//                                  the tiles of parity w (all 64 rows, from S in shared memory:
//                                  the row max chained through the other's m(t - 1)), writes
//                                  their e4m3 P and O^T factors, and adds every tile into its
//                                  256 V columns of O^T (V^T . P^T, as tile_pairs' warpgroup
//                                  w), in tile order: softmax(t) of its own tile, then PV(t - 1)
//                                  of the other's, then PV(t) after the next step's softmax.
//                                  So one warpgroup's softmax runs while the other's PVs and the
//                                  scorer's QK occupy the tensor cores. Then the epilogue
//                                  (transposed_pv::write_output, barriers over threads 0..255)
//   warps 12..15                   the producer warpgroup (warp 12 issues the TMA copies of Q and
//                                  KV as in tile_pairs, warp 15 checks the inputs)
// l is kept per warpgroup (against its own last reference) and merged at the work's end.
#pragma once
#include "mla_decode_sm90_tile_pairs.cuh"

namespace mla {
namespace score_pv {

constexpr int kPvThreads = 256;       // the two PV warpgroups (threads 0..255)
constexpr int kScorerThreads = 128;   // the scorer (threads 256..383)
constexpr int kConsumerThreads = kPvThreads + kScorerThreads;
constexpr int kBarSFull = 9;          // + w: S of a tile of parity w stored (the scorer arrives, PV warpgroup w syncs)
constexpr int kBarSEmpty = 11;        // + w: ... read (PV warpgroup w arrives, the scorer syncs)
constexpr int kBarMp = 13;            // + w: PV warpgroup w wrote m, P and F of its tile (w arrives, 1 - w syncs)
constexpr int kProducerRegs = 24;
#ifndef SPV_SR
#define SPV_SR 104
#define SPV_PR 192
#endif
constexpr int kScorerRegs = SPV_SR;
constexpr int kPvRegs = SPV_PR;
static_assert(kProducerRegs + kScorerRegs + 2 * kPvRegs <= 4 * 128, "the 512-thread launch bound's 128 registers a thread");

// tile_pairs' layout (Q, the 4-stage KV ring, the P slots at kOffP, the factor slots at
// kOffScale, kOffInv / kOffRed for write_output, the KV and Q barriers), plus two fp32 S slots,
// two m slots and the P_empty mbarriers. Slot w of S, P, F and m belongs to the tiles of
// parity w (the CTA's tile counter), so PV warpgroup w writes P, F and m slot w.
// S slot layout: the scorer's thread (group, lane) stores its s[8][4] as 8 float4s, float4 j at
// ((group 8 + j) 32 + lane); PV thread (group, lane) reads back the same values (rows
// 16 group + lane / 4, + 8). Each j is 32 lanes x 16 contiguous bytes (no bank conflict).
template <int BlockN, int PageSize, bool Causal>
struct ScorePvConfig : tile_pairs::TilePairsConfig<BlockN, PageSize, Causal> {
  using B = tile_pairs::TilePairsConfig<BlockN, PageSize, Causal>;
  static constexpr int kSBytes = kRows * B::BN * 4;                // one S slot, fp32
  static constexpr int kOffS = (B::kSmemBytes + 127) / 128 * 128;
  static constexpr int kOffM = kOffS + 2 * kSBytes;                // m(t) [2][64] floats
  static constexpr int kOffPEmpty = kOffM + 2 * kRows * 4;         // p_empty[2] mbarriers
  static constexpr int kSmemBytes = kOffPEmpty + 2 * 8;
  static_assert(B::kSwizzled && B::kQTma, "score_pv runs TMA stages (page_size >= 8; rendered at >= 64)");
  static_assert(B::kTmaRows == B::BN, "score_pv is rendered for pages holding a whole tile");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory tile does not fit an sm_90 CTA (227 KB)");
};

// Named barriers of 256 threads: the scorer with one PV warpgroup (S), or the two PV warpgroups (m, P, F).
__device__ __forceinline__ void nb_arrive(int id) { asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory"); }
__device__ __forceinline__ void nb_sync(int id) { asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory"); }

template <class C>
__device__ __forceinline__ float* m_slot(uint8_t* smem, int w) {
  return reinterpret_cast<float*>(smem + C::kOffM) + w * kRows;
}
// p_empty[w]: PV warpgroup 1 - w's 128 threads arrive once their PV of a tile of parity w is done
// (P, F and m slot w may be written again); warpgroup w waits before its next write of them.
template <class C>
__device__ __forceinline__ uint32_t p_empty_bar(const uint8_t* smem, int w) {
  return smem_addr(smem + C::kOffPEmpty) + w * 8;
}
template <class C>
__device__ __forceinline__ void init_barriers(const uint8_t* smem) {
  for (int w = 0; w < 2; ++w) wg::mbar_init(p_empty_bar<C>(smem, w), 128);
}

// ---- the scorer -------------------------------------------------------------------------------
// S = Q K(stage)^T over the whole tile, waited: the three chunks of tile_pairs::QkPlan issued
// back to back (S and two accumulators: no gap between chunks), added in chunk order (the
// same sums as tile_pairs::qk_tile).
template <class C>
__device__ __forceinline__ void qk_tile3(float (&s)[C::kSTiles][4], const uint8_t* smem, uint32_t bar_full,
                                         tile_pairs::StageUse su) {
  static_assert(tile_pairs::QkPlan::kChunks == 3, "qk_tile3 issues tile_pairs' three chunks");
  wg::mbar_wait(bar_full + su.stage * 8, su.parity);
  AITER_MLA_STAMP(kKvWait);
  const uint32_t q_addr = smem_addr(smem + C::kOffQ);
  const uint32_t k_addr = smem_addr(smem + C::kOffKv + su.stage * C::kStageBytes);
  float acc0[C::kSTiles][4], acc1[C::kSTiles][4];
  tile_pairs::qk_chunk<C, 0>(s, q_addr, k_addr);
  tile_pairs::qk_chunk<C, 1>(acc0, q_addr, k_addr);
  tile_pairs::qk_chunk<C, 2>(acc1, q_addr, k_addr);
  wg::wgmma_wait<1>();
  wg::fence_operands(s);
  wg::qk_add<C>(s, acc0);
  wg::wgmma_wait<0>();
  wg::qk_add<C>(s, acc1);
  wg::fence_operands(s);
}

// V rows [valid, BN) of a stage -> 0 (the 8 V column blocks of 64-byte rows; the RoPE block is
// K only). Past a work's end a page may hold anything (NaN), and P = 0 there must not meet it.
// By the scorer (128 threads) after its QK of the tile, before its S_full arrival: the PV
// warpgroups read the stage's V after that (the owner through S_full, the other through the
// owner's m/P arrival). fence.proxy.async orders the zeros before the stage's next TMA fill.
template <class C>
__device__ __forceinline__ void zero_v_tail(uint8_t* smem, int stage, int valid, int tid) {
  constexpr int kVBlocks = kVDim / C::kSwBytes;   // 8
  uint8_t* base = smem + C::kOffKv + stage * C::kStageBytes;
  const int chunks = (C::BN - valid) * kVBlocks * (C::kSwBytes / 16);
  for (int i = tid; i < chunks; i += kScorerThreads) {
    const int row = valid + i / (kVBlocks * (C::kSwBytes / 16));
    const int blk = (i / (C::kSwBytes / 16)) % kVBlocks, c = i % (C::kSwBytes / 16);
    *reinterpret_cast<uint4*>(base + blk * (C::BN * C::kSwBytes) + row * C::kSwBytes + c * 16) = make_uint4(0, 0, 0, 0);
  }
  wg::fence_proxy_async();
}

template <class C>
__device__ __forceinline__ float* s_slot(uint8_t* smem, int w, int group, int lane) {
  return reinterpret_cast<float*>(smem + C::kOffS + w * C::kSBytes) + (group * 8 * 32 + lane) * 4;
}

// The scorer's tiles of one work (num_tiles tiles, tokens from tok_start to tok_end); seq: the
// CTA's tile counter; q_empty: the Q tile's release barrier (arrived after the last QK).
template <class C>
__device__ __forceinline__ void score_work(uint8_t* smem, uint32_t bar_full, uint32_t bar_empty, uint32_t q_empty,
                                           uint32_t& seq, int tok_start, int tok_end, int num_tiles, int group,
                                           int lane) {
  static_assert(C::kSTiles == 8, "score_pv's S slot holds 64-key tiles");
  constexpr int kS = C::kStages;
  const int tid = threadIdx.x - kPvThreads;
  for (int t = 0; t < num_tiles; ++t, ++seq) {
    const tile_pairs::StageUse su{static_cast<int>(seq % kS), (seq / kS) & 1};
    const int w = seq & 1;
    const int tok = tok_start + t * C::BN;
    float s[C::kSTiles][4];
#ifdef SPV_QK3
    qk_tile3<C>(s, smem, bar_full, su);
#else
    tile_pairs::qk_tile<C>(s, smem, bar_full, su);
#endif
    if (t + 1 == num_tiles) {
      wg::mbar_arrive(q_empty);                                  // the work's last read of Q
      if (tok_end - tok < C::BN) zero_v_tail<C>(smem, su.stage, tok_end - tok, tid);
    }
    wg::mbar_arrive(bar_empty + su.stage * 8);                  // K read
    AITER_MLA_STAMP(kQk);
    if (seq >= 2) nb_sync(kBarSEmpty + w);                       // S(seq - 2) is read
    AITER_MLA_STAMP(kHandover);
    float* dst = s_slot<C>(smem, w, group, lane);
#pragma unroll
    for (int j = 0; j < C::kSTiles; ++j) *reinterpret_cast<float4*>(dst + j * 128) = make_float4(s[j][0], s[j][1], s[j][2], s[j][3]);
    nb_arrive(kBarSFull + w);
    AITER_MLA_STAMP(kSoftmax);
  }
}

// After the scorer's last work: the S_empty syncs of the CTA's last two tiles, so that no
// named barrier is left with a pending generation.
__device__ __forceinline__ void score_finish(uint32_t seq) {
  for (uint32_t u = seq >= 2 ? seq - 2 : 0; u < seq; ++u) nb_sync(kBarSEmpty + (u & 1));
}

// ---- the PV warpgroups --------------------------------------------------------------------------
// This warp's V^T fragments of m-block MB (both k32 steps) from the stage at stage_addr
// (transposed_pv::load_vt_frags_impl without the tail mask: the scorer zeroed the tail rows).
template <class C, int MB>
__device__ __forceinline__ void load_vt_mblock(uint32_t (&a)[C::BN / 32][4], uint32_t src, uint32_t sw, int half,
                                               int group) {
  const int x = 16 * half + 4 * MB + group;   // 16-column chunk of V
#pragma unroll
  for (int kk = 0; kk < C::BN / 32; ++kk) {
    uint32_t d[4];
    ldmatrix_x4_trans(d, src + (x >> 2) * (C::BN * 64) + kk * 32 * 64 + (((x & 3) ^ sw) << 4));
    a[kk][0] = fp8::prmt(d[0], d[1], 0x6420);
    a[kk][1] = fp8::prmt(d[0], d[1], 0x7531);
    a[kk][2] = fp8::prmt(d[2], d[3], 0x6420);
    a[kk][3] = fp8::prmt(d[2], d[3], 0x7531);
  }
}

// m-blocks MB.. of one tile: block MB's wgmmas go out as one commit group with fragments
// a[MB & 1]; block MB + 1's fragments load under them (after the group of MB - 1, which read
// a[(MB + 1) & 1], is waited).
template <class C, int MB>
__device__ __forceinline__ void pv_mblocks(float (&o)[C::kOTiles][4], uint32_t (&a)[2][C::BN / 32][4], uint32_t src,
                                           uint32_t sw, uint32_t pb, uint32_t v_empty, int half, int group) {
  if constexpr (MB < C::kMBlocks) {
    wg::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < C::BN / 32; ++kk)
      transposed_pv::wgmma_pv_t<MB>(o, a[MB & 1][kk], wg::make_desc(pb + kk * 256, 128, 512));
    wg::wgmma_commit();
    if constexpr (MB + 1 < C::kMBlocks) {
      if constexpr (MB >= 1) {
        wg::wgmma_wait<1>();            // block MB - 1 is done with a[(MB + 1) & 1]
        wg::fence_operands(a[(MB + 1) & 1]);
      }
      load_vt_mblock<C, MB + 1>(a[(MB + 1) & 1], src, sw, half, group);
      if constexpr (MB + 2 == C::kMBlocks) wg::mbar_arrive(v_empty);   // this thread's V reads are done
    }
    pv_mblocks<C, MB + 1>(o, a, src, sw, pb, v_empty, half, group);
  }
}

// A PV warpgroup's rows (the S layout: rows r0 = 16 group + lane / 4 and r0 + 8): st.m the
// running max as of the last softmax it ran or merged, st.l its own tiles' partial sums against
// lref (the row max at its last own tile; -inf while the row has seen no key, when st.l is 0),
// key_end / full_end as RowState.
struct PvRows {
  RowState st;
  float lref[2];
};

// Softmax of tile `seq` (parity w = this warpgroup): S from slot w, the row max merged with
// m(t - 1) from slot 1 - w (after the other's m/P arrival; `first`: the work's first tile, m =
// -inf), then m(t), F(t) = 2^(m(t - 1) - ref) and e4m3 P(t) into slot w, l += p against ref.
template <class C>
__device__ __forceinline__ void softmax_own(PvRows& r, uint32_t& puse, uint8_t* smem, int w, bool first, int tok,
                                            float scale_log2, int group, int lane) {
  const int r0 = group * 16 + (lane >> 2);
  nb_sync(kBarSFull + w);
  AITER_MLA_STAMP(kHandover);
  float s[C::kSTiles][4];
  {
    const float* src = s_slot<C>(smem, w, group, lane);
#pragma unroll
    for (int j = 0; j < C::kSTiles; ++j) {
      const float4 x = *reinterpret_cast<const float4*>(src + j * 128);
      s[j][0] = x.x;
      s[j][1] = x.y;
      s[j][2] = x.z;
      s[j][3] = x.w;
    }
  }
  nb_arrive(kBarSEmpty + w);   // S is in registers
  float mx[2];
  const float sc = masked_quad_max<C>(s, r.st, tok + (lane & 3) * 2, tok + C::BN, scale_log2, mx);
  float m_prev[2] = {-INFINITY, -INFINITY};
  if (!first) {
    nb_sync(kBarMp + (w ^ 1));   // the other's m(t - 1), P(t - 1), F(t - 1)
    m_prev[0] = m_slot<C>(smem, w ^ 1)[r0];
    m_prev[1] = m_slot<C>(smem, w ^ 1)[r0 + 8];
  }
  AITER_MLA_STAMP(kKvWait);
  float mref[2], f[2], g[2], sum[2] = {0.f, 0.f};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float m_new = fmaxf(m_prev[h], mx[h]);
    mref[h] = tile_pairs::max_ref(m_new);
    f[h] = fast_exp2(m_prev[h] - mref[h]);
    g[h] = fast_exp2(r.lref[h] - mref[h]);   // this warpgroup's l to the new reference (0 from -inf)
    r.st.m[h] = m_new;
  }
  if (puse > 0) wg::mbar_wait(p_empty_bar<C>(smem, w), (puse - 1) & 1);   // the other's PV of slot w's last tile
  ++puse;
  if ((lane & 3) == 0) {
    float* fac = tile_pairs::row_factor<C>(smem, w);
    fac[r0] = f[0];
    fac[r0 + 8] = f[1];
    m_slot<C>(smem, w)[r0] = r.st.m[0];
    m_slot<C>(smem, w)[r0 + 8] = r.st.m[1];
  }
#pragma unroll
  for (int j = 0; j < C::kSTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[j][e] = fast_exp2(fmaf(s[j][e], sc, -mref[e >> 1]));
      sum[e >> 1] += s[j][e];
    }
  {
    uint8_t* pp = smem + C::kOffP + w * C::kPBytes + transposed_pv::p_row(r0, (lane & 3) * 2);
#pragma unroll
    for (int j = 0; j < C::kSTiles; j += 2) {
      const uint32_t lo0 = fp8::e4m3x2(s[j][0], s[j][1]), hi0 = fp8::e4m3x2(s[j + 1][0], s[j + 1][1]);
      const uint32_t lo1 = fp8::e4m3x2(s[j][2], s[j][3]), hi1 = fp8::e4m3x2(s[j + 1][2], s[j + 1][3]);
      *reinterpret_cast<uint32_t*>(pp + transposed_pv::p_step(j)) = lo0 | (hi0 << 16);
      *reinterpret_cast<uint32_t*>(pp + 512 + transposed_pv::p_step(j)) = lo1 | (hi1 << 16);
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    r.st.l[h] = r.st.l[h] * g[h] + sum[h];
    r.lref[h] = r.st.m[h];
  }
  wg::fence_proxy_async();   // P -> the PV wgmmas' B operand
  nb_arrive(kBarMp + w);
  wg::wg_sync(w);            // every row's P(t) and F(t) before this warpgroup's own rescale and PV(t)
  AITER_MLA_STAMP(kSoftmax);
}

// PV of tile `seq` (parity tw) into this warpgroup's O^T columns: rescale by F(tw), V^T . P(tw)^T,
// waited; then, for the other's tile, this warpgroup's arrival on its p_empty.
template <class C>
__device__ __forceinline__ void pv_tile(float (&o)[C::kOTiles][4], uint8_t* smem, uint32_t bar_full,
                                        uint32_t bar_empty, uint32_t seq, int w, int group, int lane) {
  constexpr int kS = C::kStages;
  const tile_pairs::StageUse su{static_cast<int>(seq % kS), (seq / kS) & 1};
  const int tw = seq & 1;
  {
    float2 f[8];
    if (transposed_pv::load_factors<C>(f, smem, tw, lane)) {
#pragma unroll
      for (int mb = 0; mb < C::kMBlocks; ++mb) transposed_pv::scale_mblock(o, mb, f);
    }
  }
  wg::fence_operands(o);
  wg::mbar_wait(bar_full + su.stage * 8, su.parity);   // the stage's TMA bytes (long landed)
  const int m = lane >> 3, i = lane & 7;
  const uint32_t sw = static_cast<uint32_t>(i >> 1) & 3;   // (row / 2) % 4 of this lane's rows
  const uint32_t src = smem_addr(smem + C::kOffKv + su.stage * C::kStageBytes) + (8 * m + i) * 64;
  uint32_t a[2][C::BN / 32][4];
  load_vt_mblock<C, 0>(a[0], src, sw, w, group);
  const uint32_t pb = smem_addr(smem + C::kOffP + tw * C::kPBytes);
  pv_mblocks<C, 0>(o, a, src, sw, pb, bar_empty + su.stage * 8, w, group);
  wg::wgmma_wait<0>();
  wg::fence_operands(o);
  wg::fence_operands(a[0]);
  wg::fence_operands(a[1]);
  if (tw != w) wg::mbar_arrive(p_empty_bar<C>(smem, tw));   // done with the other's P, F slot
  AITER_MLA_STAMP(kPv);
}

// The PV warpgroups' tiles of one work (see the header); seq: the CTA's tile counter. On return
// r.st holds, for the epilogue, m = the work's final max and l = this warpgroup's partial sums
// against its reference (row_totals adds the two warpgroups' quad sums).
template <class C>
__device__ __forceinline__ void pv_work(float (&o)[C::kOTiles][4], PvRows& r, uint32_t& puse, uint8_t* smem,
                                        uint32_t bar_full, uint32_t bar_empty, uint32_t& seq, int tok_start, int num_tiles,
                                        float scale_log2, int w, int group, int lane) {
  static_assert(C::kMBlocks == 4 && C::BN == 64, "score_pv's PV: 4 m-blocks of 64 V columns, 2 k32 steps");
  if (num_tiles <= 0) return;
  if ((seq & 1) == w) softmax_own<C>(r, puse, smem, w, true, tok_start, scale_log2, group, lane);
  for (int t = 1; t < num_tiles; ++t) {
    if (((seq + t) & 1) == w) softmax_own<C>(r, puse, smem, w, false, tok_start + t * C::BN, scale_log2, group, lane);
    pv_tile<C>(o, smem, bar_full, bar_empty, seq + t - 1, w, group, lane);
  }
  const uint32_t last = seq + num_tiles - 1;
  if ((last & 1) != w) {   // the other's last tile: its m/P arrival, and the work's final max
    nb_sync(kBarMp + (w ^ 1));
    const int r0 = group * 16 + (lane >> 2);
    r.st.m[0] = m_slot<C>(smem, w ^ 1)[r0];
    r.st.m[1] = m_slot<C>(smem, w ^ 1)[r0 + 8];
  }
  pv_tile<C>(o, smem, bar_full, bar_empty, last, w, group, lane);
  seq += num_tiles;
#pragma unroll
  for (int h = 0; h < 2; ++h) r.st.l[h] *= fast_exp2(r.lref[h] - tile_pairs::max_ref(r.st.m[h]));
}

}  // namespace score_pv
}  // namespace mla
