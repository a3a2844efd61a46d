"""``aiter-mla bench``: the main job — MLA decode timed against a roofline floor measured in the
same run, beside peers and reference numbers.

Modules: ``commands`` (CLI), ``variants`` (which JIT variants, building them), ``inputs``
(DeepSeek-V3-like batches), ``formulas`` (FLOPs, bytes, floor), ``ceilings`` (read, copy and
GEMM rates; ``read_bandwidth`` launches the read kernel), ``timing`` (CUDA-graph replays),
``sweep`` (rows), ``power`` (SM clock and board power per row), ``peers`` (FlashInfer, FlashMLA),
``jit_figures`` (cold build, warm load), ``reference_numbers`` (the seed's MI355 table),
``environment``, ``report`` and ``plots`` (outputs).
"""
