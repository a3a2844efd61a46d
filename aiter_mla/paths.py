"""Where the repository's fixed top-level pieces live (templates/, jit_config.json)."""
from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent
TEMPLATES_DIR = REPO_ROOT / "templates"
JIT_CONFIG_PATH = REPO_ROOT / "jit_config.json"
