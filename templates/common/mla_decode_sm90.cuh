// MLA decode on sm_90a: the device vocabulary every main loop shares: the CTA shape, the work
// record, the per-row softmax state, masking and the online softmax's max half, and the
// epilogue of the loops that keep O in the S layout (alternating).
//
// One CTA = 64 query rows of one work, 256 consumer threads = 8 warps = 2 warpgroups of 4 row
// groups (16 rows, the wgmma M layout). In the S layout a thread of warp (g, c) owns rows
// r = 16g + lane/4 and r + 8. When the two warpgroups split a tile's keys (QK) they exchange
// their partial row max through shared memory, so both hold the same running max m; each
// keeps a partial row sum l (over its own keys), summed once in the epilogue.
//
// Why this shape: 64 x 512 fp32 of O is 128 registers per thread over 8 warps; 128 rows would
// be the SM's whole register file (docs/DESIGN.md §9.1), so a 128-row tile runs as two 64-row
// CTAs that read the same KV (grid.y = 2), as FlashMLA does.
//
// Every device function here takes the tile config `C` so the main loops in mla_decode.cu.j2
// read as the maths of docs/DESIGN.md §5.9 without touching loads, masking or the epilogue.
#pragma once
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>
#include <math.h>

namespace mla {

constexpr int kQkDim = 576;      // 512 latent + 64 RoPE
constexpr int kVDim = 512;       // V = first 512 columns of the KV row
constexpr int kRows = 64;        // query rows per CTA
constexpr int kThreads = 256;    // 8 warps

// ---- tile configuration (compile-time; instantiated by the template) ----------------------
// log2 of the page size, which must be a power of two in 1..256 (every config's kLog2P).
template <int P>
constexpr int log2_page_size() {
  static_assert(P >= 1 && P <= 256 && (P & (P - 1)) == 0, "page_size must be a power of two <= 256");
  int l = 0;
  while ((1 << l) < P) ++l;
  return l;
}

// ---- PTX wrappers ---------------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy; src_bytes == 0 zero-fills the destination without reading src (tails,
// padded rows: garbage such as NaN in unused page slots is never loaded).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// Two probabilities as one bf16x2 word of P (the alternating loop's PV is a bf16 wgmma).
__device__ __forceinline__ uint32_t pack2_bf16(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

// Barrier for the two warps of one row group (ids 1..4; id 0 is __syncthreads).
__device__ __forceinline__ void pair_sync(int group) {
  asm volatile("bar.sync %0, 64;\n" ::"r"(group + 1) : "memory");
}

// ---- the work being processed ---------------------------------------------------------------
struct Work {
  int batch_idx, partial_qo_loc, qo_start, qo_end;
  int kv_tok_start, kv_tok_end;   // virtual token range [start, end)
  int kv_offset;
  int valid_rows;                  // CTA rows [0, valid_rows) are real (token, head); may be <= 0
};

// Per-thread row state: a thread of warp (g, c) owns rows r = 16g + lane/4 and r + 8.
struct RowState {
  float m[2];        // running max in log2 units (shared by the warp pair)
  float l[2];        // partial row sum over this thread's keys
  int key_end[2];    // first invisible virtual token for the row (causal / tail / invalid row)
  int full_end;      // a tile ending at or before it needs no key mask: every valid row of the CTA
                     // sees all its keys (padded rows then score finite keys: unused, unwritten)
};

// 2^x by the SFU alone (ex2.approx.ftz: about 2 ulp; results below 2^-126 flush to 0, which
// is negligible beside the row max's 1). exp2f adds a denormal range fix-up around each SFU
// op: 3 more instructions per probability in the hot loop. ex2(-inf) = 0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// ---- global -> shared loads ------------------------------------------------------------------
// The page table as the KV loaders see it: the ids and the pool's page count.
struct PageTable {
  const int* __restrict__ ids;   // kv_indices
  unsigned num_pages;            // <= 2^32 - 1 (the pool has at most 2^32 rows)
  unsigned last_page;            // num_pages - 1
};

// Physical row of virtual token v in the [num_pages * P, 576] pool: kv_indices[v / P] * P +
// v % P (64-bit: pools over 2^31 bytes); the page lookup of the TMA loader (the cp.async one
// folds the same check into its copy predicate). A page id outside [0, num_pages) reads page
// num_pages - 1 instead, so no copy leaves the pool, and sets `bad`: the producer reports it
// once its loop is done (report_bad_pages in mla_decode.cu.j2), so the lookup stays a compare
// and a min (the fp8 producers run on 24 registers).
template <class C>
__device__ __forceinline__ int64_t kv_pool_row(const PageTable& pt, int v, bool& bad) {
  const unsigned page = static_cast<unsigned>(__ldg(pt.ids + (v >> C::kLog2P)));
  bad |= page >= pt.num_pages;   // negative ids are huge here
  return (static_cast<int64_t>(min(page, pt.last_page)) << C::kLog2P) + (v & (C::P - 1));
}

// ---- maths -----------------------------------------------------------------------------------
// O's two rows per thread times their factors.
template <class C>
__device__ __forceinline__ void scale_rows(float (&o)[C::kOTiles][4], const float (&scale_o)[2]) {
#pragma unroll
  for (int j = 0; j < C::kOTiles; ++j) {
    o[j][0] *= scale_o[0];
    o[j][1] *= scale_o[0];
    o[j][2] *= scale_o[1];
    o[j][3] *= scale_o[1];
  }
}

// Masks keys at or past each row's key_end to -inf (kbase: the virtual token of s[0][0];
// s[j][e] is key kbase + 8 j + (e & 1)) and returns in mx the max of each of its two rows over
// the quad (the 4 lanes sharing the rows), in the exp2 domain. Returns the factor the scores
// still need (exp_scores applies it): a tile that ends by st.full_end (tile_end, uniform) with
// a positive scale leaves them unscaled (max(s) * scale = max(s * scale), so the scale costs
// one multiply per row here and rides in each probability's FFMA); otherwise they are masked
// and scaled here and the factor is 1 (any scale sign stays exact).
template <class C>
__device__ __forceinline__ float masked_quad_max(float (&s)[C::kSTiles][4], const RowState& st, int kbase,
                                                 int tile_end, float scale_log2, float (&mx)[2]) {
  mx[0] = mx[1] = -INFINITY;
  float sc = 1.f;
  if (tile_end <= st.full_end && scale_log2 > 0.f) {
#pragma unroll
    for (int j = 0; j < C::kSTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) mx[e >> 1] = fmaxf(mx[e >> 1], s[j][e]);
    sc = scale_log2;
  } else {
#pragma unroll
    for (int j = 0; j < C::kSTiles; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e >> 1;
        const int key = kbase + j * 8 + (e & 1);
        const float v = key < st.key_end[h] ? s[j][e] * scale_log2 : -INFINITY;
        s[j][e] = v;
        mx[h] = fmaxf(mx[h], v);
      }
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
    mx[h] *= sc;
  }
  return sc;
}

// The max half of the online softmax for one tile (exp2 domain): masks keys at or beyond each
// row's key_end to -inf (masked_quad_max), agrees the new row max with the partner warp (through
// shared memory, one pair barrier), and returns the factor O and l must be multiplied by
// (scale_o) and the reference each p = exp2(s * sc - m_ref) uses; returns sc (masked_quad_max).
// A row whose max is still -inf uses 0 as reference, so p = 0 and the factor is 0 (no NaN from
// -inf - -inf).
template <class C>
__device__ __forceinline__ float softmax_row_max(float (&s)[C::kSTiles][4], RowState& st, float (&scale_o)[2],
                                                 float (&m_ref)[2], uint8_t* smem, int tok0, float scale_log2,
                                                 int group, int half, int lane) {
  float* red_max = reinterpret_cast<float*>(smem + C::kOffRed);   // [2][64]
  const int r0 = group * 16 + (lane >> 2);
  float mx[2];
  const float sc = masked_quad_max<C>(s, st, tok0 + half * (C::BN / 2) + (lane & 3) * 2, tok0 + C::BN, scale_log2, mx);
  if ((lane & 3) == 0) {
    red_max[half * kRows + r0] = mx[0];
    red_max[half * kRows + r0 + 8] = mx[1];
  }
  pair_sync(group);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float other = red_max[(half ^ 1) * kRows + r0 + 8 * h];
    const float m_new = fmaxf(st.m[h], fmaxf(mx[h], other));
    m_ref[h] = m_new == -INFINITY ? 0.f : m_new;
    scale_o[h] = fast_exp2(st.m[h] - m_ref[h]);
    st.m[h] = m_new;
  }
  return sc;
}

// p = exp2(s * sc - m_ref) for this thread's scores (after softmax_row_max, sc its result);
// store(j, p0, p1, p2, p3) writes n8 tile j's values (row r0: p0, p1; row r0 + 8: p2, p3);
// sum gets the two row sums.
template <class C, class Store>
__device__ __forceinline__ void exp_scores(const float (&s)[C::kSTiles][4], const float (&m_ref)[2], float sc,
                                           float (&sum)[2], Store store) {
  sum[0] = sum[1] = 0.f;
#pragma unroll
  for (int j = 0; j < C::kSTiles; ++j) {
    const float p0 = fast_exp2(fmaf(s[j][0], sc, -m_ref[0])), p1 = fast_exp2(fmaf(s[j][1], sc, -m_ref[0]));
    const float p2 = fast_exp2(fmaf(s[j][2], sc, -m_ref[1])), p3 = fast_exp2(fmaf(s[j][3], sc, -m_ref[1]));
    sum[0] += p0 + p1;
    sum[1] += p2 + p3;
    store(j, p0, p1, p2, p3);
  }
}

// ---- epilogue ------------------------------------------------------------------------------
// The final per-row values of this thread's two rows (r0 = 16 group + lane / 4 and r0 + 8):
// sums l over the quad and the partner warp (one pair barrier), then inv = out_scale / l and
// LSE = ln(sum exp(score)) = ln2 * (m + log2 l). A row that saw no key (l == 0) gets inv 0 and
// LSE +inf (final) / -inf (partial, split), never NaN.
template <class C>
__device__ __forceinline__ void row_totals(RowState& st, uint8_t* smem, bool split, float out_scale, int group,
                                           int half, int lane, float (&inv)[2], float (&lse)[2]) {
  float* red_sum = reinterpret_cast<float*>(smem + C::kOffRed) + 2 * kRows;   // [2][64]
  const int r0 = group * 16 + (lane >> 2);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    st.l[h] += __shfl_xor_sync(0xffffffffu, st.l[h], 1);
    st.l[h] += __shfl_xor_sync(0xffffffffu, st.l[h], 2);
  }
  if ((lane & 3) == 0) {
    red_sum[half * kRows + r0] = st.l[0];
    red_sum[half * kRows + r0 + 8] = st.l[1];
  }
  pair_sync(group);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float l = st.l[h] + red_sum[(half ^ 1) * kRows + r0 + 8 * h];
    // the special-function unit's reciprocal and log2 (errors ~2^-22): the IEEE division
    // and log2f are long dependent sequences on a short work's critical path
    inv[h] = l > 0.f ? __fdividef(out_scale, l) : 0.f;
    lse[h] = l > 0.f ? (st.m[h] + __log2f(l)) * 0.69314718055994531f : (split ? -INFINITY : INFINITY);
  }
}

// Writes this warp's 256 columns of each valid row: bf16 O * out_scale / l and the final LSE
// (unsplit work), or fp32 partial O and partial LSE (split work); see row_totals.
template <class C>
__device__ __forceinline__ void write_output(const float (&o)[C::kOTiles][4], RowState& st, uint8_t* smem,
                                             const Work& w, int row_base, int num_heads, float out_scale,
                                             __nv_bfloat16* __restrict__ out, float* __restrict__ final_lse,
                                             float* __restrict__ split_out, float* __restrict__ split_lse,
                                             int group, int half, int lane) {
  const int r0 = group * 16 + (lane >> 2);
  const bool split = w.partial_qo_loc >= 0;
  float inv[2], lse[2];
  row_totals<C>(st, smem, split, out_scale, group, half, lane, inv, lse);
  if (!split) {
    // 16-byte stores: a quad holds, for each group of 4 n8 tiles (4k .. 4k + 3), 4 x 4 bf16
    // pairs, lane q those of columns 2q, 2q + 1 of each tile; a quad transpose gives lane q tile
    // 4k + q's 8 columns, so a quad writes 64 contiguous bytes of a row. 4-byte stores wrote 16
    // bytes a row, half a sector each, and made the epilogue store-bound (docs/perf/notes.md).
    // k outermost, both rows inside: each tile's registers die as soon as it is written.
    const int q = lane & 3;
    __nv_bfloat16* dst[2];
#pragma unroll
    for (int h = 0; h < 2; ++h)
      dst[h] = out + ((int64_t)w.qo_start * num_heads + row_base + r0 + 8 * h) * kVDim + half * (kVDim / 2) + q * 8;
#pragma unroll
    for (int k = 0; k < C::kOTiles / 4; ++k) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint32_t a[4];
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          const __nv_bfloat162 v = __floats2bfloat162_rn(o[4 * k + t][2 * h] * inv[h], o[4 * k + t][2 * h + 1] * inv[h]);
          a[t] = *reinterpret_cast<const uint32_t*>(&v);
        }
        // 4 x 4 transpose across the quad in two exchanges: the off-diagonal 2 x 2 blocks with
        // lane q ^ 2, then within each 2 x 2 block with lane q ^ 1
        const bool hi = q & 2, odd = q & 1;
        const uint32_t y0 = __shfl_xor_sync(0xffffffffu, hi ? a[0] : a[2], 2);
        const uint32_t y1 = __shfl_xor_sync(0xffffffffu, hi ? a[1] : a[3], 2);
        const uint32_t c0 = hi ? y0 : a[0], c1 = hi ? y1 : a[1], c2 = hi ? a[2] : y0, c3 = hi ? a[3] : y1;
        const uint32_t z0 = __shfl_xor_sync(0xffffffffu, odd ? c0 : c1, 1);
        const uint32_t z1 = __shfl_xor_sync(0xffffffffu, odd ? c2 : c3, 1);
        const uint4 v = odd ? make_uint4(z0, c1, z1, c3) : make_uint4(c0, z0, c2, z1);
        if (r0 + 8 * h < w.valid_rows)   // the same for a quad's 4 lanes
          *reinterpret_cast<uint4*>(dst[h] + k * 32) = v;
      }
    }
    if (final_lse != nullptr && half == 0 && q == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h)
        if (r0 + 8 * h < w.valid_rows) final_lse[(int64_t)w.qo_start * num_heads + row_base + r0 + 8 * h] = lse[h];
    }
    return;
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = r0 + 8 * h;                      // row within the CTA
    if (r >= w.valid_rows) continue;
    const int tile_row = row_base + r;             // row within the work's block_m tile
    const int col0 = half * (kVDim / 2) + (lane & 3) * 2;
    if (split) {
      const int64_t row = (int64_t)w.partial_qo_loc * num_heads + tile_row;
      float* dst = split_out + row * kVDim + col0;
#pragma unroll
      for (int j = 0; j < C::kOTiles; ++j)
        *reinterpret_cast<float2*>(dst + j * 8) = make_float2(o[j][2 * h] * inv[h], o[j][2 * h + 1] * inv[h]);
      if (half == 0 && (lane & 3) == 0) split_lse[row] = lse[h];
    } else {
      const int64_t row = (int64_t)w.qo_start * num_heads + tile_row;
      __nv_bfloat16* dst = out + row * kVDim + col0;
#pragma unroll
      for (int j = 0; j < C::kOTiles; ++j)
        *reinterpret_cast<__nv_bfloat162*>(dst + j * 8) = __floats2bfloat162_rn(o[j][2 * h] * inv[h], o[j][2 * h + 1] * inv[h]);
      if (final_lse != nullptr && half == 0 && (lane & 3) == 0) final_lse[row] = lse[h];
    }
  }
}

}  // namespace mla
