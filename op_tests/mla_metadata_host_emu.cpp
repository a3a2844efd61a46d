// CPU emulator of the one-CTA metadata kernel (templates/mla_metadata.cu.j2), for machines
// without a GPU: the rendered template's md_run runs with one std::thread per CUDA thread;
// __syncthreads and warp shuffles are emulated with barriers. The kernel code under
// test is the same text nvcc compiles; only the MD_* primitives differ.
//
// Build: g++ -std=c++17 -O1 -pthread -shared -fPIC -DMD_RENDERED='"<rendered .cu>"' [-DEMU_WARP=64] this.cpp
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "host_emu_barrier.h"

#define AITER_MLA_HOST_EMU 1

namespace emu {

// The warp width: 32 as on NVIDIA; -DEMU_WARP=64 emulates AMD's 64-lane wave.
#ifndef EMU_WARP
#define EMU_WARP 32
#endif
constexpr int kWarp = EMU_WARP;

struct Block {
  explicit Block(int nthreads) : nthreads(nthreads), block(nthreads), slots(nthreads) {
    for (int w = 0; w < nthreads / kWarp; ++w) warps.emplace_back(new Barrier(kWarp));
  }
  ~Block() {
    for (auto* b : warps) delete b;
  }
  int nthreads;
  Barrier block;
  std::vector<Barrier*> warps;
  std::vector<int64_t> slots;  // one exchange slot per thread
};

Block* blk = nullptr;
thread_local int tid = 0;

inline void sync_block() { blk->block.wait(); }

// __syncthreads_count: the number of threads whose pred is non-zero, returned to all.
inline int sync_count(int pred) {
  blk->slots[tid] = pred != 0;
  blk->block.wait();
  int n = 0;
  for (int i = 0; i < blk->nthreads; ++i) n += (int)blk->slots[i];
  blk->block.wait();
  return n;
}

template <class T>
inline T shfl_up(T v, int d) {
  const int w = tid / kWarp, lane = tid % kWarp;
  blk->slots[tid] = (int64_t)v;
  blk->warps[w]->wait();
  const T r = lane >= d ? (T)blk->slots[w * kWarp + lane - d] : v;
  blk->warps[w]->wait();
  return r;
}

template <class T>
inline T shfl_idx(T v, int src) {
  const int w = tid / kWarp;
  blk->slots[tid] = (int64_t)v;
  blk->warps[w]->wait();
  const T r = (T)blk->slots[w * kWarp + src % kWarp];
  blk->warps[w]->wait();
  return r;
}

// __any_sync over the thread's warp.
inline bool warp_any(bool pred) {
  const int w = tid / kWarp;
  blk->slots[tid] = pred;
  blk->warps[w]->wait();
  bool any = false;
  for (int i = 0; i < kWarp; ++i) any = any || blk->slots[w * kWarp + i] != 0;
  blk->warps[w]->wait();
  return any;
}

inline void sync_warp() { blk->warps[tid / kWarp]->wait(); }

// The one-warp body's choice in the last run: 1 its 32-bit path, 2 the tiled body, 0 neither.
int last_path = 0;

bool force_tiled = false;  // run the tiled body md_body whatever md_run would pick

}  // namespace emu

#define MD_DEVICE inline
#define MD_HOSTDEV inline
#define MD_WARP EMU_WARP
#define MD_TID (emu::tid)
#define MD_NTHREADS (emu::blk->nthreads)
#define MD_SYNC() emu::sync_block()
#define MD_SYNC_COUNT(pred) emu::sync_count(pred)
#define MD_SHFL_UP(v, d) emu::shfl_up((v), (d))
#define MD_SHFL_IDX(v, src) emu::shfl_idx((v), (src))
#define MD_WARP_ANY(pred) emu::warp_any(pred)
#define MD_SYNC_WARP() emu::sync_warp()
#define MD_FFS(m) __builtin_ffsll((long long)(m))
#define MD_LDCG(ptr) (*(ptr))
#define MD_ROLLED  // (g++ has no unroll pragma of that spelling)
#define MD_STORE16(ptr, a, b, c, d) ((ptr)[0] = (a), (ptr)[1] = (b), (ptr)[2] = (c), (ptr)[3] = (d))
#define MD_NOTE_PATH(fast) (emu::tid == 0 ? (void)(emu::last_path = (fast) ? 1 : 2) : (void)0)

#include MD_RENDERED

// Same arguments as aiter_mla_get_metadata_v1, host pointers, plus the emulated block size
// (a multiple of the warp width, <= 1024), split_heavy_tiles before it. Returns 0, or 1 for invalid arguments.
extern "C" int emu_get_metadata_v1(
    const void* qo_indptr, const void* kv_indptr, const void* kv_last_page_lens,
    void* work_metadata_ptrs, void* work_indptr, void* work_info_set, void* reduce_indptr,
    void* reduce_final_map, void* reduce_partial_map, int64_t cap_work_indptr,
    int64_t cap_works, int64_t cap_reduce_indptr, int64_t cap_final_map,
    int64_t cap_partial_map, int num_batches, int num_clusters, int num_splits, int page_size,
    int kv_granularity, int overhead, int tail_threshold, void* split_heavy_tiles, int nthreads) {
  if (nthreads < emu::kWarp || nthreads % emu::kWarp || nthreads > 1024) return 1;
  const bool tiled = emu::force_tiled;
  // the shared memory
  std::vector<int64_t> ws(((tiled ? md_workspace_bytes(nthreads)
                                  : md_run_workspace_bytes(num_batches, nthreads)) + 7) / 8);
  MdParams p;
  p.qo_indptr = (const int32_t*)qo_indptr;
  p.kv_indptr = (const int32_t*)kv_indptr;
  p.kv_last_page_lens = (const int32_t*)kv_last_page_lens;
  p.work_metadata_ptrs = (uint64_t*)work_metadata_ptrs;
  p.work_indptr = (int32_t*)work_indptr;
  p.work_info_set = (int32_t*)work_info_set;
  p.reduce_indptr = (int32_t*)reduce_indptr;
  p.reduce_final_map = (int32_t*)reduce_final_map;
  p.reduce_partial_map = (int32_t*)reduce_partial_map;
  p.cap_work_indptr = cap_work_indptr;
  p.cap_works = cap_works;
  p.cap_reduce_indptr = cap_reduce_indptr;
  p.cap_final_map = cap_final_map;
  p.cap_partial_map = cap_partial_map;
  p.num_batches = num_batches;
  p.num_clusters = num_clusters;
  p.num_splits = num_splits;
  p.page_size = page_size;
  p.kv_granularity = kv_granularity;
  p.overhead = overhead;
  p.tail_threshold = tail_threshold;
  p.split_heavy_tiles = (volatile int32_t*)split_heavy_tiles;
  emu::last_path = 0;
  emu::Block block(nthreads);
  emu::blk = &block;
  std::vector<std::thread> threads;
  for (int t = 0; t < nthreads; ++t)
    threads.emplace_back([t, &p, &ws, tiled] {
      emu::tid = t;
      if (tiled) md_body(p, (unsigned char*)ws.data());
      else md_run(p, (unsigned char*)ws.data());
    });
  for (auto& th : threads) th.join();
  emu::blk = nullptr;
  return 0;
}

// Whether md_run takes the one-warp path (md_body_lanes) for this batch count and block size.
extern "C" int emu_lanes_apply(int64_t num_batches, int nthreads) {
  return md_lanes_apply(num_batches, nthreads) ? 1 : 0;
}

// The block size the device launch uses for num_batches.
extern "C" int emu_launch_threads(int64_t num_batches) { return md_launch_threads(num_batches); }

// 1: later calls run the tiled body (md_body) even where the device would take the one-warp path.
extern "C" void emu_force_tiled(int on) { emu::force_tiled = on != 0; }

extern "C" int emu_warp() { return emu::kWarp; }

extern "C" int emu_lanes_max() { return MD_LANES_MAX; }

// 1: md_body_lanes's 32-bit path ran in the last emu_get_metadata_v1 call, 2: it handed the
// inputs to the tiled body, 0: md_body_lanes did not run.
extern "C" int emu_last_path() { return emu::last_path; }
