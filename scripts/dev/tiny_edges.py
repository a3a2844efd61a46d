"""What the tiny case's step is made of (issue 6; docs/perf/notes.md change 22): CUDA-graph µs
per call of decode + reduce, with one or two more kernels in front of it (an empty reduce, i.e.
a PDL kernel with nothing to do, or the metadata kernel), so that the cost of one more kernel in
the chain can be told from the metadata kernel's own work.

usage: python3 scripts/dev/tiny_edges.py   (on the GPU machine; prints one table)
"""
import os
import sys

import torch

sys.path.insert(0, os.getcwd())
import aiter_mla  # noqa: E402
import op_tests.test_mla_persistent as T  # noqa: E402
from scripts.dev.graph_timing import graph_us  # noqa: E402

FP8, BF16 = torch.float8_e4m3fn, torch.bfloat16
rows = ["case                     dec+red  empty+dec+red  2empty+dec+red  meta+dec+red  meta+meta+dec+red"]
for name, dt, b, ctx in [("fp8 (128,1) b1 c21", FP8, 1, 21), ("bf16 (128,1) b1 c21", BF16, 1, 21),
                         ("fp8 (128,1) b64 c3200", FP8, 64, 3200)]:
    c = T.make_case(128, 1, 64, dt, [ctx] * b, seed=1, spare_pages=0)
    bufs = T.plan(c)
    (_m, _wi, _ws, reduce_indptr, reduce_final_map, reduce_partial_map) = bufs
    o = torch.empty((c.q.shape[0], 128, 512), dtype=torch.bfloat16, device="cuda")
    o2 = torch.empty_like(o)
    n = max(1, int(reduce_partial_map.numel()))
    po = torch.zeros((n, 1, 128, 512), dtype=torch.float32, device="cuda")
    pl = torch.zeros((n, 1, 128, 1), dtype=torch.float32, device="cuda")
    empty = lambda: aiter_mla.mla_reduce_v1(po, pl, reduce_indptr, reduce_final_map, reduce_partial_map, 1, o2)  # noqa: E731
    dec = lambda: T.decode_with(c, bufs, o, lse_out=False)  # noqa: E731
    meta = lambda: T.fill_plan(c, bufs)  # noqa: E731
    arms = [lambda: dec(), lambda: (empty(), dec()), lambda: (empty(), empty(), dec()),
            lambda: (meta(), dec()), lambda: (meta(), meta(), dec())]
    us = [[graph_us(f) for f in arms] for _ in range(3)]
    rows.append(f"{name:24s} " + "  ".join("/".join(f"{u[i]:.1f}" for u in us).rjust(14) for i in range(len(arms))))
    print(rows[-1], flush=True)
print("\n".join(rows))
