"""Device ceilings measured in the same run as the rows they bound (docs/DESIGN.md §6.2).

- copy bandwidth: a 2 GiB device-to-device copy, bytes read + written per second;
- bf16 GEMM: ``torch.matmul`` of random 8192 x 8192 bf16 matrices;
- fp8 GEMM: ``torch._scaled_mm`` of random 8192 x 8192 e4m3 matrices (B column-major, as
  cuBLASLt needs; per-tensor scales 1), bf16 out.

Each is the median of ``reps`` CUDA-event timings after a warm-up. Random data, not zeros: a
GEMM on zeros draws less power and clocks higher than one on real data.
"""
from __future__ import annotations

from .timing import time_repeated

COPY_BYTES = 2 << 30
GEMM_N = 8192


def copy_tbps(nbytes: int = COPY_BYTES, reps: int = 20) -> float:
    """Device-to-device copy bandwidth in TB/s (1e12 B/s), counting read + written bytes."""
    import torch

    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = time_repeated(lambda: dst.copy_(src), reps=reps)
    del src, dst
    return 2 * nbytes / (ms * 1e-3) / 1e12


def bf16_tflops(n: int = GEMM_N, reps: int = 20) -> float:
    """Dense bf16 GEMM rate in TFLOPS: ``2 n^3`` per ``torch.matmul`` of n x n matrices."""
    import torch

    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    ms = time_repeated(lambda: torch.matmul(a, b, out=out), reps=reps)
    return 2 * n ** 3 / (ms * 1e-3) / 1e12


def fp8_tflops(n: int = GEMM_N, reps: int = 20) -> float:
    """Dense fp8 e4m3 GEMM rate in TFLOPS through ``torch._scaled_mm`` (bf16 out, scales 1)."""
    import torch

    a = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
    # _scaled_mm wants B column-major: build it [N, K] row-major and pass the transpose.
    b = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn).t()
    one = torch.ones((), device="cuda", dtype=torch.float32)
    ms = time_repeated(
        lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
        reps=reps)
    return 2 * n ** 3 / (ms * 1e-3) / 1e12


def measure(reps: int = 20) -> dict:
    """``{"copy_TBps", "bf16_TFLOPS", "fp8_TFLOPS"}`` measured now on the current GPU."""
    import torch

    result = {"copy_TBps": copy_tbps(reps=reps), "bf16_TFLOPS": bf16_tflops(reps=reps),
              "fp8_TFLOPS": fp8_tflops(reps=reps)}
    torch.cuda.empty_cache()
    return result
