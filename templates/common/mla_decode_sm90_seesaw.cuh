// MLA decode on sm_90a: the fp8 "seesaw" main loop (template parameter mainloop = "wgmma_seesaw").
//
// wgmma_ot runs both consumer warpgroups in lockstep on every tile: each scores half of the
// keys (QK at N = 32, which re-reads the whole Q tile per warpgroup: 108 KB of operand reads
// per tile), they agree the row max through shared memory, and the tensor cores idle while both
// run the softmax. Here the tiles go in pairs (a, b), FlashMLA's seesaw schedule on the
// transposed PV of wgmma_ot:
//   warpgroup 0 (role A)                       warpgroup 1 (role B)
//   S_a = Q K_a^T (N = 64)                     S_b = Q K_b^T (N = 64), its row max
//   m_a, P_a, f_a = 2^(m - m_a) -> smem  ---->  (waits for role A)
//   O_L *= f_a; O_L += V_a,L^T P_a^T           O_R *= f_a; O_R += V_a,R^T P_a^T
//   (waits for role B)                  <----  m_b, P_b, f_b = 2^(m_a - m_b) -> smem
//   O_L *= f_b; O_L += V_b,L^T P_b^T           O_R *= f_b; O_R += V_b,R^T P_b^T
// so role B's softmax runs while both PV_a products are on the tensor cores, and QK reads Q
// once per 64 keys per warpgroup (72 KB per tile). O^T, P, V^T fragments and the epilogue are
// wgmma_ot's (mla_decode_sm90_ot.cuh); warpgroup c still owns V columns [256c, 256c + 256).
//
// Shared state of a pair, written by one role and read by the other (rows 0..63):
//   P_a, P_b (e4m3, PV's B layout), f_a, f_b (factors O and l take), m_a, m_b (running maxima).
// Hand-offs are named barriers: role A arrives on kBarA once P_a, f_a, m_a are written; role B
// arrives on kBarB once P_b, f_b, m_b are written AND its PV_a is done (so role A may rewrite
// P_a, f_a and m_a in the next pair). Role A waits its PV_b before the next pair's kBarA
// arrival, so role B may rewrite P_b after its kBarA wait. Every wgmma is waited inside its
// role's branch: none is in flight across the loop's back edge (ptxas C7514).
#pragma once
#include "mla_decode_sm90_ot.cuh"

namespace mla {
namespace seesaw {

template <int BlockN, int PageSize, bool Causal>
struct MlaDecodeSeesawConfig : ovl::Fp8TmaTile<BlockN, PageSize, Causal> {
  using T = ovl::Fp8TmaTile<BlockN, PageSize, Causal>;
  using T::BN;
  static constexpr int kSTiles = BN / 8;               // n8 tiles of S per thread: N = BN per warpgroup
  static constexpr int kStages = 4;                   // KV ring
  static constexpr int kMBlocks = kVDim / 2 / 64;     // m64 blocks of O^T per warpgroup
  static constexpr int kPBytes = kRows * BN;          // one P buffer (ot::p_offset layout)
  static constexpr int kOffP = T::kOffKv + kStages * T::kStageBytes;   // P_a, P_b
  static constexpr int kOffScale = kOffP + 2 * kPBytes;               // f_a[64], f_b[64] (ot::rescale_ot's buf 0 / 1)
  static constexpr int kOffMax = kOffScale + 2 * kRows * 4;           // m_a[64], m_b[64]
  static constexpr int kOffInv = kOffMax + 2 * kRows * 4;             // [64] out_scale / l (ot::write_output)
  static constexpr int kOffRed = kOffInv + kRows * 4;
  static constexpr int kOffBar = kOffRed + T::kRedBytes;              // full[kStages], empty[kStages]
  static constexpr int kSmemBytes = kOffBar + 2 * kStages * 8;
  static_assert(BN == 64, "the seesaw loop scores 64-key tiles (m64n64 QK)");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory tile does not fit an sm_90 CTA (227 KB)");
  static_assert(T::kOffKv % 512 == 0 && kOffP % 128 == 0, "operand tiles are aligned");
};

// Named barriers of the hand-offs (0: __syncthreads, 1-4: row-group pairs, 5-6: warpgroups,
// 7: consumers). 256 = the arriving warpgroup plus the waiting one.
constexpr int kBarA = 8;
constexpr int kBarB = 9;
__device__ __forceinline__ void bar_arrive(int id) { asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory"); }
__device__ __forceinline__ void bar_wait(int id) { asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory"); }

// Reference a row's probabilities are taken against: its max, or 0 while the max is -inf (then
// p = 0 and every factor 2^(m_old - ref) is 0: no -inf - -inf).
__device__ __forceinline__ float max_ref(float m) { return m == -INFINITY ? 0.f : m; }

// P = 2^(S * sc - ref) as e4m3 into P buffer `buf` (keys at ovl::p_pos; sc: masked_quad_max's
// result); sum = this thread's fp32 sums.
template <class C>
__device__ __forceinline__ void write_p(const float (&s)[C::kSTiles][4], const float (&ref)[2], float sc, uint8_t* smem,
                                        int buf, int group, int lane, float (&sum)[2]) {
  const int r0 = group * 16 + (lane >> 2);
  uint8_t* p = smem + C::kOffP + buf * C::kPBytes + ot::p_row(r0, (lane & 3) * 2);
  exp_scores<C>(s, ref, sc, sum, [&](int j, float p0, float p1, float p2, float p3) {
    *reinterpret_cast<__nv_fp8x2_storage_t*>(p + ot::p_step(j)) = ovl::e4m3x2(p0, p1);
    *reinterpret_cast<__nv_fp8x2_storage_t*>(p + 512 + ot::p_step(j)) = ovl::e4m3x2(p2, p3);
  });
}

// Row values [which][64] (0: f / m of tile a, 1: of tile b) through shared memory.
template <class C>
__device__ __forceinline__ float* row_factor(uint8_t* smem, int which) {
  return reinterpret_cast<float*>(smem + C::kOffScale) + which * kRows;
}
template <class C>
__device__ __forceinline__ float* row_max(uint8_t* smem, int which) {
  return reinterpret_cast<float*>(smem + C::kOffMax) + which * kRows;
}

// The quad leader writes its two rows' factor and running max for the other role.
template <class C>
__device__ __forceinline__ void publish_rows(uint8_t* smem, int which, const float (&f)[2], const float (&m)[2], int r0,
                                             int lane) {
  if ((lane & 3) == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      row_factor<C>(smem, which)[r0 + 8 * h] = f[h];
      row_max<C>(smem, which)[r0 + 8 * h] = m[h];
    }
  }
}

// One KV stage of the ring: its smem index, the parity of its full barrier for this use.
struct StageUse {
  int stage;
  uint32_t parity;
};

// O^T += V^T(stage) . P^T(buf) after O^T *= f(buf), then waited; the stage is released once
// the V^T fragments are in registers. (The fragment registers are live until the wait.)
template <class C>
__device__ __forceinline__ void pv_tile(float (&o)[C::kOTiles][4], uint32_t (&a)[C::kMBlocks][C::BN / 32][4],
                                        uint8_t* smem, uint32_t bar_full, uint32_t bar_empty, StageUse su, int buf,
                                        int half, int group, int lane, int valid) {
  wg::mbar_wait(bar_full + su.stage * 8, su.parity);
  wg::fence_operands(o);
  ot::load_vt_frags<C>(a, smem, su.stage, half, group, lane, valid);
  wg::mbar_arrive(bar_empty + su.stage * 8);   // this warpgroup is done with the stage
  ot::rescale_ot<C>(o, smem, buf, lane);
  ot::pv_issue<C>(o, a, smem, buf);
}
template <class C>
__device__ __forceinline__ void pv_wait(float (&o)[C::kOTiles][4], uint32_t (&a)[C::kMBlocks][C::BN / 32][4]) {
  wg::wgmma_wait<0>();
  wg::fence_operands(o);
#pragma unroll
  for (int mb = 0; mb < C::kMBlocks; ++mb) wg::fence_operands(a[mb]);
}

// S = Q K(stage)^T over the whole 64-key tile, waited. fp8 promotion (see wg::QkAcc) with one
// accumulator set beside S (O^T's 128 registers leave no room for wgmma_ot's two): chunk 0 is
// issued into S itself, chunk c > 0 into acc, which is added to S once it is done; chunk c + 1
// waits for that add, so the tensor cores see a gap per chunk that the other warpgroup's
// wgmmas fill.
template <class C, int Chunk>
__device__ __forceinline__ void qk_chunk(float (&d)[C::kSTiles][4], uint32_t q_addr, uint32_t k_addr) {
  constexpr int kChunk = wg::QkAcc<C>::kChunk;
  wg::qk_steps<true, kChunk>(d, Chunk * kChunk, [&](int kk, uint64_t& da, uint64_t& db) {
    da = wg::q_desc<C>(q_addr, kk);
    db = wg::k_desc<C>(k_addr, kk);
  });
}
template <class C, int Chunk>
__device__ __forceinline__ void qk_rest(float (&s)[C::kSTiles][4], float (&acc)[C::kSTiles][4], uint32_t q_addr,
                                        uint32_t k_addr) {
  if constexpr (Chunk < wg::QkAcc<C>::kChunks) {
    qk_chunk<C, Chunk>(acc, q_addr, k_addr);
    wg::wgmma_wait<0>();
    wg::qk_add<C>(s, acc);
    qk_rest<C, Chunk + 1>(s, acc, q_addr, k_addr);
  }
}
template <class C>
__device__ __forceinline__ void qk_tile(float (&s)[C::kSTiles][4], const uint8_t* smem, uint32_t bar_full, StageUse su) {
  static_assert(C::kFp8, "the seesaw loop is fp8 only");
  wg::mbar_wait(bar_full + su.stage * 8, su.parity);
  const uint32_t q_addr = smem_addr(smem + C::kOffQ);
  const uint32_t k_addr = smem_addr(smem + C::kOffKv + su.stage * C::kStageBytes);
  float acc[C::kSTiles][4];
  qk_chunk<C, 0>(s, q_addr, k_addr);
  qk_rest<C, 1>(s, acc, q_addr, k_addr);
  wg::fence_operands(s);
}

// Role A (warpgroup 0) for the pair (tile a at tok_a; tile b exists when has_b).
template <class C>
__device__ __forceinline__ void role_a(float (&o)[C::kOTiles][4], uint32_t (&a)[C::kMBlocks][C::BN / 32][4],
                                       RowState& st, uint8_t* smem, uint32_t bar_full, uint32_t bar_empty,
                                       StageUse su_a, StageUse su_b, bool has_b, int tok_a, int valid_a, int valid_b,
                                       float scale_log2, int group, int lane) {
  const int r0 = group * 16 + (lane >> 2);
  {
    float s[C::kSTiles][4];
    qk_tile<C>(s, smem, bar_full, su_a);
    float mx[2], ref[2], f[2], sum[2];
    const float sc = masked_quad_max<C>(s, st, tok_a + (lane & 3) * 2, tok_a + C::BN, scale_log2, mx);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float m_new = fmaxf(st.m[h], mx[h]);
      ref[h] = max_ref(m_new);
      f[h] = fast_exp2(st.m[h] - ref[h]);
      st.m[h] = m_new;
    }
    write_p<C>(s, ref, sc, smem, 0, group, lane, sum);
#pragma unroll
    for (int h = 0; h < 2; ++h) st.l[h] = st.l[h] * f[h] + sum[h];
    publish_rows<C>(smem, 0, f, st.m, r0, lane);
  }
  wg::fence_proxy_async();   // P_a (st.shared) -> the PV wgmmas' B operand
  wg::wg_sync(0);            // P_a and f_a of all 64 rows, for this warpgroup's own PV_a
  bar_arrive(kBarA);
  pv_tile<C>(o, a, smem, bar_full, bar_empty, su_a, 0, 0, group, lane, valid_a);
  bar_wait(kBarB);           // P_b, f_b, m_b written; role B's PV_a done
  pv_wait<C>(o, a);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    st.l[h] *= row_factor<C>(smem, 1)[r0 + 8 * h];
    st.m[h] = row_max<C>(smem, 1)[r0 + 8 * h];
  }
  if (has_b) {
    pv_tile<C>(o, a, smem, bar_full, bar_empty, su_b, 1, 0, group, lane, valid_b);
    pv_wait<C>(o, a);
  }
}

// Role B (warpgroup 1) for the pair.
template <class C>
__device__ __forceinline__ void role_b(float (&o)[C::kOTiles][4], uint32_t (&a)[C::kMBlocks][C::BN / 32][4],
                                       RowState& st, uint8_t* smem, uint32_t bar_full, uint32_t bar_empty,
                                       StageUse su_a, StageUse su_b, bool has_b, int tok_b, int valid_a, int valid_b,
                                       float scale_log2, int group, int lane) {
  const int r0 = group * 16 + (lane >> 2);
  float s[C::kSTiles][4];
  float mx[2] = {-INFINITY, -INFINITY};
  float sc = 1.f;
  if (has_b) {
    qk_tile<C>(s, smem, bar_full, su_b);
    sc = masked_quad_max<C>(s, st, tok_b + (lane & 3) * 2, tok_b + C::BN, scale_log2, mx);
  }
  bar_wait(kBarA);           // P_a, f_a, m_a written
  pv_tile<C>(o, a, smem, bar_full, bar_empty, su_a, 0, 1, group, lane, valid_a);
  float ref[2], f[2], sum[2] = {0.f, 0.f};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float m_a = row_max<C>(smem, 0)[r0 + 8 * h];
    const float f_a = row_factor<C>(smem, 0)[r0 + 8 * h];
    const float m_new = fmaxf(m_a, mx[h]);
    ref[h] = max_ref(m_new);
    f[h] = fast_exp2(m_a - ref[h]);
    st.l[h] *= f_a * f[h];
    st.m[h] = m_new;
  }
  if (has_b) write_p<C>(s, ref, sc, smem, 1, group, lane, sum);
#pragma unroll
  for (int h = 0; h < 2; ++h) st.l[h] += sum[h];
  publish_rows<C>(smem, 1, f, st.m, r0, lane);
  wg::fence_proxy_async();   // P_b -> the PV wgmmas
  wg::wg_sync(1);            // P_b and f_b of all 64 rows, for this warpgroup's own PV_b
  pv_wait<C>(o, a);          // PV_a done: role A may rewrite P_a, f_a, m_a after kBarB
  bar_arrive(kBarB);
  if (has_b) {
    pv_tile<C>(o, a, smem, bar_full, bar_empty, su_b, 1, 1, group, lane, valid_b);
    pv_wait<C>(o, a);
  }
}

}  // namespace seesaw
}  // namespace mla
