"""Shared pytest set-up: the ``gpu`` marker, and an isolated JIT sandbox with a fake compiler.

``@pytest.mark.gpu`` tests are skipped, with a reason, where torch sees no CUDA device.

The ``fake_jit`` fixture gives a temporary cache root, config, templates folder and a fake
``nvcc`` (a Python script) that can sleep, fail, crash or write half a file, and logs every
build it starts, so JIT behaviour is tested on a CPU machine in milliseconds per build. It
writes a real tiny shared library (built once per session with the host C compiler) so that
loads really go through ctypes.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

GPU_SKIP_REASON = "needs an NVIDIA GPU (sm_90); none visible"

# Variables the JIT reads that a developer's shell may have set: tests start without them.
_JIT_VARS = ("AITER_MLA_CACHE_DIR", "AITER_MLA_DISABLE_JIT", "AITER_REBUILD",
             "AITER_MLA_LOCK_TIMEOUT", "AITER_MLA_NVCC", "AITER_MLA_CONFIG",
             "AITER_MLA_TEMPLATES_DIR", "AITER_MLA_EXTRA_NVCC_FLAGS", "AITER_MLA_EXTRA_HIP_FLAGS",
             "AITER_MLA_LINEINFO", "AITER_ENABLE_EXPERIMENTAL", "HIP_KITTENS_DIR",
             "AITER_MLA_GIT", "AITER_MLA_VERBOSE", "AITER_MLA_CLANG", "AITER_MLA_HIPCC",
             "NVCC_APPEND_FLAGS", "NVCC_PREPEND_FLAGS", "NVCC_CCBIN", "HIPCC_COMPILE_FLAGS_APPEND",
             "HIPCC_LINK_FLAGS_APPEND")


def pytest_collection_modifyitems(config, items):
    gpu_items = [it for it in items if it.get_closest_marker("gpu")]
    if not gpu_items:
        return
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if not has_gpu:
        skip = pytest.mark.skip(reason=GPU_SKIP_REASON)
        for it in gpu_items:
            it.add_marker(skip)


FAKE_LIB_C = r"""
int aiter_mla_fake_answer(void) { return 42; }
const char* aiter_mla_error_string(int e) { return e ? "fake error" : "no error"; }
"""

FAKE_COMPILER = r'''#!{python}
# fake nvcc for aiter_mla tests (version: {version})
import hashlib, os, signal, sys, time
args = sys.argv[1:]
if "--version" in args:
    print("fake nvcc, release 13.0, {version}")
    sys.exit(0)
out = args[args.index("-o") + 1]
src = [a for a in args if a.endswith(".cu")][0]
log = os.environ.get("FAKE_CC_LOG")
def note(what):
    if log:
        with open(log, "a") as f:
            f.write(f"{{what}} {{os.getpid()}} {{src}}\n")
note("start")
time.sleep(float(os.environ.get("FAKE_CC_SLEEP", "0")))
mode = os.environ.get("FAKE_CC_MODE", "ok")
data = open({lib!r}, "rb").read()
if mode == "rm_root":   # the cache root deleted under the build: cwd is ROOT/staging/<build>
    import shutil
    shutil.rmtree(os.path.dirname(os.path.dirname(os.getcwd())))
    sys.exit(0)
if mode == "fail":
    sys.stderr.write("fake-nvcc: error: something is wrong at line 3\nsecond line\n")
    sys.exit(2)
if mode in ("half", "half_hang", "crash"):
    with open(out, "wb") as f:
        f.write(data[: len(data) // 2])
        f.flush()
    if mode == "half_hang":
        note("half")
        time.sleep(120)
    if mode == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(0)
nonce = hashlib.sha256(open(src, "rb").read() + " ".join(args).encode()).hexdigest()
with open(out, "wb") as f:
    f.write(data + b"\0NONCE" + nonce.encode())
note("done")
'''


@pytest.fixture(scope="session")
def fake_lib(tmp_path_factory) -> Path:
    """A tiny real shared library exporting ``aiter_mla_fake_answer`` (returns 42)."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("needs a host C compiler (cc/gcc) to make the fake compiler's library")
    d = tmp_path_factory.mktemp("fakelib")
    (d / "fake.c").write_text(FAKE_LIB_C)
    subprocess.run([cc, "-shared", "-fPIC", "-O1", str(d / "fake.c"), "-o", str(d / "fake.so")],
                   check=True)
    return d / "fake.so"


FAKE_TEMPLATE = """// fake module {{ module }} n={{ n }} flavor={{ flavor }} arch={{ arch }}
#include "common/fake.cuh"
int fake_n = {{ n }};
"""


def fake_config(**extra_modules) -> dict:
    modules = {
        "fake": {
            "template": "fake.cu.j2",
            "params": {"arch": ["sm_90a"], "n": list(range(1, 17)), "flavor": ["a", "b"]},
            "default_variants": [{"arch": "sm_90a", "n": 1, "flavor": "a"},
                                 {"arch": "sm_90a", "n": 2, "flavor": "a"}],
            "flags": {"nvcc": ["-DFAKE_MODULE=1"]},
            "third_party": [],
            "experimental": False,
        },
        "fake_exp": {
            "template": "fake.cu.j2",
            "params": {"arch": ["sm_90a"], "n": [3], "flavor": ["a"]},
            "default_variants": [{"arch": "sm_90a", "n": 3, "flavor": "a"}],
            "flags": {},
            "third_party": [],
            "experimental": True,
        },
    }
    modules.update(extra_modules)
    return {
        "schema_version": 1,
        "toolchains": {"nvcc": {"flags": ["-O3", "-shared"]}, "hipcc": {"flags": []},
                       "clang": {"flags": []}},
        "third_party": {"HipKittens": {"url": "https://example.invalid/HipKittens.git",
                                       "commit": "a5e308a7ec633b1e94a952de629f41653a0874f3"}},
        "modules": modules,
    }


@dataclass
class FakeJit:
    """Handles to the sandbox: paths, the env to give children, and helpers."""

    root: Path            # cache root
    config: Path
    templates: Path
    compiler: Path
    log: Path
    lib: Path
    env: dict = field(default_factory=dict)

    def write_config(self, cfg: dict) -> None:
        self.config.write_text(json.dumps(cfg, indent=1))

    def set_version(self, version: str) -> None:
        """Rewrite the fake compiler so its ``--version`` output changes."""
        self.compiler.write_text(FAKE_COMPILER.format(python=sys.executable, version=version,
                                                      lib=str(self.lib)))
        self.compiler.chmod(0o755)

    def builds(self) -> list[str]:
        """Lines 'start PID SRC' / 'done PID SRC' the fake compiler logged."""
        if not self.log.exists():
            return []
        return [ln for ln in self.log.read_text().splitlines() if ln]

    def started(self) -> int:
        return sum(1 for ln in self.builds() if ln.startswith("start"))

    def run_child(self, code: str, extra_env: dict | None = None, timeout: float = 120,
                  check: bool = True) -> subprocess.CompletedProcess:
        """Run ``code`` in a fresh Python process with the sandbox's environment."""
        env = {**self.env, **(extra_env or {})}
        proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                              capture_output=True, text=True, timeout=timeout, cwd=str(REPO))
        if check and proc.returncode != 0:
            raise AssertionError(f"child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return proc

    def spawn_child(self, code: str, extra_env: dict | None = None) -> subprocess.Popen:
        env = {**self.env, **(extra_env or {})}
        return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=str(REPO), start_new_session=True)


def load_example(name: str):
    """``examples/<name>.py`` loaded as a fresh module (examples are scripts, not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"example_{name}", REPO / "examples" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def deny_write_access(monkeypatch, folder, any_write_bit: bool = False) -> None:
    """Make ``os.access(folder, W_OK)`` answer False in this process (a root user's stand-in for a
    read-only mount); ``any_write_bit``: also for modes that include W_OK among others."""
    real_access = os.access

    def access(p, mode, **kw):
        writes = (mode & os.W_OK) if any_write_bit else mode == os.W_OK
        return False if writes and str(p) == str(folder) else real_access(p, mode, **kw)

    monkeypatch.setattr(os, "access", access)


def run_read_only(ro_dirs, cmd: list[str], env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``cmd`` in a child that sees every folder of ``ro_dirs`` read-only, all the way down:
    a private read-only bind mount for root (chmod does not stop root), else ``chmod -R a-w``
    for the run (modes restored after). Skips the test where neither can be done."""
    if os.geteuid() != 0:
        modes = {}
        for d in ro_dirs:
            for p in [Path(d), *Path(d).rglob("*")]:
                if not p.is_symlink():
                    modes[p] = p.stat().st_mode
        for p, mode in sorted(modes.items(), key=lambda kv: len(kv[0].parts), reverse=True):
            p.chmod(mode & ~0o222)   # children first: a read-only folder's entries stay reachable
        try:
            return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        finally:
            for p, mode in sorted(modes.items(), key=lambda kv: len(kv[0].parts)):
                p.chmod(mode)
    # absolute paths: the child's env may have a PATH without them (a machine with no compiler)
    unshare, sh, mount = (shutil.which(t) for t in ("unshare", "sh", "mount"))
    if None in (unshare, sh, mount):
        pytest.skip("root without unshare(1)/mount(8): cannot make a folder read-only for the test")
    probe = subprocess.run([unshare, "-m", sh, "-c", f"{mount} --bind -o ro / /tmp 2>/dev/null; exit 0"],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip("unshare -m is not permitted here: cannot make a read-only mount")
    mounts = " && ".join(f"{mount} --bind -o ro {shlex.quote(str(d))} {shlex.quote(str(d))}" for d in ro_dirs)
    return subprocess.run([unshare, "-m", sh, "-c", f'{mounts} && exec "$0" "$@"', *cmd], env=env,
                          capture_output=True, text=True, timeout=timeout)


def tree_snapshot(root: Path) -> dict[str, tuple]:
    """(kind, size, mtime_ns, mode) of every path under ``root``: equal snapshots mean nothing
    under it was written, created, removed or touched."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(root))] = (p.is_dir(), st.st_size, st.st_mtime_ns, st.st_mode)
    return out


@pytest.fixture
def jit_clean(monkeypatch):
    """No JIT variable from the caller's shell; fresh per-process JIT state before and after."""
    from aiter_mla.jit import core

    for v in _JIT_VARS:
        monkeypatch.delenv(v, raising=False)
    core.reset_state()
    yield
    core.reset_state()


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    """Real builds into a cache under tmp_path instead of the user's default cache (tests that
    compile a real module on a machine without a GPU must not leave entries behind)."""
    from aiter_mla.jit import core

    monkeypatch.setenv("AITER_MLA_CACHE_DIR", str(tmp_path / "jit_cache"))
    core.reset_state()
    yield tmp_path / "jit_cache"
    core.reset_state()


def _cuda_binary_tool(name: str) -> str | None:
    """``name`` on PATH, else from the nvidia-cuda-* wheels (nvidia/cu*/bin)."""
    exe = shutil.which(name)
    if exe:
        return exe
    try:
        import nvidia
        for root in nvidia.__path__:
            for cand in Path(root).glob(f"cu*/bin/{name}"):
                return str(cand)
    except ImportError:
        pass
    return None


@pytest.fixture
def cuobjdump() -> str:
    """Path of cuobjdump (PATH, else the nvidia-cuda-cuobjdump wheel); skips the test, with the
    reason, when there is none."""
    exe = _cuda_binary_tool("cuobjdump")
    if exe is None:
        pytest.skip("cuobjdump not found (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm, "
                    "part of the test extra)")
    return exe


@pytest.fixture
def cuobjdump_sass(cuobjdump) -> str:
    """cuobjdump for ``-sass``, which also needs nvdisasm (beside it or on PATH); skips, with
    the reason, without it."""
    beside = Path(cuobjdump).with_name("nvdisasm")
    if not beside.exists() and shutil.which("nvdisasm") is None:
        pytest.skip("nvdisasm not found: cuobjdump -sass needs it (pip install nvidia-cuda-nvdisasm, "
                    "part of the test extra)")
    return cuobjdump


@pytest.fixture
def fake_jit(tmp_path, monkeypatch, fake_lib, jit_clean) -> FakeJit:
    """An isolated JIT with a fake nvcc: set in this process (monkeypatch) and in ``.env``."""
    templates = tmp_path / "templates"
    (templates / "common").mkdir(parents=True)
    (templates / "fake.cu.j2").write_text(FAKE_TEMPLATE)
    (templates / "common" / "fake.cuh").write_text('#pragma once\n#include "fake_inner.cuh"\n')
    (templates / "common" / "fake_inner.cuh").write_text("#pragma once\n#define FAKE_INNER 1\n")
    (templates / "common" / "unrelated.cuh").write_text("#pragma once\n#define UNRELATED 1\n")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fj = FakeJit(root=tmp_path / "cache", config=tmp_path / "jit_config.json",
                 templates=templates, compiler=bindir / "fake-nvcc", log=tmp_path / "builds.log",
                 lib=fake_lib)
    fj.write_config(fake_config())
    fj.set_version("v1")
    settings = {"AITER_MLA_CACHE_DIR": str(fj.root), "AITER_MLA_CONFIG": str(fj.config),
                "AITER_MLA_TEMPLATES_DIR": str(fj.templates), "AITER_MLA_NVCC": str(fj.compiler),
                "FAKE_CC_LOG": str(fj.log), "AITER_MLA_LOCK_TIMEOUT": "60"}
    for k, v in settings.items():
        monkeypatch.setenv(k, v)
    child = {k: v for k, v in os.environ.items() if k not in _JIT_VARS}
    child.update(settings)
    child["PYTHONPATH"] = str(REPO) + os.pathsep + child.get("PYTHONPATH", "")
    fj.env = child
    return fj
