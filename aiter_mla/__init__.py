"""aiter_mla: JIT-compiled MLA decode attention (DeepSeek-V3/R1: 576-dim keys, 512-dim values,
one KV head, paged KV cache), re-creating AMD AITER's "HK MLA" decode subsystem.

Public ops (AITER's names and argument orders):
``get_mla_metadata_info_v1``, ``get_mla_metadata_v1``, ``mla_decode_fwd``,
``hk_mla_decode_fwd``, ``mla_reduce_v1``. For engines: :class:`MlaDecodePlanner` (sized once,
``plan`` per step, ``run`` per layer) and ``concat_and_cache_mla`` (new tokens into the paged
cache). ``check_errors`` / ``DeviceIndexError``: the bad
index values the kernels found (:mod:`aiter_mla.ops.errors`); the float64 reference is
:mod:`aiter_mla.reference`.
"""
from .version import __version__  # noqa: F401

# Lazy attributes: `import aiter_mla` stays cheap (no torch import) so CLI commands and a
# warm JIT load in a new process pay only for what they use.
_LAZY = {
    "reference": ("aiter_mla.reference", None),
    "mla_reduce_v1": ("aiter_mla.ops.reduce", "mla_reduce_v1"),
    "hk_mla_decode_fwd": ("aiter_mla.ops.decode", "hk_mla_decode_fwd"),
    "mla_decode_fwd": ("aiter_mla.ops.decode", "mla_decode_fwd"),
    "get_mla_metadata_info_v1": ("aiter_mla.ops.metadata", "get_mla_metadata_info_v1"),
    "get_mla_metadata_v1": ("aiter_mla.ops.metadata", "get_mla_metadata_v1"),
    "check_errors": ("aiter_mla.ops.errors", "check_errors"),
    "MlaDecodePlanner": ("aiter_mla.ops.planner", "MlaDecodePlanner"),
    "concat_and_cache_mla": ("aiter_mla.ops.cache", "concat_and_cache_mla"),
    "DeviceIndexError": ("aiter_mla.ops.errors", "DeviceIndexError"),
}
__all__ = sorted(_LAZY)


def _submodule(package: str, name: str):
    """``package.name`` imported, when that module exists (``aiter_mla.ops.metadata``,
    ``aiter_mla.arch``, ... are reachable from ``import aiter_mla`` alone, as the README writes
    them); else AttributeError."""
    import importlib
    import importlib.util

    if name.startswith("_") or importlib.util.find_spec(f"{package}.{name}") is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    return importlib.import_module(f"{package}.{name}")


def __getattr__(name):
    try:
        module_name, attr = _LAZY[name]
    except KeyError:
        return _submodule(__name__, name)   # (imports set it as an attribute of the package)
    import importlib

    module = importlib.import_module(module_name)
    value = module if attr is None else getattr(module, attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))   # a lazy name once used is in globals() too
