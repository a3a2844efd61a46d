"""MLA decode ops: ``hk_mla_decode_fwd`` (the persistent split-KV kernel) and ``mla_decode_fwd``
(AITER's public entry: plan if needed, decode, reduce).

Both follow AITER PR #3072 (``aiter/mla.py``, ``csrc/kernels/mla/hk_decode_fwd.cu``;
docs/DESIGN.md §5) with its defects fixed (docs/DESIGN.md §8): ragged q lengths never read or
write past their batch, ``final_lse`` is written for unsplit works too, every row of every work
is written (fully masked rows: 0 / LSE +inf, split pieces 0 / -inf), and ``q_scale`` /
``kv_scale`` are honoured (real value = stored x scale).

Supported (:func:`is_supported_shape`, ``SUPPORTED_DTYPES``): any q heads in 1..128 and q
length in 1..16 (``arch.MAX_HEADS``, ``arch.MAX_SEQLEN_Q``), so up to 2048 query rows a
request. A work's rows run as 64-row CTAs side by side on the same KV (``arch.tile_rows``: 64,
128, 192, ...; padded rows where heads x qlen is not a multiple of 64). ``AITER_SHAPES``: the
ten (heads, qlen) pairs AITER's HK kernel takes, with AITER's meanings. q/kv both fp8 e4m3fn or
both bf16; output bf16; page_size any power of two 1..256 (the kernel reads it from
``kv_buffer.shape[1]``, as AITER's HK entry does).

Numerics (kernel: templates/mla_decode.cu.j2 + templates/common/mla_decode_sm90*.cuh): scores
= q.k over 576 dims (tensor cores, fp32 accumulate; fp8 QK promoted to fp32 in chunks of k-steps)
x q_scale x kv_scale x sm_scale; exp2-based online softmax; output = (P.V) x kv_scale / l in
bf16; LSE natural log. The fp8 main loops ("score_pv" at 64 or 128 rows with pages >= 64 and
no mask, "tile_pairs" at the other shapes above 32 rows, "warpgroup_works" at most 32) run PV
as an e4m3 wgmma with P rounded to e4m3, as AITER does; bf16 "alternating" rounds P to bf16.
Measured on the H200 against float64 (the bench's check): relative L2 at most 1.2e-2 (fp8) and
about 1.8e-3 (bf16).

Checks (docs/DESIGN.md §4.2, §5.13). The host checks shapes, dtypes, devices, layouts and the
plan record once per buffer set and keeps the filled launch (:class:`Prepared`) in an identity
cache: a warm call with the same long-lived tensors (kv_buffer, the index tensors, the plan, the
scales and any split buffers, by object and data pointer) and a q / o of the same shape, dtype and
device is a key, a lookup and the launches, with no device synchronisation. Index *values*
(qo_indptr, kv_indptr, kv_indices, kv_last_page_lens and the schedule's records) are checked by
the decode kernel, on the device, every call: a bad value is never used to address memory, and it
surfaces as :class:`aiter_mla.ops.errors.DeviceIndexError` (a ValueError naming the argument and
the entry) at the next op call on that device or at :func:`aiter_mla.check_errors`. An index
buffer refilled in place between calls (as engines do every step) is checked again by the kernel
that reads it. A tensor whose shape or storage is changed in place (``resize_``, ``set_``,
``as_strided_``) after a call must be passed as a new tensor object. Host checks are skipped
while a CUDA graph is being captured (the kernel's checks still run).
"""
from __future__ import annotations

import ctypes
import math
from typing import Optional

import torch

from .. import arch
from ..arch import QK_HEAD_DIM, V_HEAD_DIM
from ..scalars import require_bool, require_int, require_real
from ..work_info import KERNEL_DTYPES, WORK_INFO_INTS, kernel_dtype_name
from . import errors, launch, metadata, reduce
from .launch import raw_stream

__all__ = [
    "AITER_SHAPES",
    "SUPPORTED_DTYPES",
    "decode_variant",
    "is_supported_shape",
    "hk_mla_decode_fwd",
    "mla_decode_fwd",
]

#: AITER's ten (num_heads, max_seqlen_q) pairs -> its tile rows: m16x8 (128 rows, two 64-row
#: CTAs here), m16x4 (64), and (16,1), (32,1), (16,2) on the 64-row tile with padded rows. Every
#: other shape of :func:`is_supported_shape` runs too (``arch.tile_rows``).
AITER_SHAPES = {
    (128, 1): 128, (64, 2): 128, (32, 4): 128, (16, 8): 128,
    (64, 1): 64, (32, 2): 64, (16, 4): 64,
    (16, 1): 64, (32, 1): 64, (16, 2): 64,
}


def is_supported_shape(num_heads: int, max_seqlen_q: int) -> bool:
    """Whether the decode kernels take ``num_heads`` q heads (per KV head) at q length
    ``max_seqlen_q``: 1..arch.MAX_HEADS and 1..arch.MAX_SEQLEN_Q. TypeError for a non-int
    (bools and floats included), as :func:`decode_variant`."""
    num_heads = require_int("num_heads", num_heads)
    max_seqlen_q = require_int("max_seqlen_q", max_seqlen_q)
    return 1 <= num_heads <= arch.MAX_HEADS and 1 <= max_seqlen_q <= arch.MAX_SEQLEN_Q

#: torch dtype -> template name. q and kv must be the same (fp8/fp8 or bf16/bf16).
SUPPORTED_DTYPES = {getattr(torch, name): value for name, value in KERNEL_DTYPES.items()}

#: Rows (num_heads x max_seqlen_q) up to which a work fits one consumer warpgroup, the wgmma N
#: of the ``warpgroup_works`` loop.
FEW_ROWS = arch.FEW_ROWS

#: The sm_90a main loops (the ``mainloop`` template parameter), one per (dtype, row count, page
#: size, mask): "score_pv" (fp8, SCORE_PV_ROWS rows, pages of at least SCORE_PV_MIN_PAGE, mask
#: none: one scorer warpgroup scores every KV tile while two PV warpgroups add the previous
#: one, templates/common/mla_decode_sm90_score_pv.cuh), "tile_pairs"
#: (fp8, more than FEW_ROWS rows otherwise: the warpgroups score alternate KV tiles of a pair,
#: templates/common/mla_decode_sm90_tile_pairs.cuh), "warpgroup_works" (fp8, at most FEW_ROWS
#: rows: each consumer warpgroup runs its own work list, mla_decode_sm90_warpgroup_works.cuh) and
#: "alternating" (bf16: the warpgroups own alternate KV tiles and run out of phase, the row max
#: chained between them, mla_decode_sm90_alternating.cuh). docs/DESIGN.md §9.5-§9.7 describe them.
MAINLOOPS = ("score_pv", "tile_pairs", "warpgroup_works", "alternating")

#: score_pv's shapes: works of one or two whole 64-row CTAs (the row counts its GPU tests run;
#: padded rows, e.g. (40,1), keep tile_pairs until a GPU run covers them), pages holding whole
#: 64-key TMA tiles.
SCORE_PV_ROWS = (64, 128)
SCORE_PV_MIN_PAGE = 64


def mainloop_for(dtype: str, rows: int, *, page_size: int, mask: str) -> str:
    """The main loop that runs kv dtype ``dtype`` ("fp8" / "bf16") at ``rows`` = heads x qlen
    (1 .. arch.MAX_ROWS), ``page_size`` tokens a page and ``mask`` ("none" / "causal").
    ValueError for another dtype or mask name, a row count outside that range or a page size
    that is not a power of two in 1..256; TypeError for a non-int ``rows`` or ``page_size``."""
    if dtype not in KERNEL_DTYPES.values():
        raise ValueError(f"dtype must be one of {sorted(KERNEL_DTYPES.values())}, got {dtype!r}")
    if mask not in ("none", "causal"):
        raise ValueError(f"mask must be 'none' or 'causal', got {mask!r}")
    rows = require_int("rows", rows)
    page_size = require_int("page_size", page_size)
    if not 1 <= rows <= arch.MAX_ROWS:
        raise ValueError(f"rows must be heads x qlen in 1..{arch.MAX_ROWS}, got {rows}")
    if not (1 <= page_size <= 256 and page_size & (page_size - 1) == 0):
        raise ValueError(f"page_size must be a power of two in 1..256, got {page_size}")
    if dtype == "bf16":
        return "alternating"
    if rows <= FEW_ROWS:
        return "warpgroup_works"
    if rows in SCORE_PV_ROWS and page_size >= SCORE_PV_MIN_PAGE and mask == "none":
        return "score_pv"
    return "tile_pairs"


_DEFAULT_SM_SCALE = 1.0 / math.sqrt(QK_HEAD_DIM)

_ptr, _i64, _int = ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int

#: ``aiter_mla_decode`` of templates/mla_decode.cu.j2: a ``DecodeArgs`` pointer (``fixed``: the
#: buffers that stay, the sizes every index is checked against, the error record; filled once
#: per buffer set), then the per-call buffers and the stream.
SIGNATURE = launch.Signature("aiter_mla_decode", (
    ("q", _ptr), ("out", _ptr), ("final_lse", _ptr), ("split_out", _ptr), ("split_lse", _ptr),
    ("stream", _ptr)), fixed=(
    ("kv", _ptr), ("kv_rows", _i64), ("num_pages", _i64), ("kv_indices", _ptr),
    ("kv_indices_len", _i64), ("kv_last_page_lens", _ptr), ("qo_indptr", _ptr),
    ("kv_indptr", _ptr), ("work_indptr", _ptr), ("work_indptr_len", _i64), ("work_info", _ptr),
    ("num_works", _i64), ("q_scale", _ptr), ("kv_scale", _ptr), ("q_rows", _i64),
    ("split_tokens", _i64), ("error_claim", _ptr), ("error_record", _ptr),
    ("reduce_launch", _ptr), ("reduce_args", _ptr), ("arrivals", _ptr), ("reduce_indptr", _ptr),
    ("reduce_partial_map", _ptr), ("reduce_indptr_len", _i64), ("partial_map_len", _i64),
    ("sm_scale", ctypes.c_float),
    ("num_heads", _int), ("num_clusters", _int), ("grid_x", _int), ("num_batches", _int),
    ("total_q", _int), ("max_seqlen_q", _int), ("device", _int)))


def _decode_module(variant: tuple, _device_index: int):
    from ..jit import get_module

    return get_module("mla_decode", **dict(variant))


#: Loaded aiter_mla_decode per (variant = tuple(decode_variant(...).items()), device).
_entry_points = launch.EntryPoints(SIGNATURE, _decode_module)
_launched: set[tuple[str, int]] = set()      # (module key, device) launched at least once
#: Checked launches (:class:`Prepared`) by what decides their checks (``_key``).
_prepared = launch.IdentityCache()


def _supported_text() -> str:
    return (f"supported: num_heads in 1..{arch.MAX_HEADS} and max_seqlen_q in 1..{arch.MAX_SEQLEN_Q}; "
            f"q/kv dtypes: fp8 e4m3fn/fp8 e4m3fn or bf16/bf16; page_size: a power of two in 1..256")


def decode_variant(num_heads: int, max_seqlen_q: int, page_size: int, q_dtype: torch.dtype,
                   kv_dtype: torch.dtype, *, target: str = "sm_90a", who: str = "mla decode",
                   tensor_names: tuple[str, str] | None = None) -> dict:
    """The ``mla_decode`` template parameters for a problem shape (the JIT variant) on
    ``target`` (sm_90a; gfx942 / gfx950: :func:`amd_decode_variant`).

    Returns a dict for ``aiter_mla.jit.get_module("mla_decode", **params)``: arch sm_90a,
    block_m = ``arch.tile_rows`` (64, 128, ..., 2048), page_size, block_n 64, mask ``causal`` when max_seqlen_q > 1 else
    ``none``, q_dtype / kv_dtype ("fp8" / "bf16") and mainloop (``mainloop_for``).

    Raises TypeError when num_heads / max_seqlen_q / page_size is not an int (bools and floats
    included) or q_dtype / kv_dtype is not a torch.dtype, ValueError when num_heads or
    max_seqlen_q is < 1, and NotImplementedError (listing what is supported) for any other
    shape, dtype pair or page size. On sm_90a the ValueError and NotImplementedError messages
    start with ``who`` (the caller's name) and name the dtypes as ``q_dtype`` / ``kv_dtype``,
    or as the dtypes of the caller's tensors ``tensor_names`` (e.g. ``("query", "kv_buffer")``);
    the AMD targets' messages name the target instead.
    """
    if target != "sm_90a":
        return amd_decode_variant(num_heads, max_seqlen_q, page_size, q_dtype, kv_dtype, target=target)
    num_heads = require_int("num_heads", num_heads)
    max_seqlen_q = require_int("max_seqlen_q", max_seqlen_q)
    page_size = require_int("page_size", page_size)
    key = (num_heads, max_seqlen_q)
    for name, value in (("num_heads", num_heads), ("max_seqlen_q", max_seqlen_q)):
        if value < 1:
            raise ValueError(f"{who}: {name} must be >= 1, got {value}")
    if not is_supported_shape(num_heads, max_seqlen_q):
        raise NotImplementedError(
            f"{who}: (num_heads, max_seqlen_q) = {key} is not supported; {_supported_text()}")
    for name, dt in (("q_dtype", q_dtype), ("kv_dtype", kv_dtype)):
        if not isinstance(dt, torch.dtype):
            raise TypeError(f"{name} must be a torch.dtype (torch.float8_e4m3fn or torch.bfloat16), "
                            f"got {dt!r} ({type(dt).__name__})")
    if q_dtype not in SUPPORTED_DTYPES or kv_dtype != q_dtype:
        qn, kvn = (f"{n} dtype" for n in tensor_names) if tensor_names else ("q_dtype", "kv_dtype")
        raise NotImplementedError(
            f"{who}: {qn} {q_dtype} with {kvn} {kv_dtype} is not supported; {_supported_text()}")
    if not (1 <= page_size <= 256 and page_size & (page_size - 1) == 0):
        raise NotImplementedError(
            f"{who}: page_size {page_size} is not supported; {_supported_text()}")
    dt = SUPPORTED_DTYPES[q_dtype]
    mask = "causal" if max_seqlen_q > 1 else "none"
    return dict(arch="sm_90a", block_m=arch.tile_rows(num_heads, max_seqlen_q), page_size=int(page_size), block_n=64,
                mask=mask, q_dtype=dt, kv_dtype=dt,
                mainloop=mainloop_for(dt, num_heads * max_seqlen_q, page_size=page_size, mask=mask))


#: The fp8 torch dtype each AMD target's decode reads (its MFMA's encoding) -> template name.
AMD_FP8 = {"gfx942": (torch.float8_e4m3fnuz, "fp8_fnuz"), "gfx950": (torch.float8_e4m3fn, "fp8")}


def amd_decode_variant(num_heads: int, max_seqlen_q: int, page_size: int, q_dtype: torch.dtype,
                       kv_dtype: torch.dtype, *, target: str) -> dict:
    """The ``mla_decode`` template parameters on AMD ``target`` (gfx942 / gfx950;
    templates/mla_decode_amd.cu.j2): block_m = ``arch.amd_tile_rows`` (128 = m16x8, or 64 =
    m16x4 on gfx950 under ``AITER_ENABLE_EXPERIMENTAL``), block_n 32 (gfx942) / 64 (gfx950),
    mask ``causal`` when max_seqlen_q > 1, dtypes ``AMD_FP8[target]`` (q and kv
    torch.float8_e4m3fnuz on gfx942, torch.float8_e4m3fn on gfx950), mainloop ``mfma``.

    Raises ValueError for an unknown target or num_heads / max_seqlen_q < 1, TypeError for a
    non-int or non-dtype argument, NotImplementedError for more than 128 rows, another dtype
    or a page size that is not a power of two in 1..256.
    """
    if target not in AMD_FP8:
        raise ValueError(f"target must be an AMD target ({' or '.join(AMD_FP8)}; sm_90a's "
                         f"parameters are decode_variant's), got {target!r}")
    num_heads = require_int("num_heads", num_heads)
    max_seqlen_q = require_int("max_seqlen_q", max_seqlen_q)
    page_size = require_int("page_size", page_size)
    block_m = arch.amd_tile_rows(num_heads, max_seqlen_q, target)
    want, name = AMD_FP8[target]
    for arg, dt in (("q_dtype", q_dtype), ("kv_dtype", kv_dtype)):
        if not isinstance(dt, torch.dtype):
            raise TypeError(f"{arg} must be a torch.dtype ({want}), got {dt!r} ({type(dt).__name__})")
        if dt != want:
            raise NotImplementedError(f"mla decode on {target}: {arg} must be {want} (the fp8 its "
                                      f"MFMA reads), got {dt}")
    if not (1 <= page_size <= 256 and page_size & (page_size - 1) == 0):
        raise NotImplementedError(
            f"mla decode on {target}: page_size must be a power of two in 1..256, got {page_size}")
    return dict(arch=target, block_m=block_m, page_size=page_size, block_n=32 if target == "gfx942" else 64,
                mask="causal" if max_seqlen_q > 1 else "none", q_dtype=name, kv_dtype=name, mainloop="mfma")


def launch_grid_x(params: dict, clusters: int) -> int:
    """grid.x of the decode launch for a variant ``params`` and ``clusters`` work lists.

    The kernel runs grid (grid_x, block_m / 64); CTA x walks clusters x, x + grid_x, ...
    Every loop but ``warpgroup_works`` launches one CTA column per cluster: with block_m 128 the
    two 64-row CTAs of a work (blockIdx.y 0 / 1) run at the same time, and the second reads the
    KV from L2, since ``arch.num_clusters`` gives those shapes num_cu / 2 lists (FlashMLA sizes
    its grid the same way: num_sm_parts = num_sms / m_blocks). ``warpgroup_works`` launches
    ceil(clusters / 2): CTA x runs clusters 2x and 2x + 1 (+ 2 grid_x, ...), one per consumer
    warpgroup. The AMD kernel (``mfma``) runs one workgroup per cluster, as AITER's grid.

    Args: ``params`` a ``decode_variant`` dict; ``clusters`` >= 1 (``arch.num_clusters``).
    Returns an int in [1, clusters]. Raises KeyError when ``params`` lacks mainloop / block_m,
    TypeError / ValueError when ``clusters`` is not an int >= 1.
    """
    clusters = require_int("clusters", clusters)
    if clusters < 1:
        raise ValueError(f"clusters must be >= 1, got {clusters}")
    if params["mainloop"] == "warpgroup_works":
        return max(1, (clusters + 1) // 2)   # CTA x runs clusters 2x (warpgroup 0) and 2x + 1
    return clusters


# ---------------------------------------------------------------------------------------------
# checks


def _require_cuda(name: str, t) -> None:
    """The device check of an op, before anything that needs CUDA (capture state, planning);
    checks that need no device may come first (mla_decode_fwd's shapes and dtypes)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_cuda:
        raise ValueError(f"{name} must be a CUDA tensor, got one on {t.device}")


def _capturing(device: torch.device) -> bool:
    if device.index is None or device.index == torch.cuda.current_device():
        return torch.cuda.is_current_stream_capturing()
    with torch.cuda.device(device):
        return torch.cuda.is_current_stream_capturing()


def _check_tensor(t, name: str, dtype, device: torch.device, dim: Optional[int] = None,
                  contiguous: bool = True) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dtype is not None and t.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype}, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name} must be on {device} (where query is), got {t.device}")
    if dim is not None and t.dim() != dim:
        raise ValueError(f"{name} must have {dim} dimension{'' if dim == 1 else 's'}, got shape {tuple(t.shape)}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (shape {tuple(t.shape)}, stride {t.stride()})")


def _check_scale(t, name: str, device: torch.device) -> None:
    if t is None:
        return
    _check_tensor(t, name, torch.float32, device)
    if t.numel() != 1:
        raise ValueError(f"{name} must hold 1 element (per-tensor scale), got shape {tuple(t.shape)}")


def _check_batch_layout(qo_indptr, kv_indptr, kv_last_page_lens) -> int:
    """The batch count the three per-batch tensors agree on (sizes only: no device needed)."""
    batch = qo_indptr.numel() - 1
    if batch < 1:
        raise ValueError(f"qo_indptr must have batch + 1 >= 2 entries, got {qo_indptr.numel()}")
    if kv_indptr.numel() != batch + 1:
        raise ValueError(f"qo_indptr and kv_indptr must both have batch + 1 entries: qo_indptr has "
                         f"{qo_indptr.numel()} (batch {batch}), kv_indptr has {kv_indptr.numel()}")
    if kv_last_page_lens.numel() < batch:
        raise ValueError(f"kv_last_page_lens must have at least batch = {batch} entries, got {kv_last_page_lens.numel()}")
    return batch


def _check_indptr_len(work_indptr, clusters: int) -> None:
    if work_indptr.numel() < clusters + 1:
        raise ValueError(f"work_indptr must hold num_clusters + 1 = {clusters + 1} entries "
                         f"(aiter_mla.arch.num_clusters), got {work_indptr.numel()}")


def _check_plan(work_info_set, work_indptr, num_heads: int, max_seqlen_q: int, page_size: int,
                batch: int, clusters: int) -> None:
    """The schedule must have been planned for this shape (metadata.lookup_plan). A schedule
    for fewer clusters than the launch would leave works unrun: checked here too. A schedule
    with no plan record (written by hand, or by metadata_reference.to_buffers) is trusted."""
    plan = metadata.lookup_plan(work_info_set)
    if plan is None:
        return  # not planned by get_mla_metadata_v1 in this process (e.g. hand-built): trusted
    want = dict(num_heads=num_heads, max_seqlen_qo=max_seqlen_q, page_size=page_size,
                batch_size=batch, num_clusters=clusters,
                work_indptr_ptr=work_indptr.data_ptr())
    for field, value in want.items():
        got = getattr(plan, field)
        if int(got) != int(value):
            what = "a different work_indptr buffer" if field == "work_indptr_ptr" else f"{field}={got}"
            raise ValueError(f"work_info_set was planned with {what} but this call has "
                             f"{field}={value}; re-run get_mla_metadata_v1 for this shape")


# ---------------------------------------------------------------------------------------------
# launch


def _validate(query, kv_buffer, qo_indptr, kv_indptr, kv_page_indices, kv_last_page_lens,
              work_indptr, work_info_set, max_seqlen_q, split_output, split_lse, final_output,
              q_scale, kv_scale, final_lse, params: Optional[dict] = None,
              clusters: Optional[int] = None) -> tuple[dict, int]:
    """The host checks of a call's shapes, dtypes, devices, layouts and plan; returns (variant
    params, work-list count). ``params`` / ``clusters``: what ``mla_decode_fwd`` already
    computed for this call (then not again). Index *values* are the kernel's to check
    (``errors``)."""
    if not isinstance(query, torch.Tensor):
        raise TypeError(f"query must be a torch.Tensor, got {type(query).__name__}")
    device = query.device   # every tensor on it; CUDA is checked after the tensors (below), so
    if device.type != "cuda" and launch.any_on_cuda(   # that a call on CPU tensors names its other
            kv_buffer, qo_indptr, kv_indptr, kv_page_indices, kv_last_page_lens, work_indptr,   # mistakes
            work_info_set, split_output, split_lse, final_output, q_scale, kv_scale, final_lse):
        raise ValueError(f"query must be a CUDA tensor, got one on {device}")   # the odd one out
    if query.dim() != 3 or query.shape[2] != QK_HEAD_DIM:
        raise ValueError(f"query must be [total_q, num_heads, {QK_HEAD_DIM}], got {tuple(query.shape)}")
    total_q, num_heads = int(query.shape[0]), int(query.shape[1])
    _check_tensor(query, "query", None, device)
    _check_tensor(kv_buffer, "kv_buffer", None, device, dim=4)
    if kv_buffer.shape[2] != 1 or kv_buffer.shape[3] != QK_HEAD_DIM:
        raise ValueError(f"kv_buffer must be [num_pages, page_size, 1, {QK_HEAD_DIM}] (one KV head), "
                         f"got {tuple(kv_buffer.shape)}")
    launch.check_aligned(query, "query")
    launch.check_aligned(kv_buffer, "kv_buffer")
    page_size = int(kv_buffer.shape[1])
    max_seqlen_q = require_int("max_seqlen_q", max_seqlen_q)
    if params is None:
        params = decode_variant(num_heads, max_seqlen_q, page_size, query.dtype, kv_buffer.dtype,
                                tensor_names=("query", "kv_buffer"))
    _check_tensor(final_output, "final_output", torch.bfloat16, device, dim=3)
    if tuple(final_output.shape) != (total_q, num_heads, V_HEAD_DIM):
        raise ValueError(f"final_output must be [{total_q}, {num_heads}, {V_HEAD_DIM}] (query rows, "
                         f"heads, V dim), got {tuple(final_output.shape)}")
    launch.check_aligned(final_output, "final_output")
    for name, t in (("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr),
                    ("kv_page_indices", kv_page_indices), ("kv_last_page_lens", kv_last_page_lens),
                    ("work_indptr", work_indptr)):
        _check_tensor(t, name, torch.int32, device, dim=1)
    batch = _check_batch_layout(qo_indptr, kv_indptr, kv_last_page_lens)
    _check_tensor(work_info_set, "work_info_set", torch.int32, device, dim=2)
    if work_info_set.shape[1] != WORK_INFO_INTS:
        raise ValueError(f"work_info_set must be [num_works, {WORK_INFO_INTS}], got {tuple(work_info_set.shape)}")
    _check_tensor(split_output, "split_output", torch.float32, device)
    _check_tensor(split_lse, "split_lse", torch.float32, device)
    if split_output.numel() % (num_heads * V_HEAD_DIM) != 0 or split_output.shape[-1] != V_HEAD_DIM:
        raise ValueError(f"split_output must be [N, 1, {num_heads}, {V_HEAD_DIM}] fp32, got "
                         f"{tuple(split_output.shape)}")
    launch.check_aligned(split_output, "split_output")
    n_rows = split_output.numel() // V_HEAD_DIM
    if split_lse.numel() != n_rows:
        raise ValueError(f"split_output and split_lse must have the same rows N (split_output "
                         f"[N, 1, {num_heads}, {V_HEAD_DIM}], split_lse [N, 1, {num_heads}, 1]), got "
                         f"split_output {tuple(split_output.shape)} ({n_rows // num_heads} token rows) "
                         f"and split_lse {tuple(split_lse.shape)} ({split_lse.numel()} values)")
    if final_lse is not None:
        _check_tensor(final_lse, "final_lse", torch.float32, device)
        if final_lse.numel() != total_q * num_heads:
            raise ValueError(f"final_lse must be [{total_q}, {num_heads}], got {tuple(final_lse.shape)}")
    _check_scale(q_scale, "q_scale", device)
    _check_scale(kv_scale, "kv_scale", device)
    if device.type != "cuda":
        raise ValueError(f"query must be a CUDA tensor, got one on {device}")
    if clusters is None:
        clusters = arch.num_clusters(num_heads, max_seqlen_q, device=device, kv_dtype=params["kv_dtype"])
    _check_plan(work_info_set, work_indptr, num_heads, max_seqlen_q, page_size, batch, clusters)
    _check_indptr_len(work_indptr, clusters)
    return params, clusters



# ---------------------------------------------------------------------------------------------
# launch: checked once per buffer set (Prepared, cached in _prepared), then a warm call is a key,
# a lookup and the launches (docs/DESIGN.md §4.2)


class Prepared:
    """A checked decode launch: the loaded entry point and its filled ``DecodeArgs``, the
    device's error record, the split buffers' shapes and, for ``mla_decode_fwd``, how the split
    rows are merged. ``plan_key`` / ``plan``: the plan record the checks saw
    (``metadata._plans``); a warm call requires it unchanged.

    The merge (docs/DESIGN.md §5.10) runs one of two ways, chosen per launch:

    * *chained* (``args`` as filled by :meth:`chain_reduce`): the decode entry point launches the
      reduce kernel right after the decode; any schedule, two launches.
    * *fused* (:meth:`allow_fused`): the decode kernel merges each split tile itself, behind a
      per-tile arrival counter; one launch, for schedules whose tiles have at most
      ``work_info.FUSED_MERGE_MAX_PIECES`` pieces (a merged tile's pieces all pass through one SM).

    Both are right for any schedule, so the choice can follow a hint the host reads without a
    sync: the metadata kernel's count of heavier tiles in the last schedule it made on this
    device (``errors.Sink.split_heavy_tiles``, possibly a schedule behind). Fused needs zeroed
    counters per stream (the kernel's last CTA zeroes them again), so ``state`` = (stream,
    fused, DecodeArgs address) names the launch for the current stream. A CUDA-graph capture
    always gets the chained reduce (a graph is replayed on other data): a state made inside a
    capture is chained, and a fused state's args keep the chained reduce too, which the entry
    point takes whenever ``cudaStreamIsCapturing`` says the stream is being captured
    (docs/DESIGN.md §5.10)."""

    __slots__ = ("module", "fn", "args", "addr", "index", "sink", "split_shape", "lse_shape",
                 "reduce", "plan_key", "plan", "device", "hint", "state", "_fused_args",
                 "_merge_maps", "_modes")

    def chain_reduce(self, r) -> None:
        """Make the decode entry point launch the reduce ``r`` (a ``reduce.Prepared`` filled
        with ``ask_errors=False``) after the decode: one host call for both kernels."""
        self.reduce = r
        self.args.reduce_launch, self.args.reduce_args = r.fn_addr, r.addr

    def allow_fused(self, reduce_indptr, reduce_partial_map, counters: int) -> None:
        """Let launches merge inside the decode kernel while the device's hint allows
        (``counters``: num_batches x CTAs per work)."""
        self.hint = self.sink.split_heavy_tiles
        self._merge_maps = (reduce_indptr.data_ptr(), reduce_partial_map.data_ptr(),
                            reduce_indptr.numel(), reduce_partial_map.numel(), counters)
        self._modes = {}
        self._fused_args = ()   # (DecodeArgs, counters) of each fused state, kept alive
        self.state = (None, None, self.addr)

    def select(self, stream: int) -> tuple:
        """The (stream, fused, args address) to launch with on ``stream`` now (kept as
        ``state``); makes the stream's zeroed counters on its first fused launch."""
        fused = self.hint.value == 0 and not _capturing(self.device)
        key = (stream, fused)
        addr = self._modes.get(key)
        if addr is None:
            if fused:
                indptr, pmap, indptr_len, pmap_len, counters = self._merge_maps
                arrivals = torch.zeros(1 + counters, dtype=torch.int32, device=self.device)
                # the chained reduce stays set: the entry point takes it instead of the
                # fused merge when the stream is being captured (docs/DESIGN.md §5.10)
                a = type(self.args).from_buffer_copy(self.args)
                a.arrivals, a.reduce_indptr, a.reduce_partial_map = arrivals.data_ptr(), indptr, pmap
                a.reduce_indptr_len, a.partial_map_len = indptr_len, pmap_len
                self._fused_args += ((a, arrivals),)
                addr = ctypes.addressof(a)
            else:
                addr = self.addr
            self._modes[key] = addr
        self.state = (stream, fused, addr)
        return self.state

    def launch(self, q_ptr: int, out_ptr: int, final_lse_ptr, split_ptr: int, split_lse_ptr: int) -> None:
        """The decode launch (and the chained reduce's, or the fused merge) on the current
        stream; raises the recorded device error instead when there is one (nothing launched).
        ``mla_decode_fwd``'s warm path inlines these lines (a Python frame costs ~0.2 µs):
        change both together."""
        stream = raw_stream(self.index)
        addr = self.addr
        if self.hint is not None:
            st = self.state
            if st[0] != stream or st[1] != (self.hint.value == 0):
                st = self.select(stream)
            addr = st[2]
        rc = self.fn(addr, q_ptr, out_ptr, final_lse_ptr, split_ptr, split_lse_ptr, stream)
        if rc != 0:
            self.fail(rc)

    def fail(self, rc: int) -> None:
        launch.fail(rc, self.module, "mla decode launch", self.sink,
                    None if self.reduce is None else self.reduce.module)


def _prepare(query, kv_buffer, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens, work_indptr,
             work_info_set, max_seqlen_q, softmax_scale, split_output, split_lse, final_output,
             q_scale, kv_scale, final_lse, params=None, clusters=None) -> Prepared:
    """Check a call (``_validate``, skipped during CUDA-graph capture) and fill its launch.
    RuntimeError when a variant never launched is first used inside a capture."""
    # before anything that may build or load a module: a bad scale is named first
    softmax_scale = require_real("softmax_scale", softmax_scale, float32=True)
    device = query.device
    capturing = _capturing(device)
    if not capturing:
        params, clusters = _validate(
            query, kv_buffer, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens, work_indptr,
            work_info_set, max_seqlen_q, split_output, split_lse, final_output, q_scale,
            kv_scale, final_lse, params, clusters)
    num_heads = int(query.shape[1])
    max_seqlen_q = int(max_seqlen_q)
    if params is None:
        params = decode_variant(num_heads, max_seqlen_q, int(kv_buffer.shape[1]), query.dtype,
                                kv_buffer.dtype, tensor_names=("query", "kv_buffer"))
    if clusters is None:
        clusters = arch.num_clusters(num_heads, max_seqlen_q, device=device, kv_dtype=params["kv_dtype"])
        _check_indptr_len(work_indptr, clusters)   # the one check the kernel's reads depend on
    index = device.index if device.index is not None else torch.cuda.current_device()
    module, fn = _entry_points.get(tuple(params.items()), index)
    if capturing and (module.key, index) not in _launched:
        raise RuntimeError(
            f"mla decode variant {params} is used for the first time on {device} while a CUDA "
            "graph is being captured; run the op once outside the capture (warm-up) first")
    sink = errors.sink(index)
    kv_shape = kv_buffer.shape

    def ptr(t):
        return None if t is None else t.data_ptr()

    p = Prepared()
    p.module, p.fn, p.index, p.sink, p.device = module, fn, index, sink, device
    p.args = SIGNATURE.pack(
        kv=kv_buffer.data_ptr(), kv_rows=int(kv_shape[0]) * int(kv_shape[1]),
        num_pages=int(kv_shape[0]), kv_indices=kv_indices.data_ptr(),
        kv_indices_len=kv_indices.numel(), kv_last_page_lens=kv_last_page_lens.data_ptr(),
        qo_indptr=qo_indptr.data_ptr(), kv_indptr=kv_indptr.data_ptr(),
        work_indptr=work_indptr.data_ptr(), work_indptr_len=work_indptr.numel(),
        work_info=work_info_set.data_ptr(), num_works=int(work_info_set.shape[0]),
        q_scale=ptr(q_scale), kv_scale=ptr(kv_scale),
        q_rows=int(query.shape[0]) * num_heads,
        split_tokens=split_output.numel() // (num_heads * V_HEAD_DIM),
        error_claim=sink.claim_ptr, error_record=sink.record_ptr, reduce_launch=None,
        reduce_args=None, arrivals=None, reduce_indptr=None, reduce_partial_map=None,
        reduce_indptr_len=0, partial_map_len=0, sm_scale=softmax_scale, num_heads=num_heads, num_clusters=clusters,
        grid_x=launch_grid_x(params, clusters), num_batches=qo_indptr.numel() - 1,
        total_q=int(query.shape[0]), max_seqlen_q=max_seqlen_q, device=index)
    p.addr = ctypes.addressof(p.args)
    p.split_shape, p.lse_shape = tuple(split_output.shape), tuple(split_lse.shape)
    p.reduce = p.hint = None
    p.plan_key = metadata._plan_key(work_info_set)
    p.plan = metadata._plans.get(p.plan_key)
    return p


def _launch_first(p: Prepared, *ptrs) -> None:
    """The first launch of a Prepared (outside a capture): a variant launched once may be
    captured later."""
    p.launch(*ptrs)
    _launched.add((p.module.key, p.index))


def _key(q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens, work_indptr,
         work_info_set, q_scale, kv_scale, split_output, split_lse, final_lse, rest) -> tuple:
    """What decides a call's checks and fixed arguments: the per-call tensors (q, o) by shape,
    dtype and device; the long-lived ones by object and data pointer (``IdentityCache``);
    ``rest``: the scalars. AttributeError / TypeError for a non-tensor (the checks name it)."""
    return (q.shape, q.dtype, q.device, o.shape, o.dtype, o.device,
            id(kv_buffer), kv_buffer.data_ptr(), kv_buffer.shape,
            id(qo_indptr), qo_indptr.data_ptr(), id(kv_indptr), kv_indptr.data_ptr(),
            id(kv_indices), kv_indices.data_ptr(), id(kv_last_page_lens), kv_last_page_lens.data_ptr(),
            id(work_indptr), work_indptr.data_ptr(), id(work_info_set), work_info_set.data_ptr(),
            id(q_scale), None if q_scale is None else q_scale.data_ptr(),
            id(kv_scale), None if kv_scale is None else kv_scale.data_ptr(),
            id(split_output), id(split_lse), id(final_lse)) + rest


def _is_warm(p: Optional[Prepared], q, o) -> bool:
    """Whether the looked-up launch ``p`` serves this call: found, checked against the plan
    record that is current, and this call's q / o contiguous and 16-byte aligned (what a key cannot
    hold). A bad value an earlier kernel found is the entry point's to report
    (``Prepared.fail``)."""
    return (p is not None and metadata._plans.get(p.plan_key) is p.plan and q.is_contiguous()
            and o.is_contiguous() and not q.data_ptr() & 15 and not o.data_ptr() & 15)


@torch.library.custom_op(
    "aiter_mla::hk_mla_decode_fwd",
    mutates_args=("split_output", "split_lse", "final_output", "final_lse"),
    device_types="cuda",
)
def _hk_mla_decode_op(query: torch.Tensor, kv_buffer: torch.Tensor, qo_indptr: torch.Tensor,
                      kv_indptr: torch.Tensor, kv_page_indices: torch.Tensor,
                      kv_last_page_lens: torch.Tensor, work_indptr: torch.Tensor,
                      work_info_set: torch.Tensor, max_seqlen_q: int, softmax_scale: float,
                      split_output: torch.Tensor, split_lse: torch.Tensor, final_output: torch.Tensor,
                      q_scale: Optional[torch.Tensor], kv_scale: Optional[torch.Tensor],
                      final_lse: Optional[torch.Tensor]) -> None:
    _hk_decode(query, kv_buffer, qo_indptr, kv_indptr, kv_page_indices, kv_last_page_lens,
               work_indptr, work_info_set, max_seqlen_q, softmax_scale, split_output, split_lse,
               final_output, q_scale, kv_scale, final_lse)


@_hk_mla_decode_op.register_fake
def _(query, kv_buffer, qo_indptr, kv_indptr, kv_page_indices, kv_last_page_lens, work_indptr,
      work_info_set, max_seqlen_q, softmax_scale, split_output, split_lse, final_output, q_scale,
      kv_scale, final_lse) -> None:
    return None


def hk_mla_decode_fwd(query, kv_buffer, qo_indptr, kv_indptr, kv_page_indices, kv_last_page_lens,
                      work_indptr, work_info_set, max_seqlen_q, softmax_scale, split_output,
                      split_lse, final_output, *, q_scale=None, kv_scale=None, final_lse=None):
    """Persistent split-KV MLA decode: runs every work of the schedule (AITER ``hk_mla_decode_fwd``).

    Args:
        query: [total_q, H, 576] fp8 e4m3fn or bf16, contiguous, 16-byte aligned start; (H,
            max_seqlen_q) in :func:`is_supported_shape`.
        kv_buffer: [num_pages, page_size, 1, 576], same dtype as query, contiguous, 16-byte aligned
            start; page_size is read from ``kv_buffer.shape[1]`` (a power of two 1..256). V = first
            512 columns.
        qo_indptr, kv_indptr: [B+1] int32 (kv_indptr in pages); used by the checks only, the
            kernel addresses everything through the work records.
        kv_page_indices: [>= kv_indptr[-1]] int32 physical page ids.
        kv_last_page_lens: [>= B] int32 (entries past B unread, as in AITER), tokens in each
            batch's last page (1..page_size).
        work_indptr: [>= num_clusters + 1] int32; cluster i runs works work_indptr[i]..[i+1].
        work_info_set: [num_works, 8] int32 work records (:mod:`aiter_mla.work_info`).
        max_seqlen_q: int, the planned q length per batch (batches may be shorter: ragged).
        softmax_scale: float, applied to q.k of the real values.
        split_output: [N, 1, H, 512] fp32, 16-byte aligned start; split works write partial rows
            (partial_qo_loc + t) * H + h (normalised partial O).
        split_lse: [N, 1, H, 1] fp32; split works' partial LSE (natural log; -inf: no key).
        final_output: [total_q, H, 512] bf16, contiguous, 16-byte aligned start; unsplit works
            write their rows here.
        q_scale, kv_scale: optional [1] fp32 per-tensor scales (real = stored x scale); None = 1.
        final_lse: optional [total_q, H] fp32; unsplit works write their LSE (+inf: no key).

    Returns None (outputs are written in place).

    Raises TypeError / ValueError naming the argument for bad dtypes, devices, layouts or shapes
    (eager only), :class:`aiter_mla.ops.errors.DeviceIndexError` (a ValueError) for a bad index
    value an earlier call's kernel found on this device (the module docstring says when),
    NotImplementedError for unsupported shapes/dtypes, RuntimeError
    when the launch fails or a never-launched variant is first used inside CUDA-graph capture,
    and the JIT errors of :func:`aiter_mla.jit.get_module` on a variant's first use in a process
    (all RuntimeError subclasses: ToolchainError, BuildError, CacheError (CacheNotWritableError and
    LockTimeoutError among them), JitDisabledError, ModuleLoadError; a malformed
    ``AITER_MLA_*`` variable is a ValueError naming it).

    Source: AITER #3072 ``hk_mla_decode_fwd`` (``csrc/kernels/mla/hk_decode_fwd.cu``),
    docs/DESIGN.md §5.7-§5.9 and §5.11, plus the fixes of
    docs/DESIGN.md §8.1, §8.2, §8.4 and §8.6 (honoured scales).
    """
    if torch.compiler.is_compiling():
        torch.ops.aiter_mla.hk_mla_decode_fwd(
            query, kv_buffer, qo_indptr, kv_indptr, kv_page_indices, kv_last_page_lens,
            work_indptr, work_info_set, int(max_seqlen_q), float(softmax_scale), split_output,
            split_lse, final_output, q_scale, kv_scale, final_lse)
        return None
    _hk_decode(query, kv_buffer, qo_indptr, kv_indptr, kv_page_indices, kv_last_page_lens,
               work_indptr, work_info_set, max_seqlen_q, softmax_scale, split_output, split_lse,
               final_output, q_scale, kv_scale, final_lse)
    return None


def _hk_decode(query, kv_buffer, qo_indptr, kv_indptr, kv_page_indices, kv_last_page_lens,
               work_indptr, work_info_set, max_seqlen_q, softmax_scale, split_output, split_lse,
               final_output, q_scale, kv_scale, final_lse) -> None:
    if isinstance(query, torch.Tensor) and not query.is_cuda:   # the device-free checks first,
        require_real("softmax_scale", softmax_scale, float32=True)   # (on CUDA: _prepare's)
        _validate(query, kv_buffer, qo_indptr, kv_indptr, kv_page_indices, kv_last_page_lens,
                  work_indptr, work_info_set, max_seqlen_q, split_output, split_lse,
                  final_output, q_scale, kv_scale, final_lse)   # then its own device check
    _require_cuda("query", query)
    try:
        key = ("hk",) + _key(query, kv_buffer, final_output, qo_indptr, kv_indptr, kv_page_indices,
                             kv_last_page_lens, work_indptr, work_info_set, q_scale, kv_scale,
                             split_output, split_lse, final_lse, (max_seqlen_q, softmax_scale))
        p = _prepared.entries.get(key)
    except (AttributeError, TypeError):   # a non-tensor, or an unhashable scalar
        key = p = None
    if _is_warm(p, query, final_output):
        p.launch(query.data_ptr(), final_output.data_ptr(),
                 None if final_lse is None else final_lse.data_ptr(), split_output.data_ptr(),
                 split_lse.data_ptr())
        return
    p = _prepare(query, kv_buffer, qo_indptr, kv_indptr, kv_page_indices, kv_last_page_lens,
                 work_indptr, work_info_set, max_seqlen_q, softmax_scale, split_output,
                 split_lse, final_output, q_scale, kv_scale, final_lse)
    _launch_first(p, query.data_ptr(), final_output.data_ptr(),
                  None if final_lse is None else final_lse.data_ptr(), split_output.data_ptr(),
                  split_lse.data_ptr())
    if key is not None and not _capturing(query.device):
        _prepared.put(key, p, (kv_buffer, qo_indptr, kv_indptr, kv_page_indices, kv_last_page_lens,
                               work_indptr, work_info_set, q_scale, kv_scale, split_output,
                               split_lse, final_lse))


def mla_decode_fwd(q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens,
                   max_seqlen_q, page_size=1, nhead_kv=1, sm_scale=None, logit_cap=0.0,
                   num_kv_splits=None, num_kv_splits_indptr=None, work_meta_data=None,
                   work_indptr=None, work_info_set=None, reduce_indptr=None, reduce_final_map=None,
                   reduce_partial_map=None, q_scale=None, kv_scale=None, intra_batch_mode=False,
                   return_logits=False, return_lse=False, *, logits=None, attn_lse=None,
                   final_lse=None):
    """MLA decode attention, AITER's public entry (``aiter.mla.mla_decode_fwd``, persistent mode).

    Writes ``o`` in place. When ``work_meta_data`` is None the schedule is planned here, the
    one ``get_mla_metadata_info_v1`` + ``get_mla_metadata_v1`` would plan with
    ``kv_granularity = default_kv_granularity(page_size)`` (through their private helpers,
    ``metadata._buffer_specs`` and ``metadata._fill_schedule``, into six buffers allocated for
    the call); otherwise the given schedule (``work_indptr``, ``work_info_set``, ``reduce_*``) is
    used. Then the decode kernel runs and
    the split rows are merged (docs/DESIGN.md §5.10): with a caller-made plan whose tiles have at
    most ``work_info.FUSED_MERGE_MAX_PIECES`` pieces, by the decode kernel itself (one launch);
    otherwise, and in any CUDA-graph capture, by the reduce kernel of ``mla_reduce_v1``,
    launched right after it. The choice follows the metadata kernel's count on the device
    (:class:`Prepared`); either way gives the same result.

    Args:
        q: [total_q, H, 576] fp8 e4m3fn or bf16, contiguous. kv_buffer: [num_pages, page_size,
            1, 576], same dtype, contiguous (page_size a power of two 1..256). o: [total_q, H,
            512] bf16 output, contiguous. q, kv_buffer, o and logits start 16-byte aligned (the
            kernels move their rows in 16-byte units; torch's allocations are).
        qo_indptr: [B+1] int32, q tokens, starting at 0 and ending at total_q (B >= 1); each
            request 1 to max_seqlen_q of them (the scheduler refuses 0 in a CPU plan; the
            kernels check only the upper bound).
        kv_indptr: [B+1] int32, pages into ``kv_indices``, starting at 0, non-decreasing.
        kv_indices: [>= kv_indptr[-1]] int32 physical page ids, each in [0, num_pages).
        kv_last_page_lens: [>= B] int32 (entries past B unread), tokens in each non-empty
            batch's last page, 1..page_size.
            Index values are the kernel's to check (a bad one raises DeviceIndexError at a
            later call; module docstring).
        max_seqlen_q: int, q length per batch (AITER: uniform MTP length; shorter batches work).
            It also picks the mask (there is no mask argument, as in AITER): none at 1; causal
            above 1, bottom-right aligned per batch (q token i of a batch's n sees its first
            ctx - n + 1 + i keys).
        page_size: must equal kv_buffer.shape[1]. nhead_kv: must be 1.
        sm_scale: a finite float, default 1/sqrt(576). logit_cap: must be <= 0 (unsupported,
            as AITER).
        num_kv_splits, num_kv_splits_indptr, intra_batch_mode: accepted for AITER compatibility
            and unused (as in AITER #3072's persistent path); intra_batch_mode must be a bool.
        q_scale, kv_scale: optional [1] fp32 per-tensor scales (honoured).
        return_logits: a bool, kept for AITER compatibility (logits are always returned).
        return_lse: a bool (Python or NumPy): also return final_lse [total_q, H] fp32 (natural
            log; +inf for no key).
        logits, attn_lse (keyword only, not in AITER): the split buffers, [N, 1, H, 512] and
            [N, 1, H, 1] fp32 with N = reduce_partial_map.shape[0] * max_seqlen_q, given together
            and reused call after call. AITER's signature returns freshly allocated ones: two
            ``torch.empty`` a call (about 8 µs of host time on the H200 host,
            docs/perf/host_path_h200.md); giving them, with a caller-made plan, makes the call
            allocate nothing (a self-planned call still allocates its six schedule buffers).
        final_lse (keyword only): with return_lse, a [total_q, H] fp32 buffer to write instead of
            allocating one.

    Returns:
        (logits, final_lse): logits = the fp32 split-partial buffer [N, 1, H, 512] (AITER; the
        one given, if any); final_lse = [total_q, H] fp32 when return_lse else None.

    Host time, warm (the same plan and long-lived tensors as an earlier call): no checks re-run,
    no device synchronisation; bad index values are the kernel's to find (module docstring).

    Raises ValueError / TypeError naming the argument (TypeError for an ``intra_batch_mode``,
    ``return_logits`` or ``return_lse`` that is not a bool: ``'no'`` is not read as truthy),
    NotImplementedError for unsupported
    shapes or dtypes (listing what is supported), :class:`aiter_mla.ops.errors.DeviceIndexError`
    (a ValueError) for a bad index value an earlier call's kernel found on this device (raised
    before this call launches anything), RuntimeError when a launch (metadata, decode
    or reduce) fails or a variant is first used inside CUDA-graph capture, and the
    JIT errors of :func:`aiter_mla.jit.get_module` on a variant's first use in a process (all
    RuntimeError subclasses: ToolchainError, BuildError, CacheError (CacheNotWritableError and
    LockTimeoutError among them), JitDisabledError, ModuleLoadError; a malformed
    ``AITER_MLA_*`` variable is a ValueError naming it).

    Source: AITER #3072 ``aiter/mla.py`` ``mla_decode_fwd`` (docs/DESIGN.md §5.1: plan, decode, reduce; no
    head folding: every supported shape runs natively, which avoids the (64,2) fold mismatch,
    docs/DESIGN.md §8.5).
    """
    if work_meta_data is not None and not torch.compiler.is_compiling():
        # Warm path: a caller-made plan whose checks passed before (module docstring). The key
        # holds every scalar's type: 1 == True == 1.0 and 0.0 == False hash alike, but the
        # checks refuse a flag of 1, a page_size of 64.0 and a logit_cap of False (the eight
        # types cost ~80 ns of host time, timed on a CPU).
        try:
            key = _key(q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens,
                       work_indptr, work_info_set, q_scale, kv_scale, logits, attn_lse,
                       final_lse, (id(reduce_indptr), reduce_indptr.data_ptr(),
                                   id(reduce_final_map), reduce_final_map.data_ptr(),
                                   id(reduce_partial_map), reduce_partial_map.data_ptr(),
                                   max_seqlen_q, page_size, nhead_kv, sm_scale, logit_cap,
                                   return_lse, return_lse.__class__, intra_batch_mode.__class__,
                                   return_logits.__class__, max_seqlen_q.__class__,
                                   page_size.__class__, nhead_kv.__class__, sm_scale.__class__,
                                   logit_cap.__class__))
            p = _prepared.entries.get(key)
        except (AttributeError, TypeError):   # a non-tensor, or an unhashable scalar
            key = p = None
        # Inline (Prepared.launch's lines; change both together): each Python frame costs the
        # host ~0.2 µs (docs/perf/host_path_h200.md).
        if (p is not None and metadata._plans.get(p.plan_key) is p.plan and q.is_contiguous()
                and o.is_contiguous()):
            q_ptr = q.data_ptr()
            if not (q_ptr | o.data_ptr()) & 15:
                if logits is None:   # AITER returns fresh split buffers: two allocations a call
                    logits = torch.empty(p.split_shape, dtype=torch.float32, device=p.device)
                    attn_lse = torch.empty(p.lse_shape, dtype=torch.float32, device=p.device)
                if return_lse and final_lse is None:
                    final_lse = torch.empty((q.shape[0], q.shape[1]), dtype=torch.float32, device=p.device)
                elif not return_lse:
                    final_lse = None
                # one host call: the error record asked, then the decode launch and the merge
                # (fused into it, or the chained reduce launch: Prepared)
                stream = raw_stream(p.index)
                st = p.state
                if st[0] != stream or st[1] != (p.hint.value == 0):
                    st = p.select(stream)
                rc = p.fn(st[2], q_ptr, o.data_ptr(), None if final_lse is None else final_lse.data_ptr(),
                          logits.data_ptr(), attn_lse.data_ptr(), stream)
                if rc != 0:
                    p.fail(rc)
                return logits, final_lse
        return _mla_decode_fwd_cold(
            q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens, max_seqlen_q,
            page_size, nhead_kv, sm_scale, logit_cap, work_meta_data, work_indptr,
            work_info_set, reduce_indptr, reduce_final_map, reduce_partial_map, q_scale,
            kv_scale, return_lse, logits, attn_lse, final_lse, key, intra_batch_mode,
            return_logits)
    return _mla_decode_fwd_cold(
        q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens, max_seqlen_q,
        page_size, nhead_kv, sm_scale, logit_cap, work_meta_data, work_indptr, work_info_set,
        reduce_indptr, reduce_final_map, reduce_partial_map, q_scale, kv_scale, return_lse,
        logits, attn_lse, final_lse, None, intra_batch_mode, return_logits)


def _mla_decode_fwd_cold(q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens,
                         max_seqlen_q, page_size, nhead_kv, sm_scale, logit_cap, work_meta_data,
                         work_indptr, work_info_set, reduce_indptr, reduce_final_map,
                         reduce_partial_map, q_scale, kv_scale, return_lse, logits, attn_lse,
                         final_lse, key, intra_batch_mode, return_logits):
    """mla_decode_fwd's first call on a buffer set (and every self-planned call): every check,
    the plan when none is given, the launches; with a ``key``, the checked launch is kept for
    the warm path."""
    for name, t in (("q", q), ("kv_buffer", kv_buffer)):   # a non-tensor is a TypeError, as in the other ops
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    # bools only (Python or NumPy): return_lse='no' would return an LSE
    for name, flag in (("intra_batch_mode", intra_batch_mode), ("return_logits", return_logits),
                       ("return_lse", return_lse)):
        require_bool(name, flag)
    if q.dim() != 3:
        raise ValueError(f"q must be a [total_q, num_heads, {QK_HEAD_DIM}] tensor, got {tuple(q.shape)}")
    if kv_buffer.dim() != 4:
        raise ValueError(f"kv_buffer must be [num_pages, page_size, 1, {QK_HEAD_DIM}], got {tuple(kv_buffer.shape)}")
    if logit_cap is not None and require_real("logit_cap", logit_cap) > 0:
        raise NotImplementedError(f"logit_cap must be <= 0 (soft-capping is not supported), got {logit_cap}")
    if require_int("nhead_kv", nhead_kv) != 1:
        raise NotImplementedError(f"nhead_kv must be 1 (MLA has one latent KV head), got {nhead_kv!r}")
    sm_scale = (_DEFAULT_SM_SCALE if sm_scale is None
                else require_real("sm_scale", sm_scale, example="1/sqrt(576)", float32=True))
    if kv_buffer.shape[2] != 1:
        raise NotImplementedError(f"kv_buffer.shape[2] (KV heads) must be 1 (MLA has one latent KV head), "
                                  f"got {kv_buffer.shape[2]}")
    page_size = require_int("page_size", page_size)
    max_seqlen_q = require_int("max_seqlen_q", max_seqlen_q)
    if page_size != int(kv_buffer.shape[1]):
        raise ValueError(f"page_size={page_size} does not match kv_buffer.shape[1]={kv_buffer.shape[1]}")
    total_q, num_heads = int(q.shape[0]), int(q.shape[1])
    # Once per call: the variant (the plan's checks, the decode's checks and its launch use it)
    # and the work-list count (computed by the plan when there is one, else by the checks).
    params = decode_variant(num_heads, max_seqlen_q, page_size, q.dtype, kv_buffer.dtype,
                            tensor_names=("q", "kv_buffer"))
    # the checks that need no device, so that a call on CPU tensors reports them too
    if q.shape[2] != QK_HEAD_DIM or kv_buffer.shape[3] != QK_HEAD_DIM:
        raise ValueError(f"q and kv_buffer must end in {QK_HEAD_DIM} (512 latent + 64 RoPE dims), got "
                         f"q {tuple(q.shape)}, kv_buffer {tuple(kv_buffer.shape)}")
    # (_check_tensor against each tensor's own device: the device check comes after these, and
    # the layout checks with _validate's)
    for name, t, dtype, dim in (("o", o, torch.bfloat16, 3), ("qo_indptr", qo_indptr, torch.int32, 1),
                                ("kv_indptr", kv_indptr, torch.int32, 1),
                                ("kv_indices", kv_indices, torch.int32, 1),
                                ("kv_last_page_lens", kv_last_page_lens, torch.int32, 1)):
        _check_tensor(t, name, dtype, getattr(t, "device", None), dim=dim, contiguous=False)
    if tuple(o.shape) != (total_q, num_heads, V_HEAD_DIM):
        raise ValueError(f"o must be [{total_q}, {num_heads}, {V_HEAD_DIM}] (q's rows and heads, the V dim), "
                         f"got {tuple(o.shape)}")
    if not torch.compiler.is_compiling():   # (Dynamo cannot trace data_ptr(); the ops' bodies check)
        for name, t in (("q", q), ("kv_buffer", kv_buffer), ("o", o), ("logits", logits)):
            if isinstance(t, torch.Tensor):   # logits: optional; its other checks come with the plan's
                launch.check_aligned(t, name)
    _check_batch_layout(qo_indptr, kv_indptr, kv_last_page_lens)
    if final_lse is not None and not return_lse:
        raise ValueError("final_lse is given but return_lse is False: pass return_lse=True")
    _require_cuda("q", q)   # after the shape and dtype checks, which need no device
    device = q.device
    clusters = None

    if work_meta_data is None:
        # get_mla_metadata_info_v1 + get_mla_metadata_v1 with this call's work-list count (the
        # info's other checks hold by decode_variant: supported heads x qlen and dtypes).
        clusters = arch.num_clusters(num_heads, max_seqlen_q, device=device,
                                     kv_dtype=kernel_dtype_name(kv_buffer.dtype))
        info = metadata._buffer_specs(qo_indptr.numel() - 1, clusters)   # batch >= 1: checked above
        (work_meta_data, work_indptr, work_info_set, reduce_indptr, reduce_final_map,
         reduce_partial_map) = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in info]
        metadata._fill_schedule(
            qo_indptr, kv_indptr, kv_last_page_lens, num_heads, 1, work_meta_data,
            work_info_set, work_indptr, reduce_indptr, reduce_final_map, reduce_partial_map,
            page_size=page_size, kv_granularity=metadata.default_kv_granularity(page_size),
            max_seqlen_qo=max_seqlen_q, uni_seqlen_qo=max_seqlen_q, fast_mode=True, topk=-1,
            max_split_per_batch=-1, intra_batch_mode=False, dtype_q=q.dtype,
            dtype_kv=kv_buffer.dtype, num_clusters=clusters, own_buffers=True)
        key = None   # fresh plan buffers: nothing to keep
    else:
        for name, t in (("work_indptr", work_indptr), ("work_info_set", work_info_set),
                        ("reduce_indptr", reduce_indptr), ("reduce_final_map", reduce_final_map),
                        ("reduce_partial_map", reduce_partial_map)):
            if t is None:
                raise ValueError(f"{name} must be given with work_meta_data (persistent mode)")
        for name, t in (("reduce_indptr", reduce_indptr), ("reduce_final_map", reduce_final_map),
                        ("reduce_partial_map", reduce_partial_map)):
            _check_tensor(t, name, torch.int32, device)

    n_partial = int(reduce_partial_map.shape[0]) * max_seqlen_q
    split_shape = (n_partial, 1, num_heads, V_HEAD_DIM)
    if (logits is None) != (attn_lse is None):
        raise ValueError("logits and attn_lse must be given together (the split buffers), got "
                         f"logits={'a tensor' if logits is not None else None}, "
                         f"attn_lse={'a tensor' if attn_lse is not None else None}")
    given = logits is not None
    if given:
        for name, t, shape in (("logits", logits, split_shape),
                               ("attn_lse", attn_lse, (n_partial, 1, num_heads, 1))):
            _check_tensor(t, name, torch.float32, device)
            if tuple(t.shape) != shape:
                raise ValueError(f"{name} must be {list(shape)} (reduce_partial_map entries x "
                                 f"max_seqlen_q, 1, heads, ...), got {tuple(t.shape)}")
    else:
        logits = torch.empty(split_shape, dtype=torch.float32, device=device)
        attn_lse = torch.empty((n_partial, 1, num_heads, 1), dtype=torch.float32, device=device)
    if final_lse is not None:
        _check_tensor(final_lse, "final_lse", torch.float32, device)
        if tuple(final_lse.shape) != (total_q, num_heads):
            raise ValueError(f"final_lse must be [{total_q}, {num_heads}], got {tuple(final_lse.shape)}")
    lse_given = final_lse is not None
    if not lse_given and return_lse:
        final_lse = torch.empty((total_q, num_heads), dtype=torch.float32, device=device)

    if torch.compiler.is_compiling():   # the ops as graph nodes; their bodies run the eager path
        torch.ops.aiter_mla.hk_mla_decode_fwd(
            q, kv_buffer, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens, work_indptr,
            work_info_set, max_seqlen_q, float(sm_scale), logits, attn_lse, o, q_scale, kv_scale,
            final_lse)
        torch.ops.aiter_mla.mla_reduce_v1(logits, attn_lse, reduce_indptr, reduce_final_map,
                                          reduce_partial_map, max_seqlen_q, o, final_lse)
        return logits, final_lse
    p = _prepare(q, kv_buffer, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens, work_indptr,
                 work_info_set, max_seqlen_q, sm_scale, logits, attn_lse, o, q_scale, kv_scale,
                 final_lse, params, clusters)
    capturing = _capturing(device)
    if not capturing:
        reduce._check(logits, attn_lse, reduce_indptr, reduce_final_map, reduce_partial_map,
                      max_seqlen_q, o, final_lse)
    p.chain_reduce(reduce.prepare(logits, reduce_indptr, reduce_final_map, reduce_partial_map,
                                  max_seqlen_q, o, final_lse, ask_errors=False))
    if key is not None:   # a caller-made plan (a self-made one is fresh: the hint is about another)
        p.allow_fused(reduce_indptr, reduce_partial_map, (qo_indptr.numel() - 1) * (params["block_m"] // 64))
    _launch_first(p, q.data_ptr(), o.data_ptr(), None if final_lse is None else final_lse.data_ptr(),
                  logits.data_ptr(), attn_lse.data_ptr())
    if key is not None and not capturing:
        _prepared.put(key, p, (kv_buffer, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens,
                               work_indptr, work_info_set, q_scale, kv_scale,
                               logits if given else None, attn_lse if given else None,
                               final_lse if lse_given else None,
                               reduce_indptr, reduce_final_map, reduce_partial_map))
    return logits, final_lse
