"""``aiter-mla metadata``: print the split-KV schedule of a batch shape, cluster by cluster.

For "why is my batch slow": the per-cluster loads show how evenly the KV is spread (the decode
time is roughly the busiest cluster's), the split table shows which batches were cut and how
many partial rows the reduce has to merge. The schedule is the CPU reference's
(:mod:`aiter_mla.ops.metadata_reference`), which the device kernel matches exactly.
"""
from __future__ import annotations

import json
import random

from .. import arch, env
from ..bench.commands import SEED_MAX, seed_value
from ..cli_errors import CommandLineError
from ..work_info import WI

#: Upper bound of --clusters: 2 x CU_NUM's bound (m16x4 runs two clusters per CU); a typo such
#: as 2000000000 would otherwise size the schedule's buffers in the billions.
MAX_CLUSTERS = 2 * env.registry()["CU_NUM"].maximum
#: Upper bound of --batch: a typo such as 100000000 ran for ~10 minutes in tens of GB.
MAX_BATCH = 1 << 20
#: The scheduler's argument names as this command's flags, for its error messages.
_FLAGS = {"num_heads": "--heads", "num_clusters": "--clusters", "page_size": "--page-size",
          "kv_granularity": "--kv-granularity", "max_seqlen_qo": "--qlen",
          "max_split_per_batch": "--max-split-per-batch"}


def _int_list(text: str, name: str) -> list[int]:
    """``a,b,c`` as ints; an empty item (``1,,2``, a trailing comma) is refused, not dropped: it
    would shift which length each batch gets."""
    items = text.split(",")
    if any(not x.strip() for x in items):
        raise CommandLineError(f"--{name} has an empty item: an int or a comma list of ints, got {text!r}")
    try:
        return [int(x) for x in items]
    except ValueError:
        raise CommandLineError(f"--{name} must be an int or a comma list of ints, got {text!r}") from None


def _no_more_than_batch(vals: list[int], batch: int, name: str, text: str) -> None:
    """A list is cycled over the batch, so more items than requests would be dropped unread:
    refused (a typo in --batch or the list), as is an empty one."""
    if not vals:
        raise CommandLineError(f"--{name} is empty")
    if len(vals) > max(batch, 1):
        raise CommandLineError(f"--{name} lists {len(vals)} values for --batch {batch}: give at most "
                               f"{max(batch, 1)} (one a request; a list is cycled over the batch), got {text!r}")


def _lengths(spec: str, batch: int, seed: int | None) -> list[int]:
    """``N``, ``a,b,c`` (cycled over the batch) or ``LO-HI`` (uniform random, seeded: ``seed``,
    0 when None; a seed given with another form is an error, since it would be ignored)."""
    if "-" in spec.strip("-") and "," not in spec:   # '10,-1' is a list with a negative length
        seed = 0 if seed is None else seed
        try:
            lo, hi = (int(x) for x in spec.split("-", 1))
        except ValueError:
            raise CommandLineError(f"--ctx range must be LO-HI with ints, got {spec!r}") from None
        if not 0 <= lo <= hi:
            raise CommandLineError(f"--ctx range LO-HI needs 0 <= LO <= HI, got {spec!r}")
        from .metadata_reference import INT32_MAX

        if hi > INT32_MAX:   # before the draw: the message names the bound given, not a draw
            raise CommandLineError(f"--ctx must be at most {INT32_MAX} KV tokens a request (kv_offset "
                                   f"is int32), got HI={hi} in {spec!r}")
        rng = random.Random(seed)
        return [rng.randint(lo, hi) for _ in range(batch)]
    if seed is not None:
        raise CommandLineError(f"--seed applies only to a random --ctx LO-HI, got --ctx {spec!r} "
                               f"with --seed {seed}")
    vals = _int_list(spec, "ctx")
    _no_more_than_batch(vals, batch, "ctx", spec)
    if min(vals) < 0:
        raise CommandLineError(f"--ctx lengths must be >= 0 tokens, got {spec!r}")
    return [vals[b % len(vals)] for b in range(batch)]


def build(args):
    """The inputs and schedule for parsed CLI arguments: (qo, kv, lpl, tokens, schedule).

    Raises :class:`CommandLineError` naming the flag for a malformed or out-of-range value (the
    scheduler's own range checks included)."""
    from .metadata import default_kv_granularity
    from .metadata_reference import INT32_MAX, check_scalars, reference_schedule

    if not 0 <= args.batch <= MAX_BATCH:
        raise CommandLineError(f"--batch must be in [0, {MAX_BATCH}] (the schedule is planned by the CPU "
                               f"reference in Python: 10**6 requests take ~6 s and ~0.9 GB), got {args.batch}")
    ps = args.page_size
    if ps < 1 or ps > 256 or ps & (ps - 1):
        raise CommandLineError(f"--page-size must be a power of two in 1..256 (the decode kernels' page sizes), got {ps}")
    G = default_kv_granularity(ps) if args.kv_granularity is None else args.kv_granularity
    tokens = _lengths(args.ctx, args.batch, args.seed)
    qlens_cycle = _int_list(args.qlen, "qlen")
    _no_more_than_batch(qlens_cycle, args.batch, "qlen", args.qlen)
    if min(qlens_cycle) < 1:
        raise CommandLineError(f"--qlen must be >= 1 q tokens a request, got {args.qlen!r}")
    # the scheduler's own checks, their messages naming this command's flags
    try:
        check_scalars(num_heads=args.heads, num_clusters=1 if args.clusters is None else args.clusters,
                      page_size=ps, kv_granularity=G, max_seqlen_qo=max(qlens_cycle),
                      max_split_per_batch=args.max_split_per_batch, names=_FLAGS)
    except (ValueError, NotImplementedError) as exc:   # out of range, or past the kernels' shapes
        raise CommandLineError(str(exc)) from None
    qlens = [qlens_cycle[b % len(qlens_cycle)] for b in range(args.batch)]
    max_q = max(qlens) if qlens else 1
    clusters = args.clusters
    if clusters is not None and not 1 <= clusters <= MAX_CLUSTERS:
        raise CommandLineError(f"--clusters must be in [1, {MAX_CLUSTERS}], got {clusters}")
    if clusters is None:
        try:
            try:
                clusters = arch.num_clusters(args.heads, max_q, kv_dtype=args.dtype)
            except RuntimeError:   # an H200: no GPU here, CU_NUM unset
                clusters = arch.num_clusters(args.heads, max_q, cu=132, kv_dtype=args.dtype)
        except ValueError as exc:   # heads x qlen past the kernels' rows: a flag value
            raise CommandLineError(str(exc)) from None
    if tokens and max(tokens) > INT32_MAX:   # the scheduler's kv_offset is int32, as in AITER
        raise CommandLineError(f"--ctx must be at most {INT32_MAX} KV tokens a request (kv_offset is int32), "
                               f"got {max(tokens)}")
    qo, kv, lpl = [0], [0], []
    for t, q in zip(tokens, qlens):
        pages = -(-t // ps)
        kv.append(kv[-1] + pages)
        lpl.append(t - (pages - 1) * ps if pages else 1)
        qo.append(qo[-1] + q)
    if kv[-1] > INT32_MAX:   # kv_indptr is int32 on the device, as in AITER
        raise CommandLineError(f"--batch {args.batch} x --ctx {args.ctx!r} is {kv[-1]} KV pages of {ps} tokens in "
                               f"all; kv_indptr holds at most {INT32_MAX} (int32): fewer tokens or a larger "
                               f"--page-size")
    sched = reference_schedule(qo, kv, lpl, num_heads=args.heads, num_clusters=clusters,
                               page_size=ps, kv_granularity=G, max_seqlen_qo=max_q,
                               max_split_per_batch=args.max_split_per_batch)
    return qo, kv, lpl, tokens, sched


def _piece_tokens(rec, kv, tokens, ps) -> int:
    b = rec[WI["batch_idx"]]
    start = (rec[WI["kv_start"]] - kv[b]) * ps
    end = tokens[b] if rec[WI["kv_offset"]] == 0 else tokens[b] - rec[WI["kv_offset"]]
    return max(0, end - start)


def render(qo, kv, tokens, s, *, show_works: bool = False) -> str:
    """The human-readable report of schedule ``s``."""
    ps, G, C = s.page_size, s.kv_granularity, s.num_clusters
    B = s.batch_size
    lines = []
    total_cost = sum(s.cluster_cost)
    lines.append(
        f"schedule: batch {B}, clusters {C} (payload spread over num_splits {s.num_splits}), "
        f"page_size {ps}, kv_granularity {G} pages = {G * ps} tokens per cost block, "
        f"overhead {s.overhead} block(s) per piece, max_seqlen_qo {s.max_seqlen_qo}")
    lines.append(
        f"cost: {total_cost} blocks in all, cut every delta = {s.delta} blocks; payload "
        f"(delta + overhead, a cluster's bound) {s.payload}; works "
        f"{s.num_works} (buffer bound {B + C - 1}), reduce entries "
        f"{len(s.reduce_partial_map)} (bound {max(0, min(B + C - 1, 2 * (C - 1)))})")
    loads = s.cluster_cost
    busy = [c for c in range(C) if loads[c] > 0]
    if busy:
        mean = sum(loads) / C
        top = max(range(C), key=lambda c: loads[c])
        lines.append(
            f"cluster load: max {loads[top]} (cluster {top}), mean {mean:.1f}, "
            f"min {min(loads)}; max/mean {loads[top] / mean:.2f}; idle clusters {C - len(busy)}")
    else:
        lines.append(f"cluster load: none (no batch has a key); idle clusters {C}")
    lines.append("")
    lines.append(f"{'cluster':>7} {'works':>5} {'cost':>7} {'%payload':>8} {'kv tokens':>10}  batches")
    for c in range(C):
        w0, w1 = s.work_indptr[c], s.work_indptr[c + 1]
        recs = s.work_info[w0:w1]
        toks = sum(_piece_tokens(r, kv, tokens, ps) for r in recs)
        bs = sorted({r[WI["batch_idx"]] for r in recs})
        desc = (f"{bs[0]}" if len(bs) == 1 else f"{bs[0]}..{bs[-1]}") if bs else "-"
        cut = any(r[WI["kv_offset"]] != 0 for r in recs)
        pct = 100.0 * loads[c] / s.payload if s.payload else 0.0
        lines.append(f"{c:>7} {w1 - w0:>5} {loads[c]:>7} {pct:>7.0f}% {toks:>10}  {desc}"
                     + (" (cut)" if cut else ""))
    lines.append("")
    split = [b for b in range(B) if s.reduce_indptr[b + 1] > s.reduce_indptr[b]]
    rows = sum((qo[b + 1] - qo[b]) * (s.reduce_indptr[b + 1] - s.reduce_indptr[b])
               for b in split)
    lines.append(f"split batches: {len(split)} of {B}; partial rows to reduce: {rows} q tokens "
                 f"x {s.num_heads} heads")
    if split:
        lines.append(f"{'batch':>6} {'kv tokens':>10} {'qlen':>4} {'pieces':>6} {'clusters':>9}  "
                     "piece tokens")
        cluster_of = {}
        for c in range(C):
            for w in range(s.work_indptr[c], s.work_indptr[c + 1]):
                cluster_of[w] = c
        for b in split:
            ws = [w for w, r in enumerate(s.work_info) if r[WI["batch_idx"]] == b]
            cs = [cluster_of[w] for w in ws]
            sizes = [_piece_tokens(s.work_info[w], kv, tokens, ps) for w in ws]
            lines.append(f"{b:>6} {tokens[b]:>10} {qo[b + 1] - qo[b]:>4} {len(ws):>6} "
                         f"{cs[0]:>4}..{cs[-1]:<4}  {','.join(map(str, sizes))}")
    notes = []
    if busy and s.payload <= 4 * s.overhead:
        notes.append("the payload is only a few overheads: the per-piece overhead dominates; "
                     "fewer clusters or more KV per batch balance better")
    if busy and len(busy) < C:
        why = ("no batch is split: splitting one costs a reduce" if not split
               else f"each batch takes {s.span // s.delta} clusters of its own" if s.span
               else "too little KV to spread")
        idle = C - len(busy)
        notes.append(f"{idle} {'cluster gets' if idle == 1 else 'clusters get'} no work ({why})")
    if busy and max(loads) > 1.25 * (sum(loads) / len(busy)):
        notes.append("uneven loads: the busiest cluster sets the decode time; a smaller "
                     "kv_granularity gives finer cuts")
    if notes:
        lines.append("")
        lines += [f"note: {n}" for n in notes]
    if show_works:
        lines.append("")
        lines.append("work records (" + ", ".join(WI) + "):")
        for w, r in enumerate(s.work_info):
            lines.append(f"  {w:>5}: {tuple(r)}")
    return "\n".join(lines)


def run(args) -> int:
    qo, kv, _lpl, tokens, s = build(args)
    if args.json:
        print(json.dumps({
            "work_indptr": s.work_indptr, "work_info": [list(r) for r in s.work_info],
            "reduce_indptr": s.reduce_indptr,
            "reduce_final_map": [list(t) for t in s.reduce_final_map],
            "reduce_partial_map": s.reduce_partial_map, "cluster_cost": s.cluster_cost,
            "payload": s.payload, "num_clusters": s.num_clusters, "num_splits": s.num_splits}))
    else:
        print(render(qo, kv, tokens, s, show_works=args.works))
    return 0


def register(subparsers) -> None:
    """Add the ``metadata`` sub-command."""
    p = subparsers.add_parser(
        "metadata", help="print the split-KV work schedule (per-cluster loads, split table)",
        description="Plan a batch with the split-KV scheduler and print per-cluster loads and "
                    "the split table.")
    p.add_argument("--batch", type=int, required=True, help="number of requests")
    p.add_argument("--ctx", required=True,
                   help="KV tokens per request: N, a comma list (cycled; at most --batch items), or LO-HI (random)")
    p.add_argument("--heads", type=int, default=128, help="q heads (per KV head; default 128)")
    p.add_argument("--qlen", default="1", help="q tokens per request: N or a comma list (cycled; at most --batch items; default 1)")
    p.add_argument("--page-size", type=int, default=64, help="KV tokens per page (default 64)")
    p.add_argument("--kv-granularity", type=int, default=None,
                   help="pages per cost block (default max(1, 64 // page_size), as the decode op)")
    p.add_argument("--clusters", type=int, default=None,
                   help="work lists (default: aiter_mla.arch.num_clusters for the GPU or CU_NUM, "
                        "an H200's 132 SMs if neither: 264 for <= 32 rows (heads x qlen) in fp8, 132 "
                        "in bf16 and up to 64 rows, then 132 // the 64-row blocks: 66 at 128 rows, "
                        "33 at 256, 4 at 2048)")
    p.add_argument("--dtype", choices=("fp8", "bf16"), default="fp8",
                   help="the decode's dtype (q and KV), which sets the default --clusters at "
                        "<= 32 rows (default fp8)")
    p.add_argument("--max-split-per-batch", type=int, default=-1,
                   help="caps the split count at this x --batch, as AITER's max_split_per_batch "
                        "(default -1: no cap)")
    p.add_argument("--seed", type=seed_value, default=None,
                   help=f"seed for --ctx LO-HI, 0..{SEED_MAX} (default 0; only with LO-HI)")
    p.add_argument("--works", action="store_true", help="also list every work record")
    p.add_argument("--json", action="store_true", help="print the schedule as JSON")
    p.set_defaults(func=run)
