"""Compilers: find one for an arch, fingerprint it, build a command, run it, check its output.

=========  ===========================  ===================================================
arch       compiler                     artifact
=========  ===========================  ===================================================
sm_90a     nvcc                         ``lib.so``: host library, static cudart, ctypes-loadable
gfx942/950 hipcc (ROCm installed)       ``lib.so``: host library, ctypes-loadable
gfx942     clang-19 ``-x hip`` (no ROCm) ``code.hsaco``: device code object, compile-only check
=========  ===========================  ===================================================

clang-19 does not know gfx950 (LLVM 20 added it), so gfx950 needs ROCm's hipcc or a newer clang
set through ``AITER_MLA_CLANG``.

A compiler's identity is its path and ``--version`` output. The output is remembered on disk
by (path, size, mtime), so a warm cache hit in a new process starts no subprocess (CuPy's nvcc
backend spends 0.42 s per process re-running nvcc for its key).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shlex
import shutil
import struct
import sys
import time
import logging
import weakref
from dataclasses import dataclass
from pathlib import Path

from .. import env
from ..arch import AMD_ARCHS, NVIDIA_ARCHS

#: The key-changing env vars each toolchain reads (their values enter the key of its builds).
KEY_ENV = {
    "nvcc": ("AITER_MLA_EXTRA_NVCC_FLAGS", "AITER_MLA_LINEINFO", "NVCC_APPEND_FLAGS",
             "NVCC_PREPEND_FLAGS", "NVCC_CCBIN", "CUDAHOSTCXX", "CC", "CXX"),
    "hipcc": ("AITER_MLA_EXTRA_HIP_FLAGS", "AITER_MLA_LINEINFO", "HIPCC_COMPILE_FLAGS_APPEND",
              "HIPCC_LINK_FLAGS_APPEND", "HIP_CLANG_PATH", "CC", "CXX"),
    "clang": ("AITER_MLA_EXTRA_HIP_FLAGS", "AITER_MLA_LINEINFO"),
}

#: The key-changing env vars of :data:`KEY_ENV` that pick which compiler runs rather than how it
#: compiles: part of the toolchain's identity, which a lookup without a compiler cannot check.
TOOLCHAIN_ENV = frozenset({"NVCC_CCBIN", "CUDAHOSTCXX", "CC", "CXX", "HIP_CLANG_PATH"})

#: ELF ``e_flags & 0xff`` (EF_AMDGPU_MACH) of each AMD target, checked on every code object.
_AMDGPU_MACH = {"gfx942": 0x4C, "gfx950": 0x4F}
_EM_AMDGPU = 224
_HOST_EM = {"x86_64": 62, "aarch64": 183, "ppc64le": 21}


class ToolchainError(RuntimeError):
    """No usable compiler for an arch; the message says what to install or which variable to set.

    ``variable``: the set variable that chose the compiler that does not work (not executable,
    its ``--version`` fails, not what it should be, too old), else None (none installed, or one
    that works but cannot build this arch)."""

    def __init__(self, message: str, variable: str | None = None):
        super().__init__(message)
        self.variable = variable


class BuildError(RuntimeError):
    """A compile failed or produced an unusable artifact.

    Attributes: ``variant`` (readable name), ``params``, ``source_path`` (the rendered source,
    kept for inspection), ``command``, ``returncode``, ``stderr_tail``.
    """

    def __init__(self, message: str, *, variant: str, params: dict, source_path: Path,
                 command: list[str], returncode: int | None, stderr_tail: str):
        super().__init__(message)
        self.variant = variant
        self.params = dict(params)
        self.source_path = source_path
        self.command = list(command)
        self.returncode = returncode
        self.stderr_tail = stderr_tail


@dataclass(frozen=True)
class Compiler:
    """One found compiler. ``loadable`` says whether its artifact is a host library that
    ctypes can load (False for the clang compile-only check)."""

    kind: str
    path: str
    version: str

    @classmethod
    def absent(cls, kind: str) -> "Compiler":
        """Stands for a ``kind`` compiler that is not installed, for a lookup without one: its
        flags are known (they depend on the kind only), its identity is the kind alone."""
        return cls(kind, "", "")

    @property
    def loadable(self) -> bool:
        return self.kind != "clang"

    @property
    def artifact_name(self) -> str:
        return "lib.so" if self.loadable else "code.hsaco"

    def identity(self) -> dict:
        """The compiler's part of the cache key; for nvcc and hipcc also the compiler they run
        (``host_compiler``: nvcc's host C++ compiler, hipcc's clang; which one, and that
        file's identity, :func:`compiler_identity`). clang-19 compiles alone: its own file and
        version are its identity."""
        if not self.path:   # Compiler.absent
            return {"kind": self.kind}
        ident = {"kind": self.kind, "path": self.path, "version": self.version}
        if self.kind == "nvcc":
            ident["host_compiler"] = host_compiler_identity()
        elif self.kind == "hipcc":
            ident["host_compiler"] = hip_clang_identity(self.path)
        return ident

    def arch_flags(self, arch: str) -> list[str]:
        """Target flags: one exact SASS target for NVIDIA (no PTX, so nothing is JIT-compiled
        by the driver at load), ``--offload-arch`` for AMD."""
        if self.kind == "nvcc":
            num = arch[len("sm_"):]
            return [f"-gencode=arch=compute_{num},code={arch}"]
        flags = [f"--offload-arch={arch}"]
        if self.kind == "clang":
            flags.append("--no-gpu-bundle-output")  # a plain AMDGPU ELF, not an offload bundle
        return flags

    def env_flags(self) -> list[str]:
        """Flags that come from key-changing env vars (see :data:`KEY_ENV`)."""
        if self.kind == "nvcc":
            extra = env.get_words("AITER_MLA_EXTRA_NVCC_FLAGS")
            lineinfo = ["-lineinfo"]
        else:
            extra = env.get_words("AITER_MLA_EXTRA_HIP_FLAGS")
            lineinfo = ["-gline-tables-only"]
        return (lineinfo if env.get_flag("AITER_MLA_LINEINFO") else []) + extra

    def command(self, flags: list[str], source: Path, output: Path,
                include_dirs: list[Path]) -> list[str]:
        """The full command line; ``flags`` are the normalized flags that enter the key
        (paths stay out of the key: their contents are hashed instead)."""
        incs = [f"-I{d}" for d in include_dirs]
        return [self.path, *flags, *incs, str(source), "-o", str(output)]


def _first_executable(candidates: list[tuple[str, str | None]]) -> tuple[str, str] | None:
    """The first (origin, path) that is an executable file, its path made absolute: compilers
    run in a staging folder, where a path relative to the caller's directory means nothing."""
    for origin, path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return origin, os.path.abspath(path)
    return None


def explicit_tool(var: str) -> str | None:
    """The program ``var`` names (a path, or a bare name such as ``nvcc`` looked up on PATH),
    None when unset; raises :class:`ToolchainError` naming ``var`` when it is no executable."""
    value = env.get(var)
    if not value:
        return None
    found = _first_executable([(var, (shutil.which(value) or value) if os.sep not in value else value)])
    if found is None:
        raise ToolchainError(f"{var}={value!r} is not an executable file", variable=var)
    return found[1]


def _find_nvcc() -> str:
    explicit = explicit_tool("AITER_MLA_NVCC")
    if explicit:
        return explicit
    cands = [(var, os.path.join(env.get(var), "bin", "nvcc") if env.get(var) else None)
             for var in ("CUDA_HOME", "CUDA_PATH")]
    cands += [("PATH", shutil.which("nvcc")), ("default", "/usr/local/cuda/bin/nvcc")]
    found = _first_executable(cands)
    named = next((var for var, path in cands[:2] if path is not None), None)   # the toolkit root set first
    if found is not None and named is not None and found[0] != named:   # it has no nvcc: say which one is used
        # a log line, as the JIT's other warnings: a Python warning prints its source line
        logging.getLogger("aiter_mla.jit").warning(
            "aiter_mla: %s=%r has no executable bin/nvcc; using %s (from %s)", named, env.get(named),
            found[1], found[0])
    if found is None:
        raise ToolchainError(
            "nvcc not found (needed for sm_90a): install the CUDA toolkit (12.5 or newer), then "
            "set AITER_MLA_NVCC to the nvcc binary, or CUDA_HOME to the toolkit root, "
            "or put nvcc on PATH"
        )
    return found[1]


def _find_hipcc() -> str | None:
    explicit = explicit_tool("AITER_MLA_HIPCC")
    if explicit:
        return explicit
    rocm = env.get("ROCM_PATH")
    found = _first_executable([
        ("ROCM_PATH", os.path.join(rocm, "bin", "hipcc") if rocm else None),
        ("default", "/opt/rocm/bin/hipcc"),
        ("PATH", shutil.which("hipcc")),
    ])
    return found[1] if found else None


def _find_clang() -> str | None:
    explicit = explicit_tool("AITER_MLA_CLANG")
    if explicit:
        return explicit
    found = _first_executable([("PATH", shutil.which("clang-19"))])
    return found[1] if found else None


#: Oldest nvcc the sm_90a templates build with: the TMA paths resolve cuTensorMapEncodeTiled
#: through cudaGetDriverEntryPointByVersion, which CUDA 12.5 added (README: CUDA 12.5+).
MIN_NVCC_RELEASE = (12, 5)


def nvcc_release(version_text: str) -> tuple[int, int] | None:
    """(major, minor) from ``nvcc --version`` output (``Cuda compilation tools, release 13.0``)."""
    m = re.search(r"release (\d+)\.(\d+)", version_text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def clang_major(version_text: str) -> int | None:
    """The major version in ``clang --version`` output (``Debian clang version 19.1.7``)."""
    m = re.search(r"clang version (\d+)", version_text)
    return int(m.group(1)) if m else None


def _probe(path: str, identity_dir: Path | None, fix: str, variable: str | None) -> str:
    """:func:`compiler_version`, its error extended with the variable that picks another
    compiler (``fix``: "VAR to ...") and carrying ``variable`` (the set one that chose it)."""
    try:
        return compiler_version(path, identity_dir)
    except ToolchainError as exc:
        raise ToolchainError(f"{exc} (set {fix})", variable=variable) from None


def _chosen_by(var: str) -> str | None:
    """``var`` when it is set (it chose the compiler), else None."""
    return var if env.get(var) else None


def toolchain_kinds(arch: str) -> tuple[str, ...]:
    """The compiler kinds that can build ``arch``, in the order :func:`find_compiler` prefers
    them. Raises :class:`ToolchainError` for an arch no toolchain builds."""
    if arch in NVIDIA_ARCHS:
        return ("nvcc",)
    if arch in AMD_ARCHS:
        return ("hipcc", "clang")
    raise ToolchainError(f"no toolchain for arch {arch!r}")


def find_compiler(arch: str, identity_dir: Path | None) -> Compiler:
    """The compiler that builds ``arch``, with its identity. ``identity_dir`` holds the
    remembered ``--version`` outputs (None: remember in this process only).

    Raises :class:`ToolchainError` naming what to install or which variable to set.
    """
    if arch in NVIDIA_ARCHS:
        path = _find_nvcc()
        var = _chosen_by("AITER_MLA_NVCC")
        version = _probe(path, identity_dir, "AITER_MLA_NVCC to a working nvcc, or CUDA_HOME to its toolkit root", var)
        release = nvcc_release(version)
        if release is None or release < MIN_NVCC_RELEASE:
            found = "names no CUDA release" if release is None else f"is CUDA {release[0]}.{release[1]}"
            raise ToolchainError(
                f"nvcc at {path} {found} (--version: {(version.strip().splitlines() or [''])[-1][:120]!r}); "
                f"sm_90a modules need CUDA {MIN_NVCC_RELEASE[0]}.{MIN_NVCC_RELEASE[1]} or newer: "
                f"set AITER_MLA_NVCC to a newer nvcc, or CUDA_HOME to its toolkit root", variable=var
            )
        return Compiler("nvcc", path, version)
    toolchain_kinds(arch)   # raises for an arch no toolchain builds
    hipcc = _find_hipcc()
    if hipcc:
        return Compiler("hipcc", hipcc, _probe(hipcc, identity_dir, "AITER_MLA_HIPCC or ROCM_PATH",
                                               _chosen_by("AITER_MLA_HIPCC")))
    clang = _find_clang()
    if clang is None:
        # gfx950 is in LLVM from clang 20: Debian's clang-19 would not build it
        check = ("Debian's clang-19 and lld-19 (apt-get install clang-19 lld-19; or set "
                 "AITER_MLA_CLANG) for the compile-only check" if arch == "gfx942" else
                 "clang 20 or newer with lld (set AITER_MLA_CLANG; the README's 'To compile "
                 "gfx950 here' uses the ziglang package's clang 22) for the compile-only check")
        raise ToolchainError(
            f"no AMD toolchain for {arch}: install ROCm (hipcc; set ROCM_PATH or AITER_MLA_HIPCC) "
            f"to build loadable modules, or {check}"
        )
    var = _chosen_by("AITER_MLA_CLANG")
    version = _probe(clang, identity_dir, "AITER_MLA_CLANG to clang 19 or newer", var)
    major = clang_major(version)
    if major is None:
        first = (version.splitlines() or [""])[0][:120]
        raise ToolchainError(
            f"{clang} is not clang: its --version names no 'clang version N' ({first!r}); set "
            f"AITER_MLA_CLANG to clang 19 or newer (20 or newer for gfx950)", variable=var)
    if arch == "gfx950" and major < 20:
        raise ToolchainError(
            f"gfx950 needs a newer toolchain than clang {major} at {clang} (LLVM added gfx950 "
            f"in clang 20): install ROCm 6.4+ (hipcc; set ROCM_PATH or AITER_MLA_HIPCC) or "
            f"set AITER_MLA_CLANG to clang 20 or newer"
        )
    return Compiler("clang", clang, version)


_versions: dict[tuple, str] = {}
# Probes that timed out or failed, by identity, with when: a hanging `--version` costs its
# timeout once, not once per variant looked up. Kept for a while only, since the identity does
# not cover everything a probe depends on (the environment, a slow disk's one-off timeout).
_failed_probes: dict[str, tuple[str, float]] = {}
FAILED_PROBE_TTL_S = 60.0

# Absolute paths named in a wrapper script (e.g. /usr/local/bin/nvcc: exec /usr/local/cuda/bin/nvcc)
_SCRIPT_PATH = re.compile(rb"(/[^\s'\"`;|&$()<>]+)")


def _file_stamp(path: str) -> list:
    st = os.stat(path)
    return [os.path.abspath(path), os.path.realpath(path), st.st_size, st.st_mtime_ns]


def compiler_identity(path: str) -> list:
    """What identifies the compiler at ``path`` without running it: its path, resolved path,
    size and mtime, and, when it is a script (``#!``), the same for every existing file whose
    absolute path the script names. So a toolkit switched behind a wrapper script or a
    symlinked directory (/usr/local/cuda -> cuda-12.4) is seen as a different compiler
    (ccache's default "mtime" check misses both)."""
    stamp = [_file_stamp(path)]
    try:
        with open(path, "rb") as f:
            head = f.read(2)
            if head == b"#!":   # a script: read it (a compiler binary is not read further)
                head += f.read(65536)
    except OSError:
        return stamp
    if head.startswith(b"#!"):
        for token in dict.fromkeys(_SCRIPT_PATH.findall(head)):
            named = token.decode(errors="replace")
            if os.path.isfile(named):
                stamp.append(_file_stamp(named))
    return stamp


def host_compiler_identity() -> list:
    """The host compiler nvcc uses: ``NVCC_CCBIN`` (a path or a name on PATH), else ``g++`` on
    PATH (nvcc's default on Linux), identified by :func:`compiler_identity` (no run); the name
    alone when it cannot be found (the build then fails, as nvcc would)."""
    import shutil

    name = (env.get("NVCC_CCBIN") or "").strip() or "g++"
    path = name if os.sep in name else shutil.which(name)
    if not path or not os.path.isfile(path):
        return [name]
    return compiler_identity(path)


def hip_clang_identity(hipcc: str) -> list:
    """The clang hipcc runs: ``HIP_CLANG_PATH``/clang++ when set, else ROCm's own beside
    ``hipcc`` (``<rocm>/lib/llvm/bin`` or ``<rocm>/llvm/bin``), identified by
    :func:`compiler_identity` (no run); the expected path alone when none is there. hipcc's
    ``--version`` (in the key) is remembered by hipcc's own file, so a clang replaced under it
    shows only here."""
    explicit = (env.get("HIP_CLANG_PATH") or "").strip()
    rocm = Path(os.path.realpath(hipcc)).parent.parent
    places = [Path(explicit)] if explicit else [rocm / "lib" / "llvm" / "bin", rocm / "llvm" / "bin"]
    for folder in places:
        path = folder / "clang++"
        if path.is_file():
            return compiler_identity(str(path))
    return [str(places[0] / "clang++")]


def compiler_version(path: str, identity_dir: Path | None) -> str:
    """``path --version`` output, remembered in-process and on disk under ``identity_dir``
    by ``compiler_identity(path)``; a changed binary (or a changed target of a wrapper script)
    is probed again."""
    stamp_list = compiler_identity(path)
    stamp = json.dumps(stamp_list)
    version = _versions.get(stamp)
    if version is not None:
        return version
    failed = _failed_probes.get(stamp)
    if failed is not None and time.monotonic() - failed[1] < FAILED_PROBE_TTL_S:
        raise ToolchainError(f"{failed[0]} (a probe {time.monotonic() - failed[1]:.0f} s ago; "
                             f"probed again after {FAILED_PROBE_TTL_S:.0f} s)")
    record = None
    if identity_dir is not None:
        record = _version_record(identity_dir, stamp_list)
        try:
            saved = json.loads(record.read_text())
            if saved["identity"] == stamp_list:
                _versions[stamp] = saved["version"]
                return saved["version"]
        except (OSError, ValueError, KeyError, TypeError):
            pass
    # Imported here, not above: importing subprocess costs milliseconds (signal, locale), and a
    # warm hit in a new process must not pay for a probe it does not run.
    import subprocess

    try:
        # run_group replaces bytes that are not UTF-8: a banner is still a banner to report
        proc = run_group([path, "--version"], timeout=30)
    except subprocess.TimeoutExpired as exc:
        why = f"could not run {path} --version: {exc}"
        _failed_probes[stamp] = (why, time.monotonic())
        raise ToolchainError(why) from None
    except OSError as exc:   # may pass (a busy file, no process slot): probed again next time
        raise ToolchainError(f"could not run {path} --version: {exc}") from None
    if proc.returncode != 0:
        # one line: the output's last line says why (a whole banner would bury the reason)
        last = ((proc.stderr or proc.stdout).strip().splitlines() or [""])[-1][-200:]
        why = f"{path} --version failed with exit status {proc.returncode}" + (f": {last}" if last else "")
        _failed_probes[stamp] = (why, time.monotonic())
        raise ToolchainError(why)
    version = (proc.stdout + proc.stderr).strip()
    _versions[stamp] = version
    # Remembered only inside a cache root a build has made (it has entries/): a lookup (jit
    # list, a load under AITER_MLA_DISABLE_JIT) must not create a mistyped root, or a
    # toolchains/ folder in any existing folder named as one, as a side effect. A build that
    # makes the root writes it then (save_version).
    if record is not None and (identity_dir.parent / "entries").is_dir():
        _write_version(record, stamp_list, version)
    return version


def _version_record(identity_dir: Path, stamp_list: list) -> Path:
    return identity_dir / (hashlib.sha256(stamp_list[0][0].encode()).hexdigest()[:32] + ".json")


def _write_version(record: Path, stamp_list: list, version: str) -> None:
    from .cache import atomic_write_text  # noqa: PLC0415 (cache imports this module)

    atomic_write_text(record, json.dumps({"identity": stamp_list, "version": version}),
                      best_effort=True)


def save_version(identity_dir: Path, path: str) -> None:
    """Write the ``--version`` output this process probed for the compiler at ``path`` into
    ``identity_dir`` (a cache root's ``toolchains/``, once a build has made the root), so the
    next process's warm hit probes nothing."""
    if not path:   # Compiler.absent
        return
    stamp_list = compiler_identity(path)
    version = _versions.get(json.dumps(stamp_list))
    record = _version_record(identity_dir, stamp_list)
    if version is not None and not record.exists():
        _write_version(record, stamp_list, version)


def run_group(command: list[str], timeout: float):
    """``subprocess.run(command, capture_output=True, text=True)`` (errors replaced) in a
    process group of its own, which is killed whole when ``timeout`` seconds pass: a wrapper
    script's children (a hung ``sleep``) must not outlive it. Raises OSError, and
    ``subprocess.TimeoutExpired`` after the kill."""
    import subprocess

    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          errors="replace", env=env.child_environ(), start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except BaseException:
            _kill_group(proc, interrupted=False)
            raise   # leaving the with block closes the pipes, which a detached child may hold
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def _drain(proc) -> str:
    """The rest of a killed compiler's output. A descendant that left its process group (a
    compiler-cache daemon) may hold the pipe open: after 5 s the pipes are closed and what was
    read is kept."""
    import subprocess

    try:
        return proc.communicate(timeout=5)[0] or ""
    except subprocess.TimeoutExpired as exc:
        for f in (proc.stdout, proc.stderr):
            if f is not None:
                f.close()
        part = exc.output or b""
        return part.decode("utf-8", "surrogateescape") if isinstance(part, bytes) else part


#: AITER_MLA_BUILD_TIMEOUT values from this on (inf included) mean no limit, as 0 does: the
#: pipe wait cannot take a timeout of that size (OverflowError).
_NO_LIMIT_SECONDS = 1e6


#: run_compiler's exit status for a compiler killed at AITER_MLA_BUILD_TIMEOUT (as timeout(1)).
BUILD_TIMED_OUT = 124


def run_compiler(command: list[str], cwd: Path, log_path: Path, note: str = "") -> tuple[int, str, bool]:
    """Run a build in ``cwd``; write ``note``, its command and output to ``log_path``; return
    (exit status, output, interrupted): interrupted when this process killed the compiler
    (:func:`kill_running_builds`, on Ctrl-C / SIGTERM), not when something else did (a crash,
    the out-of-memory killer). A compiler still running after ``AITER_MLA_BUILD_TIMEOUT``
    seconds (0, inf or 1e6 and more: no limit) is killed with its process group: exit status
    :data:`BUILD_TIMED_OUT`, not interrupted, and the output ends with a line saying so.
    Raises ValueError for a malformed AITER_MLA_BUILD_TIMEOUT.

    The compiler's temporary files (TMPDIR, TMP, TEMP) go to ``cwd/tmp``, removed when it ends:
    nvcc cannot clean up its tmpxft_* files when an interrupted build is killed."""
    import shutil
    import subprocess

    limit = env.get_float("AITER_MLA_BUILD_TIMEOUT", 600.0, minimum=0.0)
    if env.get_flag("AITER_MLA_VERBOSE"):
        print("aiter_mla: " + shlex.join(command), file=sys.stderr)
    tmp = Path(cwd) / "tmp"
    tmp.mkdir(exist_ok=True)
    # relative to cwd, for the reason the command is (core._compile_and_publish)
    child_env = env.child_environ(TMPDIR="tmp", TMP="tmp", TEMP="tmp")
    timed_out = False
    try:
        try:
            # Its own process group, so an interrupted build (Ctrl-C, SIGTERM from a batch
            # scheduler or `timeout`) takes nvcc's children (cicc, ptxas) down with it.
            # bytes that are not UTF-8 (a path's, as the OS gives it) pass through as
            # surrogates and back out unchanged into build.log
            proc = subprocess.Popen(command, cwd=str(cwd), stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, encoding="utf-8",
                                    errors="surrogateescape", env=child_env,
                                    start_new_session=True)
        except OSError as exc:
            rc, out, proc = 127, f"could not start {command[0]}: {exc}", None
        else:
            _running.add(proc)
            try:
                try:
                    out, _ = proc.communicate(timeout=limit if 0 < limit < _NO_LIMIT_SECONDS else None)
                except subprocess.TimeoutExpired:
                    timed_out = True
                    _kill_group(proc, interrupted=False)
                    out = _drain(proc)
            except BaseException:
                _kill_group(proc)
                raise
            finally:
                _running.discard(proc)
            rc = proc.returncode
            if timed_out:
                rc = BUILD_TIMED_OUT
                out = (out or "") + (f"\n[aiter_mla] {Path(command[0]).name} ran past "
                                     f"AITER_MLA_BUILD_TIMEOUT={limit:g} s and was killed\n")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log_path.write_text(f"# in {cwd}\n{note}$ " + shlex.join(command) + "\n" + out,
                        encoding="utf-8", errors="surrogateescape")   # a cache path need not be UTF-8
    # a timeout is not an interrupt, even where a Ctrl-C came while the timed-out group was reaped
    return rc, out, not timed_out and proc is not None and proc in _killed


_running: set = set()  # compiler processes of builds in flight (any thread)
_killed: weakref.WeakSet = weakref.WeakSet()  # the ones _kill_group killed: interrupted builds


def kill_running_builds() -> None:
    """Kill every compiler this process started and is still waiting for (the CLI calls it
    on Ctrl-C / SIGTERM: builds run in worker threads, which a signal does not interrupt).
    Their builds then fail, and their staging folders are removed as for any failed build."""
    for proc in list(_running):
        _kill_group(proc)


@contextlib.contextmanager
def interruptible(pool):
    """Wrap the body that waits on a pool of builds: on Ctrl-C / SIGTERM (or any error), cancel
    the builds not started and kill the running compilers, so leaving the pool's ``with``
    block does not wait for them to finish."""
    try:
        yield
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        kill_running_builds()
        raise


def _kill_group(proc, interrupted: bool = True) -> None:
    """SIGKILL ``proc``'s process group and reap it; ``interrupted``: a Ctrl-C / SIGTERM kill
    (recorded for run_compiler's report), not a timeout."""
    import signal

    if proc.returncode is not None:   # reaped already: its pid may belong to another process now
        return
    if interrupted:
        _killed.add(proc)   # before the kill: the build's thread reads it once communicate() returns
    try:
        if hasattr(os, "killpg"):
            os.killpg(proc.pid, signal.SIGKILL)
        else:   # no process groups (Windows): the compiler alone
            proc.kill()
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def check_artifact(path: Path, compiler: Compiler, arch: str) -> str | None:
    """None when ``path`` is a complete ELF of the expected kind, else the reason it is not.

    Catches a truncated file (section headers lie past the end, where ELF writers put them)
    and a wrong target (host machine for a ``.so``, EF_AMDGPU_MACH for a code object).
    """
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            size = os.fstat(f.fileno()).st_size
    except FileNotFoundError:
        return "the compiler wrote no output file"
    if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
        return f"not a 64-bit little-endian ELF file ({size} bytes)"
    e_type, e_machine = struct.unpack_from("<HH", head, 16)
    e_shoff = struct.unpack_from("<Q", head, 40)[0]
    e_flags = struct.unpack_from("<I", head, 48)[0]
    e_shentsize, e_shnum = struct.unpack_from("<HH", head, 58)
    if e_type != 3:
        return f"ELF type {e_type} is not a shared object"
    if e_shoff == 0 or e_shoff + e_shentsize * e_shnum > size:
        return f"truncated: section headers end past the file's {size} bytes"
    if compiler.loadable:
        import platform

        want = _HOST_EM.get(platform.machine())
        if want is not None and e_machine != want:
            return f"ELF machine {e_machine} is not this host's ({want})"
    else:
        if e_machine != _EM_AMDGPU:
            return f"ELF machine {e_machine} is not AMDGPU ({_EM_AMDGPU})"
        mach = e_flags & 0xFF
        if mach != _AMDGPU_MACH.get(arch):
            return f"code object is for EF_AMDGPU_MACH {mach:#x}, not {arch}"
    return None
