"""Python ops: ``metadata`` (the work schedule; ``metadata_reference`` is its Python model and
``metadata_dump`` prints one), ``decode``, ``reduce``, ``cache`` (``concat_and_cache_mla``),
``planner`` (``MlaDecodePlanner``), ``errors`` (the device error record), and the
``convert_fp8`` demo; ``launch`` holds and launches their JIT modules' entry points."""


def __getattr__(name):
    # aiter_mla.ops.<module> from `import aiter_mla` alone (aiter_mla._submodule)
    from .. import _submodule

    return _submodule(__name__, name)
