"""Render one variant of a module's Jinja template (StrictUndefined: a name the template uses
but the variant does not define is an error, never an empty string).

What a template sees: its module's parameters (``arch``, ``block_m``, ...), ``module`` (the
module name), ``arch_family`` (``"nvidia"`` or ``"amd"``), and the constants the host and
the kernels share (:func:`template_globals`: the work-record indices ``WI_*`` /
``WORK_INFO_INTS``, the error codes ``ERR_*``, the error record's shape, the ``LAUNCH_*``
return codes, ``FUSED_MERGE_MAX_PIECES`` and the scheduler's ``WHOLE_BATCH_SLACK``), all from
:mod:`aiter_mla.work_info`.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import env, work_info
from ..arch import NVIDIA_ARCHS
from .config import ModuleConfig


class RenderError(RuntimeError):
    """A template could not be rendered for a variant (missing file, undefined name, syntax)."""


@dataclass(frozen=True)
class Rendered:
    """A rendered variant: the source text, the template's bytes hash and the hashes of every
    header under the templates folder that the source includes (directly or not)."""

    text: str
    template_path: Path
    template_sha256: str
    headers: dict[str, str]

    @property
    def source_sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


_environments: dict[str, Any] = {}


def template_globals() -> dict[str, int]:
    """Constants every template sees (Jinja globals): ``work_info.template_constants`` (the work
    record's ``WI_*`` field indices and ``WORK_INFO_INTS``, ``ERR_*``, ``ERROR_SLOTS``,
    ``ERROR_SLOT_WORDS``, ``LAUNCH_*``, ``FUSED_MERGE_MAX_PIECES``) and the scheduler's
    ``WHOLE_BATCH_SLACK``, so the kernels and the Python side share one definition.
    Raises nothing."""
    consts = work_info.template_constants()
    consts["WHOLE_BATCH_SLACK"] = work_info.WHOLE_BATCH_SLACK
    return consts


def template_file(module: ModuleConfig, tdir: Path) -> Path:
    """``module``'s template under ``tdir``; raises :class:`RenderError` naming it when it does
    not exist."""
    path = tdir / module.template
    if not path.is_file():
        override = (env.get("AITER_MLA_TEMPLATES_DIR") or "").strip()   # as get_path reads it
        if override and not tdir.is_dir():
            hint = f"AITER_MLA_TEMPLATES_DIR={override} is not a folder: unset it or fix the path"
        elif override:
            hint = f"from AITER_MLA_TEMPLATES_DIR={override}: add the file or unset the variable"
        else:
            hint = "set AITER_MLA_TEMPLATES_DIR, or add the file"
        raise RenderError(f"module {module.name!r}: template {path} does not exist ({hint})")
    return path


def _environment(tdir: Path):
    import jinja2  # only the cold path renders; a warm hit never imports Jinja

    envj = _environments.get(str(tdir))
    if envj is None:
        envj = jinja2.Environment(
            loader=jinja2.FileSystemLoader(str(tdir)),
            undefined=jinja2.StrictUndefined,
            keep_trailing_newline=True,
            # No compiled-template cache: its freshness check is an mtime, which cannot see
            # two edits within one filesystem timestamp tick; rendering is off the hot path.
            cache_size=0,
        )
        envj.globals.update(template_globals())
        _environments[str(tdir)] = envj
    return envj


def render(module: ModuleConfig, params: dict[str, Any], tdir: Path) -> Rendered:
    """Render ``module``'s template for ``params`` (already checked by
    :meth:`ModuleConfig.check_params`) from the templates folder ``tdir``.

    Raises :class:`RenderError` naming the template, the variant and the Jinja error.
    """
    import jinja2

    template_path = template_file(module, tdir)
    template_bytes = template_path.read_bytes()
    context = {"module": module.name,
               "arch_family": "nvidia" if params["arch"] in NVIDIA_ARCHS else "amd",
               **params}
    try:
        text = _environment(tdir).get_template(module.template).render(**context)
    except jinja2.UndefinedError as exc:
        raise RenderError(
            f"module {module.name!r} variant {describe(module.name, params)}: template "
            f"{template_path} uses an undefined name: {exc.message} "
            f"(defined: {', '.join(sorted(context))} and the shared constants of "
            f"aiter_mla.work_info: WI_*, ERR_*, LAUNCH_*, ...)"
        ) from None
    except UnicodeDecodeError as exc:   # jinja2 reads templates as UTF-8 and names no file
        raise RenderError(
            f"module {module.name!r} variant {describe(module.name, params)}: template "
            f"{_undecodable(template_path, tdir, exc.object)} is not UTF-8 text ({exc.reason} at byte "
            f"{exc.start})"
        ) from None
    except jinja2.TemplateError as exc:
        where = f"{getattr(exc, 'filename', None) or template_path}:{getattr(exc, 'lineno', '?')}"
        raise RenderError(
            f"module {module.name!r} variant {describe(module.name, params)}: "
            f"template error at {where}: {exc}"
        ) from None
    return Rendered(text, template_path, hashlib.sha256(template_bytes).hexdigest(),
                    included_headers(text, tdir))


def _undecodable(template_path: Path, tdir: Path, data: bytes) -> Path:
    """The template that is not UTF-8: the Jinja file under ``tdir`` whose bytes are ``data``
    (what the decoder failed on: jinja2 decodes a file whole), else the first one that fails
    to decode, ``template_path`` first; ``template_path`` when none does."""
    candidates = [template_path, *sorted(tdir.rglob("*.j2"))]
    failing = []
    for p in candidates:
        try:
            raw = p.read_bytes()
        except OSError:
            continue
        if raw == data:
            return p
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            failing.append(p)
    return failing[0] if failing else template_path


_INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"\n]+)[>"]', re.MULTILINE)
# a computed include (`#include MACRO`): which file it names is the preprocessor's to decide
_COMPUTED_INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+[A-Za-z_]', re.MULTILINE)


def included_headers(text: str, tdir: Path) -> dict[str, str]:
    """``{path relative to tdir: sha256}`` of every file under ``tdir`` that ``text`` includes,
    followed transitively (``"x"`` looks beside the including file, then in ``tdir``;
    ``<x>`` in ``tdir``, as ``-I templates`` does). Includes inside ``#if`` count too: a
    spare header in the key costs a rebuild at worst, a missing one a stale binary. For the
    same reason a computed include (``#include MACRO``) anywhere puts every file under
    ``tdir`` in the key."""
    root = tdir.resolve()
    found: dict[str, str] = {}
    pending: list[tuple[str, Path]] = [(text, root)]
    while pending:
        body, base = pending.pop()
        if _COMPUTED_INCLUDE_RE.search(body):
            return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
                    for p in sorted(root.rglob("*")) if p.is_file()}
        for kind, name in _INCLUDE_RE.findall(body):
            candidates = ([base / name] if kind == '"' else []) + [root / name]
            for cand in candidates:
                try:
                    path = cand.resolve()
                    rel = path.relative_to(root).as_posix()
                except (ValueError, OSError):
                    continue  # outside the templates folder: the toolchain's own headers
                if rel in found:
                    break
                try:
                    data = path.read_bytes()
                except (FileNotFoundError, IsADirectoryError):
                    continue
                found[rel] = hashlib.sha256(data).hexdigest()
                pending.append((data.decode(errors="replace"), path.parent))
                break
    return dict(sorted(found.items()))


def describe(name: str, params: dict[str, Any]) -> str:
    """A variant's readable name: ``convert_fp8(arch=sm_90a, out_dtype=bf16)``."""
    return f"{name}(" + ", ".join(f"{k}={params[k]}" for k in sorted(params)) + ")"
