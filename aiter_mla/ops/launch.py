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
import weakref
from collections.abc import Callable, Hashable
from typing import Any, NamedTuple

from ..jit import core as _jit_core
from ..locks import ForkSafeLock
from ..work_info import LAUNCH_ERROR_PENDING, LAUNCH_REDUCE_FAILED


class Signature:
    """A C entry point's signature: ``symbol``, ``fields`` = ((C parameter name, ctypes type),
    ...) in the C order, and ``restype``. ``names`` and ``argtypes`` derive from ``fields``;
    a call site passes its arguments positionally in this order.

    ``fixed``, when given, is the entry's first parameter: a pointer to a C struct with these
    fields, in this order (``Args``, a ctypes Structure). Those are the arguments that stay the
    same call after call on the same buffers, so an op fills one ``Args`` per buffer set and a
    warm call converts only the per-call ``fields`` (a ctypes argument costs about 0.1 us; the
    decode's ``DecodeArgs`` holds 33 fields). The C side exports ``<symbol>_args_bytes()`` = sizeof(struct),
    checked against ``ctypes.sizeof(Args)`` when the entry point is loaded."""

    __slots__ = ("symbol", "fields", "names", "argtypes", "restype", "fixed", "Args")

    def __init__(self, symbol: str, fields, restype=ctypes.c_int, fixed=None):
        self.symbol = symbol
        self.fields = tuple((str(name), ctype) for name, ctype in fields)
        self.fixed = None if fixed is None else tuple((str(name), ctype) for name, ctype in fixed)
        self.names = tuple(name for name, _ in self.fields)
        self.argtypes = ((ctypes.c_void_p,) if self.fixed else ()) + tuple(t for _, t in self.fields)
        self.restype = restype
        for what, group in (("parameter", self.fields), ("field", self.fixed or ())):
            names = [name for name, _ in group]
            if len(set(names)) != len(names):
                raise ValueError(f"{symbol}: repeated {what} name in {tuple(names)}")
        self.Args = None
        if self.fixed:
            self.Args = type(f"{symbol}_args", (ctypes.Structure,), {"_fields_": list(self.fixed)})

    def pack(self, **values):
        """An ``Args`` with every fixed field set (KeyError naming a missing or unknown one)."""
        names = {name for name, _ in self.fixed}
        missing, unknown = names - values.keys(), values.keys() - names
        if missing or unknown:
            raise KeyError(f"{self.symbol} args: missing {sorted(missing)}, unknown {sorted(unknown)}")
        return self.Args(**values)

    def __repr__(self) -> str:
        args = ", ".join(f"{t.__name__} {n}" for n, t in self.fields)
        if self.fixed:
            args = f"const {self.symbol}_args*, " + args
        return f"Signature({self.restype.__name__} {self.symbol}({args}))"


def fail(rc: int, module, what: str, sink, chained=None) -> None:
    """Raise what an entry point's nonzero return code ``rc`` means: LAUNCH_ERROR_PENDING (the
    error record held an error, nothing was launched) raises it (``sink.raise_pending()``:
    :class:`aiter_mla.ops.errors.DeviceIndexError`); LAUNCH_REDUCE_FAILED + e raises the
    ``chained`` reduce module's error e; any other code is ``module``'s launch error, a
    RuntimeError naming ``what``."""
    if rc == LAUNCH_ERROR_PENDING:
        sink.raise_pending()
        raise RuntimeError(f"{what}: the error record was set and then cleared by another thread")
    if chained is not None and rc > LAUNCH_REDUCE_FAILED:
        chained.check(rc - LAUNCH_REDUCE_FAILED, "mla_reduce_v1: launch")
    module.check(rc, what)


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
            if s.fixed:
                size = module.function(s.symbol + "_args_bytes", (), ctypes.c_longlong)()
                if size != ctypes.sizeof(s.Args):
                    raise RuntimeError(
                        f"{s.symbol}: the module's argument struct is {size} bytes, the op's "
                        f"{ctypes.sizeof(s.Args)}: the template and the op's SIGNATURE disagree")
            loaded = Loaded(module, module.function(s.symbol, s.argtypes, s.restype))
            loaded = self._loaded.setdefault((key, device_index), loaded)
        return loaded


class IdentityCache:
    """Checked launches, keyed by tuples that hold the caller's long-lived tensors by ``id()``
    (and their data pointers) and the per-call ones by shape, dtype and device (what a key
    cannot hold, such as contiguity and alignment, each op checks on the warm path, e.g.
    ``decode._is_warm``): a warm call looks its checks up instead of running them
    (docs/DESIGN.md §4.2).

    An entry lives until one of the tensors its key names by id is freed (a weak reference's
    callback drops it, so a live key's ids always name the objects that were checked), until
    :func:`aiter_mla.jit.reset_state` (the values hold loaded entry points), or until the cache
    reaches ``limit`` entries (it then starts over). Lookups are ``cache.entries.get(key)``.
    """

    def __init__(self, limit: int = 4096):
        self.entries: dict = {}
        self._refs: dict = {}
        self.limit = limit
        self._lock = ForkSafeLock(reentrant=True)   # a callback may run inside put (a collection)
        _jit_core.on_reset(self.clear)

    def put(self, key, value, tensors) -> None:
        """Store ``value`` under ``key``; ``tensors``: the objects ``key`` holds by id (None
        entries are skipped)."""
        def drop(_ref, key=key, cache=self):
            with cache._lock:
                cache.entries.pop(key, None)
                cache._refs.pop(key, None)

        refs = tuple(weakref.ref(t, drop) for t in tensors if t is not None)
        with self._lock:
            if len(self.entries) >= self.limit:
                self.entries.clear()
                self._refs.clear()
            self.entries[key] = value
            self._refs[key] = refs

    def clear(self) -> None:
        with self._lock:
            self.entries.clear()
            self._refs.clear()

    def __len__(self) -> int:
        return len(self.entries)


def check_aligned(t, name: str, who: str = "") -> None:
    """ValueError unless tensor ``t`` starts 16-byte aligned. The kernels read or write these
    tensors' rows in 16-byte units (Q and KV by cp.async or TMA, bf16 output rows by 16-byte
    stores, fp32 partial rows read back as float4): a misaligned start would be a
    misaligned-address fault on the device. ``who``: the op's prefix for the message."""
    if t.data_ptr() % 16:
        raise ValueError(f"{who}{name} must start at a 16-byte aligned address (the kernels move its "
                         f"rows in 16-byte units), got data_ptr() % 16 = {t.data_ptr() % 16}; a tensor "
                         f"of its own (torch.empty, .clone()) is aligned")


def any_on_cuda(*tensors) -> bool:
    """Whether any argument is a CUDA tensor (others may be anything, None included). The ops
    check their first tensor's device after the device-free checks, so that a call on CPU
    tensors names its other mistakes; when another argument is already on CUDA, the first
    tensor is the odd one out and its device check comes first."""
    return any(getattr(t, "is_cuda", False) for t in tensors)


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
