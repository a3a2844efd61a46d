// MLA decode on sm_90a: the bf16 "alternating" main loop (template parameter mainloop =
// "alternating"), whose two consumer warpgroups run out of phase.
//
// The warpgroups take the work's 64-key tiles in turn: warpgroup w owns tiles b = 2i + w. Each
// scores its own tile over all 576 dims (S[64 x 64], m64n64k16), runs its softmax, and both add
// every tile into their own 256 of O's 512 columns (m64n256k16). The row max is chained: the
// softmax of tile b starts from the max after tile b - 1, which the other warpgroup computed and
// handed over through shared memory with its P(b - 1) and factor exp2(m(b - 2) - m(b - 1)).
// One step of warpgroup w, for its tile b (the same code for both warpgroups: the role is only
// data, since ptxas serialises every wgmma of a loop whose warpgroup-role branches hold
// wgmmas, docs/perf/notes.md):
//   1. wait for the other's hand-over of tile b - 1 (named barrier 9 + other; none for b = 0),
//      wait for this warpgroup's PV of tile b - 2, rescale O and l by the factor of b - 1,
//      issue PV(b - 1): O += P(b - 1) [shared memory] . V(b - 1) [its columns];
//   2. issue QK(b), part by part as the stage's parts land; wait for both;
//   3. softmax of tile b from m(b - 1), P(b) written to shared memory with m(b) and the factor,
//      hand-over (bar.arrive 9 + w); rescale O and l;
//   4. issue PV(b) with P(b) from registers (wgmma RS); waited at the next step.
// So each warpgroup's softmax runs while the other's PVs and QK occupy the tensor cores, and no
// barrier of all 256 consumers sits in the loop. One P tile in shared memory serves both
// directions: a warpgroup writes P(b) only after its PV(b - 1) has read P(b - 1), and the other
// writes P(b + 1) only after reading P(b).
//
// Edges as data, not branches: warpgroup 0's first step adds "tile -1" (P zeroed at the work's
// start, V = the Q tile, finite); an odd tile count gets a masked tile n (no copy: K and V read
// from the Q tile, every score masked, so P = 0 and its factor 1). After its last step warpgroup
// 0 alone adds warpgroup 1's last tile (a branch whose wgmmas are waited inside it).
// A TMA stage (one tile, both warpgroups use it) is three parts, each with its own full and
// empty barrier: the RoPE column block, released by the owner once its QK is done, and V's two
// 256-column halves, each released by the warpgroup whose PVs read it once its PV of the tile
// is done (128 arrivals each). The producer refills a part as soon as it is free, and QK(b)
// waits for each part just before its k-steps. A cp.async stage is one part, released by both
// warpgroups (256 arrivals). Rows, masking, the epilogue and the producer are
// shared (mla_decode_sm90.cuh, mla_decode_sm90_wgmma.cuh): the stages are TMA-filled and
// 128-byte swizzled at page_size >= 8, cp.async-filled and interleaved below.
#pragma once
#include "mla_decode_sm90_wgmma.cuh"


namespace mla {
namespace alt {

template <int BlockN, int PageSize, bool Causal, bool Tma>
struct AlternatingConfig : wg::WgmmaTile<BlockN, PageSize, false, Causal> {
  using T = wg::WgmmaTile<BlockN, PageSize, false, Causal>;
  using T::BN;
  using T::kGroupBytes;
  using T::kStageBytes;
  using T::kOffKv;
  static constexpr int kSTiles = BN / 8;                      // a warpgroup scores a whole tile (N = 64)
  static constexpr int kStages = 2;
  static constexpr bool kSwizzled = Tma;                      // KV stage layout (wg::k_desc, wg::v_desc)
  static constexpr bool kQTma = Tma;                          // Q copied by the producer, in the stage layout
  static constexpr int kVGroupBytes = kGroupBytes;
  static constexpr int kTmaRows = PageSize < BlockN ? PageSize : BlockN;
  // TMA stages in the 128-byte-swizzled layout: 9 column blocks of BN rows x 128 B. With 64-byte
  // rows a stage is 1,152 box rows, and the stage loads limited the loop (docs/perf/notes.md).
  static constexpr int kSwBytes = 128;
  static constexpr int kTmaBoxBytes = kTmaRows * kSwBytes;
  // P [64 rows x 64 keys] bf16, interleaved K-major (8 rows x 16 bytes core matrices: key chunk
  // c of row group g at g * 1024 + c * 128), the A operand of the other warpgroup's PV.
  static constexpr int kPGroupBytes = BN * 2 * 8;
  static constexpr int kPBytes = kRows * BN * 2;
  static constexpr int kOffP = kOffKv + kStages * kStageBytes;
  static constexpr int kOffXchg = kOffP + kPBytes;            // hand-over: m[64], factor[64]
  static constexpr int kOffRed = kOffXchg + 2 * kRows * 4;    // epilogue row sums (row_totals)
  // A TMA stage is three parts, each with its own full and empty barrier: the RoPE column block
  // (K only: free once the owner's QK is done) and the two 256-column halves of V (free once
  // that half's warpgroup has added the tile into O). The producer refills each part as soon
  // as it is free, and QK starts on the first part that lands. cp.async stages are one part.
  static constexpr int kParts = Tma ? 3 : 1;
  static constexpr int kPartRope = 0;                         // part 1 + h: V half h (column blocks 4h .. 4h + 3)
  static constexpr int kOffBar = kOffRed + T::kRedBytes;      // full[stage][part], empty[stage][part], q_full, q_empty
  static constexpr int kOffQBar = kOffBar + 2 * kStages * kParts * 8;
  static constexpr int kSmemBytes = kOffQBar + (kQTma ? 2 * 8 : 0);

  static_assert(kSmemBytes <= 227 * 1024, "shared memory tile does not fit an sm_90 CTA (227 KB)");
  static_assert(kOffKv % 1024 == 0 && kStageBytes % 1024 == 0 && kOffP % 128 == 0, "aligned operands (128-byte swizzle atoms: 1 KB)");
  static_assert(!Tma || PageSize >= 8, "TMA stages: page_size >= 8");
  static_assert(!Tma || T::kRowBytes / kSwBytes == 9, "TMA parts: 9 column blocks, V's 512 columns in the first 8");
};

// The producer warp's TMA copies of the tile of BN virtual tokens from tok0 into the stage at
// stage_addr, part by part in the order QK reads them (the RoPE block, V's halves 0 and 1;
// qk_issue_parts): each waits for its own release, then posts its
// bytes on its own full barrier (bar_full / bar_empty: the stage's part 0 barrier; part p is
// 8 p bytes on). Pages past kv_tok_end are not looked up; a part is at most 8 pages x 4
// column blocks, one box per lane. With map_v (pages of >= BN tokens, so a tile is one run of
// pool rows) each V half is one 3-D box of its 4 column blocks: a tile takes 3 copies instead
// of 9 (1-3% faster at (128,1) ctx >= 3200, 2-6% at ctx 21 on an H100, docs/perf/notes.md).
template <class C>
__device__ __forceinline__ void produce_tile_parts(uint32_t stage_addr, uint32_t bar_full, uint32_t bar_empty,
                                                   uint32_t empty_parity, const void* map, const void* map_v,
                                                   const PageTable& page_table, int tok0, int kv_tok_end, int lane,
                                                   bool& bad_page) {
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
#if AITER_MLA_ALT_NO_KV_COPY
    // Diagnostic (never shipped): no KV copy; the part is signalled full at once (stale data)
    if (lane == 0) wg::mbar_arrive(bar_full + part * 8);
    continue;
#endif
    if (lane == 0) wg::mbar_arrive_expect_tx(bar_full + part * 8, (pages << log2_blocks) * C::kTmaBoxBytes);
    __syncwarp();
    if (map_v != nullptr && part != C::kPartRope) {
      // map_v (pages hold whole tiles: one box-row block): the 4 column blocks in one copy
      if (lane == 0) wg::tma_load_box3(stage_addr + blk0 * (C::BN * C::kSwBytes), map_v, 0, page_row, blk0, bar_full + part * 8);
    } else {
      const int pg = lane >> log2_blocks, blk = blk0 + (lane & ((1 << log2_blocks) - 1));
      const int row = __shfl_sync(0xffffffffu, page_row, pg & 31);
      if (pg < pages)
        wg::tma_load_box(stage_addr + blk * (C::BN * C::kSwBytes) + pg * C::kTmaBoxBytes, map, blk * C::kSwBytes, row,
                         bar_full + part * 8);
    }
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

// Issues S = Q . K^T of the tile at k_addr over all 576 dims in the order of the stage's parts:
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
// after the previous tile, the other warpgroup's), and returns in a the bf16 P as wgmma A
// fragments (k-step kk = n8 tiles 2kk, 2kk + 1: the S accumulator layout is the A layout), in
// m_new the new max, in scale the factor exp2(m_prev - m_new) for O and l (0 while the row saw
// no key: -inf references become 0, no NaN) and in sum this thread's part of the row sums.
template <class C>
__device__ __forceinline__ void softmax_tile(float (&s)[C::kSTiles][4], const RowState& st, const float (&m_prev)[2],
                                             int kbase, int tile_end, float scale_log2, float (&m_new)[2],
                                             float (&scale)[2], float (&sum)[2], uint32_t (&a)[C::BN / 16][4]) {
  float mx[2];
  const float sc = masked_quad_max<C>(s, st, kbase, tile_end, scale_log2, mx);
  float m_ref[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    m_new[h] = fmaxf(m_prev[h], mx[h]);
    m_ref[h] = m_new[h] == -INFINITY ? 0.f : m_new[h];
    scale[h] = fast_exp2(m_prev[h] - m_ref[h]);
  }
  exp_scores<C>(s, m_ref, sc, sum, [&](int j, float p0, float p1, float p2, float p3) {
    a[j >> 1][(j & 1) * 2] = pack2_bf16(p0, p1);
    a[j >> 1][(j & 1) * 2 + 1] = pack2_bf16(p2, p3);
  });
}

// Writes P (the A fragments of softmax_tile) into the shared P tile and, from each quad's first
// lane, the rows' new max and factor; then fences them to the async proxy (the other
// warpgroup's PV reads P by wgmma) and hands over.
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
  float* xm = reinterpret_cast<float*>(smem + C::kOffXchg);
  if ((lane & 3) == 0) {
    xm[r0] = m_new[0];
    xm[r0 + 8] = m_new[1];
    xm[kRows + r0] = scale[0];
    xm[kRows + r0 + 8] = scale[1];
  }
  wg::fence_proxy_async();
  handover_arrive(half);
}

// The other warpgroup's hand-over of its tile: waits for it, then reads this thread's rows' max
// (into m) and factor.
template <class C>
__device__ __forceinline__ void take_over(float (&m)[2], float (&scale)[2], const uint8_t* smem, int group, int half,
                                          int lane) {
  handover_wait(half ^ 1);
  const int r0 = group * 16 + (lane >> 2);
  const float* xm = reinterpret_cast<const float*>(smem + C::kOffXchg);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    m[h] = xm[r0 + 8 * h];
    scale[h] = xm[kRows + r0 + 8 * h];
  }
}

// O's and l's rows times their factors.
template <class C>
__device__ __forceinline__ void rescale(float (&o)[C::kOTiles][4], RowState& st, const float (&scale)[2]) {
  scale_rows<C>(o, scale);
  st.l[0] *= scale[0];
  st.l[1] *= scale[1];
}

// Zeroes V's 512 columns of a TMA stage's rows past the tile's valid keys, with the 128 threads
// of one warpgroup (the tile's owner): the tail page's rows past the work's end may hold NaN, and
// pages not loaded keep an earlier tile's bytes, so P = 0 never meets them (K there is masked in
// the softmax by select). The caller fences the stores to the async proxy and syncs the
// warpgroup.
template <class C>
__device__ __forceinline__ void zero_v_tail_wg(uint8_t* smem, int stage, int valid) {
  static_assert(C::kSwizzled, "TMA stages only (cp.async zero-fills the tail)");
  uint8_t* base = smem + C::kOffKv + stage * C::kStageBytes;
  const int chunks = (C::BN - valid) * (kVDim * 2 / 16);
  for (int i = threadIdx.x & 127; i < chunks; i += 128) {
    const int row = valid + (i >> 6), c = i & 63;   // 16-byte chunk c of the row's 1 KB of V
    constexpr int kPer = C::kSwBytes / 16;
    *reinterpret_cast<uint4*>(base + (c / kPer) * (C::BN * C::kSwBytes) + row * C::kSwBytes + (c % kPer) * 16) =
        make_uint4(0, 0, 0, 0);
  }
}

// Zeroes the P tile (the "tile -1" warpgroup 0 adds first) with the 256 consumer threads; the
// caller fences and syncs.
template <class C>
__device__ __forceinline__ void zero_p(uint8_t* smem) {
  for (int i = threadIdx.x; i < C::kPBytes / 16; i += kThreads)
    reinterpret_cast<uint4*>(smem + C::kOffP)[i] = make_uint4(0, 0, 0, 0);
}

}  // namespace alt
}  // namespace mla
