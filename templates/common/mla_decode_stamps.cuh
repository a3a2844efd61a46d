// Per-phase clock stamps of the decode loops, compiled in only with -DAITER_MLA_PHASE_STAMPS
// (passed through AITER_MLA_EXTRA_NVCC_FLAGS, which enters the cache key, so stamped and plain
// builds are separate entries). Without the flag every macro below is empty and the kernel is
// the plain one.
//
// One thread per role records: thread 0 (consumer warpgroup 0), thread 128 (warpgroup 1) and
// thread 256 (lane 0 of the producer warp 8; warpgroup_works' second producer warp, for ring 1,
// is not recorded). AITER_MLA_STAMP(phase) adds the SM clocks since that thread's previous
// stamp to `phase` (the phase that just ended), in shared memory at the end of the dynamic
// block (the launch adds AITER_MLA_STAMP_SMEM_BYTES; static __shared__ arrays would sit in
// front of the tile and move it off the 512-byte alignment the TMA swizzle reads rely on);
// AITER_MLA_STAMP_TILES(n) counts the KV tiles the role worked on; AITER_MLA_STAMP_END() adds
// the CTA's sums into aiter_mla_decode_stamps' array [slot][role][phase], slot = the CTA's
// linear index (CTAs past kSlots are not recorded), with the tile count as the last field.
// scripts/phase_budget.py reads them (aiter_mla_decode_stamps) and prints a per-tile budget.
//
// The timeline: thread 0 also reads the global timer (ns, one clock for every SM) at its entry,
// the end of the PDL wait, the end of its first work's set-up, the start and end of its last
// epilogue and its exit, and stores them per call in aiter_mla_decode_timeline's array
// [slot][call][mark] (the first kLineCalls launches since the last reset; the call index is
// counted per slot, so it lines the slots up only while every launch has the same grid, as in
// phase_budget.py's one case at a time), so that a call's
// fixed part can be placed: the previous grid's end to this one's release, the fill, the spread
// of the lists' ends, the epilogue.
#pragma once

#ifdef AITER_MLA_PHASE_STAMPS
namespace mla {
namespace stamps {

constexpr int kSlots = 1024;
constexpr int kRoles = 3;   // consumer warpgroup 0, consumer warpgroup 1, the producer warp
enum Phase : int {
  kPdlWait,       // kernel entry to the end of the PDL wait
  kWork,          // a work's set-up: its record, its Q (the first work's: the pipeline's fill)
  kKvWait,        // waiting for a KV stage to land (consumers)
  kQk,            // S = Q K^T, promoted
  kSoftmax,       // masking, row max (exchange included), P written
  kPv,            // V^T fragments, O rescale, P V and its wait
  kProduceWait,   // the producer waiting for a free stage (or for the consumers' first Q)
  kProduceIssue,  // the producer's page lookups and copy issue
  kHandover,      // waiting for the other warpgroup's hand-over (alternating)
  kEpilogue,      // a work's epilogue: output, LSE, the split merge's arrival
  kPhases
};
constexpr const char* kNames = "pdl_wait,work,kv_wait,qk,softmax,pv,produce_wait,produce_issue,handover,epilogue";

enum Mark : int { kEntry, kWaited, kFirstWork, kEpiStart, kEpiEnd, kExit, kMarks };
constexpr const char* kMarkNames = "entry,waited,first_work,last_epilogue_start,last_epilogue_end,exit";
constexpr int kLineCalls = 64;

// the phases, the tile count, the last stamp's clock; thread 0 also: the marks and the last
// stamp's global time
constexpr int kFields = kPhases + 2 + kMarks + 1;
constexpr int kSmemBytes = (kRoles * kFields * 8 + 127) / 128 * 128;

__device__ unsigned long long g_sums[kSlots][kRoles][kPhases + 1];
__device__ unsigned long long g_line[kSlots][kLineCalls][kMarks];
__device__ unsigned int g_line_calls[kSlots];

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}
extern __shared__ __align__(128) uint8_t aiter_mla_stamp_smem[];   // the kernel's dynamic block

__device__ __forceinline__ bool recorder() { return (threadIdx.x & 127) == 0 && threadIdx.x <= 256; }
// This thread's role's fields [kFields] in the last kSmemBytes of the dynamic block.
__device__ __forceinline__ unsigned long long* fields() {
  uint32_t size;
  asm("mov.u32 %0, %%dynamic_smem_size;\n" : "=r"(size));
  return reinterpret_cast<unsigned long long*>(aiter_mla_stamp_smem + size - kSmemBytes) + (threadIdx.x >> 7) * kFields;
}

__device__ __forceinline__ void begin() {
  if (recorder()) {
    unsigned long long* f = fields();
    for (int k = 0; k < kFields; ++k) f[k] = 0;
    f[kPhases + 1] = clock64();
    if (threadIdx.x == 0) f[kPhases + 2 + kEntry] = f[kPhases + 2 + kMarks] = global_ns();
  }
}
__device__ __forceinline__ void mark(Phase phase) {
  if (recorder()) {
    unsigned long long* f = fields();
    const unsigned long long now = clock64();
    f[phase] += now - f[kPhases + 1];
    f[kPhases + 1] = now;
    if (threadIdx.x == 0) {
      unsigned long long* m = f + kPhases + 2;
      const unsigned long long t = global_ns();
      if (phase == kPdlWait) m[kWaited] = t;
      if (phase == kWork && m[kFirstWork] == 0) m[kFirstWork] = t;
      if (phase == kEpilogue) {
        m[kEpiStart] = m[kMarks];
        m[kEpiEnd] = t;
      }
      m[kMarks] = t;
    }
  }
}
__device__ __forceinline__ void tiles(int n) {
  if (recorder()) fields()[kPhases] += n;
}
__device__ __forceinline__ void end() {
  const int slot = blockIdx.y * gridDim.x + blockIdx.x;
  if (recorder() && slot < kSlots) {
    const unsigned long long* f = fields();
    for (int k = 0; k <= kPhases; ++k) g_sums[slot][threadIdx.x >> 7][k] += f[k];
    if (threadIdx.x == 0) {
      const unsigned int n = g_line_calls[slot];
      if (n < kLineCalls) {
        for (int k = 0; k < kExit; ++k) g_line[slot][n][k] = f[kPhases + 2 + k];
        g_line[slot][n][kExit] = global_ns();
      }
      g_line_calls[slot] = n + 1;
    }
  }
}

}  // namespace stamps
}  // namespace mla
#define AITER_MLA_STAMP_SMEM_BYTES mla::stamps::kSmemBytes
#define AITER_MLA_STAMP_BEGIN() mla::stamps::begin()
#define AITER_MLA_STAMP(phase) mla::stamps::mark(mla::stamps::phase)
#define AITER_MLA_STAMP_TILES(n) mla::stamps::tiles(n)
#define AITER_MLA_STAMP_END() mla::stamps::end()
#else
#define AITER_MLA_STAMP_SMEM_BYTES 0
#define AITER_MLA_STAMP_BEGIN() ((void)0)
#define AITER_MLA_STAMP(phase) ((void)0)
#define AITER_MLA_STAMP_TILES(n) ((void)0)
#define AITER_MLA_STAMP_END() ((void)0)
#endif
