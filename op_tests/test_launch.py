"""The one launch helper (aiter_mla/ops/launch.py) and the entry-point signatures it declares (CPU).

Every op's SIGNATURE must match its rendered template's C declaration in count, C type and name:
ctypes passes a mismatch on silently, and only a GPU run would show it.
"""
from __future__ import annotations

import ctypes
import re

import pytest

from aiter_mla.jit import core
from aiter_mla.jit.config import load_config, templates_dir
from aiter_mla.jit.render import render
from aiter_mla.bench import read_bandwidth
from aiter_mla.ops import convert, decode, launch, metadata, reduce

_AS_CTYPES = {"const void*": ctypes.c_void_p, "void*": ctypes.c_void_p, "long long": ctypes.c_longlong,
              "int64_t": ctypes.c_int64, "int32_t": ctypes.c_int32,
              "int": ctypes.c_int, "float": ctypes.c_float}


def _c_fields(text: str, pattern: str) -> list[tuple[str, str]]:
    # "type name" items separated by commas (a signature) or semicolons (a struct body)
    items = [i.strip() for i in re.split(r"[,;]", pattern) if i.strip()]
    return [(re.sub(r"\s*\w+$", "", i), re.search(r"(\w+)$", i).group(1)) for i in items]


def _c_signature(module: str, symbol: str) -> tuple[list, list | None]:
    """(C type, parameter name) of ``symbol`` in every default variant of ``module`` rendered
    for sm_90a, and, when its first parameter is ``const <Struct>*``, that struct's (C type,
    field name) list; the variants must agree."""
    m = load_config().modules[module]
    found = None
    for params in m.default_variants:
        if params.get("arch", "sm_90a") != "sm_90a":
            continue
        text = render(m, dict(params), templates_dir()).text
        sig = re.search(rf"AITER_MLA_EXPORT int {symbol}\((.*?)\)\s*\{{", text, re.S)
        assert sig, f"{module}: no AITER_MLA_EXPORT int {symbol}(...) in the rendered source"
        args = _c_fields(text, sig.group(1))
        fields = None
        first = re.fullmatch(r"const (\w+Args)\*", args[0][0])
        if first:
            body = re.search(rf"struct {first.group(1)} \{{(.*?)\}};", text, re.S)
            assert body, f"{module}: no struct {first.group(1)} in the rendered source"
            fields = _c_fields(text, re.sub(r"//[^\n]*", "", body.group(1)))
            args = args[1:]
        assert found is None or (args, fields) == found, (module, params)
        found = (args, fields)
    assert found, f"{module} has no sm_90a default variant"
    return found


@pytest.mark.parametrize("module,op", [("mla_decode", decode), ("mla_metadata", metadata),
                                       ("mla_reduce", reduce), ("convert_fp8", convert),
                                       ("read_bandwidth", read_bandwidth)])
def test_signature_matches_the_template(module, op):
    """The per-call parameters and (for a ``fixed`` signature) the argument struct, field by
    field: count, C type and name."""
    sig = op.SIGNATURE
    c_args, c_fields = _c_signature(module, sig.symbol)
    per_call = list(sig.argtypes[1:] if sig.fixed else sig.argtypes)
    assert [_AS_CTYPES[t] for t, _ in c_args] == per_call, list(zip(c_args, per_call))
    assert [n for _, n in c_args] == list(sig.names), list(zip(c_args, sig.names))
    assert sig.restype is ctypes.c_int
    if sig.fixed is None:
        assert c_fields is None, f"{module}: the template takes a struct the op does not declare"
        return
    assert c_fields is not None, f"{module}: the op declares a struct the template does not take"
    assert [_AS_CTYPES[t] for t, _ in c_fields] == [t for _, t in sig.fixed], list(zip(c_fields, sig.fixed))
    assert [n for _, n in c_fields] == [n for n, _ in sig.fixed]


def test_decode_variants_all_take_the_same_struct():
    """The TMA (page_size >= 8) and cp.async launchers of both dtypes declare one DecodeArgs."""
    m = load_config().modules["mla_decode"]
    seen = set()
    for params in m.default_variants:
        text = render(m, dict(params), templates_dir()).text
        body = re.search(r"struct DecodeArgs \{(.*?)\};", text, re.S).group(1)
        seen.add(re.sub(r"//[^\n]*|\s+", " ", body).strip())
    assert len(seen) == 1


def test_signature_derives_names_and_argtypes_and_refuses_repeats():
    s = launch.Signature("f", (("a", ctypes.c_void_p), ("n", ctypes.c_int)))
    assert s.names == ("a", "n") and s.argtypes == (ctypes.c_void_p, ctypes.c_int) and s.restype is ctypes.c_int
    assert "c_void_p a" in repr(s) and "c_int n" in repr(s) and s.Args is None
    with pytest.raises(ValueError, match=r"f: repeated parameter name in \('a', 'a'\)"):
        launch.Signature("f", (("a", ctypes.c_int), ("a", ctypes.c_int)))
    with pytest.raises(ValueError, match=r"f: repeated field name in \('x', 'x'\)"):
        launch.Signature("f", (("a", ctypes.c_int),), fixed=(("x", ctypes.c_int), ("x", ctypes.c_int)))


def test_fixed_signature_packs_a_struct_and_passes_its_pointer_first():
    s = launch.Signature("g", (("stream", ctypes.c_void_p),),
                         fixed=(("p", ctypes.c_void_p), ("n", ctypes.c_longlong), ("k", ctypes.c_int)))
    assert s.argtypes == (ctypes.c_void_p, ctypes.c_void_p) and s.names == ("stream",)
    a = s.pack(p=16, n=2**40, k=-3)
    assert (a.p, a.n, a.k) == (16, 2**40, -3) and ctypes.sizeof(a) == 24
    with pytest.raises(KeyError, match=r"missing \['k'\], unknown \['z'\]"):
        s.pack(p=1, n=2, z=3)


class _FakeModule:
    def __init__(self, tag):
        self.tag, self.asked = tag, []

    def function(self, symbol, argtypes, restype):
        self.asked.append((symbol, tuple(argtypes), restype))
        return (self.tag, symbol)


def test_entry_points_load_once_per_variant_and_device_until_reset():
    """EntryPoints asks module_for once per (variant key, device), returns the same loaded
    function on every later call, and forgets it on reset_state (a process that switches
    templates must not keep the old kernels)."""
    calls = []

    def module_for(key, device):
        calls.append((key, device))
        return _FakeModule(f"{key}@{device}#{len(calls)}")

    sig = launch.Signature("aiter_mla_x", (("p", ctypes.c_void_p),))
    eps = launch.EntryPoints(sig, module_for)
    a = eps.get("v1", 0)
    assert eps.get("v1", 0) is a and calls == [("v1", 0)]
    assert a.fn == ("v1@0#1", "aiter_mla_x") and a.module.asked == [("aiter_mla_x", (ctypes.c_void_p,), ctypes.c_int)]
    b, c = eps.get("v1", 1), eps.get("v2", 0)
    assert calls == [("v1", 0), ("v1", 1), ("v2", 0)] and len({id(a), id(b), id(c)}) == 3
    core.reset_state()
    assert eps.get("v1", 0) is not a and calls[-1] == ("v1", 0) and len(calls) == 4


def test_raw_stream_is_bound_once():
    fn = launch.raw_stream
    assert callable(fn) and launch.raw_stream is fn
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        launch.nope  # noqa: B018


def test_forked_child_gets_the_ops_locks_free():
    """A fork while another thread holds one of the ops' locks (the plan record, the error
    sinks, a launch cache): the child's first call that took it hung forever, the lock copied
    in its held state. Each is a locks.ForkSafeLock, fresh in the child."""
    import os
    import signal
    import threading

    from aiter_mla.ops import errors, launch, metadata

    held = [metadata._plans_lock, errors._lock, launch.IdentityCache()._lock]
    taken, done = threading.Event(), threading.Event()

    def holder():   # another thread holds every lock across the fork, as a busy engine thread would
        for lk in held:
            lk.acquire()
        taken.set()
        done.wait()
        for lk in held:
            lk.release()

    t = threading.Thread(target=holder)
    t.start()
    taken.wait()
    try:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                signal.alarm(30)
                code = 0 if all(lk.acquire(timeout=5) for lk in held) else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
    finally:
        done.set()
        t.join()
    assert os.waitstatus_to_exitcode(status) == 0
    for lk in held:   # the parent's locks are free again once the thread let go
        assert lk.acquire(timeout=1)
        lk.release()


def test_every_launching_entry_point_drops_a_stale_error_first():
    """The runtime's last error is per host thread and sticks until read: each entry point that
    returns cudaGetLastError must read (drop) it first, or an error an earlier call returned
    early with comes back as its own (a review finding). Every module's every default variant,
    both vendors (AMD's hipGetLastError has the same semantics)."""
    cfg = load_config()
    seen = 0
    for name, m in cfg.modules.items():
        for params in m.default_variants:
            text = render(m, dict(params), templates_dir()).text
            for fn in re.finditer(r"AITER_MLA_EXPORT int (\w+)\((.*?)\)\s*\{\s*([^;]*;)", text, re.S):
                symbol, first = fn.group(1), fn.group(3)
                body = text[fn.end():text.find("\n}", fn.end())]
                if "cudaGetLastError" not in body and "Launch" not in body and "launch_" not in body:
                    continue   # a size query or a stamp read: launches nothing
                assert first == "aiter_mla_drop_stale_error();", (name, params, symbol, first)
                seen += 1
    assert seen >= 7, seen
