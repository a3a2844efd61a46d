"""The JIT variants a sweep uses, and building them (``aiter-mla bench --compile-only``).

Which decode variant a row uses comes from one function, :func:`aiter_mla.ops.decode.decode_variant`
(the op's own dispatch); the metadata and reduce modules are keyed by the same arch. Building
needs nvcc, not a GPU, so this half of the main job runs on any machine.
"""
from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field

from ..jit.toolchain import interruptible


@dataclass
class Variant:
    """One JIT module variant: ``get_module(name, **params)``."""

    name: str
    params: dict

    @property
    def key(self) -> tuple:
        return (self.name, tuple(sorted(self.params.items())))

    def label(self) -> str:
        return f"{self.name}(" + ", ".join(f"{k}={v}" for k, v in self.params.items()) + ")"


@dataclass
class BuildResult:
    """Outcome of one ``get_module`` call: wall seconds, and the error (empty when it worked)
    with the tail of the compiler output."""

    variant: Variant
    seconds: float
    error: str = ""
    detail: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.error


def torch_dtype(name: str):
    """``"fp8"`` -> ``torch.float8_e4m3fn``, ``"bf16"`` -> ``torch.bfloat16``."""
    import torch

    return {"fp8": torch.float8_e4m3fn, "bf16": torch.bfloat16}[name]


def decode_params(heads: int, qlen: int, page_size: int, q_dtype: str, kv_dtype: str) -> dict:
    """The ``mla_decode`` parameters of one row, from the op's own dispatch function.

    Raises NotImplementedError (from the op) for an unsupported shape or dtype pair.
    """
    from ..ops.decode import decode_variant

    return decode_variant(heads, qlen, page_size, torch_dtype(q_dtype), torch_dtype(kv_dtype))


def sweep_variants(pairs, page_sizes, q_dtype: str, kv_dtype: str) -> list[Variant]:
    """Distinct variants a sweep over ``pairs`` x ``page_sizes`` needs, in first-use order:
    every decode variant, then ``mla_metadata(arch)`` and ``mla_reduce(arch, out_dtype=bf16)``
    for each arch among them, and ``read_bandwidth(arch)`` (the bench's read ceiling,
    :mod:`.ceilings`), so that a cache built by ``--compile-only`` serves a GPU run without a
    compiler. Raises NotImplementedError for an unsupported row."""
    decode: dict[tuple, Variant] = {}
    for heads, qlen in pairs:
        for page in page_sizes:
            v = Variant("mla_decode", decode_params(heads, qlen, page, q_dtype, kv_dtype))
            decode.setdefault(v.key, v)
    out = list(decode.values())
    for arch in dict.fromkeys(v.params["arch"] for v in decode.values()):
        out.append(Variant("mla_metadata", {"arch": arch}))
        out.append(Variant("mla_reduce", {"arch": arch, "out_dtype": "bf16"}))
        out.append(Variant("read_bandwidth", {"arch": arch}))
    return out


def _describe(exc: BaseException) -> tuple[str, list[str]]:
    """One-line reason plus the tail of a long message (compiler output)."""
    text = str(exc).strip()
    lines = text.splitlines() or ["(no message)"]
    head = f"{type(exc).__name__}: {lines[0]}"
    if type(exc).__name__ == "TemplateNotFound":
        head = f"template {lines[0]!r} does not exist (TemplateNotFound)"
    return head, lines[1:][-20:]


def build_variants(variants: list[Variant], jobs: int, progress: bool = True) -> list[BuildResult]:
    """Render, build and load each variant through ``aiter_mla.jit.get_module`` in ``jobs``
    parallel threads, with a progress bar on stderr. Never raises for a failed build: the
    result carries the error. Seconds are wall time of that variant's ``get_module`` call
    (a cache hit is a load, milliseconds)."""
    from tqdm import tqdm

    from ..jit import get_module

    def one(v: Variant) -> BuildResult:
        t0 = time.perf_counter()
        try:
            get_module(v.name, **v.params)
        except Exception as exc:  # a failed build is a result, reported with its reason
            head, detail = _describe(exc)
            return BuildResult(v, time.perf_counter() - t0, head, detail)
        return BuildResult(v, time.perf_counter() - t0)

    results: dict[tuple, BuildResult] = {}
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool, tqdm(
        total=len(variants), desc="build variants", unit="variant", file=sys.stderr,
        disable=not progress,
    ) as bar, interruptible(pool):
        futures = {pool.submit(one, v): v for v in variants}
        for fut in as_completed(futures):
            r = fut.result()
            results[r.variant.key] = r
            bar.set_postfix_str(f"{r.variant.name} {r.seconds:.1f}s{'' if r.ok else ' FAILED'}")
            bar.update(1)
    return [results[v.key] for v in variants]


def format_build_table(results: list[BuildResult]) -> str:
    """Plain-text table: variant, seconds, status."""
    rows = [(r.variant.label(), f"{r.seconds:.2f}", "ok" if r.ok else f"FAILED: {r.error}")
            for r in results]
    w0 = max([len("variant")] + [len(r[0]) for r in rows])
    lines = [f"{'variant':<{w0}}  {'seconds':>8}  status"]
    lines += [f"{a:<{w0}}  {b:>8}  {c}" for a, b, c in rows]
    return "\n".join(lines)
