// Device-side input checks: the first bad value a kernel meets is written to a host error
// record (pinned memory, read by the Python op at its next call without a sync: ops/errors.py),
// and the kernel goes on with a safe value (a page clamped or zero-filled, a work skipped). Codes: the
// ERR_<NAME> template globals (work_info.DEVICE_ERRORS).
#pragma once
#include <stdint.h>

namespace mla {

// Two slots: 0 for the inputs' own values (the batch layout, the page ids), 1 for the
// schedule's records, whose errors usually follow from a bad layout; the host reports slot 0
// first, so the message names the root cause.
struct ErrorSink {
  unsigned int* claim;           // [2] device words: 0 until a thread claims the slot
  volatile long long* record;    // [2][4] host (mapped) words per slot: code, index, value, bound
  int first_schedule_code;       // codes >= this one go to slot 1
};

// The claim makes one thread the writer of a slot, which fills the details, fences them to the
// system and writes the code last: a host that sees a code sees its details. Inlined: a call
// would make every caller save its live registers around it (spills).
__device__ __forceinline__ void report_error(const ErrorSink& sink, int code, long long index, long long value,
                                             long long bound) {
  const int slot = code >= sink.first_schedule_code ? 1 : 0;
  if (sink.claim == nullptr || atomicCAS(sink.claim + slot, 0u, 1u) != 0u) return;
  volatile long long* r = sink.record + 4 * slot;
  r[1] = index;
  r[2] = value;
  r[3] = bound;
  __threadfence_system();
  r[0] = code;
  __threadfence_system();
}

}  // namespace mla
