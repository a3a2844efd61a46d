// MLA decode on sm_90a: the overlapped fp8 main loop (template parameter mainloop = "wgmma_ovl").
//
// Same CTA (64 rows, 2 consumer warpgroups + 1 producer warpgroup), QK and work loop as
// wgmma_ws; what changes is the order of the per-tile chain and the PV operands:
//   * order (FlashAttention-3's intra-warpgroup overlap): QK(t) -> issue PV(t-1) -> softmax(t)
//     -> wait PV(t-1). The softmax of tile t runs on the CUDA cores while the tensor cores run
//     PV(t-1), instead of both idling in turn. O is rescaled by tile t-1's factor just before
//     PV(t-1) is issued (no wgmma touches O then), and only when a row max changed in the warp
//     (the factor is then exactly 1, so skipping is exact).
//   * PV in fp8: P is rounded to e4m3 (AITER's fp8 kernel does the same; l stays the fp32 sum)
//     and V is the B operand of an e4m3 m64n256k32 wgmma. fp8 wgmma operands must be K-major,
//     so V (key-major in the KV stage) is transposed into V^T by the producer warpgroup's three
//     spare warps (transpose_v), double-buffered, while the consumers compute. This replaces
//     the consumers' fp8 -> fp16 V conversion (1,400 cycles a tile on their critical path,
//     docs/perf/notes.md) and halves PV's tensor time.
//
// Key order inside V^T. ldmatrix.trans on 16-bit elements hands lane (j = lane / 4,
// r = lane % 4) the bytes of keys 2r, 2r+1 for columns 2j, 2j+1; two such matrices (keys
// 0-7 and 8-15 of a 16-key block) are merged with one prmt per column into 4-key words. So
// position p of a 16-key block holds key kv_key_of(p): positions 4r..4r+3 = keys 2r, 2r+1,
// 8+2r, 9+2r. PV sums over keys, so any order works as long as P uses the same one:
// softmax_p writes P's column for key k at p_pos(k).
#pragma once
#include "mla_decode_sm90_wgmma.cuh"

namespace mla {
namespace ovl {

// Tile constants shared by the fp8 loops fed by TMA (wgmma_ovl here, wgmma_ot in
// mla_decode_sm90_ot.cuh): the warpgroup tile shape with fp8 Q and KV, plus the TMA boxes.
template <int BlockN, int PageSize, bool Causal>
struct Fp8TmaTile : wg::WgmmaTile<BlockN, PageSize, true, Causal> {
  // page_size >= 8: KV stages are loaded by TMA in the 64-byte-swizzled layout (9 column blocks
  // of BN rows x 64 B; a box is kTmaRows rows x 64 B, at most one page); smaller pages keep
  // cp.async and the interleaved layout (a TMA box never spans two pages).
  static constexpr bool kSw64 = PageSize >= 8;
  static constexpr int kTmaRows = PageSize < BlockN ? PageSize : BlockN;
  static constexpr int kTmaBoxBytes = kTmaRows * 64;
};

template <int BlockN, int PageSize, bool Causal>
struct MlaDecodeOvlConfig : Fp8TmaTile<BlockN, PageSize, Causal> {
  using T = Fp8TmaTile<BlockN, PageSize, Causal>;
  using T::BN;
  static constexpr int kStages = 3;                           // KV ring
  static constexpr int kPStride = BN + 16;                    // fp8 P row: 80 B, ldmatrix conflict-free
  // V^T: 64 column groups of 8 columns x BN key positions (K-major core matrices, LBO 128 B).
  // The group stride is 16 B more than BN * 8 so that the transposers' 4-byte stores of one
  // warp instruction land in 32 different banks.
  static constexpr int kVtSbo = BN * 8 + 16;
  static constexpr int kVtBytes = (kVDim / 8) * kVtSbo;

  static constexpr int kPBytes = kRows * kPStride;
  static constexpr int kOffVt = T::kOffKv + kStages * T::kStageBytes;   // 2 buffers
  static constexpr int kOffP = kOffVt + 2 * kVtBytes;
  static constexpr int kOffRed = kOffP + kPBytes;
  // mbarriers: full[kStages], empty[kStages], vt_full[2], vt_empty[2].
  static constexpr int kOffBar = kOffRed + T::kRedBytes;
  static constexpr int kSmemBytes = kOffBar + (2 * kStages + 4) * 8;

  static_assert(kSmemBytes <= 227 * 1024, "shared memory tile does not fit an sm_90 CTA (227 KB)");
  static_assert(T::kOffKv % 512 == 0 && kOffVt % 128 == 0 && kVtBytes % 16 == 0 && kOffP % 16 == 0,
                "operand tiles are aligned");
};

// Spare producer warps that transpose V (warps 9, 10, 11 of the CTA).
constexpr int kTransposeWarps = 3;

// Position of tile key k (0 .. BN-1) in P's columns and V^T's K dimension (see the header).
__device__ __forceinline__ int p_pos(int k) {
  const int kk = k & 15;
  return (k & ~15) | (((kk & 7) >> 1) << 2) | ((kk >> 3) << 1) | (kk & 1);
}

// Two unnormalised probabilities as e4m3 (AITER's fp8 P; satfinite, round to nearest).
__device__ __forceinline__ __nv_fp8x2_storage_t e4m3x2(float lo, float hi) {
  return __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3);
}

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}
__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

// One transposer warp's share of V^T for the tile in `stage`: 64 units (16-key block G x 32
// columns), unit u by warp u % 3. Per unit one ldmatrix.x4.trans reads four 8 x 16-byte core
// matrices (keys 16G.. / 16G+8.. x chunks 2c, 2c+1) and four 4-byte stores write the columns.
// Keys at or past `valid` (the tile's tail: not loaded, or rows past the work's end that a TMA
// group copy brought along, possibly NaN) are written as 0, so that P = 0 never meets them.
template <class C>
__device__ __forceinline__ void transpose_v(const uint8_t* smem, int stage, int buf, int tw, int lane, int valid) {
  // lane (m = lane / 8, i = lane % 8) addresses row i of matrix m: keys + 8 (m & 1), chunk + (m >> 1)
  const int m = lane >> 3, i = lane & 7;
  uint32_t src = smem_addr(smem + C::kOffKv + stage * C::kStageBytes);
  uint32_t sw_even = 0, sw_odd = 0;
  if constexpr (C::kSw64) {
    src += (8 * (m & 1) + i) * 64;
    const int xr = (i >> 1) & 3;                   // (row / 2) % 4 of this lane's rows
    sw_even = ((m >> 1) ^ xr) << 4;                // chunk 2 c2 + (m >> 1), c2 even: chunk % 4 = m >> 1
    sw_odd = ((2 + (m >> 1)) ^ xr) << 4;           // c2 odd: chunk % 4 = 2 + (m >> 1)
  } else {
    src += i * 16 + (m & 1) * C::kGroupBytes + (m >> 1) * 128;
  }
  const int j = lane >> 2, r = lane & 3;
  const uint32_t dst = smem_addr(smem + C::kOffVt + buf * C::kVtBytes) + (j >> 2) * C::kVtSbo + (j & 3) * 32 + r * 4;
  // One unit at a time: issuing several units' loads together was slower overall (384 vs 321 us
  // at fp8 (128,1) b64 ctx 8192): the extra shared-memory traffic in flight delays the consumers.
#pragma unroll 1
  for (int u = tw; u < (C::BN / 16) * (kVDim / 32); u += kTransposeWarps) {
    const int g = u % (C::BN / 16), c2 = u / (C::BN / 16);
    uint32_t d[4];
    if constexpr (C::kSw64) {
      ldmatrix_x4_trans(d, src + (c2 >> 1) * (C::BN * 64) + g * 16 * 64 + ((c2 & 1) ? sw_odd : sw_even));
    } else {
      ldmatrix_x4_trans(d, src + 2 * g * C::kGroupBytes + 2 * c2 * 128);
    }
    if (valid < (g + 1) * 16) {
      // a register's low 16 bits are key k (two columns), its high 16 bits key k + 1, with
      // k = 16g + 2r in d[0], d[2] and 16g + 8 + 2r in d[1], d[3]
      const int k0 = 16 * g + 2 * r;
      const uint32_t m_lo = (k0 < valid ? 0x0000ffffu : 0u) | (k0 + 1 < valid ? 0xffff0000u : 0u);
      const uint32_t m_hi = (k0 + 8 < valid ? 0x0000ffffu : 0u) | (k0 + 9 < valid ? 0xffff0000u : 0u);
      d[0] &= m_lo;
      d[2] &= m_lo;
      d[1] &= m_hi;
      d[3] &= m_hi;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // columns 32 c2 + 16 h + 2 j (+1): column group 4 c2 + 2 h + j / 4, row 2 (j % 4) (+1)
      const uint32_t at = dst + (4 * c2 + 2 * h) * C::kVtSbo + g * 128;
      st_shared_u32(at, prmt(d[2 * h], d[2 * h + 1], 0x6420));
      st_shared_u32(at + 16, prmt(d[2 * h], d[2 * h + 1], 0x7531));
    }
  }
}

// Online softmax of tile t without touching O: softmax_row_max, then writes P(t) as e4m3
// (unnormalised exp2(s - m), keys at p_pos) and l = l * scale + the fp32 sum of this thread's p;
// scale_o is the factor O must be multiplied by before PV(t) adds P(t) V(t).
template <class C>
__device__ __forceinline__ void softmax_p(float (&s)[C::kSTiles][4], RowState& st, float (&scale_o)[2],
                                          uint8_t* smem, int tok0, float scale_log2, int group, int half,
                                          int lane) {
  const int r0 = group * 16 + (lane >> 2);
  float mx[2];
  const float sc = softmax_row_max<C>(s, st, scale_o, mx, smem, tok0, scale_log2, group, half, lane);
  float sum[2];
  uint8_t* p_row0 = smem + C::kOffP + r0 * C::kPStride;
  exp_scores<C>(s, mx, sc, sum, [&](int j, float p0, float p1, float p2, float p3) {
    const int col = p_pos(half * (C::BN / 2) + j * 8 + (lane & 3) * 2);
    *reinterpret_cast<__nv_fp8x2_storage_t*>(p_row0 + col) = e4m3x2(p0, p1);
    *reinterpret_cast<__nv_fp8x2_storage_t*>(p_row0 + 8 * C::kPStride + col) = e4m3x2(p2, p3);
  });
#pragma unroll
  for (int h = 0; h < 2; ++h) st.l[h] = st.l[h] * scale_o[h] + sum[h];
}

// O *= the previous tile's factor, per row; skipped when it is 1 for every row of the warp
// (the running max did not change), which is exact.
template <class C>
__device__ __forceinline__ void rescale_o(float (&o)[C::kOTiles][4], const float (&scale_o)[2]) {
  if (__any_sync(0xffffffffu, scale_o[0] != 1.f || scale_o[1] != 1.f)) scale_rows<C>(o, scale_o);
}

// P A-fragments of this warp's 16 rows, one per 32-key step (k32 e4m3 layout = ldmatrix b16).
template <class C>
__device__ __forceinline__ void load_p(uint32_t (&a)[C::BN / 32][4], const uint8_t* smem, int group, int lane) {
  const uint32_t p_addr = smem_addr(smem + C::kOffP) + (group * 16 + (lane & 15)) * C::kPStride + (lane >> 4) * 16;
#pragma unroll
  for (int kk = 0; kk < C::BN / 32; ++kk) ldmatrix_x4(a[kk], p_addr + kk * 32);
}

// O[64 x 256] += A[64 x 32 positions] (e4m3, registers) . B[32 positions x 256] (e4m3 V^T,
// K-major in shared memory).
__device__ __forceinline__ void wgmma_pv_e4m3(float (&o)[32][4], const uint32_t (&a)[4], uint64_t db) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 {" AITER_MLA_PV_ACC_REGS
               "}, {%128, %129, %130, %131}, %132, 1, 1, 1;\n"
               : AITER_MLA_PV_ACC_OUTS(o)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

// Issues (does not wait for) O[64 x cols of half] += P[64 x BN] . V[BN x 256] from V^T buffer buf.
template <class C>
__device__ __forceinline__ void pv_issue(float (&o)[C::kOTiles][4], const uint32_t (&a)[C::BN / 32][4],
                                         const uint8_t* smem, int buf, int half) {
  const uint32_t vt = smem_addr(smem + C::kOffVt + buf * C::kVtBytes) + half * (kVDim / 2 / 8) * C::kVtSbo;
  wg::fence_operands(o);
  wg::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < C::BN / 32; ++kk) wgmma_pv_e4m3(o, a[kk], wg::make_desc(vt + kk * 256, 128, C::kVtSbo));
  wg::wgmma_commit();
  wg::fence_operands(o);
}

}  // namespace ovl
}  // namespace mla
