"""A loaded variant: the ctypes handle of a published host library and its C entry points."""
from __future__ import annotations

import ctypes
from pathlib import Path


class ModuleLoadError(RuntimeError):
    """A published library could not be loaded, or lacks a requested symbol. ``reason``: the
    dynamic loader's message when loading failed (else None)."""

    reason: str | None = None


def elf_truncation(path: Path) -> str | None:
    """Why the 64-bit little-endian ELF file ``path`` is cut short, or None when its program
    headers' loadable segments and its section header table all lie inside the file (or it is
    no such ELF file: dlopen then refuses it with its own message). A truncated library whose
    header is intact maps, and the first touch past the end kills the process with SIGBUS."""
    import struct

    with open(path, "rb") as f:
        head = f.read(64)
        size = f.seek(0, 2)
        if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
            return None
        phoff, shoff = struct.unpack_from("<QQ", head, 0x20)
        phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", head, 0x36)
        if shnum and shoff + shnum * shentsize > size:
            return f"truncated: section headers end at byte {shoff + shnum * shentsize}, the file has {size}"
        if phnum == 0 or phentsize < 56:   # no program headers (an object file): dlopen says why
            return None
        if phoff + phnum * phentsize > size:
            return f"truncated: program headers end at byte {phoff + phnum * phentsize}, the file has {size}"
        f.seek(phoff)
        table = f.read(phnum * phentsize)
        if len(table) < phnum * phentsize:   # shrank since the size was read
            return f"truncated: program headers end at byte {phoff + phnum * phentsize}"
    for i in range(phnum):
        p_type, _, p_offset, _, _, p_filesz = struct.unpack_from("<IIQQQQ", table, i * phentsize)
        if p_type == 1 and p_offset + p_filesz > size:   # PT_LOAD
            return f"truncated: segment {i} ends at byte {p_offset + p_filesz}, the file has {size}"
    return None


class Module:
    """A loaded variant of a JIT module.

    Attributes: ``name`` (module), ``params`` (the variant's parameters, sorted), ``key``
    (cache key, sha256 hex), ``lib_path`` (the published ``lib.so``). The file may be removed
    later by ``jit clear``/``rebuild``; this process keeps its mapping.
    """

    def __init__(self, name: str, params: dict, key: str, lib_path: Path):
        self.name = name
        self.params = dict(params)
        self.key = key
        self.lib_path = Path(lib_path)
        try:
            problem = elf_truncation(self.lib_path)
            if problem is not None:   # dlopen would map past the file's end: SIGBUS, not an error
                raise OSError(f"{lib_path}: {problem}")
            self._lib = ctypes.CDLL(str(lib_path))
        except OSError as exc:
            err = ModuleLoadError(f"could not load {name} {self.params} from {lib_path}: {exc}")
            err.reason = str(exc)   # the loader's own text (dlerror), for the caller's advice
            raise err from None
        self._fns: dict[tuple, object] = {}
        self._error_string = None

    def function(self, symbol: str, argtypes, restype=ctypes.c_int):
        """The C entry point ``symbol`` with the ctypes signature given (cached per symbol and
        signature: asking again with another signature gives a new handle with that one, and
        the earlier handle keeps its own).

        ``argtypes``: ctypes types of the arguments; ``restype``: the return type
        (``c_int``: a ``cudaError_t``, 0 = success). Raises :class:`ModuleLoadError` when the
        library does not export ``symbol``; TypeError naming ``argtypes`` when it is not a
        sequence, and ctypes' ``TypeError`` for an argument type that is not a ctypes type.
        """
        try:
            argtypes = tuple(argtypes)
        except TypeError:
            raise TypeError(f"function({symbol!r}): argtypes must be a sequence of ctypes types "
                            f"([] for none), got {argtypes!r}") from None
        key = (symbol, argtypes, restype)
        fn = self._fns.get(key)
        if fn is None:
            try:
                fn = self._lib[symbol]   # a fresh handle (attribute access shares one per symbol)
            except AttributeError:
                raise ModuleLoadError(
                    f"module {self.name} ({self.lib_path}) exports no symbol {symbol!r}"
                ) from None
            fn.argtypes = list(argtypes)
            fn.restype = restype
            self._fns[key] = fn
        return fn

    def error_string(self, code: int) -> str:
        """The runtime's text for an error code returned by an entry point
        (``aiter_mla_error_string``, exported by every module)."""
        if self._error_string is None:
            self._error_string = self.function("aiter_mla_error_string", [ctypes.c_int],
                                               ctypes.c_char_p)
        text = self._error_string(int(code))
        return text.decode(errors="replace") if text else f"error {code}"

    def check(self, code: int, what: str) -> None:
        """Raise RuntimeError naming ``what`` and the runtime's message when ``code`` != 0."""
        if code != 0:
            raise RuntimeError(f"{what} failed: {self.error_string(code)} (error {code}) "
                               f"[module {self.name} {self.params}]")

    def __repr__(self) -> str:
        return f"Module({self.name!r}, {self.params}, key={self.key[:12]}...)"
