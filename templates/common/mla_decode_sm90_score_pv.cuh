// MLA decode on sm_90a: the fp8 "score_pv" main loop (template parameter mainloop = score_pv;
// decode.mainloop_for picks it for fp8 works of 64 or 128 rows at page_size >= 64 with no mask, and
// tile_pairs for the other fp8 shapes above 32 rows). docs/DESIGN.md §9.5 has its design and
// measurements. It reuses tile_pairs' stages, producer, QK chunks and epilogue.
//
// 512 threads, four warpgroups with distinct roles:
//   warps 0..7  (threads 0..255)   two PV warpgroups; PV warpgroup c owns O^T rows (V columns)
//                                  [256c, 256c + 256) as tile_pairs' warpgroup c does, and they
//                                  run the epilogue (transposed_pv::write_output, whose
//                                  barriers are the 256 threads 0..255, as today)
//   warps 8..11 (threads 256..383) the scorer: QK of every tile (64 rows x 64 keys, three
//                                  promoted chunks of 6 k-steps), an exact per-tile online
//                                  softmax (it holds whole rows: the row max is a quad
//                                  shuffle), e4m3 P into a 2-slot ring, O^T's factor per row
//   warps 12..15                   the producer warpgroup (warp 12 issues the TMA copies of Q and
//                                  KV as in tile_pairs, warp 15 checks the inputs)
// setmaxnreg: producer 24, scorer 136, PV 176 (4 x 128 at the 512-thread launch bound). ptxas
// (CUDA 13.0, -Xptxas -v, 64 and 128 rows at page 64): 128 registers, 20 B spill stores / 20 B
// loads, no C75xx note; SASS puts the 20 B in the producer warp's code (24 registers), none in
// the scorer's or the PV warpgroups' loops. Scorer 120 (producer 40)
// spills nothing but serialises the wgmmas (C7512); PV 168 or 184 (scorer <= 120) C7512 too.
#pragma once
#include "mla_decode_sm90_tile_pairs.cuh"

namespace mla {
namespace score_pv {

constexpr int kPvThreads = 256;       // the two PV warpgroups (threads 0..255)
constexpr int kScorerThreads = 128;   // the scorer (threads 256..383)
constexpr int kConsumerThreads = kPvThreads + kScorerThreads;
constexpr int kBarPFull = 9;          // + slot
constexpr int kBarPEmpty = 11;        // + slot
constexpr int kBarF = 13;             // + slot
constexpr int kProducerRegs = 24;
constexpr int kScorerRegs = 136;
constexpr int kPvRegs = 176;
static_assert(kProducerRegs + kScorerRegs + 2 * kPvRegs <= 4 * 128, "the 512-thread launch bound's 128 registers a thread");

// tile_pairs' layout (Q, the 4-stage KV ring, the P slots at kOffP, the factor slots at
// kOffScale, kOffInv / kOffRed for write_output, the KV and Q barriers), plus the rows' l and m
// per work parity and their mbarriers.
template <int BlockN, int PageSize, bool Causal>
struct ScorePvConfig : tile_pairs::TilePairsConfig<BlockN, PageSize, Causal> {
  using B = tile_pairs::TilePairsConfig<BlockN, PageSize, Causal>;
  static constexpr int kOffLm = (B::kSmemBytes + 15) / 16 * 16;   // [2 parities][l, m][64] floats
  static constexpr int kOffLmBar = kOffLm + 2 * 2 * kRows * 4;    // lm_full[2], lm_empty[2]
  static constexpr int kSmemBytes = kOffLmBar + 4 * 8;
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

template <class C>
__device__ __forceinline__ float* lm_rows(uint8_t* smem, int parity, int which) {   // which 0: l, 1: m
  return reinterpret_cast<float*>(smem + C::kOffLm) + (parity * 2 + which) * kRows;
}
template <class C>
__device__ __forceinline__ uint32_t lm_full_bar(const uint8_t* smem, int parity) {
  return smem_addr(smem + C::kOffLmBar) + parity * 8;
}
template <class C>
__device__ __forceinline__ uint32_t lm_empty_bar(const uint8_t* smem, int parity) {
  return smem_addr(smem + C::kOffLmBar) + (2 + parity) * 8;
}

// Thread 0, with the other barriers: lm_full counts the scorer's threads, lm_empty the PV ones.
template <class C>
__device__ __forceinline__ void init_barriers(const uint8_t* smem) {
  for (int b = 0; b < 2; ++b) {
    wg::mbar_init(lm_full_bar<C>(smem, b), kScorerThreads);
    wg::mbar_init(lm_empty_bar<C>(smem, b), kPvThreads);
  }
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
// By the scorer (128 threads) after its QK of the tile, before its F(t) arrival: the PV
// warpgroups sync F(t) before their first ldmatrix of the stage (block 0's fragments load before
// P_full(t)). fence.proxy.async orders the zeros before the stage's next TMA fill.
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

// The scorer's tiles of one work (tokens [tok_start, tok_end), num_tiles tiles); seq: the
// CTA's tile counter; q_empty: the Q tile's release barrier (arrived after the last QK). On
// return P(last) is published and the rows' l (quad-summed) and m are in the lm buffer of
// parity `wpar` (the work's index among this CTA's works, mod 2); wuse: that buffer's use.
template <class C>
__device__ __forceinline__ void score_work(RowState& st, uint8_t* smem, uint32_t bar_full, uint32_t bar_empty,
                                           uint32_t q_empty, uint32_t& seq, int tok_start, int tok_end,
                                           int num_tiles, float scale_log2, int wpar, uint32_t wuse, int group,
                                           int lane) {
  constexpr int kS = C::kStages;
  // P(t) is published once it is written and QK(t + 1)'s last chunk is waited (so the proxy
  // fence's wait for P's stores likely overlaps that wait), and PV(t) runs under softmax(t + 1).
  // Tile t + 1's stage is refilled once PV(t - 3) has read its V, and P(t - 3) went out three
  // iterations before the wait for it. Only the 4-stage ring has run.
  const int r0 = group * 16 + (lane >> 2);
  const int tid = threadIdx.x - kPvThreads;
  // QK(t + 1)'s chunks 0 and 1 are issued before softmax(t), so the tensor cores run them under
  // the row maxima; once the rows' factors are out, chunk 1 is added and chunk 2 issued into its
  // accumulator, to run under the exponentials (S(t) and two QK accumulators live through the
  // softmax: three 32-float arrays at the peak, as before, what the scorer's 136 registers hold).
  // A work's last tile issues a dummy QK (discarded) on its own stage, both operands from the
  // stage, so that every iteration has the same wgmma groups (a wgmma issued under a branch
  // serialises them all); Q is released at once, that stage after the dummy is waited.
  const uint32_t q_addr = smem_addr(smem + C::kOffQ);
  float s[C::kSTiles][4];
  if (num_tiles > 0) qk_tile3<C>(s, smem, bar_full, tile_pairs::StageUse{static_cast<int>(seq % kS), (seq / kS) & 1});
  for (int t = 0; t < num_tiles; ++t, ++seq) {
    const tile_pairs::StageUse su{static_cast<int>(seq % kS), (seq / kS) & 1};
    const tile_pairs::StageUse su1{static_cast<int>((seq + 1) % kS), ((seq + 1) / kS) & 1};
    const int slot = seq & 1;
    const int tok = tok_start + t * C::BN;
    const bool last = t + 1 == num_tiles;
    if (last) {
      wg::mbar_arrive(q_empty);                                  // the work's last read of Q
      if (tok_end - tok < C::BN) zero_v_tail<C>(smem, su.stage, tok_end - tok, tid);
    } else {
      wg::mbar_arrive(bar_empty + su.stage * 8);                // K read
      wg::mbar_wait(bar_full + su1.stage * 8, su1.parity);      // tile t + 1's stage
    }
    AITER_MLA_STAMP(kKvWait);
    const uint32_t k_next = smem_addr(smem + C::kOffKv + (last ? su.stage : su1.stage) * C::kStageBytes);
    const uint32_t q_next = last ? k_next : q_addr;
    float sn[C::kSTiles][4], acc0[C::kSTiles][4];
    tile_pairs::qk_chunk<C, 0>(sn, q_next, k_next);
    tile_pairs::qk_chunk<C, 1>(acc0, q_next, k_next);
    AITER_MLA_STAMP(kQk);
    float mx[2];
    const float sc = masked_quad_max<C>(s, st, tok + (lane & 3) * 2, tok + C::BN, scale_log2, mx);
    float mref[2], f[2], sum[2] = {0.f, 0.f};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float m_new = fmaxf(st.m[h], mx[h]);
      mref[h] = tile_pairs::max_ref(m_new);
      f[h] = fast_exp2(st.m[h] - mref[h]);
      st.m[h] = m_new;
    }
    AITER_MLA_STAMP(kSoftmax);
    if (seq >= 2) nb_sync(kBarPEmpty + slot);                    // PV(seq - 2) is done with this slot
    AITER_MLA_STAMP(kHandover);
    if ((lane & 3) == 0) {
      float* fac = tile_pairs::row_factor<C>(smem, slot);
      fac[r0] = f[0];
      fac[r0 + 8] = f[1];
    }
    nb_arrive(kBarF + slot);                                     // O^T may be rescaled
    wg::wgmma_wait<0>();   // QK(t + 1)'s chunks 0-1
    wg::fence_operands(sn);
    wg::qk_add<C>(sn, acc0);
    tile_pairs::qk_chunk<C, 2>(acc0, q_next, k_next);
    AITER_MLA_STAMP(kQk);   // the wait for chunks 0-1 and chunk 2's issue
#pragma unroll
    for (int j = 0; j < C::kSTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[j][e] = fast_exp2(fmaf(s[j][e], sc, -mref[e >> 1]));
        sum[e >> 1] += s[j][e];
      }
    {
      uint8_t* pp = smem + C::kOffP + slot * C::kPBytes + transposed_pv::p_row(r0, (lane & 3) * 2);
#pragma unroll
      for (int j = 0; j < C::kSTiles; j += 2) {
        const uint32_t lo0 = fp8::e4m3x2(s[j][0], s[j][1]), hi0 = fp8::e4m3x2(s[j + 1][0], s[j + 1][1]);
        const uint32_t lo1 = fp8::e4m3x2(s[j][2], s[j][3]), hi1 = fp8::e4m3x2(s[j + 1][2], s[j + 1][3]);
        *reinterpret_cast<uint32_t*>(pp + transposed_pv::p_step(j)) = lo0 | (hi0 << 16);
        *reinterpret_cast<uint32_t*>(pp + 512 + transposed_pv::p_step(j)) = lo1 | (hi1 << 16);
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) st.l[h] = st.l[h] * f[h] + sum[h];
    AITER_MLA_STAMP(kSoftmax);
    {   // QK(t + 1)'s chunk 2, waited and added; P's stores are likely landed by its end
      wg::wgmma_wait<0>();
      wg::fence_operands(sn);
      wg::qk_add<C>(sn, acc0);
      wg::fence_operands(sn);
    }
    AITER_MLA_STAMP(kQk);   // chunk 2's wait and add
    wg::fence_proxy_async();   // P -> the PV wgmmas' B operand
    nb_arrive(kBarPFull + slot);                                 // P(t): its PV runs under softmax(t + 1)
    AITER_MLA_STAMP(kSoftmax);   // P's publication
    if (last) wg::mbar_arrive(bar_empty + su.stage * 8);       // K read (and the dummy's reads)
#pragma unroll
    for (int j = 0; j < C::kSTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] = sn[j][e];
  }
  // the rows' l and m for the PV warpgroups' epilogue
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    st.l[h] += __shfl_xor_sync(0xffffffffu, st.l[h], 1);
    st.l[h] += __shfl_xor_sync(0xffffffffu, st.l[h], 2);
  }
  wg::mbar_wait(lm_empty_bar<C>(smem, wpar), (wuse & 1) ^ 1);   // the epilogue of work - 2 read it
  if ((lane & 3) == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      lm_rows<C>(smem, wpar, 0)[r0 + 8 * h] = st.l[h];
      lm_rows<C>(smem, wpar, 1)[r0 + 8 * h] = st.m[h];
    }
  }
  wg::mbar_arrive(lm_full_bar<C>(smem, wpar));
}

// After the scorer's last work: the P_empty arrivals of the CTA's last two tiles, so that no
// named barrier is left with a pending generation.
__device__ __forceinline__ void score_finish(uint32_t seq) {
  for (uint32_t u = seq >= 2 ? seq - 2 : 0; u < seq; ++u) nb_sync(kBarPEmpty + (u & 1));
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

// The PV warpgroups' tiles of one work (see the header); seq: the CTA's tile counter.
template <class C>
__device__ __forceinline__ void pv_work(float (&o)[C::kOTiles][4], uint8_t* smem, uint32_t bar_full,
                                        uint32_t bar_empty, uint32_t& seq, int num_tiles, int half, int group,
                                        int lane) {
  static_assert(C::kMBlocks == 4 && C::BN == 64, "score_pv's PV: 4 m-blocks of 64 V columns, 2 k32 steps");
  constexpr int kS = C::kStages;
  const int m = lane >> 3, i = lane & 7;
  const uint32_t sw = static_cast<uint32_t>(i >> 1) & 3;   // (row / 2) % 4 of this lane's rows
  for (int t = 0; t < num_tiles; ++t, ++seq) {
    const tile_pairs::StageUse su{static_cast<int>(seq % kS), (seq / kS) & 1};
    const int slot = seq & 1;
    nb_sync(kBarF + slot);
    AITER_MLA_STAMP(kHandover);
    {
      float2 f[8];
      if (transposed_pv::load_factors<C>(f, smem, slot, lane)) {
#pragma unroll
        for (int mb = 0; mb < C::kMBlocks; ++mb) transposed_pv::scale_mblock(o, mb, f);
      }
    }
    wg::fence_operands(o);
    wg::mbar_wait(bar_full + su.stage * 8, su.parity);   // the stage's TMA bytes (long landed)
    const uint32_t src = smem_addr(smem + C::kOffKv + su.stage * C::kStageBytes) + (8 * m + i) * 64;
    uint32_t a[2][C::BN / 32][4];
    load_vt_mblock<C, 0>(a[0], src, sw, half, group);
    nb_sync(kBarPFull + slot);
    AITER_MLA_STAMP(kKvWait);
    const uint32_t pb = smem_addr(smem + C::kOffP + slot * C::kPBytes);
    pv_mblocks<C, 0>(o, a, src, sw, pb, bar_empty + su.stage * 8, half, group);
    wg::wgmma_wait<0>();
    wg::fence_operands(o);
    wg::fence_operands(a[0]);
    wg::fence_operands(a[1]);
    nb_arrive(kBarPEmpty + slot);
    AITER_MLA_STAMP(kPv);
  }
}

// The epilogue's row state from the scorer's lm buffer of parity wpar (use wuse): m for every
// thread, l on half 0's quad leaders only, so that transposed_pv::write_output's row_totals (quad
// sum, then + the other half's) gives exactly l.
template <class C>
__device__ __forceinline__ void pv_row_state(RowState& st, uint8_t* smem, int wpar, uint32_t wuse, int half,
                                             int group, int lane) {
  const int r0 = group * 16 + (lane >> 2);
  wg::mbar_wait(lm_full_bar<C>(smem, wpar), wuse & 1);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float l = lm_rows<C>(smem, wpar, 0)[r0 + 8 * h];
    st.m[h] = lm_rows<C>(smem, wpar, 1)[r0 + 8 * h];
    st.l[h] = half == 0 && (lane & 3) == 0 ? l : 0.f;
  }
  wg::mbar_arrive(lm_empty_bar<C>(smem, wpar));
}

}  // namespace score_pv
}  // namespace mla
