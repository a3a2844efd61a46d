"""Split-KV work schedule: AITER's ``get_mla_metadata_info_v1`` / ``get_mla_metadata_v1``
(fast mode, v1_2 buffers and cost model), filled on the device by the JIT module
``mla_metadata``.

A *cluster* is AITER's term for one persistent work list (one entry of ``work_indptr``); the
count comes from :func:`aiter_mla.arch.num_clusters`, the same function the decode launch uses.
The schedule itself (position based: the cost line cut every ``delta`` blocks), its units and
this package's fixes are described in :mod:`aiter_mla.ops.metadata_reference` (the CPU
reference the kernel is tested against).

Proofs. B batches, C clusters, N <= C the clusters the payload is spread over; batch b costs
``c_b = blocks_b + OVH`` and occupies ``[P_b, P_b + c_b)`` on the cost line (overhead first,
then blocks), ``S = sum c_b``, ``delta >= ceil(S / N)`` (>= 1 when B >= 1, as S >= OVH):
``ceil(S / N)``, or aligned to uniform batches
(:func:`~aiter_mla.ops.metadata_reference.cost_line`); the proofs below use only
``S <= N * delta``. When uniform batches are spread over k = N // B clusters each, batch b
occupies ``[P_b, P_b + k delta)`` with ``P_b = b k delta`` (its overhead, its blocks, then
padding that no cut or piece uses), and S stands for the line's length ``B k delta <= N
delta``: the proofs hold as written, and each cluster then holds at most one work.
A piece starting at line position x (a cut, or ``P_b + OVH``) goes to cluster
``min(N - 1, x // delta)``.

*Buffer bounds* (why :func:`get_mla_metadata_info_v1` never under-sizes). A kept cut lies at a
multiple ``m * delta`` strictly inside one batch's block region; the regions are disjoint, so
each m is used at most once, and ``m * delta < S <= N * delta`` gives ``1 <= m <= N - 1``.
Hence cuts K <= N - 1, works = B + K <= B + N - 1, and reduce entries = K + (#split batches)
<= min(2K, K + B) <= min(2(N - 1), B + N - 1), which the sizes with C >= N cover. Zero-length
batches cost OVH and are never cut, so the bound holds for them too. Every piece lies on one
cluster < N (a cut m goes to cluster m <= N - 1), and a batch's pieces sit on consecutive
clusters: the piece ending at cut m starts in ``[(m - 1) delta, m delta)`` (at the previous
kept cut, which is ``(m - 1) delta`` as kept cuts are consecutive multiples, or at
``P_b + OVH``, the first multiple after which is m), so it is the last work of cluster m - 1.

*Cluster cost* (KV blocks + OVH per piece). Let ``tail = 0`` if max_seqlen_qo = 1, else
``ceil((floor((max_seqlen_qo - 2) / page_size) + 1) / kv_granularity)``: the most blocks
after a cut that leaves fewer than max_seqlen_qo tokens (its last page holds >= 1 token).
Then every cluster k costs <= ``delta + OVH + tail``, and <= ``delta + OVH`` (AITER's
payload when delta = ceil(S / N)) when the tail rule drops no cut. Proof: k's pieces start in ``[k delta, (k+1)
delta)`` (the last cluster: up to S <= N delta). Their line intervals are disjoint: a first
piece ``[P_b, end)``, a cut piece ``[m delta, end)`` plus OVH not on the line. Start: if k's
first piece starts at the cut ``k delta`` its interval starts there and it pays the one
off-line OVH (no overhead straddles ``k delta``, which lies inside a batch's blocks);
otherwise it is a batch's first piece with ``P_b + OVH >= k delta``, so the intervals start at
``>= k delta - OVH``. End: a piece of k running past ``(k+1) delta`` holds that point inside
its batch's block region (were it inside the overhead, the batch's first piece would start at
``>= (k+1) delta``), i.e. a candidate cut; kept, the piece would end there, so the tail rule
dropped it and the piece ends at its batch's end, < max_seqlen_qo tokens = <= tail blocks
later. So the line span is <= delta + OVH + tail (OVH counted once, on the line or off it).

Kernel cost: no serial walk; block-wide prefix sums over batches in tiles of blockDim (the
template's header comment).
"""
from __future__ import annotations

import ctypes
import functools
import weakref
from dataclasses import dataclass
from typing import Any

from .. import arch as _arch
from ..locks import ForkSafeLock
from ..scalars import require_bool
from . import launch
from .metadata_reference import (
    INT32_MAX,
    check_int,
    check_scalars,
    num_splits_for,
    overhead_blocks,
    reference_schedule,
    to_buffers,
)
from ..work_info import KERNEL_DTYPES, WORK_INFO_INTS, kernel_dtype_name

__all__ = [
    "default_kv_granularity",
    "max_works",
    "max_partial_entries",
    "get_mla_metadata_info_v1",
    "get_mla_metadata_v1",
    "PlanRecord",
    "lookup_plan",
]

def default_kv_granularity(page_size: int) -> int:
    """Pages per cost block for the decode op's plans: ``max(1, 64 // page_size)``.

    64 tokens is one KV tile of the decode kernel (block_n 64), so a cut never splits a tile
    and a piece's cost counts whole tiles. (AITER's test passes ``max(page_size, 16)``, which at
    page 64 is 4096 tokens per block: coarse splits.) Raises TypeError for a page size that is
    not a Python or NumPy int (bools, floats, strings and tensors included) and ValueError for
    one that is not a power of two. Page sizes past 256 are accepted here (one page per block); the decode op refuses
    them.
    """
    check_int("page_size", page_size)   # as every scalar of the scheduler's API
    if page_size < 1 or page_size & (page_size - 1):
        raise ValueError(f"page_size must be a power of two >= 1, got {page_size}")
    return max(1, 64 // page_size)


def _check_counts(batch_size, num_clusters) -> None:
    # get_mla_metadata_info_v1 allows 0 batches (empty buffers); a schedule has >= 1 work list
    check_int("batch_size", batch_size)
    check_int("num_clusters", num_clusters)
    if batch_size < 0:
        raise ValueError(f"batch_size must be >= 0, got {batch_size}")
    if num_clusters < 1:
        raise ValueError(f"num_clusters must be >= 1, got {num_clusters}")


def max_works(batch_size: int, num_clusters: int) -> int:
    """Most work records any schedule of ``batch_size`` batches over ``num_clusters`` clusters
    can have: ``B + C - 1`` (module docstring has the proof).

    Raises TypeError when either is not a Python or NumPy int (bools, floats, strings and
    tensors included) and ValueError for ``batch_size < 0`` or ``num_clusters < 1``."""
    _check_counts(batch_size, num_clusters)
    return _max_works(batch_size, num_clusters)


def _max_works(batch_size: int, num_clusters: int) -> int:
    # max_works without its checks, for the scheduler's own calls (checked ints; per step);
    # 0 for an empty plan of 0 splits
    return max(0, batch_size + num_clusters - 1)


def max_partial_entries(batch_size: int, num_clusters: int) -> int:
    """Most ``reduce_partial_map`` entries (= split pieces): ``min(B + C - 1, 2 (C - 1))``.

    Raises TypeError when either is not a Python or NumPy int (bools, floats, strings and
    tensors included) and ValueError for ``batch_size < 0`` or ``num_clusters < 1``."""
    _check_counts(batch_size, num_clusters)
    return _max_partial_entries(batch_size, num_clusters)


def _max_partial_entries(batch_size: int, num_clusters: int) -> int:
    # max_partial_entries without its checks, for the scheduler's own calls
    return max(0, min(batch_size + num_clusters - 1, 2 * (num_clusters - 1)))


def _unsupported_modes(*, is_sparse: bool, fast_mode: bool, intra_batch_mode: bool) -> None:
    # bools only (Python or NumPy): 'no' or None would read as a mode the caller did not ask for
    for name, value in (("is_sparse", is_sparse), ("fast_mode", fast_mode),
                        ("intra_batch_mode", intra_batch_mode)):
        require_bool(name, value)
    if is_sparse:
        raise NotImplementedError("sparse MLA (is_sparse / topk >= 0) is not supported yet")
    if intra_batch_mode:
        raise NotImplementedError("intra_batch_mode (AITER v1_0) is not supported yet")
    if not fast_mode:
        raise NotImplementedError("fast_mode=False (AITER v1_1 scheduler) is not supported; "
                                  "use fast_mode=True")


@functools.lru_cache(maxsize=None)
def _kernel_dtypes() -> frozenset:
    import torch

    return frozenset(getattr(torch, name) for name in KERNEL_DTYPES)


def _check_dtype_args(**dtypes) -> None:
    """Each given dtype is None or one the decode kernels take (``work_info.KERNEL_DTYPES``,
    the dtypes of ``decode.SUPPORTED_DTYPES``): TypeError for a non-dtype, ValueError otherwise.
    A pair the decode does not take (fp8 with bf16) passes: AITER's callers plan bf16 q with fp8
    KV, the plan follows the KV's dtype (``_plan_dtype``), and the decode refuses the pair."""
    import torch

    for name, dtype in dtypes.items():
        if dtype is None:
            continue
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"{name} must be a torch.dtype (e.g. torch.float8_e4m3fn or "
                            f"torch.bfloat16) or None, got {type(dtype).__name__} {dtype!r}")
        if dtype not in _kernel_dtypes():
            raise ValueError(f"{name} must be torch.float8_e4m3fn or torch.bfloat16 (the dtypes "
                             f"the decode kernels take) or None, got {dtype}")


def get_mla_metadata_info_v1(batch_size, max_seqlen_qo, num_head_qo, q_dtype, kv_dtype,
                             is_sparse=False, fast_mode=True, num_kv_splits=32,
                             intra_batch_mode=False):
    """Shapes and dtypes of the six schedule buffers, in AITER's order (allocate each with
    ``torch.empty(shape, dtype=dtype, device=...)``):

    0. ``work_metadata_ptrs`` (2,) uint64
    1. ``work_indptr`` (C + 1,) int32
    2. ``work_info_set`` (B + C - 1, 8) int32
    3. ``reduce_indptr`` (B + 1,) int32
    4. ``reduce_final_map`` (B, 2) int32
    5. ``reduce_partial_map`` (min(B + C - 1, 2 (C - 1)),) int32

    B = ``batch_size`` (the most batches the buffers will be planned for), C =
    :func:`aiter_mla.arch.num_clusters` (num_CU x occupancy / CTAs per work; ``CU_NUM`` overrides num_CU).
    One qo tile per batch, of ``num_head_qo * max_seqlen_qo`` <= 2048 rows (``arch.MAX_ROWS``;
    the decode runs a tile's 64-row blocks side by side, so C counts them). The decode op's
    partial buffers need ``entries * max_seqlen_qo`` token rows. ``num_kv_splits`` does not
    change the sizes; ``q_dtype`` and ``kv_dtype`` change them only at <= 32 rows (heads x q
    length): bf16 plans one work list per multiprocessor there, fp8 two (``arch.occupancy``; the KV's
    dtype decides, else q's, and with neither, fp8's count), so plan with the dtypes the decode
    will run (``get_mla_metadata_v1``'s ``dtype_q`` / ``dtype_kv``); a plan for the other count
    is refused by the decode by name (``work_indptr``'s length).

    Source: AITER ``aiter/ops/attention.py`` (fast mode); the bounds are proven in this module's
    docstring and tighter than AITER's only where AITER over-counts qo tiles.
    Raises NotImplementedError for ``is_sparse``, ``intra_batch_mode``, ``fast_mode=False`` or
    more than 128 heads or a q length over 16 (so more than 2048 rows a tile); ValueError for a negative batch size, one whose work indices
    would not fit int32, non-positive lengths, or a dtype no decode kernel takes (TypeError
    for a non-dtype); RuntimeError when no GPU is visible and ``CU_NUM`` is unset. Each dtype is
    checked alone: a pair no decode kernel takes (fp8 q with bf16 KV) passes, as in AITER, since
    the sizes do not depend on it; ``mla_decode_fwd`` refuses such a pair. The shapes hold
    Python ints (a numpy integer ``batch_size`` is converted).
    """
    _unsupported_modes(is_sparse=is_sparse, fast_mode=fast_mode,
                       intra_batch_mode=intra_batch_mode)
    check_int("batch_size", batch_size)
    check_int("num_kv_splits", num_kv_splits)   # unused for the sizes, but AITER's is an int >= 1
    if num_kv_splits < 1:
        raise ValueError(f"num_kv_splits must be >= 1, got {num_kv_splits}")
    _check_dtype_args(q_dtype=q_dtype, kv_dtype=kv_dtype)
    if batch_size < 0:
        raise ValueError(f"batch_size must be >= 0, got {batch_size}")
    batch_size = int(batch_size)   # numpy integers pass check_int; the shapes hold Python ints
    if batch_size > INT32_MAX:   # past int32 whatever the work-list count: said before asking for it
        raise ValueError(f"batch_size must be <= {INT32_MAX} (int32 work indices), got {batch_size}")
    check_scalars(num_heads=num_head_qo, num_clusters=1, page_size=1, kv_granularity=1,
                  max_seqlen_qo=max_seqlen_qo, max_split_per_batch=-1, names={"num_heads": "num_head_qo"})
    return _buffer_specs(batch_size, _arch.num_clusters(num_head_qo, max_seqlen_qo,
                                                        kv_dtype=_plan_dtype(q_dtype, kv_dtype)))


def _plan_dtype(q_dtype, kv_dtype) -> str | None:
    """The decode dtype a plan is for (``"fp8"`` / ``"bf16"``: the work-list count of the
    shapes of at most 32 rows depends on it, ``arch.occupancy``): the KV's, else q's, else
    None (fp8's count)."""
    return kernel_dtype_name(kv_dtype if kv_dtype is not None else q_dtype) if (
        kv_dtype is not None or q_dtype is not None) else None


def _buffer_specs(batch_size: int, nc: int) -> list:
    """The six (shape, dtype) pairs for ``batch_size`` (an int >= 0) batches over ``nc`` work
    lists; ValueError when the work indices would not fit int32. The decode op plans through
    this with the work-list count it computed once per call."""
    import torch

    if _max_works(batch_size, nc) > INT32_MAX:
        # work and reduce-entry indices are int32 in every buffer and kernel
        raise ValueError(f"batch_size must be <= {INT32_MAX - nc + 1} (int32 work indices with "
                         f"{nc} work lists), got {batch_size}")
    return [
        ((2,), torch.uint64),
        ((nc + 1,), torch.int32),
        ((_max_works(batch_size, nc), WORK_INFO_INTS), torch.int32),
        ((batch_size + 1,), torch.int32),
        ((batch_size, 2), torch.int32),
        ((_max_partial_entries(batch_size, nc),), torch.int32),
    ]


# ---------------------------------------------------------------------------------------------
# Plan records: what each filled work_info_set was planned for, so the decode op can check it.

@dataclass(frozen=True)
class PlanRecord:
    """The shape a schedule was planned for (recorded by :func:`get_mla_metadata_v1`, on the
    device and on the CPU). ``num_heads`` = q heads per KV head; dtypes as given, None when not
    (the plan then has fp8's work-list count, :func:`get_mla_metadata_info_v1`)."""
    num_heads: int
    num_heads_k: int
    max_seqlen_qo: int
    page_size: int
    kv_granularity: int
    batch_size: int
    num_clusters: int
    num_splits: int
    dtype_q: Any
    dtype_kv: Any
    work_indptr_ptr: int


_plans: dict[tuple, tuple] = {}
_plans_lock = ForkSafeLock()
_PLANS_PURGE_AT = 256


def _plan_key(t) -> tuple:
    return (t.device.type, t.device.index, t.data_ptr())


def _record_plan(work_info_set, work_indptr, **fields) -> PlanRecord:
    rec = PlanRecord(work_indptr_ptr=work_indptr.data_ptr(), **fields)
    key = _plan_key(work_info_set)
    with _plans_lock:
        if len(_plans) >= _PLANS_PURGE_AT:
            for k in [k for k, (ref, _) in _plans.items() if ref() is None]:
                del _plans[k]
        _plans[key] = (weakref.ref(work_info_set), rec)
    return rec


def lookup_plan(work_info_set) -> PlanRecord | None:
    """The :class:`PlanRecord` of the last schedule written into ``work_info_set`` (a
    torch.Tensor; matched by device and data pointer, while the tensor object that was filled
    is alive), else None.

    Raises TypeError when ``work_info_set`` is not a torch.Tensor."""
    import torch

    if not isinstance(work_info_set, torch.Tensor):
        raise TypeError(f"work_info_set must be a torch.Tensor, got {type(work_info_set).__name__}")
    entry = _plans.get(_plan_key(work_info_set))
    if entry is None or entry[0]() is None:
        return None
    return entry[1]


# ---------------------------------------------------------------------------------------------
# get_mla_metadata_v1

def _check_int32_vector(t, name: str, device) -> None:
    import torch

    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise TypeError(f"{name} must have dtype torch.int32, got {t.dtype}")   # as the decode op
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
    if t.numel() > 1 and t.stride(0) != 1:
        raise ValueError(f"{name} must have unit stride, got stride {t.stride(0)}")
    if t.device != device:
        raise ValueError(f"{name} must be on {device}, got {t.device}")


def _check_buffer(t, name: str, dtype, min_rows: int, cols: int | None, device,
                  sizing=lambda: "batch_size >= the batch count") -> None:
    """``sizing()``: the allocation hint of the too-few-rows message."""
    import torch

    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype}, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name} must be on {device}, got {t.device}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got shape {tuple(t.shape)} and stride {t.stride()}")
    if cols is None:
        if t.dim() != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
    elif t.dim() != 2 or t.shape[1] != cols:
        raise ValueError(f"{name} must have shape (rows, {cols}), got {tuple(t.shape)}")
    if t.shape[0] < min_rows:
        raise ValueError(
            f"{name} has {t.shape[0]} {'elements' if cols is None else 'rows'}; this input needs >= {min_rows} "
            f"(allocate it from get_mla_metadata_info_v1 with {sizing()})")


def _byte_span(t) -> tuple[int, int]:
    """The bytes [start, end) a tensor's elements occupy (empty: start == end)."""
    if t.numel() == 0:
        return t.data_ptr(), t.data_ptr()
    last = sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


def _check_disjoint(outputs, inputs) -> None:
    """Raises ValueError naming the first output buffer that shares bytes with another output or
    with an input: the scheduler writes them in turn, so one would overwrite another and the
    plan would be silently wrong (a work_indptr passed again as reduce_indptr was). Inputs may
    share memory with each other (they are only read). The spans are sorted once, so a clash
    is always between neighbours or within a run of overlapping spans."""
    n_out = len(outputs)
    spans = sorted((*_byte_span(t), i, name) for i, (name, t) in enumerate(list(outputs) + list(inputs)))
    reach, holder = -1, None   # the furthest end so far and whose span it is
    for start, end, i, name in spans:
        if start == end:
            continue   # empty: no bytes
        if holder is not None and start < reach and (i < n_out or holder[0] < n_out):
            a, b = (holder[1], name) if holder[0] < i else (name, holder[1])
            raise ValueError(f"{a} and {b} must not share memory, got overlapping bytes "
                             f"ending at {reach:#x} and starting at {start:#x}: each output buffer "
                             f"needs its own allocation (get_mla_metadata_info_v1)")
        if end > reach:
            reach, holder = end, (i, name)


_vp, _i64, _i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int

#: ``aiter_mla_get_metadata_v1`` of templates/mla_metadata.cu.j2: a ``MetadataArgs`` pointer
#: (``fixed``: the buffers, their capacities, then B, C, N, page size, G, OVH, tail threshold,
#: device; filled once per buffer set), then the stream.
SIGNATURE = launch.Signature("aiter_mla_get_metadata_v1", (("stream", _vp),), fixed=(
    ("qo_indptr", _vp), ("kv_indptr", _vp), ("kv_last_page_lens", _vp),
    ("work_metadata_ptrs", _vp), ("work_indptr", _vp), ("work_info_set", _vp),
    ("reduce_indptr", _vp), ("reduce_final_map", _vp), ("reduce_partial_map", _vp),
    ("cap_work_indptr", _i64), ("cap_works", _i64), ("cap_reduce_indptr", _i64),
    ("cap_final_map", _i64), ("cap_partial_map", _i64),
    ("num_batches", _i32), ("num_clusters", _i32), ("num_splits", _i32), ("page_size", _i32),
    ("kv_granularity", _i32), ("overhead", _i32), ("tail_threshold", _i32),
    ("device", _i32), ("error_record", _vp), ("split_heavy_tiles", _vp)))


def _metadata_module(_key, device_index: int):
    from ..jit import get_module

    return get_module("mla_metadata", arch=launch.device_arch(device_index))


_entry_points = launch.EntryPoints(SIGNATURE, _metadata_module)   # one variant per device
_prepared = launch.IdentityCache()   # checked launches (Prepared) by buffers and arguments


def get_mla_metadata_v1(seqlens_qo_indptr, seqlens_kv_indptr, kv_last_page_lens,
                        num_heads_per_head_k, num_heads_k, is_causal, work_metadata_ptrs,
                        work_info_set, work_indptr, reduce_indptr, reduce_final_map,
                        reduce_partial_map, page_size=1, kv_granularity=16, max_seqlen_qo=-1,
                        uni_seqlen_qo=-1, fast_mode=True, topk=-1, max_split_per_batch=-1,
                        intra_batch_mode=False, dtype_q=None, dtype_kv=None) -> None:
    """Fill the six schedule buffers in place (AITER's argument order: ``work_info_set``
    before ``work_indptr``).

    Inputs (int32, unit stride, one device): ``seqlens_qo_indptr`` [B+1] (q tokens; ragged
    lengths allowed, each in [1, max_seqlen_qo]), ``seqlens_kv_indptr`` [B+1] (**pages**,
    non-decreasing; values must fit int32, so at page_size 1 the
    total KV is < 2**31 tokens), ``kv_last_page_lens`` [>=B] (tokens in each non-empty batch's
    last page, 1..page_size: so 1 at page size 1, where the schedule does not read them; the
    decode kernel checks them at every page size). Both indptrs may start past 0 here (as
    AITER: the work records hold absolute offsets), but the decode op needs them to start at
    0 (and qo_indptr to end at total_q); it reads these same tensors. ``page_size``: a power of two (the decode supports 1..256).
    ``kv_granularity``: pages per cost block (power of two; the decode op passes
    :func:`default_kv_granularity`). ``max_split_per_batch``: as AITER, a cap on the *total*
    split count, ``min(work lists, max_split_per_batch x B)`` (not per batch: at 1, one long
    batch among short ones is still cut into several pieces); negative (the default) for no cap. ``max_seqlen_qo`` (or ``uni_seqlen_qo`` when it is -1)
    must be given: reading it from ``qo_indptr`` would need a host sync. ``is_causal`` (a bool) is
    accepted and unused (as in AITER's v1_2): the decode's mask follows the q length (causal
    above 1, :func:`aiter_mla.ops.decode.mla_decode_fwd`), whatever it says. ``dtype_q``/``dtype_kv`` set the work-list count at <= 32 rows (bf16: one list per
    multiprocessor, fp8 or None: two; ``get_mla_metadata_info_v1``'s note), nothing else.

    On a CUDA device: one launch of the JIT kernel on the current stream; no host
    synchronisation, so it can be captured in a CUDA graph. The host checks only shapes,
    dtypes and devices, once per buffer set (a warm call with the same buffers and arguments is
    a lookup and the launch). Input *values* are not validated by this kernel: invalid values
    give an invalid schedule, but the kernel never writes outside the buffers, and the decode
    kernel that reads the same tensors checks them and reports the first bad one
    (:mod:`aiter_mla.ops.errors`); :func:`aiter_mla.ops.metadata_reference.validate_inputs`
    checks them on the host. On CPU tensors the reference scheduler fills the buffers (and does
    validate values).

    Writes: ``work_metadata_ptrs[:2] = (&work_indptr, &work_info_set)``; all of ``work_indptr``
    (entries past C repeat the work count) and ``reduce_indptr`` (entries past B repeat the
    entry count); the used rows of ``work_info_set`` (padding field 0);
    ``reduce_final_map[:B]`` (every tile, split or not); the used entries of
    ``reduce_partial_map``. Records a :class:`PlanRecord` for :func:`lookup_plan`.

    Source: AITER ``get_mla_metadata_v1`` -> ``get_mla_metadata_v1_2_device`` (PR #3072):
    its buffers, units and cost model; the cluster assignment is position based instead of
    AITER's serial greedy, with the fixes listed in :mod:`aiter_mla.ops.metadata_reference`.

    Raises :class:`aiter_mla.ops.errors.DeviceIndexError` (a ValueError) for a bad index value
    an earlier decode kernel found on this device (before this call launches anything);
    NotImplementedError for ``topk >= 0``, ``intra_batch_mode``, ``fast_mode=False``,
    ``num_heads_k != 1``, ``num_heads_per_head_k > 128`` or ``max_seqlen_qo > 16``; ValueError /
    TypeError for bad arguments (named, with expected and actual values), buffers too small
    for this input (at <= 32 rows their sizes depend on ``dtype_q`` / ``dtype_kv``: allocate
    them from ``get_mla_metadata_info_v1`` with ``q_dtype`` / ``kv_dtype`` equal to this call's
    ``dtype_q`` / ``dtype_kv``), or output buffers that share memory with each other or an input; RuntimeError
    when the cluster count cannot be known (CPU tensors, no visible GPU and ``CU_NUM`` unset) or
    the launch fails, and on CUDA the JIT errors of :func:`aiter_mla.jit.get_module` on a
    variant's first use in a process (all RuntimeError subclasses: ToolchainError, BuildError,
    CacheError (CacheNotWritableError and LockTimeoutError among them), JitDisabledError,
    ModuleLoadError).
    """
    if type(is_causal) is not bool:   # unused, but a string such as 'no' is a caller's bug
        require_bool("is_causal", is_causal)
    # Warm: the same buffers (by object and data pointer) and arguments as a checked call
    # before: one lookup, the launch (whose entry point asks the error record first:
    # launch.fail raises what it held), the plan record again (launch.IdentityCache).
    try:
        key = (id(seqlens_qo_indptr), seqlens_qo_indptr.data_ptr(), id(seqlens_kv_indptr),
               seqlens_kv_indptr.data_ptr(), id(kv_last_page_lens), kv_last_page_lens.data_ptr(),
               id(work_metadata_ptrs), work_metadata_ptrs.data_ptr(), id(work_info_set),
               work_info_set.data_ptr(), id(work_indptr), work_indptr.data_ptr(),
               id(reduce_indptr), reduce_indptr.data_ptr(), id(reduce_final_map),
               reduce_final_map.data_ptr(), id(reduce_partial_map), reduce_partial_map.data_ptr(),
               num_heads_per_head_k, num_heads_k, page_size, kv_granularity, max_seqlen_qo,
               uni_seqlen_qo, fast_mode, topk, max_split_per_batch, intra_batch_mode, dtype_q,
               dtype_kv)
        warm = _prepared.entries.get(key)
    except (AttributeError, TypeError):   # a non-tensor, or an unhashable argument
        key = warm = None
    if warm is not None:
        rc = warm.fn(warm.addr, launch.raw_stream(warm.index))
        if rc != 0:
            launch.fail(rc, warm.module, "mla_metadata kernel launch", warm.sink)
        _plans[warm.plan_key] = warm.plan
        return
    _fill_schedule(seqlens_qo_indptr, seqlens_kv_indptr, kv_last_page_lens,
                   num_heads_per_head_k, num_heads_k, work_metadata_ptrs, work_info_set,
                   work_indptr, reduce_indptr, reduce_final_map, reduce_partial_map, page_size,
                   kv_granularity, max_seqlen_qo, uni_seqlen_qo, fast_mode, topk,
                   max_split_per_batch, intra_batch_mode, dtype_q, dtype_kv, key=key)


def _fill_schedule(seqlens_qo_indptr, seqlens_kv_indptr, kv_last_page_lens, num_heads_per_head_k,
                   num_heads_k, work_metadata_ptrs, work_info_set, work_indptr, reduce_indptr,
                   reduce_final_map, reduce_partial_map, page_size, kv_granularity,
                   max_seqlen_qo, uni_seqlen_qo, fast_mode, topk, max_split_per_batch,
                   intra_batch_mode, dtype_q, dtype_kv, num_clusters=None, key=None,
                   own_buffers=False) -> None:
    """:func:`get_mla_metadata_v1`'s checked work (its argument order less ``is_causal``);
    ``num_clusters``: the work-list count when the caller has it (the decode op computes it
    once per call), else ``arch.num_clusters`` of the heads, q length and device. ``key``: the
    public op's warm-path key, under which the checked launch is kept (None: not kept).
    ``own_buffers``: the outputs were just allocated by the caller (the decode op's own plan),
    so they cannot overlap anything and the overlap check (~15 µs of host time) is skipped."""
    import torch

    for name, value in (("topk", topk), ("max_seqlen_qo", max_seqlen_qo), ("uni_seqlen_qo", uni_seqlen_qo)):
        if value is not None:   # before they are compared: '1' < 0 would be an unnamed TypeError
            check_int(name, value)
    _unsupported_modes(is_sparse=bool(topk is not None and topk >= 0), fast_mode=fast_mode,
                       intra_batch_mode=intra_batch_mode)
    _check_dtype_args(dtype_q=dtype_q, dtype_kv=dtype_kv)
    if max_seqlen_qo is None or max_seqlen_qo <= 0:
        if uni_seqlen_qo is None or uni_seqlen_qo <= 0:
            raise ValueError(
                "max_seqlen_qo (or uni_seqlen_qo) must be given as a positive int; reading it "
                "from seqlens_qo_indptr would need a host synchronisation; got max_seqlen_qo="
                f"{max_seqlen_qo!r}, uni_seqlen_qo={uni_seqlen_qo!r}")
        check_int("uni_seqlen_qo", uni_seqlen_qo)
        max_seqlen_qo = uni_seqlen_qo
    elif uni_seqlen_qo is not None and uni_seqlen_qo > 0 and uni_seqlen_qo != max_seqlen_qo:
        raise ValueError(f"uni_seqlen_qo={uni_seqlen_qo} (uniform q length) must equal "
                         f"max_seqlen_qo={max_seqlen_qo}")
    check_int("max_seqlen_qo", max_seqlen_qo)
    check_int("num_heads_per_head_k", num_heads_per_head_k)   # before num_clusters, which says num_heads
    if num_heads_per_head_k < 1:
        raise ValueError(f"num_heads_per_head_k must be >= 1, got {num_heads_per_head_k}")
    check_int("num_heads_k", num_heads_k)
    if num_heads_k < 1:
        raise ValueError(f"num_heads_k must be >= 1, got {num_heads_k}")
    if num_heads_k != 1:   # AITER divides the clusters by it; the decode op would refuse the plan
        raise NotImplementedError(f"num_heads_k must be 1 (MLA has one KV head; the decode kernels "
                                  f"take no other), got {num_heads_k}")
    if not isinstance(seqlens_kv_indptr, torch.Tensor):
        raise TypeError(f"seqlens_kv_indptr must be a torch.Tensor, got "
                        f"{type(seqlens_kv_indptr).__name__}")
    device = seqlens_kv_indptr.device
    if device.type not in ("cuda", "cpu"):   # the device every other tensor is held to: say so first
        raise ValueError(f"seqlens_kv_indptr must be on a CUDA device or the CPU, got {device}")
    _check_int32_vector(seqlens_kv_indptr, "seqlens_kv_indptr", device)
    _check_int32_vector(seqlens_qo_indptr, "seqlens_qo_indptr", device)
    _check_int32_vector(kv_last_page_lens, "kv_last_page_lens", device)
    nb = seqlens_kv_indptr.numel() - 1
    if nb < 0:
        raise ValueError("seqlens_kv_indptr must have num_batches + 1 >= 1 entries, got 0")
    if seqlens_qo_indptr.numel() != nb + 1:
        # Both give the batch count; name both, the caller knows which one is wrong.
        raise ValueError(f"seqlens_qo_indptr and seqlens_kv_indptr must have the same length "
                         f"(num_batches + 1), got {seqlens_qo_indptr.numel()} and {nb + 1}")
    if kv_last_page_lens.numel() < nb:
        raise ValueError(f"kv_last_page_lens must have >= {nb} entries, got "
                         f"{kv_last_page_lens.numel()}")

    num_heads = num_heads_per_head_k * num_heads_k
    # checked by the arguments' names before the cluster count is asked (it refuses the same shapes)
    check_scalars(num_heads=num_heads_per_head_k, num_clusters=1 if num_clusters is None else num_clusters,
                  page_size=page_size, kv_granularity=kv_granularity, max_seqlen_qo=max_seqlen_qo,
                  max_split_per_batch=max_split_per_batch, names={"num_heads": "num_heads_per_head_k"})
    nc = num_clusters if num_clusters is not None else _arch.num_clusters(
        num_heads, max_seqlen_qo, num_heads_k, device=device if device.type == "cuda" else None,
        kv_dtype=_plan_dtype(dtype_q, dtype_kv))
    nsplit = num_splits_for(nc, max_split_per_batch, nb)

    def sizing(lists: bool = True) -> str:
        # The sizes follow the batch count and (``lists``) the work-list count, which the heads,
        # the q length, the device (or CU_NUM) and, at <= 32 rows, the dtypes decide: the hint
        # names what this call used (built only for an error message).
        text = f"batch_size >= {nb}, num_head_qo = {num_heads}, max_seqlen_qo = {max_seqlen_qo}"
        if not lists:
            return text
        text += f"; this call has {nc} work lists from the heads, q length and device / CU_NUM"
        if num_heads * max_seqlen_qo <= 32:
            planned = _plan_dtype(dtype_q, dtype_kv) or "fp8, no dtype given"
            text += (f" and, at <= 32 rows, the dtypes: it planned for dtype_q = {dtype_q}, "
                     f"dtype_kv = {dtype_kv} ({planned}; fp8 plans two work lists per "
                     f"multiprocessor, bf16 one), so give get_mla_metadata_info_v1 q_dtype / "
                     f"kv_dtype equal to this call's dtype_q / dtype_kv")
        return text

    _check_buffer(work_metadata_ptrs, "work_metadata_ptrs", torch.uint64, 2, None, device,
                  lambda: "any arguments: it always has 2 entries")
    _check_buffer(work_indptr, "work_indptr", torch.int32, nc + 1, None, device, sizing)
    _check_buffer(work_info_set, "work_info_set", torch.int32, _max_works(nb, nsplit),
                  WORK_INFO_INTS, device, sizing)
    _check_buffer(reduce_indptr, "reduce_indptr", torch.int32, nb + 1, None, device, lambda: sizing(False))
    _check_buffer(reduce_final_map, "reduce_final_map", torch.int32, nb, 2, device, lambda: sizing(False))
    _check_buffer(reduce_partial_map, "reduce_partial_map", torch.int32,
                  _max_partial_entries(nb, nsplit), None, device, sizing)
    if not own_buffers:
        _check_disjoint((("work_metadata_ptrs", work_metadata_ptrs), ("work_indptr", work_indptr),
                         ("work_info_set", work_info_set), ("reduce_indptr", reduce_indptr),
                         ("reduce_final_map", reduce_final_map), ("reduce_partial_map", reduce_partial_map)),
                        (("seqlens_qo_indptr", seqlens_qo_indptr), ("seqlens_kv_indptr", seqlens_kv_indptr),
                         ("kv_last_page_lens", kv_last_page_lens)))

    prepared = None
    if device.type == "cuda":
        prepared = _prepare(device, seqlens_qo_indptr, seqlens_kv_indptr, kv_last_page_lens,
                            work_metadata_ptrs, work_info_set, work_indptr, reduce_indptr,
                            reduce_final_map, reduce_partial_map, nb=nb, nc=nc, nsplit=nsplit,
                            page_size=page_size, kv_granularity=kv_granularity,
                            max_seqlen_qo=max_seqlen_qo)
        prepared.launch()
    elif device.type == "cpu":
        sched = reference_schedule(
            seqlens_qo_indptr, seqlens_kv_indptr, kv_last_page_lens,
            num_heads=num_heads_per_head_k, num_clusters=nc, page_size=page_size,
            kv_granularity=kv_granularity, max_seqlen_qo=max_seqlen_qo,
            max_split_per_batch=max_split_per_batch,
            names=("seqlens_qo_indptr", "seqlens_kv_indptr"))
        to_buffers(sched, (work_metadata_ptrs, work_indptr, work_info_set, reduce_indptr,
                           reduce_final_map, reduce_partial_map))
    else:
        raise ValueError(f"tensors must be on a CUDA device or the CPU, got {device}")

    _record_plan(work_info_set, work_indptr, num_heads=num_heads_per_head_k,
                 num_heads_k=num_heads_k, max_seqlen_qo=max_seqlen_qo, page_size=page_size,
                 kv_granularity=kv_granularity, batch_size=nb, num_clusters=nc,
                 num_splits=nsplit, dtype_q=dtype_q, dtype_kv=dtype_kv)
    if prepared is not None and key is not None and not torch.cuda.is_current_stream_capturing():
        prepared.plan_key = _plan_key(work_info_set)
        prepared.plan = _plans[prepared.plan_key]
        _prepared.put(key, prepared, (seqlens_qo_indptr, seqlens_kv_indptr, kv_last_page_lens,
                                      work_metadata_ptrs, work_info_set, work_indptr,
                                      reduce_indptr, reduce_final_map, reduce_partial_map))


class Prepared:
    """A checked metadata launch: the loaded entry point, its filled ``MetadataArgs``, the
    device's error record, and the plan record it writes (re-recorded on every warm call, the
    same object, so that the decode op's warm path sees an unchanged plan)."""

    __slots__ = ("module", "fn", "args", "addr", "index", "sink", "plan_key", "plan")

    def launch(self) -> None:
        rc = self.fn(self.addr, launch.raw_stream(self.index))
        if rc != 0:
            launch.fail(rc, self.module, "mla_metadata kernel launch", self.sink)


def _prepare(device, qo_indptr, kv_indptr, kv_last_page_lens, work_metadata_ptrs, work_info_set,
             work_indptr, reduce_indptr, reduce_final_map, reduce_partial_map, *, nb, nc, nsplit,
             page_size, kv_granularity, max_seqlen_qo) -> Prepared:
    from . import errors

    if device.index is not None:
        index = device.index
    else:
        import torch

        index = torch.cuda.current_device()
    p = Prepared()
    p.module, p.fn = _entry_points.get(None, index)
    p.index, p.sink = index, errors.sink(index)
    p.args = SIGNATURE.pack(
        qo_indptr=qo_indptr.data_ptr(), kv_indptr=kv_indptr.data_ptr(),
        kv_last_page_lens=kv_last_page_lens.data_ptr(),
        work_metadata_ptrs=work_metadata_ptrs.data_ptr(), work_indptr=work_indptr.data_ptr(),
        work_info_set=work_info_set.data_ptr(), reduce_indptr=reduce_indptr.data_ptr(),
        reduce_final_map=reduce_final_map.data_ptr(),
        reduce_partial_map=reduce_partial_map.data_ptr(), cap_work_indptr=work_indptr.numel(),
        cap_works=work_info_set.shape[0], cap_reduce_indptr=reduce_indptr.numel(),
        cap_final_map=reduce_final_map.shape[0], cap_partial_map=reduce_partial_map.numel(),
        num_batches=nb, num_clusters=nc, num_splits=nsplit, page_size=page_size,
        kv_granularity=kv_granularity, overhead=overhead_blocks(page_size),
        tail_threshold=max_seqlen_qo, device=index, error_record=p.sink.record_ptr,
        split_heavy_tiles=p.sink.split_heavy_tiles_ptr)
    p.addr = ctypes.addressof(p.args)
    return p
