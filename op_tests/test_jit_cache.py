"""The cache under concurrency and failure, with the fake compiler of conftest.py.

Each test names the public report it guards against (docs/DESIGN.md §3.8).
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from aiter_mla.jit import core
from aiter_mla.jit.cache import Cache, CacheError, CacheNotWritableError, LockTimeoutError
from aiter_mla.jit.config import ParamError
from aiter_mla.jit.toolchain import BuildError
from conftest import deny_write_access, run_read_only

P = dict(arch="sm_90a", n=1, flavor="a")

CHILD_LOAD = """
import ctypes, sys, json
from aiter_mla.jit import get_module
m = get_module("fake", arch="sm_90a", n={n}, flavor="a")
ans = m.function("aiter_mla_fake_answer", [], ctypes.c_int)()
print(json.dumps({{"key": m.key, "answer": ans, "path": str(m.lib_path)}}))
"""


def _answer(mod) -> int:
    import ctypes

    return mod.function("aiter_mla_fake_answer", [], ctypes.c_int)()


def _leftovers(root):
    """Temp files or staging folders anywhere under the cache root."""
    bad = [p for p in root.rglob("*") if p.name.endswith(".tmp")]
    staging = root / "staging"
    if staging.exists():
        bad += list(staging.iterdir())
    return bad


def test_build_load_and_warm_memo_touches_no_file(fake_jit, monkeypatch):
    m = core.get_module("fake", **P)
    assert _answer(m) == 42
    assert m.name == "fake" and m.params == {"arch": "sm_90a", "flavor": "a", "n": 1}
    assert m.lib_path.is_file() and len(m.key) == 64

    events = []
    recording = [True]

    def hook(event, args):
        if recording[0] and (event == "open" or event.startswith(("os.", "subprocess", "ctypes.dl"))):
            events.append(event)

    def no_stat(*a, **k):
        raise AssertionError("warm lookup called os.stat")

    sys.addaudithook(hook)
    monkeypatch.setattr(os, "stat", no_stat)
    try:
        for _ in range(100):
            assert core.get_module("fake", flavor="a", n=1, arch="sm_90a") is m
    finally:
        recording[0] = False
        monkeypatch.undo()
    assert events == []


@pytest.mark.parametrize("bad", [1.0, True])
def test_warm_memo_refuses_what_a_cold_call_refuses(fake_jit, bad):
    """n=1.0 and n=True equal n=1 as dict keys: a loaded n=1 must not make them pass."""
    with pytest.raises(ParamError, match="n"):
        core.get_module("fake", arch="sm_90a", n=bad, flavor="a")
    core.get_module("fake", **P)
    with pytest.raises(ParamError, match="n"):
        core.get_module("fake", arch="sm_90a", n=bad, flavor="a")


def test_in_process_lookup_within_5_microseconds(fake_jit):
    core.get_module("fake", **P)
    get = core.get_module
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(20000):
            get("fake", arch="sm_90a", n=1, flavor="a")
        best = min(best, (time.perf_counter() - t0) / 20000)
    assert best <= 5e-6, f"in-process lookup took {best * 1e6:.2f} us (budget 5 us)"


def test_eight_threads_one_variant_one_build(fake_jit, monkeypatch):
    monkeypatch.setenv("FAKE_CC_SLEEP", "0.3")
    results, errors = [], []
    barrier = threading.Barrier(8)

    def worker():
        barrier.wait()
        try:
            results.append(core.get_module("fake", **P))
        except Exception as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(results) == 8 and all(r is results[0] for r in results)
    assert fake_jit.started() == 1


def test_sixteen_cold_processes_one_variant(fake_jit):
    """triton #2688 / PR #4295, pytorch PR #92664: one build, one entry, no temp files."""
    env = {"FAKE_CC_SLEEP": "0.5"}
    procs = [fake_jit.spawn_child(CHILD_LOAD.format(n=1), env) for _ in range(16)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert {o["answer"] for o in outs} == {42}
    assert len({o["key"] for o in outs}) == 1
    assert fake_jit.started() == 1, fake_jit.builds()
    entries = list((fake_jit.root / "entries").iterdir())
    assert len(entries) == 1
    assert _leftovers(fake_jit.root) == []
    meta = json.loads((entries[0] / "meta.json").read_text())
    data = (entries[0] / "lib.so").read_bytes()
    import hashlib

    assert hashlib.sha256(data).hexdigest() == meta["artifact"]["sha256"]


def test_eight_processes_eight_variants(fake_jit):
    """flashinfer PR #2339: concurrent builds of different variants each use their own folder."""
    env = {"FAKE_CC_SLEEP": "0.3"}
    procs = [fake_jit.spawn_child(CHILD_LOAD.format(n=n), env) for n in range(1, 9)]
    keys = set()
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
        o = json.loads(out.strip().splitlines()[-1])
        assert o["answer"] == 42
        keys.add(o["key"])
    assert len(keys) == 8
    assert fake_jit.started() == 8
    assert len(list((fake_jit.root / "entries").iterdir())) == 8
    assert _leftovers(fake_jit.root) == []


def _wait_for(pred, timeout=60.0, what="condition"):
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.mark.parametrize("mode,marker", [("ok", "start"), ("half_hang", "half")])
def test_sigkilled_builder_does_not_block_next_caller(fake_jit, mode, marker):
    """pytorch #189245 (and 8 more reports): a killed lock holder wedged every later load.
    With a half-written artifact in staging (flashinfer #2010), nothing half is ever loaded."""
    a = fake_jit.spawn_child(CHILD_LOAD.format(n=1), {"FAKE_CC_SLEEP": "30" if mode == "ok" else "0",
                                                      "FAKE_CC_MODE": mode})
    try:
        _wait_for(lambda: any(ln.startswith(marker) for ln in fake_jit.builds()),
                  what="the first builder to start compiling")
    finally:
        os.killpg(a.pid, signal.SIGKILL)
        a.communicate()
    # The compiler runs in its own session (a SIGKILLed builder cannot take it down): kill the
    # fake one here so that the test leaves no process behind (half_hang sleeps 120 s).
    for line in fake_jit.builds():
        with contextlib.suppress(ProcessLookupError, ValueError, IndexError):
            os.kill(int(line.split()[1]), signal.SIGKILL)
    assert not (fake_jit.root / "entries").exists() or not list((fake_jit.root / "entries").iterdir())
    t0 = time.monotonic()
    out = fake_jit.run_child(CHILD_LOAD.format(n=1), {"AITER_MLA_LOCK_TIMEOUT": "20"}).stdout
    elapsed = time.monotonic() - t0
    assert json.loads(out.strip().splitlines()[-1])["answer"] == 42
    assert elapsed < 20 + 15, f"next caller took {elapsed:.1f} s"
    assert _leftovers(fake_jit.root) == []


def test_lock_file_naming_a_live_pid_does_not_block(fake_jit):
    """ROCm/aiter #5266: liveness judged by pid. Ours never reads the lock file's content."""
    key, _ = core.variant_key("fake", **P)
    lock = fake_jit.root / "locks" / f"{key}.lock"
    lock.parent.mkdir(parents=True)
    lock.write_text(f"{os.getpid()}\n1\n")
    t0 = time.monotonic()
    assert _answer(core.get_module("fake", **P)) == 42
    assert time.monotonic() - t0 < 10


def test_lock_wait_names_variant_and_lock_then_times_out(fake_jit, monkeypatch, caplog):
    key, _ = core.variant_key("fake", **P)
    holder = fake_jit.spawn_child(f"""
        import time
        from pathlib import Path
        from aiter_mla.jit.cache import Cache
        with Cache(Path({str(fake_jit.root)!r}), True).lock({key!r}, "test holder", timeout=5):
            print("held", flush=True)
            time.sleep(30)
    """)
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setenv("AITER_MLA_LOCK_TIMEOUT", "3")
        core.reset_state()
        with caplog.at_level("WARNING", logger="aiter_mla.jit"):
            with pytest.raises(LockTimeoutError) as ei:
                core.get_module("fake", **P)
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.communicate()
    msg = str(ei.value)
    assert "build of fake(arch=sm_90a, flavor=a, n=1)" in msg
    assert str(fake_jit.root / "locks" / f"{key}.lock") in msg
    assert f"pid {holder.pid}" in msg and "AITER_MLA_LOCK_TIMEOUT" in msg
    assert any("waiting" in r.getMessage() and "fake(arch=sm_90a" in r.getMessage()
               for r in caplog.records)
    # Once the holder is gone the same call succeeds at once.
    assert _answer(core.get_module("fake", **P)) == 42


@pytest.mark.parametrize("mode,why", [("half", "truncated"), ("crash", "exit status -9")])
def test_half_written_artifact_is_never_published(fake_jit, monkeypatch, mode, why):
    monkeypatch.setenv("FAKE_CC_MODE", mode)
    with pytest.raises(BuildError) as ei:
        core.get_module("fake", **P)
    assert why in str(ei.value)
    assert not (fake_jit.root / "entries").exists() or not list((fake_jit.root / "entries").iterdir())
    assert ei.value.source_path.is_file()  # kept for inspection under failed/
    # the message names the kept folder (the staging one is gone) and a command to paste: shell
    # words holding the kept source (it was unquoted, on the staging paths: fresh-user report)
    msg = str(ei.value)
    assert f"rendered source and build.log: {ei.value.source_path.parent}\n" in msg
    assert "staging" not in msg
    again = msg.split("command, on the kept source: ", 1)[1].splitlines()[0]
    assert str(ei.value.source_path) in shlex.split(again)
    assert str(ei.value.source_path) in ei.value.command   # the attribute too (it held the staging path)
    monkeypatch.setenv("FAKE_CC_MODE", "ok")
    core.reset_state()
    assert _answer(core.get_module("fake", **P)) == 42
    assert _leftovers(fake_jit.root) == []


@pytest.mark.parametrize("damage", ["flip_byte", "truncate", "meta_garbage", "meta_arch", "lib_is_a_folder",
                                    "meta_missing", "entry_is_a_file"])
def test_corrupt_entry_is_moved_aside_and_rebuilt(fake_jit, damage, caplog):
    """CuPy's hash-on-read: a damaged entry is detected, never loaded, and rebuilt."""
    m = core.get_module("fake", **P)
    entry = m.lib_path.parent
    lib, meta_path = entry / "lib.so", entry / "meta.json"

    def replace_lib(data: bytes):  # a new inode: this process has the old one mapped
        tmp = entry / "damaged"
        tmp.write_bytes(data)
        os.replace(tmp, lib)

    if damage == "flip_byte":
        data = bytearray(lib.read_bytes())
        data[100] ^= 0xFF
        replace_lib(bytes(data))
    elif damage == "truncate":
        replace_lib(lib.read_bytes()[:1000])
    elif damage == "meta_garbage":
        meta_path.write_text("{not json")
    elif damage == "lib_is_a_folder":   # was a bare IsADirectoryError from every load, build and list
        os.replace(lib, entry / "old_lib")
        lib.mkdir()
    elif damage == "meta_missing":      # was rebuilt without the warning every other damage gives
        meta_path.unlink()
    elif damage == "entry_is_a_file":   # was a bare NotADirectoryError from publish's rename
        shutil.rmtree(entry)
        entry.write_text("not an entry")
    else:
        meta = json.loads(meta_path.read_text())
        meta["arch"] = "gfx942"
        meta_path.write_text(json.dumps(meta))
    core.reset_state()  # as a new process would
    with caplog.at_level("WARNING", logger="aiter_mla.jit"):
        m2 = core.get_module("fake", **P)
    assert _answer(m2) == 42
    assert fake_jit.started() == 2
    assert any("corrupt" in r.getMessage() for r in caplog.records)
    assert Cache(fake_jit.root, True).read_entry(m2.key, "sm_90a").__class__.__name__ == "Entry"


def test_warm_hit_in_new_process_starts_no_subprocess(fake_jit):
    core.build_variant("fake", **P)
    out = fake_jit.run_child("""
        import sys, time, json, ctypes
        import aiter_mla.jit as jit
        def hook(event, args):
            if event in ("subprocess.Popen", "os.posix_spawn", "os.fork", "os.exec", "os.system"):
                raise RuntimeError("warm hit started a subprocess: " + event)
        sys.addaudithook(hook)
        t0 = time.perf_counter()
        m = jit.get_module("fake", arch="sm_90a", n=1, flavor="a")
        ms = (time.perf_counter() - t0) * 1e3
        print(json.dumps({"ms": ms, "answer": m.function("aiter_mla_fake_answer", [], ctypes.c_int)(),
                          "jinja": "jinja2" in sys.modules, "filelock": "filelock" in sys.modules}))
    """).stdout
    o = json.loads(out.strip().splitlines()[-1])
    assert o["answer"] == 42
    assert not o["jinja"] and not o["filelock"]  # the warm path renders nothing, locks nothing
    assert o["ms"] < 20, f"warm new-process load took {o['ms']:.1f} ms (test budget 20 ms)"
    assert fake_jit.started() == 1


def _readonly_child(fake_jit, ro_dirs, code, extra_env=None, argv=()):
    """Run ``code`` (with ``argv`` as sys.argv[1:]) in a child that sees ``ro_dirs`` read-only
    (conftest.run_read_only)."""
    env = {**fake_jit.env, **(extra_env or {})}
    return run_read_only(ro_dirs, [sys.executable, "-c", textwrap.dedent(code), *argv], env)


def test_prefilled_read_only_cache_still_loads(fake_jit):
    core.build_variant("fake", **P)
    proc = _readonly_child(fake_jit, [fake_jit.root], CHILD_LOAD.format(n=1))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["answer"] == 42
    assert fake_jit.started() == 1


def test_read_only_explicit_root_names_the_variable(fake_jit):
    fake_jit.root.mkdir()
    proc = _readonly_child(fake_jit, [fake_jit.root], CHILD_LOAD.format(n=1))
    assert proc.returncode != 0
    assert "CacheNotWritableError" in proc.stderr and "AITER_MLA_CACHE_DIR" in proc.stderr
    assert str(fake_jit.root) in proc.stderr


def _default_root_sandbox(fake_jit, tmp_path):
    """(home, tmpdir, env): the default cache root under a fresh HOME and the temp dir (the
    fallback's parent) under a fresh TMPDIR, with AITER_MLA_CACHE_DIR unset for the children."""
    home = tmp_path / "home"
    home.mkdir()
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    fake_jit.env.pop("AITER_MLA_CACHE_DIR")
    return home, tmpdir, {"HOME": str(home), "TMPDIR": str(tmpdir), "XDG_CACHE_HOME": ""}


def test_read_only_default_root_falls_back_with_warning(fake_jit, tmp_path):
    home, tmpdir, env = _default_root_sandbox(fake_jit, tmp_path)
    proc = _readonly_child(fake_jit, [home], CHILD_LOAD.format(n=1), env)
    assert proc.returncode == 0, proc.stderr
    assert "not writable" in proc.stderr and "building in" in proc.stderr
    assert list((tmpdir).glob("aiter_mla-*/entries/*/lib.so"))


def test_read_only_default_root_later_processes_find_the_fallback(fake_jit, tmp_path):
    """What one process built in the fallback root, the next finds there: no second build, no
    "building in ... instead" warning, and ``jit list`` reports it cached. Before, the fallback
    was consulted only once a process went to build, so list said [missing]."""
    home, tmpdir, env = _default_root_sandbox(fake_jit, tmp_path)
    first = _readonly_child(fake_jit, [home], CHILD_LOAD.format(n=1), env)
    assert first.returncode == 0 and "building in" in first.stderr, first.stderr
    second = _readonly_child(fake_jit, [home], CHILD_LOAD.format(n=1), env)
    assert second.returncode == 0, second.stderr
    assert "building in" not in second.stderr, second.stderr
    assert json.loads(second.stdout)["path"].startswith(str(tmpdir / f"aiter_mla-{os.getuid()}"))
    assert fake_jit.started() == 1
    listed = _readonly_child(fake_jit, [home], """
        from aiter_mla.jit import commands
        print(commands._cache_status("fake", dict(arch="sm_90a", n=1, flavor="a"))[0])
    """, env)
    assert listed.returncode == 0 and listed.stdout.strip() == "cached", (listed.stdout, listed.stderr)


def test_read_only_default_root_clear_gc_and_info_cover_the_fallback(fake_jit, tmp_path):
    """With the default root read-only, lookups and `jit list` used the per-user fallback but
    info, clear and gc did not: clear said "removed 0 entries" and left the fallback's entry."""
    home, tmpdir, env = _default_root_sandbox(fake_jit, tmp_path)
    (home / ".cache" / "aiter_mla").mkdir(parents=True)   # an existing, read-only default root
    first = _readonly_child(fake_jit, [home], CHILD_LOAD.format(n=1), env)
    assert first.returncode == 0 and "building in" in first.stderr, first.stderr
    fallback = tmpdir / f"aiter_mla-{os.getuid()}"
    assert len(list(fallback.glob("entries/*/lib.so"))) == 1
    cli = """
        import sys
        from aiter_mla.cli import main
        sys.exit(main(sys.argv[1:]))
    """
    run = lambda *argv: _readonly_child(fake_jit, [home], cli, env, argv)  # noqa: E731
    info = run("info")
    assert info.returncode == 0 and f"cache: {fallback} (per-user fallback, also read by lookups), 1 entries" in info.stdout, info.stdout
    cleared = run("jit", "clear", "--all")
    assert cleared.returncode == 0, cleared.stderr
    assert "skipped" in cleared.stdout and "not writable" in cleared.stdout
    assert "removed 1 entry" in cleared.stdout and str(fallback) in cleared.stdout, cleared.stdout
    assert not list(fallback.glob("entries/*/lib.so"))


def test_read_only_default_root_without_fallback_clear_fails(fake_jit, tmp_path):
    """Nothing writable to act on: clear and gc exit 1 naming the root (not 0 after a note)."""
    home, tmpdir, env = _default_root_sandbox(fake_jit, tmp_path)
    root = home / ".cache" / "aiter_mla"
    root.mkdir(parents=True)
    cli = """
        import sys
        from aiter_mla.cli import main
        sys.exit(main(sys.argv[1:]))
    """
    for argv in (("jit", "clear", "--all"), ("jit", "gc", "--max-bytes", "0")):
        proc = _readonly_child(fake_jit, [home], cli, env, argv)
        assert proc.returncode == 1, (proc.stdout, proc.stderr)
        assert f"JIT cache root {root} is not writable" in proc.stderr


def test_info_survives_an_unreadable_fallback_root(fake_jit, tmp_path, capsys):
    from aiter_mla.cli import main
    from aiter_mla.jit.cache import Cache

    bad = tmp_path / "fb"
    bad.mkdir()
    (bad / "entries").write_text("not a folder")
    core._get_state().caches.append(Cache(bad, explicit=False))
    assert main(["info"]) == 0
    assert f"cache: {bad} (per-user fallback, also read by lookups), unreadable: Not a directory" in capsys.readouterr().out


def test_read_only_default_root_refuses_a_shared_fallback(fake_jit, tmp_path):
    """The per-user fallback under the temp dir has a guessable path: a folder there that others
    may write to (or that another user owns) is refused, since a lib.so planted in it would be
    loaded. Before the check, a world-writable /tmp/aiter_mla-<uid> was built in and loaded from."""
    home, tmpdir, env = _default_root_sandbox(fake_jit, tmp_path)
    shared = tmpdir / f"aiter_mla-{os.getuid()}"
    shared.mkdir()
    os.chmod(shared, 0o777)
    proc = _readonly_child(fake_jit, [home], CHILD_LOAD.format(n=1), env)
    assert proc.returncode != 0
    assert "CacheNotWritableError" in proc.stderr and "not safe" in proc.stderr, proc.stderr
    assert "group or others may write" in proc.stderr and "AITER_MLA_CACHE_DIR" in proc.stderr
    assert str(shared) in proc.stderr
    assert not list(shared.glob("entries/*/lib.so"))


def test_info_names_an_unusable_fallback_as_a_problem(fake_jit, tmp_path):
    """The default root read-only and the fallback refused (others may write to it): every build
    fails, so info exits 1 with a problem naming the fallback. Before, it exited 0 with no
    problem and said "builds go to the per-user temp fallback"."""
    home, tmpdir, env = _default_root_sandbox(fake_jit, tmp_path)
    (home / ".cache" / "aiter_mla").mkdir(parents=True)   # an existing, read-only default root
    shared = tmpdir / f"aiter_mla-{os.getuid()}"
    cli = """
        import sys
        from aiter_mla.cli import main
        sys.exit(main(sys.argv[1:]))
    """
    ok = _readonly_child(fake_jit, [home], cli, env, ("info",))   # no fallback yet: it can be made
    assert ok.returncode == 0, (ok.stdout, ok.stderr)
    assert f"builds go to the per-user temp fallback {shared}" in ok.stdout, ok.stdout
    shared.mkdir()
    os.chmod(shared, 0o777)
    bad = _readonly_child(fake_jit, [home], cli, env, ("info",))
    assert bad.returncode == 1, (bad.stdout, bad.stderr)
    assert f"fallback cache root {shared}" in bad.stdout + bad.stderr
    assert "group or others may write" in bad.stdout + bad.stderr


def test_cache_not_writable_error_in_process(fake_jit, monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("AITER_MLA_CACHE_DIR", str(blocker / "cache"))  # parent is a file
    core.reset_state()
    with pytest.raises(CacheNotWritableError, match="AITER_MLA_CACHE_DIR"):
        core.get_module("fake", **P)


def test_cache_not_writable_error_names_the_blocking_subfolder(fake_jit, monkeypatch, tmp_path):
    """A file where the root's entries/ folder belongs: the error names that path, not only
    the root (it read as if the root itself were unwritable)."""
    root = tmp_path / "cache"
    root.mkdir()
    (root / "entries").write_text("x")
    monkeypatch.setenv("AITER_MLA_CACHE_DIR", str(root))
    core.reset_state()
    with pytest.raises(CacheNotWritableError, match=f"at {root / 'entries'}"):
        core.get_module("fake", **P)


def test_disable_jit_loads_built_and_names_missing(fake_jit, monkeypatch):
    core.build_variant("fake", **P)
    monkeypatch.setenv("AITER_MLA_DISABLE_JIT", "1")
    core.reset_state()
    assert _answer(core.get_module("fake", **P)) == 42
    with pytest.raises(core.JitDisabledError) as ei:
        core.get_module("fake", arch="sm_90a", n=5, flavor="b")
    msg = str(ei.value)
    assert "AITER_MLA_DISABLE_JIT=1" in msg and "fake(arch=sm_90a, flavor=b, n=5)" in msg
    assert "aiter-mla jit build fake --param arch=sm_90a --param flavor=b --param n=5" in msg
    assert fake_jit.started() == 1


def test_disable_jit_refuses_a_rebuild_as_a_rebuild(fake_jit, monkeypatch):
    """jit rebuild (and AITER_REBUILD) under AITER_MLA_DISABLE_JIT=1 with a compiler present said
    the built entry was "not built ... by this compiler"; it is refused as the rebuild it is."""
    core.build_variant("fake", **P)
    monkeypatch.setenv("AITER_MLA_DISABLE_JIT", "1")
    core.reset_state()
    with pytest.raises(core.JitDisabledError, match=r"is to be rebuilt \(jit rebuild or AITER_REBUILD\)") as ei:
        core.build_variant("fake", force=True, **P)
    assert "not built" not in str(ei.value)
    assert "rebuild it first in an environment without AITER_MLA_DISABLE_JIT (aiter-mla jit rebuild fake " \
        in str(ei.value) and "jit build" not in str(ei.value), ei.value
    monkeypatch.setenv("AITER_REBUILD", "1")
    core.reset_state()
    with pytest.raises(core.JitDisabledError, match="is to be rebuilt"):
        core.build_variant("fake", **P)
    assert fake_jit.started() == 1


def test_disable_jit_names_a_damaged_entry_as_damaged(fake_jit, monkeypatch):
    """Under AITER_MLA_DISABLE_JIT=1 a damaged entry was reported as 'not built'."""
    m = core.get_module("fake", **P)
    lib = m.lib_path
    data = bytearray(lib.read_bytes())
    data[100] ^= 0xFF
    tmp = lib.parent / "damaged"
    tmp.write_bytes(bytes(data))
    os.replace(tmp, lib)
    monkeypatch.setenv("AITER_MLA_DISABLE_JIT", "1")
    core.reset_state()
    with pytest.raises(core.JitDisabledError, match="is damaged in the cache"):
        core.get_module("fake", **P)


def test_aiter_rebuild_rebuilds_each_variant_once_per_process(fake_jit, monkeypatch):
    m_old = core.get_module("fake", **P)
    assert fake_jit.started() == 1
    monkeypatch.setenv("AITER_REBUILD", "1")
    core.reset_state()  # a new process
    m1 = core.get_module("fake", **P)
    core.get_module("fake", **P)
    core.build_variant("fake", **P)
    assert fake_jit.started() == 2  # once in this "process"
    assert _answer(m_old) == 42 and _answer(m1) == 42  # the old mapping keeps working
    core.reset_state()
    core.get_module("fake", **P)
    assert fake_jit.started() == 3
    monkeypatch.setenv("AITER_REBUILD", "0")
    core.reset_state()
    core.get_module("fake", **P)
    assert fake_jit.started() == 3


@pytest.mark.parametrize("value,included", [(None, False), ("0", False), ("", False),
                                            ("abc", False), ("1", True), ("2", True)])
def test_experimental_skipped_by_build_all_unless_enabled(fake_jit, monkeypatch, value, included):
    if value is None:
        monkeypatch.delenv("AITER_ENABLE_EXPERIMENTAL", raising=False)
    else:
        monkeypatch.setenv("AITER_ENABLE_EXPERIMENTAL", value)
    names = {name for name, _ in core.build_all()}
    assert ("fake_exp" in names) is included
    assert "fake" in names


def test_experimental_module_still_builds_on_demand(fake_jit, monkeypatch):
    monkeypatch.setenv("AITER_ENABLE_EXPERIMENTAL", "0")
    assert _answer(core.get_module("fake_exp", arch="sm_90a", n=3, flavor="a")) == 42


def test_gc_evicts_lru_never_locked(fake_jit):
    cache = Cache(fake_jit.root, True)
    keys = []
    for n in range(1, 5):
        keys.append(core.build_variant("fake", arch="sm_90a", n=n, flavor="a").entry.key)
    now = time.time()
    for age, key in zip((400, 300, 200, 100), keys):  # keys[0] is least recently used
        os.utime(fake_jit.root / "used" / key, (now - age, now - age))
    sizes = {e["key"]: e["bytes"] for e in cache.entries()}
    held = cache.try_lock(keys[0])  # a build of the oldest is in progress
    try:
        report = cache.gc(max_bytes=sizes[keys[2]] + sizes[keys[3]] + sizes[keys[0]])
    finally:
        held.release()
    assert report["skipped_locked"] == [keys[0]]
    assert report["removed"] == [keys[1]]
    left = {e["key"] for e in cache.entries()}
    assert left == {keys[0], keys[2], keys[3]}
    report = cache.gc(max_bytes=0)
    assert set(report["removed"]) == left and cache.entries() == []
    assert all((fake_jit.root / "locks" / f"{k}.lock").exists() for k in keys)  # never deleted


def test_an_entry_removed_by_another_process_is_counted_once(fake_jit, monkeypatch):
    """Two `jit gc` / `jit clear` at once reported 23 removals of 19 entries: remove_entry said
    True for an entry another process had already moved away (a break test). It now says None
    there, and gc neither counts it nor leaves its bytes in "remain"."""
    cache = Cache(fake_jit.root, True)
    keys = [core.build_variant("fake", arch="sm_90a", n=n, flavor="a").entry.key for n in (1, 2)]
    assert cache.remove_entry(keys[0]) is True
    assert cache.remove_entry(keys[0]) is None   # already gone: not this call's removal
    # gc over a listing in which keys[1] is still present, removed by "another process" first
    listing = cache.entries()
    monkeypatch.setattr(cache, "entries", lambda: listing)
    assert Cache(fake_jit.root, True).remove_entry(keys[1]) is True
    report = cache.gc(max_bytes=0)
    assert report["removed"] == [] and report["remaining_bytes"] == 0 and report["skipped_locked"] == []


def test_clear_during_build_keeps_lock_and_staging(fake_jit):
    """FlashInfer's clear-cache deletes the lock files of running builds; ours never does."""
    from aiter_mla.cli import main

    key, _ = core.variant_key("fake", **P)
    a = fake_jit.spawn_child(CHILD_LOAD.format(n=1), {"FAKE_CC_SLEEP": "3"})
    try:
        _wait_for(lambda: fake_jit.started() == 1, what="the build to start")
        staging = list((fake_jit.root / "staging").iterdir())
        assert len(staging) == 1
        assert main(["jit", "clear", "--all"]) == 0
        assert staging[0].exists()
        assert (fake_jit.root / "locks" / f"{key}.lock").exists()
        out, err = a.communicate(timeout=120)
    finally:
        if a.poll() is None:
            os.killpg(a.pid, signal.SIGKILL)
    assert a.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1])["answer"] == 42
    assert (fake_jit.root / "entries" / key / "lib.so").exists()


def test_loaded_module_keeps_working_after_clear(fake_jit):
    from aiter_mla.cli import main

    m = core.get_module("fake", **P)
    assert main(["jit", "clear", "--all"]) == 0
    assert not (fake_jit.root / "entries" / m.key).exists()
    assert _answer(m) == 42
    assert core.get_module("fake", **P) is m


def test_foreign_things_under_entries_are_left_alone(fake_jit, capsys):
    """A stray file under entries/ made list / info / gc / clear fail (iterdir on a file, blamed
    on the root's writability), and clear --all / gc deleted any folder there."""
    from aiter_mla.cli import main

    key = core.build_variant("fake", **P).entry.key
    entries = fake_jit.root / "entries"
    (entries / ".DS_Store").write_text("x")
    (entries / "my_notes").mkdir()
    (entries / "my_notes" / "n.txt").write_text("data")
    # a user's folder as the root may have its own trash/, failed/, index/ (gc and clear --all
    # deleted them)
    theirs = [fake_jit.root / "trash" / "old" / "photo", fake_jit.root / "failed" / "x" / "y",
              fake_jit.root / "index" / "notes.txt"]
    for f in theirs:
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("mine")
    assert [e["key"] for e in Cache(fake_jit.root, True).entries()] == [key]
    assert main(["jit", "list"]) == 0
    capsys.readouterr()
    assert main(["jit", "gc", "--max-bytes", "0"]) == 0
    assert "removed 1 entry (" in capsys.readouterr().out   # not "1 entries"
    assert not (entries / key).exists()
    core.build_variant("fake", **P)
    assert main(["jit", "clear", "--all"]) == 0
    assert "removed 1 entry" in capsys.readouterr().out
    assert (entries / ".DS_Store").read_text() == "x"
    assert (entries / "my_notes" / "n.txt").read_text() == "data"
    assert all(f.read_text() == "mine" for f in theirs)
    # what move_aside left in trash/ (an interrupted delete, e.g. of a third-party checkout) goes
    leftover = fake_jit.root / "trash" / f"HipKittens-{'ab' * 20}.4242.deadbeef"
    leftover.mkdir()
    assert main(["jit", "gc", "--max-bytes", "0"]) == 0
    assert not leftover.exists() and all(f.read_text() == "mine" for f in theirs)


def test_clear_all_says_it_removed_failed_builds(fake_jit, capsys):
    """clear --all deletes the kept sources and logs of failed builds (failed/<key>): its report
    said only "removed 0 entries" while they went (a fresh-user trial)."""
    from aiter_mla.cli import main

    for k in ("ab" * 32, "cd" * 32):
        d = fake_jit.root / "failed" / k
        d.mkdir(parents=True)
        (d / "build.log").write_text("error")
    assert main(["jit", "clear", "--all"]) == 0
    out = capsys.readouterr().out
    assert "removed 0 entries (0 bytes) and 2 failed builds' source and log from" in out, out
    assert not any((fake_jit.root / "failed").iterdir())
    core.build_variant("fake", **P)
    assert main(["jit", "clear", "--all"]) == 0
    assert "failed build" not in capsys.readouterr().out   # none kept: not mentioned


def test_default_root_ignores_a_relative_xdg_cache_home(monkeypatch, tmp_path):
    """XDG_CACHE_HOME=relxdg put the cache under the working folder (the spec: ignore it)."""
    from aiter_mla.jit.cache import default_root

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", "relxdg")
    assert default_root() == tmp_path / ".cache" / "aiter_mla"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_root() == tmp_path / "xdg" / "aiter_mla"


def test_default_root_ignores_a_relative_home(monkeypatch, tmp_path):
    """HOME=relhome put the default cache under the working folder, so it moved with the
    current directory (fresh-user report); like a relative XDG_CACHE_HOME it is ignored, and the
    account's home folder is used, or the per-user temp root where the uid has no account."""
    from pathlib import Path

    from aiter_mla.jit.cache import _account_home, default_root

    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", "relhome")
    assert default_root() == Path(_account_home()) / ".cache" / "aiter_mla"
    assert default_root().is_absolute()
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_root() == tmp_path / ".cache" / "aiter_mla"
    # a uid with no account (containers): the relative HOME was read back through expanduser
    import pwd

    from aiter_mla.jit.cache import fallback_root

    def no_account(uid):
        raise KeyError(uid)

    monkeypatch.setattr(pwd, "getpwuid", no_account)
    monkeypatch.setenv("HOME", "relhome")
    assert default_root() == fallback_root() and default_root().is_absolute()


def test_info_reports_a_broken_cache_root_and_writes_nothing(jit_clean, monkeypatch, tmp_path, capsys):
    """info printed only the errno for a root that is a file, and probed the compilers into a
    fresh root (creating it). An AITER_MLA_CACHE_DIR no build can use is a problem (exit 1;
    it exited 0 with no problem line: fresh-user report); one not made yet is not."""
    from aiter_mla.cli import main

    afile = tmp_path / "afile"
    afile.write_text("")
    monkeypatch.setenv("AITER_MLA_CACHE_DIR", str(afile))
    assert main(["info"]) == 1
    out = capsys.readouterr().out
    assert f"cache: {afile} (AITER_MLA_CACHE_DIR), unreadable: Not a directory" in out
    assert f"problem: cache root {afile} (AITER_MLA_CACHE_DIR): unreadable: Not a directory" in out
    assert "versions:" in out and "toolchains:" in out and "env (k = enters the cache key):" in out
    fresh = tmp_path / "fresh"
    monkeypatch.setenv("AITER_MLA_CACHE_DIR", str(fresh))
    core.reset_state()
    assert main(["info"]) == 0
    assert (f"cache: {fresh} (AITER_MLA_CACHE_DIR), 0 entries, 0 bytes; does not exist yet"
            in capsys.readouterr().out)
    assert not fresh.exists()
    # a read-only root (as root user, only a read-only mount does it: os.access stands in)
    fresh.mkdir()
    deny_write_access(monkeypatch, fresh)
    assert main(["info"]) == 1
    out = capsys.readouterr().out
    assert "0 entries, 0 bytes; not writable: builds fail (AITER_MLA_CACHE_DIR)" in out
    assert f"problem: cache root {fresh} (AITER_MLA_CACHE_DIR): not writable: builds fail" in out
    # a root not made yet under a read-only folder: said so, not "the first build makes it"
    under = fresh / "sub" / "cache"
    monkeypatch.setenv("AITER_MLA_CACHE_DIR", str(under))
    core.reset_state()
    deny_write_access(monkeypatch, fresh, any_write_bit=True)
    assert main(["info"]) == 1
    assert (f"does not exist and cannot be made ({fresh} is not writable): builds fail (AITER_MLA_CACHE_DIR)"
            in capsys.readouterr().out)


def test_a_cache_root_link_that_does_not_resolve_is_a_problem(jit_clean, monkeypatch, tmp_path, capsys):
    """A dangling AITER_MLA_CACHE_DIR link was shown as "does not exist yet" (info exit 0) while
    every build failed; a looping one made loads call the entry "damaged" (fresh-user report).
    Both are the root's problem, said as such."""
    from aiter_mla.cli import main
    from aiter_mla.paths import unmakeable_folder_reason

    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "missing")
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    for root in (dangling, loop):
        assert "is a symlink that does not resolve" in unmakeable_folder_reason(root)
        monkeypatch.setenv("AITER_MLA_CACHE_DIR", str(root))
        core.reset_state()
        assert main(["info"]) == 1, root
        out = capsys.readouterr().out
        assert f"problem: cache root {root} (AITER_MLA_CACHE_DIR): " in out, out
    assert not (tmp_path / "missing").exists()
    # the looping root's entry is absent, not damaged: the writer then names the root
    assert Cache(loop, True).read_entry("ab" * 32, "sm_90a") is None
    assert "does not resolve" in unmakeable_folder_reason(dangling / "sub")


def test_info_names_a_missing_dependency(jit_clean, monkeypatch, capsys):
    """A --no-deps install without jinja2 or filelock: info said "not importable" in its versions
    line but exited 0 (fresh-user report). Without them nothing can be built, so it is a problem,
    except under AITER_MLA_DISABLE_JIT (loads of indexed entries need neither)."""
    import sys

    from aiter_mla.cli import main

    monkeypatch.setitem(sys.modules, "jinja2", None)     # import jinja2 now raises ImportError
    monkeypatch.setitem(sys.modules, "filelock", None)
    assert main(["info"]) == 1
    out = capsys.readouterr().out
    assert "problem: jinja2 is not importable (" in out and \
        "): variants can be neither rendered nor built (pip install jinja2)" in out
    assert "problem: filelock is not importable (" in out and \
        "): variants cannot be built (pip install filelock)" in out
    monkeypatch.setenv("AITER_MLA_DISABLE_JIT", "1")
    main(["info"])
    out = capsys.readouterr().out
    assert "jinja2 not importable" in out   # still shown in the versions line
    assert "problem: jinja2" not in out and "problem: filelock" not in out


def test_staging_is_on_the_cache_filesystem(fake_jit):
    core.build_variant("fake", **P)
    assert (fake_jit.root / "staging").stat().st_dev == (fake_jit.root / "entries").stat().st_dev


def test_sigterm_during_cli_build_kills_the_compiler_and_cleans_up(fake_jit):
    """Batch schedulers and `timeout` send SIGTERM: the build must stop at once (not run the
    compiler to completion in a worker thread), exit 143 (130 is Ctrl-C) and leave no staging or
    entry; the kept failure record says the build was interrupted."""
    code = ("import sys; from aiter_mla.cli import main; "
            "sys.exit(main(['jit', 'build', 'fake', '--param', 'n=5', '--param', 'flavor=a', "
            "'--param', 'arch=sm_90a']))")
    proc = fake_jit.spawn_child(code, {"FAKE_CC_SLEEP": "30", "FAKE_CC_MODE": "ok"})
    try:
        _wait_for(lambda: any(ln.startswith("start") for ln in fake_jit.builds()),
                  what="the build to start compiling")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)
        elapsed = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 143
    assert elapsed < 10, f"SIGTERM took {elapsed:.1f} s to stop the build"
    logs = list((fake_jit.root / "failed").glob("*/build.log"))
    assert len(logs) == 1 and "interrupted" in logs[0].read_text()
    assert not any(ln.startswith("done") for ln in fake_jit.builds())
    assert _leftovers(fake_jit.root) == []
    entries = fake_jit.root / "entries"
    assert not entries.exists() or not list(entries.iterdir())


def test_an_interrupted_build_keeps_the_keys_real_failure(fake_jit, monkeypatch):
    """An interrupted build (this process killed the compiler: Ctrl-C / SIGTERM) replaced
    failed/<key>, the key's last real failure (a break test): it now keeps that record, and
    keeps its own only where there was none (test_sigterm_during_cli_build...). A compiler
    killed by anything else is a failure of its own, recorded (a review)."""
    monkeypatch.setenv("FAKE_CC_MODE", "fail")
    with pytest.raises(BuildError):
        core.build_variant("fake", arch="sm_90a", n=4, flavor="a")
    (record,) = (fake_jit.root / "failed").iterdir()
    real = (record / "build.log").read_text()
    assert "killed by signal" not in real and "something is wrong" in real
    monkeypatch.setenv("FAKE_CC_MODE", "ok")
    monkeypatch.setattr(core, "run_compiler", lambda *a, **k: (-9, "", True))   # killed by us
    with pytest.raises(BuildError, match="the build was interrupted") as ei:
        core.build_variant("fake", arch="sm_90a", n=4, flavor="a")
    assert [p.name for p in (fake_jit.root / "failed").iterdir()] == [record.name]
    assert (record / "build.log").read_text() == real
    assert ei.value.source_path == record / "source.cu" and ei.value.source_path.is_file()
    assert f"this build's log was not kept; the key's last failed build (the same source): {record}" in str(ei.value)
    assert _leftovers(fake_jit.root) == []
    # killed by something else (a crash, the out-of-memory killer): a real failure, recorded
    monkeypatch.setattr(core, "run_compiler", lambda *a, **k: (-9, "", False))
    with pytest.raises(BuildError, match="killed by signal 9: it crashed, or the system killed it") as ei:
        core.build_variant("fake", arch="sm_90a", n=4, flavor="a")
    assert "[aiter_mla] " in (record / "build.log").read_text()
    assert f"rendered source and build.log: {record}" in str(ei.value)


@pytest.mark.parametrize("errno_, raised", [(errno.ENOSPC, CacheNotWritableError), (errno.ENOENT, FileNotFoundError)])
def test_a_full_disk_is_named_and_leaves_no_staging(fake_jit, monkeypatch, errno_, raised):
    """A full disk under a build was a bare OSError ([Errno 28], no path, not one of the
    errors get_module documents) and left its staging folder (a break test). Now the staging
    folder goes, and a root that cannot take the files is CacheNotWritableError naming it;
    any other OS error passes unchanged."""
    real = Path.write_text

    def write_text(self, *a, **k):
        if self.name == "source.cu":
            raise OSError(errno_, os.strerror(errno_), str(self))
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "write_text", write_text)
    with pytest.raises(raised) as ei:
        core.build_variant("fake", arch="sm_90a", n=4, flavor="a")
    if raised is CacheNotWritableError:
        msg = str(ei.value)
        assert f"could not write into the cache root {fake_jit.root}" in msg and "source.cu" in msg, msg
        assert "No space left on device" in msg and "free space there" in msg, msg
    assert _leftovers(fake_jit.root) == []


def test_successful_build_clears_the_failure_record(fake_jit, monkeypatch):
    """failed/<key> describes the last failed build of a key; once the key builds, it is stale."""
    monkeypatch.setenv("FAKE_CC_MODE", "fail")
    with pytest.raises(Exception):
        core.build_variant("fake", arch="sm_90a", n=4, flavor="a")
    failed = fake_jit.root / "failed"
    assert len(list(failed.iterdir())) == 1
    monkeypatch.setenv("FAKE_CC_MODE", "ok")
    core.build_variant("fake", arch="sm_90a", n=4, flavor="a")
    assert list(failed.iterdir()) == []


def test_forked_child_does_not_inherit_a_held_variant_lock(fake_jit):
    """A fork while another thread builds a variant: the child's get_module of that variant
    waited forever on the thread lock copied in its held state (found by a fresh-user pass)."""
    lock = core._variant_lock(("fake", tuple(sorted(P.items()))))
    with lock:   # as a building thread holds it
        pid = os.fork()
        if pid == 0:   # the child: must build and load on its own, not hang
            code = 1
            try:
                signal.alarm(60)
                code = 0 if _answer(core.get_module("fake", **P)) == 42 else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_an_unknown_module_and_bad_argtypes_raise_named_errors(fake_jit):
    """get_module of an unknown name raised a KeyError its docstring did not list, and
    function(argtypes=None) a bare "'NoneType' object is not iterable" (a fresh-user report)."""
    import ctypes

    from aiter_mla.jit.config import UnknownModuleError

    with pytest.raises(ValueError, match="nosuch") as ei:
        core.get_module("nosuch", arch="sm_90a")
    assert isinstance(ei.value, (UnknownModuleError, KeyError))
    m = core.get_module("fake", **P)
    with pytest.raises(TypeError, match=r"function\('aiter_mla_fake_answer'\): argtypes must be a sequence of "
                                        r"ctypes types \(\[\] for none\), got None"):
        m.function("aiter_mla_fake_answer", None, ctypes.c_int)
    assert m.function("aiter_mla_fake_answer", (), ctypes.c_int)() == 42


@pytest.mark.parametrize("edit,why", [
    (lambda m: m.update(loadable=False), "loadable=False for an artifact named 'lib.so'"),
    (lambda m: m["artifact"].update(size=str(m["artifact"]["size"])), "not an integer"),
    (lambda m: [1, 2], "holds a list, not an object"),
    # "meta.json lacks string indices must be integers, not 'str'" (a fresh-user report)
    (lambda m: m.update(artifact="lib.so"), "meta.json's artifact is a str, not an object"),
    (lambda m: m["artifact"].update(name=3), "meta.json's artifact name is 3, not a string"),
    (lambda m: m.update(arch=["sm_90a"]), "built for arch ['sm_90a'], wanted sm_90a"),
])
def test_inconsistent_meta_is_damage(fake_jit, edit, why, caplog):
    """meta.json edited into something a build never writes: 'loadable' false on an nvcc
    lib.so gave a CompileOnlyError telling to install ROCm, and a string size or a list gave
    a message that named nothing (found by a fresh-user pass). Now: damage, rebuilt."""
    m = core.get_module("fake", **P)
    meta_path = m.lib_path.parent / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta = edit(meta) or meta
    meta_path.write_text(json.dumps(meta))
    got = Cache(fake_jit.root, True).read_entry(m.key, "sm_90a")
    assert got.__class__.__name__ == "Corrupt" and why in got.reason
    core.reset_state()
    with caplog.at_level("WARNING", logger="aiter_mla.jit"):
        assert _answer(core.get_module("fake", **P)) == 42
    assert fake_jit.started() == 2


def test_damaged_entry_in_a_read_only_root_says_it_is_damaged(fake_jit, monkeypatch):
    """Only 'not writable' was said, not why a build was needed."""
    m = core.get_module("fake", **P)
    meta_path = m.lib_path.parent / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["artifact"]["sha256"] = "0" * 64
    meta_path.write_text(json.dumps(meta))
    core.reset_state()

    def refuse(self, for_loads=True):
        raise CacheNotWritableError(f"JIT cache root {self.root} is not writable (test)")

    monkeypatch.setattr(Cache, "ensure_writable", refuse)
    with pytest.raises(CacheNotWritableError, match="is damaged in the cache .*must be rebuilt, "
                                                    "but JIT cache root .* is not writable"):
        core.get_module("fake", **P)


def test_a_cache_root_deleted_during_the_build_is_named(fake_jit, monkeypatch):
    """`rm -rf` of the cache root while a build ran gave a bare FileNotFoundError on the
    staging folder's build.log (a fresh-user report); the error now says what went."""
    monkeypatch.setenv("FAKE_CC_MODE", "rm_root")
    with pytest.raises(CacheError, match=r"staging folder .* disappeared during the build .*"
                                         r"\(the cache root .* was removed, or another program removed "
                                         r"the folder\); build again"):
        core.get_module("fake", **P)
    monkeypatch.setenv("FAKE_CC_MODE", "ok")
    assert _answer(core.get_module("fake", **P)) == 42   # and the next build works


def test_a_compiler_past_the_build_timeout_fails_its_build_and_frees_the_key(fake_jit, monkeypatch):
    """A hung compiler is killed at AITER_MLA_BUILD_TIMEOUT: the build fails naming the
    variable, its failure is recorded, and the next build of the key runs (the lock is free)."""
    monkeypatch.setenv("FAKE_CC_SLEEP", "60")
    monkeypatch.setenv("AITER_MLA_BUILD_TIMEOUT", "1")
    t0 = time.monotonic()
    with pytest.raises(BuildError, match="ran past AITER_MLA_BUILD_TIMEOUT and was killed") as ei:
        core.build_variant("fake", arch="sm_90a", n=6, flavor="a")
    assert time.monotonic() - t0 < 30
    assert "ran past AITER_MLA_BUILD_TIMEOUT=1 s and was killed" in str(ei.value)
    (record,) = (fake_jit.root / "failed").iterdir()
    assert "ran past AITER_MLA_BUILD_TIMEOUT=1 s" in (record / "build.log").read_text()
    monkeypatch.setenv("FAKE_CC_SLEEP", "0")
    monkeypatch.delenv("AITER_MLA_BUILD_TIMEOUT")   # the default: a loaded machine must not flake
    assert core.build_variant("fake", arch="sm_90a", n=6, flavor="a").built
    assert _leftovers(fake_jit.root) == []


# ----- fresh-user reports of 2026-12-07: damage that named nothing, or killed the process


def test_an_index_file_that_is_not_utf8_is_a_miss(fake_jit, capsys):
    """An index file holding invalid UTF-8 raised a bare UnicodeDecodeError (naming no file)
    from every build, load, ``jit clear`` and ``jit gc``; now it reads as a missing index
    entry, as text garbage already did."""
    from aiter_mla.cli import main

    core.get_module("fake", **P)
    index = list((fake_jit.root / "index").iterdir())
    assert index
    for f in index:
        f.write_bytes(b"\xff")
    assert Cache(fake_jit.root, True).read_index(index[0].name) is None
    core.reset_state()   # as a new process would
    assert _answer(core.get_module("fake", **P)) == 42
    for f in (fake_jit.root / "index").iterdir():
        f.write_bytes(b"\xff")
    assert main(["jit", "gc", "--max-bytes", "0"]) == 0
    assert main(["jit", "clear", "--all"]) == 0
    capsys.readouterr()


def test_a_truncated_library_with_a_matching_manifest_is_refused_not_mapped(fake_jit):
    """lib.so cut short with meta.json edited to match it: dlopen mapped it and the process
    died of SIGBUS (exit 135). The ELF header's own extents now show the cut before the load."""
    import hashlib

    from aiter_mla.jit.loader import elf_truncation

    m = core.get_module("fake", **P)
    assert elf_truncation(m.lib_path) is None   # an intact library passes
    data = m.lib_path.read_bytes()[:1000]
    tmp = m.lib_path.parent / "cut"
    tmp.write_bytes(data)
    os.replace(tmp, m.lib_path)
    meta_path = m.lib_path.parent / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["artifact"].update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    meta_path.write_text(json.dumps(meta))
    assert "truncated" in elf_truncation(m.lib_path)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD_LOAD.format(n=1))], env=fake_jit.env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    assert "ModuleLoadError" in proc.stderr and "truncated" in proc.stderr, proc.stderr[-2000:]
    assert "aiter-mla jit rebuild" in proc.stderr


def test_a_template_that_is_not_utf8_is_a_render_error_naming_it(fake_jit):
    """jinja2's UnicodeDecodeError named neither the template nor the variant."""
    from aiter_mla.jit.render import RenderError

    tpl = fake_jit.templates / "fake.cu.j2"
    tpl.write_bytes(tpl.read_bytes() + b"\xff")
    with pytest.raises(RenderError, match=f"template {tpl} is not UTF-8 text"):
        core.get_module("fake", **P)


@pytest.mark.parametrize("where", ["missing", "existing"])
def test_info_tries_the_cache_root_rather_than_trusting_access(fake_jit, capsys, monkeypatch, tmp_path, where):
    """For root, os.access() says yes to /proc, /sys or an immutable folder, where every mkdir
    fails: info said "does not exist yet (the first build makes it)" and exited 0 while every
    build raised CacheNotWritableError. It now makes (and removes) a probe folder there
    (mkdtemp failing with EROFS stands in for such a folder)."""
    import tempfile

    from aiter_mla.cli import main

    parent = tmp_path / "mount"
    parent.mkdir()
    target = parent / "cache" if where == "missing" else parent
    monkeypatch.setenv("AITER_MLA_CACHE_DIR", str(target))
    core.reset_state()
    assert main(["info"]) == 0   # writable: no problem, and no probe left behind
    assert list(parent.iterdir()) == []
    real = tempfile.mkdtemp

    def read_only_mount(*args, dir=None, **kw):
        if dir is not None and Path(dir) == parent:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(dir))
        return real(*args, dir=dir, **kw)

    monkeypatch.setattr(tempfile, "mkdtemp", read_only_mount)
    capsys.readouterr()
    assert main(["info"]) == 1
    out = capsys.readouterr().out
    assert f"problem: cache root {target} (AITER_MLA_CACHE_DIR)" in out, out
    assert os.strerror(errno.EROFS) in out


def test_info_names_an_unusable_fallback_behind_an_unreadable_default_root(fake_jit, tmp_path):
    """~/.cache a file, so the default root cannot be read and builds go to the fallback, which
    others may write to, so every build fails. info exited 0: the fallback was checked only
    behind a default root that read cleanly."""
    home, tmpdir, env = _default_root_sandbox(fake_jit, tmp_path)
    (home / ".cache").write_text("not a folder")
    shared = tmpdir / f"aiter_mla-{os.getuid()}"
    shared.mkdir()
    os.chmod(shared, 0o777)
    proc = subprocess.run([sys.executable, "-c", "import sys; from aiter_mla.cli import main; sys.exit(main(['info']))"],
                          env={**fake_jit.env, **env}, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert f"fallback cache root {shared} (the default root cannot be read)" in proc.stdout + proc.stderr
    assert "group or others may write" in proc.stdout + proc.stderr
    assert f"unreadable: Not a directory: builds go to the per-user temp fallback {shared}" in proc.stdout


def test_commands_that_only_read_make_no_probe_folder(fake_jit, monkeypatch, tmp_path, capsys):
    """--cache-dir is checked for every jit command: the write probe (a folder made and removed)
    is for info and bench -o only, not for list, where it touched a folder the user never named
    (the nearest existing parent of a missing root; a review)."""
    import tempfile

    from aiter_mla.cli import main

    def no_probe(*args, **kw):
        raise AssertionError(f"probe folder made: {args} {kw}")

    monkeypatch.setattr(tempfile, "mkdtemp", no_probe)
    assert main(["jit", "list", "--cache-dir", str(tmp_path / "missing" / "deeper")]) == 0
    assert main(["jit", "list", "--cache-dir", str(fake_jit.root)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        p.name for p in tmp_path.iterdir() if not p.name.startswith(".aiter_mla_probe"))
    capsys.readouterr()


def test_elf_truncation_leaves_files_without_program_headers_to_dlopen(tmp_path):
    """An object file (no program headers) was reported as "truncated: program headers end at
    byte 0"; dlopen names what is wrong with it."""
    import struct

    from aiter_mla.jit.loader import elf_truncation

    head = bytearray(64)
    head[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<HHHH", head, 0x36, 0, 0, 64, 0)   # e_phentsize 0, e_phnum 0, no sections
    obj = tmp_path / "x.o"
    obj.write_bytes(bytes(head) + b"\0" * 100)
    assert elf_truncation(obj) is None
    struct.pack_into("<Q", head, 0x20, 64)                # one program header past the end
    struct.pack_into("<HH", head, 0x36, 56, 1)
    obj.write_bytes(bytes(head) + b"\0" * 10)
    assert "program headers end at byte 120" in elf_truncation(obj)


def test_the_undecodable_template_named_is_the_one_that_failed(tmp_path):
    """With an unrelated broken .j2 in the folder, the search named the first failing file in
    sorted order, not the one jinja2 read (a review): the decoder's own bytes pick it."""
    from aiter_mla.jit.render import _undecodable

    (tmp_path / "a_backup.j2").write_bytes(b"old \xfe")
    (tmp_path / "b_included.inc.j2").write_bytes(b"inc \xff")
    main = tmp_path / "main.cu.j2"
    main.write_text("fine")
    assert _undecodable(main, tmp_path, b"inc \xff") == tmp_path / "b_included.inc.j2"
    assert _undecodable(main, tmp_path, b"gone") == tmp_path / "a_backup.j2"
