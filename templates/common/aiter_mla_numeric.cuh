// Portable number formats by bit manipulation: fp8 e4m3 (OCP "fn") decode and float -> bf16
// round-to-nearest-even. Host and device: no runtime header, so the same code compiles under
// nvcc, hipcc, clang -x hip -nogpuinc and a plain C++ compiler (op_tests check it there
// against torch on all 256 fp8 codes).
//
// Encoding: OCP FP8 E4M3 ("e4m3fn", torch.float8_e4m3fn, what NVIDIA sm_89+ and AMD gfx950
// implement): bias 7, no infinities, S.1111.111 = NaN, max 448. AMD gfx942 hardware uses the
// other variant, e4m3fnuz (bias 8, 0x80 = NaN, no -0); we decode e4m3fn on every target so one
// fp8 tensor means the same numbers everywhere.
#pragma once
#include <stdint.h>

#ifndef AITER_MLA_HD
#if defined(__CUDACC__) || defined(__HIP__)
#define AITER_MLA_HD __host__ __device__
#else
#define AITER_MLA_HD
#endif
#endif

AITER_MLA_HD inline uint32_t aiter_mla_f2u(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, sizeof(u));
  return u;
}

AITER_MLA_HD inline float aiter_mla_u2f(uint32_t u) {
  float f;
  __builtin_memcpy(&f, &u, sizeof(f));
  return f;
}

// fp8 e4m3fn code -> float (exact: every e4m3 value is a float).
AITER_MLA_HD inline float aiter_mla_e4m3fn_to_float(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24;
  const uint32_t exp = (v >> 3) & 0xFu;
  const uint32_t man = v & 0x7u;
  if (exp == 0xFu && man == 0x7u) return aiter_mla_u2f(sign | 0x7FC00000u);  // NaN
  // Subnormal: man * 2^-9; normal: 2^(exp-7) * (1 + man/8), rebased to float's bias 127.
  const float mag = exp == 0 ? static_cast<float>(man) * 0.001953125f
                             : aiter_mla_u2f(((exp + 120u) << 23) | (man << 20));
  return aiter_mla_u2f(aiter_mla_f2u(mag) | sign);
}

// float -> bf16 bits, round to nearest even; NaN stays a (quiet) NaN.
AITER_MLA_HD inline uint16_t aiter_mla_float_to_bf16_bits(float f) {
  uint32_t u = aiter_mla_f2u(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// 2^x on the FMA pipe, for softmax arguments (x <= 0 up to rounding; valid for x < 127): the
// fp8 softmax takes part of its exponentials here instead of the SFU's ex2, whose pipe then
// carries fewer of them (mla_decode_sm90_tile_pairs.cuh). x = j + f with j = round(x) (from
// the low mantissa bits of x + 1.5 * 2^23) and f in [-0.5, 0.5]; 2^f by a degree-4 polynomial
// with constant term 1 (so 2^0 = 1 exactly: the row's max keeps p = 1), fitted for relative
// error (max 2.9e-6, checked on the host in op_tests); 2^j added to the exponent bits. Like
// ex2.approx.ftz: 0 below -126 (and for -inf), NaN stays NaN.
AITER_MLA_HD inline float aiter_mla_exp2_fma(float x) {
  const float kRound = 12582912.f;   // 1.5 * 2^23
  const float xc = x < -126.f ? -126.f : x;
  const float t = xc + kRound;
  const float f = xc - (t - kRound);
  float p = __builtin_fmaf(0.0095828525870487f, f, 0.05590642847265837f);
  p = __builtin_fmaf(p, f, 0.24024098645418382f);
  p = __builtin_fmaf(p, f, 0.693124192890907f);
  p = __builtin_fmaf(p, f, 1.f);
  const float r = aiter_mla_u2f(aiter_mla_f2u(p) + (aiter_mla_f2u(t) << 23));
  return x < -126.f ? 0.f : r;
}
