// MLA decode on sm_90a: the fp8 "warpgroup works" main loop (template parameter mainloop =
// "warpgroup_works", works of at most 32 rows: (16,1), (32,1), (16,2)).
//
// Each consumer warpgroup runs its own work list (cluster) with its own producer warp and
// 2-stage KV ring, so one CTA holds two independent pipelines and one warpgroup's softmax runs
// while the other's matrix products do. A warpgroup holds a whole work's <= 32 query rows.
// Both products run transposed, with the query rows as the wgmma N = 32:
//   QK: S^T[64 keys x 32 rows] = K[64 x 576] . Q^T, A = K (the KV stage) and B = the
//       warpgroup's 32 Q rows, both K-major in shared memory; m64n32k32 e4m3, promoted to fp32
//       every 3 k-steps.
//   PV: O^T[512 V columns x 32 rows] += V^T[512 x 64 keys] . P^T[64 keys x 32 rows], A = V^T
//       from registers (ldmatrix.trans of the stage + prmt) and B = P^T from shared memory;
//       8 m64 blocks of m64n32k32, 128 accumulators per thread.
// S^T and O^T share one thread layout along N: thread (warp w, lane) holds query rows
// 8i + 2 (lane % 4) + b (i = 0..3, b = 0, 1) in both, so the row factors never leave the thread.
// A row's max over the tile's keys (M: 16w + lane / 4 + 8h) is reduced over the lane's key bits
// by shuffles and over the 4 warps through shared memory (one warpgroup barrier).
//
// Key order in PV's K dimension. ldmatrix.trans lane (j, r) receives rows 2r, 2r+1 of each 8x8
// matrix, and prmt merges matrices 0 and 1 into positions 4r..4r+3. Addressing matrix 0's rows
// with keys (0, 8, 1, 9, 2, 10, 3, 11) and matrix 1's with (4, 12, 5, 13, 6, 14, 7, 15) puts
// keys j and j + 8 of a 16-key block side by side (pair_pos): exactly the two keys a thread
// of S^T holds, so P^T is stored as one 16-bit word per query row.
#pragma once
#include "mla_decode_sm90_fp8.cuh"

namespace mla {
namespace wg_works {

constexpr int kWgRows = 32;   // query rows per consumer warpgroup (the wgmma N)

template <int BlockN, int PageSize, bool Causal>
struct WarpgroupWorksConfig : fp8::TmaTile<BlockN, PageSize, Causal> {
  using T = fp8::TmaTile<BlockN, PageSize, Causal>;
  using T::BN;
  static constexpr int kStages = 4;                      // KV stages: two rings of 2, one per warpgroup
  static constexpr int kMBlocks = kVDim / 64;            // m64 blocks of O^T per warpgroup
  static constexpr int kKSteps = T::kKSteps;             // k32 steps of QK (18)
  static constexpr int kQkChunk = 3;                     // k-steps per fp32-promoted chunk
  // P^T of one warpgroup (B operand, K-major): 8-row groups 512 B apart, 16-position core
  // matrices 128 B apart.
  static constexpr int kPBytes = kWgRows * BN;
  static constexpr int kRedFloats = kWgRows * 4;         // [32 rows][4 warps]
  static constexpr int kOffP = T::kOffKv + kStages * T::kStageBytes;   // [2 warpgroups][2 buffers]
  static constexpr int kOffRed = kOffP + 4 * kPBytes;                 // [2 warpgroups][2 buffers]
  static constexpr int kOffBar = kOffRed + 4 * kRedFloats * 4;        // full[kStages], empty[kStages]
  static constexpr int kSmemBytes = kOffBar + 2 * kStages * 8;
  static_assert(BN == 64, "the warpgroup_works loop's S^T is one m64 block of keys");
  static_assert(kKSteps % kQkChunk == 0 && kKSteps / kQkChunk >= 2, "k-steps split into 2 or more whole chunks");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory tile does not fit an sm_90 CTA (227 KB)");
  static_assert(T::kOffKv % 512 == 0 && kOffP % 128 == 0, "operand tiles are aligned");
};

// Position (0..15, even) of block key j (0..7) in a 16-key block of PV's K dimension; key j + 8
// is at the next position.
__device__ __forceinline__ int pair_pos(int j) { return ((j & 3) << 2) | ((j >> 2) << 1); }

// Row (key) of a 32-key step that ldmatrix lane (m = lane / 8, i = lane % 8) addresses.
__device__ __forceinline__ int vt_lane_key(int lane) {
  const int m = lane >> 3, i = lane & 7;
  return 16 * (m >> 1) + 4 * (m & 1) + (i >> 1) + 8 * (i & 1);
}

// This warp's A fragments of PV for the tile in `stage`: a[mb][kk] for m-block mb (V columns
// 64 mb .. + 63; this warp's 16 of them: chunk x = 4 mb + w), k32 step kk. Keys at or past
// `valid` (the tile's tail: not loaded, or rows of a TMA box past the work's end, maybe NaN)
// become 0 so that P = 0 never meets them. Tail = false: every key is valid; the 16 ldmatrix
// then issue back to back (a per-load mask branch serialised them).
template <class C, bool Tail>
__device__ __forceinline__ void load_vt_frags_impl(uint32_t (&a)[C::kMBlocks][C::BN / 32][4], const uint8_t* smem,
                                                   int stage, int w, int lane, int valid) {
  const int r = lane & 3;
  const int key = vt_lane_key(lane);
  uint32_t src = smem_addr(smem + C::kOffKv + stage * C::kStageBytes);
  uint32_t sw = 0;
  if constexpr (C::kSwizzled) {
    src += key * 64;
    sw = static_cast<uint32_t>(key >> 1) & 3;   // the 64-byte swizzle of this lane's row
  } else {
    src += (key >> 3) * C::kGroupBytes + (key & 7) * 16;
  }
#pragma unroll
  for (int mb = 0; mb < C::kMBlocks; ++mb) {
    const int x = 4 * mb + w;   // 16-column chunk of V
#pragma unroll
    for (int kk = 0; kk < C::BN / 32; ++kk) {
      uint32_t* d = a[mb][kk];
      if constexpr (C::kSwizzled) {
        ldmatrix_x4_trans(a[mb][kk], src + (x >> 2) * (C::BN * 64) + kk * 32 * 64 + (((x & 3) ^ sw) << 4));
      } else {
        ldmatrix_x4_trans(a[mb][kk], src + kk * 4 * C::kGroupBytes + x * 128);
      }
      if constexpr (Tail) {
        // d[q]: low 16 bits = key 16 (q / 2) + 4 (q % 2) + r of the step, high = that key + 8
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int k0 = kk * 32 + 16 * (q >> 1) + 4 * (q & 1) + r;
          d[q] &= (k0 < valid ? 0x0000ffffu : 0u) | (k0 + 8 < valid ? 0xffff0000u : 0u);
        }
      }
    }
  }
#pragma unroll
  for (int mb = 0; mb < C::kMBlocks; ++mb)
#pragma unroll
    for (int kk = 0; kk < C::BN / 32; ++kk) {
      uint32_t* d = a[mb][kk];
      const uint32_t d0 = d[0], d2 = d[2];
      d[0] = fp8::prmt(d0, d[1], 0x6420);   // V column 2 (lane / 4) of the chunk, positions 4r..
      d[1] = fp8::prmt(d0, d[1], 0x7531);   // column 2 (lane / 4) + 1
      d[2] = fp8::prmt(d2, d[3], 0x6420);   // second 16-key block
      d[3] = fp8::prmt(d2, d[3], 0x7531);
    }
}

template <class C>
__device__ __forceinline__ void load_vt_frags(uint32_t (&a)[C::kMBlocks][C::BN / 32][4], const uint8_t* smem,
                                              int stage, int w, int lane, int valid) {
  if (valid >= C::BN) {
    load_vt_frags_impl<C, false>(a, smem, stage, w, lane, valid);
  } else {
    load_vt_frags_impl<C, true>(a, smem, stage, w, lane, valid);
  }
}

// One chunk of QK k-steps into acc (overwritten by its first step), issued and committed.
// kd0 / qd0: the step-0 descriptors of K (A) and Q (B); step kk adds its byte offset / 16.
template <class C>
__device__ __forceinline__ void qk_issue_chunk(float (&acc)[4][4], uint64_t kd0, uint64_t qd0, int chunk) {
  wg::qk_steps<true, C::kQkChunk>(acc, chunk * C::kQkChunk, [&](int kk, uint64_t& da, uint64_t& db) {
    // the address field is the low 14 bits and never carries: add to the low word only
    da = (kd0 & 0xffffffff00000000ull) | static_cast<uint32_t>(static_cast<uint32_t>(kd0) + (wg::k_step_bytes<C>(kk) >> 4));
    db = (qd0 & 0xffffffff00000000ull) | static_cast<uint32_t>(static_cast<uint32_t>(qd0) + (kk * 256 >> 4));
  });
}

// S^T[64 keys x this warpgroup's 32 rows] over all 576 dims; returns with every wgmma done.
// s[i][e]: key 16 w + lane / 4 + 8 (e / 2), row 8 i + 2 (lane % 4) + e % 2.
template <class C>
__device__ __forceinline__ void qk(float (&s)[4][4], const uint8_t* smem, int stage, int wgi) {
  const uint32_t k_addr = smem_addr(smem + C::kOffKv + stage * C::kStageBytes);
  const uint32_t q_addr = smem_addr(smem + C::kOffQ) + wgi * (kWgRows / 8) * C::kGroupBytes;
  constexpr int kChunks = C::kKSteps / C::kQkChunk;
  // Opaque to the optimiser: otherwise it hoists all 36 per-step descriptors out of the tile
  // loop (72 registers, spilled); here each is one add in the loop.
  uint64_t kd0 = wg::k_desc<C>(k_addr, 0), qd0 = wg::q_desc<C>(q_addr, 0);
  asm volatile("" : "+l"(kd0), "+l"(qd0));
  float acc[2][4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    if (c >= 2) {
      wg::wgmma_wait<1>();             // chunk c - 2 is done; c - 1 may still run
      wg::qk_add<C>(s, acc[c & 1]);
    }
    qk_issue_chunk<C>(acc[c & 1], kd0, qd0, c);
  }
  wg::wgmma_wait<1>();
  wg::qk_add<C>(s, acc[kChunks & 1]);
  wg::wgmma_wait<0>();
  wg::qk_add<C>(s, acc[(kChunks - 1) & 1]);
  wg::fence_operands(s);
}

// Running state of this thread's 8 query rows (index q = 2 i + b: row 8 i + 2 (lane % 4) + b).
struct RowState8 {
  float m[8];   // running max, log2 units (the same in every thread holding the row)
  float l[8];   // partial row sum over this thread's keys
};

// v[k] (row q = k of 2K) -> the max over the lanes that differ in lane bit `bit`, keeping K/2
// rows: lanes with the bit clear keep rows 0..K/2-1, the others K/2..K-1.
template <int K>
__device__ __forceinline__ void max_halve(float (&v)[8], int lane, int bit) {
  const bool hi = (lane >> bit) & 1;
#pragma unroll
  for (int k = 0; k < K / 2; ++k) {
    const float keep = hi ? v[k + K / 2] : v[k];
    const float send = hi ? v[k] : v[k + K / 2];
    v[k] = fmaxf(keep, __shfl_xor_sync(0xffffffffu, send, 1 << bit));
  }
}

// Online softmax of one tile for this warpgroup: scales (and, unless `full`, masks: key >=
// key_end_of(row) -> -inf) the scores, agrees each row's max over the 64 keys (shuffles, then
// the 4 warps through shared memory and a warpgroup barrier), writes P^T (e4m3) into buffer
// `buf`, and rescales l and O^T. A row whose max is still -inf uses 0 as reference (p = 0,
// factor 0, no NaN). The caller's barrier after this makes P^T visible to PV.
template <class C, class KeyEnd>
__device__ __forceinline__ void softmax_pt(float (&s)[4][4], RowState8& st, float (&o)[32][4], uint8_t* smem,
                                           int wgi, int buf, int tok0, bool full, KeyEnd key_end_of,
                                           float scale_log2, int w, int lane) {
  const int j = lane >> 2, r = lane & 3;
  // Common path: the scores stay unscaled (max(s) * sc = max(s * sc) for sc > 0) and each p is
  // one FFMA plus ex2 below. A masked tile or a scale <= 0 scales (and masks) here, sc = 1.
  float sc = scale_log2;
  if (!full || !(scale_log2 > 0.f)) {
    const int k0 = tok0 + 16 * w + j;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        const int ke = key_end_of(8 * i + 2 * r + b);
        s[i][b] = k0 < ke ? s[i][b] * scale_log2 : -INFINITY;
        s[i][b + 2] = k0 + 8 < ke ? s[i][b + 2] * scale_log2 : -INFINITY;
      }
    sc = 1.f;
  }
  float v[8];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int b = 0; b < 2; ++b) v[2 * i + b] = fmaxf(s[i][b], s[i][b + 2]);
  max_halve<8>(v, lane, 2);
  max_halve<4>(v, lane, 3);
  max_halve<2>(v, lane, 4);
  // v[0] = this warp's max of row q = 4 bit2 + 2 bit3 + bit4 of the lane (bits of lane / 4)
  float* red = reinterpret_cast<float*>(smem + C::kOffRed) + (wgi * 2 + buf) * C::kRedFloats;
  {
    const int q = 4 * (j & 1) + 2 * ((j >> 1) & 1) + (j >> 2);
    red[(8 * (q >> 1) + 2 * r + (q & 1)) * 4 + w] = v[0];
  }
  wg::wg_sync(wgi);
  float m_ref[8], scale_o[8];
  bool changed = false;
#pragma unroll
  for (int q = 0; q < 8; ++q) {
    const float4 t = *reinterpret_cast<const float4*>(red + (8 * (q >> 1) + 2 * r + (q & 1)) * 4);
    const float m_new = fmaxf(st.m[q], fmaxf(fmaxf(t.x, t.y), fmaxf(t.z, t.w)) * sc);
    m_ref[q] = m_new == -INFINITY ? 0.f : m_new;
    scale_o[q] = fast_exp2(st.m[q] - m_ref[q]);
    changed |= scale_o[q] != 1.f;
    st.m[q] = m_new;
  }
  uint8_t* pt = smem + C::kOffP + (wgi * 2 + buf) * C::kPBytes + w * 128 + 2 * r * 16 + pair_pos(j);
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const int q = 2 * i + b;
      const float p0 = fast_exp2(fmaf(s[i][b], sc, -m_ref[q]));
      const float p1 = fast_exp2(fmaf(s[i][b + 2], sc, -m_ref[q]));
      st.l[q] = st.l[q] * scale_o[q] + (p0 + p1);
      *reinterpret_cast<__nv_fp8x2_storage_t*>(pt + i * 512 + b * 16) = fp8::e4m3x2(p0, p1);
    }
  if (__any_sync(0xffffffffu, changed)) {   // skipping factors of exactly 1 is exact
#pragma unroll
    for (int mb = 0; mb < C::kMBlocks; ++mb)
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[4 * mb + i][e] *= scale_o[2 * i + (e & 1)];
  }
}

// O^T[64 V columns of m-block MB x 32 rows] (o[4 MB .. 4 MB + 3]) += A (e4m3 registers) . B (P^T).
#define AITER_MLA_RS_T(i) "+f"(o[4 * MB + i][0]), "+f"(o[4 * MB + i][1]), "+f"(o[4 * MB + i][2]), "+f"(o[4 * MB + i][3])
template <int MB>
__device__ __forceinline__ void wgmma_pv_n32(float (&o)[32][4], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "{%16, %17, %18, %19}, %20, 1, 1, 1;\n"
      : AITER_MLA_RS_T(0), AITER_MLA_RS_T(1), AITER_MLA_RS_T(2), AITER_MLA_RS_T(3)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
#undef AITER_MLA_RS_T

template <class C, int MB>
__device__ __forceinline__ void pv_issue_blocks(float (&o)[32][4], const uint32_t (&a)[C::kMBlocks][C::BN / 32][4],
                                                uint32_t p) {
  if constexpr (MB < C::kMBlocks) {
#pragma unroll
    for (int kk = 0; kk < C::BN / 32; ++kk) wgmma_pv_n32<MB>(o, a[MB][kk], wg::make_desc(p + kk * 256, 128, 512));
    pv_issue_blocks<C, MB + 1>(o, a, p);
  }
}

// O^T += V^T . P^T(buf) for this warpgroup; returns with the wgmmas done (A's registers free).
template <class C>
__device__ __forceinline__ void pv(float (&o)[32][4], const uint32_t (&a)[C::kMBlocks][C::BN / 32][4],
                                   const uint8_t* smem, int wgi, int buf) {
  wg::fence_operands(o);
  wg::wgmma_fence();
  pv_issue_blocks<C, 0>(o, a, smem_addr(smem + C::kOffP + (wgi * 2 + buf) * C::kPBytes));
  wg::wgmma_commit();
  wg::wgmma_wait<0>();
  wg::fence_operands(o);
}

// Epilogue of this warpgroup's rows (the work's rows row_base .. row_base + 31; the
// shared-memory reductions are warpgroup wgi's): l summed over the thread's key lanes and the 4 warps, then
// bf16 O * out_scale / l and the final LSE (unsplit work) or fp32 partial O and LSE (split).
// A row that saw no key gets O = 0 and LSE +inf (final) / -inf (partial), never NaN.
template <class C>
__device__ __forceinline__ void write_output(const float (&o)[32][4], RowState8& st, uint8_t* smem, const Work& w,
                                             int wgi, int row_base, int num_heads, float out_scale,
                                             __nv_bfloat16* __restrict__ out, float* __restrict__ final_lse,
                                             float* __restrict__ split_out, float* __restrict__ split_lse,
                                             int wp, int lane) {
  const int j = lane >> 2, r = lane & 3;
  const bool split = w.partial_qo_loc >= 0;
#pragma unroll
  for (int q = 0; q < 8; ++q) {
    st.l[q] += __shfl_xor_sync(0xffffffffu, st.l[q], 4);
    st.l[q] += __shfl_xor_sync(0xffffffffu, st.l[q], 8);
    st.l[q] += __shfl_xor_sync(0xffffffffu, st.l[q], 16);
  }
  float* red = reinterpret_cast<float*>(smem + C::kOffRed) + wgi * 2 * C::kRedFloats;
  if (j == 0) {
#pragma unroll
    for (int q = 0; q < 8; ++q) red[(8 * (q >> 1) + 2 * r + (q & 1)) * 4 + wp] = st.l[q];
  }
  wg::wg_sync(wgi);
  const int64_t row0 = (split ? (int64_t)w.partial_qo_loc : (int64_t)w.qo_start) * num_heads + row_base;
  const int rows = w.valid_rows;   // real rows of this warpgroup
  float inv[8];
#pragma unroll
  for (int q = 0; q < 8; ++q) {
    const int n = 8 * (q >> 1) + 2 * r + (q & 1);
    const float4 t = *reinterpret_cast<const float4*>(red + n * 4);
    const float l = (t.x + t.y) + (t.z + t.w);
    inv[q] = l > 0.f ? __fdividef(out_scale, l) : 0.f;   // the SFU's, as mla::row_totals
    if (wp == 0 && j == 0 && n < rows) {
      const float lse = l > 0.f ? (st.m[q] + __log2f(l)) * 0.69314718055994531f : (split ? -INFINITY : INFINITY);
      if (split) {
        split_lse[row0 + n] = lse;
      } else if (final_lse != nullptr) {
        final_lse[row0 + n] = lse;
      }
    }
  }
  // Each value pair of row n at column col, to `store` (fp8::store_pairs picks it).
  auto each_pair = [&](auto&& store) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        const int n = 8 * i + 2 * r + b, q = 2 * i + b;
        const bool live = n < rows;   // a predicate on each store, not a branch around the row
#pragma unroll
        for (int mb = 0; mb < C::kMBlocks; ++mb) {
          const int col = 16 * (4 * mb + wp) + 2 * j;
          const float v0 = o[4 * mb + i][b] * inv[q], v1 = o[4 * mb + i][b + 2] * inv[q];
          if (live) store((row0 + n) * kVDim + col, v0, v1);
        }
      }
    }
  };
  fp8::store_pairs(each_pair, split, split_out, out);
}

// This warpgroup's 32 Q rows (CTA rows 32 wgi ..; q row q_row0 + row), rows at or past
// `rows` zero-filled, by its 128 threads (tid 0..127) into the interleaved Q tile.
template <class C>
__device__ __forceinline__ void load_q_rows(uint8_t* smem, const uint8_t* __restrict__ q, int64_t q_row0, int rows,
                                            int wgi, int tid) {
  const uint32_t base = smem_addr(smem + C::kOffQ) + wgi * (kWgRows / 8) * C::kGroupBytes;
#pragma unroll
  for (int i = tid; i < kWgRows * C::kChunksPerRow; i += 128) {
    int row, col;
    const uint32_t off = wg::chunk_of<C>(i, row, col);
    const bool ok = row < rows;
    const uint8_t* src = ok ? q + (q_row0 + row) * (int64_t)C::kRowBytes + col : q;
    cp_async_16(base + off, src, ok ? 16 : 0);
  }
}

}  // namespace wg_works
}  // namespace mla
