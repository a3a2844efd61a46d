// Diagnostic (never shipped): the latency of exchanging a 64 x 64 fp32 partial score tile
// (16 KB) between the two CTAs of a 2-CTA cluster, per consumer warpgroup and tile, as a
// dim-split 128-row decode would do every tile. Each WG writes its 32 floats a thread into the
// peer CTA's buffer with st.async (completing bytes on the peer's mbarrier), waits for the
// peer's 16 KB in its own buffer, reads and adds them, then frees the buffer by a remote arrive.
// Modes: 0 = DSMEM, double buffer; 1 = DSMEM, single buffer; 2 = local only (own smem + WG
// barrier; the floor); work = FMA chain cycles between exchanges (a softmax's stand-in).
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ uint32_t mapa(uint32_t a, uint32_t rank) {
  uint32_t r; asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank)); return r;
}
__device__ __forceinline__ void mbar_init(uint32_t b, int n) { asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(b), "r"(n)); }
__device__ __forceinline__ void expect_tx(uint32_t b, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(b), "r"(bytes) : "memory");
}
__device__ __forceinline__ void arrive_local(uint32_t b) { asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(b) : "memory"); }
__device__ __forceinline__ void arrive_remote(uint32_t cb) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" :: "r"(cb) : "memory");
}
__device__ __forceinline__ void wait_cluster(uint32_t b, uint32_t parity) {
  asm volatile("{\n.reg .pred p;\nW: mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%0], %1;\n@!p bra W;\n}\n" :: "r"(b), "r"(parity) : "memory");
}
__device__ __forceinline__ void st_async4(uint32_t cdst, float a, float b, float c, float d, uint32_t cbar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];"
               :: "r"(cdst), "r"(__float_as_uint(a)), "r"(__float_as_uint(b)), "r"(__float_as_uint(c)), "r"(__float_as_uint(d)), "r"(cbar) : "memory");
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
__device__ __forceinline__ uint32_t cluster_rank() { uint32_t r; asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r)); return r; }
__device__ __forceinline__ void wg_bar(int id) { asm volatile("bar.sync %0, 128;" :: "r"(id) : "memory"); }

constexpr int kTile = 64 * 64 * 4;   // bytes a WG sends a tile

__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(256) xchg(int iters, int mode, int work, long long* out, float* sink) {
  extern __shared__ __align__(128) unsigned char smem[];
  // recv[w][k] (2 x 2 x 16 KB), then full[w][k], empty[w][k] mbarriers
  float* recv = reinterpret_cast<float*>(smem);
  const uint32_t bars = smem_u32(smem + 4 * kTile);
  const int tid = threadIdx.x, w = tid >> 7, t = tid & 127;
  const uint32_t me = cluster_rank(), peer = me ^ 1;
  auto full = [&](int k) { return bars + (w * 2 + k) * 8; };
  auto empty = [&](int k) { return bars + 32 + (w * 2 + k) * 8; };
  if (t == 0) for (int k = 0; k < 2; ++k) { mbar_init(full(k), 1); mbar_init(empty(k), 1); }
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  cluster_sync();
  const int nbuf = mode == 1 ? 1 : 2;
  float acc[32];
  for (int j = 0; j < 32; ++j) acc[j] = tid * 0.001f + j;
  long long t0 = 0;
  for (int i = 0; i < iters + 8; ++i) {
    if (i == 8) t0 = clock64();
    const int k = i % nbuf;
    const uint32_t par = (i / nbuf) & 1;
    float* buf = recv + (w * 2 + k) * (kTile / 4);
    if (mode == 2) {
      wg_bar(1 + w);   // the previous read of buf is done
      for (int j = 0; j < 32; j += 4) *reinterpret_cast<float4*>(buf + (j / 4 * 128 + t) * 4) = make_float4(acc[j], acc[j + 1], acc[j + 2], acc[j + 3]);
      wg_bar(1 + w);
    } else {
      if (t == 0) expect_tx(full(k), kTile);
      if (i >= nbuf) wait_cluster(empty(k), ((i - nbuf) / nbuf) & 1);   // the peer freed my slot in its buffer
      const uint32_t dst = mapa(smem_u32(buf + t * 4), peer), rb = mapa(full(k), peer);
      for (int j = 0; j < 32; j += 4) st_async4(dst + (j / 4) * 2048, acc[j], acc[j + 1], acc[j + 2], acc[j + 3], rb);
      wait_cluster(full(k), par);
    }
    for (int j = 0; j < 32; j += 4) {
      const float4 v = *reinterpret_cast<const float4*>(buf + (j / 4 * 128 + ((t + (mode == 2 ? 1 : 0)) & 127)) * 4);   // conflict-free: a warp's float4s are 512 contiguous bytes
      acc[j] += v.x * 1e-3f; acc[j + 1] += v.y * 1e-3f; acc[j + 2] += v.z * 1e-3f; acc[j + 3] += v.w * 1e-3f;
    }
    if (mode != 2) {
      wg_bar(1 + w);
      if (t == 0) arrive_remote(mapa(empty(k), peer));   // my buffer k is free for the peer's next write
    }
    for (int r = 0; r < work; ++r)
#pragma unroll
      for (int j = 0; j < 32; ++j) acc[j] = fmaf(acc[j], 0.999f, 1e-4f);
  }
  const long long dt = clock64() - t0;
  cluster_sync();
  if (t == 0) out[(blockIdx.x * 2 + w)] = dt / iters;
  float s = 0; for (int j = 0; j < 32; ++j) s += acc[j];
  if (s == 12345.f) sink[tid] = s;
}

int main() {
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int ctas = sms, smem = 4 * kTile + 64 + 110 * 1024;   // ~175 KB: one CTA an SM
  cudaFuncSetAttribute(xchg, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  long long* out; float* sink;
  cudaMalloc(&out, ctas * 2 * sizeof(long long)); cudaMalloc(&sink, 1024 * 4);
  const char* names[] = {"dsmem double buffer", "dsmem single buffer", "local smem only"};
  printf("mode | work (FMA rounds of 32) | cycles a tile: median / min / max over %d WGs\n", ctas * 2);
  for (int work : {0, 8, 32})
    for (int mode = 0; mode < 3; ++mode) {
      xchg<<<ctas, 256, smem>>>(2000, mode, work, out, sink);
      cudaError_t e = cudaDeviceSynchronize();
      if (e != cudaSuccess) { printf("error %s\n", cudaGetErrorString(e)); return 1; }
      std::vector<long long> h(ctas * 2);
      cudaMemcpy(h.data(), out, h.size() * 8, cudaMemcpyDeviceToHost);
      std::sort(h.begin(), h.end());
      printf("%s | %d | %lld / %lld / %lld\n", names[mode], work, h[h.size() / 2], h.front(), h.back());
    }
  return 0;
}
