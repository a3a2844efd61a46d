// MLA decode on sm_90a: the fp8 "tile pairs" main loop (template parameter mainloop =
// "tile_pairs", more than 32 rows).
//
// The KV tiles go in pairs (a, b) and each consumer warpgroup scores a whole tile (QK at
// N = 64, so Q is read once per 64 keys per warpgroup: 72 KB of operand reads per tile, against
// 108 KB when both warpgroups score half of every tile at N = 32):
//   warpgroup 0                                warpgroup 1
//   S_a = Q K_a^T, m_loc,a = max(m, max S_a)   S_b = Q K_b^T, m_loc,b = max(m, max S_b)
//   p_a = 2^(S_a - m_loc,a) in fp32            p_b = 2^(S_b - m_loc,b) in fp32
//   ---------- exchange m_loc only (shared memory, consumer barrier) ----------
//   M = max(m_loc,a, m_loc,b); each scales its fp32 p by g = 2^(m_loc - M) and rounds it to
//   e4m3 (P_a, P_b); l = l 2^(m - M) + g sum(p); O^T's factor 2^(m - M) -> shared memory
//   ---------- consumer barrier: P_a, P_b, factors written ----------
//   O_L *= 2^(m - M); O_L += V_a,L^T P_a^T     O_R *= 2^(m - M); O_R += V_a,R^T P_a^T
//   O_L += V_b,L^T P_b^T                       O_R += V_b,R^T P_b^T
// Both softmaxes run at once and O^T is rescaled once a pair; the warpgroups meet twice a
// pair, and still run in lockstep. PV_a and PV_b go out as one commit group, the rescale of
// each O^T m-block just before its four wgmmas (pv_pair). p = 1 stays exact in the tile that
// holds M. Numerics: every p is taken against the pair's max, not the running max at its own
// tile, so one tile of each pair is rounded against its partner's max; results move with the
// schedule's split points by 1.4-1.7x the per-tile rounding noise, at the same error against
// float64 (docs/perf/notes.md, issue 6 change 18). A work's odd last tile is split between the
// warpgroups by keys (`single`, below). O^T, P, V^T fragments and the epilogue are
// mla_decode_sm90_transposed_pv.cuh's; warpgroup c owns V columns [256c, 256c + 256). Every
// wgmma is waited inside `pair` (and `single`): none is in flight across the loop's back edge
// (else ptxas serializes every wgmma: C7514).
#pragma once
#include "mla_decode_sm90_transposed_pv.cuh"

namespace mla {
namespace tile_pairs {

template <int BlockN, int PageSize, bool Causal>
struct TilePairsConfig : fp8::TmaTile<BlockN, PageSize, Causal> {
  using T = fp8::TmaTile<BlockN, PageSize, Causal>;
  using T::BN;
  static constexpr int kSTiles = BN / 8;               // n8 tiles of S per thread: N = BN per warpgroup
  static constexpr int kStages = 4;                   // KV ring
  static constexpr int kMBlocks = kVDim / 2 / 64;     // m64 blocks of O^T per warpgroup
  static constexpr int kPBytes = kRows * BN;          // one P buffer (transposed_pv::p_offset layout)
  static constexpr int kOffP = T::kOffKv + kStages * T::kStageBytes;   // P_a, P_b
  static constexpr int kOffScale = kOffP + 2 * kPBytes;               // O^T's factors [2][64]: the pair's (buffer 0), the odd last tile's (buffer 1, `single`)
  static constexpr int kOffMax = kOffScale + 2 * kRows * 4;           // m_loc of warpgroup 0 [64], of warpgroup 1 [64]
  static constexpr int kOffInv = kOffMax + 2 * kRows * 4;             // [64] out_scale / l (transposed_pv::write_output)
  static constexpr int kOffRed = kOffInv + kRows * 4;
  static constexpr int kOffBar = kOffRed + T::kRedBytes;              // full[kStages], empty[kStages]
  static constexpr int kOffQBar = kOffBar + 2 * kStages * 8;          // q_full, q_empty (kQTma)
  static constexpr int kSmemBytes = kOffQBar + 2 * 8;
  // With TMA stages the producer copies Q too, first of each work, in the stage layout: no
  // consumer cp.async of Q, whose issue stalled behind the KV copies.
  static constexpr bool kQTma = T::kSwizzled;
  static_assert(BN == 64, "the tile_pairs loop scores 64-key tiles (m64n64 QK)");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory tile does not fit an sm_90 CTA (227 KB)");
  static_assert(T::kOffKv % 512 == 0 && kOffP % 128 == 0, "operand tiles are aligned");
};

// Reference a row's probabilities are taken against: its max, or 0 while the max is -inf (then
// p = 0 and every factor 2^(m_old - ref) is 0: no -inf - -inf).
__device__ __forceinline__ float max_ref(float m) { return m == -INFINITY ? 0.f : m; }

// Row values [which][64] through shared memory: row_factor(0) holds O^T's factor of the pair
// (transposed_pv::rescale_ot's buffer 0), row_max(half) warpgroup half's m_loc.
template <class C>
__device__ __forceinline__ float* row_factor(uint8_t* smem, int which) {
  return reinterpret_cast<float*>(smem + C::kOffScale) + which * kRows;
}
template <class C>
__device__ __forceinline__ float* row_max(uint8_t* smem, int which) {
  return reinterpret_cast<float*>(smem + C::kOffMax) + which * kRows;
}

// One KV stage of the ring: its smem index, the parity of its full barrier for this use.
struct StageUse {
  int stage;
  uint32_t parity;
};

template <class C>
__device__ __forceinline__ void pv_wait(float (&o)[C::kOTiles][4], uint32_t (&a)[C::kMBlocks][C::BN / 32][4]) {
  wg::wgmma_wait<0>();
  wg::fence_operands(o);
#pragma unroll
  for (int mb = 0; mb < C::kMBlocks; ++mb) wg::fence_operands(a[mb]);
}

// S = Q K(stage)^T over the whole 64-key tile, waited. fp8 promotion (see wg::QkAcc) with one
// accumulator set beside S (O^T's 128 registers leave no room for QkAcc's two): chunk 0 is
// issued into S itself, chunk c > 0 into acc, which is added to S once it is done; chunk c + 1
// waits for that add, so the tensor cores see a gap per chunk that the other warpgroup's
// wgmmas fill. Chunk c runs k-steps [QkPlan::kBounds[c], QkPlan::kBounds[c + 1]).
// Three chunks of 6 k-steps (192 products), not wg::QkAcc's six of 3: each chunk's wait costs
// about 1% of the call, and 6 keeps the N(0, 1) tests' worst LSE error at 1.4e-3 against their
// 2e-3 bound (3: 7.6e-4; the output error does not move; docs/perf/notes.md change 22).
struct QkPlan {
  static constexpr int kChunks = 3;
  static constexpr int kBounds[kChunks + 1] = {0, 6, 12, 18};
};
template <class C, int Chunk>
__device__ __forceinline__ void qk_chunk(float (&d)[C::kSTiles][4], uint32_t q_addr, uint32_t k_addr) {
  constexpr int kFirst = QkPlan::kBounds[Chunk];
  wg::qk_steps<true, QkPlan::kBounds[Chunk + 1] - kFirst>(d, kFirst, [&](int kk, uint64_t& da, uint64_t& db) {
    da = wg::q_desc<C>(q_addr, kk);
    db = wg::k_desc<C>(k_addr, kk);
  });
}
template <class C, int Chunk>
__device__ __forceinline__ void qk_rest(float (&s)[C::kSTiles][4], float (&acc)[C::kSTiles][4], uint32_t q_addr,
                                        uint32_t k_addr) {
  if constexpr (Chunk < QkPlan::kChunks) {
    qk_chunk<C, Chunk>(acc, q_addr, k_addr);
    wg::wgmma_wait<0>();
    wg::qk_add<C>(s, acc);
    qk_rest<C, Chunk + 1>(s, acc, q_addr, k_addr);
  }
}
template <class C>
__device__ __forceinline__ void qk_tile(float (&s)[C::kSTiles][4], const uint8_t* smem, uint32_t bar_full, StageUse su) {
  static_assert(C::kFp8, "the tile_pairs loop is fp8 only");
  static_assert(QkPlan::kBounds[0] == 0 && QkPlan::kBounds[QkPlan::kChunks] == C::kKSteps, "the chunks cover QK's k-steps");
  wg::mbar_wait(bar_full + su.stage * 8, su.parity);
  AITER_MLA_STAMP(kKvWait);
  const uint32_t q_addr = smem_addr(smem + C::kOffQ);
  const uint32_t k_addr = smem_addr(smem + C::kOffKv + su.stage * C::kStageBytes);
  float acc[C::kSTiles][4];
  qk_chunk<C, 0>(s, q_addr, k_addr);
  qk_rest<C, 1>(s, acc, q_addr, k_addr);
  wg::fence_operands(s);
}

// O^T[m-block MB] *= f (when `rescale`), then its four PV wgmmas: V_a^T . P_a^T and V_b^T . P_b^T
// (P buffers 0 and 1). The next m-block's multiplies touch other registers, so they run while
// this block's wgmmas compute (a wgmma.fence orders them before the next issue).
template <class C, int MB>
__device__ __forceinline__ void pv_pair_blocks(float (&o)[C::kOTiles][4], const uint32_t (&fa)[C::kMBlocks][C::BN / 32][4],
                                               const uint32_t (&fb)[C::kMBlocks][C::BN / 32][4], const float2 (&f)[8],
                                               bool rescale, uint32_t p_a, uint32_t p_b) {
  if constexpr (MB < C::kMBlocks) {
    if (rescale) transposed_pv::scale_mblock(o, MB, f);
    wg::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < C::BN / 32; ++kk) transposed_pv::wgmma_pv_t<MB>(o, fa[MB][kk], wg::make_desc(p_a + kk * 256, 128, 512));
#pragma unroll
    for (int kk = 0; kk < C::BN / 32; ++kk) transposed_pv::wgmma_pv_t<MB>(o, fb[MB][kk], wg::make_desc(p_b + kk * 256, 128, 512));
    pv_pair_blocks<C, MB + 1>(o, fa, fb, f, rescale, p_a, p_b);
  }
}

// PV of both tiles of a pair, issued as one commit group and not waited: the V^T fragments of
// tiles a and b (both stages released once read), O^T's factors of the pair, then per m-block
// the rescale and four wgmmas. Both fragment sets stay live until the group is waited (64
// registers beside O^T's 128; S and the QK accumulators are dead here).
template <class C>
__device__ __forceinline__ void pv_pair(float (&o)[C::kOTiles][4], uint32_t (&fa)[C::kMBlocks][C::BN / 32][4],
                                        uint32_t (&fb)[C::kMBlocks][C::BN / 32][4], uint8_t* smem, uint32_t bar_full,
                                        uint32_t bar_empty, StageUse su_a, StageUse su_b, int half, int group,
                                        int lane, int valid_a, int valid_b) {
  wg::mbar_wait(bar_full + su_a.stage * 8, su_a.parity);
  wg::mbar_wait(bar_full + su_b.stage * 8, su_b.parity);
  wg::fence_operands(o);
  transposed_pv::load_vt_frags<C>(fa, smem, su_a.stage, half, group, lane, valid_a);
  transposed_pv::load_vt_frags<C>(fb, smem, su_b.stage, half, group, lane, valid_b);
  wg::mbar_arrive(bar_empty + su_a.stage * 8);
  wg::mbar_arrive(bar_empty + su_b.stage * 8);
  float2 f[8];
  const bool rescale = transposed_pv::load_factors<C>(f, smem, 0, lane);   // row_factor(0) is transposed_pv's scale[0]
  const uint32_t p_a = smem_addr(smem + C::kOffP), p_b = p_a + C::kPBytes;
  wg::fence_operands(o);
  pv_pair_blocks<C, 0>(o, fa, fb, f, rescale, p_a, p_b);
  wg::wgmma_commit();
  wg::fence_operands(o);
}

// One pair (tile a at tok_a, tile b after it): warpgroup `half` scores tile a (half 0) or b
// (half 1), the schedule in the header. Both add PV_a and PV_b into their O^T columns.
template <class C>
__device__ __forceinline__ void pair(float (&o)[C::kOTiles][4], uint32_t (&fa)[C::kMBlocks][C::BN / 32][4],
                                     uint32_t (&fb)[C::kMBlocks][C::BN / 32][4], RowState& st, uint8_t* smem,
                                     uint32_t bar_full, uint32_t bar_empty, StageUse su_a, StageUse su_b, int tok_a,
                                     int valid_a, int valid_b, float scale_log2, int half, int group, int lane,
                                     uint32_t q_empty) {
  const int r0 = group * 16 + (lane >> 2);
  const int tok = tok_a + half * C::BN;
  float s[C::kSTiles][4];
  float mx[2];
  qk_tile<C>(s, smem, bar_full, half == 0 ? su_a : su_b);
  if (q_empty != 0) wg::mbar_arrive(q_empty);   // the work's last read of Q: the next work's copy may start
  AITER_MLA_STAMP(kQk);
  const float sc = masked_quad_max<C>(s, st, tok + (lane & 3) * 2, tok + C::BN, scale_log2, mx);
  float ref[2], sum[2] = {0.f, 0.f};
#pragma unroll
  for (int h = 0; h < 2; ++h) ref[h] = fmaxf(st.m[h], mx[h]);   // m_loc (not yet max_ref'd)
  if ((lane & 3) == 0) {
    row_max<C>(smem, half)[r0] = ref[0];
    row_max<C>(smem, half)[r0 + 8] = ref[1];
  }
#pragma unroll
  for (int j = 0; j < C::kSTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[j][e] = fast_exp2(fmaf(s[j][e], sc, -max_ref(ref[e >> 1])));
      sum[e >> 1] += s[j][e];
    }
  wg::consumer_sync();       // both warpgroups' local maxima
  float g[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float m_new = fmaxf(ref[h], row_max<C>(smem, half ^ 1)[r0 + 8 * h]);
    const float mref = max_ref(m_new);
    const float f_o = fast_exp2(st.m[h] - mref);
    g[h] = fast_exp2(max_ref(ref[h]) - mref);
    st.l[h] = st.l[h] * f_o + sum[h] * g[h];
    st.m[h] = m_new;
    if (half == 0 && (lane & 3) == 0) row_factor<C>(smem, 0)[r0 + 8 * h] = f_o;
  }
  {
    uint8_t* p = smem + C::kOffP + half * C::kPBytes + transposed_pv::p_row(r0, (lane & 3) * 2);
#pragma unroll
    for (int j = 0; j < C::kSTiles; ++j) {
      *reinterpret_cast<__nv_fp8x2_storage_t*>(p + transposed_pv::p_step(j)) = fp8::e4m3x2(s[j][0] * g[0], s[j][1] * g[0]);
      *reinterpret_cast<__nv_fp8x2_storage_t*>(p + 512 + transposed_pv::p_step(j)) = fp8::e4m3x2(s[j][2] * g[1], s[j][3] * g[1]);
    }
  }
  wg::fence_proxy_async();   // P_a, P_b -> the PV wgmmas' B operand
  wg::consumer_sync();       // P_a, P_b and O's factors written
  AITER_MLA_STAMP(kSoftmax);
  pv_pair<C>(o, fa, fb, smem, bar_full, bar_empty, su_a, su_b, half, group, lane, valid_a, valid_b);
  pv_wait<C>(o, fa);
#pragma unroll
  for (int mb = 0; mb < C::kMBlocks; ++mb) wg::fence_operands(fb[mb]);
  AITER_MLA_STAMP(kPv);
}

// The pair tile seen by `single`: the same shared-memory layout, S at N = BN / 2 per warpgroup
// (each scores half of a tile's keys).
template <class C>
struct KeyHalfTile : C {
  static constexpr int kSTiles = C::BN / 16;
};

// A work's last tile when its tile count is odd: each warpgroup scores half of its keys, the
// maxima meet through transposed_pv::softmax_p, and both add the tile into their O^T columns.
// (A pair with one tile would leave warpgroup 1 idle through QK and softmax: 1-tile works ran
// 7% slower that way.) P and O^T's factors go to buffer 1; the barrier first
// makes sure both warpgroups' PV of the work's last pair, which read P buffers 0 and 1, are done.
template <class C>
__device__ __forceinline__ void single(float (&o)[C::kOTiles][4], uint32_t (&a)[C::kMBlocks][C::BN / 32][4],
                                       RowState& st, uint8_t* smem, uint32_t bar_full, uint32_t bar_empty,
                                       StageUse su, int tok, int valid, float scale_log2, int half, int group,
                                       int lane, uint32_t q_empty) {
  using V = KeyHalfTile<C>;
  float s[V::kSTiles][4];
  wg::mbar_wait(bar_full + su.stage * 8, su.parity);
  AITER_MLA_STAMP(kKvWait);
  {
    wg::QkAcc<V> qk_acc;
    wg::qk_begin<V>(qk_acc, smem, su.stage, half);
    wg::qk_finish<V>(s, qk_acc, smem, su.stage, half);
  }
  if (q_empty != 0) wg::mbar_arrive(q_empty);   // the work's last read of Q
  AITER_MLA_STAMP(kQk);
  wg::fence_operands(o);
  transposed_pv::load_vt_frags<V>(a, smem, su.stage, half, group, lane, valid);
  wg::mbar_arrive(bar_empty + su.stage * 8);
  wg::consumer_sync();       // the last pair's PV_a and PV_b are done in both warpgroups
  transposed_pv::softmax_p<V>(s, st, smem, 1, tok, scale_log2, group, half, lane);
  wg::fence_proxy_async();   // P -> the PV wgmma's B operand
  wg::consumer_sync();       // P and the factors of all rows written
  AITER_MLA_STAMP(kSoftmax);
  transposed_pv::rescale_ot<V>(o, smem, 1, lane);
  transposed_pv::pv_issue<V>(o, a, smem, 1);
  pv_wait<V>(o, a);
  AITER_MLA_STAMP(kPv);
}

}  // namespace tile_pairs
}  // namespace mla
