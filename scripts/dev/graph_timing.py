"""CUDA-graph timing shared by the scripts/dev device checks (fp8_loop_check.py, rs_knockout.py,
fixed_cost_probe.py, dual_timeline_probe.py), on the bench's own timer."""
import torch

import op_tests.test_mla_persistent as T
from aiter_mla.bench.timing import time_calls


def graph_us(fn, reps=20, calls=8):
    """Median µs per call of ``fn``: ``calls`` calls captured in one graph, ``reps`` replays
    (aiter_mla.bench.timing.time_calls; a capture failure is an error here, not an eager
    fallback)."""
    t = time_calls([fn] * calls, per_sample=calls, min_samples=reps, max_samples=reps)
    if t.method != "graph":
        raise RuntimeError(f"graph timing fell back to {t.method}: {t.note}")
    return t.us


def time_case(c, bufs, heads, reps=20, calls=8):
    """Median µs per decode + reduce call of case ``c`` (``T.plan`` buffers ``bufs``). Returns
    (µs, the output tensor)."""
    o = torch.empty((c.q.shape[0], heads, 512), dtype=torch.bfloat16, device="cuda")
    return graph_us(lambda: T.decode_with(c, bufs, o, lse_out=False), reps, calls), o
