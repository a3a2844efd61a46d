"""A/B of the metadata kernel's time per call (issue 6, change 16; docs/perf/notes.md).

usage: [AITER_MLA_TEMPLATES_DIR=<templates copy>] [TAG=name] python3 scripts/dev/metadata_ab.py
Run once per templates copy (e.g. `git archive <commit> templates | tar -x -C DIR`), in one
device call. Per shape (page 64, 128 heads, qlen 1; op_tests/bench_metadata.py's inputs): the
works the schedule made and the best and the median of three CUDA-graph timings (16 calls per
replay). No reference check: an old templates copy may schedule differently on purpose.
"""
import os
import sys

import torch

sys.path.insert(0, os.getcwd())
from aiter_mla.ops import metadata as md  # noqa: E402
from op_tests.bench_metadata import _inputs  # noqa: E402
from scripts.dev.graph_timing import graph_us  # noqa: E402

FP8 = torch.float8_e4m3fn
for batch, ctx, varlen in [(1, 21, False), (64, 3200, False), (64, 3200, True), (256, 8192, False),
                           (4096, 2000, True)]:
    qo, kv, lpl = _inputs(batch, ctx, varlen, 64, 1)
    qo_d, kv_d, lpl_d = (torch.tensor(x, dtype=torch.int32, device="cuda") for x in (qo, kv, lpl))
    info = md.get_mla_metadata_info_v1(batch, 1, 128, FP8, FP8)
    ptrs, indptr, info_set, rindptr, final, partial = (torch.empty(s, dtype=d, device="cuda") for s, d in info)

    def op():
        md.get_mla_metadata_v1(qo_d, kv_d, lpl_d, 128, 1, False, ptrs, info_set, indptr, rindptr, final, partial,
                               page_size=64, kv_granularity=md.default_kv_granularity(64), max_seqlen_qo=1,
                               dtype_q=FP8, dtype_kv=FP8)

    op()
    torch.cuda.synchronize()
    us = sorted(graph_us(op, reps=20, calls=16) for _ in range(3))
    print(f"{os.environ.get('TAG', '?')} b{batch} c{ctx} {'var' if varlen else 'uni'}: works {int(indptr[-1])} "
          f"graph us {us[0]:.2f} {us[1]:.2f}", flush=True)
