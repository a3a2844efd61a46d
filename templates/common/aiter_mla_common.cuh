// Shared by every aiter_mla kernel module: the C ABI conventions of a built variant.
//
// Every module is a host shared library with extern "C" entry points that launch on the
// caller's stream and return a cudaError_t as int (0 = success). Python (ctypes) checks the
// return value and turns it into an exception with aiter_mla_error_string().
//
// Three compile modes, picked by the toolchain (aiter_mla/jit/toolchain.py):
//   nvcc (sm_90a)                -> CUDA runtime, the code as written.
//   hipcc (gfx942/gfx950, ROCm)  -> HIP runtime; the CUDA runtime names used by templates
//                                   are mapped to HIP below (untested here: no ROCm machine).
//   clang -x hip -nogpuinc, with AITER_MLA_HIP_DEVICE_ONLY (gfx942 compile check, no ROCm)
//                                -> no HIP headers exist: this file supplies the few
//                                   qualifiers, built-in variables, vector types, warp
//                                   functions and runtime declarations templates use. Host
//                                   code is parsed and type-checked but not emitted.
#pragma once
#include <stdint.h>
#include <stddef.h>

#if defined(__HIP__) || defined(__HIPCC__)
#define AITER_MLA_AMD 1
#else
#define AITER_MLA_NVIDIA 1
#endif

#if defined(AITER_MLA_NVIDIA)
#include <cuda_runtime.h>

#elif !defined(AITER_MLA_HIP_DEVICE_ONLY)
#include <hip/hip_runtime.h>
typedef hipError_t cudaError_t;
typedef hipStream_t cudaStream_t;
#define cudaSuccess hipSuccess
#define cudaErrorInvalidValue hipErrorInvalidValue
#define cudaErrorInvalidConfiguration hipErrorInvalidConfiguration
#define cudaErrorInvalidDevice hipErrorInvalidDevice
#define cudaGetDevice hipGetDevice
#define cudaSetDevice hipSetDevice
#define cudaGetLastError hipGetLastError
#define cudaGetErrorString hipGetErrorString
#define cudaDeviceGetAttribute hipDeviceGetAttribute
#define cudaDevAttrMaxSharedMemoryPerBlockOptin hipDeviceAttributeSharedMemPerBlockOptin
#define cudaFuncSetAttribute hipFuncSetAttribute
#define cudaFuncAttributeMaxDynamicSharedMemorySize hipFuncAttributeMaxDynamicSharedMemorySize

#else  // AITER_MLA_HIP_DEVICE_ONLY: clang -x hip -nogpuinc -nogpulib --cuda-device-only
#include <math.h>
#define __host__ __attribute__((host))
#define __device__ __attribute__((device))
#define __global__ __attribute__((global))
#define __shared__ __attribute__((shared))
#define __constant__ __attribute__((constant))
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
// HIP's meaning of the thread bound (clang ignores CUDA's launch_bounds attribute on AMDGPU,
// which left every kernel compiled for 1024-thread workgroups and their register budget); the
// second argument (CUDA's minimum blocks per SM, which HIP maps to waves per EU) is not mapped.
#define AITER_MLA_FIRST_ARG(n, ...) n
#define __launch_bounds__(...) __attribute__((amdgpu_flat_work_group_size(1, AITER_MLA_FIRST_ARG(__VA_ARGS__, 0))))
#define __align__(n) __attribute__((aligned(n)))

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

// Built-in index variables as HIP defines them: properties read through amdgcn builtins.
#define AITER_MLA_BUILTIN_VAR(type_name, var, fx, fy, fz)                          \
  struct type_name {                                                               \
    __declspec(property(get = get_x)) unsigned x;                                  \
    __declspec(property(get = get_y)) unsigned y;                                  \
    __declspec(property(get = get_z)) unsigned z;                                  \
    static __device__ __forceinline__ unsigned get_x() { return fx; }              \
    static __device__ __forceinline__ unsigned get_y() { return fy; }              \
    static __device__ __forceinline__ unsigned get_z() { return fz; }              \
  };                                                                               \
  extern const __device__ __attribute__((weak)) type_name var;
AITER_MLA_BUILTIN_VAR(aiter_mla_thread_idx_t, threadIdx, __builtin_amdgcn_workitem_id_x(),
                      __builtin_amdgcn_workitem_id_y(), __builtin_amdgcn_workitem_id_z())
AITER_MLA_BUILTIN_VAR(aiter_mla_block_idx_t, blockIdx, __builtin_amdgcn_workgroup_id_x(),
                      __builtin_amdgcn_workgroup_id_y(), __builtin_amdgcn_workgroup_id_z())
AITER_MLA_BUILTIN_VAR(aiter_mla_block_dim_t, blockDim, __builtin_amdgcn_workgroup_size_x(),
                      __builtin_amdgcn_workgroup_size_y(), __builtin_amdgcn_workgroup_size_z())
AITER_MLA_BUILTIN_VAR(aiter_mla_grid_dim_t, gridDim,
                      __builtin_amdgcn_grid_size_x() / __builtin_amdgcn_workgroup_size_x(),
                      __builtin_amdgcn_grid_size_y() / __builtin_amdgcn_workgroup_size_y(),
                      __builtin_amdgcn_grid_size_z() / __builtin_amdgcn_workgroup_size_z())
#undef AITER_MLA_BUILTIN_VAR
#if defined(__AMDGCN_WAVEFRONT_SIZE__)
static constexpr int warpSize = __AMDGCN_WAVEFRONT_SIZE__;
#else
static constexpr int warpSize = 64;   // clang 22 dropped the macro; gfx942 / gfx950 run wave64
#endif

__device__ __forceinline__ void __syncthreads() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}
// HIP's __syncthreads_count (a workgroup reduction in the device libraries, which this mode does
// not link): a barrier that returns how many threads passed a non-zero predicate, counted in
// one shared int. The first barrier keeps a reset from racing the previous call's reads.
__device__ __forceinline__ int __syncthreads_count(int predicate) {
  __shared__ int aiter_mla_sync_count;
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) aiter_mla_sync_count = 0;
  __syncthreads();
  if (predicate) __hip_atomic_fetch_add(&aiter_mla_sync_count, 1, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_WORKGROUP);
  __syncthreads();
  return aiter_mla_sync_count;
}
__device__ __forceinline__ void __threadfence() { __builtin_amdgcn_fence(__ATOMIC_SEQ_CST, "agent"); }
__device__ __forceinline__ void __threadfence_block() {
  __builtin_amdgcn_fence(__ATOMIC_SEQ_CST, "workgroup");
}
__device__ __forceinline__ void __threadfence_system() { __builtin_amdgcn_fence(__ATOMIC_SEQ_CST, ""); }
// HIP's atomicCAS: the old value (the exchange writes it into `compare` when it fails).
__device__ __forceinline__ unsigned atomicCAS(unsigned* address, unsigned compare, unsigned val) {
  __hip_atomic_compare_exchange_strong(address, &compare, val, __ATOMIC_RELAXED, __ATOMIC_RELAXED,
                                       __HIP_MEMORY_SCOPE_AGENT);
  return compare;
}

// Vector types (plain aligned structs: enough to type-check and generate code).
#define AITER_MLA_VEC2(T, N) struct alignas(2 * sizeof(T)) N { T x, y; };
#define AITER_MLA_VEC4(T, N) struct alignas(4 * sizeof(T)) N { T x, y, z, w; };
AITER_MLA_VEC2(float, float2) AITER_MLA_VEC4(float, float4)
AITER_MLA_VEC2(int, int2) AITER_MLA_VEC4(int, int4)
AITER_MLA_VEC2(unsigned, uint2) AITER_MLA_VEC4(unsigned, uint4)
#undef AITER_MLA_VEC2
#undef AITER_MLA_VEC4
__host__ __device__ __forceinline__ float2 make_float2(float x, float y) { return {x, y}; }
__host__ __device__ __forceinline__ float4 make_float4(float x, float y, float z, float w) {
  return {x, y, z, w};
}

// Cross-lane operations (HIP's names and semantics; width defaults to the wavefront).
__device__ __forceinline__ int __shfl(int v, int src, int width = warpSize) {
  const int lane = __builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u));
  const int idx = (src & (width - 1)) + (lane & ~(width - 1));
  return __builtin_amdgcn_ds_bpermute(idx << 2, v);
}
__device__ __forceinline__ float __shfl(float v, int src, int width = warpSize) {
  return __builtin_bit_cast(float, __shfl(__builtin_bit_cast(int, v), src, width));
}
__device__ __forceinline__ int __shfl_xor(int v, int mask, int width = warpSize) {
  const int lane = __builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u));
  const int dst = lane ^ mask;
  const int idx = dst < ((lane + width) & ~(width - 1)) ? dst : lane;
  return __builtin_amdgcn_ds_bpermute(idx << 2, v);
}
__device__ __forceinline__ float __shfl_xor(float v, int mask, int width = warpSize) {
  return __builtin_bit_cast(float, __shfl_xor(__builtin_bit_cast(int, v), mask, width));
}
__device__ __forceinline__ int __shfl_up(int v, unsigned delta, int width = warpSize) {
  const int lane = __builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u));
  const int idx = (lane & (width - 1)) < (int)delta ? lane : lane - (int)delta;
  return __builtin_amdgcn_ds_bpermute(idx << 2, v);
}
__device__ __forceinline__ float __shfl_up(float v, unsigned delta, int width = warpSize) {
  return __builtin_bit_cast(float, __shfl_up(__builtin_bit_cast(int, v), delta, width));
}
// 64-bit and unsigned values move as two 32-bit halves (HIP declares the same overloads).
#define AITER_MLA_SHFL_WIDE(T)                                                         \
  __device__ __forceinline__ T __shfl(T v, int src, int width = warpSize) {            \
    const long long u = (long long)v;                                                  \
    const int lo = __shfl((int)(u & 0xffffffffll), src, width);                        \
    const int hi = __shfl((int)(u >> 32), src, width);                                 \
    return (T)(((long long)hi << 32) | (unsigned)lo);                                  \
  }                                                                                    \
  __device__ __forceinline__ T __shfl_xor(T v, int mask, int width = warpSize) {       \
    const long long u = (long long)v;                                                  \
    const int lo = __shfl_xor((int)(u & 0xffffffffll), mask, width);                   \
    const int hi = __shfl_xor((int)(u >> 32), mask, width);                            \
    return (T)(((long long)hi << 32) | (unsigned)lo);                                  \
  }                                                                                    \
  __device__ __forceinline__ T __shfl_up(T v, unsigned delta, int width = warpSize) {  \
    const long long u = (long long)v;                                                  \
    const int lo = __shfl_up((int)(u & 0xffffffffll), delta, width);                   \
    const int hi = __shfl_up((int)(u >> 32), delta, width);                            \
    return (T)(((long long)hi << 32) | (unsigned)lo);                                  \
  }
AITER_MLA_SHFL_WIDE(unsigned) AITER_MLA_SHFL_WIDE(long) AITER_MLA_SHFL_WIDE(unsigned long)
AITER_MLA_SHFL_WIDE(long long) AITER_MLA_SHFL_WIDE(unsigned long long)
#undef AITER_MLA_SHFL_WIDE
__device__ __forceinline__ unsigned long long __ballot(int p) {
  return __builtin_amdgcn_ballot_w64(p != 0);
}
__device__ __forceinline__ int __any(int p) { return __ballot(p) != 0; }
__device__ __forceinline__ int __all(int p) { return __ballot(!p) == 0; }

__device__ __forceinline__ int __ffs(int v) { return __builtin_ffs(v); }
__device__ __forceinline__ int __ffs(unsigned v) { return __builtin_ffs((int)v); }
__device__ __forceinline__ int __ffsll(long long v) { return __builtin_ffsll(v); }
__device__ __forceinline__ int __ffsll(unsigned long long v) { return __builtin_ffsll((long long)v); }
template <class T>
__device__ __forceinline__ T __ldg(const T* p) { return *p; }

// min/max overloads as HIP declares them (same-type arguments).
#define AITER_MLA_MINMAX(T)                                                        \
  static __device__ __forceinline__ T min(T a, T b) { return a < b ? a : b; }      \
  static __device__ __forceinline__ T max(T a, T b) { return a > b ? a : b; }
AITER_MLA_MINMAX(int) AITER_MLA_MINMAX(unsigned) AITER_MLA_MINMAX(long)
AITER_MLA_MINMAX(unsigned long) AITER_MLA_MINMAX(long long) AITER_MLA_MINMAX(unsigned long long)
#undef AITER_MLA_MINMAX
static __device__ __forceinline__ float min(float a, float b) { return __builtin_fminf(a, b); }
static __device__ __forceinline__ float max(float a, float b) { return __builtin_fmaxf(a, b); }

// Device math through LLVM intrinsics (no device libraries with -nogpulib).
static __device__ __forceinline__ float expf(float x) { return __builtin_expf(x); }
static __device__ __forceinline__ float exp2f(float x) { return __builtin_exp2f(x); }
static __device__ __forceinline__ float logf(float x) { return __builtin_logf(x); }
static __device__ __forceinline__ float log2f(float x) { return __builtin_log2f(x); }
static __device__ __forceinline__ float fmaxf(float a, float b) { return __builtin_fmaxf(a, b); }
static __device__ __forceinline__ float fminf(float a, float b) { return __builtin_fminf(a, b); }
static __device__ __forceinline__ float fabsf(float a) { return __builtin_fabsf(a); }
static __device__ __forceinline__ float fmaf(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
static __device__ __forceinline__ float __expf(float x) { return __builtin_expf(x); }
static __device__ __forceinline__ float __logf(float x) { return __builtin_logf(x); }

// Host runtime declarations: parsed, never emitted in a device-only compile.
typedef int cudaError_t;
typedef struct aiter_mla_stream* cudaStream_t;
enum { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorInvalidConfiguration = 9,
       cudaErrorInvalidDevice = 101 };
enum cudaDeviceAttr { cudaDevAttrMaxSharedMemoryPerBlockOptin = 97 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
extern "C" cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device);
template <class T>
cudaError_t cudaFuncSetAttribute(T* func, cudaFuncAttribute attr, int value);
extern "C" cudaError_t cudaGetDevice(int* device);
extern "C" cudaError_t cudaSetDevice(int device);
extern "C" cudaError_t cudaGetLastError(void);
extern "C" const char* cudaGetErrorString(cudaError_t err);
// What clang lowers `kernel<<<grid, block, smem, stream>>>(...)` to in HIP mode.
extern "C" int __hipPushCallConfiguration(dim3 grid, dim3 block, size_t smem, cudaStream_t s);
extern "C" int __hipPopCallConfiguration(dim3* grid, dim3* block, size_t* smem, cudaStream_t* s);
#endif

#include "aiter_mla_numeric.cuh"

#define AITER_MLA_EXPORT extern "C" __attribute__((visibility("default")))

// Every entry point calls this first. The runtime's last error is per host thread and sticks
// until read: an error an earlier call returned early with (a failed query, device switch or
// attribute set) would otherwise come back from this call's cudaGetLastError as this call's.
// (Errors that break the context stay sticky and still fail this call.)
static inline void aiter_mla_drop_stale_error() { (void)cudaGetLastError(); }

// Why this exists: our .so links its own static cudart, so a launch must select the device
// the caller's tensors live on (the current device of torch's runtime is not ours).
static inline cudaError_t aiter_mla_select_device(int device) {
  int cur = -1;
  cudaError_t err = cudaGetDevice(&cur);
  if (err != cudaSuccess) return err;
  if (cur != device) return cudaSetDevice(device);
  return cudaSuccess;
}

// Whether the host error record (ops/errors.py: `slots` slots of `slot_words` int64 words, the
// code first; pinned memory the kernels write) holds an error an earlier kernel found. An entry
// point asks before it launches anything and then returns LAUNCH_ERROR_PENDING (a template
// global), so the op raises that error before this call's work, without a sync. Null: no record.
static inline bool aiter_mla_error_pending(const void* record, int slots, int slot_words) {
  if (record == nullptr) return false;
  const volatile long long* words = static_cast<const volatile long long*>(record);
  for (int s = 0; s < slots; ++s)
    if (words[s * slot_words] != 0) return true;
  return false;
}

// ---- programmatic dependent launch (PDL, sm_90+) ------------------------------------------
// The metadata, decode and reduce kernels are launched with programmatic stream serialization:
// a kernel may start (CTA launch, barrier set-up) while the previous kernel in the stream is
// still finishing, and waits in aiter_mla_wait_prior_grid() for that kernel's completion and
// memory before it reads anything. Every CTA waits, even one with no work: a grid that
// completed without waiting would let the kernel after it overtake the one before it.
// aiter_mla_launch_dependents() lets the next kernel launch early. No-ops elsewhere (AMD, or
// a launch without the attribute: the wait then returns at once).
__device__ __forceinline__ void aiter_mla_wait_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void aiter_mla_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
// L2 prefetch of [base, base + bytes), spread over `nthreads` threads (this one is `tid`): a
// hint that reads no value, so it may precede aiter_mla_wait_prior_grid(). The upstream
// kernel's stores land in L2, the point of coherence, and nothing is cached nearer, so a line
// fetched early and written afterwards is read with its new value after the wait. What it
// saves is the DRAM latency of the first dependent loads after the wait (the schedule, the
// page table), which the KV streaming of the call before has evicted. The lines are counted
// from base rounded down to 128 bytes, so an unaligned span's last line is covered too; every
// line touched holds bytes of the span, so no address outside its allocation is prefetched.
__device__ __forceinline__ void aiter_mla_prefetch_l2(const void* base, long long bytes, int tid, int nthreads) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (bytes <= 0) return;
  const unsigned long long first = reinterpret_cast<unsigned long long>(base) & ~127ull;
  const unsigned long long end = reinterpret_cast<unsigned long long>(base) + static_cast<unsigned long long>(bytes);
  const int lines = static_cast<int>((end - first + 127) >> 7);
  for (int i = tid; i < lines; i += nthreads)
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(first + 128ull * i));
#else
  (void)base; (void)bytes; (void)tid; (void)nthreads;
#endif
}
#if defined(AITER_MLA_NVIDIA)
// kernel<<<grid, block, smem, stream>>>(args...) with the PDL attribute (CUDA graphs capture
// it as a programmatic edge).
template <typename... KArgs, typename... Args>
static inline cudaError_t aiter_mla_launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                               cudaStream_t stream, Args... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...);
}
#endif

AITER_MLA_EXPORT const char* aiter_mla_error_string(int err) {
  return cudaGetErrorString(static_cast<cudaError_t>(err));
}
