"""Pinned third-party header libraries (HipKittens, AITER PR #3072's pin).

``aiter-mla deps fetch`` clones the pinned commit into ``<cache>/third_party/<name>-<commit>``:
clone into staging, check out the commit, verify ``HEAD == pin``, write a completion marker
(commit + tree hash) last, publish with one rename, all under a per-pin lock. A folder without
a valid marker (a killed fetch) is moved aside and fetched again. AITER clones only when the
folder is missing, so a half-clone is never repaired and another commit is used silently.

``HIP_KITTENS_DIR`` may point at an existing checkout instead; its HEAD is read from ``.git``
(no subprocess) and must equal the pin; its tree is hashed once per process, so edits to it
take effect in the next process. The pin and the tree hash enter the cache key of every module
that lists the library in its ``third_party``.
"""
from __future__ import annotations

import hashlib
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from .. import env
from .cache import Cache
from .config import ThirdPartyPin
from .key import tree_digest

#: Env var that may name an existing checkout, per library (AITER's names).
ENV_DIRS = {"HipKittens": "HIP_KITTENS_DIR"}
MARKER = ".aiter_mla_complete"
_HEX40 = re.compile(r"^[0-9a-f]{40}$")


class ThirdPartyError(RuntimeError):
    """A pinned library is missing, incomplete, or at another commit."""


@dataclass(frozen=True)
class Checkout:
    """A verified checkout of a pin."""

    name: str
    path: Path
    commit: str
    tree_sha256: str
    origin: str  # "HIP_KITTENS_DIR" or "cache"

    @property
    def include_dir(self) -> Path:
        inc = self.path / "include"
        return inc if inc.is_dir() else self.path

    def key_item(self) -> dict[str, str]:
        return {"commit": self.commit, "tree_sha256": self.tree_sha256}


def read_git_head(repo: Path) -> str | None:
    """The commit checked out in ``repo``, read from ``.git`` files (no git process);
    None when it cannot be read that way."""
    gitdir = repo / ".git"
    try:
        if gitdir.is_file():  # worktree or submodule: "gitdir: <path>"
            text = gitdir.read_text().strip()
            if not text.startswith("gitdir:"):
                return None
            gitdir = (repo / text[len("gitdir:"):].strip()).resolve()
        head = (gitdir / "HEAD").read_text().strip()
    except (OSError, ValueError):   # ValueError: not UTF-8
        return None
    if _HEX40.match(head):
        return head
    if not head.startswith("ref:"):
        return None
    ref = head[4:].strip()
    common = gitdir
    try:
        common = (gitdir / (gitdir / "commondir").read_text().strip()).resolve()
    except (OSError, ValueError):
        pass
    for base in (gitdir, common):
        try:
            value = (base / ref).read_text().strip()
            if _HEX40.match(value):
                return value
        except (OSError, ValueError):
            pass
        try:
            for line in (base / "packed-refs").read_text().splitlines():
                parts = line.split()
                if len(parts) == 2 and parts[1] == ref and _HEX40.match(parts[0]):
                    return parts[0]
        except (OSError, ValueError):
            pass
    return None


def _lock_key(pin: ThirdPartyPin) -> str:
    return hashlib.sha256(f"third_party:{pin.name}:{pin.commit}".encode()).hexdigest()


def cache_checkout_dir(pin: ThirdPartyPin, cache: Cache) -> Path:
    return cache.third_party_dir / f"{pin.name}-{pin.commit}"


def _read_marker(path: Path, pin: ThirdPartyPin) -> dict | None:
    try:
        marker = json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if marker.get("commit") != pin.commit or not isinstance(marker.get("tree_sha256"), str):
        return None
    return marker


_env_trees: dict[tuple, str] = {}


def resolve(pin: ThirdPartyPin, cache: Cache, allow_fetch: bool) -> Checkout:
    """The verified checkout of ``pin``: ``HIP_KITTENS_DIR`` (or the library's variable) when
    set, else the cache's fetched copy, fetched now when missing or incomplete and
    ``allow_fetch``. Raises :class:`ThirdPartyError` saying what to do."""
    var = ENV_DIRS.get(pin.name)
    given = (env.get(var) or "").strip() if var else None   # as get_path reads it
    if given:
        path = env.get_path(var).resolve()
        if not path.is_dir():
            raise ThirdPartyError(f"{var}={given!r} is not a folder")
        head = read_git_head(path) or _git_rev_parse(path)
        if head is None:
            raise ThirdPartyError(
                f"{var}={given} is not a git checkout (no commit could be read there), but "
                f"jit_config.json pins {pin.name} at {pin.commit}: point {var} at a clone of "
                f"{pin.url} checked out at that commit, or unset {var} to use 'aiter-mla deps fetch'"
            )
        if head != pin.commit:
            raise ThirdPartyError(
                f"{var}={given} is at commit {head}, but jit_config.json pins {pin.name} at "
                f"{pin.commit}: check that commit out there (git -C {path} checkout "
                f"{pin.commit}), or unset {var} to use 'aiter-mla deps fetch'"
            )
        stamp = (str(path), head)
        tree = _env_trees.get(stamp)
        if tree is None:
            tree = _env_trees[stamp] = tree_digest(path)
        return Checkout(pin.name, path, head, tree, var)
    path = cache_checkout_dir(pin, cache)
    marker = _read_marker(path, pin)
    if marker is not None:
        return Checkout(pin.name, path, pin.commit, marker["tree_sha256"], "cache")
    if not allow_fetch:
        state = "is incomplete (an interrupted fetch?)" if path.exists() else "is not fetched"
        raise ThirdPartyError(
            f"{pin.name} at {pin.commit} {state} in {path}: run 'aiter-mla deps fetch "
            f"{pin.name}'" + (f" or set {var} to a checkout of that commit" if var else "")
        )
    return fetch(pin, cache)


def fetch_verified(pin: ThirdPartyPin, cache: Cache) -> tuple[Checkout, bool]:
    """``aiter-mla deps fetch``: :func:`resolve` (fetching when missing), and for the cache's
    copy its files hashed again against the marker's tree hash, which :func:`resolve` trusts
    (hashing a checkout on every process's first lookup would cost more than the lookup). A
    copy whose files changed after its fetch is removed (its edits are lost) and fetched
    again. Returns the checkout and whether it was fetched again. Raises
    :class:`ThirdPartyError`."""
    co = resolve(pin, cache, allow_fetch=True)
    if co.origin != "cache" or tree_digest(co.path, skip_files=(MARKER,)) == co.tree_sha256:
        return co, False
    with cache.lock(_lock_key(pin), f"fetch of {pin.name} at {pin.commit}"):
        marker = _read_marker(co.path, pin)
        if marker is not None and tree_digest(co.path, skip_files=(MARKER,)) != marker["tree_sha256"]:
            cache.move_aside(co.path)   # edited since its fetch: removed (through trash/)
    return fetch(pin, cache), True


def _git() -> str:
    from .toolchain import ToolchainError, explicit_tool

    try:
        git = explicit_tool("AITER_MLA_GIT")   # a path or a name on PATH, checked as the compilers'
    except ToolchainError as exc:
        raise ThirdPartyError(str(exc)) from None
    git = git or shutil.which("git")
    if not git:
        raise ThirdPartyError("git not found: install git (apt-get install git) or set AITER_MLA_GIT")
    return git


def _run_git(args: list[str], cwd: Path | None = None) -> str:
    import subprocess

    cmd = [_git(), "-c", "advice.detachedHead=false", *args]
    proc = subprocess.run(cmd, cwd=str(cwd) if cwd else None, capture_output=True, text=True,
                          env=env.child_environ(GIT_TERMINAL_PROMPT="0"))
    if proc.returncode != 0:
        raise ThirdPartyError(f"{' '.join(cmd)} failed ({proc.returncode}): "
                              f"{(proc.stderr or proc.stdout).strip()[-1500:]}")
    return proc.stdout


def _git_rev_parse(path: Path) -> str | None:
    try:
        return _run_git(["rev-parse", "HEAD"], cwd=path).strip()
    except ThirdPartyError:
        return None


def fetch(pin: ThirdPartyPin, cache: Cache) -> Checkout:
    """Clone ``pin`` into the cache (see module doc) and return the verified checkout.
    Idempotent: a complete copy is returned as is. Raises :class:`ThirdPartyError`."""
    cache.ensure_writable(for_loads=False)
    final = cache_checkout_dir(pin, cache)
    key = _lock_key(pin)
    with cache.lock(key, f"fetch of {pin.name} at {pin.commit}"):
        marker = _read_marker(final, pin)
        if marker is not None:
            return Checkout(pin.name, final, pin.commit, marker["tree_sha256"], "cache")
        cache.remove_stale_staging(key)  # left by a killed fetch; we hold the lock
        if final.exists():
            cache.move_aside(final)  # incomplete: no valid marker
        staging = cache.new_staging(key)
        try:
            try:  # fast path: one commit only (servers that allow fetching by id)
                _run_git(["init", "-q", str(staging)])
                _run_git(["fetch", "-q", "--depth", "1", pin.url, pin.commit], cwd=staging)
                _run_git(["checkout", "-q", "--detach", "FETCH_HEAD"], cwd=staging)
            except ThirdPartyError:
                shutil.rmtree(staging, ignore_errors=True)
                _run_git(["clone", "-q", "--no-checkout", pin.url, str(staging)])
                _run_git(["checkout", "-q", "--detach", pin.commit], cwd=staging)
            if (staging / ".gitmodules").exists():
                _run_git(["submodule", "update", "-q", "--init", "--recursive"], cwd=staging)
            head = _run_git(["rev-parse", "HEAD"], cwd=staging).strip()
            if head != pin.commit:
                raise ThirdPartyError(f"fetched {pin.name} from {pin.url} is at {head}, "
                                      f"not the pinned {pin.commit}")
            tree = tree_digest(staging)
            (staging / MARKER).write_text(json.dumps(
                {"name": pin.name, "url": pin.url, "commit": pin.commit, "tree_sha256": tree}))
            final.parent.mkdir(parents=True, exist_ok=True)
            staging.rename(final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return Checkout(pin.name, final, pin.commit, tree, "cache")
