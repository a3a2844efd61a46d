"""TEMPORARY minimal JIT core (render -> nvcc -> ctypes), to be replaced by the full
implementation (config validation, manifest key, filelock, staging, verify, CLI).
The public API below is the contract other modules rely on."""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import subprocess
import threading
from pathlib import Path

import jinja2

from .. import paths, work_info

_memo: dict[tuple, "Module"] = {}
_memo_lock = threading.Lock()


class Module:
    """A loaded variant: owns the ctypes handle; :meth:`function` returns a C entry point."""

    def __init__(self, name: str, params: dict, key: str, lib_path: Path):
        self.name = name
        self.params = dict(params)
        self.key = key
        self.lib_path = lib_path
        self._lib = ctypes.CDLL(str(lib_path))
        self._fns: dict[str, object] = {}

    def function(self, symbol: str, argtypes, restype=ctypes.c_int):
        fn = self._fns.get(symbol)
        if fn is None:
            fn = getattr(self._lib, symbol)
            fn.argtypes = list(argtypes)
            fn.restype = restype
            self._fns[symbol] = fn
        return fn


def _render(template: str, params: dict) -> str:
    envj = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(paths.TEMPLATES_DIR)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    envj.globals.update(work_info.template_constants())
    return envj.get_template(template).render(**params)


def get_module(name: str, **params) -> Module:
    memo_key = (name, tuple(sorted(params.items())))
    mod = _memo.get(memo_key)
    if mod is not None:
        return mod
    with _memo_lock:
        mod = _memo.get(memo_key)
        if mod is not None:
            return mod
        cfg = json.loads(paths.JIT_CONFIG_PATH.read_text())
        mcfg = cfg["modules"][name]
        src = _render(mcfg["template"], params)
        flags = cfg["toolchains"]["nvcc"]["flags"] + mcfg["flags"]["nvcc"]
        arch = params.get("arch", "sm_90a")
        gencode = ["-gencode=arch=compute_90a,code=sm_90a"] if arch == "sm_90a" else []
        key = hashlib.sha256(json.dumps([src, flags, gencode]).encode()).hexdigest()
        root = Path(os.path.expanduser("~/.cache/aiter_mla_tmp")) / key
        lib = root / "lib.so"
        if not lib.exists():
            root.mkdir(parents=True, exist_ok=True)
            (root / "src.cu").write_text(src)
            cmd = ["nvcc", *flags, *gencode, "-I", str(paths.TEMPLATES_DIR),
                   str(root / "src.cu"), "-o", str(root / "lib.tmp.so")]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"build of {name} {params} failed:\n{r.stderr[-4000:]}")
            os.replace(root / "lib.tmp.so", lib)
        mod = Module(name, params, key, lib)
        _memo[memo_key] = mod
        return mod
