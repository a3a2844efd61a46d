"""Time ``get_mla_metadata_v1`` (the split-KV scheduler kernel) on the GPU.

Writes ``docs/perf/metadata_h200.json`` and ``.md`` (or ``--out DIR``). Per shape:

* ``graph_us``: GPU time per call, from a CUDA graph of 20 back-to-back calls replayed 20
  times (what a decode step captured in a graph pays);
* ``eager_us``: wall time per call of 200 eager calls in a row, then one sync (the larger of
  the host cost of the Python op + one ctypes launch and the GPU time);
* ``tiles``: tiles of 1024 batches the kernel walks (what its time grows with; each is a few
  block-wide scans), next to ``works``, ``cuts`` (= works - batch) and ``num_clusters``.

Every shape's buffers are first checked against the CPU reference. Run on the GPU machine:
``python3 op_tests/bench_metadata.py`` (``--quick`` for three shapes).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from aiter_mla import arch  # noqa: E402
from aiter_mla.paths import checkout_commit  # noqa: E402
from aiter_mla.ops import metadata as md  # noqa: E402
from aiter_mla.ops.metadata_reference import reference_schedule  # noqa: E402


def _inputs(batch, ctx, varlen, page_size, qlen, seed=0):
    rng = random.Random(seed)
    lens = [rng.randint(max(1, ctx // 8), ctx) if varlen else ctx for _ in range(batch)]
    qo, kv, lpl = [0], [0], []
    for t in lens:
        pages = -(-t // page_size)
        kv.append(kv[-1] + pages)
        lpl.append(t - (pages - 1) * page_size)
        qo.append(qo[-1] + qlen)
    return qo, kv, lpl


def bench_one(batch, ctx, varlen, page_size, heads=128, qlen=1, calls=20, replays=20, check=True):
    """One row: inputs on the current GPU, checked against the reference (unless ``check`` is
    False: for timing kernels that schedule differently), then
    timed."""
    G = md.default_kv_granularity(page_size)
    qo, kv, lpl = _inputs(batch, ctx, varlen, page_size, qlen)
    dev = torch.device("cuda", torch.cuda.current_device())
    t = lambda x: torch.tensor(x, dtype=torch.int32, device=dev)  # noqa: E731
    qo_d, kv_d, lpl_d = t(qo), t(kv), t(lpl)
    info = md.get_mla_metadata_info_v1(batch, qlen, heads, torch.float8_e4m3fn,
                                       torch.float8_e4m3fn)
    bufs = [torch.empty(s, dtype=d, device=dev) for s, d in info]
    ptrs, indptr, info_set, rindptr, final, partial = bufs

    def op():
        md.get_mla_metadata_v1(qo_d, kv_d, lpl_d, heads, 1, False, ptrs, info_set, indptr,
                               rindptr, final, partial, page_size=page_size, kv_granularity=G,
                               max_seqlen_qo=qlen, dtype_q=torch.float8_e4m3fn,
                               dtype_kv=torch.float8_e4m3fn)

    op()
    torch.cuda.synchronize()
    nc = arch.num_clusters(heads, qlen)
    W = int(indptr[nc])
    if check:
        s = reference_schedule(qo, kv, lpl, num_heads=heads, num_clusters=nc, page_size=page_size,
                               kv_granularity=G, max_seqlen_qo=qlen)
        assert W == len(s.work_info)
        assert indptr.cpu().tolist()[: nc + 1] == s.work_indptr
        assert info_set[:W].cpu().tolist() == [list(r) for r in s.work_info]
    cuts = W - batch
    tiles = -(-batch // 1024)  # MD_THREADS batches per tile (templates/mla_metadata.cu.j2)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        op()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            op()
    g.replay()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        g.replay()
    stop.record()
    torch.cuda.synchronize()
    graph_us = start.elapsed_time(stop) * 1e3 / (calls * replays)

    n = 200
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        op()
    torch.cuda.synchronize()
    eager_us = (time.perf_counter() - t0) * 1e6 / n
    return {"batch": batch, "ctx": ctx, "varlen": varlen, "heads": heads, "qlen": qlen,
            "page_size": page_size, "kv_granularity": G, "num_clusters": nc, "works": W,
            "cuts": cuts, "tiles": tiles, "graph_us": round(graph_us, 2),
            "eager_us": round(eager_us, 2)}


def bench_metadata(shapes) -> list[dict]:
    """Rows for (batch, ctx, varlen, page_size) shapes."""
    return [bench_one(*shape) for shape in shapes]


def write_report(rows, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {"commit": checkout_commit(out_dir), "machine": torch.cuda.get_device_name(),
           "versions": {"torch": torch.__version__, "cuda": torch.version.cuda},
           "rows": rows}
    (out_dir / "metadata_h200.json").write_text(json.dumps(doc, indent=1) + "\n")
    lines = [
        "# get_mla_metadata_v1 on the H200",
        "",
        f"commit `{doc['commit']}`, {doc['machine']}, torch {doc['versions']['torch']}, "
        f"CUDA {doc['versions']['cuda']}. Written by `op_tests/bench_metadata.py`.",
        "",
        "`graph_us`: GPU time per call inside a CUDA graph (20 calls x 20 replays). "
        "`eager_us`: wall time per eager call (host Python + ctypes launch, or the GPU, "
        "whichever is slower). `tiles`: tiles of 1024 batches the kernel walks. "
        "Goal: graph_us < 10 at batch 256, <= 15 at batch 4096.",
        "",
        "| batch | ctx | varlen | page | G | clusters | works | cuts | tiles | graph µs | eager µs |",
        "|---:|---:|:---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['batch']} | {r['ctx']} | {'yes' if r['varlen'] else 'no'} | "
                     f"{r['page_size']} | {r['kv_granularity']} | {r['num_clusters']} | "
                     f"{r['works']} | {r['cuts']} | {r['tiles']} | {r['graph_us']} | {r['eager_us']} |")
    (out_dir / "metadata_h200.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "perf")
    ap.add_argument("--quick", action="store_true", help="three shapes only")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_metadata: needs a CUDA GPU", file=sys.stderr)
        return 1
    if args.quick:
        shapes = [(256, 8192, False, 64), (256, 8192, False, 1), (4096, 8192, False, 64)]
    else:
        shapes = [(b, 8192, v, ps) for ps in (64, 1) for v in (False, True)
                  for b in (1, 16, 64, 256, 1024, 4096)]
        shapes.append((40000, 2048, True, 16))  # 40 tiles: the multi-tile path
    rows = bench_metadata(shapes)
    for r in rows:
        print(r)
    write_report(rows, args.out)
    print(f"wrote {args.out / 'metadata_h200.json'} and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
