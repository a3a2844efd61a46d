"""Python ops: metadata (work schedule), decode, reduce (and the convert_fp8 demo); ``launch``
holds and launches their JIT modules' entry points."""
