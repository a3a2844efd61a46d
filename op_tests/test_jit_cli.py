"""``aiter-mla info`` / ``jit ...`` / ``deps``: behaviour and exit codes (non-zero on any failure)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from aiter_mla.cli import main
from aiter_mla.jit import core
from conftest import deny_write_access

FAKE = ["--param", "arch=sm_90a", "--param", "n=3", "--param", "flavor=b"]


def test_list_then_build_one_variant(fake_jit, capsys):
    assert main(["jit", "list"]) == 0
    out = capsys.readouterr().out
    assert "fake_exp" in out and "experimental" in out
    assert "[missing] default fake(arch=sm_90a, flavor=a, n=1)" in out
    assert main(["jit", "build", "fake", *FAKE]) == 0
    assert "built  fake(arch=sm_90a, flavor=b, n=3)" in capsys.readouterr().err
    assert fake_jit.started() == 1
    assert main(["jit", "list", "--json"]) == 0
    mods = {m["module"]: m for m in json.loads(capsys.readouterr().out)["modules"]}
    extra = [v for v in mods["fake"]["variants"] if not v["default"]]
    assert extra and extra[0]["status"] == "cached" and extra[0]["params"]["n"] == 3


def test_list_marks_an_entry_this_toolchain_would_not_load(fake_jit, capsys):
    """A non-default entry built by another compiler is listed as 'other', with this
    toolchain's key for it, not as '[ cached]' (which says a load would take it)."""
    assert main(["jit", "build", "fake", *FAKE]) == 0
    fake_jit.set_version("v2")   # the same command line now reaches another compiler
    core.reset_state()
    capsys.readouterr()
    assert main(["jit", "list", "--json"]) == 0
    mods = {m["module"]: m for m in json.loads(capsys.readouterr().out)["modules"]}
    extra = [v for v in mods["fake"]["variants"] if not v["default"]]
    assert len(extra) == 1 and extra[0]["status"] == "other", extra
    key_here = core.variant_key("fake", arch="sm_90a", n=3, flavor="b")[0]
    assert key_here != extra[0]["key"] and key_here[:12] in extra[0]["note"], extra
    assert main(["jit", "list"]) == 0
    assert "[  other] extra   fake(arch=sm_90a, flavor=b, n=3)" in capsys.readouterr().out
    assert main(["jit", "build", "fake", *FAKE]) == 0   # built here too: that row is cached
    capsys.readouterr()
    assert main(["jit", "list", "--json"]) == 0
    mods = {m["module"]: m for m in json.loads(capsys.readouterr().out)["modules"]}
    assert sorted(v["status"] for v in mods["fake"]["variants"] if not v["default"]) == ["cached", "other"]


def test_list_takes_one_output_form(fake_jit, capsys):
    """--json and --variants are two output forms: asking for both is a usage error (exit 2),
    not one of them silently."""
    with pytest.raises(SystemExit) as exc:
        main(["jit", "list", "--json", "--variants"])
    assert exc.value.code == 2
    assert "argument --variants: not allowed with argument --json" in capsys.readouterr().err


def test_build_says_the_jobs_it_runs(fake_jit, capsys, monkeypatch):
    """The job count printed is the one used: at most one a variant."""
    assert main(["jit", "build", "fake", *FAKE, "-j", "100000"]) == 0
    assert "building 1 variant(s) with 1 job(s)" in capsys.readouterr().err
    monkeypatch.setenv("MAX_JOBS", "3")
    assert main(["jit", "build", "fake"]) == 0
    assert "building 2 variant(s) with 2 job(s)" in capsys.readouterr().err


def test_build_defaults_in_parallel_and_all(fake_jit, capsys, monkeypatch):
    monkeypatch.setenv("FAKE_CC_SLEEP", "0.2")
    assert main(["jit", "build", "fake", "-j", "2"]) == 0
    assert fake_jit.started() == 2
    assert "2 of 2 ok" in capsys.readouterr().err
    assert main(["jit", "build", "--all"]) == 0  # cached now; the experimental one skipped
    err = capsys.readouterr().err
    assert err.count("cached") == 2 and "fake_exp" not in err
    monkeypatch.setenv("AITER_ENABLE_EXPERIMENTAL", "1")
    assert main(["jit", "build", "--all"]) == 0
    assert "built  fake_exp" in capsys.readouterr().err


def test_build_failure_exits_nonzero_and_reports(fake_jit, capsys, monkeypatch):
    monkeypatch.setenv("FAKE_CC_MODE", "fail")
    assert main(["jit", "build", "fake"]) == 1
    err = capsys.readouterr().err
    assert "FAILED fake(arch=sm_90a, flavor=a, n=1)" in err and "0 of 2 ok, 2 failed" in err


@pytest.mark.parametrize("argv,needle", [
    (["jit", "build"], "name a MODULE"),
    (["jit", "build", "nope"], "unknown JIT module"),
    (["jit", "build", "fake", "--param", "n=99"], "allowed: 1, 2"),
    (["jit", "build", "fake", "--param", "n"], "expected NAME=VALUE"),
    (["jit", "build", "--all", "fake"], "give no MODULE"),
    (["jit", "clear"], "give a MODULE or --all"),
    (["jit", "render", "fake", "--param", "arch=sm_90a"], "missing parameter(s) n (allowed: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16), flavor (allowed: 'a', 'b')"),
    (["jit", "render", "fake"], "missing parameter(s) n (allowed: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16), flavor (allowed: 'a', 'b')"),   # arch defaults to sm_90a, as in build
    (["metadata", "--batch", "4", "--ctx", "100", "--clusters", "2000000000"], "--clusters must be in [1, 8192]"),
    (["metadata", "--batch", "3", "--ctx", "1,,2"], "--ctx has an empty item"),   # was dropped
    # more items than requests: the extras were dropped unread (fresh-user report)
    (["metadata", "--batch", "2", "--ctx", "100,200,300"], "--ctx lists 3 values for --batch 2"),
    (["metadata", "--batch", "2", "--ctx", "100", "--qlen", "1,2,3"], "--qlen lists 3 values for --batch 2"),
    (["metadata", "--batch", "100000000", "--ctx", "10"], "--batch must be in [0, 1048576]"),   # ran for minutes
    # each named by its flag, not by the scheduler's parameter (num_heads, kv_indptr, ...)
    (["metadata", "--batch", "2", "--ctx", "10", "--heads", "0"], "--heads must be >= 1, got 0"),
    (["metadata", "--batch", "2", "--ctx", "10", "--qlen", "1,0"], "--qlen must be >= 1"),
    (["metadata", "--batch", "2", "--ctx", "10", "--kv-granularity", "3"], "--kv-granularity must be a power of two"),
    (["metadata", "--batch", "2", "--ctx", "10", "--max-split-per-batch", "0"], "--max-split-per-batch must be"),
    (["metadata", "--batch", "64", "--ctx", "2000000000", "--page-size", "1"],
     "--batch 64 x --ctx '2000000000' is 128000000000 KV pages"),
    # one request past int32 (was exit 1, naming "batch 0" instead of the flag)
    (["metadata", "--batch", "1", "--ctx", "2147483648"], "--ctx must be at most 2147483647 KV tokens a request"),
    # a range past it named a random draw, not the bound given (a break test)
    (["metadata", "--batch", "2", "--ctx", "1-99999999999"],
     "--ctx must be at most 2147483647 KV tokens a request (kv_offset is int32), got HI=99999999999 in '1-99999999999'"),
    (["metadata", "--batch", "4", "--ctx", "100", "--heads", "129"], "--heads * --qlen = 129 * 1 is not supported"),
    (["metadata", "--batch", "4", "--ctx", "100", "--qlen", "1,17"], "--heads * --qlen = 128 * 17 is not supported"),
    (["deps", "fetch", "nosuch"], "'nosuch' is not pinned"),
    # a negative list reaches the flag's own check (argparse took '-1,1' for an unknown option:
    # "expected at least one argument")
    (["metadata", "--batch", "2", "--ctx", "-5,7"], "--ctx lengths must be >= 0 tokens, got '-5,7'"),
    # a list with a negative item is a list, not a malformed LO-HI range (fresh-user report)
    (["metadata", "--batch", "2", "--ctx", "10,-1"], "--ctx lengths must be >= 0 tokens, got '10,-1'"),
])
def test_bad_usage_exits_2_with_reason(fake_jit, capsys, argv, needle):
    """A wrong command line exits 2, as argparse's own errors do (a failed build exits 1)."""
    assert main(argv) == 2
    assert needle in capsys.readouterr().err


def test_a_negative_list_reaches_the_flags_own_check(capsys):
    """argparse took '-1,1' for an unknown option ("expected at least one argument")."""
    with pytest.raises(SystemExit) as exc:   # an argparse type error: its usage and exit 2
        main(["bench", "-n", "-1,1", "--compile-only"])
    assert exc.value.code == 2
    assert "argument -n/--heads-qlen: heads and qlen must be >= 1, got '-1,1'" in capsys.readouterr().err


def test_rebuild_forces_a_build_and_old_module_keeps_working(fake_jit):
    import ctypes

    m = core.get_module("fake", arch="sm_90a", n=3, flavor="b")
    assert main(["jit", "rebuild", "fake", *FAKE]) == 0
    assert fake_jit.started() == 2
    assert m.function("aiter_mla_fake_answer", [], ctypes.c_int)() == 42


def test_rebuild_takes_all_and_from_file_as_build_does(fake_jit, tmp_path, capsys):
    """`jit rebuild --all` rebuilds every default variant, `--from-file` a listed one. Before,
    rebuild required a MODULE ("the following arguments are required: module")."""
    assert main(["jit", "build", "--all"]) == 0
    assert fake_jit.started() == 2
    assert main(["jit", "rebuild", "--all"]) == 0
    assert fake_jit.started() == 4 and "2 of 2 ok" in capsys.readouterr().err
    listed = tmp_path / "variants.txt"
    listed.write_text("fake arch=sm_90a n=1 flavor=a\n")
    assert main(["jit", "rebuild", "--from-file", str(listed)]) == 0
    assert fake_jit.started() == 5
    assert main(["jit", "rebuild"]) == 2   # a usage error, as for build
    assert "name a MODULE" in capsys.readouterr().err


def test_render_to_file_needs_no_toolchain(fake_jit, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AITER_MLA_NVCC", str(tmp_path / "no-such-nvcc"))
    out = tmp_path / "out.cu"
    assert main(["jit", "render", "fake", *FAKE, "-o", str(out)]) == 0
    assert "n=3 flavor=b" in out.read_text()
    # a folder is a bad flag value (2), like bench -o FILE (a fresh-user report: it exited 1)
    assert main(["jit", "render", "fake", *FAKE, "-o", str(tmp_path)]) == 2
    assert "expected a file path, got a folder" in capsys.readouterr().err
    monkeypatch.delenv("AITER_MLA_CONFIG")
    monkeypatch.delenv("AITER_MLA_TEMPLATES_DIR")
    assert main(["jit", "render", "convert_fp8", "--param", "arch=gfx950",
                 "--param", "out_dtype=bf16"]) == 0
    via_param = capsys.readouterr().out
    assert "aiter_mla_e4m3fn_to_float" in via_param
    # --arch is --param arch=...; the two disagreeing is refused
    assert main(["jit", "render", "convert_fp8", "--arch", "gfx950", "--param", "out_dtype=bf16"]) == 0
    assert capsys.readouterr().out == via_param
    assert main(["jit", "render", "convert_fp8", "--arch", "gfx950", "--param", "arch=sm_90a",
                 "--param", "out_dtype=bf16"]) == 2
    assert "disagree" in capsys.readouterr().err


@pytest.mark.parametrize("jobs", ["0", "-3", "two"])
def test_build_jobs_must_be_positive(fake_jit, capsys, jobs):
    """jit build -j is checked by argparse (exit 2, as bench -j), not after the variants are read."""
    with pytest.raises(SystemExit) as ei:
        main(["jit", "build", "fake", "-j", jobs])
    assert ei.value.code == 2
    assert "expected a positive integer" in capsys.readouterr().err


def test_clear_module_and_gc(fake_jit, capsys):
    core.build_variant("fake", arch="sm_90a", n=1, flavor="a")
    core.build_variant("fake", arch="sm_90a", n=2, flavor="a")
    core.build_variant("fake_exp", arch="sm_90a", n=3, flavor="a")
    assert main(["jit", "clear", "fake_exp"]) == 0
    entries = list((fake_jit.root / "entries").iterdir())
    assert len(entries) == 2
    assert main(["jit", "gc", "--max-bytes", "1K"]) == 0
    assert "removed 2 entries" in capsys.readouterr().out
    assert list((fake_jit.root / "entries").iterdir()) == []
    with pytest.raises(SystemExit) as ei:  # argparse usage error
        main(["jit", "gc", "--max-bytes", "lots"])
    assert ei.value.code == 2


def test_info_text_and_json(fake_jit, capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    for needle in ("versions: aiter_mla", "toolchains:", "sm_90a", "cache:", "pin HipKittens",
                   "AITER_MLA_CACHE_DIR=", "k AITER_MLA_EXTRA_NVCC_FLAGS"):
        assert needle in out
    assert main(["info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["cache"]["root"] == str(fake_jit.root)
    assert info["toolchains"]["sm_90a"]["path"] == str(fake_jit.compiler)
    assert info["env"]["AITER_MLA_LINEINFO"]["key_changing"] is True


def test_info_reports_a_compiler_variable_that_does_not_work(fake_jit, capsys, monkeypatch, tmp_path):
    """AITER_MLA_NVCC naming no executable fails every sm_90a build; info showed it and exited 0
    with no problem line (fresh-user report). No hipcc on an NVIDIA machine is no problem."""
    missing = tmp_path / "nvcc"
    monkeypatch.setenv("AITER_MLA_NVCC", str(missing))
    core.reset_state()
    assert main(["info"]) == 1
    out = capsys.readouterr().out
    assert f"problem: sm_90a toolchain (AITER_MLA_NVCC): AITER_MLA_NVCC={str(missing)!r} is not an executable file" in out
    assert not any(line.startswith("problem: gfx") for line in out.splitlines())


@pytest.mark.parametrize("var", ["AITER_MLA_CACHE_DIR", "AITER_MLA_CONFIG", "AITER_MLA_TEMPLATES_DIR",
                                 "HIP_KITTENS_DIR"])
def test_a_path_variable_with_an_unknown_user(fake_jit, capsys, monkeypatch, var):
    """A path variable holding '~nosuchuser/x': every command failed with pathlib's bare "Could
    not determine home directory." and info printed nothing else (fresh-user report). Now info
    shows the rest and lists the variable once as a problem (exit 1), other commands fail
    (exit 1) naming it, and the Python API raises ValueError naming it."""
    from aiter_mla import env
    from aiter_mla.jit import get_module

    value = "~aiter_mla_no_such_user_x/x"
    monkeypatch.setenv(var, value)
    core.reset_state()
    assert main(["info"]) == 1
    out = capsys.readouterr().out
    want = f"environment variable {var} must be a path whose '~aiter_mla_no_such_user_x' names a user"
    assert sum(want in line for line in out.splitlines() if line.startswith("problem:")) == 1, out
    assert "cache:" in out and "toolchain" in out   # the rest of the report is there
    with pytest.raises(ValueError, match=want):
        env.get_path(var)
    assert main(["jit", "list"]) == 1
    assert want in capsys.readouterr().err
    if var != "HIP_KITTENS_DIR":
        core.reset_state()
        with pytest.raises(ValueError, match=want):
            get_module("convert_fp8", arch="sm_90a", out_dtype="bf16")


def _info_with(monkeypatch, capsys, var: str, value) -> tuple[int, list[str], str]:
    """`aiter-mla info` with ``var`` set to ``value``: (exit status, problem lines, stdout)."""
    monkeypatch.setenv(var, str(value))
    core.reset_state()
    rc = main(["info"])
    out = capsys.readouterr().out
    return rc, [line for line in out.splitlines() if line.startswith("problem:")], out


@pytest.mark.parametrize("kind", ["missing", "file", "empty"])
def test_info_reports_an_unusable_templates_folder(fake_jit, capsys, monkeypatch, tmp_path, kind):
    """AITER_MLA_TEMPLATES_DIR naming no folder, a file or a folder without the templates:
    info printed it (a file as "no such folder") and exited 0 while every build failed
    (fresh-user report). Now a problem line names it and what it lacks (exit 1)."""
    target = tmp_path / "t"
    if kind == "file":
        target.write_text("x")
    elif kind == "empty":
        target.mkdir()
    rc, problems, out = _info_with(monkeypatch, capsys, "AITER_MLA_TEMPLATES_DIR", target)
    assert rc == 1
    want = {"missing": "no such folder: every module fails to render",
            "file": "a file, not a folder: every module fails to render",
            "empty": "lacks 1 of the 1 module templates (fake.cu.j2): those modules fail to render"}[kind]
    assert problems == [f"problem: templates {target} (AITER_MLA_TEMPLATES_DIR): {want}"], out
    shown = {"missing": " (MISSING: no such folder)", "file": " (a file, not a folder)", "empty": ";"}[kind]
    assert f"templates: {target}{shown}" in out
    monkeypatch.setenv("AITER_MLA_TEMPLATES_DIR", str(fake_jit.templates))
    core.reset_state()
    assert main(["info"]) == 0, capsys.readouterr().out


def test_info_lists_every_malformed_variable(fake_jit, capsys, monkeypatch):
    """info listed only the first malformed variable (a review): with two bad path variables
    and a bad timeout, each has its problem line, and the unusable templates folder is not
    also called missing."""
    monkeypatch.setenv("AITER_MLA_CACHE_DIR", "~aiter_mla_no_such_user_x/c")
    monkeypatch.setenv("AITER_MLA_TEMPLATES_DIR", "~aiter_mla_no_such_user_x/t")
    monkeypatch.setenv("AITER_MLA_LOCK_TIMEOUT", "-1")
    core.reset_state()
    assert main(["info"]) == 1
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("problem: environment variable")]
    assert [line.split()[3] for line in lines] == ["AITER_MLA_CACHE_DIR", "AITER_MLA_LOCK_TIMEOUT",
                                                   "AITER_MLA_TEMPLATES_DIR"], out
    assert "MISSING" not in out
    # the root shown is the default one, and says so (it read just "(default)": a break test)
    assert "(default: AITER_MLA_CACHE_DIR is unusable, see problems)" in out, out
    assert main(["info", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["cache"]["origin"] == (
        "default: AITER_MLA_CACHE_DIR is unusable, see problems")
    monkeypatch.delenv("AITER_MLA_CACHE_DIR")
    core.reset_state()
    main(["info"])
    assert "(default)," in capsys.readouterr().out


def test_cache_dir_replaces_a_malformed_cache_variable(fake_jit, capsys, monkeypatch, tmp_path):
    """With a malformed AITER_MLA_CACHE_DIR in the environment, a command given --cache-dir
    failed all the same (the CLI's check of every variable, then each variant's plan, read it),
    though it reads only its own root (a break test). Any other malformed variable still fails,
    and without --cache-dir the variable is read and refused."""
    monkeypatch.setenv("AITER_MLA_CACHE_DIR", "~aiter_mla_no_such_user_x/c")
    core.reset_state()
    root = tmp_path / "r"
    build = ["jit", "build", "fake", "--param", "arch=sm_90a", "--param", "n=3", "--param", "flavor=a"]
    assert main(build + ["--cache-dir", str(root)]) == 0
    assert main(["jit", "list", "--cache-dir", str(root)]) == 0
    out = capsys.readouterr().out
    assert any(line.strip().startswith("[ cached]") and "fake(arch=sm_90a, flavor=a, n=3)" in line
               for line in out.splitlines()) and "no_such_user" not in out, out
    assert main(["jit", "list"]) == 1
    assert "AITER_MLA_CACHE_DIR must be a path" in capsys.readouterr().err
    # an OS error in the --cache-dir root: its hint read the default root (the variable, here
    # malformed: a traceback, a review) and never named --cache-dir
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "entries").write_text("x")
    assert main(["jit", "list", "--cache-dir", str(bad)]) == 1
    err = capsys.readouterr().err
    assert f"(a path in the JIT cache root {bad}, --cache-dir={bad}: it must be a writable folder)" in err, err
    assert len(err.strip().splitlines()) == 1, err
    monkeypatch.setenv("AITER_MLA_LOCK_TIMEOUT", "-1")
    assert main(["jit", "list", "--cache-dir", str(root)]) == 1
    assert "AITER_MLA_LOCK_TIMEOUT" in capsys.readouterr().err


def test_info_reports_a_compiler_that_fails_its_version_probe(fake_jit, capsys, monkeypatch, tmp_path):
    """AITER_MLA_NVCC=/bin/false (its --version fails) exited 0 after the first fix, which only
    caught "not an executable file" (a review); under AITER_MLA_DISABLE_JIT nothing is built, so
    neither it nor a read-only prebuilt AITER_MLA_CACHE_DIR is a problem."""
    failing = tmp_path / "failing-nvcc"
    failing.write_text("#!/bin/sh\necho broken >&2\nexit 3\n")
    failing.chmod(0o755)
    monkeypatch.setenv("AITER_MLA_NVCC", str(failing))
    core.reset_state()
    assert main(["info"]) == 1
    assert "problem: sm_90a toolchain (AITER_MLA_NVCC): " in capsys.readouterr().out
    monkeypatch.setenv("AITER_MLA_DISABLE_JIT", "1")
    root = tmp_path / "prebuilt"
    root.mkdir()
    monkeypatch.setenv("AITER_MLA_CACHE_DIR", str(root))
    core.reset_state()
    deny_write_access(monkeypatch, root)
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "not writable: loads only (AITER_MLA_DISABLE_JIT: nothing is built)" in out
    assert "problem:" not in out


@pytest.mark.parametrize("how", ["fails", "hangs"])
def test_a_failing_version_probe_runs_once_a_process(fake_jit, capsys, monkeypatch, tmp_path, how):
    """An nvcc whose --version hung made `jit list` pay the 30 s probe timeout once per variant
    (5.5 minutes for 11; fresh-user report). A failed or timed-out probe of one compiler
    identity is now remembered for FAILED_PROBE_TTL_S (60 s); reset_state forgets it."""
    import subprocess

    from aiter_mla.jit import toolchain

    counter = tmp_path / "probes"
    nvcc = tmp_path / "probe-nvcc"
    # the counter's path through the environment: a path named in the script is part of the
    # compiler's identity, and its growing file would make every probe a new compiler
    nvcc.write_text('#!/bin/sh\necho x >> "$PROBE_COUNTER"\necho broken >&2\nexit 3\n')
    nvcc.chmod(0o755)
    monkeypatch.setenv("PROBE_COUNTER", str(counter))
    monkeypatch.setenv("AITER_MLA_NVCC", str(nvcc))
    if how == "hangs":   # a probe that times out, without waiting 30 s for it
        real_run = subprocess.run

        def run(cmd, *args, **kwargs):
            if cmd[1:] == ["--version"] and cmd[0] == str(nvcc):
                with counter.open("a") as f:
                    f.write("x\n")
                raise subprocess.TimeoutExpired(cmd, kwargs.get("timeout"))
            return real_run(cmd, *args, **kwargs)

        monkeypatch.setattr(subprocess, "run", run)
    core.reset_state()
    for _ in range(3):
        with pytest.raises(toolchain.ToolchainError, match="--version"):
            toolchain.find_compiler("sm_90a", None)
    assert main(["jit", "list"]) in (0, 1)
    capsys.readouterr()
    assert counter.read_text().count("x") == 1
    core.reset_state()
    with pytest.raises(toolchain.ToolchainError):
        toolchain.find_compiler("sm_90a", None)
    assert counter.read_text().count("x") == 2
    # remembered for a while only: the identity does not cover the environment, and a slow
    # disk's one-off timeout must not fail a long-lived process's builds for good (a review)
    monkeypatch.setattr(toolchain, "FAILED_PROBE_TTL_S", 0.0)
    with pytest.raises(toolchain.ToolchainError):
        toolchain.find_compiler("sm_90a", None)
    assert counter.read_text().count("x") == 3


def test_a_dangling_key_link_leaves_the_other_entries_listed(fake_jit, capsys):
    """One dangling key-named link under entries/ emptied the listing, so clear and gc removed
    nothing (a review of the file-entry fix)."""
    assert main(["jit", "build", "fake", *FAKE]) == 0
    assert main(["jit", "build", "fake", "--param", "n=2", "--param", "flavor=a"]) == 0
    (fake_jit.root / "entries" / ("0" * 64)).symlink_to(fake_jit.root / "nowhere")
    capsys.readouterr()
    assert main(["jit", "clear", "--all"]) == 0
    assert "removed 3 entries" in capsys.readouterr().out
    assert list((fake_jit.root / "entries").iterdir()) == []


def test_clear_names_a_file_where_a_cache_folder_belongs(fake_jit, capsys):
    """A file named index in the root: clear said "[Errno 20] Not a directory" (a review); it
    names the path in the usual not-writable message."""
    assert main(["jit", "build", "fake", *FAKE]) == 0
    index = fake_jit.root / "index"
    shutil.rmtree(index)
    index.write_text("x")
    capsys.readouterr()
    assert main(["jit", "clear", "--all"]) == 1
    err = capsys.readouterr().err
    assert f"is not writable (Not a directory at {index};" in err, err


def test_info_reports_a_broken_config_among_the_rest(fake_jit, capsys, monkeypatch, tmp_path):
    """`info` is the diagnostic: a config without modules used to abort it with one line and
    none of the versions, toolchains or env (fresh-user report); now it shows them, then the
    problem, and exits 1."""
    bad = tmp_path / "empty.json"
    bad.write_text("{}")
    monkeypatch.setenv("AITER_MLA_CONFIG", str(bad))
    assert main(["info"]) == 1
    out = capsys.readouterr().out
    for needle in ("versions: aiter_mla", "toolchains:", "sm_90a", "cache:", "config: not loaded",
                   "k AITER_MLA_EXTRA_NVCC_FLAGS"):
        assert needle in out
    assert out.rstrip().splitlines()[-1] == "problem: jit config: <root>.modules: missing (required)"
    assert main(["info", "--json"]) == 1
    info = json.loads(capsys.readouterr().out)
    assert info["config"] is None and info["third_party"] == {}
    assert info["problems"] == ["jit config: <root>.modules: missing (required)"]


def test_module_entry_point_exit_code(fake_jit):
    ok = subprocess.run([sys.executable, "-m", "aiter_mla", "jit", "list"], env=fake_jit.env,
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run([sys.executable, "-m", "aiter_mla", "jit", "build", "nope"],
                         env=fake_jit.env, capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown JIT module" in bad.stderr


def test_readme_has_two_setup_commands_and_ci_runs_the_test_one():
    from pathlib import Path
    import re

    repo = Path(__file__).resolve().parent.parent
    readme = (repo / "README.md").read_text()
    setup = readme.split("## Set up", 1)[1]
    block = re.search(r"```bash\n(.*?)```", setup, re.S).group(1).strip().splitlines()
    assert block == ["pip install torch==2.13.0 -e '.[test]'", "python3 -m pytest -q op_tests"]
    ci = (repo / ".ci" / "run").read_text()
    assert "\npython3 -m pytest -q op_tests\n" in ci
    # CI's install is the README's (CPU torch pinned in the same command, so no bare "torch"
    # requirement is ever resolved against the index)
    assert "\npython3 -m pip install -q torch==2.13.0 -e '.[test]'\n" in ci


def test_param_given_twice_is_an_error(capsys):
    from aiter_mla.cli import main

    rc = main(["jit", "render", "convert_fp8", "--param", "arch=sm_90a", "--param",
               "arch=gfx942", "--param", "out_dtype=bf16"])
    assert rc != 0
    assert "--param arch given twice" in capsys.readouterr().err


def _list_after_damage(fake_jit, capsys, n: int, flavor: str) -> str:
    """Build fake(n, flavor) alone, truncate its library, return `jit list`'s output."""
    assert main(["jit", "build", "fake", "--param", f"n={n}", "--param", f"flavor={flavor}",
                 "--param", "arch=sm_90a"]) == 0
    capsys.readouterr()
    (lib,) = (fake_jit.root / "entries").glob("*/lib.so")
    lib.write_bytes(lib.read_bytes()[:10])
    assert main(["jit", "list"]) == 0
    return capsys.readouterr().out


def test_list_shows_a_corrupt_default_entry_once(fake_jit, capsys):
    """A damaged entry is one row marked corrupt, not a 'missing' default plus a 'cached' extra
    (new-user report)."""
    out = _list_after_damage(fake_jit, capsys, 1, "a")
    assert "[corrupt] default fake(arch=sm_90a, flavor=a, n=1)" in out
    assert "extra   fake(arch=sm_90a, flavor=a, n=1)" not in out


def test_render_dash_writes_stdout(fake_jit, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["jit", "render", "fake", *FAKE, "-o", "-"]) == 0
    assert "n=3 flavor=b" in capsys.readouterr().out
    assert not (tmp_path / "-").exists()


def test_substituted_params_skip_excluded_defaults(fake_jit, capsys):
    """--param values substituted into every default variant: a substitution that lands on an
    excluded combination is skipped with a note (not a failure); all refused is an error."""
    cfg = __import__("conftest").fake_config()
    cfg["modules"]["fake"]["exclude"] = [{"when": {"n": 2, "flavor": "b"}, "why": "not with b"}]
    fake_jit.write_config(cfg)
    assert main(["jit", "build", "fake", "--param", "flavor=b"]) == 0
    err = capsys.readouterr().err
    assert "skipped fake(arch=sm_90a, flavor=b, n=2)" in err and "not with b" in err
    assert "1 of 1 ok" in err
    assert main(["jit", "build", "fake", "--param", "flavor=b", "--param", "n=2"]) == 2   # usage: all refused
    assert "not with b" in capsys.readouterr().err


def test_substituted_params_take_an_exclusions_instead(fake_jit, capsys):
    """An exclusion that names "instead" values: a default whose substitution lands on it is
    built with those values (what mla_decode does for mainloop=score_pv defaults with
    --param mask=causal or page_size=16: tile_pairs, the loop the op picks there; they were
    skipped, so such a prebuilt cache lacked the fp8 kernels of 33-128 rows there), unless the user
    gave the parameter the instead would change."""
    cfg = __import__("conftest").fake_config()
    cfg["modules"]["fake"]["exclude"] = [{"when": {"n": 2, "flavor": "b"}, "why": "not with b",
                                          "instead": {"n": 3}}]
    fake_jit.write_config(cfg)
    assert main(["jit", "build", "fake", "--param", "flavor=b"]) == 0
    err = capsys.readouterr().err
    assert "skipped" not in err and "2 of 2 ok" in err
    assert "fake(arch=sm_90a, flavor=b, n=1)" in err and "fake(arch=sm_90a, flavor=b, n=3)" in err
    assert main(["jit", "build", "fake", "--param", "flavor=b", "--param", "n=2"]) == 2   # n given: refused
    assert "not with b" in capsys.readouterr().err
    # the real config: mla_decode's fp8 defaults at page 16 become tile_pairs, not skipped
    from aiter_mla.jit.commands import _variants
    from aiter_mla.jit.config import load_config
    from aiter_mla import paths
    import argparse
    real = load_config(paths.JIT_CONFIG_PATH)
    args = argparse.Namespace(all=False, module="mla_decode", param=["page_size=16", "mask=causal"], arch=None,
                              from_file=None)
    got = {(v["kv_dtype"], v["block_m"], v["mainloop"]) for _, v in _variants(args, real)}
    assert ("fp8", 128, "tile_pairs") in got and ("fp8", 64, "tile_pairs") in got, got
    assert not any(loop == "score_pv" for _, _, loop in got), got


def test_a_refused_default_is_noted_once(capsys):
    """Two defaults that the given values make one refused variant get one 'skipped' note (it
    was printed once per default: a fresh-user report)."""
    from aiter_mla.jit.commands import _variants
    from aiter_mla.jit.config import load_config
    from aiter_mla import paths
    import argparse
    real = load_config(paths.JIT_CONFIG_PATH)
    args = argparse.Namespace(all=False, module="mla_decode", param=["mainloop=alternating"], arch=None,
                              from_file=None)
    got = _variants(args, real)
    assert got and all(v["kv_dtype"] == "bf16" for _, v in got), got
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("skipped ")]
    assert notes and len(notes) == len(set(notes)), notes


def test_malformed_disable_jit_fails_every_command(fake_jit, monkeypatch, capsys):
    monkeypatch.setenv("AITER_MLA_DISABLE_JIT", "maybe")
    assert main(["jit", "list"]) == 1
    assert "AITER_MLA_DISABLE_JIT" in capsys.readouterr().err
    with pytest.raises(ValueError, match="AITER_MLA_DISABLE_JIT"):
        core.variant_key("fake", arch="sm_90a", n=1, flavor="a")


def test_cache_dir_that_is_a_file_is_named(fake_jit, monkeypatch, capsys, tmp_path):
    """AITER_MLA_CACHE_DIR naming a file: list fails with the OS error and the variable that
    chose the root (it printed only "[Errno 20] Not a directory"); info reports it on its cache
    line, still prints the rest, and exits 1 (a root no build can use is a problem)."""
    a_file = tmp_path / "not_a_dir"
    a_file.write_text("x")
    monkeypatch.setenv("AITER_MLA_CACHE_DIR", str(a_file))
    core.reset_state()
    assert main(["jit", "list"]) == 1
    err = capsys.readouterr().err
    assert "Not a directory" in err and f"AITER_MLA_CACHE_DIR={a_file}" in err, err
    assert main(["info"]) == 1
    out = capsys.readouterr().out
    assert f"cache: {a_file} (AITER_MLA_CACHE_DIR), unreadable: Not a directory" in out, out


def test_closed_pipe_stops_quietly(fake_jit):
    """`aiter-mla metadata ... | head -1`: the reader leaving is not an error message (141 =
    128 + SIGPIPE, what a tool killed by the signal reports)."""
    p = subprocess.Popen([sys.executable, "-m", "aiter_mla", "metadata", "--batch", "4096", "--ctx", "8192",
                          "--works"], env=fake_jit.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 141
    assert first.startswith(b"schedule:")
    assert "error" not in err and "Traceback" not in err, err


def test_module_function_follows_the_signature_asked_for(fake_jit):
    """Asking for an entry point again with another signature gives that signature (it was
    cached by symbol alone, so the first caller's argtypes silently won)."""
    import ctypes

    mod = core.get_module("fake", arch="sm_90a", n=1, flavor="a")
    a = mod.function("aiter_mla_fake_answer", [], ctypes.c_int)
    b = mod.function("aiter_mla_fake_answer", [], ctypes.c_long)
    assert a is mod.function("aiter_mla_fake_answer", [], ctypes.c_int)
    assert a.restype is ctypes.c_int and b.restype is ctypes.c_long
    assert a() == 42 and b() == 42
    with pytest.raises(TypeError):
        mod.function("aiter_mla_fake_answer", [int], ctypes.c_int)


def test_unknown_argument_gets_its_subcommands_usage(capsys):
    with pytest.raises(SystemExit) as e:
        main(["jit", "clear", "convert_fp8", "--param", "arch=sm_90a"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "usage: aiter-mla jit clear" in err and "unrecognized arguments: --param arch=sm_90a" in err


def test_an_exception_without_text_still_says_what_happened(monkeypatch, capsys):
    """A MemoryError has no message: the error line used to end after 'error: '."""
    from aiter_mla.ops import metadata_dump

    def boom(args):
        raise MemoryError()

    monkeypatch.setattr(metadata_dump, "run", boom)
    assert main(["metadata", "--batch", "1", "--ctx", "1"]) == 1
    assert "error: MemoryError (out of memory)" in capsys.readouterr().err


def test_arch_option_and_arch_param_must_agree(jit_clean, capsys):
    """--arch used to win silently over a different --param arch."""
    assert main(["jit", "build", "mla_reduce", "--arch", "sm_90a", "--param", "arch=gfx942"]) == 2
    assert "--arch sm_90a and --param arch=gfx942 disagree" in capsys.readouterr().err


def test_list_with_a_missing_template_lists_and_exits_1(fake_jit, capsys, monkeypatch, tmp_path):
    """AITER_MLA_TEMPLATES_DIR pointing nowhere: every variant is listed as unknown, and the
    exit status says it failed (it was 0)."""
    monkeypatch.setenv("AITER_MLA_TEMPLATES_DIR", str(tmp_path / "nonexistent"))
    assert main(["jit", "list"]) == 1
    out = capsys.readouterr()
    assert "template missing" in out.out
    # and says so on stderr, naming the folder and the variable (it printed nothing there)
    assert out.err.startswith("aiter-mla jit list: error: ") and str(tmp_path / "nonexistent") in out.err
    assert "(AITER_MLA_TEMPLATES_DIR)" in out.err
    assert main(["jit", "list", "--json"]) == 1
    mods = json.loads(capsys.readouterr().out)["modules"]
    assert mods and not any(m["template_exists"] for m in mods)


GFX942_DEFAULTS = sorted([
    "convert_fp8 arch=gfx942 out_dtype=bf16",
    "mla_metadata arch=gfx942",
    "mla_reduce arch=gfx942 out_dtype=bf16",
    *(f"mla_decode arch=gfx942 block_m=128 block_n=32 kv_dtype=fp8_fnuz mainloop=mfma mask={m} page_size={p} "
      f"q_dtype=fp8_fnuz" for p in (1, 64) for m in ("none", "causal")),
])


def test_list_variants_for_one_arch(jit_clean, private_cache, capsys):
    """``jit list --variants --arch A`` prints the variants ``jit build --all --arch A`` builds
    and no other arch's, so its output feeds ``--from-file`` on a machine with only that arch's
    toolchain (the fresh-user trial's full list failed on gfx950 lines). gfx942: the four decode
    variants of jit_config.json and the other kernels retargeted, written out here."""
    assert main(["jit", "list", "--variants", "--arch", "gfx942"]) == 0
    lines = [ln.split("  #")[0] for ln in capsys.readouterr().out.splitlines() if not ln.startswith("#")]
    assert sorted(lines) == GFX942_DEFAULTS
    assert main(["jit", "list", "--variants", "--arch", "sm_90a"]) == 0
    sm90 = [ln for ln in capsys.readouterr().out.splitlines() if not ln.startswith("#")]
    assert sm90 and all(" arch=sm_90a " in ln + " " for ln in sm90) and any(ln.startswith("mla_decode ") for ln in sm90)


def test_render_errors_name_the_cause(fake_jit, tmp_path, monkeypatch, capsys):
    """(new-user report) An unwritable -o named neither -o nor the path's problem beyond errno,
    and a templates folder that does not exist was answered with "set AITER_MLA_TEMPLATES_DIR"
    although it was set."""
    assert main(["jit", "render", "fake", *FAKE, "-o", str(tmp_path / "no" / "such" / "x.cu")]) == 1
    err = capsys.readouterr().err
    assert "-o " in err and "cannot write it" in err and "No such file" in err
    monkeypatch.setenv("AITER_MLA_TEMPLATES_DIR", str(tmp_path / "missing"))
    assert main(["jit", "render", "fake", *FAKE]) == 1
    assert f"AITER_MLA_TEMPLATES_DIR={tmp_path / 'missing'} is not a folder" in capsys.readouterr().err
    monkeypatch.setenv("AITER_MLA_TEMPLATES_DIR", str(tmp_path))
    assert main(["jit", "render", "fake", *FAKE]) == 1
    assert f"from AITER_MLA_TEMPLATES_DIR={tmp_path}: add the file" in capsys.readouterr().err


def test_cache_dir_that_is_a_file_is_a_usage_error(tmp_path, capsys):
    from aiter_mla.cli import main

    f = tmp_path / "not_a_folder"
    f.write_text("x")
    with pytest.raises(SystemExit) as exc:
        main(["jit", "list", "--cache-dir", str(f)])
    assert exc.value.code == 2
    assert "--cache-dir" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["list"], ["clear", "--all"], ["gc", "--max-bytes", "0"]])
def test_missing_cache_dir_is_named_by_commands_that_read_it(tmp_path, capsys, argv):
    from aiter_mla.cli import main

    missing = tmp_path / "typo"
    assert main(["jit", *argv, "--cache-dir", str(missing)]) == 0   # nothing to list or remove
    out, err = capsys.readouterr()
    assert err == f"aiter-mla jit: no cache folder at --cache-dir {str(missing)!r}\n"
    assert "removed" not in out   # not "removed 0 entries" from a folder that is not there
    assert not missing.exists()
    # under a file it can never exist: a usage error naming the file, not that note and then
    # an errno (fresh-user report), for every command that takes --cache-dir
    f = tmp_path / "a_file"
    f.write_text("x")
    for cmd in (argv, ["build", "convert_fp8"]):
        with pytest.raises(SystemExit) as exc:
            main(["jit", *cmd, "--cache-dir", str(f / "c")])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert f"which cannot be one ({f} exists and is not a folder)" in err and "Errno" not in err


@pytest.mark.parametrize("argv", [["list"], ["clear", "--all"], ["gc", "--max-bytes", "0"]])
def test_cache_dir_tilde_is_the_same_folder_for_every_command(tmp_path, monkeypatch, capsys, argv):
    """--cache-dir=~/c (the shell leaves the ~ after '=') is HOME/c for list, clear and gc as it
    is for build: they reported "no cache folder" and removed nothing (fresh-user report)."""
    from aiter_mla.cli import main

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "c").mkdir()
    assert main(["jit", *argv, "--cache-dir=~/c"]) == 0
    assert "no cache folder" not in capsys.readouterr().err
    (tmp_path / "f").write_text("x")   # ~/f is a file: a usage error, as an absolute path is
    with pytest.raises(SystemExit) as exc:
        main(["jit", *argv, "--cache-dir=~/f"])
    assert exc.value.code == 2
    assert "expected a folder, got '~/f', which is not one" in capsys.readouterr().err


def test_max_bytes_units(capsys):
    from aiter_mla.cli import main
    from aiter_mla.jit.commands import _parse_bytes

    assert [_parse_bytes(t) for t in ("500", "500B", "5M", "5MB", "5MiB", "1.5G")] == [
        500, 500, 5 << 20, 5 << 20, 5 << 20, 3 << 29]
    # one unit word at most ('5Mbbb' was 5 MiB), and ASCII digits only: int() / float() also
    # take '1_000' and full-width digits, lower() turns the Kelvin sign into 'k' (fresh-user reports)
    for bad in ("5Mbbb", "5iii", "5ib", "1_000", "\uff11\uff12", "1\u212a", "1e3", "-5", "inf", "1.5.2G"):
        with pytest.raises(SystemExit) as exc:
            main(["jit", "gc", "--max-bytes", bad])
        assert exc.value.code == 2
        assert f"{bad!r} is not a size" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["list"], ["clear", "--all"], ["gc", "--max-bytes", "0"]])
def test_commands_that_read_a_cache_create_nothing_in_an_existing_folder(tmp_path, capsys, argv):
    """`jit clear --all --cache-dir /` made entries/, locks/, ... in / (fresh-user report), and
    `jit list --cache-dir DIR` a toolchains/ in DIR: a folder that is not a cache stays as it was."""
    from aiter_mla.cli import main

    folder = tmp_path / "just_a_folder"
    folder.mkdir()
    (folder / "mine.txt").write_text("x")
    assert main(["jit", *argv, "--cache-dir", str(folder)]) == 0
    capsys.readouterr()
    assert sorted(p.name for p in folder.iterdir()) == ["mine.txt"]


def test_list_shows_a_corrupt_extra_entry_as_corrupt(fake_jit, capsys):
    """A damaged non-default entry was listed as cached (or, with no compiler, as built by
    another toolchain) instead of damaged (fresh-user report)."""
    out = _list_after_damage(fake_jit, capsys, 5, "b")
    assert "[corrupt] extra   fake(arch=sm_90a, flavor=b, n=5)" in out, out


def test_list_and_clear_survive_a_meta_json_that_is_not_an_object(fake_jit, capsys):
    """A meta.json holding a list made `jit list` and `jit clear MODULE` exit 1 with
    "'list' object has no attribute 'get'" (a review of the damage checks)."""
    assert main(["jit", "build", "fake", *FAKE]) == 0
    (meta,) = (fake_jit.root / "entries").glob("*/meta.json")
    meta.write_text("[1, 2]")
    capsys.readouterr()
    assert main(["jit", "list"]) == 0
    out = capsys.readouterr().out   # named as damaged, not left out
    assert f"1 damaged entry whose meta.json is unreadable" in out and meta.parent.name[:12] in out
    assert main(["jit", "clear", "fake"]) == 0


def test_info_reports_a_pin_folder_variable_that_does_not_work(fake_jit, capsys, monkeypatch, tmp_path):
    """HIP_KITTENS_DIR naming no folder: info showed the pin as "not available" and exited 0
    with no problem line (fresh-user report). A set variable that names no usable checkout is
    a problem (exit 1); an unset one only means the pin is not fetched yet."""
    missing = tmp_path / "no_checkout"
    assert main(["info"]) == 0
    capsys.readouterr()
    # no module builds with the pin: the variable (AITER's own, say) costs no build
    rc, problems, out = _info_with(monkeypatch, capsys, "HIP_KITTENS_DIR", missing)
    assert rc == 0 and problems == [] and "[not available; no module builds with it]" in out, out
    cfg = json.loads(fake_jit.config.read_text())
    cfg["modules"]["fake"]["third_party"] = ["HipKittens"]
    fake_jit.config.write_text(json.dumps(cfg))
    rc, problems, out = _info_with(monkeypatch, capsys, "HIP_KITTENS_DIR", missing)
    assert rc == 1 and "[not available]" in out, out
    assert problems == [f"problem: HipKittens pin (HIP_KITTENS_DIR): HIP_KITTENS_DIR={str(missing)!r} "
                        f"is not a folder"], out


def test_list_without_a_renderer_shows_what_a_load_takes(fake_jit, capsys, monkeypatch):
    """No jinja2 (a --no-deps install): a variant built here is found by its lookup id, so a
    load takes it without rendering. list called it '[unknown] ... cannot render ..., built by
    another toolchain: served with AITER_MLA_DISABLE_JIT=1 where no compiler is found', wrong on
    both counts, and exited 1 (fresh-user report). It is '[ cached]' with its key."""
    assert main(["jit", "build", "--all"]) == 0
    capsys.readouterr()
    key = core.variant_key("fake", arch="sm_90a", n=1, flavor="a")[0]

    def no_jinja2(*args, **kwargs):
        raise ImportError("No module named 'jinja2'")

    monkeypatch.setattr(core, "render", no_jinja2)
    core.reset_state()
    assert core.get_module("fake", arch="sm_90a", n=1, flavor="a").key == key   # what a load takes
    assert main(["jit", "list", "--json"]) == 0
    mods = {m["module"]: m for m in json.loads(capsys.readouterr().out)["modules"]}
    row = next(v for v in mods["fake"]["variants"] if v["default"] and v["params"]["n"] == 1)
    assert row["status"] == "cached" and row["key"] == key and not row.get("note"), row
    assert main(["jit", "list"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if " fake(" in line]
    assert rows and all(r.lstrip().startswith("[ cached]") and "another toolchain" not in r for r in rows), rows
    # where a load would render after all, list says so: AITER_REBUILD (the load rebuilds), and
    # an index naming an entry that is gone
    monkeypatch.setenv("AITER_REBUILD", "1")
    core.reset_state()
    assert main(["jit", "list"]) == 1
    assert "cannot be rendered, first fake: cannot render" in capsys.readouterr().err
    monkeypatch.delenv("AITER_REBUILD")
    entry_dirs = [d for d in fake_jit.root.rglob(key) if d.is_dir()]
    assert len(entry_dirs) == 1, entry_dirs
    shutil.rmtree(entry_dirs[0])   # the index still names it
    core.reset_state()
    with pytest.raises(ImportError, match="jinja2"):
        core.get_module("fake", arch="sm_90a", n=1, flavor="a")
    assert main(["jit", "list"]) == 1
    assert "cannot render" in capsys.readouterr().out


def test_list_fails_on_a_variant_that_cannot_be_rendered(fake_jit, capsys, monkeypatch):
    """A template that does not render (here a Jinja syntax error; on a --no-deps install, no
    jinja2): every variant showed [unknown] and list exited 0 (fresh-user report). Now it names
    the failure on stderr and exits 1; a missing toolchain stays a fact, not a failure."""
    assert main(["jit", "list"]) == 0
    capsys.readouterr()
    (fake_jit.templates / "fake.cu.j2").write_text("{% if %}\n")
    core.reset_state()
    assert main(["jit", "list"]) == 1
    captured = capsys.readouterr()
    assert "variant(s) cannot be rendered, first fake: cannot render:" in captured.err, captured.err
    assert "[unknown]" in captured.out
    # under AITER_MLA_DISABLE_JIT with a compiler found, a load whose lookup index misses (the
    # template changed) renders to find its key and fails the same way: list exited 0 there
    monkeypatch.setenv("AITER_MLA_DISABLE_JIT", "1")
    core.reset_state()
    with pytest.raises(Exception, match="template error"):
        core.get_module("fake", arch="sm_90a", n=1, flavor="a")
    assert main(["jit", "list"]) == 1
    assert "cannot be rendered" in capsys.readouterr().err


@pytest.mark.parametrize("value, shown", [("true", "0: off"), ("yes", "0: off"), ("2x", "2: on")])
def test_info_says_how_aiters_atoi_rule_reads_a_knob(fake_jit, capsys, monkeypatch, value, shown):
    """AITER_REBUILD=true is off under AITER's atoi rule (as in AITER), which a user would not
    guess (fresh-user report): info says how the value reads; a plain integer needs no note."""
    rc, problems, out = _info_with(monkeypatch, capsys, "AITER_REBUILD", value)
    assert rc == 0 and problems == []
    assert f"AITER_REBUILD={value} (AITER's atoi rule reads it as {shown})" in out, out
    rc, problems, out = _info_with(monkeypatch, capsys, "AITER_REBUILD", "1")
    assert "AITER_REBUILD=1\n" in out and "atoi rule" not in out, out


@pytest.mark.parametrize("flavor", [True, "x y"])
def test_a_library_that_matches_its_record_but_does_not_load_names_the_rebuild(fake_jit, flavor):
    """A lib.so whose checksum matches but that the loader refuses (a bad compiler, or the file
    and its record replaced together) said only the loader's reason; it now gives the rebuild
    command for that variant, shell-quoted, with bools as the CLI spells them, and the command
    works. The loads run in fresh processes: this one has the old library mapped under the
    same path, which dlopen would hand back."""
    import hashlib
    import shlex

    from conftest import fake_config

    odd = {"template": "fake.cu.j2", "params": {"arch": ["sm_90a"], "n": [1], "flavor": [True, "x y"]},
           "default_variants": [], "flags": {}, "third_party": [], "experimental": False}
    fake_jit.write_config(fake_config(fake_odd=odd))
    core.reset_state()
    child = f"""
    import ctypes
    from aiter_mla.jit import get_module
    from aiter_mla.jit.loader import ModuleLoadError
    try:
        m = get_module("fake_odd", arch="sm_90a", n=1, flavor={flavor!r})
    except ModuleLoadError as exc:
        print("ERR", exc)
    else:
        print("ANSWER", m.function("aiter_mla_fake_answer", [], ctypes.c_int)())
    """
    m = core.get_module("fake_odd", arch="sm_90a", n=1, flavor=flavor)
    entry = m.lib_path.parent
    garbage = b"\x7fELF\x01" + bytes(range(256)) * 8     # a 32-bit ELF header, then noise
    (entry / "damaged").write_bytes(garbage)
    (entry / "damaged").replace(entry / "lib.so")
    meta = json.loads((entry / "meta.json").read_text())
    meta["artifact"].update(size=len(garbage), sha256=hashlib.sha256(garbage).hexdigest())
    (entry / "meta.json").write_text(json.dumps(meta))
    out = fake_jit.run_child(child).stdout.strip()
    assert out.startswith("ERR could not load fake_odd"), out
    argv = shlex.split(out.split("; to build it again: ", 1)[1])
    assert argv[:4] == ["aiter-mla", "jit", "rebuild", "fake_odd"], argv
    assert argv[-2:] == ["--cache-dir", str(fake_jit.root)], argv
    assert main(argv[1:]) == 0
    assert fake_jit.run_child(child).stdout.strip() == "ANSWER 42"


def test_a_library_whose_dependency_is_missing_does_not_advise_a_rebuild(fake_jit, tmp_path):
    """dlopen also fails when a library the module links to is missing (hipcc builds link
    libamdhip64.so); a rebuild would fail the same way, so the advice is the library path."""
    import hashlib
    import shutil as sh
    import subprocess as sp

    cc = sh.which("cc") or sh.which("gcc") or sh.which("clang")
    if cc is None:
        pytest.skip("needs a host C compiler to link a library against a missing one")
    (tmp_path / "dep.c").write_text("int aiter_mla_dep(void) { return 1; }\n")
    (tmp_path / "mod.c").write_text("int aiter_mla_dep(void);\n"
                                    "int aiter_mla_fake_answer(void) { return 41 + aiter_mla_dep(); }\n")
    sp.run([cc, "-shared", "-fPIC", str(tmp_path / "dep.c"), "-o", str(tmp_path / "libaitermladep.so")], check=True)
    sp.run([cc, "-shared", "-fPIC", str(tmp_path / "mod.c"), "-L", str(tmp_path), "-laitermladep",
            "-o", str(tmp_path / "mod.so")], check=True)
    m = core.get_module("fake", arch="sm_90a", n=3, flavor="b")
    entry = m.lib_path.parent
    data = (tmp_path / "mod.so").read_bytes()
    (entry / "damaged").write_bytes(data)
    (entry / "damaged").replace(entry / "lib.so")
    meta = json.loads((entry / "meta.json").read_text())
    meta["artifact"].update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    (entry / "meta.json").write_text(json.dumps(meta))
    out = fake_jit.run_child("""
    from aiter_mla.jit import get_module
    from aiter_mla.jit.loader import ModuleLoadError
    try:
        get_module("fake", arch="sm_90a", n=3, flavor="b")
    except ModuleLoadError as exc:
        print("ERR", exc)
    """).stdout.strip()
    assert "libaitermladep.so: cannot open shared object file" in out, out
    assert "check LD_LIBRARY_PATH" in out and "jit rebuild" not in out, out
