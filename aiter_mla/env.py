"""The one registry of environment variables this package reads.

Every read goes through :func:`get`, :func:`get_int`, :func:`get_flag` or :func:`get_words`; each variable is
declared once below as key-changing (its value enters the JIT cache key, because it changes
what a build produces) or neutral (it changes where or whether we build, not what).
``op_tests/test_env_registry.py`` scans the source tree and fails on any ``os.environ`` /
``os.getenv`` read outside this module, and on a read of an undeclared name.

Source of the conventions: Triton's CACHE_INVALIDATING_ENV_VARS / CACHE_NEUTRAL_ENV_VARS
split, and AITER's variable names where AITER has one (``AITER_REBUILD``,
``AITER_ENABLE_EXPERIMENTAL``, ``CU_NUM``, ``HIP_KITTENS_DIR``).
"""
from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class EnvVar:
    name: str
    key_changing: bool
    default: str | None
    doc: str
    #: AITER's ``atoi`` rule (a non-numeric value reads as 0) instead of an error. Only for
    #: AITER's own knobs, so the same environment means the same thing to both packages.
    lenient: bool = False
    #: What a set value must parse as, checked for every command by :func:`check_values`:
    #: "flag" (get_flag), "int" / "positive int" (get_int), "seconds" (a number >= 0), "words"
    #: (shell words, get_words), "path" (get_path: ``~`` / ``~user`` must expand), or "text"
    #: (anything).
    kind: str = "text"
    #: Bounds of an "int" / "positive int" value (inclusive), checked by :func:`get_int`.
    minimum: int | None = None
    maximum: int | None = None


_REGISTRY: dict[str, EnvVar] = {}


def _declare(name: str, key_changing: bool, default: str | None, doc: str,
             lenient: bool = False, kind: str = "text", minimum: int | None = None,
             maximum: int | None = None) -> None:
    _REGISTRY[name] = EnvVar(name, key_changing, default, doc, lenient, kind, minimum, maximum)


# --- where and whether we build (neutral: the artifact is the same) ---
_declare("AITER_MLA_CACHE_DIR", False, None, "JIT cache root (default ~/.cache/aiter_mla)", kind="path")
_declare("AITER_MLA_DISABLE_JIT", False, "0", "1: load only what is already built; never compile",
         kind="flag")
_declare("AITER_REBUILD", False, "0", "AITER's knob: >=1 rebuilds each module once per process",
         lenient=True, kind="flag")
_declare("AITER_MLA_LOCK_TIMEOUT", False, "900", "seconds to wait for another process's build (0: do not wait)",
         kind="seconds")
# Below the lock wait: a hung compiler fails its own build before the processes waiting for it
# give up. The slowest variant builds in about a minute on two cores.
_declare("AITER_MLA_BUILD_TIMEOUT", False, "600", "seconds one compile may run before it is killed (0 or inf: no limit)",
         kind="seconds")
_declare("AITER_MLA_NVCC", False, None, "path of nvcc (else CUDA_HOME/bin/nvcc, else PATH)")
_declare("CUDA_HOME", False, None, "CUDA toolkit root, searched for nvcc")
_declare("CUDA_PATH", False, None, "CUDA toolkit root (Windows-style name), searched for nvcc")
_declare("ROCM_PATH", False, None, "ROCm root, searched for hipcc")
_declare("AITER_MLA_CLANG", False, None, "clang used for the gfx942 compile-only check")
_declare("HIP_KITTENS_DIR", False, None, "existing HipKittens checkout (verified against the pin)", kind="path")
_declare("AITER_MLA_VERBOSE", False, "0", "1: log every build command", kind="flag")
_declare("MAX_JOBS", False, None, "parallel builds of 'aiter-mla jit build' and 'bench' when -j is not given (0: the default)", kind="int",
         minimum=0)
_declare("HOME", False, None, "home folder, for the default cache root")
_declare("XDG_CACHE_HOME", False, None, "base of the default cache root when set")
_declare("AITER_MLA_CONFIG", False, None, "jit_config.json to use instead of the repository's", kind="path")
_declare("AITER_MLA_TEMPLATES_DIR", False, None, "templates folder to use instead of the repository's", kind="path")
_declare("AITER_MLA_HIPCC", False, None, "path of hipcc (else ROCM_PATH/bin/hipcc, /opt/rocm, PATH)")
_declare("AITER_MLA_GIT", False, None, "git used by 'aiter-mla deps fetch' (else git on PATH)")
# --- what we schedule and launch (runtime policy, not codegen) ---
_declare("AITER_ENABLE_EXPERIMENTAL", False, "0",
         "AITER's knob, parsed as an int: non-zero doubles the m16x4 cluster count",
         lenient=True, kind="flag")
# The bound keeps a typo from sizing schedule buffers in the billions (no GPU has 4096 SMs/CUs).
_declare("CU_NUM", False, None, "AITER's override of the multiprocessor count", kind="positive int",
         maximum=4096)
# --- what changes the artifact (key-changing) ---
_declare("AITER_MLA_EXTRA_NVCC_FLAGS", True, "", "extra nvcc flags appended to every build",
         kind="words")
_declare("AITER_MLA_EXTRA_HIP_FLAGS", True, "", "extra hipcc/clang flags appended to every build",
         kind="words")
_declare("AITER_MLA_LINEINFO", True, "0", "1: build with -lineinfo (profilers)", kind="flag")
# What the compilers themselves read that changes their output (key-changing: a debug build from
# NVCC_APPEND_FLAGS=-G must never be served to a plain build).
_declare("NVCC_APPEND_FLAGS", True, "", "nvcc's own: flags it appends to every command")
_declare("NVCC_PREPEND_FLAGS", True, "", "nvcc's own: flags it prepends to every command")
_declare("NVCC_CCBIN", True, "", "nvcc's own: the host compiler (as -ccbin)")
_declare("CUDAHOSTCXX", True, "", "the CUDA host compiler build systems pass to nvcc")
_declare("CC", True, "", "the C compiler (hipcc's and host tools' default)")
_declare("CXX", True, "", "the C++ compiler (hipcc's and host tools' default)")
_declare("HIPCC_COMPILE_FLAGS_APPEND", True, "", "hipcc's own: flags it appends when compiling")
_declare("HIPCC_LINK_FLAGS_APPEND", True, "", "hipcc's own: flags it appends when linking")
_declare("HIP_CLANG_PATH", True, "", "hipcc's own: where its clang lives")


def registry() -> dict[str, EnvVar]:
    """All declared variables by name (a copy)."""
    return dict(_REGISTRY)


def _lookup(name: str) -> EnvVar:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(
            f"environment variable {name!r} is read but not declared in aiter_mla/env.py; "
            "declare it as key-changing or neutral"
        ) from None


def get(name: str) -> str | None:
    """The variable's value, or its declared default when unset, empty or blank (only spaces:
    AITER_MLA_CACHE_DIR="  " made a folder named with two spaces in the current directory).

    Raises KeyError if ``name`` is not declared in the registry.
    """
    var = _lookup(name)
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return var.default
    return value


def is_set(name: str) -> bool:
    """Whether the declared variable is set to a value that is not empty or blank
    (``aiter-mla info``; blank counts as unset, as in :func:`get`)."""
    _lookup(name)
    return bool((os.environ.get(name) or "").strip())


def is_blank(name: str) -> bool:
    """Whether the declared variable is set but empty or blank (read as unset by :func:`get`;
    a message can say which)."""
    return not is_set(name) and name in os.environ   # is_set checks the name is declared


_TRUE = frozenset(("true", "yes", "on"))
_FALSE = frozenset(("false", "no", "off"))


_PLAIN_INT = re.compile(r"\s*([+-]?[0-9]+)\s*")


def read_by_atoi_rule(name: str) -> bool:
    """True when ``name`` is one of AITER's knobs (the ``atoi`` rule) and set to something other
    than a plain integer (``AITER_REBUILD=true``): only that rule gives it its value."""
    value = get(name)
    return _lookup(name).lenient and value is not None and _PLAIN_INT.fullmatch(value) is None


def get_int(name: str, default: int = 0) -> int:
    """The variable parsed as an int (``default`` when unset, empty or blank).

    AITER's knobs (``AITER_ENABLE_EXPERIMENTAL``, ``AITER_REBUILD``) follow AITER's ``atoi``
    rule: a non-numeric value counts as ``default`` ("abc" is off). Every other variable
    raises ValueError naming the variable and the bad value, so a typo never silently
    changes behaviour; a variable declared a "positive int" (``CU_NUM``) also must be > 0.
    """
    var = _lookup(name)
    value = get(name)
    if value is None:
        return default
    # ASCII decimal only, as C's atoi reads it: Python's int() also takes "1_0" and
    # full-width digits, which AITER's C side would read otherwise
    whole = _PLAIN_INT.fullmatch(value)
    if whole is None:
        if var.lenient:   # C atoi: the leading [+-]digits ("2x" is 2), none at all is 0
            prefix = re.match(r"\s*([+-]?[0-9]+)", value)
            return int(prefix.group(1)) if prefix else default
        raise ValueError(f"environment variable {name} must be an integer, got {value!r}")
    number = int(whole.group(1))
    if var.kind == "positive int" and number <= 0:
        raise ValueError(f"environment variable {name} must be a positive integer, got {value!r}")
    if var.minimum is not None and number < var.minimum:
        raise ValueError(f"environment variable {name} must be >= {var.minimum}, got {value!r}")
    if var.maximum is not None and number > var.maximum:
        raise ValueError(f"environment variable {name} must be <= {var.maximum}, got {value!r}")
    return number


def get_float(name: str, default: float, minimum: float | None = None) -> float:
    """The variable parsed as a float (``default`` when unset, empty or blank); ValueError naming
    the variable for a non-number or a value below ``minimum``."""
    value = get(name)
    if value is None:
        return default
    try:
        number = float(value.strip())
    except ValueError:
        raise ValueError(f"environment variable {name} must be a number, got {value!r}") from None
    if minimum is not None and not number >= minimum:
        raise ValueError(f"environment variable {name} must be >= {minimum}, got {value!r}")
    return number


def get_flag(name: str) -> bool:
    """True for 1 / true / yes / on, False for 0 / false / no / off (case-insensitive); unset,
    empty or blank is False.

    AITER's knobs keep AITER's ``atoi`` rule (any non-zero int is on, non-numeric is off); for
    ours any other value, such as ``AITER_MLA_DISABLE_JIT=maybe`` or ``=2``, raises ValueError
    naming the variable.
    """
    var = _lookup(name)
    value = get(name)
    if value is not None and not var.lenient:
        word = value.strip().lower()
        if word in _TRUE or word == "1":
            return True
        if word in _FALSE or word == "0":
            return False
        raise ValueError(f"environment variable {name} must be 0 or 1 (or true/false, "
                         f"yes/no, on/off), got {value!r}")
    return get_int(name, 0) != 0


def get_words(name: str) -> list[str]:
    """The variable's value split as a POSIX shell would (``shlex.split``), [] when unset;
    raises ValueError naming the variable when its quoting is unbalanced."""
    value = get(name) or ""
    try:
        return shlex.split(value)
    except ValueError as exc:   # "No closing quotation", "No escaped character"
        raise ValueError(f"environment variable {name} must split into shell words "
                         f"({exc}), got {value!r}") from None


def get_path(name: str) -> Path | None:
    """The variable as an absolute path, ``~`` and ``~user`` expanded and a relative path taken
    from the current directory (not resolved: links stay as given); None when unset, empty or
    blank. Surrounding whitespace is dropped, as for the number and flag variables (" /x " made
    a folder named " " in the current directory; a newline from ``$(...)`` made "/x\n").
    Raises ValueError naming the variable when a ``~user`` cannot be expanded (pathlib's own
    error, "Could not determine home directory.", names neither)."""
    from .paths import absolute_path

    value = get(name)
    return None if value is None else absolute_path(value.strip(), f"environment variable {name}")


def _check_one(name: str, var: EnvVar) -> None:
    if var.kind == "flag":
        get_flag(name)
    elif var.kind in ("int", "positive int"):
        get_int(name)
    elif var.kind == "seconds":
        get_float(name, 0.0, minimum=0.0)
    elif var.kind == "words":
        get_words(name)
    elif var.kind == "path":
        get_path(name)


def problems(skip: tuple[str, ...] = ()) -> list[str]:
    """The message of every declared variable that is set and malformed, by name
    (``aiter-mla info`` lists them all); ``skip``: names the caller does not read."""
    found = []
    for name, var in sorted(_REGISTRY.items()):
        if is_set(name) and name not in skip:
            try:
                _check_one(name, var)
            except ValueError as exc:
                found.append(str(exc))
    return found


def check_values(skip: tuple[str, ...] = ()) -> None:
    """Parses every declared variable that is set by its kind, but those in ``skip``, and
    raises ValueError naming the first malformed one (the CLI runs this before every command,
    so a typo such as ``AITER_MLA_LOCK_TIMEOUT=-1`` fails at once instead of at the first
    build; a command given ``--cache-dir`` skips AITER_MLA_CACHE_DIR, which it does not read)."""
    found = problems(skip)
    if found:
        raise ValueError(found[0])


def child_environ(**overrides: str) -> dict[str, str]:
    """A copy of this process's environment with ``overrides`` applied, for a subprocess
    (compilers, git). Passing the environment on is not a read of any one variable."""
    child = dict(os.environ)
    child.update(overrides)
    return child


def _flag_words(value: str) -> str:
    """Extra compiler flags as the compiler gets them (shlex words), so " -DX " and "-DX"
    share a build; unbalanced quotes stay as written (get_words reports them)."""
    try:
        return shlex.join(shlex.split(value))
    except ValueError:
        return value


def key_items() -> dict[str, str]:
    """The key-changing variables, normalised for the JIT cache key: unset == default, a flag
    by its meaning ("1" / "0"), so ``AITER_MLA_LINEINFO=yes`` and ``=1`` share a build, and
    extra compiler flags (``*_FLAGS``) by their words."""
    def value(n: str, v: EnvVar) -> str:
        if v.kind == "flag":
            return "1" if get_flag(n) else "0"
        text = get(n) or ""
        return _flag_words(text) if n.endswith("_FLAGS") else text
    return {n: value(n, v) for n, v in sorted(_REGISTRY.items()) if v.key_changing}
