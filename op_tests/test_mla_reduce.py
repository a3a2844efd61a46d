"""mla_reduce_v1 (templates/mla_reduce.cu.j2) against the float64 reduce_ref.

GPU tests: random partials with 2 .. 1000 splits per tile (past AITER's CU-count LDS cap),
-inf pieces, rows no piece sees, unsplit and padding tiles left untouched (poisoned and
checked bit for bit), strided / misaligned final_output and final_lse views, AITER's 4-D
partial shapes, no final map, a grid smaller than the tile length, a corrupt schedule, a side
stream, CUDA graph capture and torch.compile. CPU tests: the build (no spills) and the
argument checks that need no GPU.
"""
from __future__ import annotations

import math
import random
import shutil
import subprocess

import pytest
import torch

import aiter_mla
from aiter_mla import reference as ref
from aiter_mla.jit import get_module
from aiter_mla.ops.reduce import mla_reduce_v1

DV = 512
POISON_OUT = 12345.0   # bf16-exact marker for rows the kernel must not touch
POISON_LSE = -1234.5

_no_gpu = not torch.cuda.is_available()


def gpu(f):
    f = pytest.mark.skipif(_no_gpu, reason="needs a CUDA GPU (sm_90a); none is visible")(f)
    return pytest.mark.gpu(f)


# ------------------------------------------------------------------------------------------
# schedule builder


def build(tile_specs, H, *, seed=0, pad_tiles=2, neg_inf_frac=0.1, empty_rows=(),
          shuffle=True, nan_in_empty=True, device="cuda"):
    """Random partials for reduce tiles given as (qlen, splits) pairs.

    splits 0 / 1 make unsplit tiles (no / one reduce entry). Partial slots are laid out in a
    shuffled order (AITER's are consecutive; any order must work). `empty_rows` lists
    (tile, token offset, heads) whose every piece has lse -inf. `pad_tiles` trailing tiles
    repeat the last indptr value (AITER's padding) and get garbage final-map rows. With
    `nan_in_empty`, partial rows with lse -inf hold NaN in the kernel input (garbage the merge
    must not read) and 0 in the reference input (the decode kernel's contract).
    """
    g = torch.Generator(device=device).manual_seed(seed)
    slots = [(t, i) for t, (_, n) in enumerate(tile_specs) for i in range(n)]
    if shuffle:
        random.Random(seed).shuffle(slots)
    loc, N = {}, 0
    for s in slots:
        loc[s] = N
        N += tile_specs[s[0]][0]
    N = max(N, 1)
    p_out = torch.randn(N, H, DV, generator=g, device=device)
    p_lse = torch.randn(N, H, generator=g, device=device) * 3
    p_lse[torch.rand(N, H, generator=g, device=device) < neg_inf_frac] = -math.inf
    rind, fmap, pmap, q0 = [0], [], [], 0
    for t, (qlen, n) in enumerate(tile_specs):
        pmap += [loc[(t, i)] for i in range(n)]
        rind.append(len(pmap))
        fmap.append([q0, q0 + qlen])
        q0 += qlen
    total_q = q0
    for t, off, heads in empty_rows:
        for i in range(tile_specs[t][1]):
            p_lse[loc[(t, i)] + off, heads] = -math.inf
    rind += [rind[-1]] * pad_tiles
    fmap += [[0, total_q]] * pad_tiles  # would clobber everything if a padding tile ran
    p_out_ref = p_out.clone()
    p_out_ref[torch.isneginf(p_lse)] = 0.0
    if nan_in_empty:
        p_out[torch.isneginf(p_lse)] = float("nan")
    i32 = dict(dtype=torch.int32, device=device)
    return dict(
        partial_output=p_out, partial_lse=p_lse, partial_output_ref=p_out_ref,
        reduce_indptr=torch.tensor(rind, **i32),
        reduce_final_map=torch.tensor(fmap, **i32).view(-1, 2),
        reduce_partial_map=torch.tensor(pmap or [0], **i32),
        total_q=total_q, H=H, specs=tile_specs)


def split_rows(b):
    """Boolean [total_q] mask of the rows of tiles with >= 2 entries."""
    m = torch.zeros(b["total_q"], dtype=torch.bool)
    q0 = 0
    for qlen, n in b["specs"]:
        if n >= 2:
            m[q0:q0 + qlen] = True
        q0 += qlen
    return m


def poisoned(total_q, H, device="cuda"):
    out = torch.full((total_q, H, DV), POISON_OUT, dtype=torch.bfloat16, device=device)
    lse = torch.full((total_q, H), POISON_LSE, dtype=torch.float32, device=device)
    return out, lse


def check(b, out, lse, reduce_final_map="from_b", what=""):
    """Kernel result (out, lse) vs reduce_ref on the poisoned bases."""
    fmap = b["reduce_final_map"] if reduce_final_map == "from_b" else reduce_final_map
    base_o, base_l = poisoned(b["total_q"], b["H"], out.device)
    want_o, want_l = ref.reduce_ref(b["partial_output_ref"], b["partial_lse"], b["reduce_indptr"],
                                    fmap, b["reduce_partial_map"], base_o, base_l)
    rows = split_rows(b).to(out.device)
    got_o = out.double()
    # untouched rows: bit for bit
    assert (out[~rows].view(torch.int16) == base_o[~rows].view(torch.int16)).all(), \
        f"{what}: rows of unsplit/padding tiles were written"
    if lse is not None:
        assert (lse[~rows] == POISON_LSE).all(), f"{what}: final_lse of unsplit rows written"
    # merged rows: bf16 rounding (half an ulp = 2^-8 relative) plus fp32 accumulation
    go, wo = got_o[rows], want_o[rows]
    assert torch.isfinite(go).all(), f"{what}: non-finite merged output"
    bad = (go - wo).abs() > (2.0 ** -8 * 1.01) * wo.abs() + 1e-4
    assert not bad.any(), (f"{what}: {int(bad.sum())} merged values off, e.g. got "
                           f"{go[bad][:4].tolist()} want {wo[bad][:4].tolist()}")
    assert ref.relative_l2(go, wo) < 3e-3
    if lse is not None:
        gl, wl = lse[rows].double(), want_l[rows]
        assert (torch.isposinf(gl) == torch.isposinf(wl)).all(), f"{what}: +inf LSE rows differ"
        fin = torch.isfinite(wl)
        assert torch.isfinite(gl[fin]).all()
        assert torch.allclose(gl[fin], wl[fin], rtol=1e-5, atol=1e-4), \
            f"{what}: LSE max err {(gl[fin] - wl[fin]).abs().max().item():.3e}"
    return want_o, want_l


def run(b, out, lse, max_seqlen_q=None, final_map="from_b", po=None, pl=None):
    fmap = b["reduce_final_map"] if final_map == "from_b" else final_map
    mla_reduce_v1(b["partial_output"] if po is None else po,
                  b["partial_lse"] if pl is None else pl,
                  b["reduce_indptr"], fmap, b["reduce_partial_map"],
                  max_seqlen_q or max(q for q, _ in b["specs"]), out, lse)


# tiles (qlen, splits): many splits (300, 600, 1000 > 2 x 264), unsplit (1 entry, 0 entries)
MIXED = [(1, 2), (2, 3), (1, 7), (4, 64), (1, 1), (2, 0), (3, 300), (1, 600), (2, 5), (1, 1000)]
# Padding tiles move the estimated splits per tile (entries / tiles) across the kernel's bands,
# so each of its 1 / 2 / 4 / 8 warps-per-row paths runs.
PAD_FOR_BAND = {"1warp": 400, "2warps": 200, "4warps": 100, "8warps": 2}


# ------------------------------------------------------------------------------------------
# GPU: values


@gpu
@pytest.mark.parametrize("band", list(PAD_FOR_BAND))
@pytest.mark.parametrize("H", [16, 128, 5])
def test_reduce_matches_reference(H, band):
    n_entries = sum(n for _, n in MIXED)
    pad = PAD_FOR_BAND[band]
    est = math.ceil(n_entries / (len(MIXED) + pad))
    assert {"1warp": est <= 8, "2warps": 8 < est <= 16, "4warps": 16 < est <= 32,
            "8warps": est > 32}[band]
    b = build(MIXED, H, seed=H, pad_tiles=pad,
              empty_rows=[(1, 1, [0, H - 1]), (3, 0, list(range(H))), (7, 0, [H // 2])])
    out, lse = poisoned(b["total_q"], H)
    run(b, out, lse)
    torch.cuda.synchronize()
    want_o, want_l = check(b, out, lse, what=f"H={H} {band}")
    assert torch.isposinf(want_l).any(), "the case must contain rows no piece sees"
    empty = torch.isposinf(want_l)
    assert (out[empty] == 0).all() and torch.isposinf(lse[empty]).all()


@gpu
def test_reduce_without_final_lse_and_4d_partials():
    b = build(MIXED, 16, seed=3)
    N, H = b["partial_output"].shape[:2]
    out, _ = poisoned(b["total_q"], H)
    run(b, out, None, po=b["partial_output"].view(N, 1, H, DV),
        pl=b["partial_lse"].view(N, 1, H, 1))
    torch.cuda.synchronize()
    check(b, out, None, what="4-D partials, no final_lse")


def _strided_out(layout, T, H, dev="cuda"):
    if layout == "contiguous":
        return torch.empty(T, H, DV, dtype=torch.bfloat16, device=dev)
    if layout == "padded_rows":      # stride_h 1024: a slice of a wider buffer
        return torch.empty(T, H, 2 * DV, dtype=torch.bfloat16, device=dev)[:, :, :DV]
    if layout == "head_major":       # [H, T, 512] viewed as [T, H, 512]
        return torch.empty(H, T, DV, dtype=torch.bfloat16, device=dev).permute(1, 0, 2)
    if layout == "stride_d2":        # every other element: no vector stores
        return torch.empty(T, H, DV, 2, dtype=torch.bfloat16, device=dev)[..., 0]
    if layout == "misaligned":       # contiguous but 2-byte aligned base
        return torch.empty(T * H * DV + 1, dtype=torch.bfloat16, device=dev)[1:].view(T, H, DV)
    raise AssertionError(layout)


@gpu
@pytest.mark.parametrize("layout", ["contiguous", "padded_rows", "head_major", "stride_d2",
                                    "misaligned"])
def test_reduce_strided_final_output(layout):
    b = build(MIXED[:4] + MIXED[8:9], 8, seed=5)
    T, H = b["total_q"], 8
    out = _strided_out(layout, T, H)
    out.fill_(POISON_OUT)
    lse = torch.empty(H, T, device="cuda").t()  # a transposed final_lse too
    lse.fill_(POISON_LSE)
    run(b, out, lse)
    torch.cuda.synchronize()
    check(b, out, lse, what=layout)


@gpu
def test_reduce_no_final_map_uniform_qlen():
    # AITER's derivation: q length = partial_map[start+1] - partial_map[start], tile t covers
    # [t*len, (t+1)*len); needs uniform qlen and consecutive slots per tile.
    specs = [(2, 3), (2, 1), (2, 0), (2, 40), (2, 2)]
    b = build(specs, 16, seed=8, shuffle=False, pad_tiles=3)
    out, lse = poisoned(b["total_q"], 16)
    run(b, out, lse, final_map=None)
    torch.cuda.synchronize()
    check(b, out, lse, reduce_final_map=None, what="no final map")


@gpu
def test_reduce_grid_smaller_than_tile():
    # max_seqlen_q sizes the grid only: a smaller value must still cover every token
    b = build([(4, 3), (3, 70), (1, 2)], 16, seed=9)
    out, lse = poisoned(b["total_q"], 16)
    run(b, out, lse, max_seqlen_q=1)
    torch.cuda.synchronize()
    check(b, out, lse, what="max_seqlen_q=1")


# (a reason, the cap, tile specs (qlen, splits), heads)
CAPPED = [
    # 2 blocks, ~350 items each in two chunks of kThreads (256): split tiles spread over both,
    # the last ones in the second; one warp a row
    ("one warp a row", 2, [(1, 3) if (t % 37 == 5 or t >= 690) else (1, t % 2) for t in range(700)], 8),
    # 1 block for 296 items, 2 q tokens (grid_y 2), ~9.6 pieces a tile: 2 warps share a row, so
    # the merge's own barriers run inside the chunk loop
    ("warps share a row", 2, [(2, 1 if t % 9 == 4 else 11) for t in range(72)], 16),
]


@gpu
@pytest.mark.parametrize("what,cap,specs,H", CAPPED, ids=[c[0] for c in CAPPED])
def test_reduce_few_blocks_stride_over_many_items(monkeypatch, what, cap, specs, H):
    # The grid is at most one wave; each block strides over (tile, head group) items and reads
    # their split counts kThreads (256) at a time. A build capped at `cap` blocks makes a few
    # blocks walk many items in several chunks.
    from aiter_mla.jit import core

    monkeypatch.setenv("AITER_MLA_EXTRA_NVCC_FLAGS", f"-DAITER_MLA_REDUCE_MAX_BLOCKS={cap}")
    core.reset_state()
    try:
        b = build(specs, H, seed=12)
        out, lse = poisoned(b["total_q"], H)
        run(b, out, lse)
        torch.cuda.synchronize()
        check(b, out, lse, what=f"{cap} blocks striding, {what}")
    finally:
        monkeypatch.delenv("AITER_MLA_EXTRA_NVCC_FLAGS")
        core.reset_state()


@gpu
def test_reduce_on_side_stream():
    b = build(MIXED, 16, seed=10)
    out, lse = poisoned(b["total_q"], 16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run(b, out, lse)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    check(b, out, lse, what="side stream")


@gpu
def test_reduce_corrupt_schedule_gives_nan_not_a_fault():
    b = build([(1, 3), (2, 4), (1, 2)], 16, seed=11, neg_inf_frac=0.0, nan_in_empty=False)
    pm = b["reduce_partial_map"].clone()
    pm[3] = 1 << 28                      # tile 1's first piece points far outside the buffer
    out, lse = poisoned(b["total_q"], 16)
    mla_reduce_v1(b["partial_output"], b["partial_lse"], b["reduce_indptr"],
                  b["reduce_final_map"], pm, 2, out, lse)
    torch.cuda.synchronize()             # an illegal access would raise here
    assert torch.isnan(out[1:3].float()).all() and torch.isnan(lse[1:3]).all()
    assert torch.isfinite(out[[0, 3]].float()).all()
    # reduce_indptr running past the end of reduce_partial_map: that tile's rows NaN
    ind = b["reduce_indptr"].clone()
    ind[3:] = b["reduce_partial_map"].numel() + 5
    out, lse = poisoned(b["total_q"], 16)
    mla_reduce_v1(b["partial_output"], b["partial_lse"], ind, b["reduce_final_map"],
                  b["reduce_partial_map"], 2, out, lse)
    torch.cuda.synchronize()
    assert torch.isnan(out[3].float()).all() and torch.isnan(lse[3]).all()
    assert torch.isfinite(out[:3].float()).all()


# ------------------------------------------------------------------------------------------
# GPU: graphs and torch.compile


@gpu
def test_reduce_cuda_graph_capture_and_replay():
    b = build(MIXED, 16, seed=12)
    out, lse = poisoned(b["total_q"], 16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run(b, out, lse)                 # warm-up: builds/loads the module outside capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run(b, out, lse)
    # new values in the same buffers, then replay
    b2 = build(MIXED, 16, seed=13)
    for k in ("partial_output", "partial_lse", "partial_output_ref"):
        b[k].copy_(b2[k])
    out.fill_(POISON_OUT)
    lse.fill_(POISON_LSE)
    graph.replay()
    torch.cuda.synchronize()
    check(b, out, lse, what="graph replay")


@gpu
def test_reduce_under_torch_compile():
    b = build(MIXED, 16, seed=14)
    fmax = max(q for q, _ in b["specs"])

    def f(po, pl, ind, fm, pm, out, lse):
        mla_reduce_v1(po, pl, ind, fm, pm, fmax, out, lse)
        return out.float() * 2.0, lse + 1.0

    compiled = torch.compile(f, fullgraph=True)
    args = (b["partial_output"], b["partial_lse"], b["reduce_indptr"], b["reduce_final_map"],
            b["reduce_partial_map"])
    out, lse = poisoned(b["total_q"], 16)
    got2, gotl = compiled(*args, out, lse)
    torch.cuda.synchronize()
    check(b, out, lse, what="torch.compile (mutated inputs)")
    assert torch.equal(got2, out.float() * 2.0) and torch.equal(gotl, lse + 1.0)


# ------------------------------------------------------------------------------------------
# argument checks


@gpu
@pytest.mark.parametrize("mutate, exc, match", [
    (lambda a: a.__setitem__("partial_output", a["partial_output"].bfloat16()), TypeError, "partial_output"),
    (lambda a: a.__setitem__("partial_output", a["partial_output"].transpose(0, 1).contiguous().transpose(0, 1)), ValueError, "partial_output must be contiguous"),
    (lambda a: a.__setitem__("partial_output", a["partial_output"][..., :256].contiguous()), ValueError, "partial_output"),
    (lambda a: a.__setitem__("partial_lse", a["partial_lse"][:-1]), ValueError, "partial_lse"),
    (lambda a: a.__setitem__("reduce_indptr", a["reduce_indptr"].long()), TypeError, "reduce_indptr"),
    (lambda a: a.__setitem__("reduce_indptr", a["reduce_indptr"].cpu()), ValueError, "reduce_indptr"),
    (lambda a: a.__setitem__("reduce_final_map", a["reduce_final_map"][:1]), ValueError, "reduce_final_map"),
    (lambda a: a.__setitem__("reduce_partial_map", a["reduce_partial_map"].float()), TypeError, "reduce_partial_map"),
    (lambda a: a.__setitem__("max_seqlen_q", 0), ValueError, "max_seqlen_q"),
    (lambda a: a.__setitem__("final_output", a["final_output"].half()), TypeError, "final_output"),
    (lambda a: a.__setitem__("final_output", a["final_output"][:, :4]), ValueError, "final_output"),
    (lambda a: a.__setitem__("final_lse", a["final_lse"][:, :4]), ValueError, "final_lse"),
])
def test_reduce_argument_checks(mutate, exc, match):
    b = build([(1, 3), (2, 2)], 8, seed=15)
    out, lse = poisoned(b["total_q"], 8)
    a = dict(partial_output=b["partial_output"], partial_lse=b["partial_lse"],
             reduce_indptr=b["reduce_indptr"], reduce_final_map=b["reduce_final_map"],
             reduce_partial_map=b["reduce_partial_map"], max_seqlen_q=2,
             final_output=out, final_lse=lse)
    mutate(a)
    with pytest.raises(exc, match=match):
        mla_reduce_v1(**a)


def test_reduce_rejects_cpu_tensors():
    b = build([(1, 3)], 4, device="cpu")
    out, lse = poisoned(b["total_q"], 4, device="cpu")
    with pytest.raises(ValueError, match="partial_output must be a CUDA tensor"):
        mla_reduce_v1(b["partial_output"], b["partial_lse"], b["reduce_indptr"],
                      b["reduce_final_map"], b["reduce_partial_map"], 1, out, lse)
    # another mistake is named before the device (a fresh-user trial on a CPU machine saw only
    # the device message)
    with pytest.raises(ValueError, match="final_lse"):
        mla_reduce_v1(b["partial_output"], b["partial_lse"], b["reduce_indptr"],
                      b["reduce_final_map"], b["reduce_partial_map"], 1, out, lse[:, :2])
    with pytest.raises((TypeError, ValueError), match="reduce_indptr"):
        mla_reduce_v1(b["partial_output"], b["partial_lse"], b["reduce_indptr"].long(),
                      b["reduce_final_map"], b["reduce_partial_map"], 1, out, lse)
    # max_seqlen_q: numpy ints pass to the device check; a float is a TypeError; a value past
    # int32 is named instead of wrapping in the launch field (a fresh-user audit)
    import numpy as np

    args = (b["partial_output"], b["partial_lse"], b["reduce_indptr"], b["reduce_final_map"],
            b["reduce_partial_map"])
    with pytest.raises(ValueError, match="partial_output must be a CUDA tensor"):
        mla_reduce_v1(*args, np.int64(1), out, lse)
    with pytest.raises(TypeError, match=r"max_seqlen_q must be an int, got 1.0 \(float\)"):
        mla_reduce_v1(*args, 1.0, out, lse)
    with pytest.raises(ValueError, match=r"max_seqlen_q must be an int in \[1, 2147483647\], got 2147483648"):
        mla_reduce_v1(*args, 2**31, out, lse)


def test_public_names():
    assert aiter_mla.mla_reduce_v1 is mla_reduce_v1
    assert aiter_mla.reference.reduce_ref is ref.reduce_ref
    assert hasattr(torch.ops.aiter_mla, "mla_reduce_v1")


# ------------------------------------------------------------------------------------------
# build (no GPU needed)


def test_reduce_module_builds_without_spills(private_cache, cuobjdump):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    mod = get_module("mla_reduce", arch="sm_90a", out_dtype="bf16")
    tool = cuobjdump
    lib = getattr(mod, "lib_path", None)
    if lib is None:
        pytest.skip("the loaded module does not expose lib_path")
    res = subprocess.run([tool, "-res-usage", str(lib)], capture_output=True,
                         text=True, check=True).stdout
    lines = [ln for ln in res.splitlines() if "REG:" in ln]
    assert lines, res
    for ln in lines:
        assert "LOCAL:0" in ln and "STACK:0" in ln, f"register spills: {ln}"


def test_reduce_module_compiles_for_gfx942(private_cache):
    """The same template, 64-lane wavefronts, through the clang-19 compile-only check."""
    from aiter_mla.jit import build_variant
    from aiter_mla.jit.toolchain import ToolchainError
    try:
        res = build_variant("mla_reduce", arch="gfx942", out_dtype="bf16")
    except ToolchainError as e:
        pytest.skip(f"no gfx942 toolchain: {e}")
    assert res.entry.artifact.exists() and res.entry.artifact.stat().st_size > 0
