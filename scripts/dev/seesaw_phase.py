"""Phase clocks of the wgmma_seesaw loop (templates from scripts/dev/seesaw_probe.py ... probe,
selected with AITER_MLA_TEMPLATES_DIR). usage: python3 scripts/dev/seesaw_phase.py OUTFILE"""
import ctypes
import os
import sys

import torch

sys.path.insert(0, os.getcwd())
import op_tests.test_mla_persistent as T  # noqa: E402
from aiter_mla.jit import get_module  # noqa: E402
from aiter_mla.ops import decode as dec  # noqa: E402

FP8 = torch.float8_e4m3fn
dec.DEFAULT_MAINLOOP["fp8"] = "wgmma_seesaw"
A = ["QK(a)", "softmax(a)", "PV(a) issue", "wait kBarB", "wait PV(a)", "PV(b)"]
B = ["QK(b)", "wait kBarA", "PV(a) issue", "softmax(b)", "wait PV(a)", "PV(b)"]
rows = []
for name, h, b, ctx in [("(128,1) b64 c8192", 128, 64, 8192), ("(16,1) b128 c8192", 16, 128, 8192)]:
    c = T.make_case(h, 1, 64, FP8, [ctx] * b, seed=1, spare_pages=0)
    bufs = T.plan(c)
    o = torch.empty((c.q.shape[0], h, 512), dtype=torch.bfloat16, device="cuda")
    T.decode_with(c, bufs, o, lse_out=False)
    torch.cuda.synchronize()
    mod = get_module("mla_decode", **dec.decode_variant(h, 1, 64, FP8, FP8))
    fn = mod.function("aiter_mla_ss_clocks", [ctypes.c_void_p, ctypes.c_int], ctypes.c_int)
    buf = (ctypes.c_ulonglong * 16)()
    fn(buf, 1)
    T.decode_with(c, bufs, o, lse_out=False)
    torch.cuda.synchronize()
    assert fn(buf, 0) == 0
    v = list(buf)
    for wg, names in ((0, A), (1, B)):
        n = max(1, v[wg * 8 + 7])
        rows.append(f"{name} wg{wg} pairs={n} " + " ".join(f"{k}={v[wg * 8 + i] / n:.0f}" for i, k in enumerate(names))
                    + f" total={sum(v[wg * 8:wg * 8 + 6]) / n:.0f}")
        print(rows[-1], flush=True)
open(sys.argv[1], "w").write("\n".join(rows) + "\n")
