// MLA decode on sm_90a: the fp8 "score_pv" main loop (template parameter mainloop = score_pv;
// decode.mainloop_for picks it for fp8 works of 64 or 128 rows at page_size >= 64 with no mask, and
// tile_pairs for the other fp8 shapes above 32 rows). docs/DESIGN.md §9.5 has its design and
// measurements. It reuses tile_pairs' stages, producer, QK chunks and epilogue.
//
// 512 threads, four warpgroups with distinct roles:
//   warps 0..7  (threads 0..255)   two PV warpgroups. Each runs the online softmax of half of the
//                                  CTA's rows (PV warpgroup c: rows [32c, 32c + 32), a row per
//                                  quad) from S in shared memory, writes its rows' e4m3 P and O^T
//                                  factors, meets the other at one 256-thread barrier a tile, and
//                                  adds the tile into its 256 V columns of O^T (V^T . P^T, as
//                                  tile_pairs' warpgroup c); then the epilogue
//                                  (transposed_pv::write_output, barriers over threads 0..255)
//   warps 8..11 (threads 256..383) the scorer: QK of every tile (64 rows x 64 keys, three
//                                  promoted chunks of 6 k-steps) into a 2-slot ring of fp32 S in
//                                  shared memory; nothing else, so its next QK starts while the
//                                  PV warpgroups run this tile's softmax and PV
//   warps 12..15                   the producer warpgroup (warp 12 issues the TMA copies of Q and
//                                  KV as in tile_pairs, warp 15 checks the inputs)
// The chain a tile is the longer of the scorer's QK + S store and a PV warpgroup's half softmax
// + PV; shared memory carries S (16 KB written and read a tile) instead of the softmax's
// exponentials sitting between two QKs.
#pragma once
#include "mla_decode_sm90_tile_pairs.cuh"

namespace mla {
namespace score_pv {

constexpr int kPvThreads = 256;       // the two PV warpgroups (threads 0..255)
constexpr int kScorerThreads = 128;   // the scorer (threads 256..383)
constexpr int kConsumerThreads = kPvThreads + kScorerThreads;
constexpr int kBarSFull = 9;          // + slot: S(t) stored (the scorer arrives, the PV warpgroups sync)
constexpr int kBarSEmpty = 11;        // + slot: S(t) read (the PV warpgroups arrive, the scorer syncs)
constexpr int kBarTile = 13;          // the PV warpgroups a tile (256 threads): P(t) and F(t) written
constexpr int kProducerRegs = 24;
#define SPV_SR 112
#define SPV_PR 184
#define SPV_QK2
constexpr int kScorerRegs = SPV_SR;
constexpr int kPvRegs = SPV_PR;
static_assert(kProducerRegs + kScorerRegs + 2 * kPvRegs <= 4 * 128, "the 512-thread launch bound's 128 registers a thread");

// tile_pairs' layout (Q, the 4-stage KV ring, the P slots at kOffP, the factor slots at
// kOffScale, kOffInv / kOffRed for write_output, the KV and Q barriers), plus two fp32 S slots
// and the rows' l and m for the epilogue.
// S slot layout: the scorer's warp g, row half h (rows 16g + lane/4 + 8h), float4 k of lane:
// floats ((2g + h) 4 + k) 128 + 4 lane .. + 3 = its S values (n8 tile 2k: e, e + 1; tile 2k + 1:
// e, e + 1) of that row. Each float4 index k is 32 lanes x 16 contiguous bytes (no bank conflict).
template <int BlockN, int PageSize, bool Causal>
struct ScorePvConfig : tile_pairs::TilePairsConfig<BlockN, PageSize, Causal> {
  using B = tile_pairs::TilePairsConfig<BlockN, PageSize, Causal>;
  static constexpr int kSBytes = kRows * B::BN * 4;                // one S slot, fp32
  static constexpr int kOffS = (B::kSmemBytes + 127) / 128 * 128;
  static constexpr int kOffLm = kOffS + 2 * kSBytes;               // [l, m][64] floats
  static constexpr int kSmemBytes = kOffLm + 2 * kRows * 4;
  static_assert(B::kSwizzled && B::kQTma, "score_pv runs TMA stages (page_size >= 8; rendered at >= 64)");
  static_assert(B::kTmaRows == B::BN, "score_pv is rendered for pages holding a whole tile");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory tile does not fit an sm_90 CTA (227 KB)");
};

__device__ __forceinline__ void nb_arrive(int id) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(kConsumerThreads) : "memory");
}
__device__ __forceinline__ void nb_sync(int id) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(kConsumerThreads) : "memory");
}
__device__ __forceinline__ void tile_sync() { asm volatile("bar.sync %0, %1;\n" ::"n"(kBarTile), "n"(kPvThreads) : "memory"); }

template <class C>
__device__ __forceinline__ float* lm_rows(uint8_t* smem, int which) {   // which 0: l, 1: m
  return reinterpret_cast<float*>(smem + C::kOffLm) + which * kRows;
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
// By the scorer (128 threads) after its QK of the tile, before its S_full(t) arrival: the PV
// warpgroups sync S_full(t) before their first ldmatrix of the stage. fence.proxy.async orders
// the zeros before the stage's next TMA fill.
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

// The scorer's S into slot `slot` (the layout at ScorePvConfig).
template <class C>
__device__ __forceinline__ void store_s(const float (&s)[C::kSTiles][4], uint8_t* smem, int slot, int group, int lane) {
  float* base = reinterpret_cast<float*>(smem + C::kOffS + slot * C::kSBytes) + group * 8 * 128 + lane * 4;
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int k = 0; k < 4; ++k)
      *reinterpret_cast<float4*>(base + (h * 4 + k) * 128) =
          make_float4(s[2 * k][2 * h], s[2 * k][2 * h + 1], s[2 * k + 1][2 * h], s[2 * k + 1][2 * h + 1]);
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
    const int slot = seq & 1;
    const int tok = tok_start + t * C::BN;
    float s[C::kSTiles][4];
#ifdef SPV_QK2
    tile_pairs::qk_tile<C>(s, smem, bar_full, su);
#else
    qk_tile3<C>(s, smem, bar_full, su);
#endif
    if (t + 1 == num_tiles) {
      wg::mbar_arrive(q_empty);                                  // the work's last read of Q
      if (tok_end - tok < C::BN) zero_v_tail<C>(smem, su.stage, tok_end - tok, tid);
    }
    wg::mbar_arrive(bar_empty + su.stage * 8);                  // K read
    AITER_MLA_STAMP(kQk);
    if (seq >= 2) nb_sync(kBarSEmpty + slot);                    // S(seq - 2) is read
    AITER_MLA_STAMP(kHandover);
    store_s<C>(s, smem, slot, group, lane);
    nb_arrive(kBarSFull + slot);
    AITER_MLA_STAMP(kSoftmax);
  }
}

// After the scorer's last work: the S_empty arrivals of the CTA's last two tiles, so that no
// named barrier is left with a pending generation.
__device__ __forceinline__ void score_finish(uint32_t seq) {
  for (uint32_t u = seq >= 2 ? seq - 2 : 0; u < seq; ++u) nb_sync(kBarSEmpty + (u & 1));
}

// ---- the PV warpgroups --------------------------------------------------------------------------
// A PV thread's softmax row: row 32 half + 8 group + lane / 4 of the CTA (the scorer's warp
// 2 half + group / 2, row half group % 2), keys 16 k + 2 (lane % 4) + {0, 1} and + 8 of each
// 16-key block k in its four float4s of S.
struct PvRow {
  float m;        // running max, log2 units (the same in the row's quad)
  float l;        // partial row sum over this thread's keys
  int key_end;    // first invisible token of the row (tail / invalid row)
  int full_end;   // a tile ending at or before it needs no key mask
};

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

// One tile's softmax for this thread's row from S slot `slot`: masks keys at or past key_end
// (unless the tile ends by full_end), p = 2^(s sc - m_ref) against the row's new running max,
// P as e4m3 into P slot `slot`, the O^T factor 2^(m_old - m_ref) into factor slot `slot`
// (quad leader), l = l f + sum p.
template <class C>
__device__ __forceinline__ void softmax_row(PvRow& st, uint8_t* smem, int slot, int tok, float scale_log2, int half,
                                            int group, int lane) {
  const int row = 32 * half + 8 * group + (lane >> 2);
  float v[4][4];
  {
    const float* src = reinterpret_cast<const float*>(smem + C::kOffS + slot * C::kSBytes) +
                       ((2 * half + (group >> 1)) * 2 + (group & 1)) * 4 * 128 + lane * 4;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float4 x = *reinterpret_cast<const float4*>(src + k * 128);
      v[k][0] = x.x;
      v[k][1] = x.y;
      v[k][2] = x.z;
      v[k][3] = x.w;
    }
  }
  nb_arrive(kBarSEmpty + slot);   // S(t) is in registers
  AITER_MLA_STAMP(kKvWait);
  float mx = -INFINITY, sc = 1.f;
  if (tok + C::BN <= st.full_end && scale_log2 > 0.f) {
#pragma unroll
    for (int k = 0; k < 4; ++k)
#pragma unroll
      for (int e = 0; e < 4; ++e) mx = fmaxf(mx, v[k][e]);
    sc = scale_log2;
  } else {
    const int kbase = tok + 2 * (lane & 3);
#pragma unroll
    for (int k = 0; k < 4; ++k)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = kbase + 16 * k + 8 * (e >> 1) + (e & 1);
        v[k][e] = key < st.key_end ? v[k][e] * scale_log2 : -INFINITY;
        mx = fmaxf(mx, v[k][e]);
      }
  }
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  mx *= sc;
  const float m_new = fmaxf(st.m, mx);
  const float mref = tile_pairs::max_ref(m_new);
  const float f = fast_exp2(st.m - mref);
  st.m = m_new;
  if ((lane & 3) == 0) tile_pairs::row_factor<C>(smem, slot)[row] = f;
  float sum = 0.f;
  uint8_t* pp = smem + C::kOffP + slot * C::kPBytes + transposed_pv::p_row(row, 2 * (lane & 3));
#pragma unroll
  for (int k = 0; k < 4; ++k) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      v[k][e] = fast_exp2(fmaf(v[k][e], sc, -mref));
      sum += v[k][e];
    }
    const uint32_t lo = fp8::e4m3x2(v[k][0], v[k][1]), hi = fp8::e4m3x2(v[k][2], v[k][3]);
    *reinterpret_cast<uint32_t*>(pp + transposed_pv::p_step(2 * k)) = lo | (hi << 16);
  }
  st.l = st.l * f + sum;
  wg::fence_proxy_async();   // P -> the PV wgmmas' B operand
}

// The PV warpgroups' tiles of one work (see the header); seq: the CTA's tile counter.
template <class C>
__device__ __forceinline__ void pv_work(float (&o)[C::kOTiles][4], PvRow& st, uint8_t* smem, uint32_t bar_full,
                                        uint32_t bar_empty, uint32_t& seq, int tok_start, int num_tiles,
                                        float scale_log2, int half, int group, int lane) {
  static_assert(C::kMBlocks == 4 && C::BN == 64, "score_pv's PV: 4 m-blocks of 64 V columns, 2 k32 steps");
  constexpr int kS = C::kStages;
  const int m = lane >> 3, i = lane & 7;
  const uint32_t sw = static_cast<uint32_t>(i >> 1) & 3;   // (row / 2) % 4 of this lane's rows
  for (int t = 0; t < num_tiles; ++t, ++seq) {
    const tile_pairs::StageUse su{static_cast<int>(seq % kS), (seq / kS) & 1};
    const int slot = seq & 1;
    nb_sync(kBarSFull + slot);
    AITER_MLA_STAMP(kHandover);
    softmax_row<C>(st, smem, slot, tok_start + t * C::BN, scale_log2, half, group, lane);
    AITER_MLA_STAMP(kSoftmax);
    wg::mbar_wait(bar_full + su.stage * 8, su.parity);   // the stage's TMA bytes (long landed)
    const uint32_t src = smem_addr(smem + C::kOffKv + su.stage * C::kStageBytes) + (8 * m + i) * 64;
    uint32_t a[2][C::BN / 32][4];
    load_vt_mblock<C, 0>(a[0], src, sw, half, group);
    tile_sync();   // every row's P(t) and factor are written
    {
      float2 f[8];
      if (transposed_pv::load_factors<C>(f, smem, slot, lane)) {
#pragma unroll
        for (int mb = 0; mb < C::kMBlocks; ++mb) transposed_pv::scale_mblock(o, mb, f);
      }
    }
    wg::fence_operands(o);
    AITER_MLA_STAMP(kKvWait);
    const uint32_t pb = smem_addr(smem + C::kOffP + slot * C::kPBytes);
    pv_mblocks<C, 0>(o, a, src, sw, pb, bar_empty + su.stage * 8, half, group);
    wg::wgmma_wait<0>();
    wg::fence_operands(o);
    wg::fence_operands(a[0]);
    wg::fence_operands(a[1]);
    AITER_MLA_STAMP(kPv);
  }
}

// The epilogue's row state (transposed_pv::write_output's S layout: rows group * 16 + lane / 4
// + 8 h) from the PV threads' rows through shared memory: m for every thread, l on half 0's
// quad leaders only, so that row_totals (quad sum, then + the other half's) gives exactly l.
// The next work's writes come after its consumer_sync.
template <class C>
__device__ __forceinline__ void pv_row_state(RowState& out, PvRow& st, uint8_t* smem, int half, int group,
                                             int lane) {
  st.l += __shfl_xor_sync(0xffffffffu, st.l, 1);
  st.l += __shfl_xor_sync(0xffffffffu, st.l, 2);
  if ((lane & 3) == 0) {
    const int row = 32 * half + 8 * group + (lane >> 2);
    lm_rows<C>(smem, 0)[row] = st.l;
    lm_rows<C>(smem, 1)[row] = st.m;
  }
  tile_sync();
  const int r0 = group * 16 + (lane >> 2);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float l = lm_rows<C>(smem, 0)[r0 + 8 * h];
    out.m[h] = lm_rows<C>(smem, 1)[r0 + 8 * h];
    out.l[h] = half == 0 && (lane & 3) == 0 ? l : 0.f;
  }
}

}  // namespace score_pv
}  // namespace mla
