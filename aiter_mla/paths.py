"""Where the kernels' templates and the JIT configuration live, and whether a folder can be
made where the user asked for one.

An installed wheel carries them as package data, ``aiter_mla/_data/templates`` and
``aiter_mla/_data/jit_config.json`` (setup.py copies them there); a checkout (an editable
install, or the source tree on ``sys.path``) has them at its top level, beside
``pyproject.toml``. Package data wins, so a stray ``templates/`` beside an installed package is
never picked up. ``AITER_MLA_TEMPLATES_DIR`` / ``AITER_MLA_CONFIG`` override both
(``jit/config.py``).
"""
from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
_DATA_DIR = PACKAGE_DIR / "_data"
#: The checkout's top level (in an installed wheel: the folder that holds the package).
REPO_ROOT = PACKAGE_DIR.parent
#: True in an installed wheel: templates and config are package data.
INSTALLED_DATA = (_DATA_DIR / "jit_config.json").is_file()
_DATA_ROOT = _DATA_DIR if INSTALLED_DATA else REPO_ROOT
TEMPLATES_DIR = _DATA_ROOT / "templates"
JIT_CONFIG_PATH = _DATA_ROOT / "jit_config.json"


def absolute_path(text: str | os.PathLike, name: str) -> Path:
    """``text`` with ``~`` / ``~user`` expanded, made absolute from the current folder (links
    kept as given). Raises ValueError naming ``name`` (a flag or "environment variable X") when a
    ``~user`` cannot be expanded: pathlib's own "Could not determine home directory." names
    neither the value nor where it came from."""
    try:
        return Path(text).expanduser().absolute()
    except RuntimeError:
        head = str(text).split("/", 1)[0]
        raise ValueError(f"{name} must be a path whose {head!r} names a user with a home folder, "
                         f"got {str(text)!r}") from None


def unmakeable_folder_reason(path: str | os.PathLike, probe_write: bool = False) -> str | None:
    """Why ``path`` can be neither used nor created as a folder, or None when it can: the
    nearest part of it that exists must be a folder this user may write into. By default
    checks only (``os.access``) and creates nothing; ``probe_write``: tries it with
    :func:`folder_write_problem`, which makes and removes a probe folder there (for ``info``
    and ``bench -o``, not for commands that only read). Raises ValueError for a ``~user``
    that cannot be expanded."""
    probe = absolute_path(path, "the folder")
    while not probe.exists() and probe != probe.parent:
        if probe.is_symlink():   # dangling or looping: no folder can be made where it points
            return f"{probe} is a symlink that does not resolve (to {probe.parent / os.readlink(probe)})"
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} exists and is not a folder"
    if not probe_write:
        return None if os.access(probe, os.W_OK | os.X_OK) else f"{probe} is not writable"
    return folder_write_problem(probe)


def folder_write_problem(folder: str | os.PathLike) -> str | None:
    """Why nothing can be created in the existing folder ``folder``, or None when a probe
    folder (``.aiter_mla_probe.*``) could be made and removed there. A real attempt, not only
    ``os.access``: for root, access() says yes to ``/proc``, ``/sys`` or an immutable
    (``chattr +i``) folder, where every mkdir fails."""
    import tempfile   # here: a warm JIT hit imports this module and must not pay for it

    if not (os.access(folder, os.W_OK) and os.access(folder, os.X_OK)):
        return f"{folder} is not writable"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".aiter_mla_probe.", dir=folder))
    except OSError as exc:
        return f"no folder can be made in {folder} ({exc.strerror or exc})"
    return None


def checkout_commit(exclude: str | os.PathLike | None = None) -> str:
    """The commit this code runs from: ``git rev-parse HEAD`` of the checkout at
    :data:`REPO_ROOT`, with ``-dirty`` when tracked or untracked (not ignored) files there
    differ, not counting ``exclude`` (an output folder inside the checkout: results written
    into ``docs/perf`` do not make the measured code dirty). ``"unknown"`` when
    :data:`REPO_ROOT` is not the top level of a git checkout holding this package: an
    installed wheel sits in ``site-packages``, which may lie inside some unrelated repository,
    whose commit is not this code's. Never raises."""
    import subprocess   # here: a warm JIT hit imports this module and must not pay for it

    def git(*args: str) -> str | None:
        try:
            # surrogateescape: a checkout path need not be UTF-8 (--show-toplevel prints it)
            proc = subprocess.run(["git", *args], capture_output=True, text=True, timeout=30,
                                  errors="surrogateescape", cwd=str(REPO_ROOT))
        except (OSError, ValueError, subprocess.TimeoutExpired):
            return None
        return proc.stdout.strip() if proc.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    try:
        ours = top is not None and Path(top).resolve() == REPO_ROOT.resolve()
    except OSError:
        ours = False
    head = git("rev-parse", "HEAD") if ours and not INSTALLED_DATA else None
    if not head:
        return "unknown"
    cmd = ["status", "--porcelain", "--", "."]
    if exclude is not None:
        try:
            rel = Path(exclude).resolve().relative_to(REPO_ROOT.resolve())
        except (ValueError, OSError):
            rel = None  # outside the checkout: nothing to exclude
        if rel is not None and str(rel) != ".":
            cmd.append(f":(exclude){rel.as_posix()}")
    status = git(*cmd)
    return head + ("-dirty" if status else "")
