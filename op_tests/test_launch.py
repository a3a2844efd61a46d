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
from aiter_mla.ops import convert, decode, launch, metadata, reduce

_AS_CTYPES = {"const void*": ctypes.c_void_p, "void*": ctypes.c_void_p, "long long": ctypes.c_longlong,
              "int64_t": ctypes.c_int64, "int32_t": ctypes.c_int32,
              "int": ctypes.c_int, "float": ctypes.c_float}


def _c_signature(module: str, symbol: str) -> list[tuple[str, str]]:
    """(C type, parameter name) of ``symbol`` in every default variant of ``module`` rendered for
    sm_90a; the variants must agree."""
    m = load_config().modules[module]
    found = None
    for params in m.default_variants:
        if params.get("arch", "sm_90a") != "sm_90a":
            continue
        text = render(m, dict(params), templates_dir()).text
        sig = re.search(rf"AITER_MLA_EXPORT int {symbol}\((.*?)\)\s*\{{", text, re.S)
        assert sig, f"{module}: no AITER_MLA_EXPORT int {symbol}(...) in the rendered source"
        args = [(re.sub(r"\s*\w+$", "", a.strip()), re.search(r"(\w+)$", a.strip()).group(1))
                for a in sig.group(1).split(",")]
        assert found is None or args == found, (module, params)
        found = args
    assert found, f"{module} has no sm_90a default variant"
    return found


@pytest.mark.parametrize("module,op", [("mla_decode", decode), ("mla_metadata", metadata),
                                       ("mla_reduce", reduce), ("convert_fp8", convert)])
def test_signature_matches_the_template(module, op):
    sig = op.SIGNATURE
    c_args = _c_signature(module, sig.symbol)
    assert [_AS_CTYPES[t] for t, _ in c_args] == list(sig.argtypes), list(zip(c_args, sig.argtypes))
    assert [n for _, n in c_args] == list(sig.names), list(zip(c_args, sig.names))
    assert sig.restype is ctypes.c_int


def test_signature_derives_names_and_argtypes_and_refuses_repeats():
    s = launch.Signature("f", (("a", ctypes.c_void_p), ("n", ctypes.c_int)))
    assert s.names == ("a", "n") and s.argtypes == (ctypes.c_void_p, ctypes.c_int) and s.restype is ctypes.c_int
    assert "c_void_p a" in repr(s) and "c_int n" in repr(s)
    with pytest.raises(ValueError, match=r"f: repeated parameter name in \('a', 'a'\)"):
        launch.Signature("f", (("a", ctypes.c_int), ("a", ctypes.c_int)))


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
