"""Device ceilings measured in the same run as the rows they bound (docs/DESIGN.md §6.2).

- read bandwidth: the ``read_bandwidth`` JIT kernel (templates/read_bandwidth.cu.j2) reading a
  2 GiB buffer, bytes read per second, the best of 2 to 5 CTAs per SM. Decode only reads
  its KV, and a decode kernel read faster (4.34 TB/s) than ``torch.sum`` over the same bytes
  (4.16) or the copy rate: this is the memory term of the floor (:mod:`.formulas`);
- copy bandwidth: a 2 GiB device-to-device copy, bytes read + written per second (kept for
  comparison with older results, whose floor it was);
- bf16 GEMM: ``torch.matmul`` of random 8192 x 8192 bf16 matrices;
- fp8 GEMM: ``torch._scaled_mm`` of random 8192 x 8192 e4m3 matrices (B column-major, as
  cuBLASLt needs; per-tensor scales 1), bf16 out.

Each is the median of ``reps`` CUDA-event timings after a warm-up. Random data, not zeros: a
GEMM on zeros draws less power and clocks higher than one on real data.
"""
from __future__ import annotations

from .timing import time_repeated

COPY_BYTES = 2 << 30
READ_BYTES = 2 << 30
#: CTAs per SM tried for the read ceiling: all resident (48 registers x 256 threads: up to 5).
READ_CTAS_PER_SM = (2, 3, 4, 5)
GEMM_N = 8192


def read_tbps(nbytes: int = READ_BYTES, reps: int = 20) -> float:
    """Read-only bandwidth in TB/s (1e12 B/s): ``nbytes`` (a multiple of 16) read once per call
    of :func:`aiter_mla.bench.read_bandwidth.read_xor`, the best over :data:`READ_CTAS_PER_SM`
    of the median of ``reps`` timings. Raises the JIT's errors if the module cannot be built."""
    import torch

    from .read_bandwidth import read_xor

    num_sm = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device="cuda")
    best = 0.0
    for ctas in READ_CTAS_PER_SM:
        partial = torch.empty(num_sm * ctas, dtype=torch.int32, device="cuda")
        ms = time_repeated(lambda: read_xor(src, partial, num_sm, ctas), reps=reps, warmup=10)
        best = max(best, nbytes / (ms * 1e-3) / 1e12)
    del src
    return best


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
    """``{"read_TBps", "copy_TBps", "bf16_TFLOPS", "fp8_TFLOPS"}`` measured now on the
    current GPU (TB/s = 1e12 B/s, TFLOPS = 1e12 FLOP/s). If the read kernel cannot be built or
    run, ``read_TBps`` is left out (the floor then uses ``copy_TBps``) and ``read_error`` says
    why."""
    import torch

    result = {"copy_TBps": copy_tbps(reps=reps)}   # first: it also warms the GPU up for the read
    try:
        result["read_TBps"] = read_tbps(reps=reps)
    except Exception as exc:  # the floor falls back to the copy rate; the report says so
        result["read_error"] = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
    result.update(bf16_TFLOPS=bf16_tflops(reps=reps), fp8_TFLOPS=fp8_tflops(reps=reps))
    torch.cuda.empty_cache()
    return result
