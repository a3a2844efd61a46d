"""The AMD decode kernel's logic, without AMD hardware: the rendered gfx942 and gfx950 kernel
text of templates/mla_decode_amd.cu.j2, unmodified, runs on the CPU through
mla_decode_amd_host_emu.cpp (one thread per lane; MFMA, fp8 pack, ds_bpermute and the barrier
emulated), against the float64 reference on the dequantized inputs (e4m3fnuz for gfx942, e4m3fn
for gfx950; aiter_mla.reference). What the emulation cannot
show is in docs/DESIGN.md §10.3.

Checked: one emulated MFMA against a plain matrix product under the ISA's lane layouts; the
e4m3fnuz / e4m3fn rounding against torch's conversion; small decodes with both masks, page 1 and
64, split works (partial rows and LSE as the reduce reads them), an empty row; unused KV slots
hold NaN. A mutation (lanes 0 and 1 of the MFMA's A layout swapped) must make them fail. Bad
index values (a page id, the batch layout, a work record) land in the error record as on sm_90a
and are never read through.
"""
from __future__ import annotations

import ctypes
import hashlib
import math
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from aiter_mla.jit.config import load_config, templates_dir
from aiter_mla.jit.render import render
from aiter_mla.ops import metadata as md
from aiter_mla.ops.decode import SIGNATURE
from aiter_mla.ops.metadata_reference import reference_schedule, to_buffers
from aiter_mla.ops.errors import _MESSAGES
from aiter_mla.reference import reduce_ref, relative_l2, split_reference
from aiter_mla.work_info import DEVICE_ERRORS, ERROR_SLOT_WORDS, ERROR_SLOTS, WI

HARNESS = Path(__file__).with_name("mla_decode_amd_host_emu.cpp")
FNUZ = torch.float8_e4m3fnuz
#: LSE bound (relative L2 against float64), docs/DESIGN.md §5.12; the output's is per case.
LSE_TOL = 2e-3


class Emulator:
    """The emulator library built against one rendered variant."""

    def __init__(self, lib: Path):
        self.lib = ctypes.CDLL(str(lib))
        self.lib.emu_decode.restype = ctypes.c_int
        P, I64, I = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
        self.lib.emu_decode.argtypes = [P, P, P, P, P, P, I]
        self.lib.emu_decode_args_bytes.restype = ctypes.c_longlong
        # the op's DecodeArgs and the kernel text's must agree, as the op's loader checks
        assert self.lib.emu_decode_args_bytes() == ctypes.sizeof(SIGNATURE.Args)
        self.lib.emu_mfma.argtypes = [P, P, P, P, I, I]
        self.lib.emu_mfma.restype = None
        self.lib.emu_float_to_fp8.argtypes = [ctypes.c_float, I]
        self.lib.emu_float_to_fp8.restype = I
        self.lib.emu_fp8_to_float.argtypes = [I, I]
        self.lib.emu_fp8_to_float.restype = ctypes.c_float


_built: dict[tuple, Emulator] = {}


def emulator_for(variant: dict, tmp: Path) -> Emulator:
    """Render ``variant`` of mla_decode and build the emulator around it (once per variant)."""
    key = tuple(sorted(variant.items()))
    if key not in _built:
        cxx = shutil.which("g++") or shutil.which("c++")
        if cxx is None:
            pytest.skip("no host C++ compiler for the kernel emulator")
        src = render(load_config().modules["mla_decode"], dict(variant), templates_dir()).text
        digest = hashlib.sha256(src.encode() + HARNESS.read_bytes()).hexdigest()[:12]
        cu = tmp / f"mla_decode_{digest}.cu"
        cu.write_text(src)
        lib = tmp / f"emu_{digest}.so"
        cmd = [cxx, "-std=c++17", "-O1", "-pthread", "-shared", "-fPIC", "-Wall", "-Wno-unknown-pragmas",
               f"-I{templates_dir()}", f'-DAMD_RENDERED="{cu}"', str(HARNESS), "-o", str(lib)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-3000:]
        _built[key] = Emulator(lib)
    return _built[key]


def gfx942(page_size: int, mask: str) -> dict:
    return dict(arch="gfx942", block_m=128, page_size=page_size, block_n=32, mask=mask, q_dtype="fp8_fnuz",
                kv_dtype="fp8_fnuz", mainloop="mfma")


def gfx950(page_size: int, mask: str, block_m: int) -> dict:
    """gfx950's variant: block_n 64, OCP e4m3fn, m16x8 (128) or m16x4 (64 rows)."""
    return dict(arch="gfx950", block_m=block_m, page_size=page_size, block_n=64, mask=mask, q_dtype="fp8",
                kv_dtype="fp8", mainloop="mfma")


#: The torch dtype and the NaN code of each target's fp8 encoding.
ENCODING = {"gfx942": (FNUZ, 0x80), "gfx950": (torch.float8_e4m3fn, 0x7F)}


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("amd_emu")


# ---------------------------------------------------------------------------------------------
# the primitives


def test_fp8_rounding_matches_torch(tmp):
    """The emulated v_cvt_pk_fp8_f32 (round to nearest even, NaN past the largest finite value)
    against torch's conversion, both encodings, on values around every code and beyond."""
    emu = emulator_for(gfx942(64, "none"), tmp)
    gen = torch.Generator().manual_seed(7)
    grid = torch.arange(256, dtype=torch.uint8)
    for dtype, is_fnuz in ((FNUZ, 1), (torch.float8_e4m3fn, 0)):
        codes = grid.view(dtype).float()
        finite = codes[torch.isfinite(codes)]
        for v in range(256):   # decode: every code
            want = grid[v:v + 1].view(dtype).float().item()
            got = emu.lib.emu_fp8_to_float(v, is_fnuz)
            assert (math.isnan(want) and math.isnan(got)) or got == want, (dtype, v, got, want)
        mids = (finite.sort().values[:-1] + finite.sort().values[1:]) / 2   # ties: round to even
        xs = torch.cat([finite, mids, torch.randn(3000, generator=gen) * 60, torch.rand(500, generator=gen) * 1e-2,
                        torch.tensor([250.0, 247.9, 248.0, 300.0, 460.0, 2.0 ** -12])])
        # torch's overflow rule varies by version (the CPU build saturates e4m3fn, torch 2.11
        # makes NaN), so torch is the reference only within the encoding's range; the
        # emulator's own overflow rule (the kernel never meets it: it converts P in [0, 1]) is
        # asserted as documented in mla_decode_amd_host_emu.cpp
        top = finite.abs().max().item()
        xs = xs[xs.abs() <= top]
        want = xs.to(dtype).view(torch.uint8)
        got = torch.tensor([emu.lib.emu_float_to_fp8(float(x), is_fnuz) for x in xs], dtype=torch.uint8)
        bad = (got != want).nonzero().flatten()
        assert bad.numel() == 0, [(xs[i].item(), int(got[i]), int(want[i])) for i in bad[:8]]
        for x in (2 * top, 1e6, -1e6):
            code = emu.lib.emu_float_to_fp8(x, is_fnuz)
            expect = 0x80 if is_fnuz else (0x7E | (0x80 if x < 0 else 0))
            assert code == expect, (dtype, x, code, expect)


def _random_fp8(shape, gen, scale=1.0, dtype=FNUZ):
    return (torch.randn(shape, generator=gen) * scale).to(dtype)


@pytest.mark.parametrize("mutation", [0, 1])
def test_one_mfma_is_the_matrix_product(tmp, mutation):
    """D = A B + C for one emulated V_MFMA_F32_16X16X32_FP8_FP8, the operands placed in the lanes
    by the ISA layout; with lanes 0 and 1 of A swapped the product is wrong."""
    emu = emulator_for(gfx942(64, "none"), tmp)
    gen = torch.Generator().manual_seed(1)
    a, b = _random_fp8((16, 32), gen), _random_fp8((32, 16), gen)
    c = torch.randn(16, 16, generator=gen)
    d = torch.empty(16, 16)
    emu.lib.emu_mfma(a.view(torch.uint8).contiguous().data_ptr(), b.view(torch.uint8).contiguous().data_ptr(),
                     c.data_ptr(), d.data_ptr(), 1, mutation)
    want = a.double() @ b.double() + c.double()
    err = (d.double() - want).abs().max().item()
    if mutation == 0:
        assert err < 1e-4, err
    else:
        assert err > 1e-2, "swapping two lanes of the A layout went unseen"


# ---------------------------------------------------------------------------------------------
# decodes


def make_case(*, heads, qlen, kv_lens, page_size, seed, num_pages_spare=3, target="gfx942"):
    """q [total_q, H, 576] and a paged pool [pages, page_size, 1, 576] in ``target``'s fp8
    (e4m3fnuz on gfx942, e4m3fn on gfx950), its pages in a shuffled order; every slot no batch
    uses holds that encoding's NaN."""
    dtype, nan = ENCODING[target]
    gen = torch.Generator().manual_seed(seed)
    B = len(kv_lens)
    q = _random_fp8((B * qlen, heads, 576), gen, 0.5, dtype)
    pages_of = [-(-n // page_size) for n in kv_lens]
    num_pages = sum(pages_of) + num_pages_spare
    pool = torch.full((num_pages, page_size, 1, 576), nan, dtype=torch.uint8).view(dtype)
    order = torch.randperm(num_pages, generator=gen)
    kv_indices, kv_indptr, last = [], [0], []
    for b, n in enumerate(kv_lens):
        for i in range(pages_of[b]):
            page = int(order[len(kv_indices)])
            kv_indices.append(page)
            used = min(page_size, n - i * page_size)
            pool[page, :used] = _random_fp8((used, 1, 576), gen, 0.5, dtype)
        kv_indptr.append(len(kv_indices))
        last.append(n - (pages_of[b] - 1) * page_size if n else 0)
    t = lambda x: torch.tensor(x, dtype=torch.int32)  # noqa: E731
    return dict(q=q, kv=pool, qo_indptr=t([b * qlen for b in range(B + 1)]), kv_indptr=t(kv_indptr),
                kv_indices=t(kv_indices or [0]), kv_last_page_lens=t(last), heads=heads, qlen=qlen,
                page_size=page_size)


def schedule(case, clusters):
    """The scheduler's buffers for ``case`` (the Python reference of the metadata kernel)."""
    B = case["qo_indptr"].numel() - 1
    s = reference_schedule(case["qo_indptr"], case["kv_indptr"], case["kv_last_page_lens"], num_heads=case["heads"],
                           num_clusters=clusters, page_size=case["page_size"],
                           kv_granularity=md.default_kv_granularity(case["page_size"]), max_seqlen_qo=case["qlen"])
    bufs = [torch.zeros(shape, dtype=dt) for shape, dt in md._buffer_specs(B, clusters)]
    to_buffers(s, bufs)
    return bufs


def run_emulated(emu, case, bufs, *, clusters, grid_x, sm_scale, q_scale=1.0, kv_scale=1.0, mutation=0,
                 record=None):
    """The emulated decode's (out, final_lse, split_out, split_lse), float64. ``record``: None
    (the error record must stay clear), or an int64 tensor of ERROR_SLOTS x ERROR_SLOT_WORDS
    zeros that receives it."""
    _, work_indptr, work_info, _, _, partial_map = bufs
    H, qlen = case["heads"], case["qlen"]
    total_q = case["q"].shape[0]
    split_tokens = max(1, partial_map.numel() * qlen)
    out = torch.full((total_q, H, 512), 0x7FC0, dtype=torch.int16)           # bf16 NaN: unwritten
    final_lse = torch.full((total_q, H), float("nan"))
    split_out = torch.full((split_tokens, H, 512), float("nan"))
    split_lse = torch.full((split_tokens, H), float("nan"))
    qs, ks = torch.tensor([q_scale]), torch.tensor([kv_scale])
    claim = torch.zeros(ERROR_SLOTS, dtype=torch.int32)
    must_stay_clear = record is None
    if must_stay_clear:
        record = torch.zeros(ERROR_SLOTS * ERROR_SLOT_WORDS, dtype=torch.int64)
    kv = case["kv"]
    # the launch's fixed arguments packed as the decode op packs them (ops/decode.py)
    args = SIGNATURE.pack(
        kv=kv.data_ptr(), kv_rows=kv.shape[0] * kv.shape[1], num_pages=kv.shape[0],
        kv_indices=case["kv_indices"].data_ptr(), kv_indices_len=case["kv_indices"].numel(),
        kv_last_page_lens=case["kv_last_page_lens"].data_ptr(), qo_indptr=case["qo_indptr"].data_ptr(),
        kv_indptr=case["kv_indptr"].data_ptr(), work_indptr=work_indptr.data_ptr(),
        work_indptr_len=work_indptr.numel(), work_info=work_info.data_ptr(), num_works=work_info.shape[0],
        q_scale=qs.data_ptr(), kv_scale=ks.data_ptr(), q_rows=total_q * H, split_tokens=split_tokens,
        error_claim=claim.data_ptr(), error_record=record.data_ptr(), reduce_launch=None, reduce_args=None,
        arrivals=None, reduce_indptr=None, reduce_partial_map=None, reduce_indptr_len=0, partial_map_len=0,
        sm_scale=sm_scale, num_heads=H, num_clusters=clusters, grid_x=grid_x,
        num_batches=case["qo_indptr"].numel() - 1, total_q=total_q, max_seqlen_q=qlen, device=0)
    rc = emu.lib.emu_decode(ctypes.addressof(args), case["q"].data_ptr(), out.data_ptr(), final_lse.data_ptr(),
                            split_out.data_ptr(), split_lse.data_ptr(), mutation)
    assert rc == 0
    if must_stay_clear:   # valid inputs: nothing reported
        assert not record.any(), f"error record written for valid inputs: {record.tolist()}"
    return out.view(torch.bfloat16).double(), final_lse.double(), split_out.double(), split_lse.double()


def check_against_reference(case, bufs, got, *, sm_scale, q_scale=1.0, kv_scale=1.0):
    """Every row the schedule writes, against float64 on the dequantized inputs: split works'
    partial rows and LSE as the reduce reads them, and the final rows (unsplit works' own, split
    tiles' the reduce of the emulated partials gives). Returns (output error, LSE error, output
    bound, LSE bound): relative L2, with docs/DESIGN.md §5.12's fp8 bound for the output
    (max(3e-2, 1.25 x the error of the reference with fp8-rounded P)) and 2e-3 for the LSE."""
    out, final_lse, split_out, split_lse = got
    _, work_indptr, work_info, reduce_indptr, final_map, partial_map = bufs
    args = (case["q"], case["kv"], case["qo_indptr"], case["kv_indptr"], case["kv_indices"],
            case["kv_last_page_lens"], work_indptr, work_info, reduce_indptr, final_map, partial_map)
    scales = dict(sm_scale=sm_scale, q_scale=q_scale, kv_scale=kv_scale)
    ref_out, ref_lse, ref_pout, ref_plse = split_reference(*args, **scales)
    p8_out, _, p8_pout, _ = split_reference(*args, **scales, fp8_p=True)
    n = ref_pout.shape[0]
    merged, merged_lse = reduce_ref(split_out[:n], split_lse[:n], reduce_indptr, final_map, partial_map,
                                    out.clone(), final_lse.clone())
    out_err, lse_err = relative_l2(merged, ref_out), relative_l2(merged_lse, ref_lse)
    bound = max(3e-2, 1.25 * relative_l2(p8_out, ref_out))
    if n:   # the partial rows themselves
        out_err = max(out_err, relative_l2(split_out[:n], ref_pout))
        lse_err = max(lse_err, relative_l2(split_lse[:n], ref_plse))
        bound = max(bound, 1.25 * relative_l2(p8_pout, ref_pout))
    return out_err, lse_err, bound, LSE_TOL


CASES = [
    # (name, page_size, mask, heads, qlen, kv_lens, clusters)
    ("page64-none-split-empty", 64, "none", 128, 1, [150, 0, 70], 3),
    ("page1-causal-emptyrow", 1, "causal", 32, 4, [45, 9, 3], 2),   # kv 3 < qlen: q token 0 sees no key
    ("page64-causal-split", 64, "causal", 16, 8, [100, 64], 3),
    ("page1-none-padded", 1, "none", 64, 1, [33, 0, 17], 2),     # 64 rows on the 128-row tile
]


def _run_case(tmp, name, page_size, mask, heads, qlen, kv_lens, clusters, mutation=0, variant=None):
    variant = variant or gfx942(page_size, mask)
    emu = emulator_for(variant, tmp)
    case = make_case(heads=heads, qlen=qlen, kv_lens=kv_lens, page_size=page_size, seed=len(name),
                     target=variant["arch"])
    bufs = schedule(case, clusters)
    sm_scale, q_scale, kv_scale = 1.0 / math.sqrt(576), 1.25, 0.75
    got = run_emulated(emu, case, bufs, clusters=clusters, grid_x=max(1, clusters - 1), sm_scale=sm_scale,
                       q_scale=q_scale, kv_scale=kv_scale, mutation=mutation)
    return case, bufs, got, check_against_reference(case, bufs, got, sm_scale=sm_scale, q_scale=q_scale,
                                                    kv_scale=kv_scale)


@pytest.mark.parametrize("name,page_size,mask,heads,qlen,kv_lens,clusters", CASES, ids=[c[0] for c in CASES])
def test_emulated_decode_matches_float64(tmp, name, page_size, mask, heads, qlen, kv_lens, clusters):
    case, bufs, got, (out_err, lse_err, out_tol, lse_tol) = _run_case(tmp, name, page_size, mask, heads, qlen,
                                                                      kv_lens, clusters)
    assert out_err <= out_tol and lse_err <= lse_tol, (name, out_err, out_tol, lse_err)
    out, final_lse, split_out, _ = got
    work_info = bufs[2][:int(bufs[1][-1])]
    has_split = bool((work_info[:, 1] >= 0).any())
    assert has_split == ("split" in name), f"{name}: split works {has_split}"
    if name.endswith("emptyrow"):   # batch 2's q token 0 (kv 3, qlen 4): output 0, final LSE +inf
        row = 2 * qlen
        assert torch.equal(out[row], torch.zeros_like(out[row])) and torch.isposinf(final_lse[row]).all()
        assert torch.isfinite(final_lse[row + 1]).all()
    for b, n in enumerate(kv_lens):   # an empty batch: output 0, final LSE +inf
        if n == 0:
            rows = slice(b * qlen, (b + 1) * qlen)
            assert torch.equal(out[rows], torch.zeros_like(out[rows])) and torch.isposinf(final_lse[rows]).all()


#: gfx950 (MI355): block_n 64 (4 key groups and 2 PV steps a tile, against gfx942's 2 and 1),
#: e4m3fn, the m16x8 tile and AITER's experimental m16x4 (4 waves). Not run on hardware either.
GFX950_CASES = [
    # (name, block_m, page_size, mask, heads, qlen, kv_lens, clusters)
    ("gfx950-m16x4-page64-split", 64, 64, "none", 64, 1, [300, 0, 64], 4),      # 64 rows: m16x4's tile
    ("gfx950-m16x4-page1-causal", 64, 1, "causal", 16, 4, [97, 2, 40], 3),      # q token 0 of batch 1 sees no key
    ("gfx950-m16x8-page16-causal-split", 128, 16, "causal", 32, 4, [250, 33], 3),
]


@pytest.mark.parametrize("name,block_m,page_size,mask,heads,qlen,kv_lens,clusters", GFX950_CASES,
                         ids=[c[0] for c in GFX950_CASES])
def test_emulated_gfx950_decode_matches_float64(tmp, name, block_m, page_size, mask, heads, qlen, kv_lens,
                                               clusters):
    """The gfx950 variants' text (block_n 64, both tiles) run in the emulation with e4m3fn inputs,
    against float64 on the dequantized inputs, with the error record clear."""
    variant = gfx950(page_size, mask, block_m)
    case, bufs, got, (out_err, lse_err, out_tol, lse_tol) = _run_case(
        tmp, name, page_size, mask, heads, qlen, kv_lens, clusters, variant=variant)
    assert case["q"].dtype == torch.float8_e4m3fn
    assert out_err <= out_tol and lse_err <= lse_tol, (name, out_err, out_tol, lse_err)
    work_info = bufs[2][:int(bufs[1][-1])]
    assert bool((work_info[:, 1] >= 0).any()) == ("split" in name), name
    out, final_lse = got[0], got[1]
    for b, n in enumerate(kv_lens):
        if n < qlen:   # batch b's q token 0 sees no key (causal, or an empty batch): output 0, LSE +inf
            t = b * qlen
            assert torch.equal(out[t], torch.zeros_like(out[t])) and torch.isposinf(final_lse[t]).all(), (name, b)


@pytest.mark.parametrize("target", ["gfx942", "gfx950"])
def test_a_swapped_lane_fails_the_decode(tmp, target):
    """Lanes 0 and 1 of the emulated A layout swapped: the decode no longer matches float64."""
    if target == "gfx942":
        name, page_size, mask, heads, qlen, kv_lens, clusters = CASES[2]
        variant = None
    else:
        name, block_m, page_size, mask, heads, qlen, kv_lens, clusters = GFX950_CASES[0]
        variant = gfx950(page_size, mask, block_m)
    *_, (out_err, lse_err, out_tol, lse_tol) = _run_case(tmp, name, page_size, mask, heads, qlen, kv_lens, clusters,
                                                         mutation=1, variant=variant)
    assert out_err > out_tol or lse_err > lse_tol, (out_err, out_tol, lse_err)


# ---------------------------------------------------------------------------------------------
# bad index values: reported in the error record as on sm_90a, never read through


def _record_slots(record):
    """The error record's slots as (code name, index, value, bound), None where clear."""
    slots = []
    for s in range(ERROR_SLOTS):
        code, index, value, bound = (int(x) for x in record[s * ERROR_SLOT_WORDS:(s + 1) * ERROR_SLOT_WORDS])
        slots.append(None if code == 0 else (DEVICE_ERRORS[code - 1], index, value, bound))
    return slots


def _final_rows(bufs, got):
    """The final output rows: the decode's own, with split tiles merged (reduce_ref)."""
    out, final_lse, split_out, split_lse = got
    _, _, _, reduce_indptr, final_map, partial_map = bufs
    return reduce_ref(split_out, split_lse, reduce_indptr, final_map, partial_map, out.clone(), final_lse.clone())


def _bad_input_run(tmp, corrupt):
    """CASES[0] (page 64, split works, an empty batch) with ``corrupt(case, bufs)`` applied after
    the schedule was planned: (clean final rows, corrupted final rows, error record slots), rows
    as (out, lse) of :func:`_final_rows`."""
    name, page_size, mask, heads, qlen, kv_lens, clusters = CASES[0]
    emu = emulator_for(gfx942(page_size, mask), tmp)
    case = make_case(heads=heads, qlen=qlen, kv_lens=kv_lens, page_size=page_size, seed=len(name))
    bufs = schedule(case, clusters)
    kw = dict(clusters=clusters, grid_x=clusters - 1, sm_scale=1.0 / math.sqrt(576))
    clean = run_emulated(emu, case, bufs, **kw)
    corrupt(case, bufs)
    record = torch.zeros(ERROR_SLOTS * ERROR_SLOT_WORDS, dtype=torch.int64)
    got = run_emulated(emu, case, bufs, record=record, **kw)
    return _final_rows(bufs, clean), _final_rows(bufs, got), _record_slots(record)


def test_bad_page_id_is_reported_and_not_read(tmp):
    """A page id past the pool in batch 0's pages: the record names its position, value and the
    pool size (the op's DeviceIndexError message), the page reads as zeros (no NaN, no access),
    and batch 2, which does not use it, is unchanged."""
    pos = {}

    def corrupt(case, bufs):
        pos["k"], pos["pages"] = 1, case["kv"].shape[0]
        case["kv_indices"][1] = pos["pages"] + 7

    clean, got, slots = _bad_input_run(tmp, corrupt)
    assert slots == [("kv_index", pos["k"], pos["pages"] + 7, pos["pages"]), None], slots
    text = _MESSAGES["kv_index"].format(index=pos["k"], value=pos["pages"] + 7, bound=pos["pages"])
    assert text.startswith(f"kv_indices[{pos['k']}] = {pos['pages'] + 7}"), text
    out, clean_out = got[0], clean[0]
    assert torch.isfinite(out[0]).all(), "the bad page leaked NaN into batch 0"
    assert not torch.equal(out[0], clean_out[0]), "batch 0 read its bad page as if it were good"
    assert torch.equal(out[2], clean_out[2]) and torch.equal(got[1][2], clean[1][2])


@pytest.mark.parametrize("field,value,want", [
    ("kv_last_page_lens", (0, 0), ("last_page_len", 0, 0, 64)),      # batch 0 has pages: 1..64
    ("qo_indptr", (3, 2), ("qo_indptr_end", 3, 2, 3)),              # the last entry != q rows (3)
    ("kv_indptr", (0, 1), ("kv_indptr_start", 0, 1, 0)),
])
def test_bad_batch_layout_is_reported(tmp, field, value, want):
    """A bad batch-layout entry goes to slot 0 with the same (code, index, value, bound) as on
    sm_90a (mla_decode_checks.inc.j2 is one text for both)."""
    def corrupt(case, bufs):
        case[field][value[0]] = value[1]

    *_, slots = _bad_input_run(tmp, corrupt)
    assert slots == [want, None], slots   # the schedule's records are still in bounds


def test_bad_work_record_is_reported_and_skipped(tmp):
    """A work record whose batch is out of range: slot 1 (the schedule's slot) names the record;
    the work is skipped, so its rows stay unwritten (NaN), and the other works run as before."""
    w = {}

    def corrupt(case, bufs):
        work_info = bufs[2]
        w["i"] = int((work_info[:int(bufs[1][-1]), WI["batch_idx"]] == 2).nonzero()[0])   # batch 2's work
        work_info[w["i"], WI["batch_idx"]] = 99

    clean, got, slots = _bad_input_run(tmp, corrupt)
    assert slots == [None, ("work_batch", w["i"], 99, 3)], slots
    assert torch.isnan(got[0][2]).all(), "the skipped work's rows were written"
    assert torch.equal(got[0][1], clean[0][1])


def test_entry_point_refuses_what_the_kernel_cannot_run(tmp):
    """The entry point's argument check (args_valid in the kernel text, which aiter_mla_decode
    and the emulator share): an in-kernel split merge (arrivals), a work_indptr shorter than
    num_clusters + 1, grid_x past the clusters; each is refused before anything runs."""
    emu = emulator_for(gfx942(64, "none"), tmp)
    keep = torch.zeros(64, dtype=torch.int64)
    base = {name: 0 for name, _ in SIGNATURE.fixed}
    base.update(dict((n, None) for n, t in SIGNATURE.fixed if t is ctypes.c_void_p))
    base.update(kv=keep.data_ptr(), num_pages=1, kv_indices=keep.data_ptr(), kv_indices_len=1,
                kv_last_page_lens=keep.data_ptr(), qo_indptr=keep.data_ptr(), kv_indptr=keep.data_ptr(),
                work_indptr=keep.data_ptr(), work_indptr_len=3, work_info=keep.data_ptr(), num_heads=16,
                num_clusters=2, grid_x=2, num_batches=1, total_q=1, max_seqlen_q=1, sm_scale=0.1)
    out = torch.zeros(8, dtype=torch.int64)
    ptrs = (keep.data_ptr(), out.data_ptr(), out.data_ptr(), out.data_ptr(), out.data_ptr())
    call = lambda **kw: emu.lib.emu_decode(ctypes.addressof(SIGNATURE.pack(**(base | kw))), *ptrs, 0)  # noqa: E731
    assert call() == 0   # valid: two empty lists (work_indptr all zeros), nothing written
    assert call(arrivals=keep.data_ptr()) == 1
    assert call(work_indptr_len=2) == 1
    assert call(grid_x=3) == 1
    assert not out.any()
