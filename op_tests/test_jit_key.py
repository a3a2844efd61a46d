"""Cache-key sensitivity (docs/DESIGN.md §3.1; failure modes of docs/DESIGN.md §3.8).

Every input that changes the artifact changes the key; inputs that do not (cache location,
checkout location, neutral env vars, unrelated headers) leave it alone.
"""
from __future__ import annotations

import json
import shutil

import pytest

from aiter_mla import env
from aiter_mla.jit import core, key as keymod
from aiter_mla.jit.toolchain import KEY_ENV

P = dict(arch="sm_90a", n=1, flavor="a")


def k(**params):
    core.reset_state()
    return core.variant_key("fake", **(params or P))[0]


def _flip_byte(path, old: str, new: str):
    text = path.read_text()
    assert old in text and len(old) == len(new)
    path.write_text(text.replace(old, new, 1))


def test_key_is_sha256_of_the_stored_manifest(fake_jit):
    key, manifest = core.variant_key("fake", **P)
    assert key == keymod.sha256_json(manifest)
    r = core.build_variant("fake", **P)
    assert r.entry.path.name == key
    meta = json.loads((r.entry.path / "meta.json").read_text())
    assert keymod.key_of(meta["manifest"]) == key
    # Readable names live only in metadata, never in paths.
    assert meta["variant"] == "fake(arch=sm_90a, flavor=a, n=1)"
    assert "fake" not in str(r.entry.path.relative_to(fake_jit.root))


def test_missing_template_fails_before_the_folder_is_hashed(fake_jit, monkeypatch):
    """A templates folder without the module's template is refused before tree_digest reads
    the folder (AITER_MLA_TEMPLATES_DIR=/tmp hashed all of /tmp first: minutes)."""
    from aiter_mla.jit.render import RenderError

    (fake_jit.templates / "fake.cu.j2").unlink()
    monkeypatch.setattr(keymod, "tree_digest", lambda *a, **kw: pytest.fail("folder hashed"))
    core.reset_state()
    with pytest.raises(RenderError, match="fake.cu.j2 does not exist"):
        core.variant_key("fake", **P)


def test_param_order_and_repeat_do_not_matter(fake_jit):
    assert k(arch="sm_90a", n=1, flavor="a") == k(flavor="a", n=1, arch="sm_90a")


def test_params_change_key(fake_jit):
    assert k(**P) != k(arch="sm_90a", n=2, flavor="a")
    assert k(**P) != k(arch="sm_90a", n=1, flavor="b")


def test_template_byte_changes_key(fake_jit):
    before = k()
    _flip_byte(fake_jit.templates / "fake.cu.j2", "// fake module", "// fake mOdule")
    assert k() != before


def test_jinja_comment_change_changes_key(fake_jit):
    # The rendered source is identical, but the template's bytes are in the key (docs/DESIGN.md §3.1).
    before = k()
    t = fake_jit.templates / "fake.cu.j2"
    t.write_text("{# a comment #}" + t.read_text())
    assert k() != before


def test_included_header_byte_changes_key_transitively(fake_jit):
    before = k()
    _flip_byte(fake_jit.templates / "common" / "fake_inner.cuh", "FAKE_INNER 1", "FAKE_INNER 2")
    assert k() != before


def test_header_of_a_computed_include_changes_key(fake_jit):
    """`#include MACRO` names its file through the preprocessor: an edit of that header kept the
    key, so a stale build was loaded (fresh-user report). Every file of the templates folder is
    then in the key."""
    t = fake_jit.templates / "fake.cu.j2"
    t.write_text(t.read_text() + '#define FAKE_HDR "common/unrelated.cuh"\n#include FAKE_HDR\n')
    before = k()
    _flip_byte(fake_jit.templates / "common" / "unrelated.cuh", "UNRELATED 1", "UNRELATED 2")
    assert k() != before


def test_unrelated_header_does_not_change_key(fake_jit):
    before = k()
    _flip_byte(fake_jit.templates / "common" / "unrelated.cuh", "UNRELATED 1", "UNRELATED 2")
    assert k() == before


def test_module_flag_changes_key(fake_jit):
    before = k()
    _flip_byte(fake_jit.config, "-DFAKE_MODULE=1", "-DFAKE_MODULE=2")
    assert k() != before


def test_toolchain_default_flag_changes_key(fake_jit):
    before = k()
    _flip_byte(fake_jit.config, '"-O3"', '"-O2"')
    assert k() != before


def test_arch_changes_key(fake_jit, monkeypatch):
    from conftest import fake_config

    cfg = fake_config()
    cfg["modules"]["fake"]["params"]["arch"] = ["sm_90a", "gfx942"]
    fake_jit.write_config(cfg)
    monkeypatch.setenv("AITER_MLA_CLANG", str(fake_jit.compiler))  # stands in for clang-19
    fake_jit.set_version("clang version 19.1.7")   # a compiler that is not clang is refused
    assert k(arch="sm_90a", n=1, flavor="a") != k(arch="gfx942", n=1, flavor="a")


def test_compiler_version_output_changes_key(fake_jit):
    before = k()
    fake_jit.set_version("v2-with-a-longer-version-string")
    assert k() != before


def test_compiler_identity_remembered_on_disk_by_path_size_mtime(fake_jit):
    k()   # on a root that does not exist yet: nothing is written (a lookup makes no root)
    assert not (fake_jit.root / "toolchains").exists()
    core.build_variant("fake", **P)   # a build makes the root and remembers the probe
    records = list((fake_jit.root / "toolchains").glob("*.json"))
    assert len(records) == 1
    rec = json.loads(records[0].read_text())
    st = fake_jit.compiler.stat()
    assert (rec["identity"][0][2], rec["identity"][0][3]) == (st.st_size, st.st_mtime_ns)
    assert "fake nvcc" in rec["version"]


def test_toolkit_switched_behind_a_wrapper_script_is_probed_again(tmp_path):
    """A wrapper script (like /usr/local/bin/nvcc: exec /usr/local/cuda/bin/nvcc) whose target
    moves (the cuda symlink re-pointed) is a different compiler: probed again, though the
    wrapper itself did not change. The identity used to be the wrapper's path, size and mtime."""
    from aiter_mla.jit import toolchain

    for ver in ("12.4", "13.0"):
        d = tmp_path / f"cuda-{ver}" / "bin"
        d.mkdir(parents=True)
        nv = d / "nvcc"
        nv.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {ver}'\n")
        nv.chmod(0o755)
    link = tmp_path / "cuda"
    link.symlink_to(tmp_path / "cuda-13.0")
    wrapper = tmp_path / "nvcc"
    wrapper.write_text(f"#!/bin/sh\nexec {link}/bin/nvcc \"$@\"\n")
    wrapper.chmod(0o755)
    ident = tmp_path / "toolchains"
    ident.mkdir()
    assert "release 13.0" in toolchain.compiler_version(str(wrapper), ident)
    link.unlink()
    link.symlink_to(tmp_path / "cuda-12.4")
    toolchain._versions.clear()   # a new process: only the on-disk record remains
    assert "release 12.4" in toolchain.compiler_version(str(wrapper), ident)


@pytest.mark.parametrize("name", sorted(n for n, v in env.registry().items() if v.key_changing))
def test_each_key_changing_env_var_changes_key(fake_jit, monkeypatch, name):
    before = k()
    monkeypatch.setenv(name, "1" if env.registry()[name].default == "0" else "-DSOMETHING")
    after = k()
    claimed_by_nvcc = name in KEY_ENV["nvcc"]
    unclaimed = not any(name in v for v in KEY_ENV.values())
    if claimed_by_nvcc or unclaimed:
        assert after != before
    else:  # e.g. AITER_MLA_EXTRA_HIP_FLAGS cannot change an nvcc build
        assert after == before


@pytest.mark.parametrize("name", sorted(n for n, v in env.registry().items() if v.key_changing))
def test_unset_equals_default(fake_jit, monkeypatch, name):
    default = env.registry()[name].default
    monkeypatch.delenv(name, raising=False)
    unset = k()
    monkeypatch.setenv(name, default or "")
    assert k() == unset


@pytest.mark.parametrize("name,value", [("AITER_MLA_VERBOSE", "1"),
                                        ("AITER_MLA_LOCK_TIMEOUT", "5"),
                                        ("AITER_ENABLE_EXPERIMENTAL", "1"),
                                        ("AITER_REBUILD", "1"),
                                        ("CU_NUM", "80")])
def test_neutral_env_vars_do_not_change_key(fake_jit, monkeypatch, name, value):
    before = k()
    monkeypatch.setenv(name, value)
    assert k() == before


def test_cache_and_checkout_locations_do_not_change_key(fake_jit, monkeypatch, tmp_path):
    before = k()
    monkeypatch.setenv("AITER_MLA_CACHE_DIR", str(tmp_path / "other-cache"))
    assert k() == before
    moved = tmp_path / "elsewhere" / "templates"
    shutil.copytree(fake_jit.templates, moved)
    monkeypatch.setenv("AITER_MLA_TEMPLATES_DIR", str(moved))
    assert k() == before


def test_every_key_changing_var_is_read_by_some_toolchain():
    """A key-changing variable no toolchain reads would be a knob that does nothing."""
    claimed = {v for names in KEY_ENV.values() for v in names}
    declared = {n for n, v in env.registry().items() if v.key_changing}
    assert declared <= claimed, f"key-changing but read by no toolchain: {declared - claimed}"


def test_real_config_keys_differ_per_arch_and_need_no_gpu(jit_clean, tmp_path, monkeypatch):
    """The real convert_fp8 keys for sm_90a and gfx942 differ (skipped without nvcc/clang)."""
    monkeypatch.setenv("AITER_MLA_CACHE_DIR", str(tmp_path))
    if not shutil.which("nvcc") or not shutil.which("clang-19"):
        pytest.skip("needs nvcc and clang-19 on PATH")
    a = core.variant_key("convert_fp8", arch="sm_90a", out_dtype="bf16")[1]
    b = core.variant_key("convert_fp8", arch="gfx942", out_dtype="bf16")[1]
    assert a["arch"] == "sm_90a" and b["arch"] == "gfx942"
    assert keymod.key_of(a) != keymod.key_of(b)
    assert a["headers"].keys() == {"common/aiter_mla_common.cuh", "common/aiter_mla_numeric.cuh"}


def test_lookup_id_covers_the_template_constants(monkeypatch):
    """render.py takes WHOLE_BATCH_SLACK from aiter_mla/work_info.py and the NVIDIA arch list
    from arch.py; the lookup id hashed neither, so after a change of them a warm lookup (lookup
    id -> index) loaded the library rendered with the old value."""
    from aiter_mla import arch, work_info

    inputs = {"module": "m", "params": {"arch": "sm_90a"}}
    before = keymod.lookup_id(inputs, "tree")
    monkeypatch.setattr(work_info, "WHOLE_BATCH_SLACK", work_info.WHOLE_BATCH_SLACK + 1)
    slack = keymod.lookup_id(inputs, "tree")
    monkeypatch.undo()
    monkeypatch.setattr(arch, "NVIDIA_ARCHS", (*arch.NVIDIA_ARCHS, "sm_100a"))
    archs = keymod.lookup_id(inputs, "tree")
    assert len({before, slack, archs}) == 3


def test_reset_state_forgets_the_ops_kernel_handles():
    """The ops keep their loaded entry points per (variant, device), outside the JIT memo
    (ops/launch.py's EntryPoints): reset_state must drop those too, or a process that switches
    templates or cache roots keeps running the old kernels (the A/B script of the time timed
    every arm with the first arm's reduce and metadata that way: docs/perf/notes.md change 22)."""
    from aiter_mla.ops import convert, decode, metadata, reduce

    ops = (reduce, metadata, decode, convert)
    for op in ops:
        op._entry_points._loaded[("stale variant", 12345)] = "stale kernel"
    core.reset_state()
    assert all(("stale variant", 12345) not in op._entry_points._loaded for op in ops)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (a real build)")
def test_compiler_env_enters_the_key(private_cache, monkeypatch):
    """NVCC_APPEND_FLAGS=-G (a debug build nvcc makes on its own) gets its own entry: plain,
    -G, plain gives two entries and the third build is a hit on the first (issue 23, item 2).
    Before, the -G build was published under the plain key and served to every later build."""
    from aiter_mla.jit import core

    params = dict(arch="sm_90a", out_dtype="bf16")
    first = core.build_variant("convert_fp8", **params)
    monkeypatch.setenv("NVCC_APPEND_FLAGS", "-G")
    core.reset_state()
    debug = core.build_variant("convert_fp8", **params)
    monkeypatch.delenv("NVCC_APPEND_FLAGS")
    core.reset_state()
    again = core.build_variant("convert_fp8", **params)
    assert first.built and debug.built and not again.built
    assert debug.entry.key != first.entry.key and again.entry.key == first.entry.key
    from aiter_mla.jit.cache import is_cache_key

    entries = {p.name for p in private_cache.rglob("*") if p.is_dir() and is_cache_key(p.name)}
    assert entries == {first.entry.key, debug.entry.key}, entries


def test_host_compiler_and_compiler_env_are_in_the_nvcc_identity(monkeypatch, tmp_path):
    from aiter_mla.jit import key, toolchain

    fake = tmp_path / "my-g++"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("NVCC_CCBIN", str(fake))
    ident = toolchain.host_compiler_identity()
    assert ident[0][0] == str(fake)
    monkeypatch.setenv("NVCC_CCBIN", "no-such-compiler-xyz")
    assert toolchain.host_compiler_identity() == ["no-such-compiler-xyz"]
    for var in ("NVCC_APPEND_FLAGS", "NVCC_PREPEND_FLAGS", "NVCC_CCBIN", "CUDAHOSTCXX", "CC", "CXX"):
        monkeypatch.setenv(var, "-x")
        assert key.env_items("nvcc")[var] == "-x", var
        assert var not in key.env_items("clang")
    monkeypatch.setenv("HIPCC_COMPILE_FLAGS_APPEND", "-O0")
    assert key.env_items("hipcc")["HIPCC_COMPILE_FLAGS_APPEND"] == "-O0"


def test_hipcc_identity_carries_the_clang_it_runs(monkeypatch, tmp_path):
    """hipcc runs HIP_CLANG_PATH's clang++ when set, else ROCm's beside it: that file's
    identity is in the key, so a clang replaced under an unchanged hipcc changes the key."""
    from aiter_mla.jit import toolchain

    rocm = tmp_path / "rocm"
    (rocm / "bin").mkdir(parents=True)
    (rocm / "lib" / "llvm" / "bin").mkdir(parents=True)
    hipcc = rocm / "bin" / "hipcc"
    hipcc.write_text("#!/bin/sh\n")
    clang = rocm / "lib" / "llvm" / "bin" / "clang++"
    clang.write_text("#!/bin/sh\n# clang 18\n")
    monkeypatch.delenv("HIP_CLANG_PATH", raising=False)
    comp = toolchain.Compiler("hipcc", str(hipcc), "HIP version: 6.4")
    first = comp.identity()["host_compiler"]
    assert first[0][0] == str(clang), first
    clang.write_text("#!/bin/sh\n# clang 19, a different build\n")
    assert comp.identity()["host_compiler"] != first
    other = tmp_path / "my-llvm"
    other.mkdir()
    (other / "clang++").write_text("#!/bin/sh\n")
    monkeypatch.setenv("HIP_CLANG_PATH", str(other))
    assert comp.identity()["host_compiler"][0][0] == str(other / "clang++")
    monkeypatch.setenv("HIP_CLANG_PATH", str(tmp_path / "nowhere"))
    assert comp.identity()["host_compiler"] == [str(tmp_path / "nowhere" / "clang++")]
    assert "host_compiler" not in toolchain.Compiler("clang", str(clang), "clang 19").identity()


def test_compiler_changed_under_a_running_process_is_found_again(fake_jit):
    """A toolkit upgraded while a server runs: the next build used the new compiler but wrote
    the first one's identity into its key and manifest, so the entry was filed under the wrong
    key (found by a fresh-user pass). The compiler's file identity is checked per build."""
    core.reset_state()
    first = core.build_variant("fake", arch="sm_90a", n=1, flavor="a").entry
    fake_jit.set_version("v2-with-a-longer-version-string")   # same path, new file
    second = core.build_variant("fake", arch="sm_90a", n=2, flavor="a").entry   # no reset
    versions = [e.meta["manifest"]["toolchain"]["version"] for e in (first, second)]
    assert "v1" in versions[0] and "v2-with-a-longer-version-string" in versions[1]
    assert second.key == k(arch="sm_90a", n=2, flavor="a")   # what a fresh process computes
