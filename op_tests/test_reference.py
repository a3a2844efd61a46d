"""The float64 reference (aiter_mla.reference) against brute force done another way.

mla_decode_ref is checked against per-(row, head) loops that walk the page table by hand and
use torch.softmax / torch.logsumexp; split_reference against mla_decode_ref on hand-made split
schedules (including the piece of docs/DESIGN.md §8.4 where a causal row sees no key); reduce_ref against one
softmax over the concatenated pieces. All CPU.
"""
from __future__ import annotations

import math
import random

import pytest
import torch

from aiter_mla import reference as ref
from aiter_mla.work_info import WI, WORK_INFO_INTS

D, DV = 576, 512
FP8 = torch.float8_e4m3fn


# ------------------------------------------------------------------------------------------
# problem builder


def make_problem(qlens, kvlens, H, page_size, q_dtype=torch.bfloat16, kv_dtype=torch.bfloat16,
                 seed=0, spare_pages=3):
    """Random paged problem; every unused KV slot (and every spare page) is NaN."""
    g = torch.Generator().manual_seed(seed)
    B = len(qlens)
    pages = [math.ceil(n / page_size) for n in kvlens]
    num_pages = sum(pages) + spare_pages
    perm = torch.randperm(num_pages, generator=g)
    kv_indptr = torch.tensor([0] + list(torch.tensor(pages).cumsum(0).tolist()), dtype=torch.int32)
    kv_indices = perm[: sum(pages)].to(torch.int32)
    last = torch.tensor([(n - (p - 1) * page_size) if p else 0 for n, p in zip(kvlens, pages)],
                        dtype=torch.int32)
    kv = torch.full((num_pages, page_size, 1, D), float("nan"))
    for b in range(B):
        for v in range(kvlens[b]):
            page = int(kv_indices[kv_indptr[b] + v // page_size])
            kv[page, v % page_size, 0] = torch.randn(D, generator=g)
    qo_indptr = torch.tensor([0] + list(torch.tensor(qlens).cumsum(0).tolist()), dtype=torch.int32)
    q = torch.randn(int(qo_indptr[-1]), H, D, generator=g)
    return dict(q=q.to(q_dtype), kv_buffer=kv.to(kv_dtype), qo_indptr=qo_indptr,
                kv_indptr=kv_indptr, kv_indices=kv_indices, kv_last_page_lens=last)


def brute_force(p, sm_scale, q_scale=1.0, kv_scale=1.0, fp8_p=False):
    """Per (row, head) loops; page walk by hand; torch.softmax / logsumexp."""
    q = p["q"].to(torch.float64) * q_scale
    kv = p["kv_buffer"]
    P = kv.shape[1]
    qo, kvp = p["qo_indptr"].tolist(), p["kv_indptr"].tolist()
    idx, last = p["kv_indices"].tolist(), p["kv_last_page_lens"].tolist()
    total_q, H = q.shape[0], q.shape[1]
    out = torch.zeros(total_q, H, DV, dtype=torch.float64)
    lse = torch.zeros(total_q, H, dtype=torch.float64)
    for b in range(len(qo) - 1):
        npages = kvp[b + 1] - kvp[b]
        keys = []
        for pi in range(npages):
            used = last[b] if pi == npages - 1 else P
            for slot in range(used):
                keys.append(kv[idx[kvp[b] + pi], slot, 0].to(torch.float64) * kv_scale)
        kvlen, qlen = len(keys), qo[b + 1] - qo[b]
        for i in range(qlen):
            r = qo[b] + i
            nvis = kvlen - (qlen - 1 - i)
            for h in range(H):
                if nvis <= 0:
                    lse[r, h] = math.inf
                    continue
                K = torch.stack(keys[:nvis])
                s = (K @ q[r, h]) * sm_scale
                lse[r, h] = torch.logsumexp(s, 0)
                if fp8_p:
                    e = torch.exp(s - s.max())
                    e8 = e.float().to(FP8).double()
                    out[r, h] = (e8 @ K[:, :DV]) / e.sum()
                else:
                    out[r, h] = torch.softmax(s, 0) @ K[:, :DV]
    return out, lse


def assert_close(a, b, tol, what):
    err = ref.relative_l2(a, b)
    assert err < tol, f"{what}: relative L2 {err:.3e} >= {tol:.1e}"


# ------------------------------------------------------------------------------------------
# mla_decode_ref


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_decode_ref_vs_brute_force_bf16(page_size):
    # ragged qlen, causal qlen > 1, kv_len 0, kv_len < qlen (rows that see no key)
    qlens, kvlens = [1, 3, 2, 4, 2, 1], [37, 20, 0, 2, 16, 1]
    p = make_problem(qlens, kvlens, H=4, page_size=page_size, seed=page_size)
    sm = 1 / math.sqrt(D)
    assert torch.isnan(p["kv_buffer"].float()).any()  # unused slots hold NaN
    out, lse = ref.mla_decode_ref(**p, sm_scale=sm)
    bo, bl = brute_force(p, sm)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    assert_close(out, bo, 1e-12, "out")
    assert_close(lse, bl, 1e-12, "lse")
    # the empty rows: batch 2 (kv 0) and batch 3's first two q positions (kv 2, qlen 4)
    q0 = sum(qlens[:2])
    assert torch.isposinf(lse[q0:q0 + 2 + 2]).all() and (out[q0:q0 + 4] == 0).all()
    assert torch.isfinite(lse[q0 + 4:q0 + 6]).all()


def test_decode_ref_fp8_scales_and_fp8_p():
    qlens, kvlens = [2, 1, 3], [70, 9, 33]
    p = make_problem(qlens, kvlens, H=3, page_size=8, q_dtype=FP8, kv_dtype=FP8, seed=7)
    sm, qs, ks = 0.11, 0.5, 1.75
    for fp8_p in (False, True):
        out, lse = ref.mla_decode_ref(**p, sm_scale=sm, q_scale=torch.tensor([qs]),
                                      kv_scale=ks, fp8_p=fp8_p)
        bo, bl = brute_force(p, sm, qs, ks, fp8_p=fp8_p)
        assert_close(out, bo, 1e-12, f"out fp8_p={fp8_p}")
        assert_close(lse, bl, 1e-12, f"lse fp8_p={fp8_p}")
    exact, _ = ref.mla_decode_ref(**p, sm_scale=sm, q_scale=qs, kv_scale=ks)
    rounded, _ = ref.mla_decode_ref(**p, sm_scale=sm, q_scale=qs, kv_scale=ks, fp8_p=True)
    err = ref.relative_l2(rounded, exact)
    assert 1e-4 < err < 5e-2, f"fp8 P should perturb a little, got {err:.3e}"


def test_decode_ref_scales_are_real_values():
    p = make_problem([2], [40], H=2, page_size=4, seed=3)
    a, la = ref.mla_decode_ref(**p, sm_scale=0.1, q_scale=2.0, kv_scale=3.0)
    p2 = dict(p, q=p["q"].double() * 2.0, kv_buffer=p["kv_buffer"].double() * 3.0)
    b, lb = ref.mla_decode_ref(**p2, sm_scale=0.1)
    assert_close(a, b, 1e-14, "out")
    assert_close(la, lb, 1e-14, "lse")


@pytest.mark.parametrize("bad, match", [
    (lambda p: p["kv_last_page_lens"].__setitem__(0, 0), "kv_last_page_lens"),
    (lambda p: p["kv_last_page_lens"].__setitem__(0, 5), "kv_last_page_lens"),
    (lambda p: p["kv_indices"].__setitem__(0, 10**6), "kv_indices"),
    (lambda p: p.__setitem__("qo_indptr", torch.tensor([0, 5, 2], dtype=torch.int32)), "qo_indptr"),
    (lambda p: p.__setitem__("q", p["q"][..., :512]), "q must be"),
    (lambda p: p.__setitem__("kv_buffer", p["kv_buffer"][:, :, 0]), "kv_buffer"),
    # the value, not a one-element list (a fresh-user report: "got [-1]")
    (lambda p: p.__setitem__("kv_indptr", torch.tensor([-1, 2, 3], dtype=torch.int32)),
     r"kv_indptr\[0\] must be 0, got -1$"),
])
def test_decode_ref_rejects_bad_input(bad, match):
    p = make_problem([1, 1], [6, 3], H=2, page_size=4)
    bad(p)
    with pytest.raises((ValueError, TypeError), match=match):
        ref.mla_decode_ref(**p, sm_scale=0.1)


# ------------------------------------------------------------------------------------------
# split_reference on hand-made schedules


def make_schedule(p, piece_pages):
    """Split every batch into pieces of `piece_pages` pages (AITER record rules)."""
    P = p["kv_buffer"].shape[1]
    qo, kvp = p["qo_indptr"].tolist(), p["kv_indptr"].tolist()
    last = p["kv_last_page_lens"].tolist()
    works, rind, fmap, pmap = [], [0], [], []
    loc = 0
    for b in range(len(qo) - 1):
        b0, b1 = kvp[b], kvp[b + 1]
        kvlen = 0 if b1 == b0 else (b1 - b0 - 1) * P + last[b]
        cuts = list(range(b0, b1, piece_pages)) + [b1] if b1 > b0 else [b0, b0]
        pieces = list(zip(cuts[:-1], cuts[1:]))
        qlen = qo[b + 1] - qo[b]
        split = len(pieces) > 1
        locs = []
        for ks, ke in pieces:
            w = [0] * WORK_INFO_INTS
            w[WI["batch_idx"]], w[WI["qo_start"]], w[WI["qo_end"]] = b, qo[b], qo[b + 1]
            w[WI["kv_start"]], w[WI["kv_end"]] = ks, ke
            w[WI["kv_offset"]] = 0 if ke == b1 else kvlen - (ke - b0) * P
            w[WI["partial_qo_loc"]] = loc if split else -1
            if split:
                locs.append(loc)
                loc += qlen
            works.append(w)
        if split:
            pmap += locs
            fmap.append([qo[b], qo[b + 1]])
            rind.append(rind[-1] + len(locs))
        else:
            fmap.append([qo[b], qo[b + 1]])
            rind.append(rind[-1])
    i32 = dict(dtype=torch.int32)
    return dict(work_indptr=torch.tensor([0, len(works)], **i32),
                work_info_set=torch.tensor(works, **i32).view(-1, WORK_INFO_INTS),
                reduce_indptr=torch.tensor(rind, **i32),
                reduce_final_map=torch.tensor(fmap, **i32).view(-1, 2),
                reduce_partial_map=torch.tensor(pmap, **i32))


@pytest.mark.parametrize("page_size, piece_pages", [(1, 7), (4, 2), (16, 1)])
def test_split_reference_matches_decode_ref(page_size, piece_pages):
    # batch 1: last piece holds 1 token with qlen 4 -> partial rows that see no key (docs/DESIGN.md §8.4)
    qlens, kvlens = [1, 4, 2, 3], [50, 4 * page_size * piece_pages + 1, 0, 19]
    p = make_problem(qlens, kvlens, H=3, page_size=page_size, seed=5)
    sched = make_schedule(p, piece_pages)
    out, lse, p_out, p_lse = ref.split_reference(**p, **sched, sm_scale=0.07)
    o_ref, l_ref = ref.mla_decode_ref(**p, sm_scale=0.07)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    assert_close(out, o_ref, 1e-12, "out")
    assert_close(lse, l_ref, 1e-12, "lse")
    assert torch.isneginf(p_lse).any(), "the schedule should contain a piece with an empty row"
    assert (p_out[torch.isneginf(p_lse)] == 0).all()
    assert not torch.isnan(p_lse).any()


def test_split_reference_no_final_map_uniform_qlen():
    p = make_problem([2, 2, 2], [33, 5, 40], H=2, page_size=1, seed=9)
    sched = make_schedule(p, 8)
    o_ref, l_ref = ref.mla_decode_ref(**p, sm_scale=0.1)
    # AITER's derivation (uniform qlen, consecutive slots): tiles 0 and 2 are split and cover
    # [0, 2) and [4, 6); tile 1 (5 tokens, one piece) is unsplit.
    out, lse, _, _ = ref.split_reference(**p, **dict(sched, reduce_final_map=None), sm_scale=0.1)
    assert_close(out, o_ref, 1e-12, "out without final map")
    assert_close(lse, l_ref, 1e-12, "lse without final map")


@pytest.mark.parametrize("bad,exc,match", [
    (dict(sm_scale=float("nan")), ValueError, "sm_scale must be a finite number"),   # NaN outputs
    (dict(sm_scale=None), TypeError, "sm_scale must be a float"),     # a bare float() error
    (dict(sm_scale="0.05"), TypeError, "sm_scale must be a float"),   # was read as 0.05
    (dict(work_info_set="float"), TypeError, "work_info_set must be int32 or int64"),
    (dict(work_info_set="list"), TypeError, "work_info_set must be a torch.Tensor, got list"),
])
def test_split_reference_checks_sm_scale_and_the_records(bad, exc, match):
    """split_reference took any sm_scale (NaN gave NaN outputs, a string was read as a number)
    and a float or list work_info_set reached Python's own errors (a break test)."""
    p = make_problem([1, 2], [20, 9], H=2, page_size=4, seed=4)
    sched = make_schedule(p, 2)
    kw = dict(sm_scale=0.07)
    wis = sched["work_info_set"]
    if bad.get("work_info_set") == "float":
        sched = dict(sched, work_info_set=wis.float())
    elif bad.get("work_info_set") == "list":
        sched = dict(sched, work_info_set=wis.tolist())
    else:
        kw.update(bad)
    with pytest.raises(exc, match=match):
        ref.split_reference(**p, **sched, **kw)


def _edit_schedule(sched, what):
    wis = sched["work_info_set"].clone()
    split = [i for i in range(wis.shape[0]) if wis[i, WI["partial_qo_loc"]] >= 0]
    if what == "empty work_indptr":
        return dict(sched, work_indptr=torch.empty(0, dtype=torch.int32))
    if what == "decreasing work_indptr":
        n = wis.shape[0]
        return dict(sched, work_indptr=torch.tensor([0, n, 1], dtype=torch.int32))
    if what == "huge partial_qo_loc":
        wis[split[0], WI["partial_qo_loc"]] = 2**31 - 1
    elif what == "far partial_qo_loc":
        wis[split[-1], WI["partial_qo_loc"]] = 10**6
    elif what == "kv_end < kv_start":
        wis[0, WI["kv_end"]] = wis[0, WI["kv_start"]] - 1
    return dict(sched, work_info_set=wis)


@pytest.mark.parametrize("what,match", [
    ("empty work_indptr", r"work_indptr must hold num_clusters \+ 1 >= 1 entries, got 0"),
    ("decreasing work_indptr", r"work_indptr must be non-decreasing, got work_indptr\[1\]=\d+ > work_indptr\[2\]=1"),
    ("huge partial_qo_loc", r"work \d+: partial_qo_loc=2147483647 puts its 1 partial rows outside \[0, 10\) "
                            r"\(5 split works x their most rows\)"),
    ("far partial_qo_loc", r"work \d+: partial_qo_loc=1000000 puts its 2 partial rows outside \[0, 10\)"),
    ("kv_end < kv_start", r"work 0: kv_end=-1 < kv_start=0"),
])
def test_split_reference_refuses_a_broken_schedule(what, match):
    """A fresh-user break test: an empty work_indptr reached an IndexError, a decreasing one a
    misleading reduce message, a partial_qo_loc of 2**31 - 1 asked the allocator for
    terabytes (10**6: a silent million-row buffer), and kv_end < kv_start was replayed as an
    empty range (a wrong answer, LSE +inf). Each is now a ValueError naming the field."""
    p = make_problem([1, 2], [20, 9], H=2, page_size=4, seed=4)
    sched = make_schedule(p, 2)
    ref.split_reference(**p, **sched, sm_scale=0.07)   # the schedule itself is fine
    with pytest.raises(ValueError, match=match):
        ref.split_reference(**p, **_edit_schedule(sched, what), sm_scale=0.07)


def test_split_reference_replays_a_layout_with_gaps():
    """AITER steps partial_qo_loc by the q tile size, so a short last tile leaves unused rows
    (a review found the first bound refused such schedules): a gap before batch 1's pieces
    still replays exactly."""
    p = make_problem([1, 2], [20, 9], H=2, page_size=4, seed=4)
    sched = make_schedule(p, 2)
    wis, pmap = sched["work_info_set"].clone(), sched["reduce_partial_map"].clone()
    for i in range(wis.shape[0]):
        if wis[i, WI["batch_idx"]] == 1 and wis[i, WI["partial_qo_loc"]] >= 0:
            wis[i, WI["partial_qo_loc"]] += 1
    pmap[3:] += 1   # batch 1's two pieces, after batch 0's three
    out, lse, p_out, _ = ref.split_reference(**p, **dict(sched, work_info_set=wis, reduce_partial_map=pmap),
                                             sm_scale=0.07)
    o_ref, l_ref = ref.mla_decode_ref(**p, sm_scale=0.07)
    assert_close(out, o_ref, 1e-12, "out")
    assert_close(lse, l_ref, 1e-12, "lse")
    assert p_out.shape[0] == 8 and torch.isnan(p_out[3]).all()   # the gap stays unwritten


# ------------------------------------------------------------------------------------------
# reduce_ref against one softmax over the concatenated pieces


def test_reduce_ref_vs_direct_softmax():
    g = torch.Generator().manual_seed(1)
    H, tiles = 3, [(2, 5), (1, 3), (3, 2), (1, 1)]  # (qlen, pieces)
    total_q = sum(t[0] for t in tiles)
    slots = []  # (tile, piece) in a shuffled partial layout
    for t, (qlen, n) in enumerate(tiles):
        slots += [(t, i) for i in range(n)]
    random.Random(0).shuffle(slots)
    loc_of, row = {}, 0
    for s in slots:
        loc_of[s] = row
        row += tiles[s[0]][0]
    N = row
    p_out = torch.full((N, H, DV), float("nan"), dtype=torch.float64)
    p_lse = torch.full((N, H), float("nan"), dtype=torch.float64)
    want_o = torch.zeros(total_q, H, DV, dtype=torch.float64)
    want_l = torch.zeros(total_q, H, dtype=torch.float64)
    rind, fmap, pmap, q0 = [0], [], [], 0
    for t, (qlen, n) in enumerate(tiles):
        for i in range(qlen):
            for h in range(H):
                K = 4 * n
                s = torch.randn(K, generator=g, dtype=torch.float64) * 4
                v = torch.randn(K, DV, generator=g, dtype=torch.float64)
                if t == 2 and i == 1:
                    s[:] = -math.inf            # a row no piece sees
                if t == 0 and h == 1:
                    s[4:8] = -math.inf          # one empty piece in a live row
                for j in range(n):
                    sj, vj = s[4 * j:4 * j + 4], v[4 * j:4 * j + 4]
                    r = loc_of[(t, j)] + i
                    if torch.isneginf(sj).all():
                        p_out[r, h], p_lse[r, h] = 0.0, -math.inf
                    else:
                        p_out[r, h] = torch.softmax(sj, 0) @ vj
                        p_lse[r, h] = torch.logsumexp(sj, 0)
                if torch.isneginf(s).all():
                    want_o[q0 + i, h], want_l[q0 + i, h] = 0.0, math.inf
                else:
                    want_o[q0 + i, h] = torch.softmax(s, 0) @ v
                    want_l[q0 + i, h] = torch.logsumexp(s, 0)
        fmap.append([q0, q0 + qlen])
        if n >= 2:
            pmap += [loc_of[(t, j)] for j in range(n)]
        elif n == 1:
            pmap += [loc_of[(t, 0)]]  # a 1-entry tile: must be skipped
        rind.append(len(pmap))
        q0 += qlen
    base_o = torch.full((total_q, H, DV), 7.0, dtype=torch.float64)
    base_l = torch.full((total_q, H), -7.0, dtype=torch.float64)
    i32 = dict(dtype=torch.int32)
    out, lse = ref.reduce_ref(p_out.view(N, 1, H, DV), p_lse.view(N, 1, H, 1),
                              torch.tensor(rind, **i32), torch.tensor(fmap, **i32),
                              torch.tensor(pmap, **i32), base_o, base_l)
    split_rows = slice(0, 2 + 1 + 3)  # tiles 0..2
    assert_close(out[split_rows], want_o[split_rows], 1e-13, "out")
    assert_close(lse[split_rows], want_l[split_rows], 1e-13, "lse")
    assert torch.isposinf(lse[4]).all() and (out[4] == 0).all()   # tile 2, q position 1
    assert (out[6:] == 7.0).all() and (lse[6:] == -7.0).all()     # 1-entry tile untouched
    assert (base_o == 7.0).all()                                  # bases are not mutated


def test_reduce_ref_rejects_out_of_range_partial_rows():
    i32 = dict(dtype=torch.int32)
    with pytest.raises(ValueError, match="reduce_partial_map"):
        ref.reduce_ref(torch.zeros(4, 1, DV), torch.zeros(4, 1), torch.tensor([0, 2], **i32),
                       torch.tensor([[0, 1]], **i32), torch.tensor([0, 9], **i32),
                       torch.zeros(1, 1, DV))


@pytest.mark.parametrize("bad,needle", [
    # a decreasing reduce_indptr was skipped (its rows came back NaN), not refused
    (dict(ind=[2, 0]), "reduce_indptr must be non-decreasing, got reduce_indptr[0]=2 > reduce_indptr[1]=0"),
    (dict(fmap=[[1, 0]]), "q_end < q_start in reduce_final_map"),
    (dict(fmap=[0, 1]), "reduce_final_map must be 2-D, got shape (2,)"),
    # read as a flat list: tile 1 took row 0 again and row 1 kept its base (a break test)
    (dict(ind=[0, 2, 4], fmap=[[0, 1, 0], [1, 2, 0]], final=(2, 1, DV)),
     "reduce_final_map must be [tiles, 2] (q_start, q_end per tile), got (2, 3)"),
    # was a bare IndexError
    (dict(ind=[0, 2, 4], fmap=[[0, 1]], final=(2, 1, DV)),
     "reduce_final_map must have a row for each merging tile: reduce_indptr's tile 1 merges 2 "
     "entries, but reduce_final_map has rows 0..0 only"),
    (dict(ind=[[0, 2]]), "reduce_indptr must be 1-D, got shape (1, 2)"),
    # merged nothing and returned NaN LSEs, where mla_reduce_v1 refuses it (a break test)
    (dict(ind=[]), "reduce_indptr must have tiles + 1 >= 1 entries, got 0"),
    # was torch's "The expanded size of the tensor (17) must match ..."
    (dict(final=(1, 17, DV)), f"final_output must be [total_q, 1, {DV}]"),
    (dict(final_lse=(1, 2)), "final_lse must be [1, 1]"),
])
def test_reduce_ref_refuses_malformed_maps_and_bases(bad, needle):
    i32 = dict(dtype=torch.int32)
    args = dict(ind=[0, 2], fmap=[[0, 1]], final=(1, 1, DV), final_lse=None)
    args.update(bad)
    with pytest.raises(ValueError) as ei:
        ref.reduce_ref(torch.zeros(4, 1, DV), torch.zeros(4, 1), torch.tensor(args["ind"], **i32),
                       torch.tensor(args["fmap"], **i32), torch.tensor([0, 1, 2, 3], **i32),
                       torch.zeros(*args["final"]),
                       None if args["final_lse"] is None else torch.zeros(*args["final_lse"]))
    assert needle in str(ei.value)


def test_reduce_ref_names_a_bad_partial_output_and_refuses_integer_data():
    """A 511-wide partial_output was reported as "final_output must be [total_q, 2, 511]", and
    integer data was merged although the docstring says float (a break test)."""
    i32 = dict(dtype=torch.int32)
    maps = (torch.tensor([0, 3], **i32), torch.tensor([[0, 1]], **i32), torch.tensor([0, 1, 2], **i32))
    po, pl, fo = torch.randn(3, 2, DV), torch.randn(3, 2), torch.zeros(1, 2, DV)
    with pytest.raises(ValueError, match=r"partial_output must be \[N, H, 512\] or \[N, 1, H, 512\], got \(3, 2, 511\)"):
        ref.reduce_ref(po[..., :511], pl, *maps, fo)
    # a 4-D partial_output whose second dim is not 1 was read as [N * dim1, H, 512] (a break test)
    with pytest.raises(ValueError, match=r"partial_output must be .* got \(3, 2, 2, 512\)"):
        ref.reduce_ref(torch.randn(3, 2, 2, DV), torch.randn(6, 2), *maps, fo)
    for args, name in (((po.int(), pl, *maps, fo), "partial_output"), ((po, pl, *maps, fo.long()), "final_output"),
                       ((po, pl.int(), *maps, fo), "partial_lse")):
        with pytest.raises(TypeError, match=f"{name} must be a float tensor, got torch.int"):
            ref.reduce_ref(*args)
    out, _ = ref.reduce_ref(po, pl, *maps, fo)   # the well-formed call still merges
    assert torch.isfinite(out).all()


def test_meta_tensors_are_named():
    """A tensor on the 'meta' device (no values) reached torch's own "Cannot copy out of meta
    tensor" / "Tensor.item() cannot be called on meta tensors", naming no argument (a break
    test); kv_indices already said so."""
    p = make_problem([1, 2], [5, 9], H=2, page_size=4, seed=3)
    for name in ("q", "kv_buffer"):
        with pytest.raises(ValueError, match=f"^{name} must hold values .* got a meta tensor"):
            ref.mla_decode_ref(**dict(p, **{name: p[name].to("meta")}), sm_scale=0.1)
    with pytest.raises(ValueError, match="^q_scale must hold values"):
        ref.mla_decode_ref(**p, sm_scale=0.1, q_scale=torch.tensor(1.0, device="meta"))
    with pytest.raises(ValueError, match="^relative_l2: b must hold values"):
        ref.relative_l2(torch.ones(3), torch.ones(3, device="meta"))
    i32 = dict(dtype=torch.int32)
    with pytest.raises(ValueError, match="^final_output must hold values"):
        ref.reduce_ref(torch.zeros(3, 2, DV), torch.zeros(3, 2), torch.tensor([0, 3], **i32),
                       torch.tensor([[0, 1]], **i32), torch.tensor([0, 1, 2], **i32),
                       torch.zeros(1, 2, DV, device="meta"))


def test_decode_ref_index_tensors_must_be_1d():
    p = make_problem([1, 2], [5, 9], H=2, page_size=4, seed=3)
    for name in ("qo_indptr", "kv_indptr", "kv_last_page_lens"):
        with pytest.raises(ValueError, match=rf"{name} must be 1-D, got shape \(1, "):
            ref.mla_decode_ref(**dict(p, **{name: p[name][None]}), sm_scale=0.1)
    with pytest.raises(ValueError, match=r"kv_indices must be a 1-D CPU or CUDA tensor, got shape \("):
        ref.mla_decode_ref(**dict(p, kv_indices=p["kv_indices"][:, None]), sm_scale=0.1)


# ------------------------------------------------------------------------------------------
# relative_l2


def test_relative_l2():
    b = torch.tensor([3.0, 4.0, math.inf], dtype=torch.float64)
    assert ref.relative_l2(b, b) == 0.0
    assert ref.relative_l2(torch.tensor([3.0, 4.0 + 5e-3, math.inf], dtype=torch.float64), b) == pytest.approx(1e-3)
    assert ref.relative_l2(torch.tensor([3.0, float("nan"), math.inf]), b) == math.inf
    assert ref.relative_l2(torch.tensor([3.0, 4.0, 1.0]), b) == math.inf
    assert ref.relative_l2(torch.zeros(2), torch.zeros(2)) == 0.0
    assert ref.relative_l2(torch.ones(2), torch.zeros(2)) == math.inf
    with pytest.raises(ValueError):
        ref.relative_l2(torch.zeros(2), torch.zeros(3))
    # the norms overflowed (nan, inf) or underflowed (0.0 for unequal inputs): a break test
    f64 = lambda *v: torch.tensor(v, dtype=torch.float64)   # noqa: E731
    assert ref.relative_l2(f64(1e300, 0.0), f64(2e300, 0.0)) == pytest.approx(0.5)
    assert ref.relative_l2(f64(1e300, 0.0), f64(-1e300, 0.0)) == pytest.approx(2.0)
    assert ref.relative_l2(f64(1e-300, 0.0), f64(2e-300, 0.0)) == pytest.approx(0.5)
    assert ref.relative_l2(f64(1e308), f64(-1e308)) == pytest.approx(2.0)
    assert ref.relative_l2(f64(1e308, math.inf), f64(-1e308, math.inf)) == pytest.approx(2.0)
    # complex inputs lost their imaginary part with a warning, lists failed on .detach()
    with pytest.raises(TypeError, match=r"relative_l2: a must be a real torch.Tensor, got a complex tensor"):
        ref.relative_l2(torch.zeros(2, dtype=torch.complex64), torch.zeros(2))
    with pytest.raises(TypeError, match=r"relative_l2: b must be a real torch.Tensor, got list"):
        ref.relative_l2(torch.zeros(2), [0.0, 0.0])


@pytest.mark.parametrize("name", ["q_scale", "kv_scale"])
@pytest.mark.parametrize("bad,exc,match", [
    ("2", TypeError, "must be a float"),            # was read as 2.0
    ([2.0], TypeError, "must be a float"),          # was a bare float() error
    (True, TypeError, "must be a float"),
    (float("nan"), ValueError, "must be a finite number"),   # made every output NaN
    (0.0, ValueError, "finite scale > 0, got 0.0"),
    (-1, ValueError, "finite scale > 0, got -1.0"),
    (torch.tensor([float("inf")]), ValueError, "finite scale > 0, got inf"),
    (torch.tensor([1.0, 2.0]), ValueError, "must hold exactly 1 element"),
])
def test_bad_dequant_scale_is_a_clear_error(name, bad, exc, match):
    p = make_problem([1], [9], H=2, page_size=4, seed=5)
    with pytest.raises(exc, match=f"{name} {match}" if match.startswith("must") else f"{name} must be a {match}"):
        ref.mla_decode_ref(**p, sm_scale=0.1, **{name: bad})


@pytest.mark.parametrize("bad", ["no", 1, 0, None, torch.tensor(True)])
def test_fp8_p_must_be_a_bool(bad):
    """fp8_p='no' read as truthy rounded P to fp8 (a fresh-user trial): TypeError naming it."""
    import numpy as np

    p = make_problem([1], [9], H=2, page_size=4, seed=5)
    with pytest.raises(TypeError, match=f"fp8_p must be a bool, got {type(bad).__name__}"):
        ref.mla_decode_ref(**p, sm_scale=0.1, fp8_p=bad)
    sched = make_schedule(p, 2)
    with pytest.raises(TypeError, match="fp8_p must be a bool"):
        ref.split_reference(**p, **sched, sm_scale=0.1, fp8_p=bad)
    o, lse = ref.mla_decode_ref(**p, sm_scale=0.1, fp8_p=np.True_)   # NumPy bools pass
    o8, lse8 = ref.mla_decode_ref(**p, sm_scale=0.1, fp8_p=True)
    assert torch.equal(o, o8) and torch.equal(lse, lse8)


@pytest.mark.parametrize("bad,exc", [(None, TypeError), (float("nan"), ValueError),
                                     (float("inf"), ValueError), ("0.1", TypeError)])
def test_bad_sm_scale_is_a_clear_error(bad, exc):
    with pytest.raises(exc, match="sm_scale must be"):
        ref.mla_decode_ref(None, None, None, None, None, None, sm_scale=bad)
