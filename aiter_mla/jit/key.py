"""The cache key: sha256 of a canonical manifest (sorted JSON), saved beside the artifact.

The manifest holds only inputs that change the artifact (docs/DESIGN.md §3.1):

- key schema version, package version and a hash of the code that shapes a build
  (render.py, key.py, toolchain.py and work_info.py, whose constants every template gets);
- module name and parameters, the template's bytes, the rendered source's hash, and the hash
  of every header under ``templates/`` that the source includes (every file there when it has
  a computed ``#include MACRO``);
- pinned third-party libraries the module lists: commit and tree hash;
- the compiler's identity (kind, path, ``--version`` output), the full flag list, the arch;
- the host (OS, machine): a C-ABI library does not depend on Python's or torch's version;
- the key-changing env vars (:mod:`aiter_mla.env`), normalized so unset == default.

Paths of the checkout and of the cache are not inputs: the same entry serves every checkout.

A second, cheaper id, the *lookup id*, is the same manifest with the render-derived fields
replaced by a hash of the whole templates folder and the templates' Jinja globals. A warm hit goes lookup id -> key through a
small index file, so a new process finds its entry without importing Jinja or rendering
(ccache's "direct mode"); any template edit changes the lookup id and falls back to the
exact path, which may still hit the same entry.

Without a compiler (a runtime image under ``AITER_MLA_DISABLE_JIT=1``) neither id can be made:
the compiler's identity is unknown. :func:`toolchain_free` strips that identity from inputs or
a manifest; entries are then matched by the hash of what is left (docs/DESIGN.md §3.9).
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path
from typing import Any

from .. import env
from ..version import __version__
from .toolchain import KEY_ENV, TOOLCHAIN_ENV, Compiler

KEY_SCHEMA = 1

_CODEGEN_FILES = ("jit/render.py", "jit/key.py", "jit/toolchain.py", "work_info.py")
_codegen: list[str] = []


def canonical_json(obj: Any) -> str:
    """Sorted, compact, ASCII JSON: one byte string per value."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def sha256_json(obj: Any) -> str:
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()


def codegen_digest() -> str:
    """Hash of the package code that shapes a build (once per process)."""
    if not _codegen:
        pkg = Path(__file__).resolve().parent.parent
        h = hashlib.sha256()
        for rel in _CODEGEN_FILES:
            h.update(rel.encode() + b"\0" + (pkg / rel).read_bytes() + b"\0")
        _codegen.append(h.hexdigest())
    return _codegen[0]


def tree_digest(root: Path, skip: tuple[str, ...] = (".git",), skip_files: tuple[str, ...] = ()) -> str:
    """sha256 over every file under ``root`` (relative path and content), ``skip`` folders
    and files named in ``skip_files`` left out. Symlinks are followed as the compiler would
    follow them. (Plain strings and os.walk: this runs on every first lookup of a process.)"""
    h = hashlib.sha256()
    base = os.fspath(root)
    cut = len(base) + 1
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if d not in skip and d != "__pycache__")
        for fn in sorted(filenames):
            if fn in skip_files:
                continue
            full = os.path.join(dirpath, fn)
            try:
                with open(full, "rb") as f:
                    data = f.read()
            except OSError:
                continue
            h.update(full[cut:].replace(os.sep, "/").encode() + b"\0" +
                     hashlib.sha256(data).digest())
    return h.hexdigest()


def env_items(toolchain_kind: str) -> dict[str, str]:
    """The key-changing env vars a build with ``toolchain_kind`` depends on: those that
    toolchain reads plus any key-changing var no toolchain claims (conservative for new ones).
    Unset and the declared default give the same value."""
    claimed = {v for names in KEY_ENV.values() for v in names}
    items = env.key_items()
    return {n: v for n, v in items.items() if n in KEY_ENV[toolchain_kind] or n not in claimed}


def host_abi() -> dict[str, str]:
    """What a plain C-ABI library or code object depends on besides the toolchain."""
    return {"system": platform.system(), "machine": platform.machine()}


def base_inputs(*, module: str, params: dict, template: str, compiler: Compiler,
                flags: list[str], third_party: dict[str, dict]) -> dict:
    """Manifest fields known before rendering (shared by the lookup id and the key)."""
    return {
        "key_schema": KEY_SCHEMA,
        "package": {"version": __version__, "codegen_sha256": codegen_digest()},
        "module": module,
        "params": dict(sorted(params.items())),
        "arch": params["arch"],
        "toolchain": compiler.identity(),
        "flags": list(flags),
        "env": env_items(compiler.kind),
        "host": host_abi(),
        "third_party": third_party,
        "_template": template,
    }


def lookup_id(inputs: dict, templates_tree: str) -> str:
    """Id of the index record that maps these inputs to a key (see module doc). Besides the
    templates folder it hashes what else reaches the rendered source: the Jinja globals
    (``render.template_globals``: work_info.py's shared constants and WHOLE_BATCH_SLACK) and
    the arch list that decides ``arch_family``; without them a warm hit loaded a library
    rendered with an old value. (The key itself hashes the rendered source.)"""
    from ..arch import NVIDIA_ARCHS
    from .render import template_globals

    return sha256_json({**inputs, "_templates_tree": templates_tree,
                        "_template_globals": template_globals(), "_nvidia_archs": list(NVIDIA_ARCHS)})


def manifest(inputs: dict, template_sha256: str, source_sha256: str,
             headers: dict[str, str]) -> dict:
    """The full manifest: ``inputs`` plus the render-derived fields. The template's file name
    is left out (renaming a file changes no artifact); its bytes are in."""
    m = {k: v for k, v in inputs.items() if not k.startswith("_")}
    m["template_sha256"] = template_sha256
    m["source_sha256"] = source_sha256
    m["headers"] = dict(sorted(headers.items()))
    return m


def key_of(manifest_obj: dict) -> str:
    """The cache key: sha256 hex of the canonical manifest."""
    return sha256_json(manifest_obj)


def toolchain_free(obj: dict) -> dict:
    """A copy of base inputs or a manifest without the toolchain's identity: ``toolchain``
    keeps only the compiler's kind, and the env vars that pick a compiler
    (:data:`~aiter_mla.jit.toolchain.TOOLCHAIN_ENV`) leave ``env``. What stays (package,
    module, parameters, sources, headers, flags, arch, host) decides what the artifact does.
    Raises KeyError when ``obj`` lacks ``toolchain`` or ``env``."""
    out = dict(obj)
    out["toolchain"] = {"kind": obj["toolchain"]["kind"]}
    out["env"] = {k: v for k, v in obj["env"].items() if k not in TOOLCHAIN_ENV}
    return out
