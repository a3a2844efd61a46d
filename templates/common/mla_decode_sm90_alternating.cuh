// MLA decode on sm_90a: the "alternating" main loop (template parameter mainloop =
// "alternating"; bf16, and fp8 above 32 rows), whose two consumer warpgroups run out of phase.
//
// The warpgroups take the work's 64-key tiles in turn: warpgroup w owns tiles b = 2i + w. Each
// scores its own tile over all 576 dims (S[64 x 64], m64n64), runs its softmax, and both add
// every tile into their own 256 of O's 512 columns. The row max is chained: the softmax of tile
// b starts from the max after tile b - 1, which the other warpgroup computed and handed over
// through shared memory with its P(b - 1) and factor exp2(m(b - 2) - m(b - 1)).
// One step of warpgroup w, for its tile b (the same code for both warpgroups: the role is only
// data, since ptxas serialises every wgmma of a loop whose warpgroup-role branches hold
// wgmmas, docs/perf/notes.md):
//   1. wait for the other's hand-over of tile b - 1 (named barrier 9 + other; none for b = 0),
//      wait for this warpgroup's PV of tile b - 2, rescale O and l by the factor of b - 1,
//      issue PV(b - 1): O += P(b - 1) [shared memory] . V(b - 1) [its columns];
//   2. issue QK(b), part by part as the stage's parts land; wait for both;
//   3. softmax of tile b from m(b - 1), P(b) written to shared memory with m(b) and the factor,
//      hand-over (bar.arrive 9 + w); rescale O and l;
//   4. issue PV(b) (bf16: P(b) from registers, wgmma RS); waited at the next step.
// fp8 differs in order too: the V^T fragments of tile b - 1 are loaded before the hand-over
// wait, the O^T rescales ride in the PV issue (per m-block), and a warpgroup's V half of its
// own tile is released in step 4, once its fragments are loaded.
// So each warpgroup's softmax runs while the other's PVs and QK occupy the tensor cores, and no
// barrier of all 256 consumers sits in the loop. bf16: one P tile in shared memory serves both
// directions: a warpgroup writes P(b) only after its PV(b - 1) has read P(b - 1), and the other
// writes P(b + 1) only after reading P(b). fp8 (the "fp8" section below): both PVs read P from
// shared memory, one buffer per warpgroup; QK is promoted in chunks; PV runs transposed.
//
// The edges: warpgroup 0's first step has no tile b - 1 ("tile -1"), and an odd tile count gets
// a masked tile n for warpgroup 1 (no copy: every score masked, so P = 0 and its factor 1, whose
// softmax still hands over the row max). Their MMAs are skipped by branches (the PV of tile -1,
// the QK and both PVs of tile n), which ptxas keeps asynchronous here (no C75xx: a branch that
// makes it wait after every wgmma shows in the default-variant build test). After its last step
// warpgroup 0 alone adds warpgroup 1's last tile (a branch whose wgmmas are waited inside it).
// A TMA stage (one tile, both warpgroups use it) is three parts, each with its own full and
// empty barrier: the RoPE column block, released by the owner once its QK is done, and V's two
// 256-column halves, each released by the warpgroup whose PVs read it once it is done with the
// tile (bf16: its PV; fp8: its V^T fragments loaded; 128 arrivals each). The producer refills a
// part as soon as it is free, and QK(b) waits for each part just before its k-steps. A
// cp.async stage is one part, released by both warpgroups (256 arrivals). Rows, masking, the
// epilogue and the producer are shared (mla_decode_sm90.cuh, mla_decode_sm90_wgmma.cuh): the
// stages are TMA-filled and swizzled (bf16 128-byte, fp8 64-byte rows) at page_size >= 8,
// cp.async-filled and interleaved below.
#pragma once
#include "mla_decode_sm90_transposed_pv.cuh"

namespace mla {
namespace alt {

template <int BlockN, int PageSize, bool Causal, bool Tma, bool Fp8 = false>
struct AlternatingConfig : wg::WgmmaTile<BlockN, PageSize, Fp8, Causal> {
  using T = wg::WgmmaTile<BlockN, PageSize, Fp8, Causal>;
  using T::BN;
  using T::kGroupBytes;
  using T::kStageBytes;
  using T::kOffKv;
  static constexpr int kSTiles = BN / 8;                      // a warpgroup scores a whole tile (N = 64)
  // KV ring: bf16 stages are 72 KB (two fit beside Q), fp8 stages 36 KB (four)
  static constexpr int kStages = Fp8 ? 4 : 2;
  static constexpr bool kSw64 = Tma;                          // KV stage layout (wg::k_desc, wg::v_desc)
  static constexpr bool kQTma = Tma;                          // Q copied by the producer, in the stage layout
  static constexpr int kVGroupBytes = kGroupBytes;
  static constexpr int kTmaRows = PageSize < BlockN ? PageSize : BlockN;
  // TMA stages in the 128-byte-swizzled layout for bf16: 9 column blocks of BN rows x 128 B. With
  // 64-byte rows a bf16 stage is 1,152 box rows, and the stage loads limited the loop
  // (docs/perf/notes.md). An fp8 row is 576 B: 9 column blocks of 64 B.
  static constexpr int kSwBytes = Fp8 ? 64 : 128;
  static constexpr int kTmaBoxBytes = kTmaRows * kSwBytes;
  // bf16: P [64 rows x 64 keys] bf16, interleaved K-major (8 rows x 16 bytes core matrices: key
  // chunk c of row group g at g * 1024 + c * 128), the A operand of the other warpgroup's PV; one
  // tile serves both directions (a warpgroup's own PV takes P from registers).
  // fp8: P [64 rows x 64 keys] e4m3 in transposed_pv's B layout, one buffer per warpgroup (both
  // PVs of a tile read it from shared memory: fp8 wgmma operands are K-major, so PV runs as
  // O^T += V^T . P^T with P^T the B operand).
  static constexpr int kPGroupBytes = BN * 2 * 8;
  static constexpr int kPBytes = kRows * BN * (Fp8 ? 1 : 2);
  static constexpr int kPBufs = Fp8 ? 2 : 1;
  static constexpr int kOffP = kOffKv + kStages * kStageBytes;
  // Hand-over: bf16 m[64], factor[64] (one set: a warpgroup reads the other's before writing its
  // own). fp8: factor[2][64] then m[2][64], one set per warpgroup, since the factors reach O^T's
  // layout through shared memory and a warpgroup reads its own set after handing it over.
  static constexpr int kOffXchg = kOffP + kPBufs * kPBytes;
  static constexpr int kXchgBytes = (Fp8 ? 4 : 2) * kRows * 4;
  static constexpr int kOffMax = Fp8 ? kOffXchg + 2 * kRows * 4 : kOffXchg;
  static constexpr int kOffScale = Fp8 ? kOffXchg : kOffXchg + kRows * 4;   // fp8: transposed_pv::load_factors' scale[w]
  static constexpr int kOffInv = kOffXchg + kXchgBytes;       // fp8: [64] out_scale / l (transposed_pv::write_output)
  static constexpr int kOffRed = kOffInv + (Fp8 ? kRows * 4 : 0);   // epilogue row sums (row_totals)
  static constexpr int kMBlocks = kVDim / 2 / 64;             // fp8: m64 blocks of O^T per warpgroup
  // A TMA stage is three parts, each with its own full and empty barrier: the RoPE column block
  // (K only: free once the owner's QK is done) and the two 256-column halves of V (free once
  // that half's warpgroup has read the tile: bf16 after its PV, fp8 once its V^T fragments are
  // loaded). The producer refills each part as soon as it is free, and QK starts on the first
  // part that lands. cp.async stages are one part.
  static constexpr int kParts = Tma ? 3 : 1;
  static constexpr int kPartRope = 0;                         // part 1 + h: V half h (column blocks 4h .. 4h + 3)
  static constexpr int kOffBar = kOffRed + T::kRedBytes;      // full[stage][part], empty[stage][part], q_full, q_empty
  static constexpr int kOffQBar = kOffBar + 2 * kStages * kParts * 8;
  static constexpr int kSmemBytes = kOffQBar + (kQTma ? 2 * 8 : 0);

  // The hand-over values warpgroup w writes (bf16: one set for both).
  __host__ __device__ static constexpr int off_factor(int w) { return kOffScale + (Fp8 ? w * kRows * 4 : 0); }
  __host__ __device__ static constexpr int off_max(int w) { return kOffMax + (Fp8 ? w * kRows * 4 : 0); }

  static_assert(kSmemBytes <= 227 * 1024, "shared memory tile does not fit an sm_90 CTA (227 KB)");
  static_assert(kOffKv % 1024 == 0 && kStageBytes % 1024 == 0 && kOffP % 128 == 0, "aligned operands (128-byte swizzle atoms: 1 KB)");
  static_assert(!Tma || PageSize >= 8, "TMA stages: page_size >= 8");
  static_assert(!Tma || T::kRowBytes / kSwBytes == 9, "TMA parts: 9 column blocks, V's 512 columns in the first 8");
};

// The producer warp's TMA copies of the tile of BN virtual tokens from tok0 into the stage at
// stage_addr, part by part in the order QK reads them (the RoPE block, V's halves 0 and 1;
// qk_issue_parts, qk_fp8): each waits for its own release, then posts its
// bytes on its own full barrier (bar_full / bar_empty: the stage's part 0 barrier; part p is
// 8 p bytes on). Pages past kv_tok_end are not looked up; a part is at most 8 pages x 4
// column blocks, one box per lane.
template <class C>
__device__ __forceinline__ void produce_tile_parts(uint32_t stage_addr, uint32_t bar_full, uint32_t bar_empty,
                                                   uint32_t empty_parity, const void* map, const PageTable& page_table,
                                                   int tok0, int kv_tok_end, int lane, bool& bad_page) {
  static_assert(C::BN / C::kTmaRows * 4 <= 32, "a part's boxes fit the warp's lanes");
  const int pages = (min(C::BN, kv_tok_end - tok0) + C::kTmaRows - 1) / C::kTmaRows;
  int page_row = 0;
  if (lane < pages) page_row = static_cast<int>(kv_pool_row<C>(page_table, tok0 + lane * C::kTmaRows, bad_page));
  AITER_MLA_STAMP(kProduceIssue);
#pragma unroll
  for (int part = 0; part < 3; ++part) {
    const int log2_blocks = part == C::kPartRope ? 0 : 2;   // column blocks: 1 or 4
    const int blk0 = part == C::kPartRope ? 8 : 4 * (part - 1);
    wg::mbar_wait(bar_empty + part * 8, empty_parity);
    AITER_MLA_STAMP(kProduceWait);
    if (lane == 0) wg::mbar_arrive_expect_tx(bar_full + part * 8, (pages << log2_blocks) * C::kTmaBoxBytes);
    __syncwarp();
    const int pg = lane >> log2_blocks, blk = blk0 + (lane & ((1 << log2_blocks) - 1));
    const int row = __shfl_sync(0xffffffffu, page_row, pg & 31);
    if (pg < pages)
      wg::tma_load_box(stage_addr + blk * (C::BN * C::kSwBytes) + pg * C::kTmaBoxBytes, map, blk * C::kSwBytes, row,
                       bar_full + part * 8);
    AITER_MLA_STAMP(kProduceIssue);
  }
}

// The hand-over barriers: 9 + w = "warpgroup w's P, max and factor are written" (256 threads:
// w arrives, the other waits). 1..4 pair_sync, 5-6 wg_sync, 7 consumer_sync, 8 q_issued.
__device__ __forceinline__ void handover_arrive(int from) {
  asm volatile("bar.arrive %0, 256;\n" ::"r"(9 + from) : "memory");
}
__device__ __forceinline__ void handover_wait(int from) {
  asm volatile("bar.sync %0, 256;\n" ::"r"(9 + from) : "memory");
}

// bf16: issues S = Q . K^T of the tile at k_addr over all 576 dims in the order of the stage's parts:
// the RoPE block, then V's halves 0 and 1 (the order produce_tile_parts fills them). Each part
// is waited for (wait_part(part)) just before its k-steps, so the MMAs start on the first part
// that lands, and is its own commit group (ptxas serialises the wgmmas when a wait loop sits
// inside a group). cp.async stages are one part (wait_part(0) each time) and run the same
// order, so the sums do not depend on the page size. Between the second and the third group
// `between()` runs: the caller waits there for its PV issued before QK (wgmma_wait<2>) and
// releases that stage's part without waiting for this tile's last part.
template <class C, class WaitPart, class Between>
__device__ __forceinline__ void qk_issue_parts(float (&s)[8][4], uint32_t q_addr, uint32_t k_addr,
                                               WaitPart wait_part, Between between) {
  wg::fence_operands(s);
  wait_part(0);
  wg::wgmma_fence();
  wg::wgmma_qk<false, 0>(s, wg::q_desc<C>(q_addr, 32), wg::k_desc<C>(k_addr, 32));
#pragma unroll
  for (int kk = 33; kk < 36; ++kk) wg::wgmma_qk<false, 1>(s, wg::q_desc<C>(q_addr, kk), wg::k_desc<C>(k_addr, kk));
  wg::wgmma_commit();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (h == 1) between();
    wait_part(C::kParts > 1 ? 1 + h : 0);
    wg::wgmma_fence();
#pragma unroll
    for (int kk = 16 * h; kk < 16 * h + 16; ++kk)
      wg::wgmma_qk<false, 1>(s, wg::q_desc<C>(q_addr, kk), wg::k_desc<C>(k_addr, kk));
    wg::wgmma_commit();
  }
  wg::fence_operands(s);
}

// Issues O[64 x 256] += P[64 x 64] (shared memory, the other warpgroup's) . V[64 x 256].
template <class C>
__device__ __forceinline__ void pv_issue_ss(float (&o)[C::kOTiles][4], uint32_t p_addr, uint32_t v_addr) {
  wg::fence_operands(o);
  wg::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < C::BN / 16; ++kk)
    wg::wgmma_pv_bf16_ss(o, wg::make_desc(p_addr + kk * 2 * 128, 128, C::kPGroupBytes), wg::v_desc<C>(v_addr, kk));
  wg::wgmma_commit();
  wg::fence_operands(o);
}

// Issues O[64 x 256] += P[64 x 64] (registers: a[kk], this warpgroup's) . V[64 x 256].
template <class C>
__device__ __forceinline__ void pv_issue_rs(float (&o)[C::kOTiles][4], uint32_t (&a)[C::BN / 16][4], uint32_t v_addr) {
  wg::fence_operands(a);
  wg::fence_operands(o);
  wg::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < C::BN / 16; ++kk) wg::wgmma_pv_bf16(o, a[kk], wg::v_desc<C>(v_addr, kk));
  wg::wgmma_commit();
  wg::fence_operands(o);
  wg::fence_operands(a);
}

// The softmax of this warpgroup's tile (after QK): masks keys at or past each row's key_end
// (kbase: the virtual token of s[0][0] for this thread), takes the row max from m_prev (the max
// after the previous tile, the other warpgroup's), and hands P to store(j, p0, p1, p2, p3) (n8
// tile j: rows r0 and r0 + 8, as exp_scores), the new max in m_new, in scale the factor
// exp2(m_prev - m_new) for O and l (0 while the row saw no key: -inf references become 0, no
// NaN) and in sum this thread's part of the row sums. The tile that holds the row's max gets
// p = 1 for it exactly (the chained max is the true running max), which e4m3 P needs.
template <class C, class Store>
__device__ __forceinline__ void softmax_tile(float (&s)[C::kSTiles][4], const RowState& st, const float (&m_prev)[2],
                                             int kbase, int tile_end, float scale_log2, float (&m_new)[2],
                                             float (&scale)[2], float (&sum)[2], Store store) {
  // fp8: 6 of the thread's 32 exponentials on the FMA pipe. At the fp8 rate the SFU's 32 ex2
  // (8 pipe cycles a warp each, 256) outlast the softmax's other instructions (about 150 issue
  // slots); each moved one costs ~9 slots more: ~6 moved balances them (~210 cycles).
  constexpr int kFmaEvery = C::kFp8 ? 5 : 0;
  float mx[2];
  const float sc = masked_quad_max<C>(s, st, kbase, tile_end, scale_log2, mx);
  float m_ref[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    m_new[h] = fmaxf(m_prev[h], mx[h]);
    m_ref[h] = m_new[h] == -INFINITY ? 0.f : m_new[h];
    scale[h] = fast_exp2(m_prev[h] - m_ref[h]);
  }
  exp_scores<C, Store, kFmaEvery>(s, m_ref, sc, sum, store);
}

// bf16 P as wgmma A fragments (k-step kk = n8 tiles 2kk, 2kk + 1: the S accumulator layout is
// the A layout), softmax_tile's store.
template <class C>
__device__ __forceinline__ auto p_to_frags(uint32_t (&a)[C::BN / 16][4]) {
  return [&a](int j, float p0, float p1, float p2, float p3) {
    a[j >> 1][(j & 1) * 2] = pack2_bf16(p0, p1);
    a[j >> 1][(j & 1) * 2 + 1] = pack2_bf16(p2, p3);
  };
}

// Writes this quad's rows' new max and factor (from its first lane) for the other warpgroup,
// fences P and them to the async proxy (the other warpgroup's PV reads P by wgmma) and hands
// over (P is written before).
template <class C>
__device__ __forceinline__ void publish(const float (&m_new)[2], const float (&scale)[2], uint8_t* smem, int group,
                                        int half, int lane) {
  const int r0 = group * 16 + (lane >> 2);
  float* xm = reinterpret_cast<float*>(smem + C::off_max(half));
  float* xf = reinterpret_cast<float*>(smem + C::off_factor(half));
  if ((lane & 3) == 0) {
    xm[r0] = m_new[0];
    xm[r0 + 8] = m_new[1];
    xf[r0] = scale[0];
    xf[r0 + 8] = scale[1];
  }
  wg::fence_proxy_async();
  handover_arrive(half);
}

// bf16: writes P (the A fragments of p_to_frags) into the shared P tile, then publishes.
template <class C>
__device__ __forceinline__ void hand_over(const uint32_t (&a)[C::BN / 16][4], const float (&m_new)[2],
                                          const float (&scale)[2], uint8_t* smem, int group, int half, int lane) {
  const int r0 = group * 16 + (lane >> 2);
  uint8_t* p_tile = smem + C::kOffP + (r0 >> 3) * C::kPGroupBytes + (r0 & 7) * 16 + (lane & 3) * 4;
#pragma unroll
  for (int kk = 0; kk < C::BN / 16; ++kk) {
    // n8 tile j = 2kk + e / 2 is key chunk j; rows r0 (e even) and r0 + 8 (one row group on)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      *reinterpret_cast<uint32_t*>(p_tile + (e & 1) * C::kPGroupBytes + (2 * kk + (e >> 1)) * 128) = a[kk][e];
  }
  publish<C>(m_new, scale, smem, group, half, lane);
}

// The other warpgroup's hand-over of its tile: waits for it, then reads this thread's rows' max
// (into m) and factor.
template <class C>
__device__ __forceinline__ void take_over(float (&m)[2], float (&scale)[2], const uint8_t* smem, int group, int half,
                                          int lane) {
  handover_wait(half ^ 1);
  const int r0 = group * 16 + (lane >> 2);
  const float* xm = reinterpret_cast<const float*>(smem + C::off_max(half ^ 1));
  const float* xf = reinterpret_cast<const float*>(smem + C::off_factor(half ^ 1));
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    m[h] = xm[r0 + 8 * h];
    scale[h] = xf[r0 + 8 * h];
  }
}

// O's and l's rows times their factors.
template <class C>
__device__ __forceinline__ void rescale(float (&o)[C::kOTiles][4], RowState& st, const float (&scale)[2]) {
  scale_rows<C>(o, scale);
  st.l[0] *= scale[0];
  st.l[1] *= scale[1];
}

// ---- fp8 -------------------------------------------------------------------------------------
// The fp8 step differs from bf16 in three places. QK is promoted (Hopper's e4m3 wgmma keeps about
// 14 mantissa bits: wg::QkAcc): three chunks of 6 k-steps, the first into S, the others into one
// accumulator set added into S in fp32. PV runs transposed (fp8 operands are K-major):
// O^T[256 V columns x 64 rows] += V^T (registers, ldmatrix.trans of the stage) . P^T (shared
// memory), so both PVs of a tile read P from shared memory (one buffer per warpgroup) and the
// row factors reach O^T's layout through shared memory (transposed_pv::load_factors). A stage's
// V half is released as soon as its warpgroup holds the tile's V^T fragments.

// One commit group of QK: k-steps First .. First + N - 1 into d (Fresh: the first overwrites it).
template <class C, bool Fresh, int First, int N>
__device__ __forceinline__ void qk_group(float (&d)[C::kSTiles][4], uint32_t q_addr, uint32_t k_addr) {
  wg::wgmma_fence();
#pragma unroll
  for (int i = 0; i < N; ++i) {
    if (Fresh && i == 0) {
      wg::wgmma_qk<true, 0>(d, wg::q_desc<C>(q_addr, First + i), wg::k_desc<C>(k_addr, First + i));
    } else {
      wg::wgmma_qk<true, 1>(d, wg::q_desc<C>(q_addr, First + i), wg::k_desc<C>(k_addr, First + i));
    }
  }
  wg::wgmma_commit();
  wg::fence_operands(d);
}

// fp8 S = Q . K^T over all 576 dims, waited, in the order of the stage's parts (the RoPE block:
// k-steps 16-17; V's halves: 0-7, 8-15), as three chunks of 6 k-steps: [16, 17, 0-3] into S,
// [4-9] and [10-15] into acc, each added into S once done (two drains a tile, which the other
// warpgroup's MMAs fill). Each part is waited for just before its first k-step, in its own
// commit group. between() runs once the first chunk is issued: the caller waits there for the
// PV it issued before QK (wgmma_wait<2>), so that PV's V^T fragments are dead before acc is live.
template <class C, class WaitPart, class Between>
__device__ __forceinline__ void qk_fp8(float (&s)[C::kSTiles][4], uint32_t q_addr, uint32_t k_addr,
                                       WaitPart wait_part, Between between) {
  static_assert(C::kFp8 && C::kKSteps == 18, "fp8: 18 k32 steps");
  constexpr int kV0 = C::kParts > 1 ? 1 : 0, kV1 = C::kParts > 1 ? 2 : 0;
  wg::fence_operands(s);
  wait_part(C::kPartRope);
  qk_group<C, true, 16, 2>(s, q_addr, k_addr);
  wait_part(kV0);
  qk_group<C, false, 0, 4>(s, q_addr, k_addr);
  between();
  float acc[C::kSTiles][4];
  qk_group<C, true, 4, 4>(acc, q_addr, k_addr);
  wait_part(kV1);
  qk_group<C, false, 8, 2>(acc, q_addr, k_addr);
  wg::wgmma_wait<0>();
  wg::qk_add<C>(s, acc);
  qk_group<C, true, 10, 6>(acc, q_addr, k_addr);
  wg::wgmma_wait<0>();
  wg::qk_add<C>(s, acc);
  wg::fence_operands(s);
}

// softmax_tile's store for fp8: P as e4m3 into this warpgroup's P buffer (p_buf), in
// transposed_pv's B layout (rows r0 and r0 + 8, keys at p_pos).
template <class C>
__device__ __forceinline__ auto p_to_smem(uint8_t* p_buf, int group, int lane) {
  uint8_t* p = p_buf + transposed_pv::p_row(group * 16 + (lane >> 2), (lane & 3) * 2);
  return [p](int j, float p0, float p1, float p2, float p3) {
    *reinterpret_cast<__nv_fp8x2_storage_t*>(p + transposed_pv::p_step(j)) = fp8::e4m3x2(p0, p1);
    *reinterpret_cast<__nv_fp8x2_storage_t*>(p + 512 + transposed_pv::p_step(j)) = fp8::e4m3x2(p2, p3);
  };
}

template <class C, int MB>
__device__ __forceinline__ void pv_blocks_fp8(float (&o)[C::kOTiles][4], const uint32_t (&a)[C::kMBlocks][C::BN / 32][4],
                                              const float2 (&f)[8], bool rescale, uint32_t p) {
  if constexpr (MB < C::kMBlocks) {
    if (rescale) transposed_pv::scale_mblock(o, MB, f);
    wg::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < C::BN / 32; ++kk) transposed_pv::wgmma_pv_t<MB>(o, a[MB][kk], wg::make_desc(p + kk * 256, 128, 512));
    pv_blocks_fp8<C, MB + 1>(o, a, f, rescale, p);
  }
}

// Issues (does not wait for) O^T *= f (when `rescale`: the rows' factors in O^T's layout), then
// O^T += V^T (fragments a) . P^T (the P buffer at p), one commit group; each m-block is rescaled
// just before its wgmmas, while the previous m-block's run.
template <class C>
__device__ __forceinline__ void pv_issue_fp8(float (&o)[C::kOTiles][4], const uint32_t (&a)[C::kMBlocks][C::BN / 32][4],
                                             const float2 (&f)[8], bool rescale, uint32_t p) {
  wg::fence_operands(o);
  pv_blocks_fp8<C, 0>(o, a, f, rescale, p);
  wg::wgmma_commit();
  wg::fence_operands(o);
}

// fp8: the fragments' registers pinned until their PV is waited.
template <class C>
__device__ __forceinline__ void fence_frags(uint32_t (&a)[C::kMBlocks][C::BN / 32][4]) {
#pragma unroll
  for (int mb = 0; mb < C::kMBlocks; ++mb) wg::fence_operands(a[mb]);
}

// Zeroes V's 512 columns of a TMA stage's rows past the tile's valid keys, with the 128 threads
// of one warpgroup (the tile's owner): the tail page's rows past the work's end may hold NaN, and
// pages not loaded keep an earlier tile's bytes, so P = 0 never meets them (K there is masked in
// the softmax by select). The caller fences the stores to the async proxy and syncs the
// warpgroup.
template <class C>
__device__ __forceinline__ void zero_v_tail_wg(uint8_t* smem, int stage, int valid) {
  static_assert(C::kSw64, "TMA stages only (cp.async zero-fills the tail)");
  uint8_t* base = smem + C::kOffKv + stage * C::kStageBytes;
  const int chunks = (C::BN - valid) * (kVDim * 2 / 16);
  for (int i = threadIdx.x & 127; i < chunks; i += 128) {
    const int row = valid + (i >> 6), c = i & 63;   // 16-byte chunk c of the row's 1 KB of V
    constexpr int kPer = C::kSwBytes / 16;
    *reinterpret_cast<uint4*>(base + (c / kPer) * (C::BN * C::kSwBytes) + row * C::kSwBytes + (c % kPer) * 16) =
        make_uint4(0, 0, 0, 0);
  }
}

}  // namespace alt
}  // namespace mla
