"""What a result was measured on: the machine and the software versions (the commit is
:func:`aiter_mla.paths.checkout_commit`)."""
from __future__ import annotations

import platform
import subprocess

from .. import __version__, paths


def _run(cmd: list[str]) -> str | None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30,
                              cwd=str(paths.REPO_ROOT))
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def nvcc_version() -> str | None:
    """Last line of ``nvcc --version`` (the JIT's compiler), or None when nvcc is not found."""
    out = _run(["nvcc", "--version"])
    return out.splitlines()[-1].strip() if out else None


def machine() -> str:
    """GPU name, multiprocessors, memory, driver; plus the host CPU architecture."""
    import torch

    if not torch.cuda.is_available():
        return f"no CUDA GPU; host {platform.machine()}"
    p = torch.cuda.get_device_properties(torch.cuda.current_device())
    driver = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    driver_text = f", driver {driver.splitlines()[0]}" if driver else ""
    return (f"{p.name} ({p.multi_processor_count} SMs, {p.total_memory / 2**30:.0f} GiB, "
            f"sm_{p.major}{p.minor}{driver_text}); host {platform.machine()}")


def versions(peers=()) -> dict:
    """Python, torch, CUDA runtime, nvcc, aiter_mla and each importable peer's version."""
    import torch

    out = {"python": platform.python_version(), "torch": torch.__version__,
           "cuda_runtime": torch.version.cuda, "nvcc": nvcc_version(), "aiter_mla": __version__}
    for peer in peers:
        out[peer.name] = peer.version
    return out
