"""How an op holds and launches a JIT module's entry point (docs/DESIGN.md §4): the entry
point's C signature declared once with named fields (:class:`Signature`), its loaded function
held per (variant key, device) until :func:`aiter_mla.jit.reset_state` (:class:`EntryPoints`),
torch's current stream as a raw handle (:func:`raw_stream`); the launch result is checked by
the loaded module itself (``Module.check``: RuntimeError with the runtime's error text).

Importing this module does not import torch (the metadata op and its CLI stay torch-free until
they launch); ``raw_stream`` is bound on first use.
"""
from __future__ import annotations

import ctypes
from collections.abc import Callable, Hashable
from typing import Any, NamedTuple

from ..jit import core as _jit_core


class Signature:
    """A C entry point's signature: ``symbol``, ``fields`` = ((C parameter name, ctypes type),
    ...) in the C order, and ``restype``. ``names`` and ``argtypes`` derive from ``fields``;
    a call site passes its arguments positionally in this order."""

    __slots__ = ("symbol", "fields", "names", "argtypes", "restype")

    def __init__(self, symbol: str, fields, restype=ctypes.c_int):
        self.symbol = symbol
        self.fields = tuple((str(name), ctype) for name, ctype in fields)
        self.names = tuple(name for name, _ in self.fields)
        self.argtypes = tuple(ctype for _, ctype in self.fields)
        self.restype = restype
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"{symbol}: repeated parameter name in {self.names}")

    def __repr__(self) -> str:
        args = ", ".join(f"{t.__name__} {n}" for n, t in self.fields)
        return f"Signature({self.restype.__name__} {self.symbol}({args}))"


class Loaded(NamedTuple):
    """A loaded entry point: the :class:`aiter_mla.jit.Module` and its ctypes function."""
    module: Any
    fn: Any


class EntryPoints:
    """One entry point of a JIT module, loaded once per (variant key, device index).

    ``module_for(key, device_index)`` returns the loaded module (``get_module(...)``) for a
    variant key (any hashable the op chooses; None for a module with one variant per device).
    The loaded functions are dropped by :func:`aiter_mla.jit.reset_state`, so a process that
    switches templates or cache roots does not keep running the old kernels. Thread-safe: two
    threads that miss together both ask ``get_module`` (which loads once) and keep the first.
    """

    def __init__(self, signature: Signature, module_for: Callable[[Hashable, int], Any]):
        self.signature = signature
        self._module_for = module_for
        self._loaded: dict[tuple, Loaded] = {}
        _jit_core.on_reset(self._loaded.clear)

    def get(self, key: Hashable, device_index: int) -> Loaded:
        """The :class:`Loaded` entry point for ``key`` on ``device_index`` (a dict lookup when
        warm; the first call raises the JIT errors of ``get_module`` and ModuleLoadError)."""
        loaded = self._loaded.get((key, device_index))
        if loaded is None:
            module = self._module_for(key, device_index)
            s = self.signature
            loaded = Loaded(module, module.function(s.symbol, s.argtypes, s.restype))
            loaded = self._loaded.setdefault((key, device_index), loaded)
        return loaded


def device_arch(device_index: int) -> str:
    """The template arch (``sm_90a``) of CUDA device ``device_index``; RuntimeError when it is
    not a supported target or no GPU is visible."""
    import torch

    from .. import arch

    with torch.cuda.device(device_index):
        return arch.current_arch()


def _bind_raw_stream() -> Callable[[int], int]:
    import torch

    try:  # a fraction of a microsecond, against several for torch.cuda.current_stream(i)
        return torch._C._cuda_getCurrentRawStream
    except AttributeError:  # CPU-only builds, or a torch without the private binding
        def raw_stream(device_index: int) -> int:
            """The raw handle of torch's current CUDA stream on ``device_index``."""
            return torch.cuda.current_stream(device_index).cuda_stream
        return raw_stream


def __getattr__(name: str):
    # raw_stream(device_index) -> int: the current stream's cudaStream_t as an int, for an entry
    # point's ``stream`` argument. Bound on first access, then a plain module attribute.
    if name == "raw_stream":
        fn = globals()["raw_stream"] = _bind_raw_stream()
        return fn
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
