"""JIT kernel modules: render a Jinja template per variant, build it, cache it by content hash,
load it with ctypes.

Public entry points: :func:`get_module` (load, building on first use) and
:func:`build_variant` (build/verify without loading; compile-only targets).
See ``docs/ARCHITECTURE.md`` for which file does what.
"""
from .core import (BuildResult, CompileOnlyError, JitDisabledError, build_variant,
                   get_module, reset_state, variant_key)
from .cache import CacheError, CacheNotWritableError, LockTimeoutError
from .loader import Module, ModuleLoadError

__all__ = ["BuildResult", "CacheError", "CacheNotWritableError", "CompileOnlyError", "JitDisabledError",
           "LockTimeoutError", "Module", "ModuleLoadError", "build_variant", "get_module", "reset_state",
           "variant_key"]
