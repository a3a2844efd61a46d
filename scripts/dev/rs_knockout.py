"""Timing experiments on the wgmma_rs loop (issue 6, change 10; docs/perf/notes.md): edited
copies of templates/ (the templates folder is part of the JIT key), timed in one process.
Every option but chunkN gives wrong outputs: timing only, never run the tests on them.

usage: python3 scripts/dev/rs_knockout.py build|time OUTDIR
  RS_OPTS   comma-separated options (default: all below); RS_CASES=all adds more shapes
Options: shipped (unchanged), chunk6 / chunk9 (QK promoted every 6 / 9 k-steps), and parts
left out: noqk, nopv, nosoftmax, nofrags (V^T fragments), noxchg (row-max exchange: shuffles,
barrier, shared memory), noexp (p = s * scale - m), nopstore (P^T stores), norescale (O^T).
"""
import os
import shutil
import subprocess
import sys

import torch

sys.path.insert(0, os.getcwd())
import op_tests.test_mla_persistent as T  # noqa: E402
from aiter_mla.jit import core  # noqa: E402
from aiter_mla.ops import decode as dec  # noqa: E402
from scripts.dev.graph_timing import time_case  # noqa: E402

FP8 = torch.float8_e4m3fn
HEADER = "common/mla_decode_sm90_rs.cuh"
EDITS = {
    "shipped": [],
    "chunk6": [("static constexpr int kQkChunk = 3;", "static constexpr int kQkChunk = 6;")],
    "chunk9": [("static constexpr int kQkChunk = 3;", "static constexpr int kQkChunk = 9;")],
    "noqk": [("  wg::qk_steps<true, C::kQkChunk>(acc,", "  if (false) wg::qk_steps<true, C::kQkChunk>(acc,")],
    "nopv": [("  pv_issue_blocks<C, 0>(o, a, smem_addr(smem + C::kOffP + (wgi * 2 + buf) * C::kPBytes));\n", "")],
    "nosoftmax": [("  const int j = lane >> 2, r = lane & 3;\n  // Common path",
                   "  const int j = lane >> 2, r = lane & 3;\n  return;\n  // Common path")],
    "nofrags": [("""  if (valid >= C::BN) {
    load_vt_frags_impl<C, false>(a, smem, stage, w, lane, valid);""", """  for (int mb = 0; mb < C::kMBlocks; ++mb)
    for (int kk = 0; kk < C::BN / 32; ++kk) a[mb][kk][0] = a[mb][kk][1] = a[mb][kk][2] = a[mb][kk][3] = 0;
  if (false) {
    load_vt_frags_impl<C, false>(a, smem, stage, w, lane, valid);""")],
    "noxchg": [("""  max_halve<8>(v, lane, 2);
  max_halve<4>(v, lane, 3);
  max_halve<2>(v, lane, 4);""", ""), ("  wg::wg_sync(wgi);\n  float m_ref[8]", "  float m_ref[8]"),
               ("    const float4 t = *reinterpret_cast<const float4*>(red + (8 * (q >> 1) + 2 * r + (q & 1)) * 4);",
                "    const float4 t = make_float4(v[q], v[q], v[q], v[q]);")],
    "noexp": [("const float p0 = fast_exp2(fmaf(s[i][b], sc, -m_ref[q]));", "const float p0 = fmaf(s[i][b], sc, -m_ref[q]);"),
              ("const float p1 = fast_exp2(fmaf(s[i][b + 2], sc, -m_ref[q]));", "const float p1 = fmaf(s[i][b + 2], sc, -m_ref[q]);")],
    "nopstore": [("      *reinterpret_cast<__nv_fp8x2_storage_t*>(pt + i * 512 + b * 16) = ovl::e4m3x2(p0, p1);\n", "")],
    "norescale": [("  if (__any_sync(0xffffffffu, changed)) {", "  if (__any_sync(0xffffffffu, changed && false)) {")],
}
mode, outdir = sys.argv[1], sys.argv[2]
os.makedirs(outdir, exist_ok=True)
OPTS = os.environ.get("RS_OPTS", ",".join(EDITS)).split(",")
SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "templates")
# (name, heads, qlen, batch, ctx); RS_CASES=all adds the other shapes the loop could serve
CASES = [("fp8 (128,1) b64 c8192", 128, 1, 64, 8192), ("fp8 (16,1) b128 c8192", 16, 1, 128, 8192)]
if os.environ.get("RS_CASES") == "all":
    CASES += [("fp8 (16,1) b64 c3200", 16, 1, 64, 3200), ("fp8 (16,1) b256 c4096", 16, 1, 256, 4096),
              ("fp8 (32,1) b128 c8192", 32, 1, 128, 8192), ("fp8 (16,2) b64 c8192", 16, 2, 64, 8192),
              ("fp8 (64,1) b128 c8192", 64, 1, 128, 8192), ("fp8 (128,1) b1 c21", 128, 1, 1, 21)]


def templates_for(opt):
    """OUTDIR/templates_<opt>: templates/ with the option's edits (each must match once)."""
    dst = os.path.join(outdir, f"templates_{opt}")
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(SRC, dst)
    path = os.path.join(dst, HEADER)
    text = open(path).read()
    for old, new in EDITS[opt]:
        assert text.count(old) == 1, (opt, old)
        text = text.replace(old, new)
    open(path, "w").write(text)
    return dst


if mode == "build":
    code = ("import sys; sys.path.insert(0, '.'); import torch; from aiter_mla.ops import decode as d; "
            "from aiter_mla.jit import get_module\n"
            "for h, q in ((128, 1), (16, 1), (32, 1), (16, 2), (64, 1)): get_module('mla_decode', "
            "**d.decode_variant(h, q, 64, torch.float8_e4m3fn, torch.float8_e4m3fn, mainloop='wgmma_rs'))")
    procs = [(opt, subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True,
                                    env=dict(os.environ, AITER_MLA_TEMPLATES_DIR=templates_for(opt))))
             for opt in OPTS]
    for opt, pr in procs:
        err = pr.communicate()[1]
        print(f"build {opt}: rc={pr.returncode} {err[-400:] if pr.returncode else ''}", flush=True)
    sys.exit(0)

rows = []
for name, h, qlen, b, ctx in CASES:
    c = T.make_case(h, qlen, 64, FP8, [ctx] * b, seed=1, spare_pages=0)
    bufs = T.plan(c)
    for loop, opt in [("wgmma_ot", "shipped")] + [("wgmma_rs", o) for o in OPTS]:
        os.environ["AITER_MLA_TEMPLATES_DIR"] = os.path.join(outdir, f"templates_{opt}")
        core.reset_state()   # also the reduce and metadata ops' handles on loaded kernels
        dec.DEFAULT_MAINLOOP["fp8"] = loop
        try:
            t, _ = time_case(c, bufs, h)
        except Exception as e:  # noqa: BLE001
            t = float("nan")
            print(f"{name} {loop} {opt}: {type(e).__name__}: {e}", flush=True)
        rows.append(f"{name:24s} {loop:10s} {opt:10s} {t:8.1f} us")
        print(rows[-1], flush=True)
    del c, bufs
    torch.cuda.empty_cache()
open(os.path.join(outdir, "rs_knockout.txt"), "w").write("\n".join(rows) + "\n")
