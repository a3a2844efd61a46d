"""CUDA-graph timing shared by the scripts/dev device checks (fp8_loop_check.py, rs_knockout.py,
fixed_cost_probe.py)."""
import torch

import op_tests.test_mla_persistent as T


def graph_us(fn, reps=20, calls=8):
    """Median µs per call of ``fn`` (run once first): ``calls`` calls captured in one graph,
    ``reps`` replays."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1000 / calls)
    ts.sort()
    return ts[len(ts) // 2]


def time_case(c, bufs, heads, reps=20, calls=8):
    """Median µs per decode + reduce call of case ``c`` (``T.plan`` buffers ``bufs``). Returns
    (µs, the output tensor)."""
    o = torch.empty((c.q.shape[0], heads, 512), dtype=torch.bfloat16, device="cuda")
    return graph_us(lambda: T.decode_with(c, bufs, o, lse_out=False), reps, calls), o
