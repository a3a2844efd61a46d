// Prototype (compile-only) of a 3-consumer-warpgroup fp8 decode loop: warpgroup 0 scores
// (QK + softmax + P), warpgroups 1 and 2 each own 256 V columns of O^T and run PV; warpgroup 3
// is the TMA producer. For ptxas register / spill / C75xx checks only.
#include <cuda.h>
#include "common/mla_decode_sm90_tile_pairs.cuh"

#ifndef SCORER_REGS
#define SCORER_REGS 120
#endif
#ifndef PV_REGS
#define PV_REGS 184
#endif
#ifndef FRAG_PER_MB
#define FRAG_PER_MB 0
#endif
#ifndef DEFER_PUBLISH
#define DEFER_PUBLISH 1
#endif

using namespace mla;
using Cfg = tile_pairs::TilePairsConfig<64, 64, false>;

struct PParams {
  PageTable pages;
  __nv_bfloat16* out;
  int num_works, kv_len;
  float scale_log2;
};

constexpr int kAll = 384;          // scorer + 2 PV warpgroups
constexpr int kBarPFull = 9;       // 9, 10
constexpr int kBarPEmpty = 11;     // 11, 12

__device__ __forceinline__ void nb_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void nb_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }

__device__ __forceinline__ float* row_lm(uint8_t* smem, int which) {   // [0]: l, [1]: m
  return reinterpret_cast<float*>(smem + Cfg::kOffMax) + which * kRows;
}

__device__ __forceinline__ void scorer(const PParams& p, uint8_t* smem, uint32_t bar_full, uint32_t bar_empty,
                                       int group, int lane) {
  const int r0 = group * 16 + (lane >> 2);
  uint32_t seq = 0;
  for (int wi = 0; wi < p.num_works; ++wi) {
    RowState st;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      st.m[h] = -INFINITY;
      st.l[h] = 0.f;
      st.key_end[h] = p.kv_len;
    }
    st.full_end = p.kv_len;
    const int n = (p.kv_len + Cfg::BN - 1) / Cfg::BN;
    for (int t = 0; t < n; ++t, ++seq) {
      const tile_pairs::StageUse su{static_cast<int>(seq % Cfg::kStages), (seq / Cfg::kStages) & 1};
      float s[Cfg::kSTiles][4];
      tile_pairs::qk_tile<Cfg>(s, smem, bar_full, su);
      wg::mbar_arrive(bar_empty + su.stage * 8);     // K read
#if DEFER_PUBLISH
      if (t > 0) nb_arrive(kBarPFull + ((seq - 1) & 1), kAll);   // P(t - 1): its PV runs under this softmax
#endif
      const int tok = t * Cfg::BN;
      float mx[2];
      const float sc = masked_quad_max<Cfg>(s, st, tok + (lane & 3) * 2, tok + Cfg::BN, p.scale_log2, mx);
      float mref[2], f[2], sum[2] = {0.f, 0.f};
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float m_new = fmaxf(st.m[h], mx[h]);
        mref[h] = tile_pairs::max_ref(m_new);
        f[h] = fast_exp2(st.m[h] - mref[h]);
        st.m[h] = m_new;
      }
#pragma unroll
      for (int j = 0; j < Cfg::kSTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[j][e] = fast_exp2(fmaf(s[j][e], sc, -mref[e >> 1]));
          sum[e >> 1] += s[j][e];
        }
      if (seq >= 2) nb_sync(kBarPEmpty + (seq & 1), kAll);   // PV(seq - 2) is done with this buffer
      {
        uint8_t* pp = smem + Cfg::kOffP + (seq & 1) * Cfg::kPBytes + transposed_pv::p_row(r0, (lane & 3) * 2);
#pragma unroll
        for (int j = 0; j < Cfg::kSTiles; j += 2) {
          const uint32_t lo0 = fp8::e4m3x2(s[j][0], s[j][1]), hi0 = fp8::e4m3x2(s[j + 1][0], s[j + 1][1]);
          const uint32_t lo1 = fp8::e4m3x2(s[j][2], s[j][3]), hi1 = fp8::e4m3x2(s[j + 1][2], s[j + 1][3]);
          *reinterpret_cast<uint32_t*>(pp + transposed_pv::p_step(j)) = lo0 | (hi0 << 16);
          *reinterpret_cast<uint32_t*>(pp + 512 + transposed_pv::p_step(j)) = lo1 | (hi1 << 16);
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) st.l[h] = st.l[h] * f[h] + sum[h];
      if ((lane & 3) == 0) {
        float* fac = tile_pairs::row_factor<Cfg>(smem, seq & 1);
        fac[r0] = f[0];
        fac[r0 + 8] = f[1];
      }
      wg::fence_proxy_async();   // P -> the PV wgmmas' B operand
#if !DEFER_PUBLISH
      nb_arrive(kBarPFull + (seq & 1), kAll);
#endif
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      st.l[h] += __shfl_xor_sync(0xffffffffu, st.l[h], 1);
      st.l[h] += __shfl_xor_sync(0xffffffffu, st.l[h], 2);
    }
    if ((lane & 3) == 0) {
      row_lm(smem, 0)[r0] = st.l[0];
      row_lm(smem, 0)[r0 + 8] = st.l[1];
    }
#if DEFER_PUBLISH
    if (n > 0) nb_arrive(kBarPFull + ((seq - 1) & 1), kAll);   // the work's last P, and l
#endif
  }
}

template <int MB>
__device__ __forceinline__ void pv_blocks(float (&o)[32][4], const uint32_t (&a)[Cfg::kMBlocks][2][4], const float2 (&f)[8],
                                          bool rescale, uint32_t pb) {
  if constexpr (MB < Cfg::kMBlocks) {
    if (rescale) transposed_pv::scale_mblock(o, MB, f);
    wg::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) transposed_pv::wgmma_pv_t<MB>(o, a[MB][kk], wg::make_desc(pb + kk * 256, 128, 512));
    pv_blocks<MB + 1>(o, a, f, rescale, pb);
  }
}

__device__ __forceinline__ void pv_role(const PParams& p, uint8_t* smem, uint32_t bar_full, uint32_t bar_empty, int half,
                                        int group, int lane) {
  uint32_t seq = 0;
  for (int wi = 0; wi < p.num_works; ++wi) {
    float o[32][4];
#pragma unroll
    for (int j = 0; j < 32; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    const int n = (p.kv_len + Cfg::BN - 1) / Cfg::BN;
    for (int t = 0; t < n; ++t, ++seq) {
      const tile_pairs::StageUse su{static_cast<int>(seq % Cfg::kStages), (seq / Cfg::kStages) & 1};
      wg::mbar_wait(bar_full + su.stage * 8, su.parity);
      uint32_t a[Cfg::kMBlocks][2][4];
      wg::fence_operands(o);
      transposed_pv::load_vt_frags<Cfg>(a, smem, su.stage, half, group, lane, p.kv_len - t * Cfg::BN);
      wg::mbar_arrive(bar_empty + su.stage * 8);   // V read
      nb_sync(kBarPFull + (seq & 1), kAll);
      float2 f[8];
      const bool rescale = transposed_pv::load_factors<Cfg>(f, smem, seq & 1, lane);
      const uint32_t pb = smem_addr(smem + Cfg::kOffP + (seq & 1) * Cfg::kPBytes);
      wg::fence_operands(o);
      pv_blocks<0>(o, a, f, rescale, pb);
      wg::wgmma_commit();
      wg::wgmma_wait<0>();
      wg::fence_operands(o);
#pragma unroll
      for (int mb = 0; mb < Cfg::kMBlocks; ++mb) wg::fence_operands(a[mb]);
      nb_arrive(kBarPEmpty + (seq & 1), kAll);
    }
    // epilogue: 1 / l of this thread's O^T columns
    float inv[8][2];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float l = row_lm(smem, 0)[8 * i + 2 * (lane & 3) + e];
        inv[i][e] = l > 0.f ? __fdividef(1.f, l) : 0.f;
      }
    const int64_t row0 = (int64_t)wi * kRows + blockIdx.x * 1000;
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int r = 8 * i + 2 * (lane & 3) + e;
#pragma unroll
        for (int mb = 0; mb < Cfg::kMBlocks; ++mb) {
          const int col = 16 * (16 * half + 4 * mb + group) + 2 * (lane >> 2);
          *reinterpret_cast<__nv_bfloat162*>(p.out + (row0 + r) * kVDim + col) =
              __floats2bfloat162_rn(o[8 * mb + i][e] * inv[i][e], o[8 * mb + i][e + 2] * inv[i][e]);
        }
      }
  }
}

__global__ void __launch_bounds__(512, 1) proto_kernel(const PParams p, const __grid_constant__ CUtensorMap kv_map) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int wgi = __shfl_sync(0xffffffffu, threadIdx.x >> 7, 0);
  const int group = warp & 3;
  const uint32_t bar_full = smem_addr(smem + Cfg::kOffBar);
  const uint32_t bar_empty = bar_full + Cfg::kStages * 8;
  if (threadIdx.x == 0) {
    for (int i = 0; i < Cfg::kStages; ++i) {
      wg::mbar_init(bar_full + i * 8, 1);
      wg::mbar_init(bar_empty + i * 8, kAll);
    }
    wg::fence_mbar_init();
  }
  __syncthreads();
  if (wgi == 3) {
    wg::setmaxnreg_dec<24>();
    if (warp != 12) return;
    bool bad = false;
    uint32_t pseq = 0;
    for (int wi = 0; wi < p.num_works; ++wi) {
      const int n = (p.kv_len + Cfg::BN - 1) / Cfg::BN;
      for (int t = 0; t < n; ++t, ++pseq) {
        const int stage = pseq % Cfg::kStages;
        wg::produce_kv_tile_tma<Cfg>(smem_addr(smem + Cfg::kOffKv + stage * Cfg::kStageBytes), bar_full + stage * 8,
                                     bar_empty + stage * 8, ((pseq / Cfg::kStages) & 1) ^ 1, &kv_map, p.pages,
                                     t * Cfg::BN, p.kv_len, lane, false, bad);
      }
    }
    if (bad) p.out[0] = __float2bfloat16(1.f);
    return;
  }
  if (wgi == 0) {
    wg::setmaxnreg_dec<SCORER_REGS>();
    // no scorer
  } else {
    wg::setmaxnreg_inc<PV_REGS>();
    pv_role(p, smem, bar_full, bar_empty, wgi - 1, group, lane);
  }
}
