"""``convert_fp8_to_bf16``: the small demo op that runs the whole JIT path on the GPU.

One ctypes call into the ``convert_fp8`` module (templates/convert_fp8.cu.j2), launched on
torch's current stream with no host sync, so it is captured by CUDA graphs.
"""
from __future__ import annotations

import ctypes
from typing import Optional

import torch

from . import launch
from .launch import raw_stream

__all__ = ["convert_fp8_to_bf16"]

#: ``aiter_mla_convert_fp8`` of templates/convert_fp8.cu.j2.
SIGNATURE = launch.Signature("aiter_mla_convert_fp8", (
    ("x", ctypes.c_void_p), ("y", ctypes.c_void_p), ("scale", ctypes.c_void_p),
    ("n", ctypes.c_int64), ("device", ctypes.c_int), ("stream", ctypes.c_void_p)))


def _convert_module(_key, device_index: int):
    from ..jit import get_module

    return get_module("convert_fp8", arch=launch.device_arch(device_index), out_dtype="bf16")


_entry_points = launch.EntryPoints(SIGNATURE, _convert_module)   # one variant per device


def _fail(exc, name: str, expected: str, actual) -> None:
    raise exc(f"convert_fp8_to_bf16: {name} must be {expected}, got {actual}")


def convert_fp8_to_bf16(x: torch.Tensor, scale: torch.Tensor,
                        out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``bf16(float(x) * scale)``, elementwise: dequantize a per-tensor-scaled fp8 tensor.

    Args:
        x: ``torch.float8_e4m3fn`` (OCP e4m3) CUDA tensor, any shape, contiguous.
        scale: ``torch.float32`` tensor with exactly one element on ``x``'s device (real value
            = stored fp8 x scale, as AITER's ``q_scale``/``kv_scale``). A tensor, not a Python
            float, so a captured CUDA graph reads the current value at replay.
        out: optional contiguous ``torch.bfloat16`` tensor of ``x``'s shape and device.

    Returns ``out`` (or a new tensor): ``x.shape``, ``torch.bfloat16``. The product is
    formed in float32 and rounded to nearest even; NaN codes (0x7f, 0xff) give NaN.

    Raises TypeError (wrong type or dtype) or ValueError (device, shape, layout) naming the
    argument, the expected and the actual value; RuntimeError with the CUDA error text if
    the launch fails. Launches on ``torch.cuda.current_stream(x.device)``.
    """
    if not isinstance(x, torch.Tensor):
        _fail(TypeError, "x", "a torch.Tensor", type(x).__name__)
    if x.dtype != torch.float8_e4m3fn:
        _fail(TypeError, "x", "torch.float8_e4m3fn", x.dtype)
    if x.device.type != "cuda":
        _fail(ValueError, "x", "a CUDA tensor", x.device)
    if not x.is_contiguous():
        _fail(ValueError, "x", "contiguous", f"strides {x.stride()} for shape {tuple(x.shape)}")
    if not isinstance(scale, torch.Tensor):
        _fail(TypeError, "scale", "a float32 tensor with one element", type(scale).__name__)
    if scale.dtype != torch.float32:
        _fail(TypeError, "scale", "torch.float32", scale.dtype)
    if scale.numel() != 1:
        _fail(ValueError, "scale", "one element", f"{scale.numel()} elements")
    if scale.device != x.device:
        _fail(ValueError, "scale", f"on {x.device} (x's device)", scale.device)
    if out is None:
        out = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
    else:
        if not isinstance(out, torch.Tensor):
            _fail(TypeError, "out", "a torch.Tensor", type(out).__name__)
        if out.dtype != torch.bfloat16:
            _fail(TypeError, "out", "torch.bfloat16", out.dtype)
        if out.device != x.device:
            _fail(ValueError, "out", f"on {x.device} (x's device)", out.device)
        if out.shape != x.shape:
            _fail(ValueError, "out", f"shape {tuple(x.shape)} (x's shape)", tuple(out.shape))
        if not out.is_contiguous():
            _fail(ValueError, "out", "contiguous", f"strides {out.stride()}")
    index = x.device.index if x.device.index is not None else torch.cuda.current_device()
    module, fn = _entry_points.get(None, index)
    rc = fn(x.data_ptr(), out.data_ptr(), scale.data_ptr(), x.numel(), index, raw_stream(index))
    if rc != 0:
        module.check(rc, "convert_fp8_to_bf16 launch")
    return out
