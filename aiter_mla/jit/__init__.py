"""JIT kernel modules: render a Jinja template per variant, build it, cache it by content hash,
load it with ctypes.

Public entry point: :func:`get_module`.
"""
from .core import Module, get_module

__all__ = ["Module", "get_module"]
