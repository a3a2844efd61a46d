// CPU emulator of the AMD decode kernel (templates/mla_decode_amd.cu.j2), for machines without
// an AMD GPU: the rendered template's decode_workgroup runs with one std::thread per lane, and
// the wave64 primitives it calls (templates/common/mla_amd_wave.cuh on the device) are defined
// here: the fp8 MFMA from the ISA's lane layouts, the fp32 -> fp8 pack, ds_bpermute and the
// workgroup barrier. LDS and global memory are plain host memory. The kernel code under test
// is the text clang compiles for gfx942; only the wave:: primitives differ.
//
// What this cannot show (docs/DESIGN.md §10.3): timing, hardware hazards (MFMA result latency,
// LDS / VMEM wait counts: C++ memory order stands in for s_waitcnt), register pressure or spills,
// the compiler's AMDGPU code generation (the host compiler compiles the kernel text), the MFMA's
// internal accumulation order and precision (modelled: exact products summed in fp32 in k
// order), and v_cvt_pk_fp8_f32 beyond what its model below says.
//
// Build: g++ -std=c++17 -O1 -pthread -shared -fPIC -DAMD_RENDERED='"<rendered .cu>"' this.cpp
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "host_emu_barrier.h"

#define AITER_MLA_HOST_EMU 1
#define AMD_MLA_DEVICE inline
// What the kernel text shares with sm_90a (aiter_mla_errors.cuh, mla_decode_checks.inc.j2) is
// written with CUDA / HIP qualifiers and device functions: their host meanings.
#define __device__
#define __forceinline__ inline
template <class T>
inline T __ldg(const T* p) { return *p; }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned atomicCAS(unsigned* address, unsigned compare, unsigned val) {
  __atomic_compare_exchange_n(address, &compare, val, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return compare;
}
inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

struct float4 {
  float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
struct uint2 {
  uint32_t x, y;
};

namespace emu {

constexpr int kWave = 64;

// One workgroup: its barrier, one barrier per wave and the lanes' exchange slots.
struct Group {
  explicit Group(int nthreads) : block(nthreads), a(nthreads), b(nthreads), u(nthreads) {
    for (int w = 0; w < nthreads / kWave; ++w) waves.emplace_back(new Barrier(kWave));
  }
  ~Group() {
    for (auto* w : waves) delete w;
  }
  Barrier block;
  std::vector<Barrier*> waves;
  std::vector<uint64_t> a, b;   // MFMA operands, one per thread
  std::vector<uint32_t> u;      // permute values
};

Group* grp = nullptr;
thread_local int tid = 0;
bool fnuz = true;   // the target's fp8 encoding (the kernel's kFp8Fnuz)
int mutation = 0;   // 1: lanes 0 and 1 of the A operand's layout swapped (the mutation test)

inline Barrier& wave_barrier() { return *grp->waves[tid / kWave]; }
inline int wave_base() { return tid / kWave * kWave; }

// ---- fp8 e4m3 codes (the ISA's data formats): fnuz bias 8, 0x80 NaN, no -0, max 240;
// OCP fn bias 7, S.1111.111 NaN, max 448. No infinities in either.
inline float fp8_to_float(uint8_t v, bool is_fnuz) {
  const int bias = is_fnuz ? 8 : 7;
  const int e = (v >> 3) & 0xF, m = v & 7;
  if (is_fnuz ? v == 0x80 : (v & 0x7F) == 0x7F) return NAN;
  const float mag = e == 0 ? std::ldexp(static_cast<float>(m), 1 - bias - 3)
                           : std::ldexp(1.f + m / 8.f, e - bias);
  return (v & 0x80) ? -mag : mag;
}

// Round to nearest even onto the e4m3 grid (v_cvt_pk_fp8_f32 with its clamp bit clear, as the
// builtin issues it). Past the largest finite value after rounding: NaN for e4m3fnuz (gfx942),
// saturation to +-448 for e4m3fn (gfx950): modelled on torch's float8_e4m3fnuz / _fn
// conversions, which the tests compare against; not checked on hardware (the kernel converts
// only P in [0, 1]). fnuz has no -0: a negative value that rounds to 0 gives +0.
inline uint8_t float_to_fp8(float x, bool is_fnuz) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(x)) return is_fnuz ? 0x80 : 0x7F;
  const uint8_t overflow = is_fnuz ? 0x80 : static_cast<uint8_t>(0x7E | sign);
  if (std::isinf(x)) return overflow;
  const int bias = is_fnuz ? 8 : 7;
  const float a = std::fabs(x);
  const int emin = 1 - bias;   // exponent of the smallest normal
  int e = a == 0.f ? emin : std::ilogb(a);
  if (e < emin) e = emin;
  // a = q * 2^(e - 3) with q in [8, 16) (normal) or [0, 8) (subnormal); round q to an integer.
  int q = static_cast<int>(std::nearbyint(std::ldexp(a, 3 - e)));
  if (q == 16) {
    q = 8;
    ++e;
  }
  uint8_t code;
  if (q < 8) {
    code = static_cast<uint8_t>(q);   // subnormal (or zero)
  } else {
    const int biased = e + bias;
    if (biased > 15) return overflow;
    code = static_cast<uint8_t>((biased << 3) | (q - 8));
    if (!is_fnuz && code == 0x7F) return overflow;   // S.1111.111 is fn's NaN
  }
  if (code == 0 && is_fnuz) return 0;
  return static_cast<uint8_t>(code | sign);
}

// ---- V_MFMA_F32_16X16X32_FP8_FP8 lane layouts, as the CDNA3 ISA tables them (see
// templates/common/mla_amd_wave.cuh): lane and byte holding A[i][k], B[k][j]; the lane and
// element holding D[i][j].
inline int a_lane(int i, int k) {
  const int lane = i + 16 * (k / 8);
  return mutation == 1 && lane < 2 ? lane ^ 1 : lane;
}
inline int b_lane(int k, int j) { return j + 16 * (k / 8); }
inline int d_row(int lane, int g) { return 4 * (lane / 16) + g; }
inline int d_col(int lane) { return lane % 16; }

inline uint8_t byte_of(uint64_t v, int b) { return static_cast<uint8_t>(v >> (8 * b)); }

}  // namespace emu

namespace wave {

struct f32x4 {
  float v[4];
  float& operator[](int i) { return v[i]; }
  const float& operator[](int i) const { return v[i]; }
  f32x4& operator*=(float s) {
    for (float& x : v) x *= s;
    return *this;
  }
};

inline int lane_id() { return emu::tid % emu::kWave; }

// Every lane posts its operands; each lane then computes its four D elements from the others'.
inline f32x4 mfma_16x16x32_fp8(uint64_t a, uint64_t b, f32x4 c) {
  emu::grp->a[emu::tid] = a;
  emu::grp->b[emu::tid] = b;
  emu::wave_barrier().wait();
  const int base = emu::wave_base(), lane = lane_id();
  f32x4 d = c;
  for (int g = 0; g < 4; ++g) {
    const int i = emu::d_row(lane, g), j = emu::d_col(lane);
    float sum = 0.f;
    for (int k = 0; k < 32; ++k) {
      const float x = emu::fp8_to_float(emu::byte_of(emu::grp->a[base + emu::a_lane(i, k)], k % 8), emu::fnuz);
      const float y = emu::fp8_to_float(emu::byte_of(emu::grp->b[base + emu::b_lane(k, j)], k % 8), emu::fnuz);
      sum += x * y;   // fp8 x fp8 is exact in fp32
    }
    d[g] = c[g] + sum;
  }
  emu::wave_barrier().wait();   // the slots are free again
  return d;
}

inline uint32_t pack_fp8x4(float x, float y, float z, float w) {
  return static_cast<uint32_t>(emu::float_to_fp8(x, emu::fnuz)) | static_cast<uint32_t>(emu::float_to_fp8(y, emu::fnuz)) << 8 |
         static_cast<uint32_t>(emu::float_to_fp8(z, emu::fnuz)) << 16 | static_cast<uint32_t>(emu::float_to_fp8(w, emu::fnuz)) << 24;
}

inline uint32_t permute(uint32_t v, int src) {
  emu::grp->u[emu::tid] = v;
  emu::wave_barrier().wait();
  const uint32_t r = emu::grp->u[emu::wave_base() + (src & (emu::kWave - 1))];
  emu::wave_barrier().wait();
  return r;
}
inline float permute(float v, int src) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  u = permute(u, src);
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}

inline void barrier() { emu::grp->block.wait(); }

}  // namespace wave

#include AMD_RENDERED

namespace {

// Runs fn(tid) on nthreads threads, one emulated workgroup.
template <class Fn>
void run_group(int nthreads, Fn fn) {
  emu::Group group(nthreads);
  emu::grp = &group;
  std::vector<std::thread> threads;
  threads.reserve(nthreads);
  for (int t = 0; t < nthreads; ++t)
    threads.emplace_back([t, &fn] {
      emu::tid = t;
      fn(t);
    });
  for (auto& th : threads) th.join();
  emu::grp = nullptr;
}

}  // namespace

// Decode as aiter_mla_decode launches it, host pointers: the same DecodeArgs (the Python side
// packs it with aiter_mla.ops.decode.SIGNATURE, as the op does), checked and turned into the
// kernel's Params by the kernel text's own args_valid / params_from; workgroups 0 .. grid_x - 1
// run one after another (they share nothing). Returns 0, or 1 for arguments the entry point
// refuses.
extern "C" int emu_decode(const DecodeArgs* a, const void* q, void* out, void* final_lse, void* split_out,
                          void* split_lse, int mutation) {
  if (a == nullptr || !amd_mla::args_valid(*a) || a->num_clusters < 1) return 1;
  const amd_mla::Params p = amd_mla::params_from(*a, q, out, final_lse, split_out, split_lse);
  const int grid_x = a->grid_x;
  emu::fnuz = amd_mla::kFp8Fnuz;
  emu::mutation = mutation;
  std::vector<uint64_t> lds((amd_mla::kLdsBytes + 7) / 8);
  for (int block = 0; block < grid_x; ++block)
    run_group(amd_mla::kThreads, [&](int t) {
      amd_mla::decode_workgroup(p, reinterpret_cast<uint8_t*>(lds.data()), block, grid_x, t);
    });
  emu::mutation = 0;
  return 0;
}

// One emulated MFMA on one wave: a [16][32] and b [32][16] fp8 codes, c [16][16] floats, all
// row-major, placed into the lanes by the layout above; d [16][16] read back by it.
extern "C" void emu_mfma(const uint8_t* a, const uint8_t* b, const float* c, float* d, int is_fnuz, int mutation) {
  emu::fnuz = is_fnuz != 0;
  emu::mutation = 0;   // the operands are placed by the ISA layout; the mutation acts inside
  std::vector<uint64_t> la(emu::kWave, 0), lb(emu::kWave, 0);
  for (int i = 0; i < 16; ++i)
    for (int k = 0; k < 32; ++k) la[emu::a_lane(i, k)] |= static_cast<uint64_t>(a[i * 32 + k]) << (8 * (k % 8));
  for (int k = 0; k < 32; ++k)
    for (int j = 0; j < 16; ++j) lb[emu::b_lane(k, j)] |= static_cast<uint64_t>(b[k * 16 + j]) << (8 * (k % 8));
  emu::mutation = mutation;
  run_group(emu::kWave, [&](int t) {
    wave::f32x4 acc;
    for (int g = 0; g < 4; ++g) acc[g] = c[emu::d_row(t, g) * 16 + emu::d_col(t)];
    acc = wave::mfma_16x16x32_fp8(la[t], lb[t], acc);
    for (int g = 0; g < 4; ++g) d[emu::d_row(t, g) * 16 + emu::d_col(t)] = acc[g];
  });
  emu::mutation = 0;
}

// sizeof(DecodeArgs), checked against the Python side's struct as the op's loader checks it.
extern "C" long long emu_decode_args_bytes() { return static_cast<long long>(sizeof(DecodeArgs)); }

// The conversions above, for their own tests: fp32 -> fp8 code, fp8 code -> fp32.
extern "C" int emu_float_to_fp8(float x, int is_fnuz) { return emu::float_to_fp8(x, is_fnuz != 0); }
extern "C" float emu_fp8_to_float(int v, int is_fnuz) { return emu::fp8_to_float(static_cast<uint8_t>(v), is_fnuz != 0); }
