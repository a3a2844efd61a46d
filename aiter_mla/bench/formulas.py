"""FLOP and byte counts of one MLA decode call, and the roofline floor (docs/DESIGN.md §6).

Pure Python, no torch: the bench, the report and the tests share these numbers.
"""
from __future__ import annotations

from collections.abc import Sequence

from ..arch import QK_HEAD_DIM, V_HEAD_DIM

#: Bytes per element of each dtype name the bench accepts.
ELEM_BYTES = {"fp8": 1, "bf16": 2}
#: The output is always bf16 (AITER's HK path and ours).
OUT_ELEM_BYTES = 2


def _elem_bytes(name: str, arg: str) -> int:
    try:
        return ELEM_BYTES[name]
    except KeyError:
        raise ValueError(f"{arg} must be one of {sorted(ELEM_BYTES)}, got {name!r}") from None


def _check_lengths(qlens: Sequence[int], kv_lens: Sequence[int]) -> None:
    if len(qlens) != len(kv_lens):
        raise ValueError(
            f"qlens and kv_lens must have one entry per request: got {len(qlens)} and {len(kv_lens)}"
        )
    if any(q < 0 for q in qlens) or any(k < 0 for k in kv_lens):
        raise ValueError("qlens and kv_lens must be non-negative")


def flops(qlens: Sequence[int], kv_lens: Sequence[int], heads: int) -> int:
    """Floating-point operations of one decode call: ``2 · Σ(qlen_b · kv_len_b) · heads · (576 + 512)``.

    AITER's formula (op_tests/test_mla_persistent.py): QK over 576 dims plus PV over 512 dims, one
    multiply-add = 2 FLOP. Keys hidden by the causal mask at qlen > 1 are counted anyway, so the
    numbers compare with the seed's. Raises ValueError on mismatched or negative lengths.
    """
    _check_lengths(qlens, kv_lens)
    return 2 * sum(q * k for q, k in zip(qlens, kv_lens)) * heads * (QK_HEAD_DIM + V_HEAD_DIM)


def bytes_moved(
    qlens: Sequence[int], kv_lens: Sequence[int], heads: int, q_dtype: str, kv_dtype: str
) -> int:
    """Minimum DRAM traffic of one decode call, in bytes: KV read once + Q read + O written.

    KV: ``Σ kv_len_b · 576 · size(kv_dtype)`` (one KV head, V is the first 512 columns of the same
    row, so it is not read again); Q: ``total_q · heads · 576 · size(q_dtype)``;
    O: ``total_q · heads · 512 · 2`` (bf16). Page tables, metadata and split partials are not
    counted: they are what a kernel adds on top of the floor.
    """
    _check_lengths(qlens, kv_lens)
    qb = _elem_bytes(q_dtype, "q_dtype")
    kvb = _elem_bytes(kv_dtype, "kv_dtype")
    total_q = sum(qlens)
    kv = sum(kv_lens) * QK_HEAD_DIM * kvb
    q = total_q * heads * QK_HEAD_DIM * qb
    o = total_q * heads * V_HEAD_DIM * OUT_ELEM_BYTES
    return kv + q + o


def gemm_rate_tflops(ceilings: dict, q_dtype: str, kv_dtype: str) -> float:
    """The GEMM ceiling that bounds a row: fp8's when both q and kv are fp8, else bf16's (docs/DESIGN.md §6.2)."""
    key = "fp8_TFLOPS" if (q_dtype == "fp8" and kv_dtype == "fp8") else "bf16_TFLOPS"
    return float(ceilings[key])


def memory_rate_tbps(ceilings: dict) -> tuple[str, float]:
    """The bandwidth ceiling that bounds a row's bytes: ``("read_TBps", rate)`` when the
    ceilings hold the read-only rate, else ``("copy_TBps", rate)``. Results written before the
    read ceiling existed (docs/perf/results_*.json up to issue 24) have only ``copy_TBps``;
    their floors were, and when recomputed still are, bytes / copy rate. KeyError if neither
    is there."""
    key = "read_TBps" if ceilings.get("read_TBps") is not None else "copy_TBps"
    return key, float(ceilings[key])


def floor_us(
    n_flops: float, n_bytes: float, ceilings: dict, q_dtype: str, kv_dtype: str
) -> float:
    """Roofline floor in µs: ``max(bytes / read bandwidth, FLOPs / GEMM rate)``.

    ``ceilings`` holds ``read_TBps`` (bytes read per second by a read-only kernel, 1e12; when
    missing, as in older results, ``copy_TBps``, bytes read + written per second, takes its
    place: :func:`memory_rate_tbps`) and ``bf16_TFLOPS`` / ``fp8_TFLOPS`` (1e12 FLOP/s), all
    measured in the same run. Raises ValueError on a non-positive ceiling.
    """
    key, bw = memory_rate_tbps(ceilings)
    rate = gemm_rate_tflops(ceilings, q_dtype, kv_dtype)
    if bw <= 0 or rate <= 0:
        raise ValueError(f"ceilings must be positive, got {key}={bw}, GEMM rate={rate}")
    # 1 TB/s = 1e6 bytes/µs; 1 TFLOPS = 1e6 FLOP/µs
    return max(n_bytes / (bw * 1e6), n_flops / (rate * 1e6))


def row_metrics(
    us: float, n_flops: float, n_bytes: float, ceilings: dict, q_dtype: str, kv_dtype: str
) -> dict:
    """Per-row figures for a measured time ``us`` (µs): TFLOPS, TB/s, floor µs (:func:`floor_us`,
    from ``read_TBps``, else ``copy_TBps``), fraction of floor.

    fraction of floor = floor / measured (1.0 is the limit). Raises ValueError for ``us <= 0``.
    """
    if not us > 0:
        raise ValueError(f"measured time us must be > 0, got {us}")
    floor = floor_us(n_flops, n_bytes, ceilings, q_dtype, kv_dtype)
    return {
        "tflops": n_flops / us / 1e6,
        "tbps": n_bytes / us / 1e6,
        "floor_us": floor,
        "frac_floor": floor / us,
    }
