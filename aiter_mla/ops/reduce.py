"""``mla_reduce_v1``: merge split-KV partial outputs by LSE (AITER ``aiter.mla_reduce_v1``).

The eager path is one ctypes call into the ``mla_reduce`` module (templates/mla_reduce.cu.j2),
launched on torch's current stream with no host sync, so it can be captured in a CUDA graph.
The same launch is registered as the torch custom op ``aiter_mla::mla_reduce_v1`` (mutating
``final_output``/``final_lse``, with a fake implementation) for ``torch.compile``.
"""
from __future__ import annotations

import ctypes
import operator
from typing import Optional

import torch

from ..arch import V_HEAD_DIM
from ..scalars import require_int
from . import errors, launch
from .launch import raw_stream

__all__ = ["mla_reduce_v1"]

_P, _I64, _I32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32

#: ``aiter_mla_reduce_v1`` of templates/mla_reduce.cu.j2: a ``ReduceArgs`` pointer (``fixed``,
#: filled once per schedule and output layout), then the per-call buffers and the stream.
SIGNATURE = launch.Signature("aiter_mla_reduce_v1", (
    ("partial_output", _P), ("partial_lse", _P), ("final_output", _P), ("final_lse", _P),
    ("stream", _P)), fixed=(
    ("reduce_indptr", _P), ("reduce_final_map", _P), ("reduce_partial_map", _P),
    ("out_stride_s", _I64), ("out_stride_h", _I64), ("out_stride_d", _I64),
    ("lse_stride_s", _I64), ("lse_stride_h", _I64), ("num_partial_rows", _I64),
    ("partial_map_len", _I64), ("total_q", _I32), ("num_heads", _I32), ("num_tiles", _I32),
    ("max_seqlen_q", _I32), ("device", _I32), ("error_record", _P)))


def _reduce_module(_key, device_index: int):
    from ..jit import get_module

    return get_module("mla_reduce", arch=launch.device_arch(device_index), out_dtype="bf16")


_entry_points = launch.EntryPoints(SIGNATURE, _reduce_module)   # one variant per device
_INT32_MAX = 2**31 - 1


def _fail(name: str, expected: str, actual) -> None:
    raise ValueError(f"mla_reduce_v1: {name} must be {expected}, got {actual}")


def _check_tensor(t, name: str, dtype, device, contiguous: bool) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"mla_reduce_v1: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"mla_reduce_v1: {name} must be {dtype}, got {t.dtype}")
    if t.device != device:
        _fail(name, f"on {device} (partial_output's device)", t.device)
    if contiguous and not t.is_contiguous():
        _fail(name, "contiguous", f"strides {t.stride()} for shape {tuple(t.shape)}")


def _check(partial_output, partial_lse, reduce_indptr, reduce_final_map, reduce_partial_map,
           max_seqlen_q, final_output, final_lse) -> None:
    if not isinstance(partial_output, torch.Tensor):
        raise TypeError("mla_reduce_v1: partial_output must be a torch.Tensor, got "
                        f"{type(partial_output).__name__}")
    # every tensor on partial_output's device; CUDA is checked last, so that a call on CPU
    # tensors names its other mistakes too
    dev = partial_output.device
    if dev.type != "cuda" and launch.any_on_cuda(partial_lse, reduce_indptr, reduce_final_map,
                                                 reduce_partial_map, final_output, final_lse):
        _fail("partial_output", "a CUDA tensor", dev)   # the odd one out: not "move the rest to CPU"
    _check_tensor(partial_output, "partial_output", torch.float32, dev, True)
    po_shape = tuple(partial_output.shape)
    if (partial_output.dim() not in (3, 4) or po_shape[-1] != V_HEAD_DIM
            or (partial_output.dim() == 4 and po_shape[1] != 1)):
        _fail("partial_output", f"[N, H, {V_HEAD_DIM}] or [N, 1, H, {V_HEAD_DIM}]", po_shape)
    launch.check_aligned(partial_output, "partial_output", "mla_reduce_v1: ")   # rows read as float4
    H = po_shape[-2]
    if H < 1:
        _fail("partial_output", "at least 1 head (size(-2))", po_shape)
    N = po_shape[0]
    _check_tensor(partial_lse, "partial_lse", torch.float32, dev, True)
    if partial_lse.numel() != N * H or (partial_lse.dim() > 0 and partial_lse.shape[0] != N):
        _fail("partial_lse", f"[N={N}, H={H}] (or [N, 1, H, 1]) matching partial_output",
              tuple(partial_lse.shape))
    _check_tensor(reduce_indptr, "reduce_indptr", torch.int32, dev, True)
    if reduce_indptr.dim() != 1 or reduce_indptr.numel() < 1:
        _fail("reduce_indptr", "1-D with tiles+1 >= 1 entries", tuple(reduce_indptr.shape))
    tiles = reduce_indptr.numel() - 1
    if reduce_final_map is not None:
        _check_tensor(reduce_final_map, "reduce_final_map", torch.int32, dev, True)
        if (reduce_final_map.dim() != 2 or reduce_final_map.shape[1] != 2
                or reduce_final_map.shape[0] < tiles):
            _fail("reduce_final_map", f"[>= tiles={tiles}, 2] (q_start, q_end)",
                  tuple(reduce_final_map.shape))
    _check_tensor(reduce_partial_map, "reduce_partial_map", torch.int32, dev, True)
    if isinstance(max_seqlen_q, torch.Tensor):   # its value would cost a host sync (and fail in capture)
        raise TypeError(f"mla_reduce_v1: max_seqlen_q must be an int, got a tensor {max_seqlen_q!r}")
    seqlen = require_int("mla_reduce_v1: max_seqlen_q", max_seqlen_q)   # numpy ints too
    if not 1 <= seqlen <= _INT32_MAX:   # an int32 launch field: never wrapped
        _fail("max_seqlen_q", f"an int in [1, {_INT32_MAX}]", repr(max_seqlen_q))
    _check_tensor(final_output, "final_output", torch.bfloat16, dev, False)
    if final_output.dim() != 3 or tuple(final_output.shape[1:]) != (H, V_HEAD_DIM):
        _fail("final_output", f"[total_q, H={H}, {V_HEAD_DIM}]", tuple(final_output.shape))
    if final_output.shape[0] > _INT32_MAX:
        _fail("final_output", f"at most {_INT32_MAX} q tokens", final_output.shape[0])
    if final_lse is not None:
        _check_tensor(final_lse, "final_lse", torch.float32, dev, False)
        if tuple(final_lse.shape) != (final_output.shape[0], H):
            _fail("final_lse", f"[total_q={final_output.shape[0]}, H={H}]",
                  tuple(final_lse.shape))
    if dev.type != "cuda":
        _fail("partial_output", "a CUDA tensor", dev)


class Prepared:
    """A checked reduce launch: the loaded entry point, its filled ``ReduceArgs`` and the
    device's error record (which the entry point asks before it launches, unless the args were
    filled for a caller that asks it). ``fn_addr``: the entry point's address, for the decode
    entry that chains it."""

    __slots__ = ("module", "fn", "fn_addr", "args", "addr", "index", "sink")

    def __init__(self, args, index: int):
        self.module, self.fn = _entry_points.get(None, index)
        self.fn_addr = ctypes.cast(self.fn, ctypes.c_void_p).value
        self.args, self.addr, self.index = args, ctypes.addressof(args), index
        self.sink = errors.sink(index)


def prepare(partial_output, reduce_indptr, reduce_final_map, reduce_partial_map, max_seqlen_q,
            final_output, final_lse, ask_errors: bool = True) -> Prepared:
    """The launch for tensors that passed ``_check`` (the decode op calls this with its own
    buffers, already checked, and ``ask_errors=False``: its entry point asks the error record
    before it launches both kernels)."""
    so, sh, sd = final_output.stride()
    ls, lh = final_lse.stride() if final_lse is not None else (0, 0)
    po_shape = partial_output.shape
    args = SIGNATURE.pack(
        reduce_indptr=reduce_indptr.data_ptr(),
        reduce_final_map=reduce_final_map.data_ptr() if reduce_final_map is not None else None,
        reduce_partial_map=reduce_partial_map.data_ptr(), out_stride_s=so, out_stride_h=sh,
        out_stride_d=sd, lse_stride_s=ls, lse_stride_h=lh, num_partial_rows=po_shape[0],
        partial_map_len=reduce_partial_map.numel(), total_q=final_output.shape[0],
        num_heads=po_shape[-2], num_tiles=reduce_indptr.numel() - 1, max_seqlen_q=operator.index(max_seqlen_q),
        device=partial_output.device.index,
        error_record=errors.sink(partial_output.device.index).record_ptr if ask_errors else None)
    return Prepared(args, partial_output.device.index)


#: Checked launches of the public op, by what decides the checks.
_prepared = launch.IdentityCache()


def _launch(partial_output, partial_lse, reduce_indptr, reduce_final_map, reduce_partial_map,
            max_seqlen_q, final_output, final_lse) -> None:
    # Warm: the checks of this call's shapes, dtypes, devices and schedule tensors passed before
    # (the schedule tensors by identity: their object and data pointer), so a dict lookup
    # replaces them. Checks read only metadata (no sync); a captured graph skips them too. The
    # entry point asks the error record before it launches (launch.fail raises what it held).
    try:
        # per-call tensors by what their checks and the fixed strides depend on
        # (partial_output's alignment too: _check refuses a misaligned start)
        key = (partial_output.shape, partial_output.stride(), partial_output.dtype,
               partial_output.device, partial_output.data_ptr() & 15,
               partial_lse.shape, partial_lse.stride(), partial_lse.dtype,
               final_output.shape, final_output.stride(), final_output.dtype, final_output.device,
               None if final_lse is None else (final_lse.shape, final_lse.stride(), final_lse.dtype,
                                               final_lse.device), max_seqlen_q,
               id(reduce_indptr), reduce_indptr.data_ptr(), id(reduce_final_map),
               None if reduce_final_map is None else reduce_final_map.data_ptr(),
               id(reduce_partial_map), reduce_partial_map.data_ptr())
    except (AttributeError, TypeError):   # not tensors: the checks say which
        key = None
    prep = _prepared.entries.get(key) if key is not None else None
    if prep is None:
        capturing = (isinstance(partial_output, torch.Tensor) and partial_output.is_cuda
                     and torch.cuda.is_current_stream_capturing())
        if not capturing:
            _check(partial_output, partial_lse, reduce_indptr, reduce_final_map,
                   reduce_partial_map, max_seqlen_q, final_output, final_lse)
        prep = prepare(partial_output, reduce_indptr, reduce_final_map, reduce_partial_map,
                       max_seqlen_q, final_output, final_lse)
        if not capturing and key is not None:
            _prepared.put(key, prep, (reduce_indptr, reduce_final_map, reduce_partial_map))
    rc = prep.fn(prep.addr, partial_output.data_ptr(), partial_lse.data_ptr(),
                 final_output.data_ptr(), None if final_lse is None else final_lse.data_ptr(),
                 raw_stream(prep.index))
    if rc != 0:
        launch.fail(rc, prep.module, "mla_reduce_v1: launch", prep.sink)


@torch.library.custom_op("aiter_mla::mla_reduce_v1", mutates_args=("final_output", "final_lse"))
def _mla_reduce_v1_op(partial_output: torch.Tensor, partial_lse: torch.Tensor,
                      reduce_indptr: torch.Tensor, reduce_final_map: Optional[torch.Tensor],
                      reduce_partial_map: torch.Tensor, max_seqlen_q: int,
                      final_output: torch.Tensor, final_lse: Optional[torch.Tensor]) -> None:
    _launch(partial_output, partial_lse, reduce_indptr, reduce_final_map, reduce_partial_map,
            max_seqlen_q, final_output, final_lse)


@_mla_reduce_v1_op.register_fake
def _(partial_output, partial_lse, reduce_indptr, reduce_final_map, reduce_partial_map,
      max_seqlen_q, final_output, final_lse) -> None:
    return None


def mla_reduce_v1(partial_output, partial_lse, reduce_indptr, reduce_final_map,
                  reduce_partial_map, max_seqlen_q, final_output, final_lse=None) -> None:
    """Merge split-KV partial attention outputs by their LSE, in place.

    For each reduce tile t with at least 2 entries (entries
    ``reduce_indptr[t] .. reduce_indptr[t+1]-1``), each q token s in ``[q_start, q_end)``
    (``reduce_final_map[t]``) and head h, with ``loc_i = reduce_partial_map[reduce_indptr[t]+i]``
    and ``lse_i = partial_lse[loc_i + s - q_start, h]``::

        M = max_i lse_i;  w_i = exp(lse_i - M)
        final_output[s, h] = bf16(sum_i w_i * partial_output[loc_i + s - q_start, h] / sum_i w_i)
        final_lse[s, h]    = M + ln(sum_i w_i)

    If every lse_i is -inf (no piece saw a key): output 0, final_lse +inf (never NaN). Tiles
    with fewer than 2 entries are left untouched (the decode kernel wrote them directly).
    There is no cap on the number of splits per tile.

    Args:
        partial_output: float32 contiguous [N, 1, H, 512] or [N, H, 512], 16-byte aligned start
            (rows are read as float4); H = size(-2).
        partial_lse: float32 contiguous, N*H values ([N, 1, H, 1] or [N, H]), natural log.
        reduce_indptr: int32 [tiles + 1].
        reduce_final_map: int32 [tiles, 2] (q_start, q_end) per tile, or None: then (AITER) the
            q length is ``reduce_partial_map[reduce_indptr[t]+1] - reduce_partial_map[reduce_indptr[t]]``
            and tile t covers ``[t*len, (t+1)*len)``.
        reduce_partial_map: int32, first partial q-token row of each split piece.
        max_seqlen_q: int >= 1, sizes the launch grid only (longer tiles are still covered).
        final_output: bf16 [total_q, H, 512], any strides (written in place).
        final_lse: optional float32 [total_q, H], any strides (written in place).

    Raises:
        TypeError / ValueError naming the argument with expected and actual values (dtype,
        device, contiguity, shape); checks run once per schedule and output layout (a warm call
        is a lookup and the launch) and are skipped while a CUDA graph is being captured.
        :class:`aiter_mla.ops.errors.DeviceIndexError` (a ValueError) for a bad index value an
        earlier decode kernel found on this device (before this call launches anything).
        RuntimeError if the launch fails; on the reduce module's first use in a process, the
        JIT errors of :func:`aiter_mla.jit.get_module` (RuntimeError subclasses: ToolchainError,
        BuildError, CacheError (CacheNotWritableError and LockTimeoutError among them),
        JitDisabledError, ModuleLoadError).
        A schedule that points outside its buffers is never read out of bounds: the affected
        rows come out NaN instead.

    Source: AITER ``aiter.mla_reduce_v1`` / ``csrc/kernels/mla/reduce.cu`` (PR #3072), without
    its LDS split cap (docs/DESIGN.md §8.3); launched on the current stream, graph-capturable.
    """
    if torch.compiler.is_compiling():
        torch.ops.aiter_mla.mla_reduce_v1(partial_output, partial_lse, reduce_indptr,
                                          reduce_final_map, reduce_partial_map, max_seqlen_q,
                                          final_output, final_lse)
        return
    _launch(partial_output, partial_lse, reduce_indptr, reduce_final_map, reduce_partial_map,
            max_seqlen_q, final_output, final_lse)
