// Shared by every aiter_mla kernel module: the C ABI conventions of a built variant.
//
// Every module is a host shared library with extern "C" entry points that launch on the
// caller's stream and return a cudaError_t as int (0 = success). Python (ctypes) checks the
// return value and turns it into an exception with aiter_mla_error_string().
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

#define AITER_MLA_EXPORT extern "C" __attribute__((visibility("default")))

// Why this exists: our .so links its own static cudart, so a launch must select the device
// the caller's tensors live on (the current device of torch's runtime is not ours).
static inline cudaError_t aiter_mla_select_device(int device) {
  int cur = -1;
  cudaError_t err = cudaGetDevice(&cur);
  if (err != cudaSuccess) return err;
  if (cur != device) return cudaSetDevice(device);
  return cudaSuccess;
}

AITER_MLA_EXPORT const char* aiter_mla_error_string(int err) {
  return cudaGetErrorString(static_cast<cudaError_t>(err));
}
