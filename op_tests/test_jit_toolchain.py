"""Toolchains: real nvcc (sm_90a) and clang-19 (gfx942 compile check) builds, missing-toolchain
and failed-compile errors, and the portable fp8/bf16 bit code checked against torch."""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from aiter_mla.jit import core
from aiter_mla.jit.toolchain import BuildError, ToolchainError, find_compiler

REPO = Path(__file__).resolve().parent.parent
HAS_NVCC = bool(shutil.which("nvcc"))
HAS_CLANG19 = bool(shutil.which("clang-19"))


@pytest.fixture
def real_jit(jit_clean, tmp_path, monkeypatch):
    monkeypatch.setenv("AITER_MLA_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.mark.skipif(not HAS_NVCC, reason="nvcc not on PATH (install the CUDA toolkit)")
def test_real_nvcc_build_of_convert_fp8_for_sm90a(real_jit):
    """The real template through render -> key -> nvcc -> verify -> publish -> ctypes load.
    No GPU is needed to compile or to load the library (it calls the runtime only when used)."""
    m = core.get_module("convert_fp8", arch="sm_90a", out_dtype="bf16")
    assert m.lib_path.name == "lib.so" and m.lib_path.parent.name == m.key
    assert m.error_string(0) == "no error"
    fn = m.function("aiter_mla_convert_fp8",
                    [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                     ctypes.c_int, ctypes.c_void_p], ctypes.c_int)
    assert fn is not None
    meta = core.build_variant("convert_fp8", arch="sm_90a", out_dtype="bf16").entry.meta
    assert "-gencode=arch=compute_90a,code=sm_90a" in meta["command"]
    assert meta["manifest"]["toolchain"]["kind"] == "nvcc"
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump:  # the SASS really is sm_90a, with no PTX for the driver to JIT
        out = subprocess.run([cuobjdump, "--list-elf", "--list-ptx", str(m.lib_path)],
                             capture_output=True, text=True).stdout
        assert "sm_90a" in out and ".ptx" not in out


@pytest.mark.skipif(not HAS_NVCC, reason="nvcc not on PATH (install the CUDA toolkit)")
@pytest.mark.parametrize("doc", ["README.md", "docs/ARCHITECTURE.md"])
def test_docs_jit_contract_snippet_runs_as_written(real_jit, doc):
    """The docs' get_module example, executed verbatim (it lacked `import ctypes` and had
    `argtypes=[...]`, so it could not run; a fresh-user report). Its argtypes must be the
    entry point's (ops/convert.py SIGNATURE)."""
    import re

    from aiter_mla.ops import convert

    blocks = re.findall(r"```python\n(.*?)```", (REPO / doc).read_text(), re.S)
    snippet = [b for b in blocks if 'get_module("convert_fp8"' in b]
    assert len(snippet) == 1, f"{doc}: expected one JIT-contract snippet, found {len(snippet)}"
    scope: dict = {}
    exec(compile(snippet[0], f"{doc}:jit-contract", "exec"), scope)
    assert scope["fn"].argtypes == [t for _, t in convert.SIGNATURE.fields]
    assert scope["fn"].restype is ctypes.c_int


@pytest.mark.skipif(not HAS_NVCC, reason="nvcc not on PATH (install the CUDA toolkit)")
def test_paths_with_shell_and_comma_characters_build(jit_clean, monkeypatch, tmp_path):
    """A cache, templates and temp folder whose paths hold , $ " and \\ (nvcc splits -I values
    on commas and hands paths to a shell): the build failed ("is not in 'keyword=value'
    format", "Unterminated quoted string"; a fresh-user report). nvcc now runs in the staging
    folder on relative names; the entry keeps no link out of the cache."""
    odd = tmp_path / 'a,b$HOME"c\\d'
    shutil.copytree(REPO / "templates", odd / "t,pl")
    monkeypatch.setenv("AITER_MLA_CACHE_DIR", str(odd / "cache"))
    monkeypatch.setenv("AITER_MLA_TEMPLATES_DIR", str(odd / "t,pl"))
    monkeypatch.setenv("TMPDIR", str(odd))
    r = core.build_variant("convert_fp8", arch="sm_90a", out_dtype="bf16")
    assert odd / "cache" in r.entry.path.parents
    assert sorted(p.name for p in r.entry.path.iterdir()) == ["build.log", "lib.so", "meta.json", "source.cu"]
    assert f"-I{odd / 't,pl'}" in r.entry.meta["command"]   # meta.json records the absolute form
    log = (r.entry.path / "build.log").read_text().splitlines()
    assert log[1] == f"# include0 -> {odd / 't,pl'}" and "-Iinclude0 source.cu -o lib.so" in log[2]
    assert core.get_module("convert_fp8", arch="sm_90a", out_dtype="bf16").error_string(0) == "no error"


@pytest.mark.skipif(not HAS_NVCC, reason="nvcc not on PATH (install the CUDA toolkit)")
def test_a_cache_root_that_is_not_utf8_builds(jit_clean, monkeypatch, tmp_path):
    """A cache root whose name holds a byte that is not UTF-8: nvcc built lib.so, then writing
    build.log raised a bare UnicodeEncodeError and left the staging folder (a break test). The
    OS's bytes now pass through into build.log unchanged."""
    root = tmp_path / os.fsdecode(b"bad\xffname")
    monkeypatch.setenv("AITER_MLA_CACHE_DIR", str(root))
    r = core.build_variant("convert_fp8", arch="sm_90a", out_dtype="bf16")
    assert root in r.entry.path.parents
    assert os.fsencode(str(root)) in (r.entry.path / "build.log").read_bytes()
    assert not any((root / "staging").iterdir())


@pytest.mark.skipif(not HAS_NVCC, reason="nvcc not on PATH (install the CUDA toolkit)")
def test_an_unlinkable_odd_include_path_is_a_clear_error(jit_clean, monkeypatch, tmp_path):
    """Where no link can be made (a cache on a filesystem without symlinks) and the include
    folder's path holds a character nvcc cannot take: a BuildError naming both, before the
    compiler runs."""
    shutil.copytree(REPO / "templates", tmp_path / "t,pl")
    monkeypatch.setenv("AITER_MLA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("AITER_MLA_TEMPLATES_DIR", str(tmp_path / "t,pl"))

    def no_links(*a, **k):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "symlink", no_links)
    with pytest.raises(BuildError, match=r"the include folder '.*t,pl' holds one of .* no link to it could be "
                                         r"made in .*staging.* \(Operation not permitted\): move it"):
        core.build_variant("convert_fp8", arch="sm_90a", out_dtype="bf16")
    assert not any((tmp_path / "cache" / "staging").iterdir())   # its staging folder went too


@pytest.mark.skipif(not HAS_NVCC, reason="nvcc not on PATH (install the CUDA toolkit)")
def test_relative_templates_dir_builds(real_jit, monkeypatch, tmp_path):
    """AITER_MLA_TEMPLATES_DIR given relative to the current directory: nvcc runs in a staging
    folder, so the templates' -I must be absolute (it was passed as given, and the build failed
    with "common/aiter_mla_common.cuh: No such file or directory")."""
    shutil.copytree(REPO / "templates", tmp_path / "my_templates")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AITER_MLA_TEMPLATES_DIR", "my_templates")
    entry = core.build_variant("convert_fp8", arch="sm_90a", out_dtype="bf16").entry
    assert f"-I{tmp_path / 'my_templates'}" in entry.meta["command"]
    # a plain path is passed as it is (no link: messages and line info name the real headers)
    assert f"-I{tmp_path / 'my_templates'} " in (entry.path / "build.log").read_text()


@pytest.mark.skipif(not HAS_NVCC, reason="nvcc not on PATH (install the CUDA toolkit)")
@pytest.mark.parametrize("var", ["AITER_MLA_NVCC", "CUDA_HOME"])
def test_relative_compiler_path_builds(real_jit, monkeypatch, tmp_path, var):
    """A compiler given relative to the current directory (AITER_MLA_NVCC=./nvcc, CUDA_HOME=cuda)
    builds: the compiler runs in a staging folder, so its path must be made absolute (it was
    passed as given, and nvcc could not be started: exit status 127). ./cuda links the folder
    above nvcc's real bin/ (the toolkit, or /usr/local for a wrapper), not nvcc alone: a toolkit's
    nvcc finds its headers from the folder it is started in."""
    (tmp_path / "cuda").symlink_to(Path(shutil.which("nvcc")).resolve().parent.parent, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(var, "./cuda/bin/nvcc" if var == "AITER_MLA_NVCC" else "cuda")
    monkeypatch.delenv("CUDA_PATH", raising=False)
    meta = core.build_variant("convert_fp8", arch="sm_90a", out_dtype="bf16").entry.meta
    assert meta["command"][0] == str(tmp_path / "cuda" / "bin" / "nvcc")


@pytest.mark.skipif(not HAS_CLANG19, reason="clang-19 not installed (apt-get install clang-19 "
                                            "lld-19): the gfx942 compile check is skipped")
def test_gfx942_compile_check_with_clang19(real_jit, monkeypatch):
    monkeypatch.setenv("ROCM_PATH", str(real_jit / "no-rocm"))  # force the clang path
    if Path("/opt/rocm/bin/hipcc").exists() or shutil.which("hipcc"):
        pytest.skip("ROCm is installed: gfx942 builds a loadable module with hipcc instead")
    r = core.build_variant("convert_fp8", arch="gfx942", out_dtype="bf16")
    assert r.entry.artifact.name == "code.hsaco" and not r.entry.loadable
    head = r.entry.artifact.read_bytes()[:64]
    assert head[:4] == b"\x7fELF" and int.from_bytes(head[18:20], "little") == 224  # EM_AMDGPU
    assert int.from_bytes(head[48:52], "little") & 0xFF == 0x4C  # EF_AMDGPU_MACH gfx942
    with pytest.raises(core.CompileOnlyError, match="cannot be loaded"):
        core.get_module("convert_fp8", arch="gfx942", out_dtype="bf16")


@pytest.mark.skipif(not HAS_CLANG19, reason="clang-19 not installed (apt-get install clang-19 "
                                            "lld-19): the gfx942 compile check is skipped")
def test_every_gfx942_module_compiles_with_clang19(real_jit, monkeypatch):
    """Every module whose jit_config allows gfx942 (what ``jit build --all --arch gfx942``
    builds) compiles to a gfx942 code object: mla_metadata's __syncthreads_count once failed
    in the clang-19 mode, which the convert_fp8 check above did not reach."""
    monkeypatch.setenv("ROCM_PATH", str(real_jit / "no-rocm"))
    if Path("/opt/rocm/bin/hipcc").exists() or shutil.which("hipcc"):
        pytest.skip("ROCm is installed: gfx942 builds a loadable module with hipcc instead")
    variants = core.build_all(arch="gfx942")
    assert {name for name, _ in variants} >= {"convert_fp8", "mla_metadata", "mla_reduce"}, variants
    for name, params in variants:
        r = core.build_variant(name, **params)
        head = r.entry.artifact.read_bytes()[:64]
        assert head[:4] == b"\x7fELF" and int.from_bytes(head[18:20], "little") == 224, (name, params)


@pytest.mark.skipif(not HAS_CLANG19, reason="clang-19 not installed")
def test_gfx950_needs_newer_toolchain_says_so(real_jit, monkeypatch):
    monkeypatch.setenv("ROCM_PATH", str(real_jit / "no-rocm"))
    if Path("/opt/rocm/bin/hipcc").exists() or shutil.which("hipcc"):
        pytest.skip("ROCm is installed")
    with pytest.raises(ToolchainError, match="gfx950 needs a newer toolchain.*clang 20"):
        core.build_variant("convert_fp8", arch="gfx950", out_dtype="bf16")


@pytest.mark.skipif(not HAS_NVCC, reason="nvcc not on PATH (install the CUDA toolkit)")
def test_cuda_home_without_nvcc_warns(jit_clean, monkeypatch, tmp_path, caplog):
    """CUDA_HOME naming a folder with no bin/nvcc: the nvcc found further on (PATH) is used, with
    a warning naming CUDA_HOME and that nvcc (it was used silently: a fresh-user trial), logged
    as one line (a Python warning printed its source line into CLI output)."""
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "bogus"))
    monkeypatch.delenv("AITER_MLA_NVCC", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)   # a valid one would be found before PATH
    import re

    with caplog.at_level("WARNING", logger="aiter_mla.jit"):
        compiler = find_compiler("sm_90a", None)
    assert any(re.search(r"CUDA_HOME=.*bogus.* has no executable bin/nvcc; using .*nvcc \(from PATH\)",
                         r.getMessage()) for r in caplog.records), caplog.text
    assert compiler.path == os.path.abspath(shutil.which("nvcc"))


def test_blank_cache_dir_means_the_default(monkeypatch):
    """A variable of only spaces counts as unset (AITER_MLA_CACHE_DIR="  " made a folder named
    with two spaces in the current directory), for info's "set" too; a blank HOME falls back to
    the account's home folder, not to "  /.cache"."""
    import pwd
    from aiter_mla import env
    from aiter_mla.jit import cache
    monkeypatch.setenv("AITER_MLA_CACHE_DIR", "  ")
    assert env.get("AITER_MLA_CACHE_DIR") is None and not env.is_set("AITER_MLA_CACHE_DIR")
    monkeypatch.setenv("HOME", "  ")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert cache.default_root() == Path(pwd.getpwuid(os.getuid()).pw_dir) / ".cache" / "aiter_mla"


@pytest.mark.parametrize("var", ["AITER_MLA_CACHE_DIR", "AITER_MLA_CONFIG", "AITER_MLA_TEMPLATES_DIR",
                                 "HIP_KITTENS_DIR"])
def test_a_path_variable_loses_its_surrounding_whitespace(monkeypatch, tmp_path, var):
    """AITER_MLA_CACHE_DIR=" /x " built into a folder named " " under the current directory,
    and a trailing newline (from $(...)) into "/x\n" (fresh-user report); the number and flag
    variables were already stripped."""
    from aiter_mla import env
    for value in (f" {tmp_path}/c ", f"{tmp_path}/c\n", f"\t{tmp_path}/c"):
        monkeypatch.setenv(var, value)
        assert env.get_path(var) == tmp_path / "c"


def test_missing_nvcc_says_what_to_install(jit_clean, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "nothing"))
    monkeypatch.setattr("os.path.isfile", lambda p: False)  # hide /usr/local/cuda too
    with pytest.raises(ToolchainError) as ei:
        find_compiler("sm_90a", None)
    msg = str(ei.value)
    assert "CUDA toolkit" in msg and "AITER_MLA_NVCC" in msg and "CUDA_HOME" in msg


def test_bad_explicit_compiler_path_is_named(jit_clean, monkeypatch, tmp_path):
    monkeypatch.setenv("AITER_MLA_NVCC", str(tmp_path / "nvcc-missing"))
    with pytest.raises(ToolchainError, match="AITER_MLA_NVCC=.*not an executable"):
        find_compiler("sm_90a", None)


@pytest.mark.parametrize("banner,needle", [
    ("Cuda compilation tools, release 11.0, V11.0.194", "is CUDA 11.0"),
    ("hello", "names no CUDA release"),
    ("", "names no CUDA release"),
    ("\\377\\376 release 11.0", "is CUDA 11.0"),   # not UTF-8: info and builds crashed decoding it
    ("Cuda compilation tools, release 12.4, V12.4.131", "is CUDA 12.4"),   # no ...ByVersion yet
])
def test_old_or_unknown_nvcc_is_refused(jit_clean, monkeypatch, tmp_path, banner, needle):
    """README asks for CUDA 12.5+; an older nvcc was accepted and would fail later with its own
    architecture error."""
    nvcc = tmp_path / "nvcc"
    nvcc.write_text(f"#!/bin/sh\nprintf '{banner}\\n'\n")
    nvcc.chmod(0o755)
    monkeypatch.setenv("AITER_MLA_NVCC", str(nvcc))
    with pytest.raises(ToolchainError, match=f"nvcc at {nvcc} {needle}.*need CUDA 12.5 or newer.*AITER_MLA_NVCC"):
        find_compiler("sm_90a", None)


def test_compiler_variable_may_be_a_bare_name(jit_clean, monkeypatch, tmp_path):
    """AITER_MLA_NVCC=nvcc said "'nvcc' is not an executable file"; a bare name is looked up on
    PATH."""
    nvcc = tmp_path / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n")
    nvcc.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("AITER_MLA_NVCC", "nvcc")
    assert find_compiler("sm_90a", None).path == str(nvcc)
    monkeypatch.setenv("AITER_MLA_NVCC", "nvcc-nowhere")
    with pytest.raises(ToolchainError, match="AITER_MLA_NVCC='nvcc-nowhere' is not an executable"):
        find_compiler("sm_90a", None)


def test_a_compiler_that_fails_its_probe_is_named_with_the_variable(jit_clean, monkeypatch, tmp_path):
    """A compiler variable naming a program whose --version fails (or is not clang) gives one
    line that names the variable to fix, not the program's whole banner or a Python None."""
    bad = tmp_path / "not-a-compiler"
    bad.write_text("#!/bin/sh\necho 'some tool 1.0'\necho 'line two'\necho 'it broke' >&2\nexit 3\n")
    bad.chmod(0o755)
    monkeypatch.setenv("AITER_MLA_NVCC", str(bad))
    with pytest.raises(ToolchainError) as ei:
        find_compiler("sm_90a", None)
    msg = str(ei.value)
    assert "\n" not in msg and "exit status 3: it broke" in msg and "AITER_MLA_NVCC" in msg
    other = tmp_path / "other-tool"
    other.write_text("#!/bin/sh\necho 'other tool 2.0'\n")
    other.chmod(0o755)
    monkeypatch.setenv("AITER_MLA_CLANG", str(other))
    monkeypatch.setattr("aiter_mla.jit.toolchain._find_hipcc", lambda: None)   # hipcc is preferred
    for arch in ("gfx942", "gfx950"):
        with pytest.raises(ToolchainError) as ei:
            find_compiler(arch, None)
        msg = str(ei.value)
        assert "is not clang" in msg and "'other tool 2.0'" in msg and "AITER_MLA_CLANG" in msg
        assert "None" not in msg


def test_missing_amd_toolchain_says_what_to_install(jit_clean, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("ROCM_PATH", str(tmp_path / "nothing"))
    monkeypatch.setattr("os.path.isfile", lambda p: False)
    with pytest.raises(ToolchainError) as ei:
        find_compiler("gfx942", None)
    msg = str(ei.value)
    assert "ROCm" in msg and "clang-19" in msg and "AITER_MLA_CLANG" in msg
    # gfx950: clang-19 cannot build it, so the hint names clang 20+ (it named clang-19 for both)
    with pytest.raises(ToolchainError) as ei:
        find_compiler("gfx950", None)
    msg = str(ei.value)
    assert "ROCm" in msg and "clang 20 or newer" in msg and "AITER_MLA_CLANG" in msg
    assert "clang-19" not in msg


def test_failed_compile_carries_stderr_params_and_source(fake_jit, monkeypatch):
    monkeypatch.setenv("FAKE_CC_MODE", "fail")
    with pytest.raises(BuildError) as ei:
        core.get_module("fake", arch="sm_90a", n=7, flavor="b")
    e = ei.value
    assert e.returncode == 2
    assert "fake-nvcc: error: something is wrong at line 3" in e.stderr_tail
    assert e.params == {"arch": "sm_90a", "flavor": "b", "n": 7}
    assert e.source_path.is_file() and "n=7 flavor=b" in e.source_path.read_text()
    msg = str(e)
    assert "something is wrong" in msg and str(e.source_path) in msg and "'n': 7" in msg
    assert (e.source_path.parent / "build.log").is_file()


def test_verbose_prints_build_command(fake_jit, monkeypatch, capsys):
    monkeypatch.setenv("AITER_MLA_VERBOSE", "1")
    core.build_variant("fake", arch="sm_90a", n=1, flavor="a")
    assert str(fake_jit.compiler) in capsys.readouterr().err


NUMERIC_TEST_C = r"""
#include <stdio.h>
#include "common/aiter_mla_numeric.cuh"
int main(int argc, char** argv) {
  for (int c = 0; c < 256; ++c) printf("%.9g\n", aiter_mla_e4m3fn_to_float((uint8_t)c));
  float f;
  while (scanf("%f", &f) == 1) printf("%u\n", (unsigned)aiter_mla_float_to_bf16_bits(f));
  return 0;
}
"""


def test_portable_fp8_and_bf16_bit_code_matches_torch(tmp_path):
    """The AMD path of convert_fp8 decodes e4m3fn and rounds to bf16 by bit manipulation;
    checked here on the host against torch for all 256 codes and edge-case floats."""
    torch = pytest.importorskip("torch")
    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("needs a host C++ compiler")
    src = tmp_path / "t.cpp"
    src.write_text(NUMERIC_TEST_C)
    exe = tmp_path / "t"
    subprocess.run([cxx, "-O1", "-std=c++17", f"-I{REPO / 'templates'}", str(src), "-o", str(exe)],
                   check=True)
    g = torch.Generator().manual_seed(0)
    floats = torch.cat([
        torch.randn(4000, generator=g, dtype=torch.float64) * 100,
        torch.tensor([0.0, -0.0, 1.0, -1.0, 448.0, 1e-30, -3.4e38, 3.4e38, 1.00390625,
                      1.01171875, 2.0 ** -133]),  # ties to even and subnormals
    ]).to(torch.float32)
    proc = subprocess.run([str(exe)], input="\n".join(f"{v:.9g}" for v in floats.tolist()),
                          capture_output=True, text=True, check=True)
    lines = proc.stdout.split()
    ours = torch.tensor([float(x) for x in lines[:256]], dtype=torch.float32)
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.float32)
    nan = torch.isnan(codes)
    assert torch.equal(torch.isnan(ours), nan) and int(nan.sum()) == 2  # 0x7f, 0xff
    assert torch.equal(ours[~nan], codes[~nan])
    assert torch.equal(torch.signbit(ours[~nan]), torch.signbit(codes[~nan]))
    parsed = torch.tensor([float(f"{v:.9g}") for v in floats.tolist()], dtype=torch.float32)
    want = parsed.to(torch.bfloat16).view(torch.int16).to(torch.int64) & 0xFFFF
    got = torch.tensor([int(x) for x in lines[256:]], dtype=torch.int64)
    assert torch.equal(got, want)


def test_common_header_compiles_in_every_mode(tmp_path):
    """The shared header parses as plain host C++ for the numeric part and, with clang-19,
    in the device-only HIP mode the gfx942 check uses (other modules' templates rely on it)."""
    if not HAS_CLANG19:
        pytest.skip("clang-19 not installed (apt-get install clang-19 lld-19)")
    src = tmp_path / "t.hip"
    src.write_text('#include "common/aiter_mla_common.cuh"\n'
                   "__global__ void k(float* x, long long* y, int n) {\n"
                   "  __shared__ float s[64];\n"
                   "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                   "  s[threadIdx.x % 64] = i < n ? x[i] : 0.f;\n"
                   "  __syncthreads();\n"
                   "  float v = __shfl_xor(s[threadIdx.x % 64], 1) + expf(1.f) + min(i, n);\n"
                   "  y[0] = __shfl_up((long long)i, 1u) + __any(v > 0.f) + __ffsll(7ll);\n"
                   "  if (i < n) x[i] = v + (float)gridDim.x;\n"
                   "}\n"
                   "AITER_MLA_EXPORT int launch(float* x, long long* y, int n, void* s) {\n"
                   "  k<<<dim3(1), dim3(64), 0, (cudaStream_t)s>>>(x, y, n);\n"
                   "  return cudaGetLastError();\n}\n")
    subprocess.run(["clang-19", "-x", "hip", "--offload-arch=gfx942", "-nogpuinc", "-nogpulib",
                    "--cuda-device-only", "--no-gpu-bundle-output", "-c", "-O3", "-std=c++17",
                    "-DAITER_MLA_HIP_DEVICE_ONLY=1", f"-I{REPO / 'templates'}", str(src), "-o",
                    str(tmp_path / "t.hsaco")], check=True)
    assert (tmp_path / "t.hsaco").stat().st_size > 0


def test_python_is_not_in_the_key_of_a_c_abi_library(fake_jit):
    _, manifest = core.variant_key("fake", arch="sm_90a", n=1, flavor="a")
    text = str(manifest)
    assert sys.version.split()[0] not in text and "torch" not in text


def test_compiler_temp_files_stay_in_staging_and_go(tmp_path):
    """The compiler's TMPDIR is the staging folder's tmp/ (given relative to the staging
    folder, where it runs: an absolute path may hold characters nvcc cannot pass on), removed
    when it ends (an interrupted nvcc, killed, leaves its tmpxft_* files behind: they must not
    pile up in /tmp)."""
    from aiter_mla.jit.toolchain import run_compiler

    staging = tmp_path / "staging"
    staging.mkdir()
    cmd = ["sh", "-c", 'echo "tmp=$TMPDIR"; touch "$TMPDIR/tmpxft_leftover" && echo "in $PWD/$TMPDIR"; exit 3']
    rc, out, interrupted = run_compiler(cmd, staging, staging / "build.log")
    assert not interrupted
    assert rc == 3
    assert "tmp=tmp\n" in out and f"in {staging / 'tmp'}" in out
    assert not (staging / "tmp").exists()
    assert (staging / "build.log").read_text().startswith(f"# in {staging}\n$ sh -c")



@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc to see that the child is gone")
def test_a_hung_compiler_is_killed_at_the_build_timeout_with_its_children(tmp_path, monkeypatch):
    """AITER_MLA_BUILD_TIMEOUT: a compiler that never ends (and its children) is killed, and the
    build reports why, instead of holding the key's lock until the waiters give up."""
    import time

    from aiter_mla.jit.toolchain import BUILD_TIMED_OUT, run_compiler

    staging = tmp_path / "staging"
    staging.mkdir()
    pidfile = tmp_path / "child.pid"
    cmd = ["sh", "-c", f'sleep 300 & echo $! > {pidfile}; echo compiling; wait']
    monkeypatch.setenv("AITER_MLA_BUILD_TIMEOUT", "1")
    t0 = time.monotonic()
    rc, out, interrupted = run_compiler(cmd, staging, staging / "build.log")
    assert time.monotonic() - t0 < 20
    assert (rc, interrupted) == (BUILD_TIMED_OUT, False)
    assert "compiling" in out and out.rstrip().endswith("sh ran past AITER_MLA_BUILD_TIMEOUT=1 s and was killed")
    child = int(pidfile.read_text())
    for _ in range(50):   # the group's SIGKILL reaches the background sleep too
        if not os.path.exists(f"/proc/{child}") or "Z" in open(f"/proc/{child}/stat").read().split()[2]:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the compiler's child {child} outlived the timeout")
    # a descendant that left the group (setsid) and holds the pipe: the wait after the kill is bounded
    cmd = ["sh", "-c", "setsid sleep 30 & echo compiling; sleep 100"]
    t0 = time.monotonic()
    rc, out, interrupted = run_compiler(cmd, staging, staging / "build.log")
    assert time.monotonic() - t0 < 15 and (rc, interrupted) == (BUILD_TIMED_OUT, False)
    assert out.rstrip().endswith("and was killed")
    # inf (or a huge value) means no limit, as 0 does, instead of an OverflowError
    for value in ("inf", "1e12", "0"):
        monkeypatch.setenv("AITER_MLA_BUILD_TIMEOUT", value)
        assert run_compiler(["sh", "-c", "echo done"], staging, staging / "build.log")[:2] == (0, "done\n")
    monkeypatch.setenv("AITER_MLA_BUILD_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="AITER_MLA_BUILD_TIMEOUT must be a number, got 'soon'"):
        run_compiler(["true"], staging, staging / "build.log")


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc to see that the child is gone")
def test_a_hung_version_probe_takes_its_children_down(tmp_path):
    """The --version probe runs in its own process group: a wrapper script's children are
    killed with it when it times out."""
    import subprocess
    import time

    from aiter_mla.jit.toolchain import run_group

    pidfile = tmp_path / "child.pid"
    with pytest.raises(subprocess.TimeoutExpired):
        run_group(["sh", "-c", f"sleep 300 & echo $! > {pidfile}; wait"], timeout=1)
    child = int(pidfile.read_text())
    for _ in range(50):
        if not os.path.exists(f"/proc/{child}") or "Z" in open(f"/proc/{child}/stat").read().split()[2]:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the probe's child {child} outlived the timeout")
    done = run_group(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=10)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")
