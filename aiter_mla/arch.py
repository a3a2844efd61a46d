"""Targets, device facts and the one cluster-count function.

A *cluster* is AITER's term: one persistent work list (one entry of ``work_indptr``), not a
Hopper thread-block cluster. :func:`num_clusters` is the single place that decides how many
there are; buffer sizing (``get_mla_metadata_info_v1``), the metadata kernel and the decode
launch all call it, so the three can never disagree (AITER PR #3072 had to keep three copies
in step by hand).
"""
from __future__ import annotations

import functools

from . import env

#: Every arch a template may be rendered for. Only sm_90a is built, run and measured here;
#: gfx942's decode compiles with clang-19 and its logic runs in a CPU emulation
#: (docs/DESIGN.md §10), never on AMD hardware.
ARCHS = ("sm_90a", "gfx942", "gfx950")
NVIDIA_ARCHS = ("sm_90a",)
AMD_ARCHS = ("gfx942", "gfx950")

#: DeepSeek MLA dimensions (fixed): 512 latent + 64 RoPE = 576 QK dims; V = first 512 dims.
KV_LORA_RANK = 512
QK_ROPE_DIM = 64
QK_HEAD_DIM = 576
V_HEAD_DIM = 512


def is_experimental_enabled() -> bool:
    """``AITER_ENABLE_EXPERIMENTAL`` parsed as an int, non-zero = on (AITER's rule since #3072).

    "0", "", unset and non-numeric values are off.
    """
    return env.get_flag("AITER_ENABLE_EXPERIMENTAL")


#: The decode shapes: any q heads per KV head in 1..MAX_HEADS and q length in 1..MAX_SEQLEN_Q,
#: so up to MAX_ROWS query rows (heads x q length) a request (docs/DESIGN.md §9.2).
MAX_HEADS = 128
MAX_SEQLEN_Q = 16
MAX_ROWS = MAX_HEADS * MAX_SEQLEN_Q
#: Query rows of one decode CTA; a work's rows are covered by whole 64-row blocks.
ROW_BLOCK = 64


def tile_rows(num_heads: int, max_seqlen_q: int) -> int:
    """Query rows one decode tile covers: the rows (heads x qlen) rounded up to whole 64-row
    blocks, so 64 (AITER's m16x4), 128 (m16x8), 192, ... up to MAX_ROWS. Shapes of fewer rows
    than their tile run with padded rows ((16,1), (40,1), (100,1), ...).

    Raises TypeError for a non-int (bools included), ValueError for a value < 1 and
    NotImplementedError past MAX_HEADS / MAX_SEQLEN_Q (so :func:`num_clusters` refuses them too).
    """
    for name, value in (("num_heads", num_heads), ("max_seqlen_q", max_seqlen_q)):
        if isinstance(value, bool) or not hasattr(type(value), "__index__"):
            raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if num_heads > MAX_HEADS or max_seqlen_q > MAX_SEQLEN_Q:
        raise NotImplementedError(
            f"(num_heads, max_seqlen_q) = ({num_heads}, {max_seqlen_q}) is not supported: at most "
            f"{MAX_HEADS} heads and q length {MAX_SEQLEN_Q}")
    rows = num_heads * max_seqlen_q
    return ROW_BLOCK * max(1, -(-rows // ROW_BLOCK))


#: Rows (heads x qlen) up to which one consumer warpgroup holds a whole work: those shapes get
#: two work lists per multiprocessor, one per warpgroup of the fp8 ``warpgroup_works`` loop.
FEW_ROWS = 32


def occupancy(num_heads: int, max_seqlen_q: int, *, target: str = "sm_90a",
              kv_dtype: str | None = None) -> int:
    """Work lists per multiprocessor (CU) on ``target``: 2 for the m16x4 tile (heads x qlen ==
    64) when ``AITER_ENABLE_EXPERIMENTAL`` is non-zero (AITER #3072 / #3391
    ``get_mla_decode_fwd_occupancy``; on AMD only gfx950 has that tile); on sm_90a also 2 for
    the padded shapes of at most ``FEW_ROWS`` rows ((16,1), (32,1), (16,2); ours, not AITER's)
    unless ``kv_dtype`` is ``"bf16"``: fp8's loop there runs a work list per consumer
    warpgroup, while bf16's ``alternating`` would run the second list as a second CTA, and one
    CTA fills an SM (two waves, and twice the KV splits); else 1. ``kv_dtype``: the decode's
    dtype name (``"fp8"``, ``"bf16"``) or None (fp8's count). ValueError for a ``target`` not in
    ``ARCHS`` or another ``kv_dtype``."""
    _check_target(target)
    if kv_dtype not in (None, "fp8", "bf16"):
        raise ValueError(f"kv_dtype must be 'fp8', 'bf16' or None, got {kv_dtype!r}")
    rows = num_heads * max_seqlen_q
    if target in AMD_ARCHS:
        return 2 if target == "gfx950" and rows <= 64 and is_experimental_enabled() else 1
    if rows <= FEW_ROWS:
        return 1 if kv_dtype == "bf16" else 2
    if rows == 64 and is_experimental_enabled():
        return 2
    return 1


def _check_target(target) -> None:
    if target not in ARCHS:
        raise ValueError(f"target must be one of {', '.join(ARCHS)}, got {target!r}")


#: Rows of AMD's decode tiles (templates/mla_decode_amd.cu.j2): m16x8 (8 waves of 16 rows)
#: and, gfx950 with ``AITER_ENABLE_EXPERIMENTAL`` only, m16x4 (4 waves, two workgroups a CU).
AMD_TILE_ROWS = (128, 64)


def amd_tile_rows(num_heads: int, max_seqlen_q: int, target: str) -> int:
    """Rows of the AMD decode tile for a shape on ``target`` (gfx942 / gfx950): 64 (m16x4) on
    gfx950 when heads x qlen <= 64 and ``AITER_ENABLE_EXPERIMENTAL`` is non-zero, else 128
    (m16x8; fewer rows run padded). Raises :func:`tile_rows`' errors, ValueError for a target
    that is not AMD and NotImplementedError past 128 rows (AITER's HK kernels stop there)."""
    tile_rows(num_heads, max_seqlen_q)   # the argument checks
    if target not in AMD_ARCHS:
        raise ValueError(f"target must be one of {', '.join(AMD_ARCHS)}, got {target!r}")
    rows = num_heads * max_seqlen_q
    if rows > AMD_TILE_ROWS[0]:
        raise NotImplementedError(
            f"(num_heads, max_seqlen_q) = ({num_heads}, {max_seqlen_q}): {rows} rows; the AMD "
            f"decode kernel runs at most {AMD_TILE_ROWS[0]} rows (heads x qlen)")
    return 64 if occupancy(num_heads, max_seqlen_q, target=target) == 2 else 128


@functools.lru_cache(maxsize=None)
def _device_multiprocessors(device_index: int) -> int:
    import torch

    return torch.cuda.get_device_properties(device_index).multi_processor_count


def num_cu(device=None) -> int:
    """Multiprocessor count of ``device`` (132 on an H200); ``CU_NUM`` overrides it.

    Raises RuntimeError when no GPU is visible and ``CU_NUM`` is unset, empty or blank, ValueError when
    ``CU_NUM`` is set to anything but a positive integer.
    """
    override = env.get_int("CU_NUM", 0)   # declared a positive int: 0 here means unset
    if override:
        return override
    import torch

    if not torch.cuda.is_available():
        state = "set but empty or blank" if env.is_blank("CU_NUM") else "unset"
        raise RuntimeError(
            f"no CUDA device is visible and CU_NUM is {state}: set CU_NUM to the multiprocessor "
            "(CU) count to plan for (132 on an H200; for an AMD target 304 on an MI300X, 256 on an "
            "MI355X)"
        )
    if device is None:
        index = torch.cuda.current_device()
    else:
        index = torch.device(device).index
        if index is None:
            index = torch.cuda.current_device()
    return _device_multiprocessors(index)


def ctas_per_work(num_heads: int, max_seqlen_q: int, *, target: str = "sm_90a") -> int:
    """CTAs (multiprocessors) one work occupies at once: on sm_90a one per 64-row block of its
    tile, all on the same KV (2 for the 128-row tile, 32 at 2048 rows); on AMD 1 (one
    workgroup holds the work's rows, :func:`amd_tile_rows`). Raises ValueError for a ``target``
    not in :data:`ARCHS`, and :func:`tile_rows`' / :func:`amd_tile_rows`' errors for an
    unsupported shape."""
    _check_target(target)
    if target in AMD_ARCHS:
        amd_tile_rows(num_heads, max_seqlen_q, target)   # its checks
        return 1
    return tile_rows(num_heads, max_seqlen_q) // 64


def num_clusters(num_heads: int, max_seqlen_q: int, num_heads_k: int = 1, device=None, *,
                 cu: int | None = None, target: str = "sm_90a", kv_dtype: str | None = None) -> int:
    """Number of persistent work lists: ``num_CU x occupancy / (ctas_per_work x num_heads_k)``,
    num_CU = ``cu`` when given (planning for a GPU that is not here), else :func:`num_cu`;
    ``kv_dtype`` as :func:`occupancy` (the decode's dtype name, or None).

    Source: AITER ``get_mla_metadata_v1_2_device`` (#3072): num_CU x occupancy / num_heads_k.
    Ours divides by ``ctas_per_work`` too: a 128-row work runs on two CTAs at once, so an H200
    holds 66 of them, not 132 (and 33 of a 256-row work's four) (with 132 lists, every batch below 132 was split and the reduce
    cost 24 us of 266 at fp8 (128,1) b64 ctx 8192; docs/perf/notes.md change 13). ``target``:
    the arch the decode runs on; on gfx942 / gfx950 a work is one workgroup, so num_CU lists
    (AITER's grid), 2 x num_CU for gfx950's experimental m16x4. Raises TypeError when an
    argument is not an int, ValueError for ``num_heads_k < 1``, ``cu < 1`` or an unknown
    target, and :func:`tile_rows`' / :func:`amd_tile_rows`' errors for an unsupported shape.
    """
    for name, value in (("num_heads", num_heads), ("max_seqlen_q", max_seqlen_q), ("num_heads_k", num_heads_k),
                        ("cu", 1 if cu is None else cu)):
        if isinstance(value, bool) or not hasattr(type(value), "__index__"):
            raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if num_heads_k < 1:
        raise ValueError(f"num_heads_k must be >= 1, got {num_heads_k}")
    if cu is not None and cu < 1:
        raise ValueError(f"cu must be >= 1, got {cu}")
    _check_target(target)
    per_work = ctas_per_work(num_heads, max_seqlen_q, target=target)   # checks the shape first
    lists = (num_cu(device) if cu is None else cu) * occupancy(num_heads, max_seqlen_q, target=target,
                                                               kv_dtype=kv_dtype)
    return max(1, lists // (per_work * num_heads_k))


def current_arch() -> str:
    """The arch of the current GPU as a template value (``sm_90a``), or raise RuntimeError."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device is visible; pass arch= explicitly (e.g. 'sm_90a')")
    if getattr(torch.version, "hip", None):   # a ROCm build: torch.cuda is the HIP device
        name = str(getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "gcnArchName", "?"))
        raise RuntimeError(
            f"AMD GPU {name}: the ops launch on sm_90a only. gfx942 / gfx950 decode variants render "
            f"and compile (aiter-mla jit build mla_decode --arch gfx942) and their logic is checked "
            f"in a CPU emulation, but the ops do not plan or launch them (docs/DESIGN.md §10)")
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) == (9, 0):
        return "sm_90a"
    raise RuntimeError(
        f"GPU compute capability {major}.{minor} is not a supported target; supported: sm_90a"
    )
