"""The built wheel works outside the checkout (CPU; issue 23, item 1).

The wheel is built from an export of the repository's files (tracked, plus untracked ones git
does not ignore: never a stale ``build/``), installed into a fresh target folder, and its CLI is
run from a folder outside the checkout with this interpreter's torch, jinja2 and filelock but
not the editable install of the checkout (its import hook is removed in the child).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from aiter_mla import paths

pytestmark = pytest.mark.slow

_RUNNER = r"""
import sys
site = sys.argv[1]
# drop the editable install's finder (it maps aiter_mla to the checkout) and use the wheel
sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in type(f).__module__]
sys.path.insert(0, site)
import aiter_mla, aiter_mla.paths as p
assert aiter_mla.__file__.startswith(site), aiter_mla.__file__
assert p.INSTALLED_DATA and str(p.TEMPLATES_DIR).startswith(site), p.TEMPLATES_DIR
from aiter_mla.cli import main
sys.exit(main(sys.argv[2:]))
"""


def _run(pip_args, **kw):
    return subprocess.run([sys.executable, "-m", "pip", *pip_args], capture_output=True, text=True,
                          timeout=600, **kw)


@pytest.fixture(scope="module")
def installed_wheel(tmp_path_factory):
    if shutil.which("git") is None or not (paths.REPO_ROOT / ".git").exists():
        pytest.skip("needs the git checkout (the wheel is built from its files)")
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=paths.REPO_ROOT, capture_output=True, check=True).stdout
    for rel in filter(None, files.decode().split("\0")):
        if (paths.REPO_ROOT / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(paths.REPO_ROOT / rel, src / rel)
    # a module left in build/ by an earlier build of a checkout that has since deleted it
    stale = src / "build" / "lib" / "aiter_mla" / "zz_stale_module.py"
    stale.parent.mkdir(parents=True)
    stale.write_text("STALE = 1\n")
    built = _run(["wheel", "-q", "--no-deps", "-w", str(root / "dist"), str(src)])
    if built.returncode != 0:
        tail = (built.stderr.strip().splitlines() or ["?"])[-1]
        if "No matching distribution" in built.stderr or "Could not find a version" in built.stderr:
            pytest.skip(f"the wheel's build backend is not installable here: {tail}")
        raise AssertionError(f"pip wheel failed: {built.stderr[-2000:]}")
    (wheel,) = (root / "dist").glob("aiter_mla-*.whl")
    site = root / "site"
    inst = _run(["install", "-q", "--no-deps", "--target", str(site), str(wheel)])
    assert inst.returncode == 0, inst.stderr[-2000:]
    # a stray templates/ and jit_config.json beside the package must not be picked up
    (site / "templates").mkdir()
    (site / "jit_config.json").write_text("not json")
    return root, site, wheel


def _cli(installed, *args):
    root, site, _ = installed
    work = root / "elsewhere"
    work.mkdir(exist_ok=True)
    env = dict(os.environ, AITER_MLA_CACHE_DIR=str(root / "cache"))
    for var in ("AITER_MLA_TEMPLATES_DIR", "AITER_MLA_CONFIG"):
        env.pop(var, None)
    return subprocess.run([sys.executable, "-c", _RUNNER, str(site), *args], cwd=work, env=env,
                          capture_output=True, text=True, timeout=600)


def test_wheel_carries_the_templates_and_the_config(installed_wheel):
    import zipfile

    _, _, wheel = installed_wheel
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "aiter_mla/_data/jit_config.json" in names
    for t in ("mla_decode.cu.j2", "mla_metadata.cu.j2", "mla_reduce.cu.j2", "convert_fp8.cu.j2",
              "common/mla_decode_sm90.cuh", "common/aiter_mla_errors.cuh"):
        assert f"aiter_mla/_data/templates/{t}" in names, t
    # a stale build/ adds nothing (fresh-user report: a deleted module stayed in later wheels)
    assert not any(n.endswith("/zz_stale_module.py") for n in names)
    shipped = json.loads(zipfile.ZipFile(wheel).read("aiter_mla/_data/jit_config.json"))
    assert shipped == json.loads((paths.REPO_ROOT / "jit_config.json").read_text())


@pytest.mark.parametrize("args", [["info"], ["jit", "list"]], ids=["info", "jit-list"])
def test_installed_cli_runs_outside_the_checkout(installed_wheel, args):
    r = _cli(installed_wheel, *args)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "JIT config" not in r.stdout + r.stderr   # the missing-config error of before
    if args == ["info"]:
        assert "_data/jit_config.json" in r.stdout and "_data/templates" in r.stdout, r.stdout


def test_installed_jit_renders_a_decode_variant(installed_wheel):
    r = _cli(installed_wheel, "jit", "render", "mla_decode", "--param", "arch=sm_90a",
             "--param", "block_m=128", "--param", "page_size=64", "--param", "block_n=64",
             "--param", "mask=none", "--param", "q_dtype=fp8", "--param", "kv_dtype=fp8",
             "--param", "mainloop=tile_pairs")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "AITER_MLA_EXPORT int aiter_mla_decode(" in r.stdout


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc to build a module")
def test_installed_jit_builds_convert_fp8(installed_wheel):
    r = _cli(installed_wheel, "jit", "build", "convert_fp8")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "1 of 1 ok, 0 failed" in r.stdout + r.stderr, r.stdout[-2000:] + r.stderr[-2000:]
