// Does cuTensorMapEncodeTiled accept a 3-D map {16 B, rows, 36 chunks} with strides {576, 16}
// (non-monotonic), and does the box {16, 8, 36} land as the interleaved core-matrix layout?
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>
#include <cstdio>
#include <cstdint>
#include <vector>

__global__ void k(const __grid_constant__ CUtensorMap m, int row0, uint8_t* out) {
  __shared__ __align__(128) uint8_t buf[4608];
  __shared__ __align__(8) uint64_t bar;
  uint32_t b = (uint32_t)__cvta_generic_to_shared(&bar), d = (uint32_t)__cvta_generic_to_shared(buf);
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(b));
    asm volatile("fence.mbarrier_init.release.cluster;");
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(4608));
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];"
                 ::"r"(d), "l"(&m), "r"(0), "r"(row0), "r"(0), "r"(b) : "memory");
    uint32_t done = 0;
    while (!done) asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; selp.u32 %0,1,0,p; }" : "=r"(done) : "r"(b));
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 4608; i += blockDim.x) out[i] = buf[i];
}

int main() {
  const int R = 100;
  std::vector<uint8_t> h(R * 576);
  for (int r = 0; r < R; ++r) for (int c = 0; c < 576; ++c) h[r * 576 + c] = (r * 7 + c * 3 + 1) & 0xff;
  uint8_t *dpool, *dout; cudaMalloc(&dpool, h.size()); cudaMalloc(&dout, 4608);
  cudaMemcpy(dpool, h.data(), h.size(), cudaMemcpyHostToDevice);
  void* fn = nullptr; cudaDriverEntryPointQueryResult q;
  cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q);
  printf("entry point: %d %d\n", (int)e, (int)q);
  alignas(64) CUtensorMap m;
  cuuint64_t dims[3] = {16, (cuuint64_t)R, 36};
  cuuint64_t strides[2] = {576, 16};
  cuuint32_t box[3] = {16, 8, 36}, es[3] = {1, 1, 1};
  CUresult r = ((PFN_cuTensorMapEncodeTiled_v12000)fn)(&m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, dpool, dims, strides, box, es,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  printf("encode 3d non-monotonic: CUresult %d\n", (int)r);
  if (r != 0) return 1;
  for (int row0 : {0, 8, 13, 96}) {
    k<<<1, 128>>>(m, row0, dout);
    e = cudaDeviceSynchronize();
    std::vector<uint8_t> o(4608); cudaMemcpy(o.data(), dout, 4608, cudaMemcpyDeviceToHost);
    int bad = 0, oob_nonzero = 0;
    for (int c = 0; c < 36; ++c) for (int rr = 0; rr < 8; ++rr) for (int b = 0; b < 16; ++b) {
      int row = row0 + rr; uint8_t got = o[c * 128 + rr * 16 + b];
      if (row < R) bad += got != h[row * 576 + c * 16 + b]; else oob_nonzero += got != 0;
    }
    printf("row0 %d: launch %d, mismatches %d, oob nonzero %d\n", row0, (int)e, bad, oob_nonzero);
  }
  return 0;
}
