"""Host time per warm eager call of the three ops (``aiter-mla bench`` reports it; run a tree's
own copy, ``python -m aiter_mla.bench.host_time``, to time that tree).

Method: one small problem (batch 1, 64 tokens, page 64), so the GPU finishes each call long
before the host issues the next and the loop's time is the ops' own host time. Every op is
called first until its modules are built and loaded (no build runs while timing); then ``reps``
rounds of ``calls`` calls each, timed with ``time.perf_counter``, median round reported in µs
per call. ``mla_decode_fwd`` is timed with a caller-made plan and caller-given output, both with
AITER's freshly allocated split buffers (``alloc``) and with caller-given ones (``no_alloc``);
this problem's one tile is not split, so the merge runs in the decode launch (``split_merge``
"fused"); ``no_alloc_chained`` times the same call with the reduce kernel chained, as a
schedule with a tile of more than FUSED_MERGE_MAX_PIECES pieces gets it. ``planner_plan`` /
``planner_run``: ``MlaDecodePlanner.plan`` and ``run`` (caller-given output) on the same problem.
"""
from __future__ import annotations

import statistics
import time


def _rounds(fn, calls: int, reps: int) -> dict:
    import torch

    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per_call.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return {"us": statistics.median(per_call), "rounds_us": per_call}


def host_times(heads: int = 128, dtype: str = "fp8", calls: int = 200, reps: int = 7,
               device: str = "cuda", progress=None) -> dict:
    """Host µs per warm call: ``get_mla_metadata_v1``, ``mla_decode_fwd`` (alloc / no_alloc),
    ``mla_reduce_v1``, and their shape; ``progress(name, figures)`` is called after each.
    Raises RuntimeError without a GPU."""
    import torch

    import aiter_mla
    from aiter_mla.ops import metadata

    if not torch.cuda.is_available():
        raise RuntimeError("host_times needs a CUDA GPU")
    dt = {"fp8": torch.float8_e4m3fn, "bf16": torch.bfloat16}[dtype]
    B, ctx, P, qlen = 1, 64, 64, 1
    i32 = dict(dtype=torch.int32, device=device)
    g = torch.Generator(device="cpu").manual_seed(7)
    kv = torch.randn(4, P, 1, 576, generator=g).to(device).to(dt)
    q = torch.randn(B * qlen, heads, 576, generator=g).to(device).to(dt)
    o = torch.empty(B * qlen, heads, 512, dtype=torch.bfloat16, device=device)
    qo_indptr = torch.arange(B + 1, **i32) * qlen
    kv_indptr = torch.arange(B + 1, **i32)
    kv_indices = torch.arange(B, **i32)
    last = torch.full((B,), ctx, **i32)
    info = metadata.get_mla_metadata_info_v1(B, qlen, heads, dt, dt, is_sparse=False, fast_mode=True)
    bufs = [torch.empty(shape, dtype=d, device=device) for shape, d in info]
    (wmd, work_indptr, work_info_set, reduce_indptr, reduce_final_map, reduce_partial_map) = bufs
    gran = metadata.default_kv_granularity(P)

    def plan():
        aiter_mla.get_mla_metadata_v1(
            qo_indptr, kv_indptr, last, heads, 1, True, wmd, work_info_set, work_indptr,
            reduce_indptr, reduce_final_map, reduce_partial_map, page_size=P,
            kv_granularity=gran, max_seqlen_qo=qlen, uni_seqlen_qo=qlen, fast_mode=True,
            dtype_q=dt, dtype_kv=dt)

    plan()
    kw = dict(page_size=P, work_meta_data=wmd, work_indptr=work_indptr,
              work_info_set=work_info_set, reduce_indptr=reduce_indptr,
              reduce_final_map=reduce_final_map, reduce_partial_map=reduce_partial_map)

    def decode(**extra):
        return aiter_mla.mla_decode_fwd(q, kv, o, qo_indptr, kv_indptr, kv_indices, last, qlen,
                                        **kw, **extra)

    logits, _ = decode()
    attn_lse = torch.empty(tuple(logits.shape[:-1]) + (1,), dtype=torch.float32, device=device)
    out = {"shape": {"heads": heads, "qlen": qlen, "batch": B, "ctx": ctx, "page_size": P,
                     "dtype": dtype}, "calls": calls, "reps": reps}
    def reduce():
        aiter_mla.mla_reduce_v1(logits, attn_lse, reduce_indptr, reduce_final_map,
                                reduce_partial_map, qlen, o, None)

    timed = [("get_mla_metadata_v1", plan), ("mla_decode_fwd_alloc", decode),
             ("mla_decode_fwd_no_alloc", lambda: decode(logits=logits, attn_lse=attn_lse)),
             ("mla_reduce_v1", reduce)]
    for name, fn in timed:
        out[name] = _rounds(fn, calls, reps)
        if progress:
            progress(name, out[name])
    # The no-alloc call again with the merge in the chained reduce kernel (two launches), as a
    # schedule with a heavy tile gets it: the device's hint set by hand (no metadata kernel
    # runs while timing, so none rewrites it).
    from aiter_mla.ops import errors

    hint = errors.sink(torch.cuda.current_device()).split_heavy_tiles
    out["split_merge"] = "fused" if hint.value == 0 else "chained"
    saved, hint.value = hint.value, 1
    out["mla_decode_fwd_no_alloc_chained"] = _rounds(lambda: decode(logits=logits, attn_lse=attn_lse), calls, reps)
    hint.value = saved
    if progress:
        progress("mla_decode_fwd_no_alloc_chained", out["mla_decode_fwd_no_alloc_chained"])
    # The engine API over the same problem (docs/DESIGN.md §4.3): plan() per step, run() per
    # layer with a caller-given output (the planner owns the split buffers).
    planner = aiter_mla.MlaDecodePlanner(B, heads, sm_scale=1.0, max_num_pages=kv.shape[0],
                                         page_size=P, max_seqlen_q=qlen, dtype=dt, device=device)
    planner.plan(qo_indptr, kv_indptr, kv_indices, last)
    for name, fn in (("planner_plan", lambda: planner.plan(qo_indptr, kv_indptr, kv_indices, last)),
                     ("planner_run", lambda: planner.run(q, kv, o))):
        out[name] = _rounds(fn, calls, reps)
        if progress:
            progress(name, out[name])
    out["launch_floor"] = _launch_floor(decode, logits, attn_lse, q, o, calls, reps)
    if progress:
        progress("launch_floor", out["launch_floor"])
    out["get_module_memo_us"] = _memo_us(heads, qlen, P, dt)
    out["python_ref_us"] = _python_ref_us(q)
    torch.cuda.synchronize()
    return out


def _launch_floor(decode, logits, attn_lse, q, o, calls: int, reps: int):
    """µs of the prepared decode launch alone (one ctypes call into the decode entry point and
    its CUDA launches: one with the merge fused, two with the reduce chained): what a warm call
    costs beyond its key."""
    from aiter_mla.ops import decode as dec

    decode(logits=logits, attn_lse=attn_lse)
    p = [p for p in dec._prepared.entries.values() if p.reduce is not None][-1]
    ptrs = (q.data_ptr(), o.data_ptr(), None, logits.data_ptr(), attn_lse.data_ptr())
    return _rounds(lambda: p.launch(*ptrs), calls, reps)


def _python_ref_us(t, n: int = 20000) -> float:
    """µs of a fixed piece of Python of the kind a warm call runs (20 ``id`` and 10
    ``data_ptr`` of a tensor into a tuple): the process's interpreter speed, so that figures
    from processes that run faster or slower can be told apart."""
    t0 = time.perf_counter()
    for _ in range(n):
        (id(t), t.data_ptr(), id(t), t.data_ptr(), id(t), t.data_ptr(), id(t), t.data_ptr(),
         id(t), t.data_ptr(), id(t), t.data_ptr(), id(t), t.data_ptr(), id(t), t.data_ptr(),
         id(t), t.data_ptr(), id(t), t.data_ptr(), id(t), id(t), id(t), id(t), id(t), id(t),
         id(t), id(t), id(t), id(t))
    return (time.perf_counter() - t0) / n * 1e6


def _memo_us(heads, qlen, page_size, dt, n: int = 10000) -> float:
    """µs per in-process ``get_module`` hit of the decode variant (the JIT memo)."""
    from aiter_mla.jit import get_module
    from aiter_mla.ops.decode import decode_variant

    params = decode_variant(heads, qlen, page_size, dt, dt)
    t0 = time.perf_counter()
    for _ in range(n):
        get_module("mla_decode", **params)
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    """``python -m aiter_mla.bench.host_time [OUT.json]``: print the figures (and write them)."""
    import json
    import sys

    res = host_times(progress=lambda name, r: print(f"{name:26s} {r['us']:8.2f} us/call" if r
                                                      else f"{name:26s} -", flush=True))
    text = json.dumps(res, indent=1)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
