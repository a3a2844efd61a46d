// MLA decode on sm_90a: PV computed transposed, O^T[512 x 64] += V^T[512 x keys] . P^T[keys x
// 64], for the tile_pairs loop (mla_decode_sm90_tile_pairs.cuh) and its odd last tile.
//   * A = V^T comes from registers: each consumer warp reads its 16 V columns of the KV stage
//     with ldmatrix.trans (16-bit elements = 2 columns of one key) and one prmt per register
//     merges two keys' halves into the e4m3 k32 A fragment. Nothing is written back (a V^T tile
//     written to shared memory every tile, 32 KB read + 32 KB written, was the limiter).
//   * B = P^T is P itself in shared memory (rows of P are K-major: positions contiguous).
// Warpgroup c owns O^T rows (V columns) [256c, 256c + 256) as four m64n64 accumulators
// (128 floats per thread). In the S layout warp g holds rows 16g + lane/4 (+8); the per-row
// factors and 1/l go through shared memory to the O^T layout (thread holds 16 rows x 8
// columns).
//
// A-fragment row rho (0..15) of warp w in m-block mb of warpgroup c is V column
// 16 X + 2 (rho % 8) + rho / 8 with X = 16 c + 4 mb + w (a 16-column chunk of V): the
// ldmatrix.trans lane (j, r) = (lane / 4, lane % 4) holds columns 2j, 2j + 1.
//
// Key order inside V^T. ldmatrix.trans hands lane (j, r) the bytes of keys 2r, 2r+1 for
// columns 2j, 2j+1; two such matrices (keys 0-7 and 8-15 of a 16-key block) are merged with
// one prmt per column into 4-key words. So positions 4r..4r+3 of a 16-key block hold keys
// 2r, 2r+1, 8+2r, 9+2r. PV sums over keys, so any order works as long as P uses the same one:
// P's column for key k is at p_pos(k).
#pragma once
#include "mla_decode_sm90_fp8.cuh"

namespace mla {
namespace transposed_pv {

// Position of tile key k (0 .. BN-1) in P's columns and V^T's K dimension (see the header).
__device__ __forceinline__ int p_pos(int k) {
  const int kk = k & 15;
  return (k & ~15) | (((kk & 7) >> 1) << 2) | ((kk >> 3) << 1) | (kk & 1);
}

// Byte offset of P(row, position) in a P buffer (K-major core matrices, see the config).
__device__ __forceinline__ int p_offset(int row, int pos) {
  return (row >> 3) * 512 + (pos >> 4) * 128 + (row & 7) * 16 + (pos & 15);
}

// Where softmax stores P: the thread's pair of keys key0 + 8 j, +1 (key0 = its first key, even,
// a multiple of 32 plus 2 (lane % 4)) of rows r0 and r0 + 8 lie at p_row(r0, key0) +
// p_step(j) and + 512 + p_step(j): p_pos moves n8 tile j by 16 (j / 2) + 2 (j % 2) positions.
__device__ __forceinline__ int p_row(int r0, int key0) { return p_offset(r0, p_pos(key0)); }
__device__ __forceinline__ constexpr int p_step(int j) { return (j >> 1) * 128 + (j & 1) * 2; }

// This warp's A fragments of PV for the tile in `stage`: a[mb][kk] for m-block mb, k32 step kk.
// Keys at or past `valid` (tile tail: not loaded, or a TMA box's rows past the work's end,
// possibly NaN) become 0 so that P = 0 never meets them.
template <class C, bool Tail>
__device__ __forceinline__ void load_vt_frags_impl(uint32_t (&a)[C::kMBlocks][C::BN / 32][4], const uint8_t* smem,
                                                   int stage, int half, int warp_in_wg, int lane, int valid) {
  const int m = lane >> 3, i = lane & 7, r = lane & 3;
  // lane (m, i) addresses key row 8m + i of the 32-key step, in its warp's 16-column chunk
  uint32_t src = smem_addr(smem + C::kOffKv + stage * C::kStageBytes);
  uint32_t sw = 0;
  if constexpr (C::kSwizzled) {
    src += (8 * m + i) * 64;
    sw = static_cast<uint32_t>(i >> 1) & 3;   // (row / 2) % 4 of this lane's rows
  } else {
    src += m * C::kGroupBytes + i * 16;   // row 8m + i of the step: group m, row i
  }
#pragma unroll
  for (int mb = 0; mb < C::kMBlocks; ++mb) {
    const int x = 16 * half + 4 * mb + warp_in_wg;   // 16-column chunk of V
#pragma unroll
    for (int kk = 0; kk < C::BN / 32; ++kk) {
      uint32_t d[4];
      if constexpr (C::kSwizzled) {
        ldmatrix_x4_trans(d, src + (x >> 2) * (C::BN * 64) + kk * 32 * 64 + ((((x & 3) ^ sw)) << 4));
      } else {
        ldmatrix_x4_trans(d, src + kk * 4 * C::kGroupBytes + x * 128);
      }
      if (Tail && valid < (kk + 1) * 32) {
        // low 16 bits of d[q] = key 8q + 2r of the step, high = 8q + 2r + 1 (both columns)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int k0 = kk * 32 + 8 * q + 2 * r;
          d[q] &= (k0 < valid ? 0x0000ffffu : 0u) | (k0 + 1 < valid ? 0xffff0000u : 0u);
        }
      }
      a[mb][kk][0] = fp8::prmt(d[0], d[1], 0x6420);   // row j: column 2j, positions 4r.. of block 0
      a[mb][kk][1] = fp8::prmt(d[0], d[1], 0x7531);   // row j + 8: column 2j + 1
      a[mb][kk][2] = fp8::prmt(d[2], d[3], 0x6420);   // block 1 (positions 16 + 4r ..)
      a[mb][kk][3] = fp8::prmt(d[2], d[3], 0x7531);
    }
  }
}

// Tail = false (every key of the tile valid): no mask code between the ldmatrix, which then
// issue back to back (a per-load mask branch serialised them).
template <class C>
__device__ __forceinline__ void load_vt_frags(uint32_t (&a)[C::kMBlocks][C::BN / 32][4], const uint8_t* smem,
                                              int stage, int half, int warp_in_wg, int lane, int valid) {
  if (valid >= C::BN) {
    load_vt_frags_impl<C, false>(a, smem, stage, half, warp_in_wg, lane, valid);
  } else {
    load_vt_frags_impl<C, true>(a, smem, stage, half, warp_in_wg, lane, valid);
  }
}

// softmax_row_max, then P(t) as e4m3 into P buffer `buf` (B layout, keys at p_pos), O^T's row
// factors into scale[buf] (warpgroup 0's quad leaders), l = l * factor + this thread's p sum.
template <class C>
__device__ __forceinline__ void softmax_p(float (&s)[C::kSTiles][4], RowState& st, uint8_t* smem, int buf, int tok0,
                                          float scale_log2, int group, int half, int lane) {
  const int r0 = group * 16 + (lane >> 2);
  float scale_o[2], mx[2];
  const float sc = softmax_row_max<C>(s, st, scale_o, mx, smem, tok0, scale_log2, group, half, lane);
  float sum[2];
  uint8_t* p = smem + C::kOffP + buf * C::kPBytes + p_row(r0, half * (C::BN / 2) + (lane & 3) * 2);
  exp_scores<C>(s, mx, sc, sum, [&](int j, float p0, float p1, float p2, float p3) {
    *reinterpret_cast<__nv_fp8x2_storage_t*>(p + p_step(j)) = fp8::e4m3x2(p0, p1);
    *reinterpret_cast<__nv_fp8x2_storage_t*>(p + 512 + p_step(j)) = fp8::e4m3x2(p2, p3);
  });
#pragma unroll
  for (int h = 0; h < 2; ++h) st.l[h] = st.l[h] * scale_o[h] + sum[h];
  if (half == 0 && (lane & 3) == 0) {
    float* scale = reinterpret_cast<float*>(smem + C::kOffScale) + buf * kRows;
    scale[r0] = scale_o[0];
    scale[r0 + 8] = scale_o[1];
  }
}

// O^T columns (query rows) of this thread: 8i + 2 (lane % 4) + {0, 1}, i = 0..7; accumulator
// element e of tile i is row 8i + 2 (lane % 4) + (e & 1), V column + (e >> 1).
// O^T accumulators: o[8 mb + i] is n8 tile i of m-block mb (the [32][4] array of the other loops).
// The factors of this thread's O^T columns from scale[buf]: f[i] for rows 8i + 2 (lane % 4) and
// + 1. Returns whether any factor of the warp differs from 1 (skipping factors of exactly 1 is
// exact).
template <class C>
__device__ __forceinline__ bool load_factors(float2 (&f)[8], const uint8_t* smem, int buf, int lane) {
  const float* scale = reinterpret_cast<const float*>(smem + C::kOffScale) + buf * kRows + 2 * (lane & 3);
  bool any = false;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    f[i] = *reinterpret_cast<const float2*>(scale + 8 * i);
    any |= f[i].x != 1.f || f[i].y != 1.f;
  }
  return __any_sync(0xffffffffu, any);
}

// O^T's m-block mb (tiles o[8 mb .. 8 mb + 7]) times the factors of its columns.
__device__ __forceinline__ void scale_mblock(float (&o)[32][4], int mb, const float2 (&f)[8]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    o[8 * mb + i][0] *= f[i].x;
    o[8 * mb + i][2] *= f[i].x;
    o[8 * mb + i][1] *= f[i].y;
    o[8 * mb + i][3] *= f[i].y;
  }
}

template <class C>
__device__ __forceinline__ void rescale_ot(float (&o)[C::kOTiles][4], const uint8_t* smem, int buf, int lane) {
  float2 f[8];
  if (load_factors<C>(f, smem, buf, lane)) {
#pragma unroll
    for (int mb = 0; mb < C::kMBlocks; ++mb) scale_mblock(o, mb, f);
  }
}

// O^T[64 x 64] (tiles o[8 MB .. 8 MB + 7]) += A[64 x 32 positions] (e4m3 registers) .
// B[32 positions x 64 rows] (P, shared memory).
#define AITER_MLA_OT_T(i) "+f"(o[8 * MB + i][0]), "+f"(o[8 * MB + i][1]), "+f"(o[8 * MB + i][2]), "+f"(o[8 * MB + i][3])
template <int MB>
__device__ __forceinline__ void wgmma_pv_t(float (&o)[32][4], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, 1, 1, 1;\n"
      : AITER_MLA_OT_T(0), AITER_MLA_OT_T(1), AITER_MLA_OT_T(2), AITER_MLA_OT_T(3), AITER_MLA_OT_T(4),
        AITER_MLA_OT_T(5), AITER_MLA_OT_T(6), AITER_MLA_OT_T(7)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
#undef AITER_MLA_OT_T

template <class C, int MB>
__device__ __forceinline__ void pv_issue_blocks(float (&o)[C::kOTiles][4],
                                                const uint32_t (&a)[C::kMBlocks][C::BN / 32][4], uint32_t p) {
  if constexpr (MB < C::kMBlocks) {
#pragma unroll
    for (int kk = 0; kk < C::BN / 32; ++kk) wgmma_pv_t<MB>(o, a[MB][kk], wg::make_desc(p + kk * 256, 128, 512));
    pv_issue_blocks<C, MB + 1>(o, a, p);
  }
}

// Issues (does not wait for) O^T[this warpgroup's 256 V columns x 64 rows] += V^T . P^T(buf).
template <class C>
__device__ __forceinline__ void pv_issue(float (&o)[C::kOTiles][4], const uint32_t (&a)[C::kMBlocks][C::BN / 32][4],
                                         const uint8_t* smem, int buf) {
  wg::fence_operands(o);
  wg::wgmma_fence();
  pv_issue_blocks<C, 0>(o, a, smem_addr(smem + C::kOffP + buf * C::kPBytes));
  wg::wgmma_commit();
  wg::fence_operands(o);
}

// Epilogue: row_totals in the S layout, 1/l through shared memory, then this thread's 16 rows
// x 8 V columns: bf16 O and the final LSE (unsplit work) or fp32 partial O and LSE (split).
template <class C>
__device__ __forceinline__ void write_output(const float (&o)[C::kOTiles][4], RowState& st, uint8_t* smem,
                                             const Work& w, int row_base, int num_heads, float out_scale,
                                             __nv_bfloat16* __restrict__ out, float* __restrict__ final_lse,
                                             float* __restrict__ split_out, float* __restrict__ split_lse,
                                             int group, int half, int lane) {
  const bool split = w.partial_qo_loc >= 0;
  float inv[2], lse[2];
  row_totals<C>(st, smem, split, out_scale, group, half, lane, inv, lse);
  float* row_inv = reinterpret_cast<float*>(smem + C::kOffInv);
  if (half == 0 && (lane & 3) == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = group * 16 + (lane >> 2) + 8 * h;
      row_inv[r] = inv[h];
      if (r < w.valid_rows) {
        if (split) {
          split_lse[(int64_t)w.partial_qo_loc * num_heads + row_base + r] = lse[h];
        } else if (final_lse != nullptr) {
          final_lse[(int64_t)w.qo_start * num_heads + row_base + r] = lse[h];
        }
      }
    }
  }
  wg::consumer_sync();   // row_inv of all 64 rows
  const int64_t row0 = (split ? (int64_t)w.partial_qo_loc : (int64_t)w.qo_start) * num_heads + row_base;
  // The 16 factors read at once (one shared-memory latency, not 16 in turn). (Predicating each
  // store on its row instead of the `continue` spilled more at page size 1: 176 B of stack.)
  float f[8][2];
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int e = 0; e < 2; ++e) f[i][e] = row_inv[8 * i + 2 * (lane & 3) + e];
  // Each value v0, v1 of row r at column col, to `store` (fp8::store_pairs picks it).
  auto each_pair = [&](auto&& store) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int r = 8 * i + 2 * (lane & 3) + e;
        if (r >= w.valid_rows) continue;
#pragma unroll
        for (int mb = 0; mb < C::kMBlocks; ++mb) {
          const int col = 16 * (16 * half + 4 * mb + group) + 2 * (lane >> 2);
          store((row0 + r) * kVDim + col, o[8 * mb + i][e] * f[i][e], o[8 * mb + i][e + 2] * f[i][e]);
        }
      }
    }
  };
  fp8::store_pairs(each_pair, split, split_out, out);
}

}  // namespace transposed_pv
}  // namespace mla
