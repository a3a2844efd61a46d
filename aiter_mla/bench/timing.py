"""GPU timing: CUDA events around CUDA-graph replays of many back-to-back calls.

Why graphs: a decode call at small batch runs in ~10 µs, about as long as the host needs to
launch it, so timing eager calls would time Python. Each graph holds ``calls_per_graph`` calls;
the graphs are replayed round robin, so the calls of one replay use different input sets from
the replays before it (see :mod:`aiter_mla.bench.inputs`), and the reported figure is the
median over replays of (replay time / calls in it).

If a call cannot be captured (an op that synchronises with the host), the same schedule runs
eagerly between the events and the result says ``method = "eager"``.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass
class Timing:
    """Median µs per call, with how it was obtained."""

    us: float
    samples: int
    calls_per_sample: int
    method: str  # "graph" or "eager"
    note: str = ""

    def as_dict(self) -> dict:
        d = {"us": self.us, "samples": self.samples, "calls_per_sample": self.calls_per_sample,
             "method": self.method}
        if self.note:
            d["note"] = self.note
        return d


def calls_per_graph(est_us: float, target_us: float = 400.0, cap: int = 64) -> int:
    """Calls per replay so one replay lasts about ``target_us`` (1 .. ``cap``): long enough that
    the replay's own launch gap (a few µs) is noise, short enough to keep many samples."""
    if est_us <= 0:
        return cap
    return max(1, min(cap, round(target_us / est_us)))


def median(xs: Sequence[float]) -> float:
    """Median of a non-empty sequence (ValueError when empty)."""
    if not xs:
        raise ValueError("median of an empty sequence")
    return float(statistics.median(xs))


def time_calls(
    fns: Sequence[Callable[[], object]], per_sample: int, min_samples: int = 10,
    max_samples: int = 30, budget_s: float = 1.0,
) -> Timing:
    """Median GPU µs per call of ``fns`` (called in order, ``per_sample`` per timed unit).

    ``len(fns)`` must be a positive multiple of ``per_sample``. Each group of ``per_sample``
    consecutive calls is captured into one CUDA graph; after one warm-up replay of every graph,
    graphs are replayed round robin and timed with CUDA events until ``max_samples`` samples,
    or ``min_samples`` once ``budget_s`` of wall time has passed. Raises ValueError on a bad
    ``per_sample``; exceptions from ``fns`` themselves propagate.
    """
    import torch

    if per_sample < 1 or len(fns) == 0 or len(fns) % per_sample:
        raise ValueError(f"len(fns)={len(fns)} must be a positive multiple of per_sample={per_sample}")
    groups = [fns[i:i + per_sample] for i in range(0, len(fns), per_sample)]
    fns[0]()  # lazy initialisation (module load, workspaces) must not happen inside a capture
    torch.cuda.synchronize()
    method, note = "graph", ""
    runners: list[Callable[[], None]] = []
    graphs = []
    try:
        pool = torch.cuda.graph_pool_handle()
        for group in groups:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                for fn in group:
                    fn()
            graphs.append(g)
        runners = [g.replay for g in graphs]
    except Exception as exc:  # an op that syncs or allocates on the host cannot be captured
        graphs.clear()
        torch.cuda.synchronize()
        first_line = (str(exc).splitlines() or [""])[0]
        method, note = "eager", f"graph capture failed ({type(exc).__name__}: {first_line})"

        def make(group):
            def run():
                for fn in group:
                    fn()
            return run

        runners = [make(group) for group in groups]
    for run in runners:  # warm-up: one pass over every input set
        run()
    torch.cuda.synchronize()
    times_ms: list[float] = []
    t_start = time.perf_counter()
    i = 0
    while len(times_ms) < max_samples:
        batch = min(10, max_samples - len(times_ms))
        events = []
        for _ in range(batch):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            runners[i % len(runners)]()
            end.record()
            events.append((start, end))
            i += 1
        torch.cuda.synchronize()
        times_ms.extend(s.elapsed_time(e) for s, e in events)
        if len(times_ms) >= min_samples and time.perf_counter() - t_start > budget_s:
            break
    us = median(times_ms) * 1000.0 / per_sample
    return Timing(us, len(times_ms), per_sample, method, note)


def time_repeated(fn: Callable[[], object], reps: int = 20, warmup: int = 3) -> float:
    """Median GPU ms of ``fn`` over ``reps`` eager runs (for long kernels: GEMMs, big copies)."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    events = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    return median([s.elapsed_time(e) for s, e in events])
