"""Device check of the fp8 main loops (issue 6, changes 3-5; docs/perf/notes.md).

usage: python3 scripts/dev/fp8_loop_check.py build|build_time|acc|time|phase OUTDIR
  env OVL_LOOP  the loop under test (default wgmma_ovl); CMP_LOOPS  loops timed after wgmma_ws
  acc   : accuracy of OVL_LOOP vs the float64 reference on 25 cases (exit 1 on a failure)
  time  : CUDA-graph timings (decode + reduce, median of 20 replays of 8 calls), wgmma_ws first;
          TIME_N: only the first N cases; TIMES=few: the <= 32-row shapes; TIMES=ab: both dtypes;
          TIMES=bf16: the bf16 default loop
  phase : clock() phases of an instrumented build (scripts/dev/fp8_loop_probe.py TEMPLATES_OUT,
          then AITER_MLA_TEMPLATES_DIR=TEMPLATES_OUT); PHASE_N cases
"""
import concurrent.futures
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.getcwd())
import op_tests.test_mla_persistent as T  # noqa: E402
from aiter_mla.ops import decode as dec  # noqa: E402
from aiter_mla.reference import relative_l2  # noqa: E402
from aiter_mla.jit import get_module  # noqa: E402
from scripts.dev.graph_timing import time_case  # noqa: E402
from scripts.dev.probe_common import read_device_counters  # noqa: E402

FP8, BF16 = torch.float8_e4m3fn, torch.bfloat16
mode, outdir = sys.argv[1], sys.argv[2]
os.makedirs(outdir, exist_ok=True)
NEW = os.environ.get("OVL_LOOP", "wgmma_ovl")


_SHIPPED = (dict(dec.DEFAULT_MAINLOOP), dict(dec.FEW_ROWS_MAINLOOP))


def set_loop(loop):
    dec.DEFAULT_MAINLOOP.update(_SHIPPED[0])
    dec.FEW_ROWS_MAINLOOP.update(_SHIPPED[1])
    dec.force_mainloop("fp8", loop)


def runs(loop, h, q):
    """Whether ``loop`` ("loop" or "loop@cuN") has a kernel for (h, q) rows (wgmma_dual: <= 32)."""
    return loop.partition("@cu")[0] not in dec.DUAL_LOOPS or h * q <= dec.FEW_ROWS


def variant_for(loop, h, q, P, dt):
    """fp8: ``loop``'s variant; bf16: the default one (the fp8 loops have no bf16 kernel, so a
    bf16 row compares only the "@cuN" cluster counts)."""
    if dt == BF16:
        return dec.decode_variant(h, q, P, dt, dt)
    return dec.decode_variant(h, q, P, dt, dt, mainloop=loop.partition("@cu")[0])


# (loops, heads, qlen, P, dtype, kv_lens, qo_lens, seed, cu_num)
ACC = [
    (128, 1, 64, FP8, [333, 70, 1, 200], None, 1, None),
    (128, 1, 64, BF16, [333, 70, 1, 200], None, 2, None),
    (128, 1, 1, FP8, [8192, 21, 0, 513], None, 3, None),
    (128, 1, 16, BF16, [8192, 21], None, 4, None),
    (128, 1, 64, FP8, [8192] * 3, None, 5, None),
    (16, 1, 1, FP8, [64, 65, 128, 129, 1, 192], None, 6, None),
    (16, 1, 16, BF16, [1000, 0, 64, 3], None, 7, None),
    (16, 4, 16, FP8, [70, 300, 1, 129, 2000], None, 8, None),
    (16, 4, 16, BF16, [70, 300, 1, 129, 2000], None, 9, None),
    (16, 4, 64, FP8, [500, 77, 1000, 3], [4, 2, 1, 3], 10, None),
    (32, 4, 64, BF16, [500, 77, 1000, 3], [4, 1, 3, 2], 11, None),
    (64, 2, 1, BF16, [17, 33, 75, 197], None, 12, None),
    (32, 4, 64, FP8, [130, 0, 513], None, 13, None),
    (64, 1, 16, FP8, [4000, 7, 129], None, 14, None),
    (16, 2, 16, FP8, [13], None, 15, None),
    (128, 1, 16, FP8, [3000, 40, 1, 700, 66, 0, 5000], None, 16, 7),    # 3 clusters: grid 3 x 2
    (128, 1, 1, BF16, [1200, 64, 65], None, 17, 5),                    # 2 clusters: grid 2 x 2
]
ACC = [a for a in ACC if a[3] == FP8] + [
    (128, 1, 64, FP8, [8192, 8191, 4097, 64, 63], None, 21, None),
    (16, 1, 64, FP8, [8192, 3200, 1], None, 22, None),
    (64, 1, 16, FP8, [2048, 1, 5, 777], None, 23, None),
    (128, 1, 64, FP8, [20000], None, 24, None),
    (128, 1, 8, FP8, [37, 100, 1, 8, 9], None, 25, None),
    (16, 1, 128, FP8, [300, 129, 64, 1], None, 26, None),
    (64, 1, 256, FP8, [513, 1000, 255], None, 27, None),
    (16, 4, 32, FP8, [70, 300, 1, 129, 2000], [4, 2, 1, 3, 4], 28, None),
    (32, 4, 8, FP8, [33, 0, 513, 7], None, 29, None),
    (128, 1, 16, FP8, [3000, 40, 1, 700, 66, 0, 5000], None, 30, 3),
    # the <= 32-row shapes (wgmma_dual): page_size 1 (cp.async producer), ragged causal q,
    # few clusters (CU_NUM 1: 2 clusters, one CTA), empty and one-token batches
    (32, 1, 1, FP8, [300, 0, 1, 129, 64], None, 31, None),
    (32, 1, 64, FP8, [8192, 77, 4000, 1, 65], None, 32, 1),
    (16, 2, 4, FP8, [70, 300, 2, 129, 2000], [2, 1, 2, 2, 1], 33, None),
    (16, 2, 64, FP8, [5000, 3, 0, 640], [1, 2, 1, 2], 34, 3),
    (16, 1, 16, FP8, [1] * 40 + [6000] * 3, None, 35, None),
]


def timed_case(name):
    """("dtype (heads,qlen) bB cCTX [P<page>]") -> (name, heads, qlen, page_size, dtype, batch, ctx);
    page 64 unless named."""
    dt, shape, b, c, *page = name.split()
    heads, qlen = (int(x) for x in shape.strip("()").split(","))
    P = int(page[0][1:]) if page else 64
    return (name, heads, qlen, P, {"fp8": FP8, "bf16": BF16}[dt], int(b[1:]), int(c[1:]))


TIME_SETS = {
    "default": ["fp8 (128,1) b64 c8192", "fp8 (128,1) b64 c3200", "fp8 (128,1) b128 c4096",
                "fp8 (16,1) b128 c8192", "fp8 (64,1) b128 c8192", "fp8 (128,1) b1 c21"],
    "few": ["fp8 (16,1) b128 c8192", "fp8 (16,1) b64 c3200", "fp8 (16,1) b256 c4096", "fp8 (32,1) b128 c8192",
            "fp8 (16,2) b128 c4096", "fp8 (16,1) b64 c8192 P1", "fp8 (16,1) b1 c21",
            "bf16 (16,1) b128 c8192"],                     # the <= 32-row shapes
    "ab": ["fp8 (128,1) b64 c8192", "fp8 (128,1) b64 c3200", "fp8 (128,1) b128 c4096", "fp8 (64,1) b128 c8192",
           "fp8 (16,1) b128 c8192", "fp8 (16,1) b64 c3200", "bf16 (128,1) b64 c8192", "bf16 (16,1) b128 c8192",
           "fp8 (128,1) b1 c21"],                          # before/after: the targets' cases, both dtypes
    "bf16": ["bf16 (128,1) b64 c8192", "bf16 (128,1) b64 c3200", "bf16 (128,1) b128 c4096", "bf16 (64,1) b128 c8192",
             "bf16 (16,1) b128 c8192", "bf16 (16,1) b64 c3200", "bf16 (128,1) b1 c21", "bf16 (128,1) b64 c8192 P16",
             "bf16 (16,1) b128 c8192 P1"],                 # the bf16 default loop (wgmma_ws); P1 keeps cp.async
}
TIMES = [timed_case(n) for n in TIME_SETS[os.environ.get("TIMES", "default")]]
LOOPS = ["wgmma_ws"] + os.environ.get("CMP_LOOPS", NEW).split(",")


def variants(loops):
    vs = []
    shapes = [(h, q, P, dt) for h, q, P, dt, *_r in ACC] + [(h, q, P, dt) for _, h, q, P, dt, _, _ in TIMES]
    for h, q, P, dt in shapes:
        for loop in loops:
            if not runs(loop, h, q):
                continue
            v = variant_for(loop, h, q, P, dt)   # bf16 rows: the default loop (fp8-only loops)
            if v not in vs:
                vs.append(v)
    for h, q in dec.SUPPORTED_SHAPES:
        for P in T.PAGE_SIZES:
            if not runs(NEW, h, q):
                continue
            v = dec.decode_variant(h, q, P, FP8, FP8, mainloop=NEW)
            if v not in vs:
                vs.append(v)
    return vs

def accuracy(loop, heads, qlen, P, dtype, kv_lens, qo_lens, seed, cu_num):
    set_loop(loop)
    if cu_num:
        os.environ["CU_NUM"] = str(cu_num)
    try:
        c = T.make_case(heads, qlen, P, dtype, kv_lens, qo_lens=qo_lens, seed=seed)
        o, lse, _ = T.run_decode(c)
    finally:
        os.environ.pop("CU_NUM", None)
    ref_out, ref_lse = T.reference(c)
    finite = bool(torch.isfinite(o).all())
    err = relative_l2(o, ref_out)
    tol = T.tolerance(dtype, ref_out, T.reference(c, fp8_p=True)[0] if dtype == FP8 else None)
    lerr = T.lse_error(lse, ref_lse)
    ok = finite and err <= tol and lerr <= 2e-3
    kv = kv_lens if len(kv_lens) < 8 else f"{len(kv_lens)}x{kv_lens[0]}"
    return ok, (f"{loop:10s} ({heads},{qlen}) P={P} {str(dtype)[6:]:14s} kv={kv} qo={qo_lens} cu={cu_num}: "
                f"rel_l2={err:.3e} tol={tol:.2e} lse_err={lerr:.3e} finite={finite} {'OK' if ok else 'FAIL'}")





if mode in ("build", "build_time"):
    vs = variants([NEW]) if mode == "build" else [variant_for(l, h, q, P, dt) for _, h, q, P, dt, _, _ in TIMES for l in LOOPS if runs(l, h, q)]
    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(16) as ex:
        list(ex.map(lambda v: get_module("mla_decode", **v), vs))
    print(f"built {len(vs)} variants in {time.time() - t0:.0f} s", flush=True)
    sys.exit(0)

if mode == "acc":
    lines, bad = [], 0
    for cse in ACC:
        if not runs(NEW, cse[0], cse[1]):
            continue
        try:
            ok, line = accuracy(NEW, *cse)
        except Exception as e:  # noqa: BLE001
            ok, line = False, f"{NEW} {cse[:4]}: EXCEPTION {type(e).__name__}: {e}"
        bad += not ok
        lines.append(line)
        print(line, flush=True)
    print(f"ACCURACY: {len(lines) - bad}/{len(lines)} OK", flush=True)
    open(os.path.join(outdir, "accuracy.txt"), "w").write("\n".join(lines) + f"\n{len(lines) - bad}/{len(lines)} OK\n")
    sys.exit(1 if bad else 0)

if mode == "time":
    rows = [f"{'case':24s} " + " ".join(f"{n:>12s}" for n in LOOPS) + f" {'speedup':>8s} {'TB/s':>7s} {'TFLOPS':>7s} {'rel_l2(new,ws)':>14s}"]
    for name, h, q, P, dt, b, ctx in TIMES[:int(os.environ.get("TIME_N", len(TIMES)))]:
        c = T.make_case(h, q, P, dt, [ctx] * b, seed=1, spare_pages=0)
        us, outs = [], []
        for name_cu in LOOPS:
            # "loop@cuN": that loop with CU_NUM=N (e.g. wgmma_ot@cu66: the 132 clusters that
            # the <= 32-row shapes had before their occupancy became 2)
            loop, _, cu = name_cu.partition("@cu")
            if not runs(loop, h, q):
                us.append(math.nan)
                continue
            set_loop(loop)
            if cu:
                os.environ["CU_NUM"] = cu
            try:
                bufs = T.plan(c)
                t, o = time_case(c, bufs, h)
                us.append(t)
                outs.append(o.float())
            except Exception as e:  # noqa: BLE001
                print(f"timing {name} {name_cu}: {type(e).__name__}: {e}", flush=True)
                us.append(math.nan)
            finally:
                os.environ.pop("CU_NUM", None)
        diff = relative_l2(outs[-1].double(), outs[0].double()) if len(outs) >= 2 else math.nan
        byts = b * ctx * 576 * (2 if dt == BF16 else 1)
        flops = 2 * h * q * b * ctx * 1088
        rows.append(f"{name:24s} " + " ".join(f"{u:12.1f}" for u in us) +
                    f" {us[0] / us[-1]:8.3f} {byts / us[-1] / 1e6:7.2f} {flops / us[-1] / 1e6:7.1f} {diff:14.3e}")
        print(rows[-1], flush=True)
        del c, bufs, outs
        torch.cuda.empty_cache()
    open(os.path.join(outdir, "table.txt"), "w").write("\n".join(rows) + "\n")
    sys.exit(0)

if mode == "phase":
    import ctypes
    rows = []
    for name, h, q, P, dt, b, ctx in TIMES[:int(os.environ.get("PHASE_N", 5))]:
        set_loop(NEW)
        c = T.make_case(h, q, P, dt, [ctx] * b, seed=1, spare_pages=0)
        v = read_device_counters(c, T.plan(c), h, "aiter_mla_phase_clocks", ctypes.c_ulonglong, 30)
        for wg in (0, 1):
            n = max(1, v[wg * 10 + 9])
            rows.append(f"{name:24s} wg{wg} tiles={n} " + " ".join(
                f"{k}={v[wg * 10 + i] / n:6.0f}" for i, k in enumerate(
                    ["wait_full", "qk", "rescale+ldP", "wait_vt", "pv_issue", "softmax", "wait_pv", "epi/gap", "issue->full"])))
        pr = v[20:30]
        n, nt = max(1, pr[9]), max(1, pr[8])
        rows.append(f"{name:24s} loader tiles={pr[9]} wait_empty={pr[0] / n:6.0f} issue={pr[1] / n:6.0f} | "
                    f"bad-lat={pr[7]} transposer tiles={pr[8]} wait_full={pr[2] / nt:6.0f} wait_vt_empty={pr[3] / nt:6.0f} transpose={pr[4] / nt:6.0f}")
        for r in rows[-3:]:
            print(r, flush=True)
        del c, bufs, o
        torch.cuda.empty_cache()
    open(os.path.join(outdir, "phase.txt"), "w").write("\n".join(rows) + "\n")
    sys.exit(0)
