"""Same-call A/B of template folders on the device (issue 6 experiments, docs/perf/notes.md).

usage: python3 scripts/dev/template_ab.py OUTDIR NAME[:LOOP]=TEMPLATES_DIR [...]
  NAME= (no folder) is the repository's templates/. NAME:LOOP forces fp8 main loop LOOP in that
  arm only (so e.g. wgmma_ot and wgmma_seesaw arms interleave in one run). Every folder's variants for CASES are
  built first, one process per folder (AITER_MLA_TEMPLATES_DIR is process-wide), then each case
  is timed under every folder in turn, ROUNDS times (interleaved, so drift shows as a spread;
  round r starts at arm r, so no arm always runs first: times are listed per arm in round order),
  by scripts/dev/graph_timing.py (CUDA-graph replay, decode + reduce). Writes OUTDIR/ab.txt.
  env CASES: ';'-separated fp8_loop_check.timed_case names (default: the fp8 (128,1) and
  (64,1) cases below); ROUNDS (default 2); LOOP: an fp8 main loop to force in every arm
  (decode.force_mainloop; default: the shipped choice); WITH_METADATA=1: time the metadata kernel
  too (get_mla_metadata_v1 + decode + reduce, as the bench's tiny case).
"""
import os
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.getcwd())
import op_tests.test_mla_persistent as T  # noqa: E402
from aiter_mla.jit import core  # noqa: E402
from aiter_mla.ops import decode as dec  # noqa: E402
from aiter_mla.reference import relative_l2  # noqa: E402
from scripts.dev.graph_timing import graph_us, time_case  # noqa: E402

FP8, BF16 = torch.float8_e4m3fn, torch.bfloat16
DEFAULT_CASES = "fp8 (128,1) b64 c8192;fp8 (128,1) b64 c3200;fp8 (128,1) b128 c4096;fp8 (64,1) b128 c8192"


def parse_case(name):
    dt, shape, b, c, *page = name.split()
    heads, qlen = (int(x) for x in shape.strip("()").split(","))
    return name, heads, qlen, int(page[0][1:]) if page else 64, {"fp8": FP8, "bf16": BF16}[dt], int(b[1:]), int(c[1:])


_SHIPPED = None


def use_templates(folder, loop=None):
    """Later get_module calls render from ``folder`` (None: the repository's templates/) and,
    when ``loop`` is given, pick that fp8 main loop (None: the run-wide choice)."""
    global _SHIPPED
    if _SHIPPED is None:
        _SHIPPED = dec.force_mainloop("fp8", dec.DEFAULT_MAINLOOP["fp8"])
    dec.restore_mainloop("fp8", _SHIPPED)
    if loop:
        dec.force_mainloop("fp8", loop)
    if folder:
        os.environ["AITER_MLA_TEMPLATES_DIR"] = folder
    else:
        os.environ.pop("AITER_MLA_TEMPLATES_DIR", None)
    # loaded modules are memoised by parameters, not by templates, and the reduce and metadata
    # ops keep their own handles (a memo clear alone left every arm on the first arm's reduce
    # and metadata kernels: change 22); reset_state forgets both
    core.reset_state()


def main():
    if os.environ.get("LOOP"):
        dec.force_mainloop("fp8", os.environ["LOOP"])
    outdir, specs = sys.argv[1], sys.argv[2:]
    os.makedirs(outdir, exist_ok=True)
    arms = [(s.partition("=")[0], s.partition("=")[2] or None) for s in specs]
    loops = {n: n.partition(":")[2] or None for n, _ in arms}
    cases = [parse_case(n) for n in os.environ.get("CASES", DEFAULT_CASES).split(";")]
    rounds = int(os.environ.get("ROUNDS", "2"))
    if os.environ.get("TEMPLATE_AB_BUILD_ONLY"):
        from aiter_mla.jit import get_module
        import concurrent.futures
        vs = []
        for _n, h, q, P, dt, _b, _c in cases:
            v = dec.decode_variant(h, q, P, dt, dt)
            if v not in vs:
                vs.append(v)
        jobs = [("mla_decode", v) for v in vs] + [("mla_metadata", {"arch": "sm_90a"}),
                                                   ("mla_reduce", {"arch": "sm_90a", "out_dtype": "bf16"})]
        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            list(ex.map(lambda j: get_module(j[0], **j[1]), jobs))
        return
    t0 = time.time()
    procs = []
    for name, folder in arms:
        env = dict(os.environ, TEMPLATE_AB_BUILD_ONLY="1")
        if loops[name]:
            env["LOOP"] = loops[name]
        env.pop("AITER_MLA_TEMPLATES_DIR", None)
        if folder:
            env["AITER_MLA_TEMPLATES_DIR"] = folder
        procs.append((name, subprocess.Popen([sys.executable, __file__, outdir, f"{name}={folder or ''}"], env=env)))
    for name, pr in procs:
        if pr.wait() != 0:
            raise SystemExit(f"build of arm {name} failed")
    print(f"built {len(arms)} arms in {time.time() - t0:.0f} s", flush=True)
    rows = [f"{'case':26s} " + " ".join(f"{n:>14s}" for n, _ in arms) + "   rel_l2 vs first arm"]
    for cname, h, q, P, dt, b, ctx in cases:
        c = T.make_case(h, q, P, dt, [ctx] * b, seed=1, spare_pages=0)
        times = {n: [] for n, _ in arms}
        outs = {}
        for r in range(rounds):
            # round r starts at arm r (mod arms): long power-heavy cases run slower in a round's later
            # slots (warming), and a fixed order charged that to the same arm every round
            for name, folder in arms[r % len(arms):] + arms[:r % len(arms)]:
                use_templates(folder, loops[name])
                bufs = T.plan(c)
                if os.environ.get("WITH_METADATA") == "1":   # the bench's tiny case: metadata + decode + reduce
                    o = torch.empty((c.q.shape[0], h, 512), dtype=torch.bfloat16, device="cuda")
                    t = graph_us(lambda: (T.fill_plan(c, bufs), T.decode_with(c, bufs, o, lse_out=False)))
                else:
                    t, o = time_case(c, bufs, h)
                times[name].append(t)
                outs[name] = o.float()
        use_templates(None)
        first = arms[0][0]
        diffs = " ".join(f"{relative_l2(outs[n].double(), outs[first].double()):.1e}" for n, _ in arms[1:])
        rows.append(f"{cname:26s} " + " ".join(f"{'/'.join(f'{t:.1f}' for t in times[n]):>14s}" for n, _ in arms)
                    + f"   {diffs}")
        print(rows[-1], flush=True)
        del c, outs
        torch.cuda.empty_cache()
    open(os.path.join(outdir, "ab.txt"), "w").write("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
