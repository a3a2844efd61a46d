"""``read_xor``: one launch of the ``read_bandwidth`` JIT module (templates/read_bandwidth.cu.j2),
the read-only kernel behind the bench's ``read_TBps`` ceiling (:mod:`.ceilings`).

Loaded and called as ``aiter_mla.ops.convert`` calls ``convert_fp8``: one ctypes call on torch's
current stream, no host sync.
"""
from __future__ import annotations

import ctypes

from ..ops import launch

#: ``aiter_mla_read_bandwidth`` of templates/read_bandwidth.cu.j2.
SIGNATURE = launch.Signature("aiter_mla_read_bandwidth", (
    ("src", ctypes.c_void_p), ("n_bytes", ctypes.c_int64), ("partial", ctypes.c_void_p),
    ("num_sm", ctypes.c_int), ("ctas_per_sm", ctypes.c_int), ("device", ctypes.c_int),
    ("stream", ctypes.c_void_p)))


def _module(_key, device_index: int):
    from ..jit import get_module

    return get_module("read_bandwidth", arch=launch.device_arch(device_index))


_entry_points = launch.EntryPoints(SIGNATURE, _module)   # one variant per device


def read_xor(src, partial, num_sm: int, ctas_per_sm: int) -> None:
    """Read every byte of ``src`` once (``num_sm * ctas_per_sm`` CTAs of 256 threads, each
    thread 8 x 16-byte loads per iteration); ``partial[i]`` = XOR of the 32-bit words CTA ``i``
    read, so the XOR over ``partial`` is the XOR of all of ``src``'s words.

    Args:
        src: contiguous CUDA tensor of any dtype, ``nbytes`` a multiple of 16, 16-byte aligned.
        partial: contiguous ``torch.int32`` tensor of ``num_sm * ctas_per_sm`` elements on
            ``src``'s device (overwritten).
        num_sm, ctas_per_sm: the grid, as SM count x CTAs per SM (both >= 1).

    Raises ValueError naming the bad argument; RuntimeError with the CUDA error text if the
    launch fails. Launches on ``torch.cuda.current_stream(src.device)``.
    """
    import torch

    if src.device.type != "cuda" or not src.is_contiguous():
        raise ValueError(f"read_xor: src must be a contiguous CUDA tensor, got {src.device}, "
                         f"strides {src.stride()}")
    nbytes = src.numel() * src.element_size()
    if nbytes % 16 or src.data_ptr() % 16:
        raise ValueError(f"read_xor: src must be 16-byte aligned with a multiple of 16 bytes, got "
                         f"{nbytes} bytes at 0x{src.data_ptr():x}")
    if num_sm < 1 or ctas_per_sm < 1:
        raise ValueError(f"read_xor: num_sm and ctas_per_sm must be >= 1, got {num_sm}, "
                         f"{ctas_per_sm}")
    grid = num_sm * ctas_per_sm
    if (partial.dtype != torch.int32 or partial.device != src.device or not partial.is_contiguous()
            or partial.numel() != grid):
        raise ValueError(f"read_xor: partial must be a contiguous int32 tensor of {grid} elements "
                         f"on {src.device}, got {partial.dtype} x {partial.numel()} on "
                         f"{partial.device}")
    index = src.device.index if src.device.index is not None else torch.cuda.current_device()
    module, fn = _entry_points.get(None, index)
    rc = fn(src.data_ptr(), nbytes, partial.data_ptr(), num_sm, ctas_per_sm, index,
            launch.raw_stream(index))
    if rc != 0:
        module.check(rc, "read_bandwidth launch")
