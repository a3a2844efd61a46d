"""CLI sub-commands of the JIT (see aiter_mla/cli.py): ``info``, ``jit ...``, ``deps fetch``.

Every command exits non-zero on any failure (a failed build among many included).
"""
from __future__ import annotations

import argparse
import functools
import importlib
import json
import math
import os
import platform
import re
import shlex
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from .. import env
from ..cli_errors import CommandLineError, missing_module_hint
from ..version import __version__
from ..paths import absolute_path, folder_write_problem, unmakeable_folder_reason
from ..arch import AMD_ARCHS, ARCHS, NVIDIA_ARCHS, is_experimental_enabled
from ..bench.commands import positive_int
from . import core, third_party
from .cache import fallback_root, fallback_root_problem, is_cache_key
from .config import ParamError, UnknownModuleError, load_config, templates_dir
from .render import RenderError, describe, render
from .toolchain import ToolchainError, find_compiler, interruptible


def register(subparsers) -> None:
    """Add ``info``, ``jit`` and ``deps`` to the ``aiter-mla`` parser."""
    p = subparsers.add_parser("info", help="versions, toolchains, GPU, cache, pins, env")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=cmd_info, checks_env_itself=True)   # it lists a bad variable among the rest

    jit = subparsers.add_parser("jit", help="build, list, clear and inspect JIT modules")
    jsub = jit.add_subparsers(dest="jit_command", metavar="COMMAND", required=True)

    p = jsub.add_parser("list", help="modules, their default variants, cached or not")
    form = p.add_mutually_exclusive_group()   # one output form: asking for two is a usage error
    form.add_argument("--json", action="store_true", help="print JSON instead of text")
    form.add_argument("--variants", action="store_true",
                      help="print the listed variants one a line, as 'jit build --from-file' reads them")
    p.add_argument("--arch", choices=ARCHS, help="list only this arch's variants")
    _add_cache_dir_arg(p)
    p.set_defaults(func=cmd_list)

    for name, helptext in (("build", "build variants (default: the module's default variants)"),
                           ("rebuild", "build again even when cached (replaces by rename); "
                                       "the same selection as build")):
        p = jsub.add_parser(name, help=helptext)
        p.add_argument("module", nargs="?")
        _add_param_arg(p)
        p.add_argument("--all", action="store_true",
                       help="every module's default variants for --arch (default sm_90a; experimental ones only when "
                            "AITER_ENABLE_EXPERIMENTAL is non-zero)")
        p.add_argument("--from-file", metavar="FILE",
                       help="the variants FILE lists, one a line: MODULE K=V ... with every "
                            "parameter (what 'jit list --variants' prints); blank lines and "
                            "# comments are skipped")
        _add_cache_dir_arg(p)
        p.add_argument("--arch", choices=ARCHS, help="build for this arch instead")
        p.add_argument("-j", "--jobs", type=positive_int, default=None,
                       help="parallel builds (default: MAX_JOBS, else min(4, CPUs))")
        p.set_defaults(func=cmd_build, force=(name == "rebuild"))

    p = jsub.add_parser("clear", help="remove cached entries (skips ones being built)")
    p.add_argument("module", nargs="?")
    p.add_argument("--all", action="store_true", help="every entry and leftover")
    _add_cache_dir_arg(p)
    p.set_defaults(func=cmd_clear)

    p = jsub.add_parser("render", help="print a variant's rendered source (no toolchain needed)")
    p.add_argument("module")
    _add_param_arg(p)
    p.add_argument("--arch", choices=ARCHS,
                   help="the variant's arch (the same as --param arch=ARCH; default sm_90a)")
    p.add_argument("-o", "--output", help="write to this file instead of stdout ('-': stdout)")
    p.set_defaults(func=cmd_render)

    p = jsub.add_parser("gc", help="evict least-recently-used entries down to a size")
    p.add_argument("--max-bytes", required=True, type=_parse_bytes,
                   help="size to shrink to: bytes, or with a K/M/G suffix (powers of 1024)")
    _add_cache_dir_arg(p)
    p.set_defaults(func=cmd_gc)

    deps = subparsers.add_parser("deps", help="pinned third-party libraries")
    dsub = deps.add_subparsers(dest="deps_command", metavar="COMMAND", required=True)
    p = dsub.add_parser("fetch", help="clone pinned libraries into the cache and verify them")
    p.add_argument("names", nargs="*", help="libraries (default: every pin)")
    p.set_defaults(func=cmd_deps_fetch)


def _add_param_arg(p) -> None:
    p.add_argument("--param", action="append", default=[], metavar="K=V",
                   help="a template parameter (repeat for each)")


def _add_cache_dir_arg(p) -> None:
    p.add_argument("--cache-dir", metavar="ROOT", type=_cache_dir,
                   help="the cache root to use instead of AITER_MLA_CACHE_DIR or the default "
                        "(e.g. a prebuilt cache for an image)")


def _cache_dir(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a folder path, got {text!r}")
    try:
        # ~ expanded here, once: the shell leaves it in --cache-dir=~/x, and every command (list,
        # clear, gc as well as build) must then act on the same folder
        path = str(absolute_path(text, "--cache-dir"))
    except ValueError as exc:   # an unknown ~user
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--cache-dir ")) from None
    if os.path.exists(path) and not os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"expected a folder, got {text!r}, which is not one")
    reason = unmakeable_folder_reason(path)
    if reason is not None and reason.endswith("is not a folder"):   # a file on the way to it
        raise argparse.ArgumentTypeError(f"expected a folder path, got {text!r}, which cannot be one "
                                         f"({reason})")
    return path


#: Commands that only read or trim a cache: a --cache-dir that does not exist is named on stderr
#: (a mistyped path would otherwise read as an empty cache).
_READS_CACHE = ("cmd_list", "cmd_clear", "cmd_gc")


def _cache_dir_option(cmd):
    """Run ``cmd(args)`` with ``--cache-dir``, when given, as the only cache root."""
    @functools.wraps(cmd)
    def run(args) -> int:
        if getattr(args, "cache_dir", None) is None:
            return cmd(args)
        if cmd.__name__ in _READS_CACHE and not os.path.isdir(args.cache_dir):
            print(f"aiter-mla jit: no cache folder at --cache-dir {args.cache_dir!r}",
                  file=sys.stderr)
            if cmd.__name__ != "cmd_list":   # clear / gc: nothing to remove (not "removed 0")
                return 0
        with core.using_cache_root(args.cache_dir):
            return cmd(args)
    return run


def _parse_bytes(text: str) -> int:
    """A byte count >= 0: digits, or a finite number with a K / M / G suffix (powers of 1024),
    optionally followed by B or iB (500M, 500MB, 500MiB)."""
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower()
    if t.endswith("ib") and len(t) > 2 and t[-3] in mult:   # one unit word at most: '5Mbbb' is not a size
        t = t[:-2]
    elif t.endswith("b"):
        t = t[:-1]
    try:
        # ASCII digits only: int() and float() would also take '1_000' and full-width digits,
        # and lower() turns the Kelvin sign into 'k' (so the given text is checked too)
        if not text.isascii() or not re.fullmatch(r"[0-9]+(\.[0-9]*)?[kmg]?|\.[0-9]+[kmg]?", t):
            raise ValueError
        if t and t[-1] in mult:
            value = float(t[:-1]) * mult[t[-1]]
            if not math.isfinite(value):   # 300+ digits: int() would raise OverflowError
                raise ValueError
            n = int(value)
        else:
            n = int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size "
                                         f"(e.g. 500000000, 500M, 2G)") from None
    return n


def _parse_params(items: list[str], label: str = "--param ") -> dict[str, str]:
    out = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise ParamError(f"{label}{item!r}: expected NAME=VALUE")
        k = k.strip()
        if k in out:
            raise ParamError(f"{label}{k} given twice ({k}={out[k]} and {k}={v.strip()})")
        out[k] = v.strip()
    return out


class VariantsFileError(ValueError):
    """A variants list file cannot be read, names no variant, or has a bad line; the message
    is ``FILE: why`` or ``FILE:LINE: why``, one line."""


# the MODULE(K=V, ...) form `jit list` and error messages name a variant by (render.describe)
_DESCRIBED = re.compile(r"([a-z][a-z0-9_]*)\((.*)\)")
#: `jit list`'s form with its key after it, alone, or the whole printed line
#: "[status] origin MODULE(K=V, ...) KEY  (note)", whose key is blank for an [unknown] variant.
_LISTED = re.compile(r"(\[[^\]]*\]\s+\S+\s+)?([a-z][a-z0-9_]*)\(([^()]*)\)"
                     r"(?(1)(?:\s+[0-9a-f]{12,64})?(?:\s+\(.*\))?|\s+[0-9a-f]{12,64}\b.*)")


#: The lines of plain `jit list` that name no variant (cmd_list prints them): its header, a
#: module's "NAME  (TEMPLATE, ...)" line, a "  PARAM: v, ..." line, the damaged-entries line.
_LIST_NOT_VARIANTS = (
    ("the header line", re.compile(r"cache root: .*")),
    ("a module line", re.compile(r"[a-z][a-z0-9_]*  \(.*\)")),
    ("a parameter line", re.compile(r"\s+[a-z][a-z0-9_]*: .*")),
    ("the damaged-entries line", re.compile(r"\d+ damaged entr.*")),
)


def _not_a_variant_line(line: str) -> str | None:
    """Why ``line`` of a list file is one of plain `jit list`'s lines that name no variant (a
    file saved from `jit list` rather than `jit list --variants`), else None."""
    for what, pattern in _LIST_NOT_VARIANTS:
        if pattern.fullmatch(line.rstrip()):
            return (f"not a variant line: {what} of 'aiter-mla jit list' is not accepted (its "
                    f"header, module and parameter lines name no variant); give one variant a "
                    f"line, MODULE K=V ..., as 'aiter-mla jit list --variants' prints them; got "
                    f"{line.strip()!r}")
    return None


def variant_line(name: str, params: dict) -> str:
    """A variant as one line of a ``--from-file`` list: ``MODULE K=V ...``, sorted by name."""
    return name + "".join(f" {k}={core._text(params[k])}" for k in sorted(params))


def _parse_variant_line(line: str, cfg) -> tuple[str, dict] | None:
    """(module, checked params) of one list-file line, None for a blank or comment line.
    Raises ParamError, UnknownModuleError, or ValueError (unbalanced quotes)."""
    text = line.split("#", 1)[0].strip()
    listed = _LISTED.fullmatch(text)   # first: _DESCRIBED's greedy (.*) would take a key and note
    described = None if listed else _DESCRIBED.fullmatch(text)
    if described or listed:
        name, inside = listed.group(2, 3) if listed else described.groups()
        items = [t.strip() for t in inside.split(",") if t.strip()]
    else:
        tokens = shlex.split(line, comments=True)
        if not tokens:
            return None
        name, items, rest = tokens[0], [], iter(tokens[1:])
        if name.startswith("-"):
            raise ParamError(f"expected a MODULE name first, got {name!r}")
        if "(" in name:   # the MODULE(K=V, ...) form without its ")"
            raise ParamError(f"expected MODULE(K=V, ...) with a closing ')', got {line.strip()!r}")
        for tok in rest:   # K=V, or --param K=V / --param=K=V as on the command line
            if tok == "--param":
                tok = next(rest, None)
                if tok is None:
                    raise ParamError("--param ends the line: expected --param K=V")
            elif tok.startswith("--param="):
                tok = tok[len("--param="):]
            items.append(tok)
    m = cfg.module(name)
    return m.name, m.check_params(m.coerce_params(_parse_params(items, label="")))


def read_variants_file(path: str, cfg) -> list[tuple[str, dict]]:
    """The variants the list file ``path`` names, in its order, repeats dropped. One variant a
    line, every parameter given: ``MODULE K=V ...`` (what ``jit list --variants`` prints; a
    ``--param`` before ``K=V`` is accepted too, and the ``MODULE(K=V, ...)`` form that
    ``jit list`` and error messages print, alone, with its key after it, or as the whole
    ``jit list`` line). Blank lines and ``#`` comments are skipped.
    ``cfg``: the :class:`~aiter_mla.jit.config.JitConfig` that checks the modules and values.

    Raises :class:`VariantsFileError` (one line): the file cannot be read or is not UTF-8, it
    names no variant, or a line has an unknown module or parameter, a missing or disallowed
    value, or unbalanced quotes (``FILE:LINE: why``); a line of plain ``jit list``'s that names
    no variant (its ``cache root:`` header, module and parameter lines) is refused as not a
    variant line, not skipped. A leading UTF-8 byte-order mark is skipped."""
    try:
        text = Path(path).read_text(encoding="utf-8-sig")   # a leading BOM (Windows editors) dropped
    except OSError as exc:
        raise VariantsFileError(f"--from-file {path!r}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise VariantsFileError(f"--from-file {path!r}: not UTF-8 text ({exc.reason} at byte "
                                f"{exc.start})") from None
    out, seen = [], set()
    for n, line in enumerate(text.splitlines(), 1):
        try:
            variant = _parse_variant_line(line, cfg)
        except (ParamError, UnknownModuleError, ValueError) as exc:
            raise VariantsFileError(f"{path}:{n}: {_not_a_variant_line(line) or exc}") from None
        if variant is None:
            continue
        ident = (variant[0], tuple(variant[1].items()))
        if ident not in seen:
            seen.add(ident)
            out.append(variant)
    if not out:
        raise VariantsFileError(f"{path} names no variant (one a line: MODULE K=V ..., as "
                                f"'aiter-mla jit list --variants' prints them)")
    return out


def _variants(args, cfg) -> list[tuple[str, dict]]:
    given_text = _parse_params(args.param)
    if getattr(args, "from_file", None) is not None:
        if args.module or given_text or args.all or args.arch:
            raise ParamError("--from-file lists every variant: give no MODULE, --param, --all "
                             "or --arch with it")
        return read_variants_file(args.from_file, cfg)
    if getattr(args, "all", False):
        if args.module or given_text:
            raise ParamError("--all builds every module's default variants: give no MODULE "
                             "or --param with it")
        return core.build_all(arch=args.arch)
    if not args.module:
        raise ParamError("name a MODULE (aiter-mla jit list shows them) or use --all")
    m = cfg.module(args.module)
    given = m.coerce_params(given_text)
    if args.arch:
        arch = m.coerce_params({"arch": args.arch})["arch"]
        if "arch" in given and given["arch"] != arch:
            raise ParamError(f"--arch {args.arch} and --param arch={given['arch']} disagree: give one")
        given["arch"] = arch
    if set(given) >= set(m.params):
        return [(m.name, given)]
    if not m.default_variants:
        m.check_params(given)  # raises, listing what is missing
    # Each default variant with the given values substituted; a substitution that lands on an
    # excluded combination takes the exclusion's "instead" values when it names some and they
    # change nothing the user gave (mainloop=score_pv with mask=causal builds tile_pairs, the
    # loop decode picks there), else it is skipped with a note (e.g. mainloop=tile_pairs into a
    # bf16 default); only when every one is refused does the first refusal become the error.
    out, seen, refused = [], set(), {}   # refused: one note per distinct variant
    for d in m.defaults_for(given.get("arch")):
        v = {**d, **given}
        try:
            m.check_params(v)
        except ParamError as exc:
            alt = m.alternative(v)
            if alt is None or any(alt[p] != given[p] for p in given):
                refused.setdefault(tuple(sorted(v.items())), (v, exc))
                continue
            v = alt
        ident = tuple(sorted(v.items()))
        if ident in seen:
            continue
        seen.add(ident)
        try:
            m.check_params(v)
        except ParamError as exc:
            refused.setdefault(ident, (v, exc))
            continue
        out.append((m.name, v))
    if refused and not out:
        raise next(iter(refused.values()))[1]
    for v, exc in refused.values():
        print(f"skipped {describe(m.name, v)}: {exc}", file=sys.stderr)
    return out


def _jobs(requested: int | None) -> int:
    """-j (already >= 1: positive_int), else MAX_JOBS, else min(4, CPUs)."""
    if requested is not None:
        return requested
    n = env.get_int("MAX_JOBS", 0)
    return n if n > 0 else max(1, min(4, os.cpu_count() or 1))


@_cache_dir_option
def cmd_build(args) -> int:
    cfg = load_config()
    variants = _variants(args, cfg)
    if not variants:
        print("nothing to build (no default variants for that arch)", file=sys.stderr)
        return 0
    n, done, failures = len(variants), 0, 0
    jobs = min(_jobs(args.jobs), n)   # no more builds at once than variants
    t0 = time.perf_counter()
    print(f"building {n} variant(s) with {jobs} job(s) into {core._get_state().cache.root}",
          file=sys.stderr)
    with ThreadPoolExecutor(max_workers=jobs) as pool, interruptible(pool):
        futs = {pool.submit(core.build_variant, name, force=args.force, **params):
                describe(name, params) for name, params in variants}
        for fut in as_completed(futs):
            done += 1
            bar = _bar(done, n)
            try:
                r = fut.result()
                state = "built " if r.built else "cached"
                kind = "" if r.entry.loadable else " [compile-only]"
                print(f"{bar} {state} {r.variant} {r.seconds:6.2f} s  {r.entry.key[:12]}{kind}",
                      file=sys.stderr)
            except Exception as exc:  # keep building the rest; report every failure
                failures += 1
                print(f"{bar} FAILED {futs[fut]}: {exc}{missing_module_hint(exc)}", file=sys.stderr)
    print(f"{n - failures} of {n} ok, {failures} failed, {time.perf_counter() - t0:.1f} s",
          file=sys.stderr)
    return 1 if failures else 0


def _bar(done: int, total: int, width: int = 20) -> str:
    filled = width * done // total
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total}"


def cmd_render(args) -> int:
    if args.output is not None and not args.output.strip():
        print("aiter-mla jit render: error: -o: expected a file path (or - for stdout), got "
              f"{args.output!r}", file=sys.stderr)
        return 2
    cfg = load_config()
    m = cfg.module(args.module)
    given = _parse_params(args.param)
    if args.arch:
        if "arch" in given and given["arch"] != args.arch:
            raise ParamError(f"--arch {args.arch} and --param arch={given['arch']} disagree: give one")
        given["arch"] = args.arch
    given.setdefault("arch", "sm_90a")   # as jit build: the lab GPU's arch unless one is named
    params = m.check_params(m.coerce_params(given))
    if args.output and args.output != "-" and os.path.isdir(args.output):   # a bad flag value: 2
        print(f"aiter-mla jit render: error: -o {args.output}: expected a file path, got a folder",
              file=sys.stderr)
        return 2
    text = render(m, params, templates_dir()).text
    if args.output and args.output != "-":
        try:
            Path(args.output).write_text(text)
        except OSError as exc:
            print(f"aiter-mla jit render: error: -o {args.output}: cannot write it "
                  f"({exc.strerror or exc})", file=sys.stderr)
            return 1
        print(f"wrote {args.output} ({len(text)} characters)", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


_CANNOT_RENDER = "cannot render"


def _cache_status(name: str, params: dict) -> tuple[str, str]:
    """('cached'|'corrupt'|'missing'|'unknown', key or reason). A corrupt entry is moved
    aside and rebuilt by the next build or load of the variant."""
    try:
        key, _ = core.variant_key(name, **params)
    except ToolchainError as exc:
        if not env.get_flag("AITER_MLA_DISABLE_JIT"):
            return "unknown", f"no toolchain: {exc}"
        return _status_without_compiler(name, params)
    except (RenderError, ImportError) as exc:   # a broken template, or no jinja2
        try:   # the plan itself fails the same way where the template file is missing
            indexed = core.indexed_key(name, **params)
        except (RenderError, ImportError):
            indexed = None
        if indexed:   # a load takes this entry without rendering (the lookup index)
            return "cached", indexed
        return "unknown", f"{_CANNOT_RENDER}: {exc}"
    except Exception as exc:
        return "unknown", str(exc)
    st = core._get_state()
    status = "missing"
    for cache in st.caches:
        got = cache.read_entry(key, params["arch"])
        if isinstance(got, core.Corrupt):
            status = "corrupt"
        elif got is not None:
            return "cached", key
    return status, key


def _status_without_compiler(name: str, params: dict) -> tuple[str, str]:
    """:func:`_cache_status` where no compiler is found, under AITER_MLA_DISABLE_JIT=1: the
    entry a load would take (built by any toolchain from the same source and flags)."""
    try:
        _, got = core.cached_without_compiler(name, **params)
    except Exception as exc:
        return "unknown", str(exc)
    if got is None:
        return "missing", "no compiler here: matched by source and flags"
    return ("cached" if isinstance(got, core.Entry) else "corrupt"), got.key


def _served_without_compiler(name: str, params: dict, key: str) -> bool:
    """Whether a load where no compiler is found (AITER_MLA_DISABLE_JIT=1) takes entry ``key``
    for this variant: built by any toolchain, but from the same source and flags."""
    try:
        _, got = core.cached_without_compiler(name, **params)
    except Exception:
        return False
    return isinstance(got, core.Entry) and got.key == key


@_cache_dir_option
def cmd_list(args) -> int:
    cfg = load_config()
    st = core._get_state()
    listed = set()
    rows = []
    # --arch: the variants 'jit build --all --arch' builds for it (every module's defaults
    # retargeted; experimental modules as AITER_ENABLE_EXPERIMENTAL says)
    retargeted = {}
    if args.arch:
        for mname, v in core.build_all(arch=args.arch):
            retargeted.setdefault(mname, []).append(v)
    for name, m in cfg.modules.items():
        mod = {"module": name, "template": m.template, "experimental": m.experimental,
               "template_exists": (templates_dir() / m.template).is_file(),
               "params": {k: list(v) for k, v in m.params.items()}, "variants": []}
        for v in (retargeted.get(name, []) if args.arch else m.default_variants):
            status, detail = _cache_status(name, v)
            is_key = is_cache_key(detail)
            if is_key:  # its entry is this row, not an "extra" one
                listed.add(detail)
            mod["variants"].append({"params": v, "default": True, "status": status,
                                    "key": detail if is_key else None,
                                    "note": None if is_key else detail})
        rows.append(mod)
    unreadable = []   # entries whose meta.json names no module: damaged, listed at the end
    for e in st.cache.entries():  # cached non-default variants (and other toolchains)
        meta = e["meta"] or {}
        if e["meta"] is None and e["key"] not in listed:
            unreadable.append(e["key"])
        if e["key"] in listed or meta.get("module") not in cfg.modules:
            continue
        for mod in rows:
            if mod["module"] != meta["module"]:
                continue
            # a default whose key is unknown (no compiler here) and whose entry another
            # toolchain built: one row, saying when that entry serves, not a second "extra" row
            twin = next((v for v in mod["variants"] if v["default"] and v["key"] is None
                         and v["params"] == meta.get("params")), None)
            got = st.cache.read_entry(e["key"], str(meta.get("arch")))
            if isinstance(got, core.Corrupt):   # damage first: "other" would hide it
                mod["variants"].append({"params": meta.get("params"), "default": False,
                                        "status": "corrupt", "key": e["key"], "note": got.reason})
                continue
            if twin is not None and _served_without_compiler(mod["module"], twin["params"], e["key"]):
                twin["note"] = (f"{twin['note']}; " if twin["note"] else "") + (
                    f"cached as {e['key'][:12]}, built by another toolchain: served with "
                    "AITER_MLA_DISABLE_JIT=1 where no compiler is found")
                continue
            # an entry this toolchain (and these flags) would not load: its params key elsewhere
            status, note = "cached", None
            if twin is not None:   # no compiler here, and the entry differs by source or flags
                status = "other"
                note = "built from other sources or with other flags; not loaded here"
            elif isinstance(meta.get("params"), dict):
                _, key_here = _cache_status(meta["module"], meta["params"])
                if is_cache_key(key_here) and key_here != e["key"]:
                    status = "other"
                    note = (f"built by another toolchain or with other flags; not loaded here, where "
                            f"this variant's key is {key_here[:12]}")
                elif not is_cache_key(key_here) and not _served_without_compiler(
                        meta["module"], meta["params"], e["key"]):
                    status = "other"
                    note = "built from other sources or with other flags; not loaded here"
            mod["variants"].append({"params": meta.get("params"), "default": False,
                                    "status": status, "key": e["key"], "note": note})
    if args.arch:   # the cached extras of other archs out
        for mod in rows:
            mod["variants"] = [v for v in mod["variants"]
                               if isinstance(v["params"], dict) and v["params"].get("arch") == args.arch]
    # a missing template is a failure (README: every command exits non-zero on one), listed anyway
    missing = [mod["template"] for mod in rows if not mod["template_exists"]]
    # a default variant that cannot be rendered (a broken template, no jinja2) and that the
    # lookup index does not name (_cache_status) fails every load and build of it, also under
    # AITER_MLA_DISABLE_JIT where a compiler is found (the index missed: the load renders to
    # find its key); not for an experimental module that is not enabled
    broken = [
        f"{mod['module']}: {v['note']}" for mod in rows if mod["template_exists"]
        and (not mod["experimental"] or is_experimental_enabled())
        for v in mod["variants"] if v["default"] and v["status"] == "unknown"
        and str(v["note"]).startswith(_CANNOT_RENDER)]
    rc = 1 if missing or broken else 0
    if broken:
        print(f"aiter-mla jit list: error: {len(broken)} variant(s) cannot be rendered, first "
              f"{broken[0]}", file=sys.stderr)
    if missing:
        where = templates_dir()
        origin = " (AITER_MLA_TEMPLATES_DIR)" if env.is_set("AITER_MLA_TEMPLATES_DIR") else ""
        print(f"aiter-mla jit list: error: {len(missing)} template(s) missing from {where}{origin}: "
              f"{', '.join(missing)}", file=sys.stderr)
    if args.variants:
        print(f"# for 'aiter-mla jit build --from-file FILE' (cache root: {st.cache.root})")
        lines = {}
        for mod in rows:
            for v in mod["variants"]:
                if isinstance(v["params"], dict):
                    line = variant_line(mod["module"], v["params"])
                    lines.setdefault(line, f"{line}  # {v['status']} {(v['key'] or '')[:12]}".rstrip())
        print("\n".join(lines.values()))
        return rc
    if args.json:
        print(json.dumps({"cache_root": str(st.cache.root), "modules": rows,
                          "unreadable_entries": unreadable}, indent=1))
        return rc
    print(f"cache root: {st.cache.root}")
    for mod in rows:
        flags = []
        if mod["experimental"]:
            flags.append("experimental")
        if not mod["template_exists"]:
            flags.append("template missing")
        print(f"\n{mod['module']}  ({mod['template']}{', ' + ', '.join(flags) if flags else ''})")
        for k, vals in mod["params"].items():
            print(f"  {k}: {', '.join(str(v) for v in vals)}")
        for v in mod["variants"]:
            tag = "default" if v["default"] else "extra  "
            key = (v["key"] or "")[:12]
            note = f"  ({v['note']})" if v["note"] else ""
            print(f"  [{v['status']:>7}] {tag} {describe(mod['module'], v['params'])} {key}{note}")
    if unreadable:
        print(f"\n{len(unreadable)} damaged entr{'y' if len(unreadable) == 1 else 'ies'} whose "
              f"meta.json is unreadable (module unknown; its variant is rebuilt when next loaded, "
              f"and 'aiter-mla jit clear --all' removes every entry): "
              f"{', '.join(k[:12] for k in unreadable)}")
    return rc


def _managed_caches(has_work=lambda cache: True) -> list:
    """The roots ``clear`` and ``gc`` act on: every root lookups read (the default or
    ``AITER_MLA_CACHE_DIR`` root, and a per-user fallback an earlier process built in while the
    default root was read-only). A read-only default root is skipped with a note; a read-only
    ``AITER_MLA_CACHE_DIR`` is an error (CacheNotWritableError naming it) unless
    ``has_work(cache)`` says there is nothing to remove there (a read-only prebuilt image with
    nothing to evict: the command has nothing to do, which is no failure). A read-only default
    root with nothing writable beside it stays an error (nothing can be acted on)."""
    from .cache import CacheNotWritableError

    st = core._get_state()
    out, refused = [], None
    for cache in st.caches:
        if not cache.root.exists():
            continue
        try:
            cache.ensure_writable(for_loads=False, create=False)   # read-only: one clear message, not a raw errno
        except CacheNotWritableError as exc:
            if cache.explicit and not has_work(cache):   # a read-only prebuilt root with nothing to do
                print(f"nothing to remove in {cache.root} (not writable)")
                continue
            if cache.explicit:
                raise
            refused = exc
            continue
        out.append(cache)
    if refused is not None:
        if not out:   # nothing could be acted on: fail as before, with the reason
            raise refused
        print(f"skipped {st.caches[0].root}: not writable (the default root; lookups also read "
              f"{', '.join(str(c.root) for c in out)}, handled below)")
    if not out and not st.cache.root.exists():
        out.append(st.cache)   # nothing built yet: report the root that would be used
    return out


@_cache_dir_option
def cmd_clear(args) -> int:
    if bool(args.module) == bool(args.all):
        raise ParamError("give a MODULE or --all, not both" if args.all else "give a MODULE or --all")
    if args.module:
        load_config().module(args.module)  # unknown names are an error

    def has_work(cache) -> bool:
        return any(not args.module or (e["meta"] or {}).get("module") == args.module for e in cache.entries()) \
            or (args.all and bool(cache.failed_builds()))

    for cache in _managed_caches(has_work):
        removed, skipped, freed = 0, [], 0
        for e in cache.entries():
            meta = e["meta"] or {}
            if args.module and meta.get("module") != args.module:
                continue
            done = cache.remove_entry(e["key"])
            if done:
                removed += 1
                freed += e["bytes"]
            elif done is False:   # None: another clear / gc removed it first
                skipped.append(meta.get("variant") or e["key"])
        failed = 0
        if args.all:
            failed = len(cache.failed_builds())
            cache.clear_failed()
        if cache.root.exists():
            cache.sweep()
        what = "failed build's" if failed == 1 else "failed builds'"
        kept = f" and {failed} {what} source and log" if failed else ""
        print(f"removed {removed} entr{'y' if removed == 1 else 'ies'} ({freed} bytes){kept} from "
              f"{cache.root}; lock files are kept (removing one could let two builders in)")
        for s in skipped:
            print(f"skipped {s}: another process holds its lock (a build, clear or gc)")
    return 0


@_cache_dir_option
def cmd_gc(args) -> int:
    for cache in _managed_caches(lambda c: sum(e["bytes"] for e in c.entries()) > args.max_bytes):
        # --max-bytes applies to each root
        report = cache.gc(args.max_bytes)
        n = len(report["removed"])
        print(f"removed {n} entr{'y' if n == 1 else 'ies'} ({report['freed_bytes']} bytes); "
              f"{report['remaining_bytes']} bytes of entries remain in {cache.root}")
        for k in report["skipped_locked"]:
            print(f"skipped {k[:12]}: another process holds its lock (a build, clear or gc)")
    return 0


def cmd_deps_fetch(args) -> int:
    cfg = load_config()
    names = args.names or sorted(cfg.third_party)
    st = core._get_state()
    for n in names:
        if n not in cfg.third_party:
            raise CommandLineError(f"{n!r} is not pinned in {cfg.path} (pinned: "
                                   f"{', '.join(sorted(cfg.third_party))})")
        co, refetched = third_party.fetch_verified(cfg.third_party[n], st.cache)
        if refetched:
            print(f"{n}: the cached checkout's files had changed since its fetch; it was removed "
                  f"and fetched again (to edit {n}, point {third_party.ENV_DIRS.get(n, 'its variable')} "
                  f"at a checkout of your own)")
        print(f"{n} {co.commit} verified at {co.path} (from {co.origin}, "
              f"tree {co.tree_sha256[:12]})")
    return 0


def _versions() -> dict:
    out = {"aiter_mla": __version__, "python": platform.python_version()}
    for mod in ("torch", "jinja2", "filelock"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception as exc:  # info reports what is missing instead of failing
            out[mod] = f"not importable ({exc})"
    return out


def _gpu() -> dict:
    try:
        import torch
    except ImportError:
        return {"available": False, "reason": "torch not importable"}
    if not torch.cuda.is_available():
        return {"available": False, "reason": "torch sees no CUDA device",
                "torch_cuda": torch.version.cuda}
    devs = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        devs.append({"index": i, "name": p.name, "capability": f"{p.major}.{p.minor}",
                     "multiprocessors": p.multi_processor_count})
    return {"available": True, "torch_cuda": torch.version.cuda, "devices": devs}


def _version_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    for ln in lines:
        if "release" in ln or "version" in ln:
            return ln.strip()
    return lines[0].strip() if lines else ""


def _root_summary(cache) -> dict:
    """A cache root for info: entries and bytes, or why it could not be read (a broken root
    is what one runs info for: it is reported on its line, not instead of everything else)."""
    out = {"root": str(cache.root), "explicit": cache.explicit, "entries": 0, "entry_bytes": 0,
           "total_bytes": 0, "error": None}
    try:
        entries = cache.entries()
        out.update(entries=len(entries), entry_bytes=sum(e["bytes"] for e in entries),
                   total_bytes=cache.total_bytes() if cache.root.exists() else 0)
    except OSError as exc:
        out["error"] = f"unreadable: {exc.strerror or exc}"
    return out


def _templates_shown() -> str:
    try:
        return str(templates_dir())
    except ValueError as exc:   # AITER_MLA_TEMPLATES_DIR cannot expand: a problem above
        return f"unusable ({exc})"


def _templates_problem(cfg) -> str | None:
    """Why the templates folder cannot render every configured module, or None. A folder that
    is missing, a file, or lacks a module's template fails those builds (and loads by source)."""
    try:
        tdir = templates_dir()
    except ValueError:   # AITER_MLA_TEMPLATES_DIR cannot expand: already a problem
        return None
    where = f"templates {tdir}" + (" (AITER_MLA_TEMPLATES_DIR)" if env.is_set("AITER_MLA_TEMPLATES_DIR") else "")
    if not tdir.is_dir():
        what = "a file, not a folder" if tdir.exists() else "no such folder"
        return f"{where}: {what}: every module fails to render"
    if cfg is None:
        return None
    wanted = {m.template for m in cfg.modules.values()}
    missing = sorted(t for t in wanted if not (tdir / t).is_file())
    if not missing:
        return None
    return (f"{where}: lacks {len(missing)} of the {len(wanted)} module templates "
            f"({', '.join(missing)}): those modules fail to render")


def cmd_info(args) -> int:
    # A diagnostic: a bad config or variable is reported among the rest (exit 1), not instead
    # of it (the CLI skips its own variable check for this command).
    problems = env.problems()   # every malformed variable, not just the first
    try:
        cfg = load_config()
    except (OSError, ValueError) as exc:
        cfg = None
        if str(exc) not in problems:   # AITER_MLA_CONFIG's own value: listed once
            problems.append(str(exc) if str(exc).startswith("jit config") else f"jit config: {exc}")
    try:
        no_builds = env.get_flag("AITER_MLA_DISABLE_JIT")
    except ValueError:   # malformed: already a problem above
        no_builds = False
    unusable_root = False
    try:
        st = core._get_state()
    except ValueError:   # an AITER_MLA_CACHE_DIR that cannot expand: a problem above; show the default root
        st, unusable_root = core._State(default=True), True
    toolchains = {}
    for arch in ARCHS:
        try:
            c = find_compiler(arch, None)   # probed afresh: info saves no record in the cache
            toolchains[arch] = {"kind": c.kind, "path": c.path, "loadable": c.loadable,
                                "version": _version_line(c.version)}
        except ToolchainError as exc:
            toolchains[arch] = {"error": str(exc)}
            # no compiler for an arch is a fact (an NVIDIA-only machine has no hipcc); one that a
            # set variable chose and that does not work fails every build of the arch (loads
            # under AITER_MLA_DISABLE_JIT need none)
            if exc.variable is not None and not no_builds:
                problems.append(f"{arch} toolchain ({exc.variable}): {exc}")
    pins = {}
    for name, pin in (cfg.third_party.items() if cfg is not None else ()):
        entry = {"url": pin.url, "commit": pin.commit}
        used = any(name in m.third_party for m in cfg.modules.values())
        try:
            co = third_party.resolve(pin, st.cache, allow_fetch=False)
            entry.update(status="ok", path=str(co.path), origin=co.origin)
        except (third_party.ThirdPartyError, OSError, ValueError) as exc:
            # a pin no module builds with is a reference, not a missing dependency
            entry.update(status="not available" if used else "not available; no module builds with it",
                         detail=str(exc))
            var = third_party.ENV_DIRS.get(name)
            if (var is not None and env.is_set(var) and not any(var in p for p in problems)
                    and used):
                # a set variable that names no usable checkout for a pin a module builds with
                # (an unset one only means "not fetched yet"; one no module uses, e.g. for
                # AITER's own checkout, costs no build)
                problems.append(f"{name} pin ({var}): {exc}")
        pins[name] = entry
    cache = _root_summary(st.cache)
    cache_note = None
    then = ("loads only (AITER_MLA_DISABLE_JIT: nothing is built)" if no_builds
            else "builds fail (AITER_MLA_CACHE_DIR)" if st.cache.explicit else
            "builds go to the per-user temp fallback")
    unbuildable = False   # no build can write at the root (it cannot be made, or is read-only)
    if cache["error"] is None:
        if not st.cache.root.exists():
            reason = unmakeable_folder_reason(st.cache.root, probe_write=True)
            unbuildable = reason is not None
            cache_note = ("does not exist yet (the first build makes it)" if reason is None else
                          f"does not exist and cannot be made ({reason}): {then}")
        elif st.cache.root.is_dir() and (why := folder_write_problem(st.cache.root)) is not None:
            unbuildable = True
            detail = "" if why.endswith(" is not writable") else f" ({why})"   # access() said no / a probe failed
            cache_note = f"not writable{detail}: {then}"
    elif not st.cache.explicit and not no_builds:
        # a default root that cannot be read (a file where ~/.cache should be, say) takes no
        # builds either: they go to the fallback, checked below
        unbuildable = True
        cache_note = then
    if unbuildable and not no_builds and not st.cache.explicit:
        # the default root cannot take builds: they go to the fallback, which must be usable
        fb = fallback_root()
        if cache_note is not None:
            cache_note += f" {fb}"
        fb_problem = fallback_root_problem(probe_write=True)
        if fb_problem is not None:
            why_fb = "cannot be read" if cache["error"] is not None else "cannot be written"
            problems.append(f"fallback cache root {fb} (the default root {why_fb}): "
                            f"{fb_problem}: builds fail; set AITER_MLA_CACHE_DIR to a writable "
                            f"folder of your own")
    if st.cache.explicit and (cache["error"] is not None or (
            (cache_note or "").endswith(then) and not no_builds)):
        # AITER_MLA_CACHE_DIR names a root no build can use (a read-only prebuilt root serving
        # loads under AITER_MLA_DISABLE_JIT is not one), or one nothing can read
        problems.append(f"cache root {st.cache.root} (AITER_MLA_CACHE_DIR): "
                        f"{cache['error'] or cache_note}")
    tproblem = _templates_problem(cfg)
    if tproblem is not None:
        problems.append(tproblem)
    versions = _versions()
    # declared dependencies a --no-deps install may lack; loads of indexed entries need neither
    # (so not a problem under AITER_MLA_DISABLE_JIT)
    for mod, lost in () if no_builds else (("jinja2", "variants can be neither rendered nor built"),
                                           ("filelock", "variants cannot be built")):
        try:
            importlib.import_module(mod)
        except Exception as exc:
            problems.append(f"{mod} is not importable ({exc}): {lost} (pip install {mod})")
    info = {
        "versions": versions,
        "archs": {"all": list(ARCHS), "nvidia": list(NVIDIA_ARCHS), "amd": list(AMD_ARCHS)},
        "toolchains": toolchains,
        "gpu": _gpu(),
        "cache": {**cache, "note": cache_note, "also_read": [_root_summary(o) for o in st.caches[1:]],
                  "origin": ("AITER_MLA_CACHE_DIR" if st.cache.explicit else
                             "default: AITER_MLA_CACHE_DIR is unusable, see problems"
                             if unusable_root else "default")},
        "config": str(cfg.path) if cfg is not None else None, "templates": _templates_shown(),
        "experimental_enabled": is_experimental_enabled(),
        "third_party": pins,
        "env": {n: {"value": env.get(n), "set": env.is_set(n),
                    "key_changing": v.key_changing, "doc": v.doc,
                    **({"reads_as": env.get_int(n)} if env.read_by_atoi_rule(n) else {})}
                for n, v in sorted(env.registry().items())},
        "problems": problems,
    }
    if args.json:
        print(json.dumps(info, indent=1))
        return 1 if problems else 0
    v = info["versions"]
    print("versions: " + ", ".join(f"{k} {val}" for k, val in v.items()))
    print("toolchains:")
    for arch, t in toolchains.items():
        if "error" in t:
            print(f"  {arch:7} none: {t['error']}")
        else:
            kind = "loadable .so" if t["loadable"] else "compile-only check"
            print(f"  {arch:7} {t['kind']} {t['path']} ({t['version']}; {kind})")
    g = info["gpu"]
    if g["available"]:
        for d in g["devices"]:
            print(f"gpu {d['index']}: {d['name']} (sm {d['capability']}, "
                  f"{d['multiprocessors']} multiprocessors)")
    else:
        print(f"gpu: none ({g['reason']})")
    c = info["cache"]
    state = (f"{c['error']}" + (f": {c['note']}" if c["note"] else "") if c["error"] else
             f"{c['entries']} entries, {c['total_bytes']} bytes" + (f"; {c['note']}" if c["note"] else ""))
    print(f"cache: {c['root']} ({c['origin']}), {state}")
    for other in c["also_read"]:
        state = other["error"] or f"{other['entries']} entries, {other['total_bytes']} bytes"
        print(f"cache: {other['root']} (per-user fallback, also read by lookups), {state}")
    tpath = Path(info["templates"])
    tdir = "" if info["templates"].startswith("unusable") or tpath.is_dir() \
        else " (a file, not a folder)" if tpath.exists() else " (MISSING: no such folder)"
    print(f"config: {info['config'] or 'not loaded (see problems)'}; templates: {info['templates']}{tdir}; experimental: "
          f"{'on' if info['experimental_enabled'] else 'off'}")
    for name, p in pins.items():
        where = p.get("path") or p.get("detail")
        print(f"pin {name}: {p['commit']} {p['url']} [{p['status']}] {where}")
    print("env (k = enters the cache key):")
    for n, e in info["env"].items():
        mark = "k" if e["key_changing"] else " "
        val = e["value"] if e["set"] else f"(unset; default {e['value']!r})"
        if "reads_as" in e:   # AITER_REBUILD=true is off there, as in AITER: say so
            val += f" (AITER's atoi rule reads it as {e['reads_as']}: {'on' if e['reads_as'] else 'off'})"
        print(f"  {mark} {n}={val}")
    for problem in problems:
        print(f"problem: {problem}")
    return 1 if problems else 0
