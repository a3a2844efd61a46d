"""SM clock, power and clock-event reasons while a kernel runs back to back (issue 6: is the
fp8 (128,1) loop bound by power rather than by its instruction chain? docs/perf/notes.md).

usage: python3 scripts/dev/clock_probe.py OUTDIR NAME=TEMPLATES_DIR [...]
  For each arm (NAME=HEAD: the repository's templates/), the decode + reduce of CASE runs in a
  loop for SECONDS while `nvidia-smi -lms 50` samples the GPU; then an fp8 GEMM (torch._scaled_mm,
  8192^3) does the same as the power reference. Prints the median SM clock (MHz), power (W), the
  clock-event reasons seen, and the calls' µs (eager calls, not graph replay), and writes them
  to OUTDIR/clocks.txt. Builds run first (template_ab.py's build mode).
  env CASE (default "fp8 (128,1) b64 c8192"), SECONDS (default 4).
"""
import os
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.getcwd())
import op_tests.test_mla_persistent as T  # noqa: E402
from scripts.dev.template_ab import parse_case, use_templates  # noqa: E402

QUERY = "clocks.sm,power.draw,clocks_event_reasons.active"


def sampled(fn, seconds):
    """Runs fn() repeatedly for ``seconds`` under nvidia-smi sampling; returns (median MHz,
    median W, set of reason masks, µs per call)."""
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits", "-lms", "50"],
                           stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)
    n, t0 = 0, time.perf_counter()
    torch.cuda.synchronize()
    while time.perf_counter() - t0 < seconds:
        for _ in range(20):
            fn()
        n += 20
        torch.cuda.synchronize()
    us = (time.perf_counter() - t0) / n * 1e6
    smi.terminate()
    out = smi.communicate()[0]
    rows = [r.split(",") for r in out.strip().splitlines() if r.count(",") == 2]
    rows = rows[len(rows) // 4:]   # skip the ramp
    mhz = statistics.median(float(r[0]) for r in rows)
    watts = statistics.median(float(r[1]) for r in rows)
    reasons = sorted({r[2].strip() for r in rows})
    return mhz, watts, reasons, us


def main():
    outdir, specs = sys.argv[1], sys.argv[2:]
    os.makedirs(outdir, exist_ok=True)
    arms = [(s.partition("=")[0], s.partition("=")[2] or None) for s in specs]
    name, h, q, P, dt, b, ctx = parse_case(os.environ.get("CASE", "fp8 (128,1) b64 c8192"))
    seconds = float(os.environ.get("SECONDS", "4"))
    env = dict(os.environ, TEMPLATE_AB_BUILD_ONLY="1", CASES=name)
    for arm, folder in arms:
        e = dict(env)
        e.pop("AITER_MLA_TEMPLATES_DIR", None)
        if folder:
            e["AITER_MLA_TEMPLATES_DIR"] = folder
        subprocess.run([sys.executable, "scripts/dev/template_ab.py", outdir, f"{arm}={folder or ''}"], env=e, check=True)
    c = T.make_case(h, q, P, dt, [ctx] * b, seed=1, spare_pages=0)
    rows = [f"{'arm':10s} {'MHz':>6s} {'W':>6s} {'us/call':>8s}  reasons"]
    for arm, folder in arms:
        use_templates(folder)
        bufs = T.plan(c)
        o = torch.empty((c.q.shape[0], h, 512), dtype=torch.bfloat16, device="cuda")
        mhz, watts, reasons, us = sampled(lambda: T.decode_with(c, bufs, o, lse_out=False), seconds)
        rows.append(f"{arm:10s} {mhz:6.0f} {watts:6.0f} {us:8.1f}  {' '.join(reasons)}")
        print(rows[-1], flush=True)
    use_templates(None)
    a = torch.randn(8192, 8192, device="cuda").to(torch.float8_e4m3fn)
    bt = torch.randn(8192, 8192, device="cuda").to(torch.float8_e4m3fn).t()
    one = torch.ones((), device="cuda")
    mhz, watts, reasons, us = sampled(lambda: torch._scaled_mm(a, bt, scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
                                      seconds)
    rows.append(f"{'fp8 GEMM':10s} {mhz:6.0f} {watts:6.0f} {us:8.1f}  {' '.join(reasons)}  "
                f"({2 * 8192 ** 3 / us / 1e6:.0f} TFLOPS)")
    print(rows[-1], flush=True)
    open(os.path.join(outdir, "clocks.txt"), "w").write("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
