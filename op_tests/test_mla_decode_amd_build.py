"""The AMD decode kernel (templates/mla_decode_amd.cu.j2) as CPU CI can check it: every gfx942
default variant compiled by Debian's clang-19 and read back from its disassembly, gfx950
rendered (built only where a ROCm >= 6.4 hipcc exists), and the cluster counts the op layer
derives for AMD targets. Its logic runs in test_mla_decode_amd_emu.py; nothing here runs on
AMD hardware.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aiter_mla import arch
from aiter_mla.jit import core
from aiter_mla.jit.config import load_config, templates_dir
from aiter_mla.jit.render import render
from aiter_mla.ops import decode, metadata

HAS_CLANG19 = bool(shutil.which("clang-19")) and bool(shutil.which("llvm-objdump-19"))

#: The stated scratch bound: the kernel spills nothing (private segment 0 bytes, no scratch_*
#: instruction). It held 500 bytes while the register bound was left at 1024 threads.
SCRATCH_BYTES_MAX = 0


def _defaults(target: str) -> list[dict]:
    m = load_config().modules["mla_decode"]
    return [dict(v) for v in m.defaults_for(target) if v["arch"] == target]


def _mfmas_expected(v: dict) -> int:
    """MFMAs one tile issues, unrolled: S^T (block_n / 16 tiles x 18 K steps of 32 dims) and
    O^T (block_n / 32 K steps x 32 tiles of 16 columns)."""
    return v["block_n"] // 16 * (576 // 32) + v["block_n"] // 32 * (512 // 16)


def _notes(path: Path) -> dict[str, int]:
    """The kernel descriptor fields of a code object (llvm-readelf --notes)."""
    out = subprocess.run(["llvm-readelf-19", "--notes", str(path)], capture_output=True, text=True,
                         check=True).stdout
    return {k: int(v) for k, v in re.findall(r"\.(\w+):\s+(\d+)\s*$", out, re.M)}


@pytest.fixture
def clang_jit(jit_clean, tmp_path, monkeypatch):
    monkeypatch.setenv("AITER_MLA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ROCM_PATH", str(tmp_path / "no-rocm"))   # force the clang-19 path
    if Path("/opt/rocm/bin/hipcc").exists() or shutil.which("hipcc"):
        pytest.skip("ROCm is installed: gfx942 builds a loadable module with hipcc instead")
    return tmp_path / "cache"


@pytest.mark.skipif(not HAS_CLANG19, reason="clang-19 / llvm-objdump-19 not installed (apt-get "
                                            "install clang-19 lld-19 llvm-19)")
def test_every_gfx942_default_decode_compiles_to_mfma_without_scratch(clang_jit):
    variants = _defaults("gfx942")
    assert {(v["page_size"], v["mask"]) for v in variants} == {(1, "none"), (1, "causal"), (64, "none"),
                                                                 (64, "causal")}
    assert core.build_all(arch="gfx942", modules=["mla_decode"]) == [("mla_decode", v) for v in variants]
    for v in variants:
        r = core.build_variant("mla_decode", **v)
        assert r.entry.artifact.name == "code.hsaco"
        dis = subprocess.run(["llvm-objdump-19", "-d", str(r.entry.artifact)], capture_output=True,
                             text=True, check=True).stdout
        mfma = re.findall(r"^\s+(v_mfma_\w+)", dis, re.M)
        assert mfma and set(mfma) == {"v_mfma_f32_16x16x32_fp8_fp8"}, (v, set(mfma))
        assert len(mfma) == _mfmas_expected(v) == 68, (v, len(mfma))
        assert "v_cvt_pk_fp8_f32" in dis and "ds_bpermute_b32" in dis and "s_barrier" in dis, v
        notes = _notes(r.entry.artifact)
        assert notes["private_segment_fixed_size"] <= SCRATCH_BYTES_MAX, (v, notes)
        assert not re.search(r"^\s+scratch_", dis, re.M), v
        assert notes["group_segment_fixed_size"] == 32 * 576 + 512 * 32, (v, notes)   # K rows + V^T
        assert notes["max_flat_workgroup_size"] == 512 and notes["vgpr_count"] <= 256, (v, notes)


@pytest.mark.skipif(not HAS_CLANG19, reason="clang-19 / llvm-objdump-19 not installed (apt-get "
                                            "install clang-19 lld-19 llvm-19)")
def test_gfx942_kernels_keep_their_thread_bound(clang_jit):
    """A kernel's __launch_bounds__ reaches the code object as its flat workgroup size (clang
    ignores CUDA's attribute on AMDGPU, which compiled every kernel for 1024 threads and its
    register budget): the reduce's 8 waves, 512 threads. (Its only user below 1024: the
    metadata kernel's bound is the default.)"""
    r = core.build_variant("mla_reduce", arch="gfx942", out_dtype="bf16")
    assert r.entry.artifact.name == "code.hsaco"
    assert _notes(r.entry.artifact)["max_flat_workgroup_size"] == 8 * 64


def _zig_clang_wrapper(folder: Path) -> Path | None:
    """A clang >= 20 that knows gfx950, as ``AITER_MLA_CLANG`` takes it: the ziglang package's
    clang (upstream LLVM; ``.ci/run`` installs it) behind a script that adds its builtin headers
    and puts Debian's lld-19 where clang's AMDGPU driver looks for ``lld``. None when either is
    missing."""
    try:
        import ziglang
    except ImportError:
        return None
    lld = shutil.which("lld-19")
    if lld is None:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "lld").symlink_to(lld)
    include = Path(ziglang.__file__).parent / "lib" / "include"
    script = folder / "clang-zig"
    script.write_text(f'#!/bin/sh\nPATH="{folder}:$PATH" exec "{sys.executable}" -m ziglang clang '
                      f'-isystem "{include}" "$@"\n')
    script.chmod(0o755)
    return script


@pytest.mark.skipif(not shutil.which("llvm-readelf-19"), reason="llvm-readelf-19 not installed (apt-get install llvm-19)")
def test_every_gfx950_default_decode_compiles_without_scratch(clang_jit, tmp_path, monkeypatch):
    """gfx950 (MI355) built, not only rendered: every gfx950 default decode variant (m16x8 both
    masks, m16x4) through the JIT's clang path with clang 22 (ziglang's upstream LLVM, not ROCm's
    fork), its kernel descriptor read back: no scratch, at most 256 VGPRs (two waves a SIMD), the
    LDS of a 64-key tile, the workgroup bound of its tile; its assembly holds one 32-key step's
    MFMAs (the step loop is not unrolled: unrolled it spilled). llvm-objdump-19 cannot
    disassemble gfx950, so the assembly comes from the same compiler with -S."""
    clang = _zig_clang_wrapper(tmp_path / "zig")
    if clang is None:
        pytest.skip("no clang >= 20 for gfx950: pip install ziglang (its clang) and apt-get install lld-19")
    monkeypatch.setenv("AITER_MLA_CLANG", str(clang))
    variants = _defaults("gfx950")
    assert {(v["block_m"], v["mask"]) for v in variants} == {(128, "none"), (128, "causal"), (64, "none")}
    for v in variants:
        r = core.build_variant("mla_decode", **v)
        assert r.entry.artifact.name == "code.hsaco"
        notes = _notes(r.entry.artifact)
        assert notes["private_segment_fixed_size"] <= SCRATCH_BYTES_MAX and notes["vgpr_count"] <= 256, (v, notes)
        assert notes["group_segment_fixed_size"] == 64 * 576 + 512 * 64, (v, notes)   # K rows + V^T
        assert notes["max_flat_workgroup_size"] == v["block_m"] // 16 * 64, (v, notes)
        cmd = list(r.entry.meta["command"])
        src = next(a for a in cmd if a.endswith(".cu"))
        cmd[cmd.index(src)] = str(r.entry.path / "source.cu")
        cmd[cmd.index("-o") + 1] = str(tmp_path / "kernel.s")
        cmd[cmd.index("-c")] = "-S"
        subprocess.run(cmd, check=True, capture_output=True)
        asm = (tmp_path / "kernel.s").read_text()
        mfma = re.findall(r"^\s+(v_mfma_\w+)", asm, re.M)
        assert set(mfma) == {"v_mfma_f32_16x16x32_fp8_fp8"} and len(mfma) == 2 * (576 // 32) + 512 // 16, (v, len(mfma))
        assert "v_cvt_pk_fp8_f32" in asm and "ds_bpermute_b32" in asm and "s_barrier" in asm, v
        assert not re.search(r"^\s+scratch_", asm, re.M), v


def _rocm_hipcc_version() -> tuple[int, int] | None:
    hipcc = shutil.which("hipcc") or ("/opt/rocm/bin/hipcc" if os.path.exists("/opt/rocm/bin/hipcc") else None)
    if hipcc is None:
        return None
    out = subprocess.run([hipcc, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"HIP version: (\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else None


def test_gfx950_defaults_render_to_the_mfma_kernel():
    m = load_config().modules["mla_decode"]
    variants = _defaults("gfx950")
    assert {v["block_m"] for v in variants} == {128, 64} and {v["block_n"] for v in variants} == {64}
    for v in variants:
        text = render(m, v, templates_dir()).text
        assert "#error" not in text, v
        assert "constexpr bool kFp8Fnuz = false;" in text and f"constexpr int kRows = {v['block_m']};" in text
        assert "constexpr int kBlockN = 64;" in text
    text = render(m, _defaults("gfx942")[0], templates_dir()).text
    assert "constexpr bool kFp8Fnuz = true;" in text and "constexpr int kBlockN = 32;" in text


#: The oldest ROCm whose hipcc compiles each target (MI300 support came with ROCm 6.0, MI355's
#: with 6.4).
ROCM_FOR = {"gfx942": (6, 0), "gfx950": (6, 4)}


@pytest.mark.parametrize("target", sorted(ROCM_FOR))
def test_amd_defaults_build_loadable_modules_with_rocm(jit_clean, tmp_path, monkeypatch, target):
    """The hipcc path: every default decode variant of ``target`` builds a host library that
    exports the launch entry points the op layer loads (as the other AMD modules do). Skips
    without that ROCm (none here: this has not run)."""
    found = _rocm_hipcc_version()
    if (found or (0, 0)) < ROCM_FOR[target]:
        pytest.skip(f"{target} builds loadable modules with ROCm >= "
                    f"{'.'.join(map(str, ROCM_FOR[target]))}'s hipcc; found "
                    f"{'.'.join(map(str, found)) if found else 'none'} (clang-19 alone compiles gfx942 "
                    f"code objects only)")
    monkeypatch.setenv("AITER_MLA_CACHE_DIR", str(tmp_path / "cache"))
    for v in _defaults(target):
        r = core.build_variant("mla_decode", **v)
        assert r.entry.loadable and r.entry.artifact.name == "lib.so", v
        syms = subprocess.run(["nm", "-D", "--defined-only", str(r.entry.artifact)], capture_output=True,
                              text=True, check=True).stdout
        for name in ("aiter_mla_decode", "aiter_mla_decode_args_bytes", "aiter_mla_error_string"):
            assert re.search(rf"\b{name}$", syms, re.M), (v, name)


@pytest.mark.parametrize("target,heads,qlen,experimental,block_m,clusters", [
    ("gfx942", 128, 1, "0", 128, 304),   # AITER's MI30x grid: one workgroup a work, num_CU lists
    ("gfx942", 16, 8, "1", 128, 304),
    ("gfx942", 16, 4, "1", 128, 304),    # gfx942 has no m16x4: 64 rows run padded on m16x8
    ("gfx950", 64, 1, "0", 128, 256),
    ("gfx950", 64, 1, "1", 64, 512),     # m16x4 at occupancy 2: 2 x num_CU lists
    ("gfx950", 16, 8, "1", 128, 256),
])
def test_amd_variant_clusters_buffers_and_grid_agree(monkeypatch, target, heads, qlen, experimental,
                                                      block_m, clusters):
    """One cluster count (arch.num_clusters with the target) sizes the metadata buffers, and
    the decode launch runs one workgroup per cluster."""
    monkeypatch.setenv("AITER_ENABLE_EXPERIMENTAL", experimental)
    cu = 304 if target == "gfx942" else 256
    dt = decode.AMD_FP8[target][0]
    v = decode.decode_variant(heads, qlen, 64, dt, dt, target=target)
    assert v["block_m"] == block_m and v["mainloop"] == "mfma"
    load_config().modules["mla_decode"].check_params(v)
    nc = arch.num_clusters(heads, qlen, cu=cu, target=target)
    assert nc == clusters
    specs = metadata._buffer_specs(8, nc)
    assert specs[1][0] == (nc + 1,)   # work_indptr: one entry per cluster + 1
    assert decode.launch_grid_x(v, nc) == nc


def test_amd_variant_refuses_what_the_kernel_does_not_run(monkeypatch):
    monkeypatch.setenv("AITER_ENABLE_EXPERIMENTAL", "1")
    fnuz, fn = torch.float8_e4m3fnuz, torch.float8_e4m3fn
    with pytest.raises(NotImplementedError, match="q_dtype must be torch.float8_e4m3fnuz"):
        decode.decode_variant(128, 1, 64, fn, fn, target="gfx942")
    with pytest.raises(NotImplementedError, match="kv_dtype must be torch.float8_e4m3fn"):
        decode.decode_variant(128, 1, 64, fn, fnuz, target="gfx950")
    with pytest.raises(NotImplementedError, match="at most 128 rows"):
        decode.decode_variant(128, 2, 64, fnuz, fnuz, target="gfx942")
    with pytest.raises(NotImplementedError, match="page_size must be a power of two"):
        decode.decode_variant(128, 1, 48, fnuz, fnuz, target="gfx942")
    with pytest.raises(ValueError, match="target must be an AMD target .*got .gfx90a."):
        decode.decode_variant(128, 1, 64, fnuz, fnuz, target="gfx90a")
    with pytest.raises(ValueError, match="target must be one of"):
        arch.num_clusters(128, 1, cu=304, target="gfx90a")


def test_ops_on_a_rocm_device_refuse_with_what_exists(monkeypatch):
    """On a ROCm build of torch the ops do not launch the AMD decode yet: current_arch says so,
    names the GPU and points at what does exist, rather than a CUDA compute-capability error."""
    import types

    import torch

    from aiter_mla import arch

    monkeypatch.setattr(torch.version, "hip", "6.4.0", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: types.SimpleNamespace(gcnArchName="gfx942:sramecc+:xnack-"))
    with pytest.raises(RuntimeError, match=r"AMD GPU gfx942:sramecc\+:xnack-: the ops launch on sm_90a only.*--arch gfx942"):
        arch.current_arch()
