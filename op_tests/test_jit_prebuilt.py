"""Prebuilt caches for images (CPU; issue 23, item 3): ``jit build --cache-dir ROOT`` fills a
root (``--all`` or ``--from-file``), and that root then serves read-only under
AITER_MLA_DISABLE_JIT=1 on a machine with no compiler (docs/DESIGN.md §3.9).

The fake-compiler sandbox of conftest.py checks the rules; the last test builds the real
convert_fp8 with nvcc (skipped without it) and loads it with nvcc out of reach.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from aiter_mla import cli
from aiter_mla.jit import core
from aiter_mla.jit.cache import CacheNotWritableError
from conftest import _JIT_VARS, FAKE_TEMPLATE, REPO, run_read_only, tree_snapshot

P1 = dict(arch="sm_90a", n=1, flavor="a")
P2 = dict(arch="sm_90a", n=2, flavor="a")
P5 = dict(arch="sm_90a", n=5, flavor="a")

# Loads each (module, params) of argv[1] with get_module; prints what it got as JSON. With
# argv[2] "strict", starting any subprocess fails the load (a warm load starts none).
LOADER = r"""
import json, sys
if sys.argv[2:] == ["strict"]:
    def hook(event, args):
        if event in ("subprocess.Popen", "os.posix_spawn", "os.fork", "os.exec", "os.system"):
            raise RuntimeError("a load started a subprocess: " + event)
    sys.addaudithook(hook)
from aiter_mla.jit import JitDisabledError, get_module
results = []
for name, params in json.loads(sys.argv[1]):
    try:
        m = get_module(name, **params)
        results.append({"key": m.key, "path": str(m.lib_path), "error_string": m.error_string(0)})
    except JitDisabledError as exc:
        results.append({"error": str(exc)})
from aiter_mla.jit.toolchain import ToolchainError, find_compiler
try:
    find_compiler("sm_90a", None)   # after the loads: its --version output is remembered then
    compiler = True
except ToolchainError:
    compiler = False
print(json.dumps({"compiler": compiler, "results": results, "jinja": "jinja2" in sys.modules,
                  "filelock": "filelock" in sys.modules}))
"""


def _no_compiler(tmp_path) -> dict:
    """Env of a machine without nvcc: every place the JIT looks for one names nothing."""
    nowhere = tmp_path / "nowhere"
    empty = tmp_path / "empty_bin"
    empty.mkdir(exist_ok=True)
    return {"AITER_MLA_NVCC": str(nowhere / "nvcc"), "CUDA_HOME": str(nowhere),
            "CUDA_PATH": str(nowhere), "PATH": str(empty), "AITER_MLA_DISABLE_JIT": "1"}


def _load(env: dict, ro_dirs: list, variants: list, strict: bool = True) -> dict:
    cmd = [sys.executable, "-c", LOADER, json.dumps(variants), *(["strict"] if strict else [])]
    proc = (run_read_only(ro_dirs, cmd, env) if ro_dirs else
            subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _cli_child(env: dict, ro_dirs: list, *argv) -> subprocess.CompletedProcess:
    return run_read_only(ro_dirs, [sys.executable, "-m", "aiter_mla", *argv], env)


def _metas(root) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(root.glob("entries/*/meta.json"))]


def _damage(lib) -> None:
    data = bytearray(lib.read_bytes())
    data[100] ^= 0xFF
    tmp = lib.with_name("damaged")
    tmp.write_bytes(bytes(data))
    os.replace(tmp, lib)


def _without_compiler(monkeypatch, tmp_path) -> dict:
    """This process, from now on, as on a machine without nvcc under AITER_MLA_DISABLE_JIT=1;
    returns what to give :func:`_with_compiler` to undo it."""
    saved = {k: os.environ.get(k) for k in _no_compiler(tmp_path)}
    for k, v in _no_compiler(tmp_path).items():
        monkeypatch.setenv(k, v)
    core.reset_state()
    return saved


def _with_compiler(monkeypatch, saved: dict) -> None:
    for k, v in saved.items():
        if v is None:
            monkeypatch.delenv(k, raising=False)
        else:
            monkeypatch.setenv(k, v)
    core.reset_state()


# ----- filling a root


def test_build_all_fills_the_cache_dir_root_only(fake_jit, tmp_path, capsys):
    root = tmp_path / "image_cache"
    assert cli.main(["jit", "build", "--all", "--cache-dir", str(root)]) == 0
    err = capsys.readouterr().err
    assert f"building 2 variant(s) with" in err and f"into {root}\n" in err and "2 of 2 ok, 0 failed" in err
    metas = _metas(root)
    assert sorted(m["params"]["n"] for m in metas) == [1, 2]
    assert not (fake_jit.root / "entries").exists()            # not AITER_MLA_CACHE_DIR's root
    assert core._get_state().cache.root == fake_jit.root       # the flag holds for that command only
    for m in metas:   # the toolchain's identity is recorded, and the id a compiler-less lookup uses
        assert m["manifest"]["toolchain"]["path"] == str(fake_jit.compiler)
        assert len(m["toolchain_free_lookup"]) == 64 and m["toolchain_free_lookup"] != m["key"]


def test_gc_and_clear_take_the_cache_dir_root_too(fake_jit, tmp_path, capsys):
    """A prebuilt root is cleaned with the same flag that filled it; the default root is left."""
    root = tmp_path / "image_cache"
    assert cli.main(["jit", "build", "--all", "--cache-dir", str(root)]) == 0
    core.build_variant("fake", arch="sm_90a", n=7, flavor="b")   # one entry in the default root
    assert len(_metas(root)) == 2
    assert cli.main(["jit", "gc", "--max-bytes", "0", "--cache-dir", str(root)]) == 0
    assert f"in {root}" in capsys.readouterr().out and _metas(root) == []
    assert cli.main(["jit", "build", "--all", "--cache-dir", str(root)]) == 0
    assert cli.main(["jit", "clear", "--all", "--cache-dir", str(root)]) == 0
    assert f"from {root}" in capsys.readouterr().out and _metas(root) == []
    assert len(_metas(fake_jit.root)) == 1                        # not AITER_MLA_CACHE_DIR's root
    assert core._get_state().cache.root == fake_jit.root


def test_build_from_file_reads_every_line_form(fake_jit, tmp_path, capsys):
    lst = tmp_path / "variants.txt"
    lst.write_text(textwrap.dedent("""\
        # variants of the image

        fake arch=sm_90a n=3 flavor=b      # K=V, as jit list --variants prints them
        fake --param arch=sm_90a --param n=4 --param=flavor=a
          fake(arch=sm_90a, flavor=a, n=5)
        fake flavor=b n=3 arch=sm_90a
        fake(arch=sm_90a, flavor=b, n=6) c8d7383c92ee
          [missing] default fake(arch=sm_90a, flavor=b, n=7) 1321286f92d7
          [  other] extra   fake(arch=sm_90a, flavor=a, n=8) 5ea8b90bea89  (built by another toolchain (x); not loaded)
          [unknown] default fake(arch=sm_90a, flavor=b, n=9)   (no toolchain: x)
        fake(arch=sm_90a, flavor=a, n=10) 5ea8b90bea89  (built by another toolchain (x); not loaded)
    """))   # from `fake(..., n=6)` on: a `jit list` form with its key, and whole `jit list` lines
    # (break tests; an [unknown] line has no key, and was read as a module named '[unknown]';
    # a line with its key and note but no status had both read as parameters)
    root = tmp_path / "r"
    assert cli.main(["jit", "build", "--from-file", str(lst), "--cache-dir", str(root)]) == 0
    assert "8 of 8 ok, 0 failed" in capsys.readouterr().err   # the repeated line is built once
    assert sorted((m["params"]["n"], m["params"]["flavor"]) for m in _metas(root)) == [
        (3, "b"), (4, "a"), (5, "a"), (6, "b"), (7, "b"), (8, "a"), (9, "b"), (10, "a")]
    assert fake_jit.started() == 8


def test_build_from_file_skips_a_byte_order_mark(fake_jit, tmp_path, capsys):
    lst = tmp_path / "variants.txt"   # as Windows editors save UTF-8 (was "unknown JIT module '\ufefffake'")
    lst.write_bytes(b"\xef\xbb\xbffake arch=sm_90a n=3 flavor=b\r\n")
    assert cli.main(["jit", "build", "--from-file", str(lst), "--cache-dir", str(tmp_path / "r")]) == 0
    assert [(m["params"]["n"], m["params"]["flavor"]) for m in _metas(tmp_path / "r")] == [(3, "b")]


BAD_LISTS = [
    ("fake arch=sm_90a n=1 flavor=a\nnope arch=sm_90a\n", ":2: unknown JIT module 'nope'"),
    ("fake arch=sm_90a n=1\n", ":1: module 'fake': missing parameter(s) flavor"),
    ("fake arch=sm_90a n=1 flavor=a size=3\n", ":1: module 'fake': unknown parameter 'size'"),
    ("fake arch=sm_90a n=99 flavor=a\n", ":1: module 'fake': parameter n='99' is not allowed"),
    ("\n# comment\nfake arch=sm_90a n 1 flavor=a\n", ":3: 'n': expected NAME=VALUE"),
    ("fake arch=sm_90a n=1 n=2 flavor=a\n", ":1: n given twice (n=1 and n=2)"),
    ("fake 'arch=sm_90a n=1\n", ":1: No closing quotation"),
    ("--param arch=sm_90a\n", ":1: expected a MODULE name first, got '--param'"),
    ("fake arch=sm_90a n=1 flavor=a --param\n", ":1: --param ends the line"),
    ("fake(arch=sm_90a, n=1)\n", ":1: module 'fake': missing parameter(s) flavor"),
    # plain `jit list`'s lines that name no variant (its header was "unknown JIT module 'cache'")
    ("cache root: /x/cache\n", (":1: not a variant line: the header line of 'aiter-mla jit list' is not "
                                 "accepted (its header, module and parameter lines name no variant); give "
                                 "one variant a line, MODULE K=V ..., as 'aiter-mla jit list --variants' "
                                 "prints them; got 'cache root: /x/cache'")),
    ("fake arch=sm_90a n=1 flavor=a\n\nfake  (fake.cu.j2, experimental)\n",
     ":3: not a variant line: a module line of 'aiter-mla jit list'"),
    ("  arch: sm_90a, gfx942\n", ":1: not a variant line: a parameter line of 'aiter-mla jit list'"),
    ("fake arch=sm_90a n=1 flavor=a\n\n1 damaged entry whose meta.json is unreadable\n",
     ":3: not a variant line: the damaged-entries line of 'aiter-mla jit list'"),
    ("# only comments\n\n", " names no variant (one a line: MODULE K=V"),
    (b"fake arch=sm_90a n=1 flavor=\xff\n", ": not UTF-8 text (invalid start byte at byte 28)"),
]


@pytest.mark.parametrize("content,needle", BAD_LISTS, ids=[n for _, n in BAD_LISTS])
def test_a_bad_list_file_is_a_one_line_error_naming_file_and_line(fake_jit, tmp_path, capsys, content, needle):
    lst = tmp_path / "variants.txt"
    (lst.write_bytes if isinstance(content, bytes) else lst.write_text)(content)
    assert cli.main(["jit", "build", "--from-file", str(lst)]) == 2   # the command line names a bad file
    out = capsys.readouterr()
    assert out.err.count("\n") == 1 and "Traceback" not in out.err + out.out, out.err
    assert out.err.startswith(f"aiter-mla jit: error: {lst}{needle}") or \
        out.err.startswith(f"aiter-mla jit: error: --from-file {str(lst)!r}{needle}"), out.err
    assert fake_jit.started() == 0   # nothing built before the whole file is read


@pytest.mark.parametrize("argv,needle", [
    (["--from-file", "{tmp}/none.txt"], "--from-file '{tmp}/none.txt': cannot read it (No such file or directory)"),
    (["--from-file", "{tmp}"], "--from-file '{tmp}': cannot read it (Is a directory)"),
    (["fake", "--from-file", "{tmp}/v.txt"], "--from-file lists every variant: give no MODULE, --param, --all or --arch"),
    (["--all", "--from-file", "{tmp}/v.txt"], "--from-file lists every variant: give no MODULE"),
])
def test_from_file_usage_errors(fake_jit, tmp_path, capsys, argv, needle):
    (tmp_path / "v.txt").write_text("fake arch=sm_90a n=1 flavor=a\n")
    assert cli.main(["jit", "build", *(a.format(tmp=tmp_path) for a in argv)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"aiter-mla jit: error: {needle.format(tmp=tmp_path)}") and err.count("\n") == 1, err
    assert fake_jit.started() == 0


def test_from_file_line_without_its_closing_parenthesis(fake_jit, tmp_path, capsys):
    """The MODULE(K=V, ...) form cut short read as an unknown module 'fake(arch=sm_90a,'."""
    lst = tmp_path / "v.txt"
    lst.write_text("fake(arch=sm_90a, n=1, flavor=a\n")
    assert cli.main(["jit", "build", "--from-file", str(lst)]) == 2
    assert capsys.readouterr().err == (f"aiter-mla jit: error: {lst}:1: expected MODULE(K=V, ...) with a "
                                       "closing ')', got 'fake(arch=sm_90a, n=1, flavor=a'\n")
    assert fake_jit.started() == 0


def test_blank_cache_dir_is_refused_and_an_unwritable_one_is_named_as_the_flag(fake_jit, tmp_path, capsys):
    with pytest.raises(SystemExit) as ei:
        cli.main(["jit", "build", "--all", "--cache-dir", " "])
    assert ei.value.code == 2 and "argument --cache-dir: expected a folder path, got ' '" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("x")
    # under a file the folder can never be made: a usage error naming the file (it was a build
    # failure, and gc / clear printed "no cache folder" and then an errno)
    with pytest.raises(SystemExit) as ei:
        cli.main(["jit", "build", "fake", "--param", "n=1", "--cache-dir", str(blocker / "cache")])
    assert ei.value.code == 2
    assert f"which cannot be one ({blocker} exists and is not a folder)" in capsys.readouterr().err
    # past the command line (a folder that turns into a file's child before the build): the
    # build names the flag that chose the root
    with core.using_cache_root(blocker / "cache"):
        with pytest.raises(CacheNotWritableError) as ei:
            core.build_variant("fake", arch="sm_90a", n=1, flavor="a")
    assert f"JIT cache root {blocker / 'cache'} is not writable" in str(ei.value)
    assert "--cache-dir points at it): set --cache-dir to a writable folder" in str(ei.value)
    assert core._get_state().cache.root == fake_jit.root   # restored after the failed build


def test_plain_list_output_is_refused_by_from_file_saying_what_to_use(fake_jit, tmp_path, capsys):
    """`jit list > FILE; jit build --from-file FILE` said "FILE:1: unknown JIT module 'cache'"
    (a fresh-user trial): the header is named as `jit list`'s, with --variants to use instead;
    nothing is skipped silently (every line but the [status] variant lines is refused)."""
    assert cli.main(["jit", "list"]) == 0
    text = capsys.readouterr().out
    lst = tmp_path / "listed.txt"
    lst.write_text(text)
    assert cli.main(["jit", "build", "--from-file", str(lst)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"aiter-mla jit: error: {lst}:1: not a variant line: the header line of "
                          f"'aiter-mla jit list' is not accepted") and err.count("\n") == 1, err
    assert "'aiter-mla jit list --variants' prints them" in err
    # without the header, the next line that names no variant is refused too
    lines = text.splitlines()
    for n, line in enumerate(lines[1:], 2):
        if line.strip() and not line.lstrip().startswith("["):
            lst.write_text("\n".join(lines[1:]) + "\n")
            assert cli.main(["jit", "build", "--from-file", str(lst)]) == 2
            assert f"{lst}:{n - 1}: not a variant line" in capsys.readouterr().err
            break
    else:
        pytest.fail(f"no module line in {text!r}")
    assert fake_jit.started() == 0


def test_list_variants_round_trips_through_from_file(fake_jit, tmp_path, capsys):
    """`jit list --variants > FILE` on one machine, `jit build --from-file FILE` on another."""
    extra = core.build_variant("fake", arch="sm_90a", n=7, flavor="b").entry   # built on demand
    assert cli.main(["jit", "list", "--variants"]) == 0
    text = capsys.readouterr().out
    assert text.splitlines() == [
        f"# for 'aiter-mla jit build --from-file FILE' (cache root: {fake_jit.root})",
        "fake arch=sm_90a flavor=a n=1  # missing " + core.variant_key("fake", **P1)[0][:12],
        "fake arch=sm_90a flavor=a n=2  # missing " + core.variant_key("fake", **P2)[0][:12],
        f"fake arch=sm_90a flavor=b n=7  # cached {extra.key[:12]}",
        "fake_exp arch=sm_90a flavor=a n=3  # missing "
        + core.variant_key("fake_exp", arch="sm_90a", n=3, flavor="a")[0][:12],
    ]
    lst = tmp_path / "variants.txt"
    lst.write_text(text)
    other = tmp_path / "other_machine"
    assert cli.main(["jit", "build", "--from-file", str(lst), "--cache-dir", str(other)]) == 0
    assert "4 of 4 ok" in capsys.readouterr().err
    assert extra.key in {m["key"] for m in _metas(other)}   # the same entry: roots are not in the key
    assert cli.main(["jit", "list", "--variants", "--cache-dir", str(other)]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[0] == f"# for 'aiter-mla jit build --from-file FILE' (cache root: {other})"
    assert [ln.split("  # ")[1].split()[0] for ln in listed[1:]] == ["cached"] * 4


# ----- serving a root read-only


def test_read_only_root_serves_without_a_compiler(fake_jit, tmp_path):
    root = tmp_path / "image_cache"
    assert cli.main(["jit", "build", "--all", "--cache-dir", str(root)]) == 0
    keys = {m["params"]["n"]: m["key"] for m in _metas(root)}
    before = tree_snapshot(root)
    env = {**fake_jit.env, "AITER_MLA_CACHE_DIR": str(root), **_no_compiler(tmp_path)}
    out = _load(env, [root], [("fake", P1), ("fake", P2)])
    assert out["compiler"] is False
    for n, got in zip((1, 2), out["results"]):
        assert got == {"key": keys[n], "path": str(root / "entries" / keys[n] / "lib.so"),
                       "error_string": "no error"}
    assert not out["jinja"] and not out["filelock"]   # a hit renders nothing, locks nothing
    err = _load(env, [root], [("fake", P5)])["results"][0]["error"]
    assert "\n" not in err and err.startswith(
        f"AITER_MLA_DISABLE_JIT=1 and fake(arch=sm_90a, flavor=a, n=5) is not built in {root} by "
        f"any toolchain (no compiler for sm_90a is found here"), err
    assert "aiter-mla jit build fake --param arch=sm_90a --param flavor=a --param n=5" in err
    listed = _cli_child(env, [root], "jit", "list")
    assert listed.returncode == 0, listed.stderr
    assert f"[ cached] default fake(arch=sm_90a, flavor=a, n=1) {keys[1][:12]}" in listed.stdout
    assert f"[ cached] default fake(arch=sm_90a, flavor=a, n=2) {keys[2][:12]}" in listed.stdout
    built = _cli_child(env, [root], "jit", "build", "--all")
    assert built.returncode == 0 and "2 of 2 ok, 0 failed" in built.stderr, built.stderr
    assert built.stderr.count("cached fake(") == 2
    # gc / clear with nothing to remove there succeed (they failed on the read-only root); with
    # something to remove they fail, saying why (a break test)
    for argv in (("jit", "gc", "--max-bytes", "100G"), ("jit", "clear", "fake_exp")):
        done = _cli_child(env, [root], *argv)
        assert done.returncode == 0 and f"nothing to remove in {root} (not writable)" in done.stdout, done.stderr
    refused = _cli_child(env, [root], "jit", "clear", "fake")
    assert refused.returncode == 1 and "not writable" in refused.stderr, refused.stderr
    # a read-only mount (root's stand-in) says so, not "Permission denied"
    assert os.geteuid() != 0 or "Read-only file system" in refused.stderr, refused.stderr
    assert tree_snapshot(root) == before
    assert fake_jit.started() == 2


def test_read_only_root_with_a_compiler_keeps_the_exact_key_and_skips_writes(fake_jit):
    """With a compiler, a load takes the exact-key path; on a read-only root every write on
    it (index record, last-use stamp, remembered --version output) is skipped, not raised.
    The same load on the writable root writes each of them: there was something to skip."""
    key = core.build_variant("fake", **P1).entry.key
    root = fake_jit.root
    for sub in ("index", "used", "toolchains"):
        shutil.rmtree(root / sub)
    before = tree_snapshot(root)
    env = {**fake_jit.env, "AITER_MLA_DISABLE_JIT": "1"}
    out = _load(env, [root], [("fake", P1)], strict=False)   # no record: --version runs
    assert out["compiler"] is True and out["results"] == [
        {"key": key, "path": str(root / "entries" / key / "lib.so"), "error_string": "no error"}]
    assert tree_snapshot(root) == before
    assert _load(env, [], [("fake", P1)], strict=False)["results"][0]["key"] == key
    assert len(list((root / "index").iterdir())) == 1 and (root / "used" / key).exists()
    assert len(list((root / "toolchains").iterdir())) == 1


def test_another_toolchains_entry_is_used_only_without_a_compiler(fake_jit, tmp_path, monkeypatch):
    key_v1 = core.build_variant("fake", **P1).entry.key
    fake_jit.set_version("v2")   # this machine's compiler is not the one that built the entry
    monkeypatch.setenv("AITER_MLA_DISABLE_JIT", "1")
    core.reset_state()
    with pytest.raises(core.JitDisabledError) as ei:
        core.get_module("fake", **P1)
    msg = str(ei.value)
    assert f"is not built in {fake_jit.root} by this compiler ({fake_jit.compiler}); an entry built " \
           f"by another toolchain (nvcc at {fake_jit.compiler}: 'fake nvcc, release 13.0, v1') is " \
           f"there, which is used only where no compiler is found" in msg, msg
    _without_compiler(monkeypatch, tmp_path)
    assert core.get_module("fake", **P1).key == key_v1


def test_without_a_compiler_the_newest_verified_entry_is_taken(fake_jit, tmp_path, monkeypatch):
    v1 = core.build_variant("fake", **P1).entry
    fake_jit.set_version("v2")
    core.reset_state()
    v2 = core.build_variant("fake", **P1).entry
    assert v2.key != v1.key and v2.meta["built_at"] > v1.meta["built_at"]
    saved = _without_compiler(monkeypatch, tmp_path)
    assert core.get_module("fake", **P1).key == v2.key
    _with_compiler(monkeypatch, saved)
    fake_jit.set_version("v1")
    assert core.build_variant("fake", force=True, **P1).entry.key == v1.key   # v1 is now newest
    _without_compiler(monkeypatch, tmp_path)
    assert core.get_module("fake", **P1).key == v1.key
    _damage(v1.artifact)   # the newest is damaged: the next newest that verifies is taken
    core.reset_state()
    assert core.get_module("fake", **P1).key == v2.key
    _damage(v2.artifact)
    core.reset_state()
    with pytest.raises(core.JitDisabledError, match=r"is damaged in the cache \(artifact is \d+ bytes sha256"):
        core.get_module("fake", **P1)


def test_without_a_compiler_flags_must_match_and_the_compiler_choice_need_not(fake_jit, tmp_path, monkeypatch):
    key = core.build_variant("fake", **P1).entry.key
    _without_compiler(monkeypatch, tmp_path)
    monkeypatch.setenv("CXX", "clang++-99")   # variables that pick a compiler: its identity
    monkeypatch.setenv("NVCC_CCBIN", "/opt/gcc/bin/g++")
    assert core.get_module("fake", **P1).key == key
    monkeypatch.setenv("AITER_MLA_EXTRA_NVCC_FLAGS", "-DEXTRA=1")   # a flag: another build
    core.reset_state()
    with pytest.raises(core.JitDisabledError, match="is not built in .* by any toolchain"):
        core.get_module("fake", **P1)


def test_without_a_compiler_an_unrelated_template_edit_falls_back_to_the_rendered_source(fake_jit, tmp_path, monkeypatch):
    key = core.build_variant("fake", **P1).entry.key
    (fake_jit.templates / "common" / "unrelated.cuh").write_text("#pragma once\n#define UNRELATED 2\n")
    _without_compiler(monkeypatch, tmp_path)
    assert core.get_module("fake", **P1).key == key   # lookup id changed, rendered source did not
    (fake_jit.templates / "fake.cu.j2").write_text(FAKE_TEMPLATE + "// edited\n")
    core.reset_state()
    with pytest.raises(core.JitDisabledError, match="by any toolchain"):
        core.get_module("fake", **P1)


def test_without_a_compiler_a_rebuild_is_refused(fake_jit, tmp_path, monkeypatch):
    core.build_variant("fake", **P1)
    _without_compiler(monkeypatch, tmp_path)
    monkeypatch.setenv("AITER_REBUILD", "1")
    with pytest.raises(core.JitDisabledError, match=r"is to be rebuilt \(jit rebuild or AITER_REBUILD\)"):
        core.get_module("fake", **P1)
    monkeypatch.delenv("AITER_REBUILD")
    with pytest.raises(core.JitDisabledError, match="is to be rebuilt"):
        core.build_variant("fake", force=True, **P1)
    assert fake_jit.started() == 1


# ----- the real module


def _plain_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _JIT_VARS}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc on PATH to build the real module")
def test_real_prebuilt_cache_serves_with_nvcc_out_of_reach(jit_clean, tmp_path):
    """The image recipe of README.md: build convert_fp8 into a root from a list file, make the
    root read-only, and load from it where no nvcc can be found. The static-cudart library
    loads without a GPU (it calls the runtime only when used)."""
    root = tmp_path / "opt_aiter_mla_cache"
    lst = tmp_path / "variants.txt"
    lst.write_text("# the image's variants\nconvert_fp8 arch=sm_90a out_dtype=bf16\n")
    build = subprocess.run([sys.executable, "-m", "aiter_mla", "jit", "build", "--cache-dir", str(root),
                            "--from-file", str(lst)], env=_plain_env(), cwd=tmp_path, capture_output=True,
                           text=True, timeout=600)
    assert build.returncode == 0 and "1 of 1 ok, 0 failed" in build.stderr, build.stderr[-3000:]
    (meta,) = _metas(root)
    assert meta["manifest"]["toolchain"]["kind"] == "nvcc" and "release" in meta["manifest"]["toolchain"]["version"]
    before = tree_snapshot(root)
    env = {**_plain_env(), "AITER_MLA_CACHE_DIR": str(root), **_no_compiler(tmp_path)}
    reduce = {"arch": "sm_90a", "out_dtype": "bf16"}
    out = _load(env, [root], [("convert_fp8", {"arch": "sm_90a", "out_dtype": "bf16"}), ("mla_reduce", reduce)])
    assert out["compiler"] is False
    assert out["results"][0] == {"key": meta["key"], "path": str(root / "entries" / meta["key"] / "lib.so"),
                                 "error_string": "no error"}
    err = out["results"][1]["error"]
    assert "\n" not in err and err.startswith(
        f"AITER_MLA_DISABLE_JIT=1 and mla_reduce(arch=sm_90a, out_dtype=bf16) is not built in {root} "
        f"by any toolchain"), err
    listed = _cli_child(env, [root], "jit", "list")
    assert listed.returncode == 0, listed.stderr
    assert f"[ cached] default convert_fp8(arch=sm_90a, out_dtype=bf16) {meta['key'][:12]}" in listed.stdout
    failed = _cli_child(env, [root], "jit", "build", "mla_reduce")
    assert failed.returncode == 1 and "Traceback" not in failed.stderr
    assert "FAILED mla_reduce(arch=sm_90a, out_dtype=bf16): AITER_MLA_DISABLE_JIT=1 and" in failed.stderr
    assert tree_snapshot(root) == before


def test_lookups_never_create_a_mistyped_root(tmp_path, monkeypatch, capsys):
    """``jit list`` and a load under AITER_MLA_DISABLE_JIT=1 on a root that does not exist leave
    it absent (the compiler's remembered --version is written only inside an existing root),
    and the load's error says the folder does not exist (fresh-user trial)."""
    from aiter_mla import cli, jit

    root = tmp_path / "typo" / "cache"
    monkeypatch.setenv("AITER_MLA_CACHE_DIR", str(root))
    jit.reset_state()
    try:
        assert cli.main(["jit", "list"]) == 0
        assert cli.main(["jit", "list", "--cache-dir", str(root), "--variants"]) == 0
        monkeypatch.setenv("AITER_MLA_DISABLE_JIT", "1")
        with pytest.raises(jit.JitDisabledError, match="that folder does not exist"):
            jit.get_module("convert_fp8", arch="sm_90a", out_dtype="bf16")
    except jit.ToolchainError:
        pytest.skip("no nvcc: the load stops before the cache")
    finally:
        jit.reset_state()
    capsys.readouterr()
    assert not (tmp_path / "typo").exists()


def test_render_refuses_an_empty_output_path(capsys):
    from aiter_mla import cli

    assert cli.main(["jit", "render", "mla_reduce", "--param", "arch=sm_90a", "--param",
                     "out_dtype=bf16", "-o", ""]) == 2
    assert capsys.readouterr().err.startswith("aiter-mla jit render: error: -o: expected a file path")


def test_list_without_a_compiler_and_jit_enabled_shows_each_default_once(fake_jit, tmp_path):
    """No compiler, AITER_MLA_DISABLE_JIT unset: a default's key is unknown, and its entry that
    another toolchain built is named on the default's own row, with when it serves, instead of a
    second "extra" row (fresh-user trial)."""
    root = tmp_path / "image_cache"
    assert cli.main(["jit", "build", "--all", "--cache-dir", str(root)]) == 0
    keys = {m["params"]["n"]: m["key"] for m in _metas(root)}
    env = {**fake_jit.env, "AITER_MLA_CACHE_DIR": str(root), **_no_compiler(tmp_path)}
    del env["AITER_MLA_DISABLE_JIT"]
    listed = _cli_child(env, [root], "jit", "list")
    assert listed.returncode == 0, listed.stderr
    rows = [line for line in listed.stdout.splitlines() if "fake(arch=sm_90a, flavor=a, n=1)" in line]
    assert len(rows) == 1, listed.stdout
    assert "default" in rows[0] and f"cached as {keys[1][:12]}" in rows[0]
    assert "served with AITER_MLA_DISABLE_JIT=1 where no compiler is found" in rows[0]
    assert "extra" not in listed.stdout


@pytest.mark.parametrize("disable_jit", [True, False])
def test_list_without_a_compiler_marks_an_entry_of_other_flags(fake_jit, tmp_path, monkeypatch, disable_jit):
    """No compiler here: an entry built with other flags is not what a load takes, so it is an
    '[  other]' row, and the default's row does not claim it is served (fresh-user trial)."""
    root = tmp_path / "image_cache"
    monkeypatch.setenv("AITER_MLA_EXTRA_NVCC_FLAGS", "-DAN_IMAGE_FLAG=1")
    assert cli.main(["jit", "build", "fake", "--param", "arch=sm_90a", "--param", "n=1",
                     "--param", "flavor=a", "--cache-dir", str(root)]) == 0
    key = _metas(root)[0]["key"]
    env = {**fake_jit.env, "AITER_MLA_CACHE_DIR": str(root), **_no_compiler(tmp_path)}
    env.pop("AITER_MLA_EXTRA_NVCC_FLAGS", None)
    if not disable_jit:
        del env["AITER_MLA_DISABLE_JIT"]
    listed = _cli_child(env, [root], "jit", "list")
    assert listed.returncode == 0, listed.stderr
    rows = [line for line in listed.stdout.splitlines() if "fake(arch=sm_90a, flavor=a, n=1)" in line]
    assert len(rows) == 2, listed.stdout
    default = next(r for r in rows if "default" in r)
    assert "served with" not in default and f"cached as {key[:12]}" not in default, default
    other = next(r for r in rows if "extra" in r)
    assert f"[  other] extra   fake(arch=sm_90a, flavor=a, n=1) {key[:12]}" in other, other
    assert "built from other sources or with other flags; not loaded here" in other


def test_no_compiler_without_disable_jit_says_a_cached_build_is_there(fake_jit, tmp_path, monkeypatch):
    """A prebuilt cache on a machine without a compiler, loaded without AITER_MLA_DISABLE_JIT:
    the "no compiler" error says the variant is cached and how to load it."""
    key = core.build_variant("fake", **P1).entry.key
    _without_compiler(monkeypatch, tmp_path)
    monkeypatch.delenv("AITER_MLA_DISABLE_JIT")
    core.reset_state()
    with pytest.raises(core.ToolchainError) as ei:
        core.get_module("fake", **P1)
    msg = str(ei.value)
    assert f"is built in {fake_jit.root} (key {key[:16]}...), and AITER_MLA_DISABLE_JIT=1 loads it " \
           f"without a compiler" in msg, msg
    assert ei.value.variable == "AITER_MLA_NVCC"   # the variable that chose the missing compiler
    # a rebuild compiles: the cached entry is no way out, so no hint
    monkeypatch.setenv("AITER_REBUILD", "1")
    core.reset_state()
    with pytest.raises(core.ToolchainError) as ei:
        core.get_module("fake", **P1)
    assert "AITER_MLA_DISABLE_JIT" not in str(ei.value), str(ei.value)
    monkeypatch.delenv("AITER_REBUILD")
    with pytest.raises(core.ToolchainError) as ei:
        core.build_variant("fake", force=True, **P1)
    assert "AITER_MLA_DISABLE_JIT" not in str(ei.value), str(ei.value)
    core.reset_state()
    # a variant that is not cached: the plain error, no hint
    with pytest.raises(core.ToolchainError) as ei:
        core.get_module("fake", **P2)
    assert "AITER_MLA_DISABLE_JIT" not in str(ei.value), str(ei.value)
    monkeypatch.setenv("AITER_MLA_DISABLE_JIT", "1")
    core.reset_state()
    assert core.get_module("fake", **P1).key == key
