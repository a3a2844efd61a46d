"""``import aiter_mla`` alone reaches what the README writes under it: the lazy ops, and the
submodules by attribute (``aiter_mla.ops.metadata...``, ``aiter_mla.arch...``), without
importing torch until an op needs it. Fresh interpreters: a test process has imported them."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

PROBE = """
import sys, aiter_mla
assert aiter_mla.arch.MAX_ROWS == 2048
assert "torch" not in sys.modules                 # a submodule attribute stays cheap
assert aiter_mla.ops.metadata.default_kv_granularity(64) == 1
assert callable(aiter_mla.ops.decode.is_supported_shape) and callable(aiter_mla.jit.get_module)
for owner, name in ((aiter_mla, "nope"), (aiter_mla.ops, "nope"), (aiter_mla, "_secret")):
    try:
        getattr(owner, name)
    except AttributeError as exc:
        assert repr(name) in str(exc), exc
    else:
        raise SystemExit(f"{owner.__name__}.{name} exists")
print("ok")
"""


def test_submodules_are_attributes_of_a_bare_import():
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
