"""Where the per-call fixed cost of the decode goes (issue 6, change 12; docs/perf/notes.md).

usage: python3 scripts/dev/fixed_cost_probe.py OUTDIR
For each case: decode + reduce (the op), decode alone (hk_mla_decode_fwd) and the reduce alone
(mla_reduce_v1 on the decode's partials), each as a CUDA graph of 8 calls (median of 20 replays).
The difference between the first and the sum of the others is what PDL overlaps.
"""
import os
import sys

import torch

sys.path.insert(0, os.getcwd())
import op_tests.test_mla_persistent as T  # noqa: E402
from scripts.dev.graph_timing import split_times  # noqa: E402

FP8 = torch.float8_e4m3fn
CASES = [(16, 1, 1, 21), (16, 1, 64, 3200), (16, 1, 64, 8192), (16, 1, 128, 3200), (16, 1, 128, 8192),
         (16, 1, 256, 8192), (128, 1, 64, 3200), (128, 1, 64, 8192)]


rows = [f"{'case':28s} {'clusters':>8s} {'works':>6s} {'splits':>6s} {'full us':>8s} {'decode':>8s} {'reduce':>8s}"]
for h, q, b, ctx in CASES:
    c = T.make_case(h, q, 64, FP8, [ctx] * b, seed=1, spare_pages=0)
    bufs = T.plan(c)
    work_indptr = bufs[1]
    full, dec_only, red_only = split_times(c, bufs, h, q)
    works = int(work_indptr[-1])
    rows.append(f"fp8 ({h},{q}) b{b} c{ctx}".ljust(28) + f" {work_indptr.numel() - 1:8d} {works:6d} {works - b:6d}"
                f" {full:8.1f} {dec_only:8.1f} {red_only:8.1f}")
    print(rows[-1], flush=True)
    del c, bufs
    torch.cuda.empty_cache()
os.makedirs(sys.argv[1], exist_ok=True)
open(os.path.join(sys.argv[1], "fixed_cost.txt"), "w").write("\n".join(rows) + "\n")
