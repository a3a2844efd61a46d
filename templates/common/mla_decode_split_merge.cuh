// The split-KV merge inside the decode kernel (docs/DESIGN.md §5.10): mla_decode_fwd's
// one-launch path, where no reduce kernel follows the decode.
//
// The threads that wrote one split piece's rows (the 256 consumers of a 64-row CTA, or the
// 128 of a warpgroup_works warpgroup) count the piece on their tile's arrival counter; the
// group that brings the count to the tile's piece count n merges all n pieces of its rows
// (out = sum_i w_i o_i / sum_i w_i, w_i = exp(lse_i - max lse), final LSE = max + ln sum w_i),
// reading the other pieces from L2. Nothing waits for another CTA, so no launch order or
// co-residency is assumed. The counters start at zero: the last CTA of the grid to finish
// zeroes them (finish_launch), so a launch that skipped a bad work record leaves none behind.
//
// One merge reads n x rows x 2 KB through one SM, so the op uses this path only while no tile
// has more than FUSED_MERGE_MAX_PIECES (2) pieces (ops/decode.py); a schedule with more goes to
// the reduce kernel, which spreads those reads over the GPU (docs/DESIGN.md §5.10).
#pragma once

#include <cuda_bf16.h>

namespace mla {
namespace split_merge {

// What the merge reads beside the split buffers; arrivals == nullptr: no merge in this launch.
struct MergeParams {
  unsigned* arrivals;              // [1 + counters]: [0] CTAs finished, then one per (batch, row block)
  const int* reduce_indptr;        // [reduce_indptr_len]: tile (= batch) b's pieces are entries
  const int* reduce_partial_map;   //   reduce_indptr[b] .. [b + 1] of this (first q-token row of each)
  long long reduce_indptr_len;
  long long partial_map_len;
  int counters;                    // num_batches x CTAs per work
};

// bar.sync on named barrier `id` over `threads` threads, returning the OR of `pred` over them.
__device__ __forceinline__ bool bar_or(int id, int threads, bool pred) {
  int r;
  asm volatile(
      "{\n .reg .pred p, q;\n setp.ne.s32 p, %1, 0;\n bar.red.or.pred q, %2, %3, p;\n selp.s32 %0, 1, 0, q;\n}\n"
      : "=r"(r)
      : "r"(static_cast<int>(pred)), "r"(id), "r"(threads)
      : "memory");
  return r != 0;
}

// Counts this group's piece (its rows are written) on `counter`; true, in every thread of the
// group, for the group whose piece completes the tile's n. Release: each writer fences its own
// stores before the barrier that precedes the count; acquire: the last group fences after it.
__device__ __forceinline__ bool arrive(unsigned* counter, int n, int bar_id, int threads, int tid) {
  __threadfence();
  asm volatile("bar.sync %0, %1;\n" ::"r"(bar_id), "r"(threads) : "memory");
  bool last = false;
  if (tid == 0) last = atomicAdd(counter, 1u) + 1u == static_cast<unsigned>(n);
  last = bar_or(bar_id, threads, last);
  if (last) __threadfence();
  return last;
}

__device__ __forceinline__ uint2 pack_bf16x4(float4 v) {
  const __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
  return make_uint2(*reinterpret_cast<const uint32_t*>(&a), *reinterpret_cast<const uint32_t*>(&b));
}

// Merges the n pieces of `rows` rows (rows <= kWarps x 8): row r's piece i is split row
// pmap[start + i] * H + tile_row0 + r, its output row final_row0 + r. Warp w takes rows
// w, w + kWarps, ... (8 of them), each lane 16 of the 512 columns (4 float4, 512 bytes apart
// across the warp: coalesced). Pieces are read with ld.global.cg (L2): other SMs wrote them.
// A piece row outside the split buffers (a corrupt schedule) makes the row NaN, never a bad read.
template <int kWarps, int kRowsPerPass>
__device__ __forceinline__ void merge_rows(const float* split_out, const float* split_lse, long long split_rows,
                                           const int* pmap, int start, int n, int num_heads, long long tile_row0,
                                           __nv_bfloat16* out, float* final_lse, long long final_row0, int rows,
                                           int warp, int lane) {
  constexpr int kRowsPerWarp = 8;
  constexpr int kDv = 512;
  float m[kRowsPerWarp], l[kRowsPerWarp];
  bool bad = false;
#pragma unroll
  for (int k = 0; k < kRowsPerWarp; ++k) {
    m[k] = -INFINITY;
    l[k] = 0.f;
  }
  // Pass 1: the max and the sum of exp(lse - max) of each row, lanes over pieces.
  for (int c = 0; c < n; c += 32) {
    const int i = c + lane;
    long long base = 0;
    if (i < n) {
      const int loc = __ldg(pmap + start + i);
      bad |= loc < 0;
      base = static_cast<long long>(loc) * num_heads + tile_row0;
    }
#pragma unroll
    for (int k = 0; k < kRowsPerWarp; ++k) {
      const int r = warp + kWarps * k;
      if (i >= n || r >= rows) continue;
      const long long row = base + r;
      if (row < 0 || row >= split_rows) {
        bad = true;
        continue;
      }
      const float x = __ldcg(split_lse + row);
      if (x > m[k]) {
        l[k] = l[k] * __expf(m[k] - x) + 1.f;
        m[k] = x;
      } else if (x != -INFINITY) {   // -inf adds nothing (and -inf - -inf would be NaN)
        l[k] += __expf(x - m[k]);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < kRowsPerWarp; ++k) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m[k], off), l2 = __shfl_xor_sync(0xffffffffu, l[k], off);
      const float mn = fmaxf(m[k], m2);
      if (mn != -INFINITY) l[k] = l[k] * __expf(m[k] - mn) + l2 * __expf(m2 - mn);
      m[k] = mn;
    }
  }
  bad = __any_sync(0xffffffffu, bad);

  // Pass 2, kRowsPerPass rows at a time (4: 64 accumulators, 16 loads in flight per piece; the
  // caller picks 2 where 4 would make its main loop spill: the merge shares its registers).
#pragma unroll
  for (int k0 = 0; k0 < kRowsPerWarp; k0 += kRowsPerPass) {
    float4 acc[kRowsPerPass][4];
#pragma unroll
    for (int j = 0; j < kRowsPerPass; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[j][q] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (!bad) {
      for (int c = 0; c < n; c += 32) {
        // Lane u fetches piece c + u's base row and its weight for each of the four rows.
        const int i = c + lane;
        long long base = 0;
        float wt[kRowsPerPass];
#pragma unroll
        for (int j = 0; j < kRowsPerPass; ++j) wt[j] = 0.f;
        if (i < n) {
          base = static_cast<long long>(__ldg(pmap + start + i)) * num_heads + tile_row0;
#pragma unroll
          for (int j = 0; j < kRowsPerPass; ++j) {
            const int r = warp + kWarps * (k0 + j);
            // the SFU's division (l is in [1, pieces]): the IEEE one is a slow-path call
            if (r < rows && m[k0 + j] != -INFINITY) wt[j] = __fdividef(__expf(__ldcg(split_lse + base + r) - m[k0 + j]), l[k0 + j]);
          }
        }
        const int cnt = min(32, n - c);
        for (int u = 0; u < cnt; ++u) {
          const long long b = __shfl_sync(0xffffffffu, base, u);
          float w[kRowsPerPass];
          float4 v[kRowsPerPass][4];
#pragma unroll
          for (int j = 0; j < kRowsPerPass; ++j) {
            w[j] = __shfl_sync(0xffffffffu, wt[j], u);
            const float4* src = reinterpret_cast<const float4*>(split_out + (b + warp + kWarps * (k0 + j)) * kDv) + lane;
#pragma unroll
            for (int q = 0; q < 4; ++q)   // zero weight (no key, or no such row): not read
              v[j][q] = w[j] != 0.f ? __ldcg(src + 32 * q) : make_float4(0.f, 0.f, 0.f, 0.f);
          }
#pragma unroll
          for (int j = 0; j < kRowsPerPass; ++j)
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              acc[j][q].x = fmaf(w[j], v[j][q].x, acc[j][q].x);
              acc[j][q].y = fmaf(w[j], v[j][q].y, acc[j][q].y);
              acc[j][q].z = fmaf(w[j], v[j][q].z, acc[j][q].z);
              acc[j][q].w = fmaf(w[j], v[j][q].w, acc[j][q].w);
            }
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kRowsPerPass; ++j) {
      const int k = k0 + j, r = warp + kWarps * k;
      if (r >= rows) continue;
      const long long row = final_row0 + r;
      uint2* dst = reinterpret_cast<uint2*>(out + row * kDv) + lane;
#pragma unroll
      for (int q = 0; q < 4; ++q)
        dst[32 * q] = pack_bf16x4(bad ? make_float4(NAN, NAN, NAN, NAN) : acc[j][q]);
      if (final_lse != nullptr && lane == 0)
        final_lse[row] = bad ? NAN : (m[k] == -INFINITY ? INFINITY : m[k] + __logf(l[k]));
    }
  }
}

// After a split piece's rows are written: count the piece, and merge the tile's rows if it was
// the last. Rows: this group's valid rows of work w (tile rows tile_row0 ..); bar_id / threads
// / tid: the group's named barrier, size and thread index; kWarps = threads / 32;
// kRowsPerPass: merge_rows'.
template <int kWarps, int kRowsPerPass>
__device__ __forceinline__ void piece_done(const MergeParams& mp, const float* split_out, const float* split_lse,
                                           long long split_rows, int batch, int counter, int num_heads,
                                           long long tile_row0, __nv_bfloat16* out, float* final_lse,
                                           long long final_row0, int rows, int bar_id, int tid) {
  int start = 0, n = 0;
  if (batch + 1 < mp.reduce_indptr_len) {
    start = __ldg(mp.reduce_indptr + batch);
    n = __ldg(mp.reduce_indptr + batch + 1) - start;
  }
  // A tile whose entries leave the map (a corrupt schedule) is never counted, so never merged.
  if (n < 1 || start < 0 || start + static_cast<long long>(n) > mp.partial_map_len) return;
  if (!arrive(mp.arrivals + 1 + counter, n, bar_id, kWarps * 32, tid)) return;
  merge_rows<kWarps, kRowsPerPass>(split_out, split_lse, split_rows, mp.reduce_partial_map, start, n, num_heads, tile_row0, out,
                     final_lse, final_row0, rows, tid >> 5, tid & 31);
}

// Once per CTA, by the 256 consumer threads (named barrier bar_id) after their last work: the
// grid's last CTA to get here zeroes the counters for the next launch on this stream (which
// reads them only after this grid completed: PDL's wait, or stream order).
__device__ __forceinline__ void finish_launch(const MergeParams& mp, int bar_id, int tid) {
  __threadfence();
  asm volatile("bar.sync %0, 256;\n" ::"r"(bar_id) : "memory");
  if (tid >= 32) return;
  bool last = false;
  if (tid == 0) last = atomicAdd(mp.arrivals, 1u) + 1u == gridDim.x * gridDim.y;
  last = __shfl_sync(0xffffffffu, last, 0);
  if (!last) return;
  __threadfence();
  for (int i = 1 + tid; i <= mp.counters; i += 32) mp.arrivals[i] = 0u;
  if (tid == 0) mp.arrivals[0] = 0u;
}

}  // namespace split_merge
}  // namespace mla
