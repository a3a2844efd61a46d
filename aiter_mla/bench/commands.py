"""``aiter-mla bench`` (also ``python -m aiter_mla.bench``): the main job.

Default sweep = the seed's table: heads 128, qlen 1, batch {1,3,5,16,32,64,128,256} x ctx
{21,64,256,512,1200,3200,5200,8192,23333}, fp8 Q and KV, page 64. Writes a table to stdout and
``results.json`` / ``results.md`` / two PNG plots into the output folder (:mod:`.report`).

``--compile-only`` renders and builds the variants the sweep would use (no GPU needed). Without
a GPU and without ``--compile-only`` the command exits 2 with a one-line explanation.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

DEFAULT_PAIRS = [(128, 1)]
DEFAULT_BATCHES = [1, 3, 5, 16, 32, 64, 128, 256]
DEFAULT_CTXS = [21, 64, 256, 512, 1200, 3200, 5200, 8192, 23333]
DEFAULT_PAGE_SIZES = [64]
DTYPES = ("fp8", "bf16")

TIMING_TEXT = (
    "CUDA events around CUDA-graph replays; each replay holds N back-to-back calls (N chosen so a "
    "replay lasts ~0.4 ms, at most 64) and successive calls read different input sets (a KV "
    "window of a pool larger than L2, and a Q set), so no call finds its KV in L2; one warm-up "
    "pass over every set, then the median over 10-30 replays of (replay time / N). Metadata: "
    "the same with 16 calls per replay on one plan's inputs.")


def _pair(text: str) -> tuple[int, int]:
    try:
        heads, qlen = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected HEADS,QLEN such as 128,1; got {text!r}") from None
    if heads < 1 or qlen < 1:
        raise argparse.ArgumentTypeError(f"heads and qlen must be >= 1, got {text!r}")
    return heads, qlen


def positive_int(text: str) -> int:
    """argparse type: an int >= 1 (bench -b / -c / -j, jit build -j)."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


#: The largest --seed (bench, metadata, scripts/template_ab.py). The bench seeds torch
#: generators with ``seed * 1_000_003 + chunk`` (:func:`aiter_mla.bench.inputs.make_kv_pool`),
#: which must stay inside what ``torch.Generator.manual_seed`` takes (-2**63 .. 2**64 - 1;
#: "Overflow when unpacking long long" past it): from 0 .. 2**32 - 1 it does, with room to spare.
SEED_MAX = 2**32 - 1


def seed_value(text: str) -> int:
    """argparse type: an input seed in 0..SEED_MAX (``--seed`` of bench and metadata)."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer in 0..{SEED_MAX} (2**32 - 1), "
                                         f"got {text!r}") from None
    if not 0 <= v <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"expected an integer in 0..{SEED_MAX} (2**32 - 1), got {v}")
    return v


def _page_size(text: str) -> int:
    v = positive_int(text)
    if v > 256 or v & (v - 1):
        raise argparse.ArgumentTypeError(f"page size must be a power of two in 1..256, got {v}")
    return v


class _Extend(argparse.Action):
    """``nargs="+"`` values that a repeated flag adds to (``-n 128,1 -n 16,1``: both pairs); the
    first use replaces the default. (argparse's "store" kept only the last use, silently.)"""

    def __call__(self, parser, namespace, values, option_string=None):
        current = getattr(namespace, self.dest, None)
        base = [] if current is None or current is self.default else list(current)
        setattr(namespace, self.dest, base + list(values))


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The bench's flags (shared by ``aiter-mla bench`` and ``python -m aiter_mla.bench``)."""
    p.add_argument("-n", "--heads-qlen", nargs="+", action=_Extend, type=_pair, default=DEFAULT_PAIRS,
                   metavar="HEADS,QLEN", help="(heads, q length) pairs (default: 128,1)")
    p.add_argument("-b", "--batch", nargs="+", action=_Extend, type=positive_int, default=DEFAULT_BATCHES,
                   help=f"batch sizes (default: {' '.join(map(str, DEFAULT_BATCHES))})")
    p.add_argument("-c", "--ctx", nargs="+", action=_Extend, type=positive_int, default=DEFAULT_CTXS,
                   help=f"context lengths in tokens (default: {' '.join(map(str, DEFAULT_CTXS))})")
    p.add_argument("--page-size", nargs="+", action=_Extend, type=_page_size, default=DEFAULT_PAGE_SIZES,
                   help="KV page sizes (default: 64)")
    p.add_argument("-d", "--dtype", choices=DTYPES, default="fp8", help="Q dtype (default: fp8)")
    p.add_argument("-kvd", "--kv-dtype", choices=DTYPES, default=None,
                   help="KV dtype (default: the Q dtype, -d)")
    p.add_argument("--varlen", action="store_true",
                   help="per-request ctx drawn log-normal with mean ctx (a serving batch)")
    p.add_argument("-o", "--output", type=Path, default=Path("bench_results"),
                   help="output folder (default: ./bench_results)")
    p.add_argument("--tag", default="",
                   help="file-name tag: results_<tag>.json etc., so sweeps can share a folder "
                        "(no path separators)")
    p.add_argument("--compile-only", action="store_true",
                   help="only render and build the variants the sweep would use (no GPU needed)")
    p.add_argument("-j", "--jobs", type=positive_int, default=None,
                   help="parallel builds (default: MAX_JOBS, else min(8, CPUs))")
    p.add_argument("--no-peers", action="store_true", help="do not time FlashInfer / FlashMLA")
    p.add_argument("--no-jit-figures", action="store_true",
                   help="skip cold-build / warm-load / dispatch figures")
    p.add_argument("--no-check", action="store_true",
                   help="skip the float64 reference spot check per row")
    p.add_argument("--seed", type=seed_value, default=0, help=f"input seed, 0..{SEED_MAX} (default: 0)")
    p.add_argument("--commit", default=None,
                   help="commit to record as measured (default: git rev-parse HEAD of this "
                        "checkout, + -dirty; for copies of the tree without .git)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def register(subparsers) -> None:
    """Add the ``bench`` sub-command to the ``aiter-mla`` parser."""
    p = subparsers.add_parser(
        "bench", help="benchmark MLA decode (the main job)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=run)


def command_line(args: argparse.Namespace) -> str:
    """The canonical command that reproduces ``args`` (for the report)."""
    parts = ["aiter-mla", "bench", "-n", *[f"{h},{q}" for h, q in args.heads_qlen],
             "-b", *map(str, args.batch), "-c", *map(str, args.ctx),
             "--page-size", *map(str, args.page_size), "-d", args.dtype]
    if args.kv_dtype is not None:   # unset: -d's
        parts += ["-kvd", args.kv_dtype]
    if args.varlen:
        parts.append("--varlen")
    parts += ["-o", str(args.output)]
    if args.tag:
        parts += ["--tag", args.tag]
    for flag in ("no_peers", "no_jit_figures", "no_check"):
        if getattr(args, flag):
            parts.append("--" + flag.replace("_", "-"))
    if args.seed:
        parts += ["--seed", str(args.seed)]
    if args.commit:
        parts += ["--commit", args.commit]
    return shlex.join(parts)


def no_gpu_reason() -> str | None:
    """Why no CUDA GPU is usable, or None when one is."""
    import torch

    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no device"
    return None


def _range_message(args: argparse.Namespace) -> str | None:
    """The sweep's sizes against the int32 limits of the ops (token counts per request, pages
    per batch in kv_indptr): a message for the first point past them, else None."""
    from .inputs import VARLEN_MAX_FACTOR

    limit = 2**31
    # --varlen draws lengths up to VARLEN_MAX_FACTOR x ctx; the bound is checked at that length
    most = VARLEN_MAX_FACTOR if getattr(args, "varlen", False) else 1
    what = f" (--varlen draws up to {VARLEN_MAX_FACTOR} x ctx)" if most > 1 else ""
    for c in args.ctx:
        if c * most >= limit:
            return f"-c {c}: a request must have < 2**31 KV tokens (int32 token counts){what}"
    for b in args.batch:
        for c in args.ctx:
            for page in args.page_size:
                pages = b * -(-c * most // page)
                if pages >= limit:
                    return (f"-b {b} -c {c} --page-size {page}: up to {pages} KV pages in one batch"
                            f"{what}; the page counts (kv_indptr) are int32, so they must stay < 2**31")
    return None


def _default_jobs() -> int:
    """MAX_JOBS when set (> 0), as for ``jit build``; else min(8, CPUs)."""
    from .. import env

    n = env.get_int("MAX_JOBS", 0)
    return n if n > 0 else min(8, os.cpu_count() or 1)


def _tag_message(args: argparse.Namespace) -> str | None:
    """Why ``--tag`` cannot name the result files, or None (checked before the sweep: the files
    are written only after it, so a bad tag used to lose the whole run)."""
    tag = args.tag or ""
    if any(c and c in tag for c in (os.sep, os.altsep, "\0")):
        return (f"--tag {tag!r}: it becomes part of file names (results_<tag>.json, .md and the "
                f"plots), so it cannot hold a path separator")
    from .report import file_names

    longest = max(file_names(tag).values(), key=lambda n: len(os.fsencode(n)))
    if len(os.fsencode(longest)) > 255:   # NAME_MAX of common file systems
        return (f"--tag: {len(os.fsencode(tag))} bytes make the file name {longest[:24]}... "
                f"{len(os.fsencode(longest))} bytes long, over the 255 a file name may have")
    return None


def output_folder_message(output) -> str | None:
    """Why ``-o OUTPUT`` could not take the results, or None; checked before a GPU sweep (as the
    tag), so its measurements are not lost at the write (also scripts/template_ab.py's and
    phase_budget.py's ``-o``)."""
    from ..paths import unmakeable_folder_reason

    reason = unmakeable_folder_reason(output, probe_write=True)
    return f"-o {output}: {reason}, so the results could not be saved" if reason else None


def run(args: argparse.Namespace) -> int:
    """Entry point of ``aiter-mla bench``; returns the exit status."""
    if getattr(args, "kv_dtype", None) is None:   # "-d bf16" alone means bf16 Q and KV
        args.kv_dtype = args.dtype
    if getattr(args, "jobs", None) is None:
        args.jobs = _default_jobs()
    message = _range_message(args) or _tag_message(args)
    if message:   # also under --compile-only: a sweep the GPU run would refuse fails here first
        print(f"aiter-mla bench: error: {message}", file=sys.stderr)
        return 2
    if args.dtype != args.kv_dtype:
        print(f"aiter-mla bench: error: -d {args.dtype} with -kvd {args.kv_dtype}: the kernels take Q and "
              f"KV of one dtype (fp8/fp8 or bf16/bf16; -d defaults to fp8, -kvd to -d): give -d "
              f"and -kvd the same value", file=sys.stderr)
        return 2
    variants, message = _variants_or_message(args)
    if message:   # an unsupported shape: an argument error, named before the GPU check
        print(message, file=sys.stderr)
        return 2
    if args.compile_only:
        return compile_only(args, variants)   # writes nothing into -o
    message = output_folder_message(args.output)
    if message:
        print(f"aiter-mla bench: error: {message}", file=sys.stderr)
        return 2
    reason = no_gpu_reason()
    if reason is not None:
        print(f"aiter-mla bench: error: no CUDA GPU visible ({reason}); use --compile-only to build the "
              "variants", file=sys.stderr)
        return 2
    return bench(args, variants)


def _variants_or_message(args):
    from .variants import sweep_variants

    try:
        return sweep_variants(args.heads_qlen, args.page_size, args.dtype, args.kv_dtype), None
    except NotImplementedError as exc:
        return None, f"aiter-mla bench: error: {exc}"


def _report_build_failures(results, table_shown: bool = False) -> int:
    """Print each failed build (after a build table, which already gives each one's error,
    only those with more to say: the compiler's output) and the count; the count returned."""
    failed = [r for r in results if not r.ok]
    for r in failed:
        if table_shown and not r.detail:
            continue
        print(f"aiter-mla bench: {r.variant.label()} failed: {r.error}", file=sys.stderr)
        for line in r.detail:
            print(f"    {line}", file=sys.stderr)
    if failed:
        print(f"aiter-mla bench: {len(failed)} of {len(results)} variants failed to build",
              file=sys.stderr)
    return len(failed)


def compile_only(args: argparse.Namespace, variants) -> int:
    """Build ``variants`` (every one the sweep would use); print the build table; non-zero on a
    failure."""
    from .variants import build_variants, format_build_table

    t0 = time.perf_counter()
    results = build_variants(variants, args.jobs, progress=not args.no_progress)
    print(format_build_table(results))
    print(f"{len(results)} variants in {time.perf_counter() - t0:.1f} s wall "
          f"({args.jobs} job{'' if args.jobs == 1 else 's'})")
    return 1 if _report_build_failures(results, table_shown=True) else 0


def bench_device():
    """The GPU the sweep runs on: torch's current CUDA device."""
    import torch

    return torch.device("cuda", torch.cuda.current_device())


def bench(args: argparse.Namespace, variants) -> int:
    """The full sweep on the current GPU (see the module docstring); ``variants``: the sweep's
    (``sweep_variants``)."""
    import torch

    from .. import arch
    from . import ceilings as ceil_mod
    from ..paths import checkout_commit
    from . import environment, host_time, inputs, jit_figures, peers as peers_mod, power, report, sweep
    from .formulas import ELEM_BYTES
    from .variants import build_variants

    t_start = time.perf_counter()
    progress = not args.no_progress
    device = bench_device()
    specs = sweep.plan_rows(args.heads_qlen, args.batch, args.ctx, args.page_size, args.dtype,
                            args.kv_dtype, args.varlen, args.seed)
    if not specs:
        print("aiter-mla bench: no rows (every ctx is shorter than its qlen)", file=sys.stderr)
        return 1
    if args.no_peers:
        peers, notes = [], ["peers not run (--no-peers)"]
    else:
        peers, notes = peers_mod.discover()

    cold_pool, cold_futures = (None, [])
    if not args.no_jit_figures:
        # Child processes with their own fresh caches: they run while this process builds (or
        # loads) the same variants in the normal cache and then times the sweep, which their
        # CPU load does not disturb (GPU-side timing of graph replays).
        cold_pool, cold_futures = jit_figures.start_cold_builds(variants, args.jobs)
    builds = build_variants(variants, args.jobs, progress=progress)
    if _report_build_failures(builds):
        if cold_pool is not None:
            cold_pool.shutdown(wait=True, cancel_futures=True)
        return 1

    ceilings = ceil_mod.measure()
    print(f"ceilings (this run): {report.ceilings_text(ceilings)}", flush=True)
    if "read_error" in ceilings:
        notes.append(f"read_TBps not measured ({ceilings['read_error']}): the floor uses copy_TBps")
    sampler = power.Sampler(power.nvml_id(device.index))
    if sampler.source is None:
        notes.append(power.NO_SOURCE_NOTE)
    l2 = sweep.l2_bytes(device)
    pool_tokens = inputs.pool_tokens_for(sweep.max_needed_tokens(specs), l2, ELEM_BYTES[args.kv_dtype])
    pool = sweep.KVPool(pool_tokens, args.kv_dtype, device, args.seed)
    ctx = sweep.SweepContext(device, pool, ceilings, l2, arch.num_cu(device), peers,
                             check=not args.no_check, sampler=sampler)
    rows = sweep.run_sweep(specs, ctx, progress=progress)

    jit = {}
    if not args.no_jit_figures:
        cold = [f.result() for f in cold_futures]
        cold_pool.shutdown()
        try:   # after the cold builds: no build runs while the host time is taken
            dispatch = host_time.host_times(args.heads_qlen[0][0], args.dtype)
        except Exception as exc:  # the figure is reported missing, the sweep's results stand
            dispatch = {"error": f"{type(exc).__name__}: {exc}"}
        jit = {"variants": [{"label": v.label(), "name": v.name, "params": v.params, "cold": c,
                             "warm": jit_figures.warm_load(v), "build_in_run_s": b.seconds}
                            for v, c, b in zip(variants, cold, builds)],
               "dispatch": dispatch,
               "notes": [f"Cold builds ran in {min(args.jobs, len(variants))} parallel child "
                         "processes while this process loaded the variants and ran the sweep."]}
    del ctx, pool

    doc = report.build_results(
        args.commit or checkout_commit(args.output), environment.machine(), environment.versions(peers), ceilings, rows,
        notes=notes, jit=jit,
        config={"command": command_line(args), "timing": TIMING_TEXT, "layers": sweep.LAYERS,
                "step_max_floor_us": sweep.STEP_MAX_FLOOR_US,
                "sm_scale": inputs.deepseek_v3_sm_scale(), "l2_bytes": l2,
                "pool_tokens": pool_tokens, "check_max_ctx": sweep.CHECK_MAX_CTX,
                "check_requests": sweep.CHECK_REQUESTS, "check_tol": sweep.CHECK_TOL,
                "max_split_per_batch": "AITER test_mla_persistent.py: 32; heads >= 128: "
                                       "min(ceil(num_CU / batch), 32)",
                "gpu_sampling": {"source": sampler.source, "gpu": sampler.gpu},
                "seed": args.seed, "wall_s": time.perf_counter() - t_start})
    print(report.render_stdout(doc))
    paths = report.write_outputs(doc, args.output, args.tag)
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    errors = [r for r in rows if r.get("error")]
    bad = [r for r in rows if r.get("ref_ok") is False]
    for r in errors:
        print(f"aiter-mla bench: row heads {r['heads']} qlen {r['qlen']} batch {r['batch']} ctx "
              f"{r['ctx']} failed: {r['error']}", file=sys.stderr)
    for r in bad:
        print(f"aiter-mla bench: row heads {r['heads']} qlen {r['qlen']} batch {r['batch']} ctx "
              f"{r['ctx']}: output differs from the float64 reference (rel-L2 "
              f"{r['ref_rel_err']:.3g} > {sweep.CHECK_TOL[r['kv_dtype']]})", file=sys.stderr)
    print(f"total {time.perf_counter() - t_start:.0f} s", file=sys.stderr)
    return 1 if (errors or bad) else 0
