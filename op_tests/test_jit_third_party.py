"""Third-party pin (HipKittens): fetch at the pinned commit, reject a wrong checkout, redo a
killed fetch, and the pin + tree entering the key. Uses a git repository made in the test
(no network)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from aiter_mla.jit import core
from aiter_mla.jit.cache import Cache
from aiter_mla.jit.config import ThirdPartyPin
from aiter_mla.jit.third_party import MARKER, ThirdPartyError, fetch, read_git_head, resolve

GIT = shutil.which("git")
pytestmark = pytest.mark.skipif(GIT is None, reason="git is not installed")


def git(*args, cwd=None) -> str:
    return subprocess.run([GIT, "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd,
                          check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def upstream(tmp_path):
    """A repository with two commits of include/kittens.cuh; returns (path, c1, c2)."""
    repo = tmp_path / "HipKittens"
    (repo / "include").mkdir(parents=True)
    git("init", "-q", str(repo))
    (repo / "include" / "kittens.cuh").write_text("#pragma once\n#define KITTENS 1\n")
    git("add", ".", cwd=repo)
    git("commit", "-q", "-m", "one", cwd=repo)
    c1 = git("rev-parse", "HEAD", cwd=repo)
    (repo / "include" / "kittens.cuh").write_text("#pragma once\n#define KITTENS 2\n")
    git("commit", "-q", "-am", "two", cwd=repo)
    c2 = git("rev-parse", "HEAD", cwd=repo)
    return repo, c1, c2


def test_fetch_pins_commit_and_is_idempotent(upstream, tmp_path, jit_clean, monkeypatch):
    repo, c1, _ = upstream
    cache = Cache(tmp_path / "cache", True)
    pin = ThirdPartyPin("HipKittens", str(repo), c1)
    co = fetch(pin, cache)
    assert co.commit == c1 and read_git_head(co.path) == c1
    assert (co.include_dir / "kittens.cuh").read_text().endswith("KITTENS 1\n")
    marker = json.loads((co.path / MARKER).read_text())
    assert marker["commit"] == c1 and marker["tree_sha256"] == co.tree_sha256
    assert list((cache.root / "staging").iterdir()) == []
    # A complete copy is reused without running git again.
    broken_git = tmp_path / "git-broken"
    broken_git.write_text("#!/bin/sh\nexit 99\n")
    broken_git.chmod(0o755)
    monkeypatch.setenv("AITER_MLA_GIT", str(broken_git))
    assert resolve(pin, cache, allow_fetch=True).path == co.path
    assert fetch(pin, cache).tree_sha256 == co.tree_sha256


def test_wrong_commit_checkout_is_rejected(upstream, tmp_path, jit_clean, monkeypatch):
    repo, c1, c2 = upstream  # repo's HEAD is c2
    monkeypatch.setenv("HIP_KITTENS_DIR", str(repo))
    with pytest.raises(ThirdPartyError) as ei:
        resolve(ThirdPartyPin("HipKittens", str(repo), c1), Cache(tmp_path / "c", True), True)
    msg = str(ei.value)
    assert c1 in msg and c2 in msg and "HIP_KITTENS_DIR" in msg
    co = resolve(ThirdPartyPin("HipKittens", str(repo), c2), Cache(tmp_path / "c", True), False)
    assert co.origin == "HIP_KITTENS_DIR" and co.commit == c2


def test_folder_that_is_no_checkout_is_named_so(upstream, tmp_path, jit_clean, monkeypatch):
    """HIP_KITTENS_DIR at a plain folder said 'is at commit None'."""
    repo, c1, _ = upstream
    plain = tmp_path / "plain"
    plain.mkdir()
    monkeypatch.setenv("HIP_KITTENS_DIR", str(plain))
    with pytest.raises(ThirdPartyError, match=f"HIP_KITTENS_DIR={plain} is not a git checkout .*{c1}") as ei:
        resolve(ThirdPartyPin("HipKittens", str(repo), c1), Cache(tmp_path / "c", True), True)
    assert "None" not in str(ei.value)


def test_read_git_head_without_git(upstream):
    repo, _, c2 = upstream
    assert read_git_head(repo) == c2
    git("pack-refs", "--all", cwd=repo)  # the ref now lives in packed-refs
    assert read_git_head(repo) == c2
    git("checkout", "-q", "--detach", "HEAD~1", cwd=repo)
    assert read_git_head(repo) == git("rev-parse", "HEAD", cwd=repo)


def test_killed_fetch_is_detected_and_redone(upstream, tmp_path, jit_clean):
    repo, c1, _ = upstream
    root = tmp_path / "cache"
    flag = tmp_path / "checkout-started"
    slow_git = tmp_path / "git-slow"
    slow_git.write_text(f"""#!/bin/sh
for a in "$@"; do
  if [ "$a" = "checkout" ]; then touch {flag}; sleep 60; fi
done
exec {GIT} "$@"
""")
    slow_git.chmod(0o755)
    code = (f"from pathlib import Path\nfrom aiter_mla.jit.cache import Cache\n"
            f"from aiter_mla.jit.config import ThirdPartyPin\n"
            f"from aiter_mla.jit.third_party import fetch\n"
            f"fetch(ThirdPartyPin('HipKittens', {str(repo)!r}, {c1!r}), Cache(Path({str(root)!r}), True))\n")
    env = {**os.environ, "AITER_MLA_GIT": str(slow_git),
           "PYTHONPATH": str(os.path.dirname(os.path.dirname(__file__)))}
    child = subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        t0 = time.monotonic()
        while not flag.exists():
            assert child.poll() is None, child.communicate()
            assert time.monotonic() - t0 < 60
            time.sleep(0.05)
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
    cache = Cache(root, True)
    assert list((root / "staging").iterdir())  # the killed fetch's half clone
    pin = ThirdPartyPin("HipKittens", str(repo), c1)
    with pytest.raises(ThirdPartyError, match="not fetched"):
        resolve(pin, cache, allow_fetch=False)
    co = fetch(pin, cache)
    assert read_git_head(co.path) == c1
    assert list((root / "staging").iterdir()) == []


def test_incomplete_checkout_folder_is_refetched(upstream, tmp_path, jit_clean):
    """AITER clones only when the folder is missing, so a half clone is never repaired."""
    repo, c1, _ = upstream
    cache = Cache(tmp_path / "cache", True)
    pin = ThirdPartyPin("HipKittens", str(repo), c1)
    half = cache.third_party_dir / f"HipKittens-{c1}"
    (half / "include").mkdir(parents=True)
    (half / "include" / "kittens.cuh").write_text("#pragma once\n#define KITT")
    with pytest.raises(ThirdPartyError, match="incomplete"):
        resolve(pin, cache, allow_fetch=False)
    co = resolve(pin, cache, allow_fetch=True)
    assert (co.include_dir / "kittens.cuh").read_text().endswith("KITTENS 1\n")


def _hk_config(repo, commit):
    from conftest import fake_config

    cfg = fake_config(fake_hk={
        "template": "fake.cu.j2",
        "params": {"arch": ["sm_90a"], "n": [1], "flavor": ["a"]},
        "default_variants": [],
        "flags": {},
        "third_party": ["HipKittens"],
        "experimental": False,
    })
    cfg["third_party"]["HipKittens"] = {"url": str(repo), "commit": commit}
    return cfg


def test_pin_and_tree_enter_the_key(upstream, fake_jit, monkeypatch):
    repo, c1, c2 = upstream
    P = dict(arch="sm_90a", n=1, flavor="a")
    fake_jit.write_config(_hk_config(repo, c2))
    monkeypatch.setenv("HIP_KITTENS_DIR", str(repo))
    core.reset_state()
    k2, m2 = core.variant_key("fake_hk", **P)
    assert m2["third_party"]["HipKittens"]["commit"] == c2
    plain, _ = core.variant_key("fake", **P)  # a module without the pin is unaffected
    # Another pin (and the checkout moved to it): new key.
    git("checkout", "-q", "--detach", c1, cwd=repo)
    fake_jit.write_config(_hk_config(repo, c1))
    core.reset_state()
    k1, _ = core.variant_key("fake_hk", **P)
    assert k1 != k2
    assert core.variant_key("fake", **P)[0] == plain
    # One byte of a header inside the pinned tree: new key.
    (repo / "include" / "kittens.cuh").write_text("#pragma once\n#define KITTENS 9\n")
    core.reset_state()
    assert core.variant_key("fake_hk", **P)[0] not in (k1, k2)
    # The library's include folder reaches the compiler.
    r = core.build_variant("fake_hk", **P)
    assert f"-I{repo / 'include'}" in r.entry.meta["command"]


def test_deps_fetch_cli(upstream, fake_jit, capsys):
    from aiter_mla.cli import main

    repo, c1, _ = upstream
    fake_jit.write_config(_hk_config(repo, c1))
    assert main(["deps", "fetch"]) == 0
    assert c1 in capsys.readouterr().out
    assert main(["deps", "fetch", "NoSuchLib"]) == 2   # a name that is not pinned: a usage error


def test_deps_fetch_rehashes_the_cached_checkout(upstream, fake_jit, capsys):
    """A file of the cached checkout edited after its fetch: lookups trust the marker's tree
    hash, and 'deps fetch' said "verified" for the edited copy (a break test). It hashes the
    files again now: the edited copy is fetched again, with the pinned content."""
    from aiter_mla.cli import main

    repo, c1, _ = upstream
    fake_jit.write_config(_hk_config(repo, c1))
    assert main(["deps", "fetch"]) == 0
    first = capsys.readouterr().out
    assert "verified" in first and "changed since its fetch" not in first
    header = next(p for p in (core._get_state().cache.root / "third_party").rglob("kittens.cuh"))
    header.write_text("#pragma once\n#define KITTENS 7\n")
    assert main(["deps", "fetch"]) == 0
    out = capsys.readouterr().out
    assert "changed since its fetch; it was removed and fetched again" in out and "verified" in out
    assert header.read_text().endswith("KITTENS 1\n")
    assert main(["deps", "fetch"]) == 0   # now intact: verified, not fetched again
    assert "changed since its fetch" not in capsys.readouterr().out


def test_aiter_mla_git_that_is_no_executable_is_named(monkeypatch, tmp_path):
    """AITER_MLA_GIT naming a missing or non-executable file is refused naming the variable
    (it raised a bare [Errno 2] / [Errno 13])."""
    from aiter_mla.jit.third_party import _git

    plain = tmp_path / "git.txt"
    plain.write_text("not a program")
    for value in (str(tmp_path / "nowhere"), str(plain)):
        monkeypatch.setenv("AITER_MLA_GIT", value)
        with pytest.raises(ThirdPartyError, match=f"AITER_MLA_GIT={value!r} is not an executable file"):
            _git()
