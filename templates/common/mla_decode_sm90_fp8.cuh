// MLA decode on sm_90a: what the two fp8 main loops (tile_pairs, warpgroup_works) share: the
// fp8 tile constants with their TMA boxes, P's e4m3 rounding and the byte permute that merges
// ldmatrix.trans halves into e4m3 A fragments of PV (V^T from the KV stage: fp8 wgmma operands
// must be K-major, and V is key-major in the stage), and the epilogue's choice of store.
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

// The O^T epilogues hand each row's pairs of values to `each_pair(store)`; this picks the store
// once per work, fp32 partial rows (split) or bf16 output rows. Tested outside the loop: inside
// it, every thread issued both kinds of store, one predicated off, and the epilogue's length
// decides a short work's time (docs/perf/rows_split_epilogue_h100.md).
template <class EachPair>
__device__ __forceinline__ void store_pairs(EachPair&& each_pair, bool split, float* __restrict__ split_out,
                                            __nv_bfloat16* __restrict__ out) {
  if (split) {
    each_pair([&](int64_t at, float v0, float v1) { *reinterpret_cast<float2*>(split_out + at) = make_float2(v0, v1); });
  } else {
    each_pair([&](int64_t at, float v0, float v1) {
      *reinterpret_cast<__nv_bfloat162*>(out + at) = __floats2bfloat162_rn(v0, v1);
    });
  }
}

}  // namespace fp8
}  // namespace mla
