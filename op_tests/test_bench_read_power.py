"""The bench's read-only bandwidth kernel (templates/read_bandwidth.cu.j2, built with the local
nvcc for sm_90a; skipped without it) and the SM clock / board power sampler
(aiter_mla/bench/power.py: summaries and a stand-in pynvml on CPU). The kernel's result and rate are checked on the GPU only."""
from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
import time
import types

import pytest

from aiter_mla.bench import power

HAS_NVCC = bool(shutil.which("nvcc"))


# ------------------------------------------------------------------------------------------
# the read kernel


@pytest.fixture
def real_jit(jit_clean, tmp_path, monkeypatch):
    monkeypatch.setenv("AITER_MLA_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_read_template_renders_for_sm90a():
    from aiter_mla.jit.config import load_config, templates_dir
    from aiter_mla.jit.core import build_all
    from aiter_mla.jit.render import render

    m = load_config().modules["read_bandwidth"]
    assert m.params == {"arch": ("sm_90a",)}
    assert ("read_bandwidth", {"arch": "sm_90a"}) in build_all()   # jit build --all builds it
    assert ("read_bandwidth", {"arch": "sm_90a"}) not in build_all(arch="gfx942")
    text = render(m, {"arch": "sm_90a"}, templates_dir()).text
    assert "ld.global.nc.L1::no_allocate.v4.u32 { %0, %1, %2, %3 }, [%4];" in text
    assert "#define READ_UNROLL 8" in text and "AITER_MLA_EXPORT int aiter_mla_read_bandwidth(" in text


@pytest.mark.skipif(not HAS_NVCC, reason="nvcc not on PATH (install the CUDA toolkit)")
def test_read_kernel_builds_with_nvcc_for_sm90a(real_jit):
    """Rendered, compiled for sm_90a, loaded with ctypes (no GPU needed to load); with
    cuobjdump on PATH, the SASS issues the 8 unrolled 16-byte non-caching loads back to back,
    before the first XOR (three-input LOP3) uses one."""
    from aiter_mla.bench.read_bandwidth import SIGNATURE
    from aiter_mla.jit import core

    m = core.get_module("read_bandwidth", arch="sm_90a")
    assert m.function(SIGNATURE.symbol, SIGNATURE.argtypes, ctypes.c_int) is not None
    assert m.error_string(1) == "invalid argument"
    meta = core.build_variant("read_bandwidth", arch="sm_90a").entry.meta
    assert "-gencode=arch=compute_90a,code=sm_90a" in meta["command"]
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump:
        sass = subprocess.run([cuobjdump, "-sass", str(m.lib_path)], capture_output=True,
                              text=True).stdout
        ops = [w for line in sass.splitlines() for w in line.split()
               if w == "LOP3.LUT" or w.startswith("LDG.")]
        assert ops[:9] == ["LDG.E.NA.128.CONSTANT"] * 8 + ["LOP3.LUT"], ops
        assert ops.count("LDG.E.NA.128.CONSTANT") >= 9   # + the tail loop's


@pytest.mark.gpu
def test_read_kernel_reads_every_word_once():
    """XOR over the CTAs' words = XOR over every 32-bit word of the buffer, for a size that
    leaves a tail shorter than one tile (3 MiB + 48 B), and errors for a bad size."""
    import numpy as np
    import torch

    from aiter_mla.bench.read_bandwidth import read_xor

    n = (3 << 20) + 48
    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
    for num_sm, ctas in ((132, 2), (7, 3)):
        partial = torch.empty(num_sm * ctas, dtype=torch.int32, device="cuda")
        read_xor(src, partial, num_sm, ctas)
        got = np.bitwise_xor.reduce(partial.cpu().numpy().view(np.uint32))
        want = np.bitwise_xor.reduce(src.cpu().numpy().view(np.uint32))
        assert got == want, (num_sm, ctas)
    with pytest.raises(ValueError, match="multiple of 16"):
        read_xor(src[:40], partial, 7, 3)


@pytest.mark.gpu
def test_read_ceiling_is_a_rate():
    from aiter_mla.bench import ceilings

    tbps = ceilings.read_tbps(nbytes=512 << 20, reps=5)
    assert 0.5 < tbps < 10.0   # H200 HBM3e peak: 4.8 TB/s


# ------------------------------------------------------------------------------------------
# the clock / power sampler


def test_summarize():
    s = power.summarize([(1980.0, 412.35), (1755.0, None), (1830.0, 600.0), (None, 500.5)])
    assert s == {"clock_mhz": {"min": 1755.0, "median": 1830.0},
                 "power_w": {"median": 500.5, "max": 600.0}, "gpu_samples": 4}
    assert power.summarize([]) == {"clock_mhz": None, "power_w": None, "gpu_samples": 0}


def _fake_pynvml(field_ok: bool):
    calls = []

    class Field:
        nvmlReturn = 0 if field_ok else 3
        value = types.SimpleNamespace(uiVal=455_500)

    nv = types.SimpleNamespace(
        NVML_CLOCK_SM=1,
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByPciBusId=lambda bus: calls.append(("bus", bus)) or "h",
        nvmlDeviceGetHandleByIndex=lambda i: calls.append(("index", i)) or "h",
        nvmlDeviceGetClockInfo=lambda h, kind: 1980 if kind == 1 else 0,
        nvmlDeviceGetFieldValues=lambda h, ids: [Field()] if ids == [186] else [],
        nvmlDeviceGetPowerUsage=lambda h: 612_000)
    return nv, calls


@pytest.mark.parametrize("field_ok,watts", [(True, 455.5), (False, 612.0)])
def test_sampler_with_a_stand_in_pynvml(monkeypatch, field_ok, watts):
    """The pynvml source: the GPU named by PCI bus id (or index), SM clock in MHz, the
    instant power field in mW when the driver has it, else nvmlDeviceGetPowerUsage."""
    nv, calls = _fake_pynvml(field_ok)
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    s = power.Sampler("00000000:18:00.0")
    assert s.source == "pynvml" and calls == [("bus", "00000000:18:00.0")]
    with power.sampled(s) as out:
        time.sleep(0.05)
    assert out["clock_mhz"] == {"min": 1980.0, "median": 1980.0}
    assert out["power_w"] == {"median": watts, "max": watts} and out["gpu_samples"] >= 1
    assert power.Sampler("3").source == "pynvml" and calls[-1] == ("index", 3)


def test_no_source_records_none(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)   # import pynvml -> ImportError
    s = power.Sampler("0")
    assert s.source is None
    with power.sampled(s) as out:
        pass
    assert out == {"clock_mhz": None, "power_w": None, "gpu_samples": 0}
    with power.sampled(None) as out:
        pass
    assert out["clock_mhz"] is None and "pynvml" in power.NO_SOURCE_NOTE


@pytest.mark.gpu
def test_sampler_on_the_gpu():
    import torch

    s = power.Sampler(power.nvml_id(torch.cuda.current_device()))
    if s.source is None:
        pytest.skip("neither pynvml nor nvidia-smi is available")
    a = torch.randn(8192, 8192, device="cuda")
    with power.sampled(s) as out:
        for _ in range(50):
            a @ a
        torch.cuda.synchronize()
    assert 300 < out["clock_mhz"]["median"] < 3000 and 20 < out["power_w"]["max"] < 2000
