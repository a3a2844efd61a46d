// MLA decode on sm_90a: the warpgroup-MMA vocabulary every main loop uses (wgmma, mbarrier and
// TMA wrappers, the producer's KV copies, QK with fp32 promotion, the operand descriptors).
//
// 256 consumer threads = 2 warpgroups; warp w of warpgroup c owns rows 16w..16w+15 (the wgmma
// M = 64 layout, whose per-warp accumulator fragment equals mma.sync's m16n8 C fragment, so
// the softmax and epilogue of mla_decode_sm90.cuh serve every loop).
//
// Shared-memory layout below page_size 8 (cp.async stages): every operand uses the no-swizzle
// ("interleaved") canonical layout: 8 rows x 16 bytes form one 128-byte core matrix; the core
// matrices of 8 rows follow each other along the row (stride 128 B), and 8-row groups follow
// each other (stride 8 x row bytes). The interleaved layout lets the same bytes serve as K-major
// K (core matrix = 8 keys x 16 bytes) and, for bf16, as MN-major V (core matrix = 8 keys x 8
// columns) with no copy. Descriptor strides (CUTLASS make_gmma_desc, INTERLEAVE): LBO = stride
// between core matrices along K, SBO = stride between core matrices along M/N, for both majors.
// At page_size >= 8 the stages are filled by TMA in a swizzled layout of column blocks of BN
// rows x kSwBytes (64 for the fp8 loops, 128 for the bf16 alternating loop; k_desc, v_desc),
// which serve as K-major K and, read the other way, as MN-major V.
#pragma once
#include "mla_decode_sm90.cuh"
#include "mla_decode_stamps.cuh"

#ifndef AITER_MLA_ALT_NO_KV_COPY
#define AITER_MLA_ALT_NO_KV_COPY 0   // diagnostic: the producers copy no KV (TMA stages)
#endif

namespace mla {
namespace wg {

// The tile shape every main loop shares (the alternating loop's config,
// mla_decode_sm90_alternating.cuh; the fp8 loops' through mla_decode_sm90_fp8.cuh): 64-row CTA, BN keys per tile, Q and KV rows of 576 elements, Q at
// 0 and the KV ring after it in shared memory.
template <int BlockN, int PageSize, bool Fp8, bool Causal>
struct WgmmaTile {
  static constexpr int BN = BlockN;
  static constexpr int P = PageSize;
  static constexpr bool kFp8 = Fp8;
  static constexpr bool kCausal = Causal;
  static constexpr int kElemBytes = Fp8 ? 1 : 2;
  static constexpr int kRowBytes = kQkDim * kElemBytes;      // 576 or 1152
  static constexpr int kChunksPerRow = kRowBytes / 16;        // 16-byte chunks = core-matrix columns
  static constexpr int kGroupBytes = 8 * kRowBytes;           // one 8-row group of Q / KV (SBO)
  static constexpr int kKSteps = kRowBytes / 32;              // 32 bytes of K per wgmma (k32 e4m3 / k16 bf16)
  static constexpr int kSTiles = BN / 16;                     // n8 tiles of S per thread at N = BN/2 (a half tile per warpgroup: tile_pairs' `single`); the whole-tile loops' configs set BN / 8
  static constexpr int kOTiles = kVDim / 2 / 8;               // n8 tiles of O per thread (N = 256)
  static constexpr int kQBytes = kRows * kRowBytes;
  static constexpr int kStageBytes = BN * kRowBytes;
  static constexpr int kRedBytes = 2 * 2 * kRows * 4;
  static constexpr int kOffQ = 0;
  static constexpr int kOffKv = kOffQ + kQBytes;
  static constexpr int kLog2P = log2_page_size<P>();
  // Q in the interleaved layout, copied by the consumers (cp.async); a loop whose producer
  // copies Q by TMA (tile_pairs, alternating; page_size >= 8) lays it out as a KV stage
  // instead.
  static constexpr bool kQTma = false;
  // Bytes of a TMA stage's swizzle row (its column blocks are BN rows x kSwBytes): 64 here;
  // the alternating loop uses 128 (half the box rows per stage, for the TMA unit).
  static constexpr int kSwBytes = 64;
  // Barrier pairs (full, empty) per KV stage: one; the alternating loop's TMA stages have three.
  static constexpr int kParts = 1;
  static_assert(BN == 64, "the warpgroup main loops run block_n 64");
};

// ---- PTX wrappers ---------------------------------------------------------------------------
// Shared-memory matrix descriptor, no swizzle: address, LBO, SBO in 16-byte units.
__device__ __forceinline__ uint64_t make_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr >> 4) & 0x3FFFu) | (static_cast<uint64_t>((lbo >> 4) & 0x3FFFu) << 16) |
         (static_cast<uint64_t>((sbo >> 4) & 0x3FFFu) << 32);
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Waits until at most N of this thread's cp.async groups are pending.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// Generic-proxy writes (cp.async, st.shared) become visible to wgmma (async proxy) after this
// fence by the writing threads plus a barrier.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// mbarrier (CTA scope). mbar_wait spins on try_wait.parity. Debug builds
// (-DAITER_MLA_MBAR_SPIN_LIMIT=N, e.g. through AITER_MLA_EXTRA_NVCC_FLAGS) trap after N failed
// tries, so a phase/parity bug ends the launch with an error instead of hanging the GPU.
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes the initialised barriers visible to the async arrivals of cp.async (with the barrier after).
__device__ __forceinline__ void fence_mbar_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
#ifdef AITER_MLA_MBAR_SPIN_LIMIT
  uint32_t tries = 0;
#endif
  for (;;) {
    uint32_t done;
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    if (done) return;
#ifdef AITER_MLA_MBAR_SPIN_LIMIT
    if (++tries == (uint32_t)(AITER_MLA_MBAR_SPIN_LIMIT)) __trap();
#endif
  }
}
// Arrives on the mbarrier when all of this thread's earlier cp.async copies have landed; the
// arrival counts toward the barrier's expected count (.noinc).
__device__ __forceinline__ void cp_async_arrive_noinc(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// Per-thread register budget of the executing warpgroup (all its warps execute it).
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N)); }
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N)); }
// Barrier of the 256 consumer threads (id 7), which the producer warpgroup skips.
__device__ __forceinline__ void consumer_sync() { asm volatile("bar.sync 7, 256;\n" ::: "memory"); }
// Pins an accumulator register in program order around wgmma issue / wait (CUTLASS
// warpgroup_fence_operand): no read or write of it is moved across.
__device__ __forceinline__ void fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void fence_operand(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }
template <class E, int R, int C>
__device__ __forceinline__ void fence_operands(E (&x)[R][C]) {
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int j = 0; j < C; ++j) fence_operand(x[i][j]);
}
// Barrier of one warpgroup (ids 5, 6; 1..4 are the row-group pairs, 0 is __syncthreads).
__device__ __forceinline__ void wg_sync(int wg) { asm volatile("bar.sync %0, 128;\n" ::"r"(wg + 5) : "memory"); }
// Barrier 8, once per CTA: its consumers have issued the copy of their first work's Q (they
// arrive), and only then does the producer warp issue its first KV copy (it waits; 256 + 32
// threads). Every CTA starts at once, and a Q copy issued behind the producers' KV stages
// waited ~3 us to issue and ~3 us more to land (fp8 (128,1) b64: Q landed 8.4 us after the
// PDL wait, the first KV stage just after, in per-CTA clock stamps).
__device__ __forceinline__ void q_issued_arrive() { asm volatile("bar.arrive 8, 288;\n" ::: "memory"); }
__device__ __forceinline__ void q_issued_wait() { asm volatile("bar.sync 8, 288;\n" ::: "memory"); }

// S[64 x 32] = (ScaleD ? S : 0) + A[64 x 32 bytes of K] . B[32 keys x 32 bytes of K]^T, both
// from shared memory.
template <bool Fp8, int ScaleD>
__device__ __forceinline__ void wgmma_qk(float (&s)[4][4], uint64_t da, uint64_t db) {
  if constexpr (Fp8) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
        "}, %16, %17, %18, 1, 1;\n"
        : "+f"(s[0][0]), "+f"(s[0][1]), "+f"(s[0][2]), "+f"(s[0][3]), "+f"(s[1][0]), "+f"(s[1][1]), "+f"(s[1][2]), "+f"(s[1][3]),
        "+f"(s[2][0]), "+f"(s[2][1]), "+f"(s[2][2]), "+f"(s[2][3]), "+f"(s[3][0]), "+f"(s[3][1]), "+f"(s[3][2]), "+f"(s[3][3])
        : "l"(da), "l"(db), "n"(ScaleD));
  } else {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
        "}, %16, %17, %18, 1, 1, 0, 0;\n"
        : "+f"(s[0][0]), "+f"(s[0][1]), "+f"(s[0][2]), "+f"(s[0][3]), "+f"(s[1][0]), "+f"(s[1][1]), "+f"(s[1][2]), "+f"(s[1][3]),
        "+f"(s[2][0]), "+f"(s[2][1]), "+f"(s[2][2]), "+f"(s[2][3]), "+f"(s[3][0]), "+f"(s[3][1]), "+f"(s[3][2]), "+f"(s[3][3])
        : "l"(da), "l"(db), "n"(ScaleD));
  }
}

// S[64 x 64] = (ScaleD ? S : 0) + A[64 x 32 bytes] . B[64 keys x 32 bytes]^T, both from shared
// memory: e4m3 (the tile_pairs loop, mla_decode_sm90_tile_pairs.cuh) or bf16 (the alternating
// loop): one warpgroup scores a whole 64-key tile.
#define AITER_MLA_QK64_ACC_REGS \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define AITER_MLA_QK64_ACC_OUTS(s) \
  "+f"(s[0][0]), "+f"(s[0][1]), "+f"(s[0][2]), "+f"(s[0][3]), "+f"(s[1][0]), "+f"(s[1][1]), "+f"(s[1][2]), "+f"(s[1][3]), \
  "+f"(s[2][0]), "+f"(s[2][1]), "+f"(s[2][2]), "+f"(s[2][3]), "+f"(s[3][0]), "+f"(s[3][1]), "+f"(s[3][2]), "+f"(s[3][3]), \
  "+f"(s[4][0]), "+f"(s[4][1]), "+f"(s[4][2]), "+f"(s[4][3]), "+f"(s[5][0]), "+f"(s[5][1]), "+f"(s[5][2]), "+f"(s[5][3]), \
  "+f"(s[6][0]), "+f"(s[6][1]), "+f"(s[6][2]), "+f"(s[6][3]), "+f"(s[7][0]), "+f"(s[7][1]), "+f"(s[7][2]), "+f"(s[7][3])
template <bool Fp8, int ScaleD>
__device__ __forceinline__ void wgmma_qk(float (&s)[8][4], uint64_t da, uint64_t db) {
  if constexpr (Fp8) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {" AITER_MLA_QK64_ACC_REGS
                 "}, %32, %33, %34, 1, 1;\n"
                 : AITER_MLA_QK64_ACC_OUTS(s)
                 : "l"(da), "l"(db), "n"(ScaleD));
  } else {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" AITER_MLA_QK64_ACC_REGS
                 "}, %32, %33, %34, 1, 1, 0, 0;\n"
                 : AITER_MLA_QK64_ACC_OUTS(s)
                 : "l"(da), "l"(db), "n"(ScaleD));
  }
}
#undef AITER_MLA_QK64_ACC_REGS
#undef AITER_MLA_QK64_ACC_OUTS

// O[64 x 256] += A[64 x 16 keys] (registers, mma.sync A-fragment layout) . B[16 keys x 256]
// (shared memory, MN-major: imm-trans-b = 1), bf16.
#define AITER_MLA_PV_ACC_REGS \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define AITER_MLA_PV_ACC_OUTS(o) \
  "+f"(o[0][0]), "+f"(o[0][1]), "+f"(o[0][2]), "+f"(o[0][3]), \
  "+f"(o[1][0]), "+f"(o[1][1]), "+f"(o[1][2]), "+f"(o[1][3]), \
  "+f"(o[2][0]), "+f"(o[2][1]), "+f"(o[2][2]), "+f"(o[2][3]), \
  "+f"(o[3][0]), "+f"(o[3][1]), "+f"(o[3][2]), "+f"(o[3][3]), \
  "+f"(o[4][0]), "+f"(o[4][1]), "+f"(o[4][2]), "+f"(o[4][3]), \
  "+f"(o[5][0]), "+f"(o[5][1]), "+f"(o[5][2]), "+f"(o[5][3]), \
  "+f"(o[6][0]), "+f"(o[6][1]), "+f"(o[6][2]), "+f"(o[6][3]), \
  "+f"(o[7][0]), "+f"(o[7][1]), "+f"(o[7][2]), "+f"(o[7][3]), \
  "+f"(o[8][0]), "+f"(o[8][1]), "+f"(o[8][2]), "+f"(o[8][3]), \
  "+f"(o[9][0]), "+f"(o[9][1]), "+f"(o[9][2]), "+f"(o[9][3]), \
  "+f"(o[10][0]), "+f"(o[10][1]), "+f"(o[10][2]), "+f"(o[10][3]), \
  "+f"(o[11][0]), "+f"(o[11][1]), "+f"(o[11][2]), "+f"(o[11][3]), \
  "+f"(o[12][0]), "+f"(o[12][1]), "+f"(o[12][2]), "+f"(o[12][3]), \
  "+f"(o[13][0]), "+f"(o[13][1]), "+f"(o[13][2]), "+f"(o[13][3]), \
  "+f"(o[14][0]), "+f"(o[14][1]), "+f"(o[14][2]), "+f"(o[14][3]), \
  "+f"(o[15][0]), "+f"(o[15][1]), "+f"(o[15][2]), "+f"(o[15][3]), \
  "+f"(o[16][0]), "+f"(o[16][1]), "+f"(o[16][2]), "+f"(o[16][3]), \
  "+f"(o[17][0]), "+f"(o[17][1]), "+f"(o[17][2]), "+f"(o[17][3]), \
  "+f"(o[18][0]), "+f"(o[18][1]), "+f"(o[18][2]), "+f"(o[18][3]), \
  "+f"(o[19][0]), "+f"(o[19][1]), "+f"(o[19][2]), "+f"(o[19][3]), \
  "+f"(o[20][0]), "+f"(o[20][1]), "+f"(o[20][2]), "+f"(o[20][3]), \
  "+f"(o[21][0]), "+f"(o[21][1]), "+f"(o[21][2]), "+f"(o[21][3]), \
  "+f"(o[22][0]), "+f"(o[22][1]), "+f"(o[22][2]), "+f"(o[22][3]), \
  "+f"(o[23][0]), "+f"(o[23][1]), "+f"(o[23][2]), "+f"(o[23][3]), \
  "+f"(o[24][0]), "+f"(o[24][1]), "+f"(o[24][2]), "+f"(o[24][3]), \
  "+f"(o[25][0]), "+f"(o[25][1]), "+f"(o[25][2]), "+f"(o[25][3]), \
  "+f"(o[26][0]), "+f"(o[26][1]), "+f"(o[26][2]), "+f"(o[26][3]), \
  "+f"(o[27][0]), "+f"(o[27][1]), "+f"(o[27][2]), "+f"(o[27][3]), \
  "+f"(o[28][0]), "+f"(o[28][1]), "+f"(o[28][2]), "+f"(o[28][3]), \
  "+f"(o[29][0]), "+f"(o[29][1]), "+f"(o[29][2]), "+f"(o[29][3]), \
  "+f"(o[30][0]), "+f"(o[30][1]), "+f"(o[30][2]), "+f"(o[30][3]), \
  "+f"(o[31][0]), "+f"(o[31][1]), "+f"(o[31][2]), "+f"(o[31][3])

__device__ __forceinline__ void wgmma_pv_bf16(float (&o)[32][4], const uint32_t (&a)[4], uint64_t db) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" AITER_MLA_PV_ACC_REGS
               "}, {%128, %129, %130, %131}, %132, 1, 1, 1, 1;\n"
               : AITER_MLA_PV_ACC_OUTS(o)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
// The same with A = P from shared memory (descriptor da, K-major; the alternating loop's PV of
// the other warpgroup's tile).
__device__ __forceinline__ void wgmma_pv_bf16_ss(float (&o)[32][4], uint64_t da, uint64_t db) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" AITER_MLA_PV_ACC_REGS
               "}, %128, %129, 1, 1, 1, 0, 1;\n"
               : AITER_MLA_PV_ACC_OUTS(o)
               : "l"(da), "l"(db));
}
#undef AITER_MLA_PV_ACC_REGS
#undef AITER_MLA_PV_ACC_OUTS

// ---- global -> shared loads (interleaved layout) ----------------------------------------------
// Chunk (row r, 16-byte column ch) goes to (r/8)*kGroupBytes + ch*128 + (r%8)*16. Thread i
// takes column pair i>>4 of 8-row group: lanes 2k, 2k+1 read the two halves of one 32-byte
// sector, and 16 lanes fill 256 contiguous bytes of shared memory.
template <class C>
__device__ __forceinline__ uint32_t chunk_of(int i, int& row, int& col_bytes) {
  constexpr int kPairs = C::kChunksPerRow / 2;
  const int lo = i & 1, r8 = (i >> 1) & 7, rest = i >> 4;
  const int g = rest / kPairs, ch = (rest % kPairs) * 2 + lo;
  row = g * 8 + r8;
  col_bytes = ch * 16;
  return g * C::kGroupBytes + ch * 128 + r8 * 16;   // shared-memory byte offset
}

// Q rows of the CTA: row R < valid_rows reads q row (q_row0 + R); the rest are zero-filled.
template <class C>
__device__ __forceinline__ void load_q_tile(uint8_t* smem, const uint8_t* __restrict__ q, int64_t q_row0,
                                            int valid_rows) {
  const uint32_t base = smem_addr(smem + C::kOffQ);
#pragma unroll
  for (int i = threadIdx.x; i < kRows * C::kChunksPerRow; i += kThreads) {
    int r, col;
    const uint32_t off = chunk_of<C>(i, r, col);
    const bool ok = r < valid_rows;
    const uint8_t* src = ok ? q + (q_row0 + r) * (int64_t)C::kRowBytes + col : q;
    cp_async_16(base + off, src, ok ? 16 : 0);
  }
}

// 16-byte cp.async at compile-time offsets from two base addresses ([reg+imm] operands), so
// that the producer keeps one address register per row group instead of one per copy.
template <int DstOff, int SrcOff>
__device__ __forceinline__ void cp_async_16_at(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0+%3], [%1+%4], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes),
               "n"(DstOff), "n"(SrcOff)
               : "memory");
}

// One row group g of produce_kv_tile: chunk pairs 2cp + h, cp = Cp .. kPairs/2 - 1.
template <class C, int G, int Cp>
__device__ __forceinline__ void produce_group(uint32_t dst, const uint8_t* src, int src_bytes) {
  if constexpr (Cp < C::kChunksPerRow / 4) {
    cp_async_16_at<G * C::kGroupBytes + Cp * 512, Cp * 64>(dst, src, src_bytes);
    produce_group<C, G, Cp + 1>(dst, src, src_bytes);
  }
}

template <class C, int G>
__device__ __forceinline__ void produce_groups(uint32_t dst, const uint8_t* const (&src)[C::BN / 8],
                                               const bool (&ok)[C::BN / 8]) {
  if constexpr (G < C::BN / 8) {
    produce_group<C, G, 0>(dst, src[G], ok[G] ? 16 : 0);
    produce_groups<C, G + 1>(dst, src, ok);
  }
}

// The producer warp's cp.async copies (page_size < 8): the 32 lanes load the KV tile of BN
// virtual tokens from tok0 into stage `stage`, interleaved (chunk_of's layout); tokens >=
// kv_tok_end are zero-filled, never read; 64-bit byte offsets.
// Lane (h, r8, lo) = (lane >> 4, (lane >> 1) & 7, lane & 1) owns row r8 of every 8-row group
// and chunks 4cp + 2h + lo of it: its 8 page lookups are issued together, then per group and
// cp one warp instruction fills 64 contiguous bytes of 8 rows (two 32-byte sectors each) and
// 2 x 256 contiguous bytes of shared memory.
template <class C>
__device__ __forceinline__ void produce_kv_tile(uint8_t* smem, int stage, const uint8_t* __restrict__ kv,
                                                const PageTable& pages, int tok0, int kv_tok_end,
                                                int lane, bool& bad_page) {
  static_assert(C::kChunksPerRow % 4 == 0 && C::BN % 8 == 0, "chunks split into (cp, h, lo)");
  const int h = lane >> 4, r8 = (lane >> 1) & 7, lo = lane & 1;
  const uint32_t dst = smem_addr(smem + C::kOffKv + stage * C::kStageBytes) + (2 * h + lo) * 128 + r8 * 16;
  const uint8_t* src[C::BN / 8];
  bool ok[C::BN / 8];
#pragma unroll
  for (int g = 0; g < C::BN / 8; ++g) {
    const int v = tok0 + g * 8 + r8;
    ok[g] = v < kv_tok_end;
    src[g] = kv;
    if (ok[g]) {
      // a page id outside the pool zero-fills its row like a token past the tail (the copy's
      // source size 0: nothing is read) and sets bad_page; no clamp, so the 8 lookups stay
      // issued together on the producer's 24 registers
      const unsigned page = static_cast<unsigned>(__ldg(pages.ids + (v >> C::kLog2P)));
      ok[g] = page < pages.num_pages;
      bad_page |= !ok[g];
      src[g] = kv + ((static_cast<int64_t>(page) << C::kLog2P) + (v & (C::P - 1))) * C::kRowBytes + (2 * h + lo) * 16;
    }
  }
  produce_groups<C, 0>(dst, src, ok);
}

// ---- TMA (page_size >= 8) -----------------------------------------------------------------------
// A TMA stage is 64-byte swizzled: (row, 16-byte chunk) sits in column block chunk / 4 (BN rows
// x 64 B), at row * 64, its position in the 64-byte row XORed with (row / 2) % 4 (TMA
// SWIZZLE_64B = wgmma's 64-byte swizzle; both act on address bits, every block 512-byte aligned).
// Adds tx bytes to the barrier's expected count and arrives once (the barrier's one arrival).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// One box (kTmaRows rows from pool row `row`, bytes col .. col+63) into dst, completing its bytes
// on bar. map: see the kernel's kv_map.
__device__ __forceinline__ void tma_load_box(uint32_t dst, const void* map, int col, int row, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
      ::"r"(dst), "l"(map), "r"(col), "r"(row), "r"(bar)
      : "memory");
}

// One 3-D box (a map whose coordinates are {byte col, row, column block}) into dst.
__device__ __forceinline__ void tma_load_box3(uint32_t dst, const void* map, int col, int row, int blk, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
      ::"r"(dst), "l"(map), "r"(col), "r"(row), "r"(blk), "r"(bar)
      : "memory");
}

// The producer warp's TMA copies of the tile of BN virtual tokens from tok0 into the stage at
// stage_addr: the row's 64-byte column blocks (fp8 9, bf16 18) x the pages holding a token
// before kv_tok_end (pages past it are not looked up: their kv_indices entry may not exist),
// spread over the 32 lanes. The page lookups run before the wait for the stage to be free;
// lane 0 posts the byte count.
template <class C>
__device__ __forceinline__ void produce_kv_tile_tma(uint32_t stage_addr, uint32_t bar_full, uint32_t bar_empty,
                                                    uint32_t empty_parity, const void* map,
                                                    const PageTable& page_table, int tok0, int kv_tok_end,
                                                    int lane, bool wait_q, bool& bad_page) {
  constexpr int kBlocks = C::kRowBytes / C::kSwBytes;         // column blocks (64 B: fp8 9, bf16 18; 128 B: bf16 9)
  constexpr int kMaxBoxes = (C::BN / C::kTmaRows) * kBlocks;  // <= 144 (bf16, page_size 8)
  const int pages = (min(C::BN, kv_tok_end - tok0) + C::kTmaRows - 1) / C::kTmaRows;
  const int boxes = pages * kBlocks;
  int row[(kMaxBoxes + 31) / 32];
#pragma unroll
  for (int i = 0; i < (kMaxBoxes + 31) / 32; ++i) {
    const int b = lane + 32 * i;
    row[i] = 0;
    if (b < boxes) {
      const int v = tok0 + (b / kBlocks) * C::kTmaRows;
      row[i] = static_cast<int>(kv_pool_row<C>(page_table, v, bad_page));
    }
  }
  AITER_MLA_STAMP(kProduceIssue);
  wg::mbar_wait(bar_empty, empty_parity);
  if (wait_q) q_issued_wait();   // after the page-index loads, whose latency it hides
  AITER_MLA_STAMP(kProduceWait);
#if AITER_MLA_ALT_NO_KV_COPY
  if (lane == 0) mbar_arrive(bar_full);   // diagnostic (never shipped): no KV copy, stale data
  return;
#endif
  if (lane == 0) mbar_arrive_expect_tx(bar_full, boxes * C::kTmaBoxBytes);
  __syncwarp();
#pragma unroll
  for (int i = 0; i < (kMaxBoxes + 31) / 32; ++i) {
    const int b = lane + 32 * i;
    if (b < boxes) {
      const int blk = b % kBlocks, pg = b / kBlocks;
      tma_load_box(stage_addr + blk * (C::BN * C::kSwBytes) + pg * C::kTmaBoxBytes, map, blk * C::kSwBytes, row[i], bar_full);
    }
  }
  AITER_MLA_STAMP(kProduceIssue);
}

// ---- maths -----------------------------------------------------------------------------------
// S = Q . K[keys of warpgroup half]^T over all 576 dims, in two calls so that work can run
// while the tensor cores compute. fp8: Hopper's e4m3 wgmma accumulates with about 14 bits of
// mantissa (DeepSeek-V3 report, section 3.3.2; seen here as LSE errors up to 3.6e-3 against
// 5e-7 in fp32), so the 18 k-steps run as chunks of kChunk steps into two alternating
// accumulator sets, each added into S in fp32 (DeepGEMM's "promotion"; fp8: tile_pairs' odd
// last tile). bf16 accumulates in fp32 and runs as one chunk.
template <class C>
struct QkAcc {
  static constexpr int kChunk = C::kFp8 ? 3 : C::kKSteps;    // k-steps per promoted chunk
  static constexpr int kChunks = C::kKSteps / kChunk;
  static_assert(C::kKSteps % kChunk == 0, "k-steps must split into whole chunks");
  float acc[2][C::kSTiles][4];
};

// B operand (K of warpgroup half's keys, one k32 step kk) of QK. k_addr = the stage's address
// plus k_half_offset<C>(half). Interleaved stages: 8-key groups kGroupBytes apart, 16-byte chunks
// 128 B apart. Swizzled stages (the TMA layout, C::kSwizzled; C::kSwBytes = 64 here, 128 in
// the alternating loop): column blocks of BN rows x kSwBytes, 8-row atoms 8 x kSwBytes apart;
// a k32 step is 32 B into a block, reached by moving the start address (the hardware applies
// the swizzle to the final address).
// The descriptor's layout field for a swizzled stage: 64-byte 2, 128-byte 1 (sm_90 encoding).
template <class C>
__device__ __forceinline__ constexpr uint64_t swizzle_bits() {
  static_assert(C::kSwBytes == 64 || C::kSwBytes == 128, "64- or 128-byte swizzle");
  return (C::kSwBytes == 128 ? 1ull : 2ull) << 62;
}
template <class C>
__device__ __forceinline__ uint32_t k_half_offset(int half) {
  return C::kSwizzled ? half * (C::BN / 2) * C::kSwBytes : half * (C::BN / 16) * C::kGroupBytes;
}
// Descriptors of step kk are the step-0 descriptor plus the step's byte offset / 16 in the
// address field (shared-memory addresses < 2^18 B: the 14-bit field never carries), so the
// unrolled chunks add constants instead of rebuilding each descriptor.
template <class C>
__device__ __forceinline__ constexpr uint32_t k_step_bytes(int kk) {
  constexpr int kPer = C::kSwBytes / 32;   // k-steps per column block
  return C::kSwizzled ? (kk / kPer) * (C::BN * C::kSwBytes) + (kk % kPer) * 32 : kk * 256;
}
template <class C>
__device__ __forceinline__ uint64_t k_desc(uint32_t k_addr, int kk) {
  const uint64_t d0 = C::kSwizzled ? make_desc(k_addr, 16, 8 * C::kSwBytes) | swizzle_bits<C>() : make_desc(k_addr, 128, C::kGroupBytes);
  return d0 + (k_step_bytes<C>(kk) >> 4);
}
// A operand (Q, interleaved layout) of QK step kk.
template <class C>
__device__ __forceinline__ uint64_t q_desc(uint32_t q_addr, int kk) {
  if constexpr (C::kQTma) {   // Q as a 64-row KV stage: 64-byte-swizzled column blocks (k_desc)
    static_assert(C::BN == kRows, "a TMA-copied Q tile has a KV stage's shape");
    return (make_desc(q_addr, 16, 8 * C::kSwBytes) | swizzle_bits<C>()) + (k_step_bytes<C>(kk) >> 4);
  } else {
    return make_desc(q_addr, 128, C::kGroupBytes) + static_cast<uint64_t>(kk * 256 >> 4);
  }
}

// One commit group of QK: k-steps first .. first + N - 1 into acc, the first overwriting it;
// descs(kk, da, db) gives step kk's A and B descriptors (each loop addresses its own operands).
template <bool Fp8, int N, int T, class Descs>
__device__ __forceinline__ void qk_steps(float (&acc)[T][4], int first, Descs descs) {
  wgmma_fence();
#pragma unroll
  for (int i = 0; i < N; ++i) {
    uint64_t da, db;
    descs(first + i, da, db);
    if (i == 0) {
      wgmma_qk<Fp8, 0>(acc, da, db);
    } else {
      wgmma_qk<Fp8, 1>(acc, da, db);
    }
  }
  wgmma_commit();
  fence_operands(acc);
}

template <class C, int Chunk>
__device__ __forceinline__ void qk_issue_chunk(QkAcc<C>& a, uint32_t q_addr, uint32_t k_addr) {
  qk_steps<C::kFp8, QkAcc<C>::kChunk>(a.acc[Chunk & 1], Chunk * QkAcc<C>::kChunk, [&](int kk, uint64_t& da, uint64_t& db) {
    da = q_desc<C>(q_addr, kk);
    db = k_desc<C>(k_addr, kk);
  });
}

template <class C>
__device__ __forceinline__ void qk_add(float (&s)[C::kSTiles][4], float (&acc)[C::kSTiles][4]) {
  fence_operands(acc);
#pragma unroll
  for (int j = 0; j < C::kSTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[j][e] += acc[j][e];
}

template <class C, int Chunk>
__device__ __forceinline__ void qk_pipeline(float (&s)[C::kSTiles][4], QkAcc<C>& a, uint32_t q_addr, uint32_t k_addr) {
  if constexpr (Chunk < QkAcc<C>::kChunks) {
    wgmma_wait<1>();                       // chunk Chunk-2 is done; Chunk-1 may still run
    qk_add<C>(s, a.acc[Chunk & 1]);
    qk_issue_chunk<C, Chunk>(a, q_addr, k_addr);
    qk_pipeline<C, Chunk + 1>(s, a, q_addr, k_addr);
  }
}

// Issues the first (up to) two chunks; returns without waiting.
template <class C>
__device__ __forceinline__ void qk_begin(QkAcc<C>& a, const uint8_t* smem, int stage, int half) {
  const uint32_t q_addr = smem_addr(smem + C::kOffQ);
  const uint32_t k_addr = smem_addr(smem + C::kOffKv + stage * C::kStageBytes) + k_half_offset<C>(half);
  qk_issue_chunk<C, 0>(a, q_addr, k_addr);
  if constexpr (QkAcc<C>::kChunks > 1) qk_issue_chunk<C, 1>(a, q_addr, k_addr);
}

// Runs the remaining chunks and sums every chunk into s (fp32); all QK wgmmas are done after.
template <class C>
__device__ __forceinline__ void qk_finish(float (&s)[C::kSTiles][4], QkAcc<C>& a, const uint8_t* smem, int stage,
                                          int half) {
#pragma unroll
  for (int j = 0; j < C::kSTiles; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
  const uint32_t q_addr = smem_addr(smem + C::kOffQ);
  const uint32_t k_addr = smem_addr(smem + C::kOffKv + stage * C::kStageBytes) + k_half_offset<C>(half);
  qk_pipeline<C, 2>(s, a, q_addr, k_addr);
  constexpr int kN = QkAcc<C>::kChunks;
  if constexpr (kN > 1) {
    wgmma_wait<1>();
    qk_add<C>(s, a.acc[(kN - 2) & 1]);
  }
  wgmma_wait<0>();
  qk_add<C>(s, a.acc[(kN - 1) & 1]);
  fence_operands(s);
}

// B operand (V, MN-major: 256 columns of warpgroup half x 16 keys, step kk) of PV. v_addr = the
// V tile plus the half's first column. Interleaved: core matrices of 8 keys x 8 columns, 8-key
// groups kVGroupBytes apart (LBO), 8-column groups 128 B apart (SBO). 64-byte-swizzled bf16 TMA
// stages: an atom is 8 keys x 32 columns (512 B, the K-major K atom read the other way), the
// next 32 columns are a column block (BN x 64 B) away (LBO), the next 8 keys 512 B (SBO), and
// step kk starts 16 keys = 1 KB further.
template <class C>
__device__ __forceinline__ uint64_t v_desc(uint32_t v_addr, int kk) {
  if constexpr (C::kSwizzled) {
    return make_desc(v_addr + kk * 16 * C::kSwBytes, C::BN * C::kSwBytes, 8 * C::kSwBytes) | swizzle_bits<C>();
  } else {
    return make_desc(v_addr + kk * 2 * C::kVGroupBytes, C::kVGroupBytes, 128);
  }
}

// A Q tile copied by TMA (C::kQTma) holds other tokens' Q in its rows past the work's valid
// rows (the cp.async path zero-fills them). Their scores are never written, but the loop runs
// slower with them than with zeros: bf16 (16,1) (16 valid rows of 64) b256 c8192 took 705-729 us
// against 596-610 with them zeroed, in one call (docs/perf/notes.md, change 20; power is the
// likely cause, not measured). So they are zeroed, 64 bytes per row and column block; the
// caller fences the stores to the async proxy and syncs before the first QK.
template <class C>
__device__ __forceinline__ void zero_q_rows(uint8_t* smem, int valid_rows) {
  static_assert(C::kQTma, "Q in the TMA stage layout only");
  constexpr int kChunksPerRow = C::kRowBytes / 16;
  uint8_t* base = smem + C::kOffQ;
  for (int i = threadIdx.x; i < (kRows - valid_rows) * kChunksPerRow; i += kThreads) {
    const int row = valid_rows + i / kChunksPerRow, c = i % kChunksPerRow;   // 16-byte chunk c of the row
    constexpr int kPer = C::kSwBytes / 16;   // 16-byte chunks per swizzle row
    *reinterpret_cast<uint4*>(base + (c / kPer) * (kRows * C::kSwBytes) + row * C::kSwBytes + (c % kPer) * 16) = make_uint4(0, 0, 0, 0);
  }
}

}  // namespace wg
}  // namespace mla
