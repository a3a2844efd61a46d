"""JIT figures for the report: cold build and warm load, each in a new process.

- cold build: ``get_module`` in a child process whose ``AITER_MLA_CACHE_DIR`` is a fresh
  temporary folder (so render, key, compile and load all happen), timed inside the child; the
  folder is checked afterwards: if the JIT wrote nothing there, the figure is flagged as not cold.
- warm load: ``import aiter_mla`` and ``aiter_mla.jit``, then ``get_module`` in a child using
  the normal cache (after the sweep has built the variant), the two timed separately (the same
  split as ``docs/perf/jit.md``: the budget is for ``get_module`` after the imports).

The ops' host time per warm call needs the GPU and lives in :mod:`aiter_mla.bench.host_time`.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from .. import env, paths
from .variants import Variant

_MARK = "AITER_MLA_BENCH_RESULT "
# The child puts this checkout first on sys.path, so it times the same code as the parent.
_CHILD = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
spec = json.loads(sys.argv[2])
t0 = time.perf_counter()
import aiter_mla
from aiter_mla.jit import get_module
t1 = time.perf_counter()
get_module(spec["name"], **spec["params"])
t2 = time.perf_counter()
print(%r + json.dumps({"import_s": t1 - t0, "get_module_s": t2 - t1}))
""" % _MARK


def _run_child(v: Variant, overrides: dict[str, str], timeout: float) -> dict:
    """Run the timing child; returns its figures plus ``process_s``, or ``{"error": ...}``."""
    cmd = [sys.executable, "-c", _CHILD, str(paths.REPO_ROOT),
           json.dumps({"name": v.name, "params": v.params})]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env=env.child_environ(**overrides))
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    wall = time.perf_counter() - t0
    for line in proc.stdout.splitlines():
        if line.startswith(_MARK):
            out = json.loads(line[len(_MARK):])
            out["process_s"] = wall
            return out
    tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
    return {"error": f"child exited {proc.returncode}: {tail}"}


def cold_build(v: Variant, timeout: float = 1800.0) -> dict:
    """``{"cold_build_s", "process_s", "import_s"}`` for ``v`` built in a fresh temporary cache
    (or ``{"error"}``); ``"not_cold"`` is set when the child left the temporary cache empty."""
    tmp = Path(tempfile.mkdtemp(prefix="aiter_mla_cold_"))
    try:
        out = _run_child(v, {"AITER_MLA_CACHE_DIR": str(tmp)}, timeout)
        if "error" not in out:
            out["cold_build_s"] = out.pop("get_module_s")
            if not any(tmp.rglob("*")):
                out["not_cold"] = ("the JIT wrote nothing under AITER_MLA_CACHE_DIR: this was a "
                                   "hit in another cache, not a cold build")
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def warm_load(v: Variant, timeout: float = 300.0) -> dict:
    """``{"import_s", "warm_load_ms", "process_s"}``: a new process loading an already-built
    ``v`` from the normal cache (or ``{"error"}``)."""
    out = _run_child(v, {}, timeout)
    if "error" not in out:
        out["warm_load_ms"] = out.pop("get_module_s") * 1e3
    return out


def start_cold_builds(variants: list[Variant], jobs: int) -> tuple[ThreadPoolExecutor, list[Future]]:
    """Start :func:`cold_build` for every variant in background threads (each a child
    process); the caller joins the futures when it needs the figures."""
    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    return pool, [pool.submit(cold_build, v) for v in variants]
