"""CUDA-graph timing shared by the scripts/dev device checks (fp8_loop_check.py, rs_knockout.py,
fixed_cost_probe.py, dual_timeline_probe.py, cta_timeline_probe.py, metadata_ab.py), on the
bench's own timer."""
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


def split_times(c, bufs, heads, qlen):
    """(decode + reduce, decode alone, reduce alone) in µs for case ``c`` with ``T.plan``
    buffers ``bufs``: the op, ``hk_mla_decode_fwd`` into fresh partial buffers, and
    ``mla_reduce_v1`` on them, each timed by :func:`graph_us`."""
    import aiter_mla
    (_meta, work_indptr, work_info_set, reduce_indptr, reduce_final_map, reduce_partial_map) = bufs
    o = torch.empty((c.q.shape[0], heads, 512), dtype=torch.bfloat16, device="cuda")
    n_part = int(reduce_partial_map.numel())
    split_o = torch.empty((max(1, n_part) * qlen, 1, heads, 512), dtype=torch.float32, device="cuda")
    split_lse = torch.empty((max(1, n_part) * qlen, 1, heads, 1), dtype=torch.float32, device="cuda")
    full = graph_us(lambda: T.decode_with(c, bufs, o, lse_out=False))
    dec_only = graph_us(lambda: aiter_mla.hk_mla_decode_fwd(
        c.q, c.kv, c.qo_indptr, c.kv_indptr, c.kv_indices, c.kv_last_page_lens, work_indptr, work_info_set,
        c.max_seqlen_q, T.SM_SCALE, split_o, split_lse, o, q_scale=c.q_scale, kv_scale=c.kv_scale))
    red_only = graph_us(lambda: aiter_mla.mla_reduce_v1(split_o, split_lse, reduce_indptr, reduce_final_map,
                                                         reduce_partial_map, c.max_seqlen_q, o))
    return full, dec_only, red_only
