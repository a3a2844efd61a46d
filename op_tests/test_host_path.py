"""The warm eager host path of the three ops, counted (CPU; issue 22).

A warm call (the same long-lived tensors as a checked call before) must do a fixed, small amount
of host work: no check re-run, no device-to-host read, no allocation where the caller gave the
buffers, one launch per kernel. The GPU parts are replaced by recording stand-ins, the cache entry
is the one a checked call would have stored (built here with the op's own key function), and
``sys.setprofile`` records every Python and C function the call enters.
"""
from __future__ import annotations

import ctypes
import sys

import pytest
import torch

from aiter_mla.ops import decode as dec
from aiter_mla.ops import metadata, reduce

#: C functions a warm call must never reach: device reads (syncs), allocation, checks' helpers.
FORBIDDEN_C = {"tolist", "item", "cpu", "synchronize", "is_current_stream_capturing",
               "current_device", "get_device_properties", "nonzero", "any", "all"}


class _Sink:
    """The error record's host side, as the warm path reads it (no error recorded)."""

    def __init__(self):
        self.words = [0] * 8
        self.raised = 0
        self.split_heavy_tiles = ctypes.c_int32(1)   # the metadata kernel's hint: a heavy tile

    def raise_pending(self):
        self.raised += 1


def _profile(fn):
    """(Python functions called, C functions called) by ``fn()``, by name, in order."""
    py, c = [], []

    def prof(frame, event, arg):
        if event == "call":
            py.append(frame.f_code.co_name)
        elif event == "c_call":
            c.append(getattr(arg, "__name__", repr(arg)))

    sys.setprofile(prof)
    try:
        out = fn()
    finally:
        sys.setprofile(None)
    return out, py, c


def _launcher(log, name):
    def fn(*args):
        log.append((name, args))
        return 0
    return fn


def _case(heads=128, total_q=4, batch=4, pages=8, page_size=64):
    i32 = dict(dtype=torch.int32)
    t = dict(
        q=torch.zeros(total_q, heads, 576, dtype=torch.bfloat16),
        kv_buffer=torch.zeros(pages, page_size, 1, 576, dtype=torch.bfloat16),
        o=torch.zeros(total_q, heads, 512, dtype=torch.bfloat16),
        qo_indptr=torch.arange(batch + 1, **i32), kv_indptr=torch.arange(batch + 1, **i32) * 2,
        kv_indices=torch.arange(pages, **i32), kv_last_page_lens=torch.full((batch,), 5, **i32),
        work_meta_data=torch.zeros(2, dtype=torch.uint64), work_indptr=torch.zeros(9, **i32),
        work_info_set=torch.zeros(11, 8, **i32), reduce_indptr=torch.zeros(batch + 1, **i32),
        reduce_final_map=torch.zeros(batch, 2, **i32), reduce_partial_map=torch.zeros(14, **i32))
    t["logits"] = torch.zeros(14, 1, heads, 512)
    t["attn_lse"] = torch.zeros(14, 1, heads, 1)
    return t


def _warm_decode_entry(t, log, given: bool, return_lse: bool):
    """Store the Prepared a checked mla_decode_fwd call would have left for these tensors."""
    p = dec.Prepared()
    p.module, p.fn, p.index, p.sink, p.device = None, _launcher(log, "decode"), 0, _Sink(), t["q"].device
    p.args, p.addr = None, 0x1000
    p.split_shape, p.lse_shape = tuple(t["logits"].shape), tuple(t["attn_lse"].shape)
    p.plan_key, p.plan = ("test", 0, 1), None
    r = reduce.Prepared.__new__(reduce.Prepared)
    r.module, r.fn, r.args, r.addr, r.index, r.sink = None, _launcher(log, "reduce"), None, 0x2000, 0, p.sink
    p.reduce = r   # chained: the decode entry point launches it (C), so no reduce call from Python
    # the device's split-merge hint says "heavy" (chained) and the stream's state is made
    p.hint, p.state = ctypes.c_int32(1), (0xABC, False, p.addr)
    logits, attn_lse = (t["logits"], t["attn_lse"]) if given else (None, None)
    key = dec._key(t["q"], t["kv_buffer"], t["o"], t["qo_indptr"], t["kv_indptr"], t["kv_indices"],
                   t["kv_last_page_lens"], t["work_indptr"], t["work_info_set"], None, None,
                   logits, attn_lse, None,
                   (id(t["reduce_indptr"]), t["reduce_indptr"].data_ptr(),
                    id(t["reduce_final_map"]), t["reduce_final_map"].data_ptr(),
                    id(t["reduce_partial_map"]), t["reduce_partial_map"].data_ptr(),
                    1, 64, 1, None, 0.0, return_lse, type(return_lse), bool, bool, int, int, int,
                    type(None), float))
    dec._prepared.put(key, p, [v for k, v in t.items() if k not in ("q", "o")])
    return p


@pytest.fixture
def no_gpu_stream(monkeypatch):
    monkeypatch.setattr(dec, "raw_stream", lambda index: 0xABC)
    monkeypatch.setattr(reduce, "raw_stream", lambda index: 0xABC)
    yield
    dec._prepared.clear()
    reduce._prepared.clear()
    metadata._prepared.clear()


def _call_decode(t, given, return_lse):
    extra = dict(logits=t["logits"], attn_lse=t["attn_lse"]) if given else {}
    return dec.mla_decode_fwd(
        t["q"], t["kv_buffer"], t["o"], t["qo_indptr"], t["kv_indptr"], t["kv_indices"],
        t["kv_last_page_lens"], 1, page_size=64, work_meta_data=t["work_meta_data"],
        work_indptr=t["work_indptr"], work_info_set=t["work_info_set"],
        reduce_indptr=t["reduce_indptr"], reduce_final_map=t["reduce_final_map"],
        reduce_partial_map=t["reduce_partial_map"], return_lse=return_lse, **extra)


@pytest.mark.parametrize("arg, bad", [("page_size", 64.0), ("page_size", True), ("nhead_kv", 1.0),
                                      ("max_seqlen_q", True), ("logit_cap", False)])
def test_warm_key_refuses_scalars_of_another_type(no_gpu_stream, arg, bad):
    """64.0 == 64, True == 1 and False == 0.0 as dict keys: after a warm entry for page_size=64,
    nhead_kv=1, max_seqlen_q=1, logit_cap=0.0, a call with one of them of another type must
    reach the cold path's check (a TypeError naming it), not the warm launch. The same call
    with the entry's own types launches (so the entry's key is the one such a call makes)."""
    t = _case()
    log = []
    _warm_decode_entry(t, log, True, return_lse=False)

    def call(**kw):
        return dec.mla_decode_fwd(
            t["q"], t["kv_buffer"], t["o"], t["qo_indptr"], t["kv_indptr"], t["kv_indices"],
            t["kv_last_page_lens"], kw["max_seqlen_q"], page_size=kw["page_size"],
            nhead_kv=kw["nhead_kv"], logit_cap=kw["logit_cap"], work_meta_data=t["work_meta_data"],
            work_indptr=t["work_indptr"], work_info_set=t["work_info_set"],
            reduce_indptr=t["reduce_indptr"], reduce_final_map=t["reduce_final_map"],
            reduce_partial_map=t["reduce_partial_map"], logits=t["logits"], attn_lse=t["attn_lse"])

    good = dict(page_size=64, nhead_kv=1, max_seqlen_q=1, logit_cap=0.0)
    call(**good)
    assert [name for name, _ in log] == ["decode"]
    with pytest.raises(TypeError, match=arg):
        call(**{**good, arg: bad})
    assert len(log) == 1


@pytest.mark.parametrize("given", [True, False], ids=["no_alloc", "aiter_alloc"])
def test_warm_decode_call_does_a_fixed_small_amount_of_host_work(no_gpu_stream, given):
    """A warm mla_decode_fwd with a caller-made plan: one key, one lookup, one host call into the
    decode entry point (which asks the error record and launches decode and reduce) with this
    call's pointers; no checks, no device read; allocations only for AITER's split buffers when
    the caller gave none."""
    t = _case()
    log = []
    p = _warm_decode_entry(t, log, given, return_lse=False)
    (logits, lse), py, c = _profile(lambda: _call_decode(t, given, False))
    py = py[2:]   # the profiled lambda and _call_decode
    assert [name for name, _ in log] == ["decode"]
    (_, dargs), = log
    split_ptr = logits.data_ptr()
    assert dargs[:5] == (0x1000, t["q"].data_ptr(), t["o"].data_ptr(), None, split_ptr), dargs
    assert dargs[6] == 0xABC and dargs[5] not in (None, 0, split_ptr), dargs
    if given:
        assert dargs[5] == t["attn_lse"].data_ptr()
    assert lse is None and p.sink.raised == 0   # the entry point asks the record, not Python
    assert (logits is t["logits"]) == given
    # Python frames: the op, its key, the stream (stood in by a lambda here) and the C function
    assert py == ["mla_decode_fwd", "is_compiling", "is_scripting", "_key", "<lambda>", "fn"], py
    assert not FORBIDDEN_C & set(c), sorted(FORBIDDEN_C & set(c))
    assert c.count("empty") == (0 if given else 2), c


@pytest.mark.parametrize("flag,bad", [("return_lse", 1), ("return_lse", "yes"),
                                      ("intra_batch_mode", 0), ("return_logits", "no")])
def test_warm_decode_call_does_not_take_a_non_bool_flag(no_gpu_stream, flag, bad):
    """A warm entry stored for return_lse=True served return_lse=1 too (1 == True and
    hash(1) == hash(True)), past the check that refuses it: the key holds the flags' types, so
    the call goes the checked way and is refused, naming the flag."""
    t = _case()
    log = []
    _warm_decode_entry(t, log, True, return_lse=True)
    extra = {"logits": t["logits"], "attn_lse": t["attn_lse"]}
    flags = {"return_lse": True, flag: bad}
    with pytest.raises(TypeError, match=f"{flag} must be a bool, got {type(bad).__name__}"):
        dec.mla_decode_fwd(
            t["q"], t["kv_buffer"], t["o"], t["qo_indptr"], t["kv_indptr"], t["kv_indices"],
            t["kv_last_page_lens"], 1, page_size=64, work_meta_data=t["work_meta_data"],
            work_indptr=t["work_indptr"], work_info_set=t["work_info_set"],
            reduce_indptr=t["reduce_indptr"], reduce_final_map=t["reduce_final_map"],
            reduce_partial_map=t["reduce_partial_map"], **flags, **extra)
    assert log == []   # nothing launched
    _call_decode(t, True, True)   # the same call with bools: warm
    assert [name for name, _ in log] == ["decode"]


def test_split_merge_follows_the_hint_per_stream(no_gpu_stream, monkeypatch):
    """Where the split merge runs (decode.Prepared): fused into the decode launch (its own
    DecodeArgs, with the stream's zeroed arrival counters; the chained reduce stays set for the
    entry point to take instead when the stream is being captured) while the device's hint
    counts no heavy tile, chained (the checked args, reduce launched by C) otherwise, always
    chained while the stream's state is made inside a capture; a second stream gets its own
    counters. Only a change of stream or of the hint leaves the two-line fast path."""
    t = _case()
    log = []
    p = _warm_decode_entry(t, log, True, return_lse=False)
    base = dec.SIGNATURE.pack(**{name: None if t_ is dec._ptr else 0 for name, t_ in dec.SIGNATURE.fixed})
    p.args, p.addr = base, ctypes.addressof(base)
    p.args.reduce_launch, p.args.reduce_args = 0x77, 0x78
    p.allow_fused(t["reduce_indptr"], t["reduce_partial_map"], counters=6)
    hint = p.hint
    assert hint is p.sink.split_heavy_tiles
    hint.value = 3
    capturing = [False]
    monkeypatch.setattr(dec, "_capturing", lambda device: capturing[0])
    streams = iter([0xABC] * 3 + [0xDEF] * 2)
    monkeypatch.setattr(dec, "raw_stream", lambda index: next(streams))

    def launched_args():
        addr = log[-1][1][0]
        return ctypes.cast(addr, ctypes.POINTER(type(base))).contents, addr

    _call_decode(t, True, False)                     # heavy: chained
    a, addr = launched_args()
    assert addr == p.addr and a.reduce_launch == 0x77 and not a.arrivals
    hint.value = 0                                   # light: fused, counters for this stream
    _call_decode(t, True, False)
    a, addr = launched_args()
    assert addr != p.addr and a.arrivals and (a.reduce_launch, a.reduce_args) == (0x77, 0x78)
    assert (a.reduce_indptr, a.reduce_partial_map) == (t["reduce_indptr"].data_ptr(), t["reduce_partial_map"].data_ptr())
    assert (a.reduce_indptr_len, a.partial_map_len) == (t["reduce_indptr"].numel(), t["reduce_partial_map"].numel())
    counters = [c for _, c in p._fused_args]
    assert len(counters) == 1 and counters[0].numel() == 7 and not counters[0].any()
    assert a.arrivals == counters[0].data_ptr()
    first = addr
    _call_decode(t, True, False)                     # the same: the fast path, the same args
    assert launched_args()[1] == first
    capturing[0] = True                              # another stream, being captured: chained
    _call_decode(t, True, False)
    assert launched_args()[1] == p.addr
    capturing[0] = False                             # that stream, no longer captured: its own counters
    _call_decode(t, True, False)
    a, addr = launched_args()
    assert addr not in (p.addr, first) and len(p._fused_args) == 2
    assert a.arrivals == p._fused_args[1][1].data_ptr() != counters[0].data_ptr()


def test_launch_failure_codes_raise_what_they_mean():
    """An entry point's return code: LAUNCH_ERROR_PENDING raises the recorded device error
    (nothing was launched), LAUNCH_REDUCE_FAILED + e the chained reduce's launch error, any
    other nonzero code the module's own."""
    from aiter_mla.ops import launch
    from aiter_mla.work_info import LAUNCH_ERROR_PENDING, LAUNCH_REDUCE_FAILED

    class Module:
        def __init__(self, name):
            self.name = name

        def check(self, code, what):
            raise RuntimeError(f"{self.name} {what} {code}")

    class Sink:
        def raise_pending(self):
            raise ValueError("kv_indices[3] = 50000000 is outside [0, num_pages=8)")

    with pytest.raises(ValueError, match=r"kv_indices\[3\]"):
        launch.fail(LAUNCH_ERROR_PENDING, Module("decode"), "mla decode launch", Sink(), Module("reduce"))
    with pytest.raises(RuntimeError, match="reduce mla_reduce_v1: launch 700"):
        launch.fail(LAUNCH_REDUCE_FAILED + 700, Module("decode"), "mla decode launch", Sink(), Module("reduce"))
    with pytest.raises(RuntimeError, match="decode mla decode launch 9"):
        launch.fail(9, Module("decode"), "mla decode launch", Sink(), Module("reduce"))
    with pytest.raises(RuntimeError, match="set and then cleared"):   # a record another thread took
        launch.fail(LAUNCH_ERROR_PENDING, Module("decode"), "x", _Sink())


def test_warm_decode_call_with_new_q_and_o_of_the_same_shape_stays_warm(no_gpu_stream):
    """Engines pass a new q (and often o) every layer: a warm entry covers them by shape, dtype
    and device; a q of another shape misses and is checked again."""
    t = _case()
    log = []
    _warm_decode_entry(t, log, True, return_lse=False)
    t2 = dict(t, q=t["q"].clone(), o=t["o"].clone())
    _call_decode(t2, True, False)
    assert [name for name, _ in log] == ["decode"] and log[0][1][1] == t2["q"].data_ptr()
    t3 = dict(t, q=torch.zeros(5, 128, 576, dtype=torch.bfloat16), o=torch.zeros(5, 128, 512, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="CUDA tensor"):   # missed: the checks run (and refuse CPU tensors)
        _call_decode(t3, True, False)
    assert len(log) == 1
    # an o of the same shape one element past an aligned start misses too: the kernels write its
    # rows in 16-byte units (a review found the warm path launched it)
    o_odd = torch.zeros(t["o"].numel() + 1, dtype=torch.bfloat16)[1:].view(t["o"].shape)
    with pytest.raises(ValueError, match="^o must start at a 16-byte aligned address"):
        _call_decode(dict(t, o=o_odd), True, False)
    assert len(log) == 1


def test_warm_entry_dies_with_its_tensors(no_gpu_stream):
    """The cache holds tensors by id: when one is freed its entries go, so a new tensor that
    reuses the id is never taken for the checked one."""
    t = _case()
    _warm_decode_entry(t, [], True, return_lse=False)
    assert len(dec._prepared) == 1
    del t["kv_indices"]
    assert len(dec._prepared) == 0


def test_warm_reduce_call_is_a_lookup_and_a_launch(no_gpu_stream):
    t = _case()
    log = []
    r = reduce.Prepared.__new__(reduce.Prepared)
    r.module, r.fn, r.args, r.addr, r.index, r.sink = None, _launcher(log, "reduce"), None, 0x3000, 0, _Sink()
    po, pl, fo = t["logits"], t["attn_lse"], t["o"]
    key = (po.shape, po.stride(), po.dtype, po.device, 0, pl.shape, pl.stride(), pl.dtype,
           fo.shape, fo.stride(), fo.dtype, fo.device, None, 1,
           id(t["reduce_indptr"]), t["reduce_indptr"].data_ptr(), id(t["reduce_final_map"]),
           t["reduce_final_map"].data_ptr(), id(t["reduce_partial_map"]), t["reduce_partial_map"].data_ptr())
    reduce._prepared.put(key, r, (t["reduce_indptr"], t["reduce_final_map"], t["reduce_partial_map"]))
    _, py, c = _profile(lambda: reduce.mla_reduce_v1(po, pl, t["reduce_indptr"], t["reduce_final_map"],
                                                     t["reduce_partial_map"], 1, fo, None))
    assert log == [("reduce", (0x3000, po.data_ptr(), pl.data_ptr(), fo.data_ptr(), None, 0xABC))]
    assert py[1:] == ["mla_reduce_v1", "is_compiling", "is_scripting", "_launch", "<lambda>", "fn"], py
    assert not FORBIDDEN_C & set(c) and "empty" not in c
    # a misaligned partial_output of the same shape and strides is not this entry: it is checked
    # (and refused) instead of read as float4 from a misaligned start (a review found it launched)
    po_odd = torch.zeros(po.numel() + 1)[1:].view(po.shape)
    with pytest.raises(ValueError, match="^mla_reduce_v1: partial_output must start at a 16-byte aligned"):
        reduce.mla_reduce_v1(po_odd, pl, t["reduce_indptr"], t["reduce_final_map"], t["reduce_partial_map"],
                             1, fo, None)
    assert len(log) == 1


def test_warm_metadata_call_is_a_lookup_a_launch_and_the_plan_record(no_gpu_stream, monkeypatch):
    t = _case()
    log = []
    m = metadata.Prepared()
    m.module, m.fn, m.args, m.addr, m.index, m.sink = None, _launcher(log, "metadata"), None, 0x4000, 0, _Sink()
    monkeypatch.setattr(metadata, "_plans", {})   # this process's real plan records stay untouched
    m.plan_key, m.plan = metadata._plan_key(t["work_info_set"]), (lambda: t["work_info_set"], "a record")
    monkeypatch.setattr(metadata.launch, "raw_stream", lambda index: 0xABC)
    args = (t["qo_indptr"], t["kv_indptr"], t["kv_last_page_lens"], t["work_meta_data"],
            t["work_info_set"], t["work_indptr"], t["reduce_indptr"], t["reduce_final_map"],
            t["reduce_partial_map"])
    key = tuple(x for a in args for x in (id(a), a.data_ptr())) + (
        128, 1, 64, 1, 1, 1, True, -1, -1, False, None, None)
    metadata._prepared.put(key, m, args)
    _, py, c = _profile(lambda: metadata.get_mla_metadata_v1(
        t["qo_indptr"], t["kv_indptr"], t["kv_last_page_lens"], 128, 1, True, t["work_meta_data"],
        t["work_info_set"], t["work_indptr"], t["reduce_indptr"], t["reduce_final_map"],
        t["reduce_partial_map"], page_size=64, kv_granularity=1, max_seqlen_qo=1, uni_seqlen_qo=1))
    assert log == [("metadata", (0x4000, 0xABC))]
    assert metadata._plans[m.plan_key] is m.plan
    assert py[1:] == ["get_mla_metadata_v1", "<lambda>", "fn"], py
    assert not FORBIDDEN_C & set(c) and "empty" not in c


def test_device_index_error_pickles_and_names_its_argument():
    import pickle

    from aiter_mla.ops.errors import DeviceIndexError

    e = DeviceIndexError("kv_indices[4] = 50000000 is outside [0, num_pages=13)", code="kv_index",
                         index=4, value=50_000_000, bound=13, device=0)
    back = pickle.loads(pickle.dumps(e))
    assert isinstance(back, ValueError) and str(back) == str(e)
    assert (back.argument, back.code, back.index, back.value, back.bound, back.device) == (
        "kv_indices", "kv_index", 4, 50_000_000, 13, 0)


@pytest.mark.parametrize("device", ["cpu", -1, True, "banana", 1.5, torch.device("meta")])
def test_check_errors_names_a_bad_device(device):
    import aiter_mla

    with pytest.raises(ValueError, match="device must be a CUDA device"):
        aiter_mla.check_errors(device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_check_errors_without_a_gpu_says_so():
    import aiter_mla

    aiter_mla.check_errors()   # nothing ran: nothing to report
    with pytest.raises(RuntimeError, match="no CUDA device is visible"):
        aiter_mla.check_errors(0)
