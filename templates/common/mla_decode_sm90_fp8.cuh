// MLA decode on sm_90a: what the two fp8 main loops (tile_pairs, warpgroup_works) share: the
// fp8 tile constants with their TMA boxes, P's e4m3 rounding and the byte permute that merges
// ldmatrix.trans halves into e4m3 A fragments of PV (V^T from the KV stage: fp8 wgmma operands
// must be K-major, and V is key-major in the stage).
#pragma once
#include "mla_decode_sm90_wgmma.cuh"

namespace mla {
namespace fp8 {

// The warpgroup tile shape with fp8 Q and KV, plus the TMA boxes.
template <int BlockN, int PageSize, bool Causal>
struct TmaTile : wg::WgmmaTile<BlockN, PageSize, true, Causal> {
  // page_size >= 8: KV stages are loaded by TMA in the 64-byte-swizzled layout (9 column blocks
  // of BN rows x 64 B; a box is kTmaRows rows x 64 B, at most one page); smaller pages keep
  // cp.async and the interleaved layout (a TMA box never spans two pages).
  static constexpr bool kSwizzled = PageSize >= 8;
  static constexpr int kTmaRows = PageSize < BlockN ? PageSize : BlockN;
  static constexpr int kTmaBoxBytes = kTmaRows * 64;
};

// Two unnormalised probabilities as e4m3 (AITER's fp8 P; satfinite, round to nearest).
__device__ __forceinline__ __nv_fp8x2_storage_t e4m3x2(float lo, float hi) {
  return __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3);
}

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

}  // namespace fp8
}  // namespace mla
