"""Float64 model of how fp8 results move with the schedule (docs/perf/notes.md, issue 6 change 18).

The fp8 main loops round P to e4m3 after taking p against a reference max. wgmma_ot takes each
64-key tile against the running max at that tile; wgmma_seesaw (the symmetric pair) takes both
tiles of a pair against the pair's max. Where a schedule splits a batch at other tokens, tiles
see other references, and their e4m3 roundings differ. This model replays
test_page_size_equivalence: the tokens of kv_lens [17, 33, 75, 197], the split points of the
reference schedule (aiter_mla.ops.metadata_reference) for page sizes 1, 16 and 64 at 128 heads
on 132 SMs, QK exact, P rounded with torch's e4m3 conversion, splits merged by their LSE. It
prints, per loop, the error against float64 softmax and the largest relative L2 between page
size 1 and 16 / 64 (the test's quantity). CPU only.
usage: python3 scripts/dev/pair_rounding_model.py [SEEDS]"""
import itertools
import math
import sys

import torch

from aiter_mla import arch
from aiter_mla.ops.metadata import default_kv_granularity
from aiter_mla.ops.metadata_reference import reference_schedule

D, DV, HEADS, BN = 576, 512, 128, 64
KV_LENS = [17, 33, 75, 197]


def e4m3(x):
    return x.float().to(torch.float8_e4m3fn).double()


def _ref(m):
    """The reference a row's p is taken against: its max, 0 while that is -inf."""
    return torch.where(torch.isinf(m), torch.zeros_like(m), m)


def one_split(s, v, loop):
    """s: [rows, n] log2-domain scores of one work, v: [n, DV]. Returns (O / l, log2 l + m)."""
    rows, n = s.shape
    m = torch.full((rows,), -math.inf, dtype=torch.float64)
    l = torch.zeros(rows, dtype=torch.float64)
    o = torch.zeros(rows, DV, dtype=torch.float64)
    step = BN if loop == "wgmma_ot" else 2 * BN
    for t0 in range(0, n, step):
        tiles = [(s[:, a:a + BN], v[a:a + BN]) for a in range(t0, min(t0 + step, n), BN)]
        if loop == "wgmma_ot":   # each tile against the running max at that tile
            (st, vt), = tiles
            m_new = torch.maximum(m, st.max(1).values)
            f = torch.exp2(m - _ref(m_new))
            p = torch.exp2(st - _ref(m_new)[:, None])
            o = o * f[:, None] + e4m3(p) @ vt
            l = l * f + p.sum(1)
            m = m_new
            continue
        # symmetric pair: p against the local max, scaled to the pair max M before rounding
        m_loc = [torch.maximum(m, st.max(1).values) for st, _ in tiles]
        big = m_loc[0] if len(m_loc) == 1 else torch.maximum(*m_loc)
        f = torch.exp2(m - _ref(big))
        o = o * f[:, None]
        l = l * f
        for (st, vt), ml in zip(tiles, m_loc):
            g = torch.exp2(_ref(ml) - _ref(big))
            p = torch.exp2(st - _ref(ml)[:, None])
            o = o + e4m3(p * g[:, None]) @ vt
            l = l + p.sum(1) * g
        m = big
    return o / l[:, None], torch.log2(l) + m


def attend(s, v, cuts, loop):
    bounds = [0] + cuts + [s.shape[1]]
    parts = [one_split(s[:, a:b], v[a:b], loop) for a, b in zip(bounds[:-1], bounds[1:])]
    lse = torch.logsumexp(torch.stack([p[1] for p in parts]) * math.log(2), 0) / math.log(2)
    return sum(out * torch.exp2(ls - lse)[:, None] for out, ls in parts)


def split_tokens(page_size):
    """{batch: token offsets where its works split} under the reference schedule."""
    pages = [math.ceil(n / page_size) for n in KV_LENS]
    kv_indptr = torch.tensor([0] + list(itertools.accumulate(pages)), dtype=torch.int32)
    last = torch.tensor([n - (p - 1) * page_size for n, p in zip(KV_LENS, pages)], dtype=torch.int32)
    qo = torch.arange(len(KV_LENS) + 1, dtype=torch.int32)
    sched = reference_schedule(qo, kv_indptr, last, num_heads=HEADS, num_clusters=arch.num_clusters(HEADS, 1, cu=132),
                               page_size=page_size, kv_granularity=default_kv_granularity(page_size),
                               max_seqlen_qo=1)
    cuts = {}
    for w in sched.work_info:
        b, kv_start = w[0], w[4]
        if kv_start > kv_indptr[b]:
            cuts.setdefault(b, []).append(min((kv_start - int(kv_indptr[b])) * page_size, KV_LENS[b]))
    return cuts


def main():
    seeds = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    cuts = {P: split_tokens(P) for P in (1, 16, 64)}
    print("split tokens per page size:", cuts)
    for seed in range(seeds):
        g = torch.Generator().manual_seed(seed)
        kv = [e4m3(torch.randn(n, D, generator=g) / 0.25) * 0.25 for n in KV_LENS]   # as the test stores them
        q = [e4m3(torch.randn(HEADS, D, generator=g) / 0.5) * 0.5 for _ in KV_LENS]
        scores = [qb @ kb.T / math.sqrt(D) * math.log2(math.e) for qb, kb in zip(q, kv)]
        exact = torch.cat([torch.softmax(s * math.log(2), 1) @ kb[:, :DV] for s, kb in zip(scores, kv)])
        line = []
        for loop in ("wgmma_ot", "wgmma_seesaw"):
            out = {P: torch.cat([attend(s, kb[:, :DV], cuts[P].get(b, []), loop)
                                 for b, (s, kb) in enumerate(zip(scores, kv))]) for P in cuts}
            rel = lambda a, b: float((a - b).norm() / b.norm())   # noqa: E731
            err = max(rel(o, exact) for o in out.values())
            moved = max(rel(out[P], out[1]) for P in (16, 64))
            line.append(f"{loop}: vs float64 {err:.2e}, P=16/64 vs P=1 {moved:.2e}")
        print(f"seed {seed}: " + "; ".join(line))


if __name__ == "__main__":
    main()
