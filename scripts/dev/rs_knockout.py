"""Timing experiments on the wgmma_rs loop (issue 6, change 10): builds of the same variant with
-D switches (AITER_MLA_EXTRA_NVCC_FLAGS is part of the cache key), timed in one process.

usage: python3 scripts/dev/rs_knockout.py build|time OUTDIR
  RS_FLAGS  ';'-separated flag sets (default: the knock-out and experiment set below)
Switches (templates/common/mla_decode_sm90_rs.cuh, templates/mla_decode.cu.j2): AITER_MLA_RS_NO_QK,
_NO_PV, _NO_SOFTMAX, _NO_FRAGS (deliberately wrong outputs: timing only), AITER_MLA_RS_QK_CHUNK=N,
AITER_MLA_RS_PINGPONG.
"""
import concurrent.futures
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.getcwd())
import op_tests.test_mla_persistent as T  # noqa: E402
from aiter_mla.jit import core  # noqa: E402
from aiter_mla.ops import decode as dec  # noqa: E402
from scripts.dev.graph_timing import time_case  # noqa: E402

FP8 = torch.float8_e4m3fn
mode, outdir = sys.argv[1], sys.argv[2]
os.makedirs(outdir, exist_ok=True)
FLAGS = os.environ.get("RS_FLAGS", ";-DAITER_MLA_RS_PINGPONG;-DAITER_MLA_RS_QK_CHUNK=9;-DAITER_MLA_RS_QK_CHUNK=18;"
                       "-DAITER_MLA_RS_NO_QK;-DAITER_MLA_RS_NO_PV;-DAITER_MLA_RS_NO_SOFTMAX;-DAITER_MLA_RS_NO_FRAGS").split(";")
# (name, heads, qlen, batch, ctx); RS_CASES=all adds the other shapes the loop could serve
CASES = [("fp8 (128,1) b64 c8192", 128, 1, 64, 8192), ("fp8 (16,1) b128 c8192", 16, 1, 128, 8192)]
if os.environ.get("RS_CASES") == "all":
    CASES += [("fp8 (16,1) b64 c3200", 16, 1, 64, 3200), ("fp8 (16,1) b256 c4096", 16, 1, 256, 4096),
              ("fp8 (32,1) b128 c8192", 32, 1, 128, 8192), ("fp8 (16,2) b64 c8192", 16, 2, 64, 8192),
              ("fp8 (64,1) b128 c8192", 64, 1, 128, 8192), ("fp8 (128,1) b1 c21", 128, 1, 1, 21)]
LOOP = os.environ.get("RS_LOOP", "wgmma_rs")

if mode == "build":
    def build(fl):
        code = ("import sys; sys.path.insert(0, '.'); import torch; from aiter_mla.ops import decode as d; "
                "from aiter_mla.jit import get_module\n"
                f"for h, q in ((128, 1), (16, 1), (32, 1), (16, 2), (64, 1)): get_module('mla_decode', "
                f"**d.decode_variant(h, q, 64, torch.float8_e4m3fn, torch.float8_e4m3fn, mainloop='{LOOP}'))")
        r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, AITER_MLA_EXTRA_NVCC_FLAGS=fl),
                           capture_output=True, text=True)
        return fl, r.returncode, r.stderr[-400:]
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        for fl, rc, err in ex.map(build, FLAGS):
            print(f"build {fl or '(shipped)'}: rc={rc} {err if rc else ''}", flush=True)
    sys.exit(0)


rows = []
for name, h, qlen, b, ctx in CASES:
    c = T.make_case(h, qlen, 64, FP8, [ctx] * b, seed=1, spare_pages=0)
    bufs = T.plan(c)
    for loop, fl in [("wgmma_ot", "")] + [(LOOP, f) for f in FLAGS]:
        os.environ["AITER_MLA_EXTRA_NVCC_FLAGS"] = fl
        core._memo.clear()
        dec.DEFAULT_MAINLOOP["fp8"] = loop
        try:
            t, _ = time_case(c, bufs, h)
        except Exception as e:  # noqa: BLE001
            t = float("nan")
            print(f"{name} {loop} {fl}: {type(e).__name__}: {e}", flush=True)
        rows.append(f"{name:24s} {loop:10s} {fl or '(shipped)':32s} {t:8.1f} us")
        print(rows[-1], flush=True)
    del c, bufs
    torch.cuda.empty_cache()
open(os.path.join(outdir, "rs_knockout.txt"), "w").write("\n".join(rows) + "\n")
