"""The split-KV work scheduler (aiter_mla.ops.metadata*, templates/mla_metadata.cu.j2).

Three independent pieces are checked against each other:

* ``check_schedule`` below, a property checker written from the issue's acceptance list
  (coverage exactly once and in order, AITER field order, split tiles >= 2 pieces with distinct
  partial rows, reduce maps, buffer bounds, per-cluster cost, every row of a split piece sees a
  key), applied to the Python reference under hypothesis;
* the Python reference (metadata_reference.py, a plain loop over each batch's multiples of
  delta on the cost line);
* the device kernel (closed-form cut counts, block-wide prefix sums, one thread per work), run
  on the CPU through a thread-per-CUDA-thread emulator (mla_metadata_host_emu.cpp) of the very
  same template text, and on the GPU (tests marked ``gpu``) through get_mla_metadata_v1.
"""
from __future__ import annotations

import collections
import ctypes
import hashlib
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aiter_mla import arch, paths
from aiter_mla.jit.render import template_globals
from aiter_mla.ops import metadata as md
from aiter_mla.ops.metadata_reference import (
    check_scalars,
    num_splits_for,
    overhead_blocks,
    reference_schedule,
    slice_width,
    to_buffers,
    validate_inputs,
)
from aiter_mla.work_info import FUSED_MERGE_MAX_PIECES, WI, WORK_INFO_INTS

PAGE_SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256]
SENTINEL = -77777

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


# ------------------------------------------------------------------------------------------
# inputs


def make_inputs(kv_tokens, qlens, page_size, kv_base=0):
    """(qo_indptr, kv_indptr [pages], kv_last_page_lens) lists for per-batch token counts."""
    kv, lpl, qo = [kv_base], [], [0]
    for t, q in zip(kv_tokens, qlens):
        pages = -(-t // page_size)
        kv.append(kv[-1] + pages)
        lpl.append(t - (pages - 1) * page_size if pages else 1)
        qo.append(qo[-1] + q)
    return qo, kv, lpl


def random_lengths(rng: random.Random, kind: str, B: int, page_size: int, G: int) -> list[int]:
    blk = page_size * G
    if kind == "uniform":
        n = rng.randint(0, 131072)
        return [n] * B
    if kind == "random":
        return [rng.randint(0, 131072) for _ in range(B)]
    if kind == "tiny":
        return [rng.randint(0, 3 * blk) for _ in range(B)]
    if kind == "zeros":
        return [0 if rng.random() < 0.7 else rng.randint(1, 20000) for _ in range(B)]
    if kind == "edges":  # lengths at and next to block boundaries: where cuts and tails meet
        return [max(0, rng.randint(0, 40) * blk + rng.choice([-8, -1, 0, 1, 2, 7, 9]))
                for _ in range(B)]
    if kind == "one_big":
        out = [rng.randint(0, 64) for _ in range(B)]
        out[rng.randrange(B)] = rng.randint(10000, 131072)
        return out
    raise ValueError(kind)


KINDS = ["uniform", "random", "tiny", "zeros", "edges", "one_big"]


# ------------------------------------------------------------------------------------------
# the independent checker


def tail_blocks_bound(thr: int, page_size: int, G: int) -> int:
    """Most blocks the tail rule can add to a cluster: a refused cut leaves < thr tokens, i.e.
    at most floor((thr - 2) / page_size) + 1 pages (the last one partial)."""
    if thr < 2:
        return 0
    pages = (thr - 2) // page_size + 1
    return -(-pages // G)


def check_schedule(qo, kv, lpl, *, work_indptr, work_info, reduce_indptr, reduce_final_map,
                   reduce_partial_map, num_clusters, page_size, G, max_seqlen_qo, msb=-1,
                   info_sizes=None):
    """Assert every property of a valid schedule. Lists in, nothing out."""
    B = len(kv) - 1
    C = num_clusters
    W = len(work_info)
    ovh = max(1, -(-16 // page_size))
    tokens = [0 if kv[b + 1] == kv[b] else
              (kv[b + 1] - kv[b] if page_size == 1 else (kv[b + 1] - kv[b] - 1) * page_size + lpl[b])
              for b in range(B)]

    # work_indptr: C + 1 monotone entries from 0 to W
    assert len(work_indptr) == C + 1
    assert work_indptr[0] == 0 and work_indptr[-1] == W
    assert all(a <= b for a, b in zip(work_indptr, work_indptr[1:]))
    cluster_of = []
    for c in range(C):
        cluster_of += [c] * (work_indptr[c + 1] - work_indptr[c])

    # field order and per-work values
    pieces: dict[int, list[int]] = {b: [] for b in range(B)}
    prev = (-1, -1)
    for w, r in enumerate(work_info):
        assert len(r) == WORK_INFO_INTS == 8
        b = r[WI["batch_idx"]]
        assert 0 <= b < B
        assert r[WI["qo_start"]] == qo[b] and r[WI["qo_end"]] == qo[b + 1]
        assert r[WI["padding"]] == 0
        assert kv[b] <= r[WI["kv_start"]] <= r[WI["kv_end"]] <= kv[b + 1]
        # works are in (batch, kv) order: batches visited in index order, pieces in KV order
        assert (b, r[WI["kv_start"]]) > prev
        prev = (b, r[WI["kv_start"]])
        pieces[b].append(w)

    partial_rows = []
    entries_seen = 0
    for b in range(B):
        ws = pieces[b]
        assert ws, f"batch {b} has no work"
        recs = [work_info[w] for w in ws]
        qlen = qo[b + 1] - qo[b]
        # coverage: pages exactly once and in order; tokens exactly once via kv_offset
        assert recs[0][WI["kv_start"]] == kv[b] and recs[-1][WI["kv_end"]] == kv[b + 1]
        pos_tok = 0
        for i, r in enumerate(recs):
            if i:
                assert r[WI["kv_start"]] == recs[i - 1][WI["kv_end"]]
            if len(recs) > 1:
                assert r[WI["kv_start"]] < r[WI["kv_end"]], "empty piece in a split batch"
            start_tok = (r[WI["kv_start"]] - kv[b]) * page_size
            assert start_tok == pos_tok
            if r[WI["kv_end"]] == kv[b + 1]:
                assert r[WI["kv_offset"]] == 0
                end_tok = tokens[b]
            else:
                end_tok = (r[WI["kv_end"]] - kv[b]) * page_size
                assert r[WI["kv_offset"]] == tokens[b] - end_tok > 0
                assert (r[WI["kv_end"]] - kv[b]) % G == 0, "cut not on a granularity boundary"
            assert end_tok >= start_tok
            pos_tok = end_tok
            # consecutive pieces sit on consecutive clusters
            if i:
                assert cluster_of[ws[i]] == cluster_of[ws[i - 1]] + 1
        assert pos_tok == tokens[b]
        if tokens[b] == 0:
            assert len(recs) == 1 and recs[0][WI["kv_start"]] == recs[0][WI["kv_end"]]
        # reduce structures
        assert tuple(reduce_final_map[b]) == (qo[b], qo[b + 1])
        n_red = reduce_indptr[b + 1] - reduce_indptr[b]
        locs = [r[WI["partial_qo_loc"]] for r in recs]
        if len(recs) == 1:
            assert locs == [-1] and n_red == 0
        else:
            assert n_red == len(recs) >= 2
            assert all(loc >= 0 for loc in locs)
            assert reduce_partial_map[reduce_indptr[b]:reduce_indptr[b + 1]] == locs
            partial_rows += [(loc, loc + qlen) for loc in locs]
            entries_seen += n_red
            # docs/DESIGN.md §8.4: every q row of every split piece sees at least one key
            for r in recs:
                start_tok = (r[WI["kv_start"]] - kv[b]) * page_size
                assert start_tok <= tokens[b] - qlen, "a causal row would see no key"
    assert reduce_indptr[0] == 0 and reduce_indptr[B] == entries_seen == len(reduce_partial_map)
    partial_rows.sort()
    assert all(a[1] <= b[0] for a, b in zip(partial_rows, partial_rows[1:])), "partial rows overlap"

    # at most one cut per cluster, and it is the cluster's last work
    for c in range(C):
        ws = list(range(work_indptr[c], work_indptr[c + 1]))
        cuts = [w for w in ws if work_info[w][WI["kv_end"]] != kv[work_info[w][0] + 1]]
        assert cuts in ([], [ws[-1]] if ws else [])

    # buffer bounds (the info function's sizes)
    N = num_splits_for(C, msb, B)
    assert W <= B + N - 1 if B else W == 0
    assert len(reduce_partial_map) <= max(0, min(B + N - 1, 2 * (N - 1)))
    if partial_rows:
        assert partial_rows[-1][1] <= len(reduce_partial_map) * max_seqlen_qo
    if info_sizes is not None:
        (n_ptrs, n_indptr, n_works, n_rindptr, n_final, n_partial) = info_sizes
        assert n_ptrs == 2 and n_indptr >= C + 1 and n_works >= W
        assert n_rindptr >= B + 1 and n_final >= B and n_partial >= len(reduce_partial_map)

    # balance (metadata.py's proof): every cluster costs <= delta + OVH, plus the blocks of
    # one tail the tail rule merged; exactly delta + OVH when no cut was dropped. delta is
    # ceil(S / N), or for equal batch costs c, if within 9/8 of it (and 16 blocks): with
    # k = N // B >= 2 clusters a batch, ceil(c / k); else the next multiple of c
    costs = [-(-(kv[b + 1] - kv[b]) // G) + ovh for b in range(B)]
    S = sum(costs)
    delta = -(-S // N) if B else 0
    if B and len(set(costs)) == 1:
        k = N // B
        width = -(-costs[0] // k) if k >= 2 else -(-delta // costs[0]) * costs[0]
        if width - delta <= 16 and (width - delta) * 8 <= delta:
            delta = width
            if k >= 2:
                # each batch on k clusters of its own, [b k, (b + 1) k): at most k pieces, one
                # work a cluster
                assert all(work_indptr[c + 1] - work_indptr[c] <= 1 for c in range(C)), work_indptr
                for c in range(C):
                    for w in range(work_indptr[c], work_indptr[c + 1]):
                        b = work_info[w][WI["batch_idx"]]
                        # (uniform empty batches cost OVH alone: theirs may sit one range on)
                        assert b * k <= c < (b + 1) * k or kv[b + 1] == kv[b], (b, c, k)
            else:
                # uniform batches in whole slices: none is split
                assert W == B and not reduce_partial_map, (W, B)
    tail = tail_blocks_bound(max_seqlen_qo, page_size, G)
    if max_seqlen_qo == 1:
        assert tail == 0
    for c in range(C):
        cost = sum(-(-(work_info[w][WI["kv_end"]] - work_info[w][WI["kv_start"]]) // G) + ovh
                   for w in range(work_indptr[c], work_indptr[c + 1]))
        assert cost <= delta + ovh + tail, f"cluster {c} cost {cost} > {delta} + {ovh} + {tail}"
    return delta


def check_reference(qo, kv, lpl, *, C, page_size, G, thr, msb=-1, heads=1):
    s = reference_schedule(qo, kv, lpl, num_heads=heads, num_clusters=C, page_size=page_size,
                           kv_granularity=G, max_seqlen_qo=thr, max_split_per_batch=msb)
    check_schedule(qo, kv, lpl, work_indptr=s.work_indptr, work_info=s.work_info,
                   reduce_indptr=s.reduce_indptr, reduce_final_map=s.reduce_final_map,
                   reduce_partial_map=s.reduce_partial_map, num_clusters=C, page_size=page_size,
                   G=G, max_seqlen_qo=thr, msb=msb)
    return s


@st.composite
def configs(draw, max_batch=4096):
    page_size = draw(st.sampled_from(PAGE_SIZES))
    B = draw(st.one_of(st.integers(1, 8), st.integers(1, 300), st.integers(1, max_batch)))
    C = draw(st.one_of(st.integers(1, 4), st.integers(1, 264), st.sampled_from([132, 264])))
    G = draw(st.sampled_from([md.default_kv_granularity(page_size), 1, 2, 16,
                              max(page_size, 16)]))
    thr = draw(st.integers(1, 8))
    msb = draw(st.sampled_from([-1, -1, -1, 1, 2, 32]))
    kind = draw(st.sampled_from(KINDS))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = random.Random(seed)
    lens = random_lengths(rng, kind, B, page_size, G)
    qlens = [rng.randint(1, thr) for _ in range(B)] if draw(st.booleans()) else [thr] * B
    return dict(lens=lens, qlens=qlens, page_size=page_size, C=C, G=G, thr=thr, msb=msb)


# ------------------------------------------------------------------------------------------
# reference + checker (CPU)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs())
def test_reference_properties(cfg):
    qo, kv, lpl = make_inputs(cfg["lens"], cfg["qlens"], cfg["page_size"])
    s = check_reference(qo, kv, lpl, C=cfg["C"], page_size=cfg["page_size"], G=cfg["G"],
                        thr=cfg["thr"], msb=cfg["msb"])
    # the buffers get_mla_metadata_info_v1 sizes for this batch count and cluster count
    saved = {k: os.environ.get(k) for k in ("CU_NUM", "AITER_ENABLE_EXPERIMENTAL")}
    try:
        os.environ["CU_NUM"] = str(cfg["C"])
        os.environ["AITER_ENABLE_EXPERIMENTAL"] = "0"
        info = md.get_mla_metadata_info_v1(len(cfg["lens"]), cfg["thr"], 1, None, None)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    check_schedule(qo, kv, lpl, work_indptr=s.work_indptr, work_info=s.work_info,
                   reduce_indptr=s.reduce_indptr, reduce_final_map=s.reduce_final_map,
                   reduce_partial_map=s.reduce_partial_map, num_clusters=cfg["C"],
                   page_size=cfg["page_size"], G=cfg["G"], max_seqlen_qo=cfg["thr"],
                   msb=cfg["msb"], info_sizes=[shape[0] for shape, _ in info])


def test_reference_hand_worked_example():
    # page 64, G = 1 page, OVH = 1; batches of 100, 0 and 300 pages; 8 clusters.
    # S = (100+1) + (0+1) + (300+1) = 404, delta = ceil(404/8) = 51: the line is cut at
    # 51, 102, 153, ... Batch 0 = [0, 101): blocks from 1, cut at 51 (block 50). Batch 1 =
    # [101, 102): its (empty) piece starts at 102 -> cluster 2. Batch 2 = [102, 403): blocks
    # from 103, cuts at 153, 204, 255, 306, 357 (blocks 50, 101, 152, 203, 254).
    qo, kv, lpl = [0, 1, 2, 3], [0, 100, 100, 400], [5, 1, 64]
    s = check_reference(qo, kv, lpl, C=8, page_size=64, G=1, thr=1, heads=128)
    assert s.delta == 51 and s.payload == 52 and s.overhead == 1
    rows = [tuple(r) for r in s.work_info]
    assert rows == [
        (0, 0, 0, 1, 0, 50, (100 - 50 - 1) * 64 + 5, 0),  # cluster 0: 50 pages + OVH = 51
        (0, 1, 0, 1, 50, 100, 0, 0),      # cluster 1
        (1, -1, 1, 2, 100, 100, 0, 0),    # zero-length batch: one unsplit work, kv_start == kv_end
        (2, 2, 2, 3, 100, 150, 16000, 0),  # cluster 2 (with batch 1: 1 + 51 = delta + OVH)
        (2, 3, 2, 3, 150, 201, 12736, 0),
        (2, 4, 2, 3, 201, 252, 9472, 0),
        (2, 5, 2, 3, 252, 303, 6208, 0),
        (2, 6, 2, 3, 303, 354, 2944, 0),
        (2, 7, 2, 3, 354, 400, 0, 0),
    ]
    assert s.work_indptr == [0, 1, 2, 4, 5, 6, 7, 8, 9]
    assert s.cluster_cost == [51, 51, 52, 52, 52, 52, 52, 47]
    assert s.reduce_indptr == [0, 2, 2, 8]
    assert s.reduce_partial_map == [0, 1, 2, 3, 4, 5, 6, 7]
    assert s.reduce_final_map == [(0, 1), (1, 2), (2, 3)]


@pytest.mark.parametrize("B, pages, C, want_delta, want_works", [
    (64, 50, 66, 51, 64),      # ceil(64 * 51 / 66) = 50 is a block short of a batch: 51
    (128, 50, 66, 102, 128),   # 99 -> two batches per cluster (+3 blocks)
    (64, 128, 66, 129, 64),    # the bench's b64 ctx 8192: 126 -> 129
    (64, 50, 60, 55, 121),     # 55 -> 102 would add 47 blocks: the plain lattice splits
    (4, 1000, 66, 63, 64),     # 16 clusters a batch: ceil(1001 / 16) = 63 (61 + 2), 16 pieces each
    (64, 128, 132, 65, 128),   # (16,1) bf16 b64 ctx 8192: two halves a batch (63 -> 65), no sliver
    (64, 50, 264, 13, 256),    # (16,1) fp8 b64 ctx 3200: four pieces a batch (13 = ceil(51 / 4))
    (45, 128, 132, 44, 174),   # 2 clusters a batch would take 65 blocks, 21 over 44: the lattice
    (256, 365, 66, 1420, 321),  # b256 ctx 23333: 4 batches would add 44 blocks (> 16)
    (64, 365, 66, 366, 64),    # b64 ctx 23333: a whole batch adds 11 blocks (<= 16, <= 355 / 8)
    (60, 128, 66, 129, 60),    # b60 ctx 8192: 118 -> 129 (+11)
    (64, 527, 66, 528, 64),    # the slack limit: 512 -> 528 (+16) taken
    (64, 560, 66, 544, 128),   # 544 -> 561 (+17) refused: the plain lattice splits
    (4, 7952, 66, 498, 64),    # k = 16 clusters a batch: 482 -> 498 (+16) taken
    (4, 8480, 66, 514, 68),    # 514 -> 531 (+17) refused
    (40, 3, 66, 3, 67),        # 3 -> 4 adds 1 block, more than 3 / 8: split
])
def test_uniform_batches_fill_whole_slices(B, pages, C, want_delta, want_works):
    # page 64, G = 1, OVH = 1: each batch costs pages + 1 blocks (slice_width's rule)
    qo = list(range(B + 1))
    kv = [b * pages for b in range(B + 1)]
    s = check_reference(qo, kv, [64] * B, C=C, page_size=64, G=1, thr=1, heads=128)
    assert s.delta == want_delta and s.num_works == want_works
    assert (len(s.reduce_partial_map) == 0) == (want_works == B)
    assert slice_width([pages + 1] * B, C) == want_delta
    assert slice_width([pages + 1] * (B - 1) + [pages], C) == -(-((pages + 1) * B - 1) // C)


def test_zero_length_batches_get_one_unsplit_work():
    qo, kv, lpl = make_inputs([0, 5000, 0, 0, 70000, 0], [2] * 6, 64)
    s = check_reference(qo, kv, lpl, C=16, page_size=64, G=1, thr=2)
    for b in (0, 2, 3, 5):
        recs = [r for r in s.work_info if r[0] == b]
        assert len(recs) == 1
        r = recs[0]
        assert r[WI["partial_qo_loc"]] == -1 and r[WI["kv_start"]] == r[WI["kv_end"]] == kv[b]
        assert r[WI["kv_offset"]] == 0
        assert s.reduce_indptr[b + 1] == s.reduce_indptr[b]
    # all-empty input still gives one work per batch
    qo, kv, lpl = make_inputs([0] * 7, [1] * 7, 16)
    s = check_reference(qo, kv, lpl, C=3, page_size=16, G=4, thr=1)
    assert len(s.work_info) == 7 and s.reduce_partial_map == []


def test_paged_tail_rule_fixes_5_6():
    # page 64, qlen 4, G 1: 2 pages holding 65 tokens (last page 1 token), 2 clusters.
    # S = 2 + 1 = 3, delta = 2: the line cut at 2 falls after page 1 and would leave 1 token:
    # q rows 0..2 would see no key in that piece (AITER applies its tail rule only at page 1).
    # We drop the cut.
    qo, kv, lpl = make_inputs([65], [4], 64)
    s = check_reference(qo, kv, lpl, C=2, page_size=64, G=1, thr=4)
    assert len(s.work_info) == 1 and s.work_info[0][WI["partial_qo_loc"]] == -1
    # with 4 tokens left the cut is fine
    qo, kv, lpl = make_inputs([68], [4], 64)
    s = check_reference(qo, kv, lpl, C=2, page_size=64, G=1, thr=4)
    assert [r[WI["kv_offset"]] for r in s.work_info] == [4, 0]


def test_page1_tail_rule_as_aiter():
    # page 1: a cut is never made when fewer than max_seqlen_qo tokens would follow it
    G = 16
    for n in range(16 * 4, 16 * 9):
        qo, kv, lpl = make_inputs([n], [8], 1)
        s = check_reference(qo, kv, lpl, C=4, page_size=1, G=G, thr=8)
        for r in s.work_info:
            if r[WI["kv_end"]] != kv[1]:
                assert r[WI["kv_offset"]] >= 8


def test_bounds_are_tight():
    # one long batch on C clusters: C works and C reduce entries, = B + C - 1 and min(.., 2(C-1))
    for C in (2, 5, 132):
        qo, kv, lpl = make_inputs([10**6], [1], 64)
        s = check_reference(qo, kv, lpl, C=C, page_size=64, G=1, thr=1)
        assert len(s.work_info) == md.max_works(1, C) == C
        assert len(s.reduce_partial_map) == md.max_partial_entries(1, C) == C
    assert md.max_works(0, 1) == 0 and md.max_partial_entries(5, 1) == 0


@pytest.mark.parametrize("fn", [md.max_works, md.max_partial_entries])
@pytest.mark.parametrize("args,exc,text", [
    ((-4, 66), ValueError, "batch_size must be >= 0, got -4"),       # max_works said 61
    ((4, 0), ValueError, "num_clusters must be >= 1, got 0"),        # max_works said 3
    ((4, -1), ValueError, "num_clusters must be >= 1, got -1"),      # max_partial_entries said 0
    ((4.5, 66), TypeError, "batch_size must be an int, got float 4.5"),   # max_works said 69.5
    ((True, 66), TypeError, "batch_size must be an int, got bool True"),
    ((4, "66"), TypeError, "num_clusters must be an int, got str '66'"),
])
def test_bounds_check_their_arguments(fn, args, exc, text):
    """A fresh-user trial: the bounds took any number and returned nonsense for it."""
    with pytest.raises(exc, match=text):
        fn(*args)
    import numpy as np

    assert fn(np.int64(4), 66) == fn(4, 66)   # NumPy ints pass, as check_int's ints do


def test_lookup_plan_names_a_non_tensor():
    """lookup_plan(None) failed with an AttributeError from inside (a fresh-user trial)."""
    with pytest.raises(TypeError, match="work_info_set must be a torch.Tensor, got NoneType"):
        md.lookup_plan(None)


def test_bounds_exhaustive_small():
    """Every small configuration (incl. zero lengths, page 1 tail rule, max qlen 8) stays
    inside the info function's bounds."""
    rng = random.Random(7)
    worst_w = worst_e = 0
    for _ in range(3000):
        ps = rng.choice([1, 2, 64])
        G = rng.choice([1, 2, 4, 16])
        B = rng.randint(1, 6)
        C = rng.randint(1, 9)
        thr = rng.randint(1, 8)
        lens = [rng.choice([0, rng.randint(1, 40), rng.randint(1, 400)]) for _ in range(B)]
        qo, kv, lpl = make_inputs(lens, [rng.randint(1, thr) for _ in range(B)], ps)
        s = check_reference(qo, kv, lpl, C=C, page_size=ps, G=G, thr=thr)
        worst_w = max(worst_w, len(s.work_info) - md.max_works(B, C))
        worst_e = max(worst_e, len(s.reduce_partial_map) - md.max_partial_entries(B, C))
    assert worst_w <= 0 and worst_e <= 0


def test_int32_limits():
    # total KV ~2**31 tokens over 4096 batches (page 256) and one batch of 2**31 - 1 tokens
    per = (2**31 - 1) // 4096
    qo, kv, lpl = make_inputs([per] * 4096, [1] * 4096, 256)
    s = check_reference(qo, kv, lpl, C=132, page_size=256, G=1, thr=1)
    assert sum(r[WI["kv_end"]] - r[WI["kv_start"]] for r in s.work_info) == kv[-1]
    qo, kv, lpl = make_inputs([2**31 - 1], [2], 256)
    s = check_reference(qo, kv, lpl, C=264, page_size=256, G=1, thr=2)
    assert max(r[WI["kv_offset"]] for r in s.work_info) < 2**31
    # page 1: kv_indptr itself is the limit (int32 pages)
    qo, kv, lpl = make_inputs([2**30, 2**30 - 1], [1, 1], 1)
    assert kv[-1] == 2**31 - 1
    check_reference(qo, kv, lpl, C=132, page_size=1, G=64, thr=1)


def test_kv_indptr_may_start_past_zero():
    qo, kv, lpl = make_inputs([3000, 0, 9000], [1, 1, 1], 16, kv_base=1000)
    s = check_reference(qo, kv, lpl, C=7, page_size=16, G=4, thr=1)
    assert s.work_info[0][WI["kv_start"]] == 1000


def test_a_batch_past_int32_tokens_names_its_kv_indptr_entries():
    """The message named the batch and its tokens but not the argument they came from (a
    fresh-user report)."""
    with pytest.raises(ValueError, match=r"batch 0 has 68719476682 KV tokens \(kv_indptr\[1\] - "
                                         r"kv_indptr\[0\] = 1073741824 pages of 64\); kv_offset is int32"):
        reference_schedule([0, 1], [0, 2**30], [10], num_heads=16, num_clusters=4,
                           page_size=64, kv_granularity=64, max_seqlen_qo=1)


def test_last_page_lens_are_checked_at_page_size_1_too():
    """The decode kernel refuses a length other than 1 at page size 1; the CPU scheduler, which
    says it validates values, let 0 and 12345 through (a fresh-user audit)."""
    with pytest.raises(ValueError, match=r"kv_last_page_lens\[1\] must be in \[1, page_size=1\] .* got 12345"):
        reference_schedule([0, 1, 2], [0, 5, 9], [1, 12345], num_heads=16, num_clusters=4,
                           page_size=1, kv_granularity=64, max_seqlen_qo=1)
    s = reference_schedule([0, 1, 2], [0, 5, 9], [1, 1], num_heads=16, num_clusters=4,
                           page_size=1, kv_granularity=64, max_seqlen_qo=1)
    assert len(s.work_info) >= 2


def test_values_that_are_not_integers_are_refused():
    """validate_inputs read 1.7 as 1 and True as 1 (a break test); get_mla_metadata_v1 points to
    it as the host-side value check."""
    import numpy as np

    for qo, bad in ((torch.tensor([0.0, 1.7, 2.9]), "qo_indptr must be an integer tensor or array, got dtype torch.float32"),
                    (np.array([0, 1, 2], dtype=bool), "qo_indptr must be an integer tensor or array, got dtype bool"),
                    ([0, True, 2], "qo_indptr[1] must be an int, got bool True"),
                    ([0, 1.0, 2], "qo_indptr[1] must be an int, got float 1.0")):
        with pytest.raises(TypeError, match=re.escape(bad)):
            reference_schedule(qo, [0, 2, 3], [16, 3], num_heads=16, num_clusters=4, page_size=16,
                               kv_granularity=4, max_seqlen_qo=4)
    s = reference_schedule(np.array([0, 1, 2]), torch.tensor([0, 2, 3], dtype=torch.int32), [16, 3],
                           num_heads=16, num_clusters=4, page_size=16, kv_granularity=4,
                           max_seqlen_qo=4)   # NumPy and int tensors still pass
    assert len(s.work_info) >= 2


def test_index_inputs_that_are_not_1d_sequences_are_refused():
    """NumPy arrays of 2 or 0 dimensions passed the 1-D check (it called torch's .dim(), which
    NumPy lacks) and failed later with a bare "'<' not supported between instances of 'list'
    and 'int'"; None or an int gave "'NoneType' object is not iterable" (a break test)."""
    import numpy as np

    kw = dict(num_heads=128, num_clusters=66, page_size=64, kv_granularity=1, max_seqlen_qo=1)
    with pytest.raises(ValueError, match=re.escape("qo_indptr must be 1-D, got shape (1, 3)")):
        reference_schedule(np.array([[0, 1, 2]]), np.array([[0, 3, 5]]), np.array([[64, 1]]), **kw)
    for qo in (np.array(2), torch.tensor(2, dtype=torch.int32)):
        with pytest.raises(ValueError, match=re.escape("qo_indptr must be 1-D, got shape ()")):
            reference_schedule(qo, np.array([0, 3, 5]), np.array([64, 1]), **kw)
    with pytest.raises(ValueError, match=re.escape("kv_last_page_lens must be 1-D, got shape (1, 2)")):
        validate_inputs([0, 1, 2], [0, 3, 5], np.array([[64, 1]]), page_size=64, max_seqlen_qo=1)
    for bad in (None, 5, {0, 1, 2}, "012"):
        with pytest.raises(TypeError, match=f"kv_indptr must be a 1-D integer tensor or array or a "
                                            f"sequence of ints, got {type(bad).__name__}"):
            reference_schedule([0, 1, 2], bad, [64, 1], **kw)
    # tuples and ranges are sequences and still pass
    assert validate_inputs((0, 1, 2), range(0, 9, 4), [64, 1], page_size=64, max_seqlen_qo=1) == (
        [0, 1, 2], [0, 4, 8], [64, 1])


def test_validate_inputs_checks_its_scalars():
    """validate_inputs compared page_size / max_seqlen_qo unchecked: None gave "'<=' not
    supported between 'int' and 'NoneType'", 64.0 was taken, nan was reported as a q length
    outside [1, nan] (a break test). It runs check_scalars' checks of the two now."""
    for kw, exc, msg in ((dict(page_size=None), TypeError, "page_size must be an int, got NoneType None"),
                         (dict(page_size=64.0), TypeError, "page_size must be an int, got float 64.0"),
                         (dict(page_size=48), ValueError, r"page_size must be a power of two in \[1, 2\*\*30\], got 48"),
                         (dict(max_seqlen_qo=float("nan")), TypeError, "max_seqlen_qo must be an int, got float nan"),
                         (dict(max_seqlen_qo=None), TypeError, "max_seqlen_qo must be an int, got NoneType None"),
                         (dict(max_seqlen_qo=0), ValueError, r"max_seqlen_qo must be >= 1 \(the largest q length")):
        args = {"page_size": 64, "max_seqlen_qo": 1, **kw}
        with pytest.raises(exc, match=msg):
            validate_inputs([0, 1], [0, 1], [1], **args)
    assert validate_inputs([0, 1], [0, 1], [1], page_size=64, max_seqlen_qo=1) == ([0, 1], [0, 1], [1])


@pytest.mark.parametrize("bad, msg", [
    (dict(kv=[0, 5, 3]), "non-decreasing"),
    (dict(qo=[0, 1, 1]), "q length of batch 1"),
    (dict(qo=[0, 1, 10]), r"\[1, max_seqlen_qo=4\]"),
    (dict(lpl=[0, 3]), r"kv_last_page_lens\[0\]"),
    (dict(lpl=[17, 3]), r"kv_last_page_lens\[0\]"),
    (dict(kv=[-1, 2, 3]), r"kv_indptr\[0\]"),
    (dict(qo=[0, 1]), "qo_indptr must have"),
    (dict(lpl=[1]), "kv_last_page_lens must have"),
])
def test_validation_errors(bad, msg):
    args = dict(qo=[0, 1, 2], kv=[0, 2, 3], lpl=[16, 3])
    args.update(bad)
    with pytest.raises(ValueError, match=msg):
        reference_schedule(args["qo"], args["kv"], args["lpl"], num_heads=16, num_clusters=4,
                           page_size=16, kv_granularity=4, max_seqlen_qo=4)


@pytest.mark.parametrize("kw, exc, msg", [
    (dict(num_heads=128, max_seqlen_qo=17), NotImplementedError, r"128 \* 17 is not supported: at most 128 heads and q length 16"),
    (dict(page_size=3), ValueError, "page_size must be a power of two"),
    (dict(kv_granularity=0), ValueError, "kv_granularity"),
    (dict(num_clusters=0), ValueError, "num_clusters"),
    (dict(max_split_per_batch=0), ValueError, "max_split_per_batch"),
    (dict(max_seqlen_qo=0), ValueError, "max_seqlen_qo"),
    # past int32, packed as 0 / a negative launch field (a break test)
    (dict(kv_granularity=2 ** 32), ValueError, r"kv_granularity must be a power of two in \[1, 2\*\*30\]"),
    (dict(page_size=2 ** 31), ValueError, r"page_size must be a power of two in \[1, 2\*\*30\], got 2147483648"),
    (dict(num_clusters=2 ** 31), ValueError, "num_clusters must be <= 2147483647"),
])
def test_scalar_errors(kw, exc, msg):
    args = dict(num_heads=16, num_clusters=4, page_size=16, kv_granularity=4, max_seqlen_qo=1)
    args.update(kw)
    with pytest.raises(exc, match=msg):
        reference_schedule([0, 1], [0, 2], [3], **args)


def test_scalar_bounds_are_inclusive():
    """The largest page_size / kv_granularity (2**30) and num_clusters (int32) still plan."""
    for kw in (dict(page_size=2 ** 30, kv_granularity=1), dict(page_size=1, kv_granularity=2 ** 30)):
        s = reference_schedule([0, 1], [0, 2], [1 if kw["page_size"] == 1 else 3], num_heads=16,
                               num_clusters=4, max_seqlen_qo=1, **kw)
        kv = [(w[WI["kv_start"]], w[WI["kv_end"]]) for w in s.work_info]
        assert kv[0][0] == 0 and kv[-1][1] == 2 and all(a[1] == b[0] for a, b in zip(kv, kv[1:])), kv
    check_scalars(num_heads=16, num_clusters=2 ** 31 - 1, page_size=16, kv_granularity=4,
                  max_seqlen_qo=1, max_split_per_batch=-1)


# ------------------------------------------------------------------------------------------
# info function and the Python op on CPU tensors


def test_info_shapes_and_order(monkeypatch):
    monkeypatch.setenv("CU_NUM", "132")
    monkeypatch.setenv("AITER_ENABLE_EXPERIMENTAL", "0")
    info = md.get_mla_metadata_info_v1(256, 1, 128, torch.float8_e4m3fn, torch.float8_e4m3fn)
    # (128,1): a 128-row work occupies two SMs, so 132 SMs hold 66 work lists
    assert info == [((2,), torch.uint64), ((67,), torch.int32), ((256 + 65, 8), torch.int32),
                    ((257,), torch.int32), ((256, 2), torch.int32), ((130,), torch.int32)]
    # m16x4 (heads x qlen == 64) doubles the clusters only with AITER_ENABLE_EXPERIMENTAL
    assert md.get_mla_metadata_info_v1(4, 4, 16, None, None)[1][0] == (133,)
    monkeypatch.setenv("AITER_ENABLE_EXPERIMENTAL", "1")
    assert md.get_mla_metadata_info_v1(4, 4, 16, None, None)[1][0] == (265,)
    assert md.get_mla_metadata_info_v1(4, 1, 128, None, None)[1][0] == (67,)
    assert arch.num_clusters(16, 4) == 264
    # the <= 32-row shapes have two work lists per multiprocessor in any mode (warpgroup_works)
    for experimental in ("0", "1"):
        monkeypatch.setenv("AITER_ENABLE_EXPERIMENTAL", experimental)
        assert [arch.num_clusters(h, q) for h, q in ((16, 1), (32, 1), (16, 2), (64, 1), (128, 1))] == [
            264, 264, 264, 264 if experimental == "1" else 132, 66]


def test_num_clusters_for_a_given_cu_count(monkeypatch):
    """cu= plans for a multiprocessor count that is not the local GPU's (metadata dump on a CPU):
    it must count the work lists exactly as CU_NUM does."""
    shapes = ((16, 1), (32, 1), (16, 2), (64, 1), (128, 1), (16, 4))
    for cu in (1, 7, 132):
        monkeypatch.setenv("CU_NUM", str(cu))
        via_env = [arch.num_clusters(h, q) for h, q in shapes]
        monkeypatch.delenv("CU_NUM")
        assert [arch.num_clusters(h, q, cu=cu) for h, q in shapes] == via_env
    assert [arch.num_clusters(h, q, cu=132) for h, q in shapes] == [264, 264, 264, 132, 66, 132]
    for bad in (0, -3):
        with pytest.raises(ValueError, match=f"cu must be >= 1, got {bad}"):
            arch.num_clusters(128, 1, cu=bad)
    with pytest.raises(TypeError, match="cu must be an int"):
        arch.num_clusters(128, 1, cu=1.5)


def test_info_batch_size_fits_int32(monkeypatch):
    monkeypatch.setenv("CU_NUM", "132")
    nc = arch.num_clusters(128, 1)
    md.get_mla_metadata_info_v1(2**31 - nc, 1, 128, None, None)   # B + C - 1 = 2**31 - 1: fits
    with pytest.raises(ValueError, match=rf"batch_size must be <= {2**31 - nc} \(int32 work indices with "
                                         rf"{nc} work lists\), got {2**31 - nc + 1}"):
        md.get_mla_metadata_info_v1(2**31 - nc + 1, 1, 128, None, None)
    # past int32 whatever the work-list count: named before CU_NUM / the GPU is asked for (it
    # said "CU_NUM is unset" on a machine without a GPU: fresh-user report)
    monkeypatch.delenv("CU_NUM")
    monkeypatch.setattr(arch, "num_clusters", lambda *a, **k: pytest.fail("work lists asked for"))
    with pytest.raises(ValueError, match=r"batch_size must be <= 2147483647 \(int32 work indices\), got 1099511627776"):
        md.get_mla_metadata_info_v1(2**40, 1, 128, None, None)


@pytest.mark.parametrize("kw", [dict(is_sparse=True), dict(intra_batch_mode=True),
                                dict(fast_mode=False)])
def test_info_unsupported_modes(kw, monkeypatch):
    monkeypatch.setenv("CU_NUM", "8")
    with pytest.raises(NotImplementedError):
        md.get_mla_metadata_info_v1(4, 1, 16, None, None, **kw)


def alloc(info, device="cpu", fill=SENTINEL):
    out = []
    for shape, dtype in info:
        if dtype == torch.uint64:
            out.append(torch.zeros(shape, dtype=dtype, device=device))
        else:
            out.append(torch.full(shape, fill, dtype=dtype, device=device))
    return out


def call_op(bufs, qo, kv, lpl, **kw):
    (ptrs, indptr, info_set, rindptr, final, partial) = bufs
    dev = indptr.device
    t = lambda x: torch.tensor(x, dtype=torch.int32, device=dev)  # noqa: E731
    md.get_mla_metadata_v1(t(qo), t(kv), t(lpl), kw.pop("heads", 16), 1,
                           kw.pop("is_causal", False), ptrs, info_set, indptr, rindptr, final,
                           partial, **kw)


def compare_buffers(bufs, sched, B):
    """Device/CPU buffers == reference schedule over the used prefixes; padding as specified;
    unused rows untouched."""
    ptrs, indptr, info_set, rindptr, final, partial = [b.cpu() for b in bufs]
    W, E = len(sched.work_info), len(sched.reduce_partial_map)
    wi = sched.work_indptr + [sched.work_indptr[-1]] * (indptr.numel() - len(sched.work_indptr))
    assert indptr.tolist() == wi
    assert info_set[:W].tolist() == [list(r) for r in sched.work_info]
    assert (info_set[W:] == SENTINEL).all()
    ri = sched.reduce_indptr + [sched.reduce_indptr[-1]] * (rindptr.numel() - B - 1)
    assert rindptr.tolist() == ri
    assert final[:B].tolist() == [list(x) for x in sched.reduce_final_map]
    assert (final[B:] == SENTINEL).all()
    assert partial[:E].tolist() == sched.reduce_partial_map
    assert (partial[E:] == SENTINEL).all()
    assert ptrs.view(torch.int64).tolist() == [bufs[1].data_ptr(), bufs[2].data_ptr()]


def test_op_on_cpu_tensors_matches_reference(monkeypatch):
    monkeypatch.setenv("CU_NUM", "10")
    qo, kv, lpl = make_inputs([5000, 0, 20000, 7], [2, 1, 2, 2], 16)
    bufs = alloc(md.get_mla_metadata_info_v1(6, 2, 16, None, None))
    call_op(bufs, qo, kv, lpl, page_size=16, kv_granularity=4, max_seqlen_qo=2)
    # (16,2) has 32 rows: two work lists per multiprocessor (arch.occupancy), 20 clusters
    s = reference_schedule(qo, kv, lpl, num_heads=16, num_clusters=20, page_size=16,
                           kv_granularity=4, max_seqlen_qo=2)
    compare_buffers(bufs, s, 4)
    rec = md.lookup_plan(bufs[2])
    assert rec is not None and (rec.num_heads, rec.max_seqlen_qo, rec.page_size,
                                rec.kv_granularity, rec.batch_size, rec.num_clusters) == (
        16, 2, 16, 4, 4, 20)
    # as given: it said bf16 (AITER's default) for a plan with fp8's count (a break test)
    assert rec.dtype_q is None and rec.dtype_kv is None
    assert md.lookup_plan(torch.empty(3, 8, dtype=torch.int32)) is None


def test_op_argument_checks(monkeypatch):
    monkeypatch.setenv("CU_NUM", "10")
    qo, kv, lpl = make_inputs([100, 200], [1, 1], 16)
    info = md.get_mla_metadata_info_v1(2, 1, 16, None, None)
    with pytest.raises(ValueError, match="max_seqlen_qo"):
        call_op(alloc(info), qo, kv, lpl, page_size=16)
    with pytest.raises(NotImplementedError):
        call_op(alloc(info), qo, kv, lpl, page_size=16, max_seqlen_qo=1, topk=64)
    with pytest.raises(NotImplementedError):
        call_op(alloc(info), qo, kv, lpl, page_size=16, max_seqlen_qo=1, intra_batch_mode=True)
    with pytest.raises(ValueError, match="uni_seqlen_qo"):
        call_op(alloc(info), qo, kv, lpl, page_size=16, max_seqlen_qo=2, uni_seqlen_qo=1)
    # errors name the argument as the caller wrote it (they said max_seqlen_q / num_heads)
    with pytest.raises(TypeError, match="max_seqlen_qo must be an int, got float 1.0"):
        call_op(alloc(info), qo, kv, lpl, page_size=16, max_seqlen_qo=1.0)
    with pytest.raises(ValueError, match="num_heads_per_head_k must be >= 1, got 0"):
        call_op(alloc(info), qo, kv, lpl, page_size=16, max_seqlen_qo=1, heads=0)
    with pytest.raises(ValueError, match="num_head_qo must be >= 1, got 0"):
        md.get_mla_metadata_info_v1(2, 1, 0, None, None)
    import numpy as np

    call_op(alloc(info), qo, kv, lpl, page_size=16, max_seqlen_qo=1, topk=np.int64(-1),
            fast_mode=np.True_)   # NumPy ints and bools pass, as check_int's ints do
    with pytest.raises(TypeError, match="fast_mode must be a bool, got NoneType None"):   # read as False
        md.get_mla_metadata_info_v1(2, 1, 16, None, None, fast_mode=None)
    with pytest.raises(TypeError, match="^is_causal must be a bool, got str 'yes'$"):   # unused, still checked
        call_op(alloc(info), qo, kv, lpl, page_size=16, max_seqlen_qo=1, is_causal="yes")
    call_op(alloc(info), qo, kv, lpl, page_size=16, max_seqlen_qo=1, is_causal=np.bool_(True))
    with pytest.raises(TypeError, match="is_sparse must be a bool, got str 'no'"):
        md.get_mla_metadata_info_v1(2, 1, 16, None, None, is_sparse="no")
    with pytest.raises(ValueError, match="num_kv_splits must be >= 1, got 0"):
        md.get_mla_metadata_info_v1(2, 1, 16, None, None, num_kv_splits=0)
    with pytest.raises(NotImplementedError, match=r"num_head_qo \* max_seqlen_qo = 129 \* 1"):
        md.get_mla_metadata_info_v1(2, 1, 129, None, None)
    with pytest.raises(NotImplementedError, match=r"num_heads_per_head_k \* max_seqlen_qo = 256 \* 1"):
        call_op(alloc(info), qo, kv, lpl, page_size=16, max_seqlen_qo=1, heads=256)
    with pytest.raises(TypeError, match="uni_seqlen_qo must be an int, got float 1.5"):
        call_op(alloc(info), qo, kv, lpl, page_size=16, max_seqlen_qo=-1, uni_seqlen_qo=1.5)
    # strings are named too (they were compared with 0 first: an unnamed '<=' TypeError)
    for kw, name in ((dict(max_seqlen_qo="1"), "max_seqlen_qo"),
                     (dict(max_seqlen_qo=1, uni_seqlen_qo="1"), "uni_seqlen_qo"),
                     (dict(max_seqlen_qo=1, topk="x"), "topk")):
        with pytest.raises(TypeError, match=f"{name} must be an int, got str"):
            call_op(alloc(info), qo, kv, lpl, page_size=16, **kw)
    with pytest.raises(ValueError, match="got max_seqlen_qo=0, uni_seqlen_qo=-1"):
        call_op(alloc(info), qo, kv, lpl, page_size=16, max_seqlen_qo=0)
    # the CPU path's value checks use this function's argument names (they said kv_indptr)
    with pytest.raises(ValueError, match=r"seqlens_kv_indptr must be non-decreasing: seqlens_kv_indptr\[2\]"):
        call_op(alloc(info), qo, [kv[0], kv[2], kv[1]], lpl, page_size=16, max_seqlen_qo=1)
    # two KV heads: AITER would halve the clusters; the decode op has one KV head and refused
    # the plan only later, at the decode call
    bufs = alloc(info)
    t = lambda x: torch.tensor(x, dtype=torch.int32)  # noqa: E731
    with pytest.raises(NotImplementedError, match="num_heads_k must be 1 .*got 2"):
        md.get_mla_metadata_v1(t(qo), t(kv), t(lpl), 16, 2, False, bufs[0], bufs[2], bufs[1], bufs[3],
                               bufs[4], bufs[5], page_size=16, max_seqlen_qo=1)
    # buffers planned for one batch are too small for two
    small = alloc(md.get_mla_metadata_info_v1(1, 1, 16, None, None))
    with pytest.raises(ValueError, match="reduce_indptr|reduce_final_map|work_info_set"):
        call_op(small, qo, kv, lpl, page_size=16, max_seqlen_qo=1)
    bufs = alloc(info)
    bufs[1] = bufs[1].to(torch.int64)
    with pytest.raises(TypeError, match="work_indptr must have dtype torch.int32, got torch.int64"):
        call_op(bufs, qo, kv, lpl, page_size=16, max_seqlen_qo=1)
    # a transposed work_info_set: the message gives the shape and stride (fresh-user report)
    bufs = alloc(info)
    wt = bufs[2].t().contiguous().t()
    bufs[2] = wt
    with pytest.raises(ValueError, match=re.escape(f"work_info_set must be contiguous, got shape "
                                                   f"{tuple(wt.shape)} and stride {wt.stride()}")):
        call_op(bufs, qo, kv, lpl, page_size=16, max_seqlen_qo=1)
    with pytest.raises(TypeError, match="seqlens_kv_indptr must have dtype torch.int32, got torch.int64"):
        b = alloc(info)
        md.get_mla_metadata_v1(torch.tensor(qo, dtype=torch.int32), torch.tensor(kv),
                               torch.tensor(lpl, dtype=torch.int32), 16, 1, False, *b[:1],
                               b[2], b[1], *b[3:], max_seqlen_qo=1)
    # an output buffer passed twice, or one overlapping another: the reduce step overwrote
    # work_indptr and the call returned a wrong plan (fresh-user report)
    bufs = alloc(info)
    bufs[3] = bufs[1]
    with pytest.raises(ValueError, match=r"work_indptr and reduce_indptr must not share memory"):
        call_op(bufs, qo, kv, lpl, page_size=16, max_seqlen_qo=1)
    bufs = alloc(info)
    bufs[5] = bufs[2].view(-1)[1:]
    with pytest.raises(ValueError, match=r"work_info_set and reduce_partial_map must not share memory"):
        call_op(bufs, qo, kv, lpl, page_size=16, max_seqlen_qo=1)
    # bytes, not elements: a buffer that starts inside another's last 8-byte element
    big = torch.zeros(1 << 16, dtype=torch.uint8)
    bufs = alloc(info)
    bufs[0] = big[:16].view(torch.uint64)
    bufs[1] = big[12:12 + 4 * bufs[1].numel()].view(torch.int32)
    with pytest.raises(ValueError, match=r"work_metadata_ptrs and work_indptr must not share memory"):
        call_op(bufs, qo, kv, lpl, page_size=16, max_seqlen_qo=1)
    # disjoint views of one allocation are fine, and plan what separate buffers plan
    apart = alloc(info)
    call_op(apart, qo, kv, lpl, page_size=16, max_seqlen_qo=1)
    packed, offset = [], 0
    for t in alloc(info):
        nbytes = t.numel() * t.element_size()
        view = big[offset:offset + nbytes].view(t.dtype).view(t.shape)
        view.copy_(t)
        packed.append(view)
        offset += -(-nbytes // 8) * 8
    call_op(packed, qo, kv, lpl, page_size=16, max_seqlen_qo=1)
    for a, b in zip(apart[1:], packed[1:]):   # [0] holds the buffers' own addresses
        assert torch.equal(a, b)
    # a tensor on the 'meta' device: named as such, not "seqlens_qo_indptr must be on meta", and
    # no false "share memory" (every meta tensor's address is 0) (a break test)
    t32 = lambda x, d="cpu": torch.tensor(x, dtype=torch.int32, device=d)  # noqa: E731
    b = alloc(info)
    with pytest.raises(ValueError, match="seqlens_kv_indptr must be on a CUDA device or the CPU, got meta"):
        md.get_mla_metadata_v1(t32(qo), t32(kv, "meta"), t32(lpl), 16, 1, False, b[0], b[2], b[1], *b[3:],
                               page_size=16, max_seqlen_qo=1)
    with pytest.raises(ValueError, match="seqlens_qo_indptr must be on cpu, got meta"):
        md.get_mla_metadata_v1(t32(qo, "meta"), t32(kv), t32(lpl), 16, 1, False, b[0], b[2], b[1], *b[3:],
                               page_size=16, max_seqlen_qo=1)
    meta_b = [x.to("meta") for x in b]
    with pytest.raises(ValueError, match="seqlens_kv_indptr must be on a CUDA device or the CPU, got meta"):
        md.get_mla_metadata_v1(t32(qo, "meta"), t32(kv, "meta"), t32(lpl, "meta"), 16, 1, False, meta_b[0],
                               meta_b[2], meta_b[1], *meta_b[3:], page_size=16, max_seqlen_qo=1)
    bufs = alloc(info)
    kv_t = torch.tensor(kv, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"reduce_indptr and seqlens_kv_indptr must not share memory"):
        md.get_mla_metadata_v1(torch.tensor(qo, dtype=torch.int32), kv_t, torch.tensor(lpl, dtype=torch.int32),
                               16, 1, False, bufs[0], bufs[2], bufs[1], kv_t, bufs[4], bufs[5],
                               page_size=16, max_seqlen_qo=1)
    # buffers sized for 128 heads (CU_NUM 10: 5 lists) used for 16 (20 lists): the message
    # names the head count, q length and list count that decided the size
    big_heads = alloc(md.get_mla_metadata_info_v1(2, 1, 128, None, None))
    with pytest.raises(ValueError, match=r"work_indptr has 6 elements; this input needs >= 21 .*"
                                         r"num_head_qo = 16, max_seqlen_qo = 1; this call has 20 work lists"):
        call_op(big_heads, qo, kv, lpl, page_size=16, max_seqlen_qo=1)
    # uni_seqlen_qo alone is enough
    call_op(alloc(info), qo, kv, lpl, page_size=16, uni_seqlen_qo=1)
    # dtypes are recorded only: AITER's callers plan bf16 q with fp8 KV (the decode refuses that
    # pair itself), so planning takes it, with the same buffers as any pair
    fp8, bf16 = torch.float8_e4m3fn, torch.bfloat16
    assert md.get_mla_metadata_info_v1(2, 1, 16, bf16, fp8) == md.get_mla_metadata_info_v1(2, 1, 16, fp8, fp8)
    call_op(alloc(info), qo, kv, lpl, page_size=16, max_seqlen_qo=1, dtype_q=bf16, dtype_kv=fp8)


def test_op_on_cpu_fills_the_first_two_work_metadata_ptrs(monkeypatch):
    """The buffer check takes a work_metadata_ptrs of >= 2 entries and the kernel writes [0] and
    [1]; the CPU fill copied exactly 2 into all of it, an unnamed RuntimeError ("The size of
    tensor a (3) must match the size of tensor b (2)") for 3 entries (a break test)."""
    monkeypatch.setenv("CU_NUM", "132")
    qo, kv, lpl = make_inputs([192, 128], [1, 1], 64)
    bufs = alloc(md.get_mla_metadata_info_v1(2, 1, 128, None, None))
    bufs[0] = torch.full((3,), 7, dtype=torch.uint64)
    call_op(bufs, qo, kv, lpl, heads=128, page_size=64, kv_granularity=1, max_seqlen_qo=1)
    assert bufs[0].view(torch.int64).tolist() == [bufs[1].data_ptr(), bufs[2].data_ptr(), 7]
    s = reference_schedule(qo, kv, lpl, num_heads=128, num_clusters=66, page_size=64,
                           kv_granularity=1, max_seqlen_qo=1)
    compare_buffers([bufs[0][:2]] + bufs[1:], s, 2)
    # to_buffers itself names a work_metadata_ptrs too short for the two pointers
    short = [torch.zeros(1, dtype=torch.uint64)] + alloc(md.get_mla_metadata_info_v1(2, 1, 128, None, None))[1:]
    with pytest.raises(ValueError, match="work_metadata_ptrs holds 1 entry, the schedule needs 2"):
        to_buffers(s, short)


def test_buffers_too_small_for_the_dtypes_say_so(monkeypatch):
    """Buffers sized for bf16 (one work list per SM at <= 32 rows) used by a call without
    dtype_q / dtype_kv (fp8's count, two): the hint named only batch size, heads and q length,
    which were all right (a break test). It names the dtypes planned for and says to pass the
    same ones to get_mla_metadata_info_v1."""
    monkeypatch.setenv("CU_NUM", "132")
    bf16 = torch.bfloat16
    qo, kv, lpl = make_inputs([192, 128], [1, 1], 64)
    kw = dict(heads=16, page_size=64, kv_granularity=1, max_seqlen_qo=1)
    info = md.get_mla_metadata_info_v1(2, 1, 16, bf16, bf16)
    with pytest.raises(ValueError, match=re.escape(
            "work_indptr has 133 elements; this input needs >= 265 (allocate it from get_mla_metadata_info_v1 "
            "with batch_size >= 2, num_head_qo = 16, max_seqlen_qo = 1; this call has 264 work lists from "
            "the heads, q length and device / CU_NUM and, at <= 32 rows, the dtypes: it planned for "
            "dtype_q = None, dtype_kv = None (fp8, no dtype given; fp8 plans two work lists per "
            "multiprocessor, bf16 one), so give get_mla_metadata_info_v1 q_dtype / kv_dtype equal to this "
            "call's dtype_q / dtype_kv)")):
        call_op(alloc(info), qo, kv, lpl, **kw)
    call_op(alloc(info), qo, kv, lpl, dtype_q=bf16, dtype_kv=bf16, **kw)   # the same dtypes: fits
    # given dtypes are named as given (128 heads: 66 lists; bf16 at 16 heads: 132)
    with pytest.raises(ValueError, match=re.escape("planned for dtype_q = torch.bfloat16, dtype_kv = None (bf16;")):
        call_op(alloc(md.get_mla_metadata_info_v1(2, 1, 128, bf16, None)), qo, kv, lpl, dtype_q=bf16, **kw)


def test_default_kv_granularity():
    assert [md.default_kv_granularity(p) for p in PAGE_SIZES] == [64, 32, 16, 8, 4, 2, 1, 1, 1]
    with pytest.raises(ValueError, match="page_size must be a power of two >= 1, got 48"):
        md.default_kv_granularity(48)
    # bare "'<' not supported" / "unsupported operand" before; refused by name now, as the
    # scheduler's other scalars (check_int)
    for bad in ("64", 64.0, True, None, torch.tensor(16)):
        with pytest.raises(TypeError, match=f"page_size must be an int, got {type(bad).__name__} "
                                            f"{re.escape(repr(bad))}"):
            md.default_kv_granularity(bad)


def test_metadata_cli_dump(capsys):
    from aiter_mla.cli import main

    rc = main(["metadata", "--batch", "5", "--ctx", "8192,300,0", "--heads", "16", "--qlen",
               "2,1", "--page-size", "64", "--clusters", "8"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "cluster" in out and "split" in out and "payload" in out
    rc = main(["metadata", "--batch", "2", "--ctx", "100", "--heads", "16", "--qlen", "17",
               "--page-size", "64", "--clusters", "8"])
    assert rc != 0   # q length 17: past the kernels' 16
    # one idle cluster: singular (it said "1 clusters get no work")
    assert main(["metadata", "--batch", "1", "--ctx", "64", "--clusters", "2"]) == 0
    out = capsys.readouterr().out
    assert "note: 1 cluster gets no work (" in out, out
    assert main(["metadata", "--batch", "1", "--ctx", "64", "--clusters", "3"]) == 0
    out = capsys.readouterr().out
    assert "note: 2 clusters get no work (" in out, out
    rc = main(["metadata", "--batch", "0", "--ctx", "10", "--clusters", "8"])
    out = capsys.readouterr().out   # no batch: the load line says so (it was a blank line)
    assert rc == 0 and "cluster load: none (no batch has a key); idle clusters 8" in out, out
    for bad in (512, 48, 0):   # the kernels' page sizes are the powers of two 1..256
        rc = main(["metadata", "--batch", "2", "--ctx", "100", "--page-size", str(bad), "--clusters", "8"])
        err = capsys.readouterr().err
        assert rc != 0 and f"--page-size must be a power of two in 1..256" in err and f"got {bad}" in err, err


def test_metadata_cli_default_clusters_follow_occupancy(capsys, monkeypatch):
    """Without --clusters, no GPU and no CU_NUM, the dump plans for an H200 with the shape's
    work lists per SM: 264 for (16,1) (two per SM), 132 for (64,1), 66 for (128,1) (a work
    on two SMs); it printed 132 for all."""
    import json

    from aiter_mla import arch as arch_mod
    from aiter_mla.cli import main

    def no_gpu(device=None):
        raise RuntimeError("no CUDA device is visible and CU_NUM is unset")

    monkeypatch.delenv("CU_NUM", raising=False)
    monkeypatch.setenv("AITER_ENABLE_EXPERIMENTAL", "0")   # (64,1) doubles with it
    monkeypatch.setattr(arch_mod, "num_cu", no_gpu)
    for heads, want in ((16, 264), (64, 132), (128, 66)):
        assert main(["metadata", "--batch", "4", "--ctx", "8192", "--heads", str(heads), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["num_clusters"] == want
    # bf16 runs <= 32 rows as one list per SM (alternating: one CTA fills an SM)
    for heads, want in ((16, 132), (64, 132), (128, 66)):
        assert main(["metadata", "--batch", "4", "--ctx", "8192", "--heads", str(heads), "--dtype",
                     "bf16", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["num_clusters"] == want


@pytest.mark.parametrize("heads", [1, 8, 16, 32, 48, 64, 100, 128])
@pytest.mark.parametrize("qlen", [1, 2, 4, 16])
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.bfloat16])
def test_decode_grid_is_one_wave(monkeypatch, heads, qlen, dtype):
    """Every sm_90a loop fits one CTA an SM (384 threads at 168 registers: 64,512 of 65,536;
    score_pv 512 at 128: 65,536), so
    a launch of more CTAs than SMs runs a second wave: the schedule's lists are sized so that the
    grid (grid_x columns of CTAs-per-work CTAs) is at most the SM count. bf16 at <= 32 rows
    launched 264 CTAs on 132 SMs."""
    from aiter_mla.ops import decode

    monkeypatch.setenv("CU_NUM", "132")
    monkeypatch.setenv("AITER_ENABLE_EXPERIMENTAL", "0")   # AITER's knob doubles the 64-row lists
    if heads * qlen > arch.MAX_ROWS:
        return
    params = decode.decode_variant(heads, qlen, 64, dtype, dtype)
    lists = arch.num_clusters(heads, qlen, kv_dtype=params["kv_dtype"])
    ctas = decode.launch_grid_x(params, lists) * arch.ctas_per_work(heads, qlen)
    assert ctas <= 132, (heads, qlen, dtype, params["mainloop"], lists, ctas)


def test_work_lists_follow_the_decode_dtype_at_few_rows(monkeypatch):
    """At <= 32 rows fp8's warpgroup_works runs a list per consumer warpgroup (2 a CU) and
    bf16's alternating one per CTA, of which one fits an SM: bf16 plans 1 a CU (264 lists ran
    as two waves and split every batch twice as often). The sizes follow the dtype the plan is
    for; above 32 rows the dtypes agree."""
    monkeypatch.setenv("CU_NUM", "132")
    monkeypatch.setenv("AITER_ENABLE_EXPERIMENTAL", "0")
    for heads, qlen in ((16, 1), (32, 1), (16, 2)):
        assert arch.occupancy(heads, qlen, kv_dtype="fp8") == arch.occupancy(heads, qlen) == 2
        assert arch.occupancy(heads, qlen, kv_dtype="bf16") == 1
        assert arch.num_clusters(heads, qlen, kv_dtype="bf16") == 132
        assert arch.num_clusters(heads, qlen, kv_dtype="fp8") == 264
    for heads, qlen in ((64, 1), (128, 1), (128, 2)):
        assert arch.num_clusters(heads, qlen, kv_dtype="bf16") == arch.num_clusters(heads, qlen, kv_dtype="fp8")
    with pytest.raises(ValueError, match="kv_dtype must be 'fp8', 'bf16' or None, got 'fp16'"):
        arch.occupancy(16, 1, kv_dtype="fp16")
    bf16, fp8 = torch.bfloat16, torch.float8_e4m3fn

    def indptr_len(q_dtype, kv_dtype):   # work_indptr: [num_clusters + 1]
        return md.get_mla_metadata_info_v1(8, 1, 16, q_dtype, kv_dtype)[1][0][0]

    assert indptr_len(bf16, bf16) == 133 and indptr_len(None, bf16) == 133 and indptr_len(bf16, None) == 133
    assert indptr_len(fp8, fp8) == 265 and indptr_len(None, None) == 265
    assert indptr_len(bf16, fp8) == 265   # AITER's bf16 q with fp8 KV: the KV decides


# ------------------------------------------------------------------------------------------
# the device kernel on the CPU emulator


def render_template(arch_name: str) -> str:
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(paths.TEMPLATES_DIR)),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.globals.update(template_globals())
    tmpl = env.get_template("mla_metadata.cu.j2")
    return tmpl.render(arch=arch_name, module="mla_metadata",
                       arch_family="amd" if arch_name.startswith("gfx") else "nvidia")


class Emulator:
    def __init__(self, lib_path: Path):
        self.lib = ctypes.CDLL(str(lib_path))
        self.fn = self.lib.emu_get_metadata_v1
        vp, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
        self.fn.argtypes = [vp] * 9 + [i64] * 5 + [i32] * 7 + [vp, i32]
        self.fn.restype = ctypes.c_int
        self.lanes_apply = self.lib.emu_lanes_apply
        self.lanes_apply.argtypes = [i64, i32]
        self.lanes_apply.restype = ctypes.c_int
        self.launch_threads = self.lib.emu_launch_threads   # the device launch's block size
        self.launch_threads.argtypes = [i64]
        self.launch_threads.restype = ctypes.c_int
        self.lib.emu_force_tiled.argtypes = [i32]
        self.warp = self.lib.emu_warp()
        self.lanes_max = self.lib.emu_lanes_max()   # batches the one-warp path serves
        # md_body_lanes's choice in the last run: 1 its 32-bit path, 2 the tiled body, 0 none
        self.last_path = self.lib.emu_last_path
        self.last_path.restype = ctypes.c_int

    def run(self, bufs, qo, kv, lpl, *, C, page_size, G, thr, msb=-1, nthreads=64,
            tiled=False, ptrs_in=None):
        """tiled: run md_body even where the launch would take the one-warp path. ptrs_in:
        (qo, kv, last_page_lens) addresses to pass instead of copies of the lists."""
        B = len(kv) - 1
        t = lambda x: torch.tensor(x, dtype=torch.int32)  # noqa: E731
        qo_t, kv_t, lpl_t = t(qo), t(kv), t(lpl or [0])
        inputs = ptrs_in or (qo_t.data_ptr(), kv_t.data_ptr(), lpl_t.data_ptr())
        ptrs, indptr, info_set, rindptr, final, partial = bufs
        heavy = ctypes.c_int32(-7)   # the split-merge hint (split_heavy_tiles)
        self.lib.emu_force_tiled(1 if tiled else 0)
        try:
            rc = self.fn(*inputs, ptrs.data_ptr(),
                         indptr.data_ptr(), info_set.data_ptr(), rindptr.data_ptr(),
                         final.data_ptr(), partial.data_ptr(), indptr.numel(), info_set.shape[0],
                         rindptr.numel(), final.shape[0], partial.numel(), B, C,
                         num_splits_for(C, msb, B), page_size, G, overhead_blocks(page_size), thr,
                         ctypes.addressof(heavy), nthreads)
        finally:
            self.lib.emu_force_tiled(0)
        assert rc == 0
        return heavy.value


def build_emulator(d: Path, arch_name: str, warp: int) -> Emulator:
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no host C++ compiler for the kernel emulator")
    src = render_template(arch_name)
    cu = d / "mla_metadata.cu"
    cu.write_text(src)
    harness = Path(__file__).with_name("mla_metadata_host_emu.cpp")
    lib = d / f"emu_{hashlib.sha256(src.encode()).hexdigest()[:12]}_w{warp}.so"
    cmd = [cxx, "-std=c++17", "-O1", "-pthread", "-shared", "-fPIC", "-Wall",
           f'-DMD_RENDERED="{cu}"', f"-DEMU_WARP={warp}", str(harness), "-o", str(lib)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    emu = Emulator(lib)
    assert emu.warp == warp
    return emu


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    return build_emulator(tmp_path_factory.mktemp("mdemu"), "sm_90a", 32)


@pytest.fixture(scope="module")
def emulator64(tmp_path_factory):
    """The AMD render with a 64-lane wave (gfx942's MD_WARP)."""
    return build_emulator(tmp_path_factory.mktemp("mdemu64"), "gfx942", 64)


def info_sizes(B, C):
    return [((2,), torch.uint64), ((C + 1,), torch.int32), ((md.max_works(B, C), 8), torch.int32),
            ((B + 1,), torch.int32), ((B, 2), torch.int32),
            ((md.max_partial_entries(B, C),), torch.int32)]


def emulate_and_compare(emulator, qo, kv, lpl, *, C, page_size, G, thr, msb=-1, nthreads=64,
                        extra=0, tiled=False):
    B = len(kv) - 1
    info = [((s[0] + extra,) + s[1:], d) if i else (s, d)
            for i, (s, d) in enumerate(info_sizes(B, C))]
    bufs = alloc(info)
    heavy = emulator.run(bufs, qo, kv, lpl, C=C, page_size=page_size, G=G, thr=thr, msb=msb,
                         nthreads=nthreads, tiled=tiled)
    s = reference_schedule(qo, kv, lpl, num_heads=1, num_clusters=C, page_size=page_size,
                           kv_granularity=G, max_seqlen_qo=thr, max_split_per_batch=msb)
    compare_buffers(bufs, s, B)
    # the hint: tiles (batches) the reference cut into more than FUSED_MERGE_MAX_PIECES pieces
    pieces = collections.Counter(rec[WI["batch_idx"]] for rec in s.work_info)
    assert heavy == sum(1 for n in pieces.values() if n > FUSED_MERGE_MAX_PIECES)
    return s


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs(max_batch=1024), st.sampled_from([32, 64, 96]), st.sampled_from([0, 3]))
def test_emulated_kernel_equals_reference(emulator, cfg, nthreads, extra):
    qo, kv, lpl = make_inputs(cfg["lens"], cfg["qlens"], cfg["page_size"])
    emulate_and_compare(emulator, qo, kv, lpl, C=cfg["C"], page_size=cfg["page_size"],
                        G=cfg["G"], thr=cfg["thr"], msb=cfg["msb"], nthreads=nthreads,
                        extra=extra)


def test_emulated_kernel_edge_cases(emulator):
    cases = [
        ([], 8, 64, 1, 1),                               # no batch at all
        ([0] * 40, 5, 16, 4, 2),                         # all zero-length
        ([65], 2, 64, 1, 4),                             # tail refusal (docs/DESIGN.md §8.4)
        ([10**6], 264, 64, 1, 1),                        # one batch over every cluster
        ([2**31 - 1], 264, 256, 1, 2),                   # 2**31 - 1 tokens in one batch
        ([2**30, 2**30 - 1], 132, 1, 64, 1),             # page 1 at the int32 page limit
        ([(2**31 - 1) // 4096] * 4096, 132, 256, 1, 1),  # total ~2**31 tokens, batch 4096
        ([8192] * 256, 132, 1, 64, 1),                   # OVH 16: clusters start mid-overhead
        ([8192] * 256, 132, 64, 1, 1),                   # one cut per cluster boundary
        ([1, 0, 2, 0, 3] * 300, 264, 64, 1, 1),          # tiny batches, many per cluster
        ([3200] * 64, 66, 64, 1, 1),                     # uniform: whole batches per slice
        ([3200] * 128, 66, 64, 1, 1),
        ([3200] * 2041, 66, 64, 1, 1),                   # uniform over several tiles: 1578 -> 1581
        ([3200] * 63 + [3201], 66, 64, 1, 1),            # one tile, one batch differs: 50, not 51
        ([3200] * 127 + [3201], 66, 64, 1, 1),           # several tiles, one differs: 99, not 102
        ([3200, 3328] * 32, 66, 64, 1, 1),               # whole mean (52) but unequal: 51, not 52
        ([3200, 3328] * 64, 66, 64, 1, 1),               # the same over several tiles: 101, not 104
        ([8192] * 64, 132, 64, 1, 1),                    # uniform, 2 clusters a batch: halves
        ([3200] * 64, 264, 64, 1, 1),                    # 4 clusters a batch
        ([8192] * 64, 132, 1, 64, 1),                    # the same at page 1 (OVH 16)
        ([100] * 3, 264, 1, 1, 1),                       # OVH 16 over a 2-block slice
        ([8192] * 45, 132, 64, 1, 3),                    # 2 a batch would add 21 blocks: lattice
    ]
    for lens, C, ps, G, thr in cases:
        qo, kv, lpl = make_inputs(lens, [thr] * len(lens), ps)
        emulate_and_compare(emulator, qo, kv, lpl, C=C, page_size=ps, G=G, thr=thr)
    # uniform batches spread over clusters, the batches walked in several tiles of threads (the
    # tiled body forced: the launch would take the one-warp path at 64 batches)
    for lens, C in (([8192] * 64, 132), ([3200] * 64, 264)):
        qo, kv, lpl = make_inputs(lens, [1] * len(lens), 64)
        emulate_and_compare(emulator, qo, kv, lpl, C=C, page_size=64, G=1, thr=1, nthreads=32,
                            tiled=True)


def test_emulated_kernel_batch_4096(emulator):
    rng = random.Random(4096)
    for ps, kind in ((64, "random"), (1, "zeros"), (16, "edges")):
        G = md.default_kv_granularity(ps)
        lens = random_lengths(rng, kind, 4096, ps, G)
        qlens = [rng.randint(1, 4) for _ in range(4096)]
        qo, kv, lpl = make_inputs(lens, qlens, ps)
        emulate_and_compare(emulator, qo, kv, lpl, C=132, page_size=ps, G=G, thr=4,
                            nthreads=128)


# md_body_lanes serves 1..LANES_MAX batches with one warp: one a lane up to the warp width, then
# two a lane on sm_90a (the emulator fixtures check it)
LANES_MAX = 64


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs(max_batch=LANES_MAX), st.sampled_from([0, 3]))
def test_emulated_one_warp_path_equals_reference(emulator, cfg, extra):
    """The one-warp path (the device's launch up to LANES_MAX batches) against the Python
    reference, on the same random configurations as the tiled path."""
    B = len(cfg["lens"])
    if B > LANES_MAX:
        B = LANES_MAX
        cfg = dict(cfg, lens=cfg["lens"][:B], qlens=cfg["qlens"][:B])
    assert emulator.lanes_max == LANES_MAX and emulator.lanes_apply(B, 32) == 1
    qo, kv, lpl = make_inputs(cfg["lens"], cfg["qlens"], cfg["page_size"])
    emulate_and_compare(emulator, qo, kv, lpl, C=cfg["C"], page_size=cfg["page_size"],
                        G=cfg["G"], thr=cfg["thr"], msb=cfg["msb"], nthreads=32, extra=extra)
    assert emulator.last_path() == lanes_path(kv, lpl, C=cfg["C"], page_size=cfg["page_size"],
                                              G=cfg["G"], thr=cfg["thr"], msb=cfg["msb"])


def test_emulated_one_warp_path_edge_cases(emulator):
    """The edge cases of test_emulated_kernel_edge_cases that fit one warp's LANES_MAX batches,
    through the one-warp path; batch 0 takes the tiled path at one warp."""
    assert emulator.lanes_apply(0, 32) == 0 and emulator.lanes_apply(LANES_MAX + 1, 32) == 0
    assert emulator.lanes_max == LANES_MAX
    assert emulator.lanes_apply(1, 64) == 0
    cases = [
        ([], 8, 64, 1, 1),                              # batch 0: the tiled body
        ([0] * 32, 5, 16, 4, 2),
        ([65], 2, 64, 1, 4),
        ([10**6], 264, 64, 1, 1),
        ([2**31 - 1], 264, 256, 1, 2),
        ([2**30, 2**30 - 1], 132, 1, 64, 1),
        ([(2**31 - 1) // 32] * 32, 132, 256, 1, 1),     # total ~2**31 tokens at LANES_MAX
        ([8192] * 32, 132, 1, 64, 1),
        ([1, 0, 2, 0, 3] * 6, 264, 64, 1, 1),
        ([3200] * 32, 16, 64, 1, 1),                    # uniform: whole batches per slice
        ([3200] * 31 + [3201], 16, 64, 1, 1),
        ([3200, 3328] * 16, 16, 64, 1, 1),
        ([8192] * 32, 132, 64, 1, 1),                   # uniform, 4 clusters a batch
        ([3200] * 16, 132, 64, 1, 1),
        ([8192] * 32, 132, 1, 64, 1),
        ([100] * 3, 264, 1, 1, 1),
        ([8192] * 30, 132, 64, 1, 3),
        ([21], 132, 64, 1, 1),                          # the bench's b1 ctx21 step
        ([3200] * 17 + [0] * 3 + [5000] * 11, 132, 64, 1, 2),
        # two batches a lane (sm_90a above 32 batches)
        ([3200] * 33, 132, 64, 1, 1),
        ([3200] * 64, 132, 64, 1, 1),                   # uniform, whole batches per slice
        ([8192] * 64, 264, 64, 1, 1),                   # uniform, 4 work lists a batch
        ([21] * 63, 132, 64, 1, 1),
        ([0, 9000] * 20 + [1] * 5, 132, 16, 4, 3),
        ([(2**22 - 1) * 16] * 64, 132, 16, 1, 1),       # the 32-bit path's largest batches
        ([2**31 - 1] + [1] * 40, 264, 256, 1, 2),       # one huge batch: the tiled body
    ]
    for lens, C, ps, G, thr in cases:
        assert emulator.lanes_apply(len(lens), 32) == (len(lens) >= 1)
        qo, kv, lpl = make_inputs(lens, [thr] * len(lens), ps)
        emulate_and_compare(emulator, qo, kv, lpl, C=C, page_size=ps, G=G, thr=thr, nthreads=32)
        if lens:
            assert emulator.last_path() == lanes_path(kv, lpl, C=C, page_size=ps, G=G, thr=thr)


def lanes_path(kv, lpl, *, C, page_size, G, thr, msb=-1):
    """Which path md_body_lanes takes, modelled from its bounds (MD_FAST_* in the template):
    1, its 32-bit path, when every batch has 0 <= pages < 2**22 pages and (page_size > 1)
    0 <= last page length < 2**24, page_size <= 256, and the kv granularity, the split count
    and the overhead are < 2**16; else 2, the tiled body (the overhead follows the page size
    here, so its bound is not reached)."""
    B = len(kv) - 1
    lanes_fit = all(0 <= kv[b + 1] - kv[b] < 2**22 and (page_size == 1 or 0 <= lpl[b] < 2**24)
                    for b in range(B))
    params_fit = (page_size <= 256 and G < 2**16 and num_splits_for(C, msb, B) < 2**16
                  and overhead_blocks(page_size) < 2**16)
    return 1 if lanes_fit and params_fit else 2


def test_emulated_one_warp_path_bounds(emulator):
    """Each bound of md_body_lanes's 32-bit path, on both sides: the path taken is the model's
    (lanes_path) and the schedule is the reference's either way."""
    cases = [  # (tokens per batch, C, page_size, G, thr, last page lengths or None)
        ([(2**22 - 1) * 64, 21, 3200], 132, 64, 1, 1, None),    # 2**22 - 1 pages: 32-bit
        ([2**22 * 64, 21, 3200], 132, 64, 1, 1, None),          # 2**22 pages: tiled
        ([2**22 - 1] * 4, 132, 1, 1, 3, None),                  # page 1
        ([2**22] + [5] * 3, 132, 1, 1, 3, None),
        ([2**21] * 32, 264, 1, 64, 2, None),                    # the line at 2**26 blocks
        ([3200] * 8, 2**16 - 1, 64, 1, 1, None),                # split count 2**16 - 1
        ([3200] * 8, 2**16, 64, 1, 1, None),                    # 2**16: tiled
        ([3200] * 8, 132, 64, 2**15, 1, None),                  # granularity 2**15
        ([3200] * 8, 132, 64, 2**16, 1, None),                  # 2**16: tiled
        # invalid last page lengths (the reference refuses them): the one-warp path must
        # write what the tiled body writes
        ([640, 640], 132, 64, 1, 1, [2**24 - 1, 7]),            # last page length 2**24 - 1
        ([640, 640], 132, 64, 1, 1, [7, 2**24]),                # 2**24: tiled
        ([640, 640], 132, 64, 1, 1, [-1, 7]),                   # negative: tiled
    ]
    seen = set()
    for lens, C, ps, G, thr, lpl_over in cases:
        qo, kv, lpl = make_inputs(lens, [1] * len(lens), ps)
        if lpl_over is None:
            emulate_and_compare(emulator, qo, kv, lpl, C=C, page_size=ps, G=G, thr=thr,
                                nthreads=32)
            path = emulator.last_path()
        else:
            lpl = lpl_over
            path = lanes_equals_tiled(emulator, qo, kv, lpl, C=C, page_size=ps, G=G, thr=thr)
        assert path == lanes_path(kv, lpl, C=C, page_size=ps, G=G, thr=thr), (lens, C, ps, G, thr)
        seen.add(path)
    assert seen == {1, 2}


def garbage_inputs(rng, B):
    """kv_indptr / qo_indptr / last-page lengths a caller should never pass: random int32,
    decreasing, or huge steps."""
    kind = rng.choice(("random", "decreasing", "huge"))
    if kind == "random":
        kv = [rng.randint(-2**31, 2**31 - 1) for _ in range(B + 1)]
    elif kind == "decreasing":
        kv = sorted((rng.randint(-2**20, 2**31 - 1) for _ in range(B + 1)), reverse=True)
    else:
        kv = [0]
        for _ in range(B):
            kv.append(min(2**31 - 1, kv[-1] + rng.choice((0, 1, 2**29))))
    qo = ([rng.randint(-2**31, 2**31 - 1) for _ in range(B + 1)] if rng.random() < 0.5
          else list(range(B + 1)))
    lpl = [rng.randint(-2**31, 2**31 - 1) for _ in range(B)]
    return qo, kv, lpl


def lanes_equals_tiled(emulator, qo, kv, lpl, *, C, **kw):
    """The one-warp body (run first; emulator.last_path() then tells its path) and the tiled
    body write the same buffers and the same split-merge hint."""
    B = len(kv) - 1
    outs = []
    for tiled in (False, True):
        bufs = alloc(info_sizes(B, C))
        heavy = emulator.run(bufs, qo, kv, lpl, C=C, tiled=tiled, nthreads=32, **kw)
        if not tiled:
            path = emulator.last_path()
        outs.append((heavy, [b.clone() for b in bufs[1:]]))
    assert outs[0][0] == outs[1][0]
    for a, b in zip(outs[0][1], outs[1][1]):
        assert torch.equal(a, b)
    return path


def test_emulated_one_warp_path_equals_tiled_on_caps(emulator):
    """Buffer sizes passed to the C entry point that disagree with the schedule (negative, past
    int32, too small): the one-warp path writes what the tiled body writes. (The op passes
    tensor sizes; the C ABI does not check them.)"""
    qo, kv, lpl = [0, 1, 2], [0, 3000, 6000], [16, 16]
    t = lambda x: torch.tensor(x, dtype=torch.int32)  # noqa: E731
    for cap_works in (-5, -(2**32) + 10, 2**32 + 3, 3, 0):
        outs = []
        for tiled in (False, True):
            bufs = [torch.zeros(2, dtype=torch.uint64), torch.full((133,), -1, dtype=torch.int32),
                    torch.full((200, 8), -1, dtype=torch.int32), torch.full((3,), -1, dtype=torch.int32),
                    torch.full((2, 2), -1, dtype=torch.int32), torch.full((400,), -1, dtype=torch.int32)]
            ins = t(qo), t(kv), t(lpl)
            heavy = ctypes.c_int32(-7)
            emulator.lib.emu_force_tiled(1 if tiled else 0)
            try:
                rc = emulator.fn(*(x.data_ptr() for x in ins), *(b.data_ptr() for b in bufs),
                                 133, cap_works, 3, 2, 400, 2, 132, 132, 16, 1, 5, 1,
                                 ctypes.addressof(heavy), 32)
            finally:
                emulator.lib.emu_force_tiled(0)
            assert rc == 0
            if not tiled:
                assert emulator.last_path() == 1
            outs.append((heavy.value, bufs[1:]))
        assert outs[0][0] == outs[1][0], cap_works
        for a, b in zip(outs[0][1], outs[1][1]):
            assert torch.equal(a, b), cap_works


def test_emulated_one_warp_path_equals_tiled_on_garbage(emulator):
    """Where the reference cannot judge (invalid inputs), the one-warp path must still write
    exactly what the tiled body writes, buffer for buffer, and the same split-merge hint: on
    wild values (the tiled body runs) and on page counts inside the 32-bit path's bounds with
    invalid q ranges and last page lengths (its 32-bit path runs)."""
    rng = random.Random(11)
    paths = collections.Counter()
    for i in range(90):
        B, C = rng.randint(1, LANES_MAX), rng.choice((1, 7, 132, 264))
        ps = rng.choice((1, 16, 64))
        qo, kv, lpl = garbage_inputs(rng, B)
        if i % 3 == 2:   # pages in bounds, the rest invalid
            kv = [0]
            for _ in range(B):
                kv.append(kv[-1] + rng.choice((0, 1, 2, rng.randint(0, 5000))))
            lpl = [rng.choice((0, -1, ps + 1, rng.randint(-3, 2**24 - 1))) for _ in range(B)]
        paths[lanes_equals_tiled(emulator, qo, kv, lpl, C=C, page_size=ps, G=rng.choice((1, 4)),
                                 thr=rng.randint(1, 8))] += 1
    assert paths[1] >= 10 and paths[2] >= 30, paths


def guarded_int32(vals, keep):
    """vals in anonymous memory that ends (or starts) at a no-access page, so that a read one
    element past (or before) the array faults. Linux: mmap + mprotect through libc."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    page = 4096
    n = len(vals)
    pages = (4 * n + page - 1) // page + 2
    base = libc.mmap(None, pages * page, 3, 0x22, -1, 0)  # PROT_READ|WRITE, MAP_PRIVATE|ANON
    assert base not in (None, ctypes.c_void_p(-1).value)
    keep.append(base)
    assert libc.mprotect(base, page, 0) == 0
    assert libc.mprotect(base + (pages - 1) * page, page, 0) == 0
    addr = base + (pages - 1) * page - 4 * n      # the array's end touches the last guard page
    (ctypes.c_int32 * n).from_address(addr)[:] = vals
    return addr


@pytest.mark.skipif(sys.platform != "linux", reason="guard pages through Linux mmap/mprotect")
def test_emulated_kernel_reads_only_its_inputs(emulator):
    """Inputs of exactly B + 1 (indptrs) and B (last-page lengths) int32 that end at a
    no-access page, and a null last-page array at page size 1: a read past an input's end
    crashes the test process. Both bodies, valid and garbage values."""
    rng = random.Random(5)
    keep = []   # the mappings stay until the process exits (a few pages)
    for i in range(40):
        B, C = rng.randint(1, LANES_MAX + 40), rng.choice((1, 7, 132))
        ps = rng.choice((1, 16, 64))
        if i % 2:
            qo, kv, lpl = garbage_inputs(rng, B)
        else:
            qo, kv, lpl = make_inputs(random_lengths(rng, "random", B, ps, 1),
                                      [1] * B, ps)
        ins = (guarded_int32(qo, keep), guarded_int32(kv, keep),
               0 if ps == 1 else guarded_int32(lpl, keep))
        for tiled in (False, True):
            bufs = alloc(info_sizes(B, C))
            emulator.run(bufs, qo, kv, lpl, C=C, page_size=ps, G=1, thr=rng.randint(1, 4),
                         nthreads=emulator.launch_threads(B), tiled=tiled, ptrs_in=ins)


def test_emulated_one_warp_path_64_lanes(emulator64):
    """AMD's 64-lane wave: the one-warp path serves up to 64 batches (one a lane); against
    the reference, with the device launch's block size."""
    rng = random.Random(64)
    lanes_max = emulator64.lanes_max
    assert lanes_max == LANES_MAX
    assert emulator64.launch_threads(lanes_max) == 64
    assert emulator64.launch_threads(lanes_max + 1) == 128
    for B in (1, 2, 31, 32, 33, 63, 64, 65, 127, 128, 129, 200):
        ps = rng.choice((1, 16, 64))
        G = md.default_kv_granularity(ps)
        lens = random_lengths(rng, rng.choice(KINDS), B, ps, G)
        qlens = [rng.randint(1, 4) for _ in range(B)]
        qo, kv, lpl = make_inputs(lens, qlens, ps)
        threads = emulator64.launch_threads(B)
        assert emulator64.lanes_apply(B, threads) == (B <= lanes_max)
        emulate_and_compare(emulator64, qo, kv, lpl, C=rng.choice((66, 132, 304)), page_size=ps,
                            G=G, thr=4, nthreads=threads)


def test_emulated_kernel_block_per_batch(emulator):
    """The device's block below 1024 batches (aiter_mla_get_metadata_v1's launch): one warp up
    to LANES_MAX batches (the one-warp path, md_body_lanes), else one thread per batch in whole
    warps, so one tile, and works walked in several rounds when the cuts make more works than
    threads. Batch sizes at and around the warp, lanes and block edges, long contexts so that
    batches are cut."""
    rng = random.Random(32)
    rounds = 0
    for B in (1, 2, 31, 32, 33, 64, 100, 128, 129, 500, 900, 993, 1023):
        C = rng.choice((66, 132))
        ps = rng.choice((1, 16, 64))
        G = md.default_kv_granularity(ps)
        lens = random_lengths(rng, "random", B, ps, G)
        qlens = [rng.randint(1, 4) for _ in range(B)]
        qo, kv, lpl = make_inputs(lens, qlens, ps)
        threads = emulator.launch_threads(B)
        assert threads == (32 if B <= LANES_MAX else min(1024, -(-B // 32) * 32))
        assert emulator.lanes_apply(B, threads) == (B <= LANES_MAX)
        s = emulate_and_compare(emulator, qo, kv, lpl, C=C, page_size=ps, G=G, thr=4,
                                nthreads=threads)
        rounds += len(s.work_info) > threads
    assert rounds >= 3   # the cases do walk works in more than one round


def test_emulated_kernel_full_block_and_many_tiles(emulator):
    """The device's block shape from 993 batches up (1024 threads: 32 warps in the cross-warp
    scan), one tile and several, and 40000 batches (40 tiles with carries, as the GPU test)."""
    rng = random.Random(1024)
    for B, ps, kind in ((1000, 64, "random"), (4096, 1, "zeros"), (40000, 16, "random")):
        G = md.default_kv_granularity(ps)
        lens = random_lengths(rng, kind, B, ps, G)
        qlens = [rng.randint(1, 4) for _ in range(B)]
        qo, kv, lpl = make_inputs(lens, qlens, ps)
        emulate_and_compare(emulator, qo, kv, lpl, C=132, page_size=ps, G=G, thr=4,
                            nthreads=1024)


def test_emulated_kernel_invalid_values_stay_in_bounds(emulator):
    """Garbage kv_indptr / last-page lengths / q lengths: the kernel must stop and write only
    inside the buffers (each buffer here is followed by a guard region)."""
    rng = random.Random(3)
    for _ in range(30):
        B, C = rng.randint(1, 200), rng.randint(1, 40)
        kv = [rng.randint(-2**31, 2**31 - 1) for _ in range(B + 1)]
        qo = [rng.randint(-2**31, 2**31 - 1) for _ in range(B + 1)]
        lpl = [rng.randint(-2**31, 2**31 - 1) for _ in range(B)]
        guard = 64
        info = info_sizes(B, C)
        raw = alloc([((s[0] + guard,) + s[1:], d) for s, d in info])
        bufs = [r[: s[0]] for r, (s, _) in zip(raw, info)]
        emulator.run(bufs, qo, kv, lpl, C=C, page_size=rng.choice([1, 16]), G=rng.choice([1, 4]),
                     thr=rng.randint(1, 8), nthreads=rng.choice([32, 64]))
        for r, (s, d) in zip(raw[1:], info[1:]):
            assert (r[s[0]:] == SENTINEL).all()


def test_template_builds_for_sm90a_with_nvcc(private_cache):
    """The kernel source compiles for sm_90a through the JIT (no GPU needed to build)."""
    if shutil.which("nvcc") is None and not os.environ.get("CUDA_HOME"):
        pytest.skip("nvcc not found")
    from aiter_mla.jit import get_module

    mod = get_module("mla_metadata", arch="sm_90a")
    assert mod is not None


# ------------------------------------------------------------------------------------------
# GPU: the kernel through get_mla_metadata_v1


def gpu_case(rng: random.Random):
    ps = rng.choice(PAGE_SIZES)
    B = rng.choice([1, 2, 3, rng.randint(1, 64), rng.randint(1, 512), rng.randint(1, 4096)])
    C = rng.choice([1, 2, rng.randint(1, 264), 132, 264])
    G = rng.choice([md.default_kv_granularity(ps), 1, 16, max(ps, 16)])
    thr = rng.randint(1, 8)
    heads = rng.choice([h for h in (1, 8, 16) if h * thr <= 128])
    msb = rng.choice([-1, -1, 1, 2, 32])
    lens = random_lengths(rng, rng.choice(KINDS), B, ps, G)
    qlens = [rng.randint(1, thr) for _ in range(B)] if rng.random() < 0.5 else [thr] * B
    return dict(lens=lens, qlens=qlens, ps=ps, C=C, G=G, thr=thr, heads=heads, msb=msb,
                extra=rng.choice([0, 0, 5]))


def gpu_run_and_compare(cfg, monkeypatch):
    monkeypatch.setenv("CU_NUM", str(cfg["C"]))
    monkeypatch.setenv("AITER_ENABLE_EXPERIMENTAL", "0")
    qo, kv, lpl = make_inputs(cfg["lens"], cfg["qlens"], cfg["ps"])
    B = len(kv) - 1
    info = md.get_mla_metadata_info_v1(B + cfg["extra"], cfg["thr"], cfg["heads"], None, None)
    bufs = alloc(info, device="cuda")
    call_op(bufs, qo, kv, lpl, heads=cfg["heads"], page_size=cfg["ps"],
            kv_granularity=cfg["G"], max_seqlen_qo=cfg["thr"],
            max_split_per_batch=cfg["msb"])
    # C multiprocessors; the <= 32-row shapes plan 2 work lists on each (arch.occupancy)
    s = reference_schedule(qo, kv, lpl, num_heads=cfg["heads"],
                           num_clusters=arch.num_clusters(cfg["heads"], cfg["thr"]),
                           page_size=cfg["ps"], kv_granularity=cfg["G"],
                           max_seqlen_qo=cfg["thr"], max_split_per_batch=cfg["msb"])
    torch.cuda.synchronize()
    compare_buffers(bufs, s, B)
    return bufs, s


@gpu
@needs_cuda
def test_gpu_kernel_equals_reference_1000_configs(monkeypatch):
    rng = random.Random(2024)
    for i in range(1000):
        cfg = gpu_case(rng)
        try:
            bufs, s = gpu_run_and_compare(cfg, monkeypatch)
        except AssertionError:
            print(f"config {i}: {dict(cfg, lens=cfg['lens'][:16])}", file=sys.stderr)
            raise
        if i % 50 == 0:  # the checker too, on a sample (it is slower than the comparison)
            qo, kv, lpl = make_inputs(cfg["lens"], cfg["qlens"], cfg["ps"])
            check_schedule(qo, kv, lpl, work_indptr=s.work_indptr, work_info=s.work_info,
                           reduce_indptr=s.reduce_indptr, reduce_final_map=s.reduce_final_map,
                           reduce_partial_map=s.reduce_partial_map,
                           num_clusters=len(s.work_indptr) - 1,
                           page_size=cfg["ps"], G=cfg["G"], max_seqlen_qo=cfg["thr"],
                           msb=cfg["msb"])


@gpu
@needs_cuda
def test_gpu_batch_4096_and_40000(monkeypatch):
    rng = random.Random(11)
    for B, ps in ((4096, 64), (4096, 1), (40000, 16)):  # 40000 batches: 40 tiles of 1024
        G = md.default_kv_granularity(ps)
        cfg = dict(lens=random_lengths(rng, "random", B, ps, G), qlens=[1] * B, ps=ps, C=132,
                   G=G, thr=1, heads=16, msb=-1, extra=0)
        gpu_run_and_compare(cfg, monkeypatch)


@gpu
@needs_cuda
def test_gpu_cuda_graph_capture(monkeypatch):
    monkeypatch.setenv("CU_NUM", "132")
    B, ps = 64, 64
    G = md.default_kv_granularity(ps)
    rng = random.Random(5)
    info = md.get_mla_metadata_info_v1(B, 2, 16, None, None)
    bufs = alloc(info, device="cuda")
    qo_d = torch.zeros(B + 1, dtype=torch.int32, device="cuda")
    kv_d = torch.zeros(B + 1, dtype=torch.int32, device="cuda")
    lpl_d = torch.ones(B, dtype=torch.int32, device="cuda")

    def load(lens):
        qo, kv, lpl = make_inputs(lens, [2] * B, ps)
        qo_d.copy_(torch.tensor(qo, dtype=torch.int32))
        kv_d.copy_(torch.tensor(kv, dtype=torch.int32))
        lpl_d.copy_(torch.tensor(lpl, dtype=torch.int32))
        return qo, kv, lpl

    def op():
        (ptrs, indptr, info_set, rindptr, final, partial) = bufs
        md.get_mla_metadata_v1(qo_d, kv_d, lpl_d, 16, 1, False, ptrs, info_set, indptr,
                               rindptr, final, partial, page_size=ps, kv_granularity=G,
                               max_seqlen_qo=2)

    load(random_lengths(rng, "random", B, ps, G))
    s_side = torch.cuda.Stream()
    with torch.cuda.stream(s_side):
        op()  # warm-up (module load) outside capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        op()
    for _ in range(3):
        qo, kv, lpl = load(random_lengths(rng, rng.choice(KINDS), B, ps, G))
        for b in bufs[1:]:
            b.fill_(SENTINEL)
        g.replay()
        torch.cuda.synchronize()
        s = reference_schedule(qo, kv, lpl, num_heads=16, num_clusters=arch.num_clusters(16, 2),
                               page_size=ps, kv_granularity=G, max_seqlen_qo=2)
        compare_buffers(bufs, s, B)


@gpu
@needs_cuda
def test_gpu_to_buffers_matches_kernel(monkeypatch):
    """reference to_buffers (used by other ops' tests) writes what the kernel writes."""
    rng = random.Random(9)
    cfg = gpu_case(rng)
    bufs, s = gpu_run_and_compare(cfg, monkeypatch)
    info = md.get_mla_metadata_info_v1(len(cfg["lens"]) + cfg["extra"], cfg["thr"],
                                       cfg["heads"], None, None)
    ref_bufs = to_buffers(s, alloc(info, device="cuda"))
    compare_buffers(ref_bufs, s, len(cfg["lens"]))


def test_dtype_arguments_are_the_kernels_dtypes(monkeypatch):
    """q_dtype / kv_dtype (info) and dtype_q / dtype_kv (op) take fp8 e4m3fn, bf16 or None;
    float32 was accepted silently although no decode kernel takes it."""
    monkeypatch.setenv("CU_NUM", "132")
    with pytest.raises(ValueError, match="q_dtype must be torch.float8_e4m3fn or torch.bfloat16.*float32"):
        md.get_mla_metadata_info_v1(2, 1, 16, torch.float32, None)
    with pytest.raises(TypeError, match="kv_dtype must be a torch.dtype"):
        md.get_mla_metadata_info_v1(2, 1, 16, None, "fp8")
    bufs = alloc(md.get_mla_metadata_info_v1(2, 1, 16, torch.bfloat16, torch.bfloat16))
    i32 = dict(dtype=torch.int32)
    args = (torch.tensor([0, 1, 2], **i32), torch.tensor([0, 2, 3], **i32), torch.tensor([3, 3], **i32), 16, 1,
            True, bufs[0], bufs[2], bufs[1], bufs[3], bufs[4], bufs[5])  # AITER's order: info_set, indptr
    with pytest.raises(ValueError, match="dtype_kv must be .*float16"):
        md.get_mla_metadata_v1(*args, max_seqlen_qo=1, dtype_kv=torch.float16)
    short_kv = (args[0], torch.tensor([0, 2], **i32)) + args[2:]
    with pytest.raises(ValueError, match=r"seqlens_qo_indptr and seqlens_kv_indptr must have the same "
                                         r"length \(num_batches \+ 1\), got 3 and 2"):
        md.get_mla_metadata_v1(*short_kv, max_seqlen_qo=1)


@pytest.mark.parametrize("target", ["gfx999", "", None, 5])
def test_ctas_per_work_refuses_an_unknown_target(target):
    """It returned the sm_90a answer for any target (fresh-user report); occupancy and
    num_clusters raise."""
    with pytest.raises(ValueError, match="target must be one of sm_90a, gfx942, gfx950"):
        arch.ctas_per_work(128, 1, target=target)

