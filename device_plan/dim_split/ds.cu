// Prototype (diagnostic, never shipped): bf16 MLA decode at 128 rows a work, the two CTAs of a
// cluster splitting the 576 dims instead of the rows. CTA c holds latent columns
// [256c, 256c + 256) and RoPE dims [32c, 32c + 32) of Q (128 rows) and of each 64-key tile;
// warpgroup w owns rows [64w, 64w + 64) and O's columns [256c, 256c + 256). Per tile: partial
// S over the CTA's 288 dims, exchanged with the peer CTA's warpgroup w through st.async
// (S = own + peer's: the same on both sides), the online softmax of its own rows, then
// O += P . V[:, the CTA's columns] with P from registers. The warpgroups issue their QK in
// turn (FA3-style scheduling barriers) so one's exchange and softmax run under the other's MMAs.
// No paging, no masking (ctx a multiple of 64), no splits: it measures the structure.
// Build: nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -I templates -o ds ds.cu
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <vector>
#include <algorithm>
#include "common/mla_decode_sm90_wgmma.cuh"

using namespace mla;

namespace ds {
constexpr int kWorkRows = 128, kBN = 64, kStages = 3;
constexpr int kOffQLat = 0;                       // 4 blocks x 128 rows x 128 B
constexpr int kOffQRope = 65536;                  // 128 rows x 64 B
constexpr int kOffStage = 73728;                  // per stage: 4 x 64 x 128 B latent, then 64 x 64 B RoPE
constexpr int kStageBytes = 36864, kStageLat = 32768;
constexpr int kOffX = kOffStage + kStages * kStageBytes;   // 2 warpgroups x 16 KB partial S
constexpr int kOffBar = kOffX + 2 * 16384;
// barriers: full[3], empty[3], q_full, q_empty, xfull[2], xempty[2]
constexpr int kSmem = kOffBar + 12 * 8;
constexpr int kQBytes = 65536 + 8192;

__device__ __forceinline__ uint32_t mapa(uint32_t a, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
  return r;
}
__device__ __forceinline__ void arrive_remote(uint32_t cb) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(cb) : "memory");
}
__device__ __forceinline__ void wait_cluster(uint32_t b, uint32_t parity) {
  asm volatile("{\n.reg .pred p;\nW: mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%0], %1;\n@!p bra W;\n}\n" ::"r"(b),
               "r"(parity) : "memory");
}
__device__ __forceinline__ void st_async4(uint32_t cdst, const float (&v)[4], uint32_t cbar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(cdst),
               "r"(__float_as_uint(v[0])), "r"(__float_as_uint(v[1])), "r"(__float_as_uint(v[2])), "r"(__float_as_uint(v[3])),
               "r"(cbar) : "memory");
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ void named_sync(int id) { asm volatile("bar.sync %0, 256;" ::"r"(id) : "memory"); }
__device__ __forceinline__ void named_arrive(int id) { asm volatile("bar.arrive %0, 256;" ::"r"(id) : "memory"); }

__device__ __forceinline__ uint64_t sw128(uint32_t addr) { return wg::make_desc(addr, 16, 1024) | (1ull << 62); }
__device__ __forceinline__ uint64_t sw64(uint32_t addr) { return wg::make_desc(addr, 16, 512) | (2ull << 62); }

struct Args {
  __nv_bfloat16* out;   // [works * 128, 512]
  float* lse;           // [works * 128]
  int works, ctx, kv_group, num_clusters;
  float scale_log2;
  long long* cycles;    // per CTA: cycles in the main loop, tiles
};

template <bool kPipe, bool kSched>
__global__ void __launch_bounds__(384, 1) __cluster_dims__(2, 1, 1)
    decode(const Args a, const __grid_constant__ CUtensorMap q_lat, const __grid_constant__ CUtensorMap q_rope,
           const __grid_constant__ CUtensorMap kv_lat, const __grid_constant__ CUtensorMap kv_rope) {
  extern __shared__ __align__(1024) uint8_t smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const uint32_t rank = cluster_rank(), peer = rank ^ 1;
  const int cl = blockIdx.x >> 1;
  const uint32_t base = smem_addr(smem);
  const uint32_t bars = base + kOffBar;
  auto full = [&](int s) { return bars + s * 8; };
  auto empty = [&](int s) { return bars + 24 + s * 8; };
  const uint32_t q_full = bars + 48, q_empty = bars + 56;
  auto xfull = [&](int w) { return bars + 64 + w * 8; };
  auto xempty = [&](int w) { return bars + 80 + w * 8; };
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      wg::mbar_init(full(s), 1);
      wg::mbar_init(empty(s), 8);   // each consumer warp's lane 0
    }
    wg::mbar_init(q_full, 1);
    wg::mbar_init(q_empty, 8);
    for (int w = 0; w < 2; ++w) {
      wg::mbar_init(xfull(w), 1);   // own thread 0's expect_tx; the peer's st.async bytes
      wg::mbar_init(xempty(w), 4);  // the peer warpgroup's 4 warps (remote)
    }
    wg::fence_mbar_init();
  }
  __syncthreads();
  cluster_sync();   // the peer's barriers exist before any remote arrive or st.async
  const int ntiles = a.ctx / kBN;
  if (warp >= 8) {
    wg::setmaxnreg_dec<24>();
    if (warp == 8 && lane == 0) {
      uint32_t pseq = 0, qw = 0;
      for (int wk = cl; wk < a.works; wk += a.num_clusters) {
        wg::mbar_wait(q_empty, (qw & 1) ^ 1);
        wg::mbar_arrive_expect_tx(q_full, kQBytes);
        wg::tma_load_box3(base + kOffQLat, &q_lat, 0, wk * kWorkRows, 4 * rank, q_full);
        wg::tma_load_box(base + kOffQRope, &q_rope, 512 + 32 * rank, wk * kWorkRows, q_full);
        ++qw;
        const int kv0 = (wk / a.kv_group) * a.ctx;
        for (int t = 0; t < ntiles; ++t, ++pseq) {
          const int s = pseq % kStages;
          wg::mbar_wait(empty(s), ((pseq / kStages) & 1) ^ 1);
          wg::mbar_arrive_expect_tx(full(s), kStageBytes);
          const uint32_t st = base + kOffStage + s * kStageBytes;
          wg::tma_load_box3(st, &kv_lat, 0, kv0 + t * kBN, 4 * rank, full(s));
          wg::tma_load_box(st + kStageLat, &kv_rope, 512 + 32 * rank, kv0 + t * kBN, full(s));
        }
      }
    }
    __syncwarp();
    cluster_sync();
    return;
  }
  wg::setmaxnreg_inc<240>();
  const int w = warp >> 2, group = warp & 3, tw = threadIdx.x & 127;
  const uint32_t xbuf = base + kOffX + w * 16384;
  const uint32_t x_peer = mapa(xbuf + tw * 16, peer), xfull_peer = mapa(xfull(w), peer), xempty_peer = mapa(xempty(w), peer);
  const float* xmine = reinterpret_cast<const float*>(smem + kOffX + w * 16384 + tw * 16);   // float4 j of thread tw at (128 j + tw) x 16 B: a warp's store is 512 contiguous bytes
  if (kSched && w == 1) named_arrive(10);   // warpgroup 0 issues the first QK
  uint32_t seq = 0, qw = 0, xs = 0;   // tiles, works, exchanges of this warpgroup
  constexpr bool kStamp = !kPipe;   // the pipelined build is short of registers
  long long cyc = 0, wf = 0, wq = 0, wx = 0, wi = 0, ws = 0, wp = 0;   // cycles: loop, stage + turn waits, QK waits, exchange
  for (int wk = cl; wk < a.works; wk += a.num_clusters) {
    wg::mbar_wait(q_full, qw & 1);
    ++qw;
    const long long t0 = clock64();
    float o[32][4];
#pragma unroll
    for (int j = 0; j < 32; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    const uint32_t qa = base + kOffQLat + w * 64 * 128, qr = base + kOffQRope + w * 64 * 64;
    auto issue_qk = [&](float (&s)[8][4], int b) {
      const int s_idx = (seq + b) % kStages;
      long long tw0 = kStamp ? clock64() : 0;
      wg::mbar_wait(full(s_idx), ((seq + b) / kStages) & 1);
      if (kSched) named_sync(10 + w);   // the other warpgroup has issued its QK
      if (kStamp) wf += clock64() - tw0;
      const long long ti0 = kStamp ? clock64() : 0;
      uint32_t st = base + kOffStage + s_idx * kStageBytes, qa_ = qa, qr_ = qr;
      asm volatile("" : "+r"(qa_), "+r"(qr_), "+r"(st));   // descriptors rebuilt here, not hoisted (registers)
      wg::fence_operands(s);
      wg::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 16; ++kk) {
        const uint64_t da = sw128(qa_ + (kk >> 2) * 16384) + (((kk & 3) * 32) >> 4);
        const uint64_t db = sw128(st + (kk >> 2) * 8192) + (((kk & 3) * 32) >> 4);
        if (kk == 0) wg::wgmma_qk<false, 0>(s, da, db);
        else wg::wgmma_qk<false, 1>(s, da, db);
      }
#pragma unroll
      for (int kr = 0; kr < 2; ++kr)
        wg::wgmma_qk<false, 1>(s, sw64(qr_) + ((kr * 32) >> 4), sw64(st + kStageLat) + ((kr * 32) >> 4));
      wg::wgmma_commit();   // s is fenced after its wait (finish), never while in flight
      if (kStamp) wi += clock64() - ti0;
      if (kSched) named_arrive(10 + (w ^ 1));   // the other warpgroup may issue its QK
    };
    // After QK(b) and PV(b - 1) are waited: release, exchange, softmax, PV(b).
    auto finish = [&](float (&s)[8][4], int b) {
      wg::fence_operands(s);
      wg::fence_operands(o);
      __syncwarp();
      if (lane == 0) {
        if (b > 0) wg::mbar_arrive(empty((seq + b - 1) % kStages));
        if (b == ntiles - 1) wg::mbar_arrive(q_empty);
      }
      const uint32_t st = base + kOffStage + ((seq + b) % kStages) * kStageBytes;
      long long tx0 = kStamp ? clock64() : 0;
      if (xs > 0) wait_cluster(xempty(w), (xs - 1) & 1);   // the peer read my previous partial
#pragma unroll
      for (int j = 0; j < 8; ++j) st_async4(x_peer + 2048 * j, s[j], xfull_peer);
      if (tw == 0) wg::mbar_arrive_expect_tx(xfull(w), 16384);
      wait_cluster(xfull(w), xs & 1);
      if (kStamp) wx += clock64() - tx0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float4 v = reinterpret_cast<const float4*>(xmine)[128 * j];
        s[j][0] += v.x;
        s[j][1] += v.y;
        s[j][2] += v.z;
        s[j][3] += v.w;
      }
      __syncwarp();
      if (lane == 0) arrive_remote(xempty_peer);
      ++xs;
      const long long ts0 = kStamp ? clock64() : 0;
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        mx[0] = fmaxf(mx[0], fmaxf(s[j][0], s[j][1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[j][2], s[j][3]));
      }
      float f[2], mn[2], sum[2] = {0.f, 0.f};
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        mn[h] = fmaxf(m[h], mx[h] * a.scale_log2);
        f[h] = fast_exp2(m[h] - mn[h]);
        m[h] = mn[h];
      }
      uint32_t p[4][4];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float p0 = fast_exp2(fmaf(s[j][0], a.scale_log2, -mn[0])), p1 = fast_exp2(fmaf(s[j][1], a.scale_log2, -mn[0]));
        const float p2 = fast_exp2(fmaf(s[j][2], a.scale_log2, -mn[1])), p3 = fast_exp2(fmaf(s[j][3], a.scale_log2, -mn[1]));
        sum[0] += p0 + p1;
        sum[1] += p2 + p3;
        p[j >> 1][(j & 1) * 2] = pack2_bf16(p0, p1);
        p[j >> 1][(j & 1) * 2 + 1] = pack2_bf16(p2, p3);
      }
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        o[j][0] *= f[0];
        o[j][1] *= f[0];
        o[j][2] *= f[1];
        o[j][3] *= f[1];
      }
      l[0] = l[0] * f[0] + sum[0];
      l[1] = l[1] * f[1] + sum[1];
      const long long tp0 = kStamp ? clock64() : 0;
      if (kStamp) ws += tp0 - ts0;
      wg::fence_operands(p);
      wg::fence_operands(o);
      wg::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        wg::wgmma_pv_bf16(o, p[kk], wg::make_desc(st + kk * 16 * 128, kBN * 128, 1024) | (1ull << 62));
      wg::wgmma_commit();
      wg::fence_operands(o);
      wg::fence_operands(p);
      if (kStamp) wp += clock64() - tp0;
    };
    auto pre = [&](float (&s)[8][4], int b, uint32_t (&p)[4][4], float (&f)[2]) {   // exchange + softmax of b; O untouched
      wg::fence_operands(s);
      const uint32_t st = base + kOffStage + ((seq + b) % kStages) * kStageBytes;
      long long tx0 = kStamp ? clock64() : 0;
      if (xs > 0) wait_cluster(xempty(w), (xs - 1) & 1);   // the peer read my previous partial
#pragma unroll
      for (int j = 0; j < 8; ++j) st_async4(x_peer + 2048 * j, s[j], xfull_peer);
      if (tw == 0) wg::mbar_arrive_expect_tx(xfull(w), 16384);
      wait_cluster(xfull(w), xs & 1);
      if (kStamp) wx += clock64() - tx0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float4 v = reinterpret_cast<const float4*>(xmine)[128 * j];
        s[j][0] += v.x;
        s[j][1] += v.y;
        s[j][2] += v.z;
        s[j][3] += v.w;
      }
      __syncwarp();
      if (lane == 0) arrive_remote(xempty_peer);
      ++xs;
      const long long ts0 = kStamp ? clock64() : 0;
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        mx[0] = fmaxf(mx[0], fmaxf(s[j][0], s[j][1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[j][2], s[j][3]));
      }
      float mn[2], sum[2] = {0.f, 0.f};
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        mn[h] = fmaxf(m[h], mx[h] * a.scale_log2);
        f[h] = fast_exp2(m[h] - mn[h]);
        m[h] = mn[h];
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float p0 = fast_exp2(fmaf(s[j][0], a.scale_log2, -mn[0])), p1 = fast_exp2(fmaf(s[j][1], a.scale_log2, -mn[0]));
        const float p2 = fast_exp2(fmaf(s[j][2], a.scale_log2, -mn[1])), p3 = fast_exp2(fmaf(s[j][3], a.scale_log2, -mn[1]));
        sum[0] += p0 + p1;
        sum[1] += p2 + p3;
        p[j >> 1][(j & 1) * 2] = pack2_bf16(p0, p1);
        p[j >> 1][(j & 1) * 2 + 1] = pack2_bf16(p2, p3);
      }
      l[0] = l[0] * f[0] + sum[0];
      l[1] = l[1] * f[1] + sum[1];
      (void)st;
    };
    // After wait<0> (nothing in flight): release stage b - 1 (PV(b - 1) read it), rescale O, PV(b)
    auto post = [&](int b, uint32_t (&p)[4][4], const float (&f)[2]) {
      wg::fence_operands(o);
      __syncwarp();
      if (lane == 0) {
        if (b > 0) wg::mbar_arrive(empty((seq + b - 1) % kStages));
        if (b == ntiles - 1) wg::mbar_arrive(q_empty);
      }
      const uint32_t st = base + kOffStage + ((seq + b) % kStages) * kStageBytes;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        o[j][0] *= f[0];
        o[j][1] *= f[0];
        o[j][2] *= f[1];
        o[j][3] *= f[1];
      }
      wg::fence_operands(p);
      wg::fence_operands(o);
      wg::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        wg::wgmma_pv_bf16(o, p[kk], wg::make_desc(st + kk * 16 * 128, kBN * 128, 1024) | (1ull << 62));
      wg::wgmma_commit();
      wg::fence_operands(o);
      wg::fence_operands(p);
    };
    float sa[8][4], sb[8][4];
    if constexpr (kPipe) {
      // QK(b + 1) in flight under the exchange and softmax of b; O is rescaled and PV(b) issued
      // only after wait<0> (ptxas serialises the wgmmas when O is touched after a wait<1>)
      issue_qk(sa, 0);   // ntiles even (the cases' contexts are multiples of 128)
      wg::wgmma_wait<0>();
      uint32_t p[4][4];
      float f[2];
      for (int b = 0; b < ntiles - 2; b += 2) {
        issue_qk(sb, b + 1);
        pre(sa, b, p, f);
        wg::wgmma_wait<0>();
        post(b, p, f);
        issue_qk(sa, b + 2);
        pre(sb, b + 1, p, f);
        wg::wgmma_wait<0>();
        post(b + 1, p, f);
      }
      issue_qk(sb, ntiles - 1);
      pre(sa, ntiles - 2, p, f);
      wg::wgmma_wait<0>();
      post(ntiles - 2, p, f);
      pre(sb, ntiles - 1, p, f);
      wg::wgmma_wait<0>();
      post(ntiles - 1, p, f);
    } else {
      for (int b = 0; b < ntiles; ++b) {
        issue_qk(sa, b);
        long long tq = kStamp ? clock64() : 0;
        wg::wgmma_wait<0>();
        if (kStamp) wq += clock64() - tq;
        finish(sa, b);
      }
    }
    wg::wgmma_wait<0>();
    wg::fence_operands(o);
    __syncwarp();
    if (lane == 0 && ntiles > 0) wg::mbar_arrive(empty((seq + ntiles - 1) % kStages));
    seq += ntiles;
    cyc += clock64() - t0;
    // epilogue: O / l in bf16, LSE (natural log) from CTA 0
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
      l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    }
    const int r0 = wk * kWorkRows + 64 * w + 16 * group + (lane >> 2);
    const int c0 = 256 * rank + 2 * (lane & 3);
#pragma unroll
    for (int j = 0; j < 32; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float inv = 1.f / l[h];
        *reinterpret_cast<__nv_bfloat162*>(a.out + (long long)(r0 + 8 * h) * 512 + c0 + 8 * j) =
            __floats2bfloat162_rn(o[j][2 * h] * inv, o[j][2 * h + 1] * inv);
      }
    }
    if (rank == 0 && (lane & 3) == 0) {
      a.lse[r0] = (m[0] + log2f(l[0])) * 0.6931471805599453f;
      a.lse[r0 + 8] = (m[1] + log2f(l[1])) * 0.6931471805599453f;
    }
  }
  if (kSched && w == 0) named_sync(10);   // the last arrive of warpgroup 1
  if ((threadIdx.x & 127) == 0) {
    long long* c = a.cycles + 8 * (2 * blockIdx.x + w);
    c[0] = cyc; c[1] = seq; c[2] = wf; c[3] = wq; c[4] = wx; c[5] = wi; c[6] = ws; c[7] = wp;
  }
  __syncwarp();
  cluster_sync();   // no CTA leaves while its peer may still write into it
}

// float64 reference for a few rows: S over all 576 dims, softmax, O; LSE natural log.
__global__ void reference(const __nv_bfloat16* q, const __nv_bfloat16* kv, int ctx, int kv_group, float scale,
                          double* s_scratch, float* out, float* lse) {
  const int row = blockIdx.x, wk = row / kWorkRows;
  const __nv_bfloat16* qr = q + (long long)row * 576;
  const __nv_bfloat16* kvb = kv + (long long)(wk / kv_group) * ctx * 576;
  double* sr = s_scratch + (long long)blockIdx.x * ctx;
  __shared__ double red[256];
  double mx = -1e300;
  for (int k = threadIdx.x; k < ctx; k += blockDim.x) {
    double acc = 0;
    for (int d = 0; d < 576; ++d) acc += (double)__bfloat162float(qr[d]) * (double)__bfloat162float(kvb[(long long)k * 576 + d]);
    sr[k] = acc * scale;
    mx = fmax(mx, sr[k]);
  }
  red[threadIdx.x] = mx;
  __syncthreads();
  for (int st = 128; st > 0; st >>= 1) {
    if (threadIdx.x < st) red[threadIdx.x] = fmax(red[threadIdx.x], red[threadIdx.x + st]);
    __syncthreads();
  }
  mx = red[0];
  __syncthreads();
  double sum = 0;
  for (int k = threadIdx.x; k < ctx; k += blockDim.x) {
    sr[k] = exp(sr[k] - mx);
    sum += sr[k];
  }
  red[threadIdx.x] = sum;
  __syncthreads();
  for (int st = 128; st > 0; st >>= 1) {
    if (threadIdx.x < st) red[threadIdx.x] += red[threadIdx.x + st];
    __syncthreads();
  }
  sum = red[0];
  for (int c = threadIdx.x; c < 512; c += blockDim.x) {
    double acc = 0;
    for (int k = 0; k < ctx; ++k) acc += sr[k] * (double)__bfloat162float(kvb[(long long)k * 576 + c]);
    out[(long long)row * 512 + c] = (float)(acc / sum);
  }
  if (threadIdx.x == 0) lse[row] = (float)(mx + log(sum));
}

__global__ void fill(__nv_bfloat16* x, long long n, unsigned seed) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed;
    h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
    const float u1 = ((h & 0xffff) + 0.5f) / 65536.f, u2 = ((h >> 16) + 0.5f) / 65536.f;
    x[i] = __float2bfloat16(sqrtf(-2.f * logf(u1)) * cosf(6.2831853f * u2));
  }
}
}  // namespace ds

static PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 f = nullptr;
  if (!f) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess || !fn) {
      printf("no cuTensorMapEncodeTiled\n");
      exit(1);
    }
    f = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }
  return f;
}
static CUtensorMap map_lat(void* base, long long rows, int box_rows) {   // {64 elems, rows, 9 blocks}, 4 blocks a box
  CUtensorMap m;
  const cuuint64_t dims[3] = {64, (cuuint64_t)rows, 9};
  const cuuint64_t strides[2] = {1152, 128};
  const cuuint32_t box[3] = {64, (cuuint32_t)box_rows, 4};
  const cuuint32_t es[3] = {1, 1, 1};
  CUresult r = encode_fn()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, base, dims, strides, box, es,
                                      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) { printf("map_lat failed %d\n", (int)r); exit(1); }
  return m;
}
static CUtensorMap map_rope(void* base, long long rows, int box_rows) {   // {576 elems, rows}, 32 x box_rows boxes
  CUtensorMap m;
  const cuuint64_t dims[2] = {576, (cuuint64_t)rows};
  const cuuint64_t strides[1] = {1152};
  const cuuint32_t box[2] = {32, (cuuint32_t)box_rows};
  const cuuint32_t es[2] = {1, 1};
  CUresult r = encode_fn()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, base, dims, strides, box, es,
                                      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_64B,
                                      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) { printf("map_rope failed %d\n", (int)r); exit(1); }
  return m;
}

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)

template <bool kPipe, bool kSched>
static void run_case(int works, int ctx, int grp, int sms, float scale) {
  auto kern = ds::decode<kPipe, kSched>;
  CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, ds::kSmem));
  const long long qrows = (long long)works * 128, kvrows = (long long)((works + grp - 1) / grp) * ctx;
  __nv_bfloat16 *q, *kv, *out;
  float *lse, *rout, *rlse;
  double* scratch;
  long long* cyc;
  const int ncl = std::min(sms / 2, works);
  CK(cudaMalloc(&q, qrows * 576 * 2));
  CK(cudaMalloc(&kv, kvrows * 576 * 2));
  CK(cudaMalloc(&out, qrows * 512 * 2));
  CK(cudaMalloc(&lse, qrows * 4));
  const int check_rows = 256;
  CK(cudaMalloc(&rout, check_rows * 512 * 4));
  CK(cudaMalloc(&rlse, check_rows * 4));
  CK(cudaMalloc(&scratch, (long long)check_rows * ctx * 8));
  CK(cudaMalloc(&cyc, 2 * ncl * 2 * 8 * 8));
  ds::fill<<<1024, 256>>>(q, qrows * 576, 17);
  ds::fill<<<1024, 256>>>(kv, kvrows * 576, 91);
  CK(cudaMemset(out, 0xff, qrows * 512 * 2));   // NaN until written
  CUtensorMap mq = map_lat(q, qrows, 128), mqr = map_rope(q, qrows, 128);
  CUtensorMap mk = map_lat(kv, kvrows, 64), mkr = map_rope(kv, kvrows, 64);
  ds::Args a{out, lse, works, ctx, grp, ncl, scale * 1.4426950408889634f, cyc};
  kern<<<2 * ncl, 384, ds::kSmem>>>(a, mq, mqr, mk, mkr);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  ds::reference<<<check_rows, 256>>>(q, kv, ctx, grp, scale, scratch, rout, rlse);
  CK(cudaDeviceSynchronize());
  std::vector<__nv_bfloat16> ho(check_rows * 512);
  std::vector<float> hr(check_rows * 512), hl(check_rows), hrl(check_rows);
  CK(cudaMemcpy(ho.data(), out, ho.size() * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hr.data(), rout, hr.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hl.data(), lse, check_rows * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hrl.data(), rlse, check_rows * 4, cudaMemcpyDeviceToHost));
  double num = 0, den = 0, lerr = 0;
  for (size_t i = 0; i < hr.size(); ++i) {
    const double d = (double)__bfloat162float(ho[i]) - hr[i];
    num += d * d;
    den += (double)hr[i] * hr[i];
  }
  for (int i = 0; i < check_rows; ++i) lerr = std::max(lerr, (double)fabsf(hl[i] - hrl[i]));
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  float best = 1e30f;
  for (int r = 0; r < 3; ++r) {
    cudaEventRecord(e0);
    for (int i = 0; i < 20; ++i) kern<<<2 * ncl, 384, ds::kSmem>>>(a, mq, mqr, mk, mkr);
    cudaEventRecord(e1);
    CK(cudaEventSynchronize(e1));
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    best = std::min(best, ms * 1000.f / 20);
  }
  std::vector<long long> hc(2 * ncl * 2 * 8);
  CK(cudaMemcpy(hc.data(), cyc, hc.size() * 8, cudaMemcpyDeviceToHost));
  std::vector<double> v[7];
  for (int i = 0; i < 4 * ncl; ++i)
    if (hc[8 * i + 1] > 0)
      for (int k = 0; k < 7; ++k) v[k].push_back((double)hc[8 * i + (k == 0 ? 0 : k + 1)] / hc[8 * i + 1]);
  for (auto& x : v) std::sort(x.begin(), x.end());
  const size_t md = v[0].size() / 2;
  printf("pipe %d sched %d | %d | %d | %d | %.1f | %.0f | stage+turn %.0f | QK issue %.0f | QK wait %.0f | exchange %.0f | softmax+rescale %.0f | PV issue %.0f | %.2e | %.2e\n",
         kPipe, kSched, works, ctx, grp, best, v[0][md], v[1][md], v[4][md], v[2][md], v[3][md], v[5][md], v[6][md], std::sqrt(num / den), lerr);
  cudaFree(q); cudaFree(kv); cudaFree(out); cudaFree(lse); cudaFree(rout); cudaFree(rlse); cudaFree(scratch); cudaFree(cyc);
}

int main() {
  int sms;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const float scale = 1.f / sqrtf(576.f);
  printf("smem %d B, %d SMs; cycles a tile and warpgroup: loop (median, range), stage + turn wait, QK wait, exchange\n", ds::kSmem, sms);
  printf("variant | works | ctx | kv_group | us/call | loop | stage+turn | QK wait | exchange | rel L2 | max |LSE err|\n");
  const int cases[][3] = {{64, 3200, 1}, {128, 8192, 2}, {64, 8192, 1}};   // contexts: multiples of 128
  for (auto& c : cases) {
    run_case<false, true>(c[0], c[1], c[2], sms, scale);
    run_case<false, false>(c[0], c[1], c[2], sms, scale);
    run_case<true, true>(c[0], c[1], c[2], sms, scale);
    run_case<true, false>(c[0], c[1], c[2], sms, scale);
  }
  return 0;
}
