"""A/B of the metadata kernel's time per call (issue 6, change 16; docs/perf/notes.md).

usage: [AITER_MLA_TEMPLATES_DIR=<templates copy>] [TAG=name] python3 scripts/dev/metadata_ab.py
Run once per templates copy (e.g. `git archive <commit> templates | tar -x -C DIR`), in one
device call. Per shape (page 64, 128 heads, qlen 1): op_tests/bench_metadata.py's bench_one
without its reference check (an old templates copy may schedule differently on purpose),
three times; prints the works the schedule made and the best and the median graph time.
"""
import os
import sys

sys.path.insert(0, os.getcwd())
from op_tests.bench_metadata import bench_one  # noqa: E402

for batch, ctx, varlen in [(1, 21, False), (64, 3200, False), (64, 3200, True), (256, 8192, False),
                           (4096, 2000, True)]:
    rows = [bench_one(batch, ctx, varlen, 64, check=False) for _ in range(3)]
    us = sorted(r["graph_us"] for r in rows)
    print(f"{os.environ.get('TAG', '?')} b{batch} c{ctx} {'var' if varlen else 'uni'}: works {rows[0]['works']} "
          f"graph us {us[0]:.2f} {us[1]:.2f}", flush=True)
