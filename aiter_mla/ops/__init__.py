"""Python ops: metadata (work schedule), decode, reduce (and the convert_fp8 demo); ``launch``
holds and launches their JIT modules' entry points."""


def __getattr__(name):
    # aiter_mla.ops.<module> from `import aiter_mla` alone (aiter_mla._submodule)
    from .. import _submodule

    return _submodule(__name__, name)
