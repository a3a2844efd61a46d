"""``concat_and_cache_mla``: write new tokens' rows into the paged MLA cache (vLLM's op of that
name, for this package's cache layout).

One ctypes call into the ``kv_cache_append`` module (templates/kv_cache_append.cu.j2) on torch's
current stream, no host sync, so it can be captured in a CUDA graph. Slot values are checked on
the device: a slot past the cache is skipped and raised later as
:class:`aiter_mla.ops.errors.DeviceIndexError` (``slot_mapping[t] = ...``), as the decode op's
index checks are (docs/DESIGN.md §5.13).
"""
from __future__ import annotations

import ctypes
from typing import Optional

import torch

from ..arch import QK_HEAD_DIM, V_HEAD_DIM
from . import errors, launch
from .launch import raw_stream

__all__ = ["concat_and_cache_mla"]

ROPE_DIM = QK_HEAD_DIM - V_HEAD_DIM   # 64

_P, _I64 = ctypes.c_void_p, ctypes.c_int64

#: ``aiter_mla_kv_cache_append`` of templates/kv_cache_append.cu.j2.
SIGNATURE = launch.Signature("aiter_mla_kv_cache_append", (
    ("kv_c", _P), ("kv_c_stride", _I64), ("k_pe", _P), ("k_pe_stride", _I64),
    ("slot_mapping", _P), ("num_tokens", _I64), ("cache", _P), ("cache_rows", _I64),
    ("scale", _P), ("error_claim", _P), ("error_record", _P), ("device", ctypes.c_int),
    ("stream", _P)))

_CACHE_DTYPES = {torch.float8_e4m3fn: "fp8", torch.bfloat16: "bf16"}


def _append_module(cache_dtype: str, device_index: int):
    from ..jit import get_module

    return get_module("kv_cache_append", arch=launch.device_arch(device_index), cache_dtype=cache_dtype)


_entry_points = launch.EntryPoints(SIGNATURE, _append_module)


def _fail(exc, name: str, expected: str, actual) -> None:
    raise exc(f"concat_and_cache_mla: {name} must be {expected}, got {actual}")


def _rows(t, name: str, width: int, tokens: Optional[int], device) -> None:
    if not isinstance(t, torch.Tensor):
        _fail(TypeError, name, "a torch.Tensor", type(t).__name__)
    if t.dtype != torch.bfloat16:
        _fail(TypeError, name, "torch.bfloat16", t.dtype)
    if t.device != device:
        _fail(ValueError, name, f"on {device} (kv_cache's device)", t.device)
    if t.dim() != 2 or t.shape[1] != width or (tokens is not None and t.shape[0] != tokens):
        rows = "num_tokens" if tokens is None else f"num_tokens={tokens}"
        _fail(ValueError, name, f"[{rows}, {width}]", tuple(t.shape))
    if t.shape[1] > 1 and t.stride(1) != 1:
        _fail(ValueError, name, "contiguous along its last dim (rows may be strided)",
              f"strides {t.stride()}")


def concat_and_cache_mla(kv_c: torch.Tensor, k_pe: torch.Tensor, kv_cache: torch.Tensor,
                         slot_mapping: torch.Tensor, *, kv_scale: Optional[torch.Tensor] = None) -> None:
    """Write ``cat(kv_c[t], k_pe[t])`` into cache slot ``slot_mapping[t]`` for every token t.

    The job of vLLM's ``concat_and_cache_mla``, for the cache layout the decode op reads.

    Args:
        kv_c: [num_tokens, 512] bf16, the compressed latent (after ``kv_a_layernorm``); rows may
            be strided (a view of a wider projection), the last dim contiguous.
        k_pe: [num_tokens, 64] bf16, the RoPE key (rotary already applied); same rules.
        kv_cache: [num_pages, page_size, 1, 576] contiguous, bf16 or fp8 e4m3fn (the decode op's
            ``kv_buffer``). Slot s is row ``s % page_size`` of page ``s // page_size``. Any
            page_size is written; the decode op reads powers of two 1..256.
        slot_mapping: [num_tokens] int64 on the cache's device. A negative slot is a padding
            token and is skipped (as vLLM). A slot >= num_pages * page_size is skipped and
            reported (below).
        kv_scale: for an fp8 cache, the [1] fp32 per-tensor scale (real value = stored x
            scale, the decode op's ``kv_scale``): stored = e4m3fn(real / scale), rounded to
            nearest even and saturated to +-448. Not allowed for a bf16 cache (bf16 copies).

    Returns None (writes ``kv_cache`` in place, on the current stream, without a host sync).

    Raises TypeError / ValueError naming the argument (dtype, shape, device, layout, a missing
    or extra ``kv_scale``); :class:`aiter_mla.ops.errors.DeviceIndexError` for a slot past the
    cache that an earlier call's kernel found (or one of the decode kernel's findings) on this
    device, raised before this call launches anything; RuntimeError when the launch fails; the
    JIT errors of :func:`aiter_mla.jit.get_module` on first use.
    """
    if not isinstance(kv_cache, torch.Tensor):
        _fail(TypeError, "kv_cache", "a torch.Tensor", type(kv_cache).__name__)
    device = kv_cache.device   # every tensor on it; CUDA is checked last (below), so that a call
    if device.type != "cuda" and launch.any_on_cuda(kv_c, k_pe, slot_mapping, kv_scale):   # on CPU names
        _fail(ValueError, "kv_cache", "a CUDA tensor", device)   # the rest too; the odd one out
    cache_dtype = _CACHE_DTYPES.get(kv_cache.dtype)
    if cache_dtype is None:
        _fail(TypeError, "kv_cache", "torch.bfloat16 or torch.float8_e4m3fn", kv_cache.dtype)
    if kv_cache.dim() != 4 or kv_cache.shape[2] != 1 or kv_cache.shape[3] != QK_HEAD_DIM:
        _fail(ValueError, "kv_cache", f"[num_pages, page_size, 1, {QK_HEAD_DIM}]", tuple(kv_cache.shape))
    if not kv_cache.is_contiguous():
        _fail(ValueError, "kv_cache", "contiguous", f"strides {kv_cache.stride()}")
    _rows(kv_c, "kv_c", V_HEAD_DIM, None, device)
    tokens = int(kv_c.shape[0])
    _rows(k_pe, "k_pe", ROPE_DIM, tokens, device)
    if not isinstance(slot_mapping, torch.Tensor):
        _fail(TypeError, "slot_mapping", "a torch.Tensor", type(slot_mapping).__name__)
    if slot_mapping.dtype != torch.int64:
        _fail(TypeError, "slot_mapping", "torch.int64", slot_mapping.dtype)
    if slot_mapping.device != device:
        _fail(ValueError, "slot_mapping", f"on {device} (kv_cache's device)", slot_mapping.device)
    if slot_mapping.dim() != 1 or slot_mapping.shape[0] != tokens:
        _fail(ValueError, "slot_mapping", f"[num_tokens={tokens}]", tuple(slot_mapping.shape))
    if tokens > 1 and slot_mapping.stride(0) != 1:
        _fail(ValueError, "slot_mapping", "contiguous", f"stride {slot_mapping.stride(0)}")
    if cache_dtype == "fp8":
        if not isinstance(kv_scale, torch.Tensor):
            _fail(TypeError, "kv_scale", "a [1] float32 tensor for an fp8 kv_cache", type(kv_scale).__name__)
        if kv_scale.dtype != torch.float32:
            _fail(TypeError, "kv_scale", "float32 (one element)", kv_scale.dtype)
        if kv_scale.numel() != 1:
            _fail(ValueError, "kv_scale", "one float32 element", f"{kv_scale.numel()} elements")
        if kv_scale.device != device:
            _fail(ValueError, "kv_scale", f"on {device} (kv_cache's device)", kv_scale.device)
    elif kv_scale is not None:
        _fail(ValueError, "kv_scale", "None for a bf16 kv_cache (values are copied)",
              f"a {type(kv_scale).__name__} ({kv_scale!r})" if not isinstance(kv_scale, torch.Tensor) else "a tensor")
    if device.type != "cuda":
        _fail(ValueError, "kv_cache", "a CUDA tensor", device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    module, fn = _entry_points.get(cache_dtype, index)
    sink = errors.sink(index)
    rc = fn(kv_c.data_ptr(), kv_c.stride(0), k_pe.data_ptr(), k_pe.stride(0), slot_mapping.data_ptr(),
            tokens, kv_cache.data_ptr(), int(kv_cache.shape[0]) * int(kv_cache.shape[1]),
            None if kv_scale is None else kv_scale.data_ptr(), sink.claim_ptr, sink.record_ptr,
            index, raw_stream(index))
    if rc != 0:
        launch.fail(rc, module, "concat_and_cache_mla launch", sink)
