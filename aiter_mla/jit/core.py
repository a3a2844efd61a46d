"""``get_module``: memo -> index -> render -> key -> cache -> lock -> build -> publish -> load.

Public API (the contract every op relies on)::

    mod = get_module("convert_fp8", arch="sm_90a", out_dtype="bf16")   # -> Module
    fn = mod.function("aiter_mla_convert_fp8", argtypes=[...], restype=ctypes.c_int)

A warm call in the same process is one dict lookup (no filesystem, no lock); the first call
of a variant in a new process reads the index, verifies the entry (size, sha256, arch) and
loads it without starting a subprocess; a miss renders, keys, takes the key's file lock,
checks again, builds in staging, verifies and publishes with one rename.

Policies (AITER's names): ``AITER_REBUILD`` >= 1 rebuilds each variant once per process;
``AITER_ENABLE_EXPERIMENTAL`` (an int, "0" is off) lets :func:`build_all` include
experimental modules, which still build on demand; ``AITER_MLA_DISABLE_JIT=1`` loads only
what is already built, and when no compiler is found then, it takes an entry of the same
source and flags that any toolchain built (docs/DESIGN.md §3.9).
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import shlex
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import env
from ..locks import ForkSafeLock
from ..paths import absolute_path
from ..arch import is_experimental_enabled
from . import key as keymod
from . import third_party
from . import toolchain as toolchain_mod
from .cache import (Cache, CacheError, CacheNotWritableError, Corrupt, Entry, default_root, existing_private_fallback_root, log,
                    private_fallback_root)
from .config import JitConfig, load_config, templates_dir
from .loader import Module, ModuleLoadError
from .render import describe, render
from .toolchain import (BuildError, Compiler, ToolchainError, check_artifact, compiler_identity,
                        compiler_version, find_compiler, run_compiler, save_version, toolchain_kinds)


class JitDisabledError(RuntimeError):
    """``AITER_MLA_DISABLE_JIT=1`` and the variant is not in the cache."""


class CompileOnlyError(RuntimeError):
    """The variant's toolchain makes a device code object (compile check) that cannot be loaded."""


_memo: dict[tuple, Module] = {}
# Fresh in a forked child (aiter_mla/locks.py): a lock another thread of the parent held at the
# fork (a build in progress) would stay held there for ever. The cross-process file lock is
# another matter: the child takes its own and waits on it as any other process does (only a
# parent SIGKILLed mid-build may leave it held until the child exits, where the child inherited
# its descriptor).
_global_lock = ForkSafeLock()
_variant_locks: dict[tuple, ForkSafeLock] = {}
_reset_hooks: list = []   # callables reset_state() runs (on_reset)


def on_reset(hook) -> None:
    """Have :func:`reset_state` call ``hook()``: for an op that keeps its own handle on a loaded
    module (the reduce and metadata ops, per device), which would otherwise outlive the memo and
    keep serving a module of the old templates or cache root."""
    _reset_hooks.append(hook)


class _State:
    """Per-process knowledge: cache roots, compilers found, variants rebuilt."""

    def __init__(self, root: Path | None = None, default: bool = False) -> None:
        # default: the default root whatever AITER_MLA_CACHE_DIR says (`info` when it is unusable)
        # the variable is read only where it is used: a --cache-dir overrides even a bad one
        explicit = None if default or root is not None else env.get_path("AITER_MLA_CACHE_DIR")
        self.reads_cache_variable = root is None and not default
        if root is not None:   # a command's --cache-dir
            self.caches = [Cache(root, explicit=True, origin="--cache-dir")]
        elif explicit is not None:
            self.caches = [Cache(explicit, explicit=True)]
        else:
            self.caches = [Cache(default_root(), explicit=False)]
            fb = existing_private_fallback_root()   # where an earlier process built, root read-only
            if fb is not None and fb != self.caches[0].root:
                self.caches.append(Cache(fb, explicit=False))
        self.compilers: dict[str, tuple[Compiler, list]] = {}   # arch -> (compiler, its file identity)
        self.rebuilt: set[tuple] = set()

    @property
    def cache(self) -> Cache:
        return self.caches[0]

    def compiler(self, arch: str) -> Compiler:
        """The compiler for ``arch``, found again when the file it resolved to changed since
        (a toolkit upgraded under a running server): a build must never record the old
        compiler's identity in its key. Per call, :func:`compiler_identity` (a stat and a
        2-byte read; a wrapper script's head and the files it names); calls come from builds
        and cold loads only."""
        got = self.compilers.get(arch)
        if got is not None:
            c, stamp = got
            try:
                if compiler_identity(c.path) == stamp:
                    return c
            except OSError:
                pass   # gone: find_compiler says what to do
        c = find_compiler(arch, self.cache.toolchains_dir)
        try:   # remembered only with the identity its version was probed for
            stamp = compiler_identity(c.path)
            if compiler_version(c.path, None) == c.version:
                self.compilers[arch] = (c, stamp)
        except OSError:
            pass   # changing right now: found again next call
        return c

    def writable_cache(self, for_loads: bool = True) -> Cache:
        """The first cache a build can write to; a read-only *default* root falls back to a
        per-user temp root with a warning, a read-only ``AITER_MLA_CACHE_DIR`` is an error
        (``for_loads``: as :meth:`Cache.ensure_writable`)."""
        try:
            self.cache.ensure_writable(for_loads)
            return self.cache
        except CacheNotWritableError as exc:
            if self.cache.explicit:
                raise
            try:
                fb_root = private_fallback_root()
            except CacheNotWritableError as fb_exc:
                raise CacheNotWritableError(f"{exc}; and {fb_exc}") from None
            fb = Cache(fb_root, explicit=False)
            fb.ensure_writable()
            log.warning("aiter_mla: %s; building in %s instead", exc, fb.root)
            # first for builds and lookups; a lookup-only copy of it (from __init__) goes
            self.caches = [fb, *(c for c in self.caches if c.root != fb_root)]
            return fb


_state: _State | None = None


def _get_state() -> _State:
    global _state
    st = _state
    if st is None:
        with _global_lock:
            if _state is None:
                _state = _State()
            st = _state
    return st


@contextlib.contextmanager
def using_cache_root(root: str | os.PathLike):
    """Within the block, builds and lookups of every thread use the cache root ``root`` alone
    (made absolute from the current directory), as if ``AITER_MLA_CACHE_DIR`` named it; the
    earlier state comes back after it. For a command's ``--cache-dir``. Raises ValueError
    naming ``--cache-dir`` for a blank ``root``."""
    global _state
    if not str(root).strip():
        raise ValueError(f"--cache-dir: expected a folder path, got {str(root)!r}")
    fresh = _State(absolute_path(root, "--cache-dir"))
    with _global_lock:
        saved, _state = _state, fresh
    try:
        yield fresh.cache
    finally:
        with _global_lock:
            _state = saved


def reset_state() -> None:
    """Forget everything this process learned (memo, cache root, compilers, rebuilt set, the
    ops' own handles on loaded modules).
    For tests that change the environment between calls; loaded libraries stay mapped."""
    global _state
    with _global_lock:
        _memo.clear()
        _variant_locks.clear()
        _state = None
    keymod._codegen.clear()
    third_party._env_trees.clear()
    toolchain_mod._failed_probes.clear()
    for hook in _reset_hooks:
        hook()


@dataclass(frozen=True)
class BuildResult:
    """What :func:`build_variant` did: the entry, whether it compiled now, and how long the
    whole call took (seconds)."""

    name: str
    params: dict
    entry: Entry
    built: bool
    seconds: float

    @property
    def variant(self) -> str:
        return describe(self.name, self.params)


@dataclass
class _Plan:
    name: str
    params: dict
    cfg: JitConfig
    compiler: Compiler
    flags: list[str]
    include_dirs: list[Path]
    inputs: dict
    lookup: str
    templates_tree: str

    @property
    def toolchain_free_lookup(self) -> str:
        """The lookup id without the toolchain's identity (recorded in meta.json)."""
        return keymod.lookup_id(keymod.toolchain_free(self.inputs), self.templates_tree)


def _plan(name: str, params: dict, kind: str | None = None) -> _Plan:
    """The build plan of a variant: for the compiler found for its arch, or, with ``kind``, for
    an absent compiler of that kind (``Compiler.absent``: flags known, identity not)."""
    # malformed variables fail on cache hits too, not only misses; under a command's
    # --cache-dir (using_cache_root), AITER_MLA_CACHE_DIR is not read
    st = _state
    env.check_values(() if st is None or st.reads_cache_variable else ("AITER_MLA_CACHE_DIR",))
    cfg = load_config()
    mcfg = cfg.module(name)
    params = mcfg.check_params(params)
    arch = params["arch"]
    state = _get_state()
    compiler = Compiler.absent(kind) if kind else state.compiler(arch)
    flags = [*cfg.toolchains[compiler.kind], *mcfg.flags[compiler.kind],
             *compiler.arch_flags(arch), *compiler.env_flags()]
    tdir = templates_dir()
    from .render import template_file

    template_file(mcfg, tdir)   # a missing template fails before the folder is hashed
    include_dirs = [tdir]
    tp = {}
    for tp_name in mcfg.third_party:
        # a plan for an absent compiler only looks up: it never clones a dependency
        co = third_party.resolve(cfg.third_party[tp_name], state.cache,
                                 allow_fetch=kind is None and not env.get_flag("AITER_MLA_DISABLE_JIT"))
        tp[tp_name] = co.key_item()
        include_dirs.append(co.include_dir)
    inputs = keymod.base_inputs(module=name, params=params, template=mcfg.template,
                                compiler=compiler, flags=flags, third_party=tp)
    tree = keymod.tree_digest(tdir)
    lookup = keymod.lookup_id(inputs, tree)
    return _Plan(name, params, cfg, compiler, flags, include_dirs, inputs, lookup, tree)


def variant_key(name: str, **params: Any) -> tuple[str, dict]:
    """(key, manifest) of a variant without building it. Needs the toolchain (its identity
    is part of the key), not a GPU. Raises what :func:`build_variant` raises before building."""
    plan = _plan(name, params)
    key, manifest, _ = _exact_key(plan)
    return key, manifest


def _exact_key(plan: _Plan):
    mcfg = plan.cfg.module(plan.name)
    rendered = render(mcfg, plan.params, templates_dir())
    manifest = keymod.manifest(plan.inputs, rendered.template_sha256, rendered.source_sha256,
                               rendered.headers)
    return keymod.key_of(manifest), manifest, rendered


def _index_hit(plan: _Plan) -> tuple[Cache, Entry] | None:
    """(cache, entry) that the lookup index names for ``plan`` and that verifies: a load's
    first try, which renders nothing; else None."""
    for cache in _get_state().caches:
        key = cache.read_index(plan.lookup)
        if key:
            got = cache.read_entry(key, plan.params["arch"])
            if isinstance(got, Entry):
                return cache, got
    return None


def _rebuild_pending(plan: _Plan) -> bool:
    """Whether AITER_REBUILD makes this process's next load of the variant build it again
    (once per process: AITER's behaviour)."""
    return env.get_flag("AITER_REBUILD") and (plan.name, tuple(plan.params.items())) not in _get_state().rebuilt


def indexed_key(name: str, **params: Any) -> str | None:
    """The key of the entry a load of this variant takes without rendering its source (through
    the lookup index: same compiler, flags and templates folder), or None: when nothing is
    indexed, the entry does not verify, or AITER_REBUILD makes the load build anyway
    (:func:`build_variant`'s first steps). Reads only. Raises what :func:`variant_key` raises
    before it renders."""
    plan = _plan(name, params)
    if _rebuild_pending(plan):
        return None
    hit = _index_hit(plan)
    return hit[1].key if hit else None


def _find(state: _State, key: str, arch: str) -> tuple[Cache, Entry | Corrupt | None]:
    found: tuple[Cache, Entry | Corrupt | None] = (state.cache, None)
    for cache in state.caches:
        got = cache.read_entry(key, arch)
        if isinstance(got, Entry):
            return cache, got
        if got is not None and found[1] is None:
            found = (cache, got)
    return found


def build_variant(name: str, *, force: bool = False, **params: Any) -> BuildResult:
    """Make sure a variant is built and published; return its entry without loading it.

    Used by ``aiter-mla jit build`` and for compile-only targets (gfx942 via clang).
    ``force`` rebuilds even when a valid entry exists (``jit rebuild``): the new entry
    replaces the old one by rename; processes that loaded the old one keep it.

    Raises ParamError, ToolchainError, RenderError, BuildError, JitDisabledError,
    CacheError (CacheNotWritableError and LockTimeoutError among them), ThirdPartyError.
    """
    t0 = time.perf_counter()
    state = _get_state()
    try:
        plan = _plan(name, params)
    except ToolchainError as exc:
        if not env.get_flag("AITER_MLA_DISABLE_JIT"):
            if force or env.get_flag("AITER_REBUILD"):
                raise   # a rebuild compiles: a cached entry is no way out
            raise _with_cached_hint(exc, name, params) from None
        return _cached_without_compiler(name, params, force, t0)
    arch = plan.params["arch"]
    variant_id = (name, tuple(plan.params.items()))
    env_rebuild = False
    if not force and _rebuild_pending(plan):
        force = env_rebuild = True  # AITER: each module force-rebuilt once per process
    if not force:
        hit = _index_hit(plan)
        if hit is not None:
            cache, got = hit
            cache.touch_used(got.key)
            return BuildResult(name, plan.params, got, False, time.perf_counter() - t0)
    key, manifest, rendered = _exact_key(plan)
    got = None
    if not force:
        cache, got = _find(state, key, arch)
        if isinstance(got, Entry):
            cache.write_index(plan.lookup, key)
            cache.touch_used(key)
            return BuildResult(name, plan.params, got, False, time.perf_counter() - t0)
    variant = describe(name, plan.params)
    if env.get_flag("AITER_MLA_DISABLE_JIT"):
        if force:   # nothing was looked up: saying "not built" would be wrong
            raise _disabled_error(name, plan.params, f"(key {key[:16]}...) is to be rebuilt (jit "
                                                     f"rebuild or AITER_REBUILD), which compiles", "rebuild")
        state_text = (f"is damaged in the cache ({got.reason})" if isinstance(got, Corrupt)
                      else f"is not built in {_roots(state)}")
        other = None if got is not None else _find_toolchain_free(plan)[1]
        if isinstance(other, Entry):   # e.g. a prebuilt cache on a machine that has a compiler
            tc = (other.meta.get("manifest") or {}).get("toolchain") or {}
            version = (str(tc.get("version") or "").strip().splitlines() or [""])[-1]
            state_text += (f" by this compiler ({plan.compiler.path}); an entry built by another "
                           f"toolchain ({tc.get('kind')} at {tc.get('path')}: {version!r}) is "
                           f"there, which is used only where no compiler is found")
        raise _disabled_error(name, plan.params, f"(key {key[:16]}...) {state_text}")
    try:   # a damaged entry is not served without a rebuild: offer no AITER_MLA_DISABLE_JIT
        cache = state.writable_cache(for_loads=not isinstance(got, Corrupt))
    except CacheNotWritableError as exc:
        if isinstance(got, Corrupt):   # say why a build was needed at all
            raise CacheNotWritableError(f"{variant} is damaged in the cache ({got.reason}) and "
                                        f"must be rebuilt, but {exc}") from None
        raise
    save_version(cache.toolchains_dir, plan.compiler.path)   # the root exists now: remember the probe
    with cache.lock(key, f"build of {variant}"):
        if env_rebuild and variant_id in state.rebuilt:
            force = False  # another thread of this process rebuilt it while we waited
        if not force:  # double-checked: another process may have published while we waited
            got = cache.read_entry(key, arch)
            if isinstance(got, Entry):
                cache.write_index(plan.lookup, key)
                cache.touch_used(key)
                return BuildResult(name, plan.params, got, False, time.perf_counter() - t0)
            if isinstance(got, Corrupt):
                log.warning("aiter_mla: cache entry %s of %s is corrupt (%s); moving it aside "
                            "and rebuilding", got.path, variant, got.reason)
                cache.move_aside(got.path)
        cache.remove_stale_staging(key)
        entry = _compile_and_publish(cache, plan, key, manifest, rendered.text, variant,
                                     replace=force)
    state.rebuilt.add(variant_id)
    cache.write_index(plan.lookup, key)
    cache.touch_used(key)
    return BuildResult(name, plan.params, entry, True, time.perf_counter() - t0)


def _text(v: Any) -> str:
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


def _roots(state: _State) -> str:
    """The cache roots, each marked when it does not exist (a mistyped AITER_MLA_CACHE_DIR)."""
    return " or ".join(str(c.root) + ("" if c.root.is_dir() else " (that folder does not exist)")
                       for c in state.caches)


def jit_command(command: str, name: str, params: dict, cache_dir: Path | None = None) -> str:
    """The ``aiter-mla jit COMMAND`` line for one variant, shell-quoted to paste (bools as the
    CLI spells them; ``cache_dir``: add ``--cache-dir``)."""
    argv = ["aiter-mla", "jit", command, name]
    for k, v in params.items():
        argv += ["--param", f"{k}={_text(v)}"]
    if cache_dir is not None:
        argv += ["--cache-dir", str(cache_dir)]
    return shlex.join(argv)


def _disabled_error(name: str, params: dict, what: str, command: str = "build") -> JitDisabledError:
    """The one-line error for a variant that ``AITER_MLA_DISABLE_JIT=1`` cannot serve; ``what``
    says why, after the variant's name; ``command``: the ``aiter-mla jit`` command that would
    make it ("rebuild" where a rebuild was asked for: ``jit build`` keeps a cached entry)."""
    cmd = jit_command(command, name, params)
    return JitDisabledError(
        f"AITER_MLA_DISABLE_JIT=1 and {describe(name, params)} {what}: {command} it first in an "
        f"environment without AITER_MLA_DISABLE_JIT ({cmd}; it refuses to {command} while the "
        f"variable is set), or unset AITER_MLA_DISABLE_JIT")


def _toolchain_free_ids(meta: dict) -> list[str]:
    """The ids an entry answers to in a lookup without a compiler: the toolchain-free lookup
    id recorded when it was built, and the hash of its manifest without the toolchain's
    identity (``key.toolchain_free``). Malformed meta.json: no ids."""
    ids = [meta["toolchain_free_lookup"]] if isinstance(meta.get("toolchain_free_lookup"), str) else []
    with contextlib.suppress(KeyError, TypeError, AttributeError):
        ids.append(keymod.key_of(keymod.toolchain_free(meta["manifest"])))
    return ids


def _find_toolchain_free(plan: _Plan) -> tuple[Cache | None, Entry | Corrupt | None]:
    """(cache, entry) of the newest verified entry any toolchain built for ``plan``'s source
    and flags (docs/DESIGN.md §3.9): by the toolchain-free lookup id first (no render), then by
    the toolchain-free key (renders). Else the first damaged one, else (None, None)."""
    found: tuple[Cache | None, Entry | Corrupt | None] = (None, None)
    for ident in (plan.toolchain_free_lookup, None):
        if ident is None:
            ident = keymod.key_of(keymod.toolchain_free(_exact_key(plan)[1]))
        for cache in _get_state().caches:
            got = cache.find_by_id(ident, plan.params["arch"], _toolchain_free_ids)
            if isinstance(got, Entry):
                return cache, got
            if got is not None and found[1] is None:
                found = (cache, got)
    return found


def cached_without_compiler(name: str, **params: Any) -> tuple[Cache | None, Entry | Corrupt | None]:
    """(cache, entry) that a load of this variant takes where no compiler is found (under
    ``AITER_MLA_DISABLE_JIT=1``): the newest verified entry built by any toolchain of the
    arch's kinds (hipcc before clang for AMD) from the same source and flags; else the first
    damaged one; else (None, None). Reads only. Raises ParamError, ToolchainError (an arch no
    toolchain builds), RenderError, ThirdPartyError."""
    arch = load_config().module(name).check_params(params)["arch"]
    found: tuple[Cache | None, Entry | Corrupt | None] = (None, None)
    for kind in toolchain_kinds(arch):
        cache, got = _find_toolchain_free(_plan(name, params, kind))
        if isinstance(got, Entry):
            return cache, got
        if found[1] is None:
            found = (cache, got)
    return found


def _with_cached_hint(exc: ToolchainError, name: str, params: dict) -> ToolchainError:
    """``exc`` (no usable compiler for the arch), plus, when the cache holds a build of the
    variant that a load without a compiler would take, that it does and how to load it: a
    prebuilt cache on such a machine is served only under ``AITER_MLA_DISABLE_JIT=1``. The
    lookup reads only (it fetches no dependency)."""
    try:
        checked = load_config().module(name).check_params(params)
        cache, got = cached_without_compiler(name, **checked)
    except Exception:   # noqa: BLE001 (the hint is a courtesy: the error to report is still exc)
        return exc
    if not isinstance(got, Entry):
        return exc
    return ToolchainError(f"{exc}; {describe(name, checked)} is built in {cache.root} (key "
                          f"{got.key[:16]}...), and AITER_MLA_DISABLE_JIT=1 loads it without a "
                          f"compiler", exc.variable)


def _cached_without_compiler(name: str, params: dict, force: bool, t0: float) -> BuildResult:
    """:func:`build_variant` where no compiler is found and ``AITER_MLA_DISABLE_JIT=1``."""
    checked = load_config().module(name).check_params(params)
    if force or env.get_flag("AITER_REBUILD"):
        raise _disabled_error(name, checked, "is to be rebuilt (jit rebuild or AITER_REBUILD) "
                                             "where no compiler is found", "rebuild")
    cache, got = cached_without_compiler(name, **checked)
    if isinstance(got, Entry):
        cache.touch_used(got.key)
        return BuildResult(name, checked, got, False, time.perf_counter() - t0)
    state_text = (f"is damaged in the cache ({got.reason}; key {got.key[:16]}...)" if isinstance(got, Corrupt)
                  else f"is not built in {_roots(_get_state())} by any toolchain (no compiler "
                       f"for {checked['arch']} is found here, so an entry of the same source and "
                       f"flags would do)")
    raise _disabled_error(name, checked, state_text)


# Characters an nvcc command line cannot carry in a path (see _compile_and_publish).
_NVCC_UNSAFE = frozenset(',$"\\`')


#: errnos of a cache root that cannot take a build's files (a full disk, a quota, a mount gone
#: read-only or a permission changed under the build)
_UNWRITABLE = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)


def _compile_and_publish(cache: Cache, plan: _Plan, key: str, manifest: dict, source: str,
                         variant: str, replace: bool) -> Entry:
    """Build ``plan`` in a staging folder and publish it as ``key``'s entry. An OS error writing
    the build's files (a full disk: a bare OSError with no path, and the staging folder left
    behind) removes the staging folder; a root that cannot take them is CacheNotWritableError,
    and a staging folder removed under the build (the cache root deleted) is CacheError."""
    staging = None
    try:
        staging = cache.new_staging(key)
        return _build_in(staging, cache, plan, key, manifest, source, variant, replace)
    except OSError as exc:
        if staging is not None:
            if exc.errno == errno.ENOENT and not staging.exists():
                # aiter-mla never removes a build in progress (its key is locked)
                raise CacheError(
                    f"build of {variant}: its staging folder {staging} disappeared during the "
                    f"build (the cache root {cache.root} was removed, or another program removed "
                    f"the folder); build again") from exc
            shutil.rmtree(staging, ignore_errors=True)
        if exc.errno not in _UNWRITABLE:
            raise
        where = f"{exc.filename}: " if exc.filename else ""
        raise CacheNotWritableError(
            f"build of {variant} could not write into the cache root {cache.root} ({where}"
            f"{exc.strerror or exc}): free space there, or set "
            f"{cache.origin if cache.explicit else 'AITER_MLA_CACHE_DIR'} to another folder") from exc


def _build_in(staging: Path, cache: Cache, plan: _Plan, key: str, manifest: dict, source: str,
              variant: str, replace: bool) -> Entry:
    src = staging / "source.cu"
    src.write_text(source)
    compiler = plan.compiler
    out = staging / compiler.artifact_name
    # The compiler runs in the staging folder on relative names: nvcc splits -I values on
    # commas and hands paths to a shell, so a cache, temp or install path holding , $ " \ or `
    # breaks an absolute command line. An include folder whose path holds one is reached
    # through a link there (named in build.log); the others stay absolute, so messages and
    # line info name the real headers.
    includes, links = [], {}
    for i, d in enumerate(plan.include_dirs):
        if _NVCC_UNSAFE.isdisjoint(str(d)):
            includes.append(d)
            continue
        link = staging / f"include{i}"
        try:
            os.symlink(d, link, target_is_directory=True)
        except OSError as exc:
            shutil.rmtree(staging, ignore_errors=True)   # rmtree does not follow the links made so far
            raise BuildError(f"build of {variant} failed: the include folder {str(d)!r} holds one of "
                             f"{' '.join(sorted(_NVCC_UNSAFE))}, which the compiler cannot take, and "
                             f"no link to it could be made in {staging} ({exc.strerror or exc}): "
                             f"move it (AITER_MLA_TEMPLATES_DIR, or the install) to a plainer path",
                             variant=variant, params=plan.params, source_path=src,
                             command=compiler.command(plan.flags, src, out, plan.include_dirs),
                             returncode=None, stderr_tail="") from None
        includes.append(Path(link.name))
        links[link.name] = str(d)
    run_cmd = compiler.command(plan.flags, Path(src.name), Path(out.name), includes)
    cmd = compiler.command(plan.flags, src, out, plan.include_dirs)   # the same, absolute: what meta.json records
    note = "".join(f"# {k} -> {v}\n" for k, v in links.items())
    t0 = time.perf_counter()
    try:
        rc, output, interrupted = run_compiler(run_cmd, staging, staging / "build.log", note=note)
    finally:
        for name in links:   # not published: the entry holds no link out of the cache
            with contextlib.suppress(OSError):
                (staging / name).unlink()
    seconds = time.perf_counter() - t0
    if rc < 0:   # killed by a signal: not a compile error
        problem = (f"{compiler.kind} stopped: the build was interrupted (Ctrl-C / SIGTERM)" if interrupted else
                   f"{compiler.kind} exit status {rc} (killed by signal {-rc}: it crashed, or the system "
                   f"killed it, e.g. when out of memory)")
        with contextlib.suppress(OSError), open(staging / "build.log", "a") as log:
            log.write(f"\n[aiter_mla] {problem}\n")
    elif rc == toolchain_mod.BUILD_TIMED_OUT and output.rstrip().endswith("and was killed"):
        problem = f"{compiler.kind} ran past AITER_MLA_BUILD_TIMEOUT and was killed (raise it for a slow machine)"
    else:
        problem = f"{compiler.kind} exit status {rc}" if rc != 0 else \
            check_artifact(out, compiler, plan.params["arch"])
    if problem:
        # an interrupted build keeps the key's last real failure, where there is one
        kept, earlier = cache.keep_failed(key, staging, replace=not interrupted)
        tail = "\n".join(output.strip().splitlines()[-40:])
        # the command on the kept source (the staging folder is gone), shell-quoted to paste
        again = compiler.command(plan.flags, kept, kept.parent / out.name, plan.include_dirs)
        where = (f"  this build's log was not kept; the key's last failed build (the same source): {kept.parent}"
                 if earlier else f"  rendered source and build.log: {kept.parent}")
        raise BuildError(
            f"build of {variant} failed: {problem}\n  params: {plan.params}\n"
            f"{where}\n  command, on the kept source: {shlex.join(again)}\n"
            f"  compiler output (last 40 lines):\n{tail}",
            variant=variant, params=plan.params, source_path=kept, command=again,
            returncode=rc, stderr_tail=tail)
    size, digest = _sha(out)
    meta = {
        "key": key,
        "module": plan.name,
        "params": plan.params,
        "variant": variant,
        "arch": plan.params["arch"],
        "loadable": compiler.loadable,
        "artifact": {"name": compiler.artifact_name, "size": size, "sha256": digest},
        "manifest": manifest,
        "toolchain_free_lookup": plan.toolchain_free_lookup,   # found without a compiler
        "built_at": time.time(),
        "build_seconds": round(seconds, 3),
        "command": cmd,
    }
    (staging / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
    final = cache.publish(staging, key, replace=replace)
    return Entry(key, final, final / compiler.artifact_name, meta)


def _sha(path: Path) -> tuple[int, str]:
    from .cache import file_sha256

    return file_sha256(path)


def _variant_lock(memo_key: tuple) -> ForkSafeLock:
    with _global_lock:
        lk = _variant_locks.get(memo_key)
        if lk is None:
            lk = _variant_locks[memo_key] = ForkSafeLock()
        return lk


def get_module(name: str, **params: Any) -> Module:
    """The loaded variant of JIT module ``name`` for ``params`` (every parameter the module
    lists in ``jit_config.json``, no hidden defaults), built on first use.

    Warm calls in a process are a dict lookup (thread-safe, no filesystem access). Raises
    UnknownModuleError (no module ``name`` in the config; a KeyError and a ValueError),
    ParamError (missing/unknown/disallowed parameter, listing the allowed values),
    ToolchainError, RenderError, BuildError (with the compiler's output), JitDisabledError,
    CompileOnlyError (an AMD arch built by the clang compile check), CacheError (CacheNotWritableError and
    LockTimeoutError among them), ModuleLoadError, and ValueError naming a malformed variable of
    :mod:`aiter_mla.env` (``AITER_MLA_EXTRA_NVCC_FLAGS`` with an unbalanced quote, say).
    """
    try:
        return _memo[_memo_key(name, params)]
    except KeyError:
        pass
    except TypeError:
        bad = {k: v for k, v in params.items() if not _hashable(v)}
        raise TypeError(f"get_module({name!r}): parameter values must be str, int or bool; "
                        f"got {bad}") from None
    return _load(name, params)


def _memo_key(name: str, params: dict) -> tuple:
    """The in-process memo's key. Each value's type is part of it: 64.0 == 64 and True == 1
    in Python, and a memo hit must not accept what the first call's checks refuse."""
    return (name, tuple(sorted((k, type(v), v) for k, v in params.items())))


def _hashable(v: Any) -> bool:
    try:
        hash(v)
    except TypeError:
        return False
    return True


def _load(name: str, params: dict) -> Module:
    memo_key = _memo_key(name, params)
    with _variant_lock(memo_key):
        mod = _memo.get(memo_key)
        if mod is not None:
            return mod
        for attempt in range(2):
            result = build_variant(name, **params)
            if not result.entry.loadable:
                raise CompileOnlyError(
                    f"{result.variant} was built by {result.entry.meta['manifest']['toolchain']['kind']} "
                    f"as a device code object only (a compile check: no ROCm here), which "
                    f"cannot be loaded; install ROCm (hipcc) to build a loadable module"
                )
            try:
                mod = Module(name, result.params, result.entry.key, result.entry.artifact)
                break
            except ModuleLoadError as exc:
                # The entry was moved aside (clear/rebuild) between verify and load: retry once.
                if attempt == 1 or os.path.exists(result.entry.artifact):
                    raise _with_load_advice(exc, result) from None
        _memo[memo_key] = mod
        return mod


def _with_load_advice(exc: ModuleLoadError, result: BuildResult) -> ModuleLoadError:
    """``exc`` with what to do. The entry passed its checksum, so the file is as it was
    published: when the loader rejects the file itself (not an ELF for this machine, too
    short), build it again; when a library it links to is missing, a rebuild would fail the
    same way."""
    lib = str(result.entry.artifact)
    reason = exc.reason or ""
    if reason.startswith(lib + ":") and "cannot open shared object file" not in reason:
        root = result.entry.path.parent.parent
        unset = " with AITER_MLA_DISABLE_JIT unset" if env.get_flag("AITER_MLA_DISABLE_JIT") else ""
        advice = f"to build it again{unset}: {jit_command('rebuild', result.name, result.params, root)}"
    else:
        advice = ("a library it links to could not be loaded: check LD_LIBRARY_PATH and the "
                  "CUDA or ROCm install (a rebuild would fail the same way)")
    out = ModuleLoadError(f"{exc}; {advice}")
    out.reason = exc.reason
    return out


def build_all(arch: str | None = None, include_experimental: bool | None = None,
              modules: list[str] | None = None) -> list[tuple[str, dict]]:
    """The variants ``jit build --all`` builds: every module's ``default_variants`` for
    ``arch`` (``ModuleConfig.defaults_for``: its own defaults for that arch, else the first
    arch's with ``arch`` substituted; modules that do not allow it are left out). Experimental
    modules are left out unless ``AITER_ENABLE_EXPERIMENTAL`` is non-zero (or
    ``include_experimental``)."""
    cfg = load_config()
    if include_experimental is None:
        include_experimental = is_experimental_enabled()
    out = []
    for mname, m in cfg.modules.items():
        if modules is not None and mname not in modules:
            continue
        if m.experimental and not include_experimental and modules is None:
            continue
        seen = set()
        for v in m.defaults_for(arch):
            v = dict(v)
            if arch is not None:
                if arch not in m.params["arch"]:
                    break
                v["arch"] = arch
            ident = tuple(sorted(v.items()))
            if ident not in seen:
                seen.add(ident)
                out.append((mname, v))
    return out
