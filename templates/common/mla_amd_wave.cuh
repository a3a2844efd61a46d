// The wave64 primitives the AMD decode kernel (templates/mla_decode_amd.cu.j2) uses, on the
// device: one fp8 MFMA, one fp32 -> fp8 pack, a cross-lane permute, the workgroup barrier.
// The kernel text calls nothing else that is AMD-specific (LDS is a plain byte array), so the
// CPU emulator (op_tests/mla_decode_amd_host_emu.cpp) defines these same names for its threads,
// one per lane, and runs the same rendered kernel text (docs/DESIGN.md §10.3).
//
// Lane layouts of V_MFMA_F32_16X16X32_FP8_FP8 (AMD Instinct MI300 "CDNA3" ISA reference guide,
// chapter "Matrix Arithmetic Instructions", its dependent-lane layout of this opcode; the same
// table for CDNA4; as the AMD Matrix Instruction Calculator prints it with --register-layout).
// Lane l (0..63), byte b (0..7) of the 64-bit operands, element g (0..3) of the result:
//   A (16 x 32, M x K): A[l % 16][8 * (l / 16) + b]
//   B (32 x 16, K x N): B[8 * (l / 16) + b][l % 16]
//   D (16 x 16, M x N): D[4 * (l / 16) + g][l % 16]      D = A B + C, fp32 accumulation.
// The fp8 encoding is the target's: e4m3fnuz (bias 8, 0x80 = NaN) on gfx942, OCP e4m3fn
// (bias 7) on gfx950 (the same opcode, per ISA).
#pragma once
#include <stdint.h>

namespace wave {

typedef float f32x4 __attribute__((ext_vector_type(4)));

// This thread's lane within its wave (0..63).
__device__ __forceinline__ int lane_id() {
  return static_cast<int>(__builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u)));
}

// D = A B + C for one 16 x 16 x 32 fp8 tile (layouts above).
__device__ __forceinline__ f32x4 mfma_16x16x32_fp8(uint64_t a, uint64_t b, f32x4 c) {
  return __builtin_amdgcn_mfma_f32_16x16x32_fp8_fp8(static_cast<long>(a), static_cast<long>(b), c, 0, 0, 0);
}

// Four floats -> four fp8 codes of the target's encoding, x in the low byte (two
// v_cvt_pk_fp8_f32: round to nearest even, clamp bit clear).
__device__ __forceinline__ uint32_t pack_fp8x4(float x, float y, float z, float w) {
  int r = __builtin_amdgcn_cvt_pk_fp8_f32(x, y, 0, false);
  r = __builtin_amdgcn_cvt_pk_fp8_f32(z, w, r, true);
  return static_cast<uint32_t>(r);
}

// The value v of lane `src` of this wave (ds_bpermute_b32: every lane reads one lane).
__device__ __forceinline__ uint32_t permute(uint32_t v, int src) {
  return static_cast<uint32_t>(__builtin_amdgcn_ds_bpermute(src << 2, static_cast<int>(v)));
}
__device__ __forceinline__ float permute(float v, int src) {
  return __builtin_bit_cast(float, permute(__builtin_bit_cast(uint32_t, v), src));
}

// Every wave of the workgroup arrives; LDS writes before it are seen by reads after it.
__device__ __forceinline__ void barrier() { __syncthreads(); }

}  // namespace wave
