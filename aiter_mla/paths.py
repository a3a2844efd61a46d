"""Where the repository's fixed top-level pieces live (templates/, jit_config.json), and
whether a folder can be made where the user asked for one."""
from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent
TEMPLATES_DIR = REPO_ROOT / "templates"
JIT_CONFIG_PATH = REPO_ROOT / "jit_config.json"


def unmakeable_folder_reason(path: str | os.PathLike) -> str | None:
    """Why ``path`` can be neither used nor created as a folder, or None when it can: the
    nearest part of it that exists must be a folder this user may write into. Checks only;
    creates nothing."""
    probe = Path(path).expanduser().absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} exists and is not a folder"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable"
    return None
