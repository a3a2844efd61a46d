"""``jit_config.json``: the modules the JIT can build, validated on load.

Schema (``schema_version`` 1; unknown keys are errors, so a typo never passes silently)::

    {
      "schema_version": 1,
      "doc": "free text",                                   # optional
      "toolchains": {                                      # default flags of each toolchain
        "nvcc":  {"flags": ["-O3", ...]},                  # sm_90a: host .so
        "hipcc": {"flags": [...]},                         # gfx9xx with ROCm: host .so
        "clang": {"flags": [...]}                          # gfx942 compile-only check
      },
      "third_party": {                                     # header libraries pinned by commit
        "HipKittens": {"url": "https://...", "commit": "<40 hex>", "doc": "..."}
      },
      "modules": {
        "<name>": {                                        # [a-z][a-z0-9_]*
          "template": "x.cu.j2",                           # path under templates/
          "doc": "...",                                    # optional
          "params": {"arch": ["sm_90a", ...], "<p>": [v, ...]},  # every allowed value
          "default_variants": [{"arch": "sm_90a", ...}],   # what 'jit build --all' builds
          "flags": {"nvcc": [...], "hipcc": [...], "clang": [...]},  # appended per toolchain
          "third_party": ["HipKittens"],                   # pins whose tree enters the key
          "experimental": false,                           # skipped by build-all unless enabled
          "exclude": [{"when": {"<p>": v, ...}, "why": "...",  # optional: combinations
                       "instead": {"<p>": v}}]             # that cannot build, refused early;
        }                                                  # v: a value, or a list of any-of values;
                                                           # instead (optional): what a default with
                                                           # --param substituted builds in its place
      }
    }

Every module has an ``arch`` parameter whose values are a subset of :data:`aiter_mla.arch.ARCHS`;
parameter values are strings, ints or bools (a value's type matters: ``64`` is not ``"64"``).
Every error names the key path (``modules.convert_fp8.params.arch[1]``) and the bad value.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import env, paths
from ..arch import ARCHS

SCHEMA_VERSION = 1
TOOLCHAINS = ("nvcc", "hipcc", "clang")
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_PARAM_RE = re.compile(r"^[a-z][a-z0-9_]*$")


class ConfigError(ValueError):
    """``jit_config.json`` does not follow the schema; the message names the key and value."""


class UnknownModuleError(KeyError, ValueError):
    """No module of that name in the config: a KeyError whose text reads as a sentence, and a
    ValueError like :class:`ParamError`'s other bad-argument errors."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class ParamError(ValueError):
    """A variant's parameters are missing, unknown or not allowed; the message lists the
    allowed values."""


@dataclass(frozen=True)
class ThirdPartyPin:
    """A header library pinned by commit (HipKittens: AITER PR #3072's pin)."""

    name: str
    url: str
    commit: str
    doc: str = ""


@dataclass(frozen=True)
class ModuleConfig:
    """One module: its template, parameter space, defaults, flags and pins."""

    name: str
    template: str
    doc: str
    params: dict[str, tuple]
    default_variants: tuple[dict, ...]
    flags: dict[str, tuple[str, ...]]
    third_party: tuple[str, ...]
    experimental: bool
    raw: dict = field(repr=False, compare=False, default_factory=dict)
    #: (when, why, instead) rules: a variant matching every item of ``when`` (parameter -> the
    #: values it matches) cannot be built; ``instead`` (parameter -> value, or None) is what a
    #: substituted default builds in its place (:meth:`alternative`).
    exclude: tuple[tuple[dict, str, dict | None], ...] = ()

    def alternative(self, params: dict[str, Any]) -> dict[str, Any] | None:
        """``params`` with the values of the first exclusion it matches that names an
        ``instead`` (e.g. mainloop=score_pv with mask=causal -> mainloop=tile_pairs), or None
        when no such exclusion matches. The result is not checked. Raises nothing."""
        for when, _, instead in self.exclude:
            if instead is not None and _matches(when, params):
                return {**params, **instead}
        return None

    def defaults_for(self, arch: str | None) -> tuple[dict, ...]:
        """The default variants a build for ``arch`` starts from: the module's own defaults for
        ``arch`` when it lists some (mla_decode lists gfx942 and gfx950 ones), else those of its
        first arch (sm_90a), into which the caller substitutes ``arch``. ``arch`` None: the
        first arch's. Raises nothing."""
        first = self.params["arch"][0] if self.params.get("arch") else None
        own = tuple(v for v in self.default_variants if arch is not None and v.get("arch") == arch)
        return own or tuple(v for v in self.default_variants if v.get("arch", first) == first)

    def check_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """Return ``params`` sorted by name after checking every parameter is given, known
        and allowed. Raises :class:`ParamError` listing the allowed values."""
        missing = [p for p in self.params if p not in params]
        if missing:
            detail = ", ".join(f"{p} (allowed: {_fmt_values(self.params[p])})" for p in missing)
            raise ParamError(f"module {self.name!r}: missing parameter(s) {detail}")
        unknown = sorted(p for p in params if p not in self.params)
        if unknown:
            raise ParamError(
                f"module {self.name!r}: unknown parameter(s) {', '.join(unknown)}; "
                f"its parameters are: {', '.join(self.params)}"
            )
        for p, value in params.items():
            if not _is_allowed(value, self.params[p]):
                # '128' against 128 read as "not allowed; allowed: ..., 128": name the type
                hint = ""
                if any(_value_text(a) == str(value) for a in self.params[p]):
                    kinds = sorted({type(a).__name__ for a in self.params[p]})
                    hint = f" (a {type(value).__name__}; the allowed values are {'/'.join(kinds)})"
                raise ParamError(
                    f"module {self.name!r}: parameter {p}={value!r}{hint} is not allowed; "
                    f"allowed: {_fmt_values(self.params[p])}"
                )
        for when, why, _ in self.exclude:
            if _matches(when, params):
                combo = ", ".join(f"{p}={params[p]!r}" for p in when)
                raise ParamError(f"module {self.name!r}: the combination {combo} is not "
                                 f"supported: {why}")
        return {p: params[p] for p in sorted(params)}

    def coerce_params(self, text_params: dict[str, str]) -> dict[str, Any]:
        """Turn command-line strings (``block_m=64``) into the allowed typed values.

        Raises :class:`ParamError` for an unknown name or a value matching no allowed value.
        """
        out: dict[str, Any] = {}
        for p, text in text_params.items():
            if p not in self.params:
                raise ParamError(
                    f"module {self.name!r}: unknown parameter {p!r}; "
                    f"its parameters are: {', '.join(self.params)}"
                )
            for allowed in self.params[p]:
                if _value_text(allowed) == text:
                    out[p] = allowed
                    break
            else:
                raise ParamError(
                    f"module {self.name!r}: parameter {p}={text!r} is not allowed; "
                    f"allowed: {_fmt_values(self.params[p])}"
                )
        return out


@dataclass(frozen=True)
class JitConfig:
    """The validated config file."""

    path: Path
    schema_version: int
    toolchains: dict[str, tuple[str, ...]]
    third_party: dict[str, ThirdPartyPin]
    modules: dict[str, ModuleConfig]

    def module(self, name: str) -> ModuleConfig:
        """The module called ``name``; raises KeyError listing the known modules."""
        try:
            return self.modules[name]
        except KeyError:
            raise UnknownModuleError(
                f"unknown JIT module {name!r}; modules in {self.path}: "
                f"{', '.join(sorted(self.modules))}"
            ) from None


def _value_text(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _fmt_values(values) -> str:
    return ", ".join(repr(v) for v in values)


def _is_allowed(value: Any, allowed: tuple) -> bool:
    # bool is an int subclass: True must not pass for 1, nor "64" for 64.
    return any(type(value) is type(a) and value == a for a in allowed)


def config_path() -> Path:
    """``AITER_MLA_CONFIG`` if set (a relative path is taken from the current directory), else
    the repository's ``jit_config.json``."""
    return env.get_path("AITER_MLA_CONFIG") or paths.JIT_CONFIG_PATH


def templates_dir() -> Path:
    """``AITER_MLA_TEMPLATES_DIR`` if set, else the repository's ``templates/``. Always absolute:
    the compiler runs in a staging folder, so a relative ``-I`` would find no header there."""
    return env.get_path("AITER_MLA_TEMPLATES_DIR") or paths.TEMPLATES_DIR


def load_config(path: str | os.PathLike | None = None) -> JitConfig:
    """Read and validate the config (default :func:`config_path`). Read afresh on every call
    (a fraction of a millisecond, off the warm path), so an edit is never missed.

    Raises FileNotFoundError naming ``AITER_MLA_CONFIG``, or :class:`ConfigError` naming the
    bad key and value.
    """
    p = Path(path) if path is not None else config_path()
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise FileNotFoundError(
            f"JIT config {p} does not exist (set AITER_MLA_CONFIG to a jit_config.json)"
        ) from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        why = {IsADirectoryError: "is a folder", PermissionError: "is not readable",
               UnicodeDecodeError: "is not UTF-8 text"}[type(exc)]
        raise ConfigError(f"JIT config {p} {why} (set AITER_MLA_CONFIG to a jit_config.json)") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{p}: not valid JSON: {exc}") from None
    return validate(raw, p)


def _fail(where: str, msg: str) -> None:
    raise ConfigError(f"jit config: {where}: {msg}")


def _check_keys(obj: Any, where: str, required: set, optional: set = frozenset()) -> None:
    if not isinstance(obj, dict):
        _fail(where, f"expected an object, got {type(obj).__name__} {obj!r}")
    for k in sorted(required - obj.keys()):
        _fail(f"{where}.{k}", "missing (required)")
    for k in sorted(obj.keys() - required - optional):
        _fail(f"{where}.{k}", f"unknown key (allowed: {', '.join(sorted(required | optional))})")


def _check_str_list(obj: Any, where: str) -> tuple[str, ...]:
    if not isinstance(obj, list):
        _fail(where, f"expected a list of strings, got {obj!r}")
    for i, s in enumerate(obj):
        if not isinstance(s, str) or not s:
            _fail(f"{where}[{i}]", f"expected a non-empty string, got {s!r}")
    return tuple(obj)


def validate(raw: Any, source: str | os.PathLike = "<config>") -> JitConfig:
    """Validate a parsed config; return :class:`JitConfig` or raise :class:`ConfigError`."""
    _check_keys(raw, "<root>", {"schema_version", "toolchains", "third_party", "modules"}, {"doc"})
    if raw["schema_version"] != SCHEMA_VERSION:
        _fail("schema_version", f"{raw['schema_version']!r} is not supported (expected {SCHEMA_VERSION})")

    toolchains: dict[str, tuple[str, ...]] = {}
    _check_keys(raw["toolchains"], "toolchains", set(TOOLCHAINS))
    for tc in TOOLCHAINS:
        _check_keys(raw["toolchains"][tc], f"toolchains.{tc}", {"flags"}, {"doc"})
        toolchains[tc] = _check_str_list(raw["toolchains"][tc]["flags"], f"toolchains.{tc}.flags")

    pins: dict[str, ThirdPartyPin] = {}
    if not isinstance(raw["third_party"], dict):
        _fail("third_party", f"expected an object, got {raw['third_party']!r}")
    for name, pin in raw["third_party"].items():
        where = f"third_party.{name}"
        _check_keys(pin, where, {"url", "commit"}, {"doc"})
        if not isinstance(pin["url"], str) or not pin["url"]:
            _fail(f"{where}.url", f"expected a non-empty string, got {pin['url']!r}")
        if not isinstance(pin["commit"], str) or not _COMMIT_RE.match(pin["commit"]):
            _fail(f"{where}.commit", f"{pin['commit']!r} is not a 40-hex-digit lowercase commit")
        pins[name] = ThirdPartyPin(name, pin["url"], pin["commit"], str(pin.get("doc", "")))

    modules: dict[str, ModuleConfig] = {}
    if not isinstance(raw["modules"], dict) or not raw["modules"]:
        _fail("modules", f"expected a non-empty object, got {raw['modules']!r}")
    for name, m in raw["modules"].items():
        modules[name] = _validate_module(name, m, pins)
    return JitConfig(Path(source), SCHEMA_VERSION, toolchains, pins, modules)


def _validate_module(name: str, m: Any, pins: dict) -> ModuleConfig:
    where = f"modules.{name}"
    if not _NAME_RE.match(name):
        _fail(where, f"module name {name!r} must match [a-z][a-z0-9_]*")
    _check_keys(m, where, {"template", "params", "default_variants", "flags", "third_party",
                           "experimental"}, {"doc", "exclude"})
    if not isinstance(m["template"], str) or not m["template"] or m["template"].startswith("/") \
            or ".." in Path(m["template"]).parts:
        _fail(f"{where}.template", f"expected a relative path under templates/, got {m['template']!r}")

    params: dict[str, tuple] = {}
    if not isinstance(m["params"], dict):
        _fail(f"{where}.params", f"expected an object, got {m['params']!r}")
    if "arch" not in m["params"]:
        _fail(f"{where}.params.arch", "missing (every module has an arch parameter)")
    for p, values in m["params"].items():
        pw = f"{where}.params.{p}"
        if not _PARAM_RE.match(p):
            _fail(pw, f"parameter name {p!r} must match [a-z][a-z0-9_]*")
        if not isinstance(values, list) or not values:
            _fail(pw, f"expected a non-empty list of allowed values, got {values!r}")
        for i, v in enumerate(values):
            if not isinstance(v, (str, int)):  # bool is an int
                _fail(f"{pw}[{i}]", f"values are strings, ints or bools, got {v!r}")
            if any(type(v) is type(u) and v == u for u in values[:i]):
                _fail(f"{pw}[{i}]", f"duplicate value {v!r}")
            if p == "arch" and v not in ARCHS:
                _fail(f"{pw}[{i}]", f"arch {v!r} is not a known target (known: {', '.join(ARCHS)})")
        params[p] = tuple(values)

    if not isinstance(m["default_variants"], list):
        _fail(f"{where}.default_variants", f"expected a list, got {m['default_variants']!r}")
    defaults = []
    for i, variant in enumerate(m["default_variants"]):
        vw = f"{where}.default_variants[{i}]"
        if not isinstance(variant, dict):
            _fail(vw, f"expected an object, got {variant!r}")
        for p in params:
            if p not in variant:
                _fail(f"{vw}.{p}", f"missing (allowed: {_fmt_values(params[p])})")
        _check_values(variant, vw, params)
        defaults.append({p: variant[p] for p in sorted(variant)})

    _check_keys(m["flags"], f"{where}.flags", set(), set(TOOLCHAINS))
    flags = {tc: _check_str_list(m["flags"].get(tc, []), f"{where}.flags.{tc}") for tc in TOOLCHAINS}

    tp = _check_str_list(m["third_party"], f"{where}.third_party")
    for i, t in enumerate(tp):
        if t not in pins:
            _fail(f"{where}.third_party[{i}]", f"{t!r} is not pinned in third_party "
                  f"(pinned: {', '.join(sorted(pins)) or 'none'})")
    if not isinstance(m["experimental"], bool):
        _fail(f"{where}.experimental", f"expected true or false, got {m['experimental']!r}")
    exclude = _validate_exclude(m.get("exclude", []), f"{where}.exclude", params)
    module = ModuleConfig(name, m["template"], str(m.get("doc", "")), params, tuple(defaults),
                          flags, tp, m["experimental"], raw=m, exclude=exclude)
    for i, variant in enumerate(defaults):
        try:
            module.check_params(variant)
        except ParamError as exc:
            _fail(f"{where}.default_variants[{i}]", str(exc))
    return module


def _matches(when: dict, params: dict[str, Any]) -> bool:
    """Whether ``params`` has, for every parameter of an exclusion's ``when``, one of its values."""
    return all(p in params and _is_allowed(params[p], vs) for p, vs in when.items())


def _check_values(obj: dict, where: str, params: dict[str, tuple]) -> None:
    """Every key of ``obj`` a parameter, every value one of its allowed values (ConfigError)."""
    for p, v in obj.items():
        if p not in params:
            _fail(f"{where}.{p}", f"unknown parameter (parameters: {', '.join(params)})")
        if not _is_allowed(v, params[p]):
            _fail(f"{where}.{p}", f"{v!r} is not allowed (allowed: {_fmt_values(params[p])})")


def _validate_exclude(raw: Any, where: str, params: dict[str, tuple]) -> tuple:
    if not isinstance(raw, list):
        _fail(where, f"expected a list, got {raw!r}")
    out = []
    for i, item in enumerate(raw):
        iw = f"{where}[{i}]"
        _check_keys(item, iw, {"when", "why"}, {"instead"})
        when = item["when"]
        if not isinstance(when, dict) or not when:
            _fail(f"{iw}.when", f"expected a non-empty object, got {when!r}")
        for p, v in when.items():
            if p not in params:
                _fail(f"{iw}.when.{p}", f"unknown parameter (parameters: {', '.join(params)})")
            if isinstance(v, list) and not v:
                _fail(f"{iw}.when.{p}", "expected a value or a non-empty list of values, got []")
            for one in (v if isinstance(v, list) else [v]):
                if not _is_allowed(one, params[p]):
                    _fail(f"{iw}.when.{p}", f"{one!r} is not allowed (allowed: {_fmt_values(params[p])})")
        if not isinstance(item["why"], str) or not item["why"]:
            _fail(f"{iw}.why", f"expected a non-empty string, got {item['why']!r}")
        instead = item.get("instead")
        if instead is not None:
            if not isinstance(instead, dict) or not instead:
                _fail(f"{iw}.instead", f"expected a non-empty object, got {instead!r}")
            _check_values(instead, f"{iw}.instead", params)
        out.append(({p: tuple(v) if isinstance(v, list) else (v,) for p, v in when.items()}, item["why"],
                    instead))
    return tuple(out)
