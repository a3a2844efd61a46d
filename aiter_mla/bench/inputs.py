"""Benchmark inputs that look like a DeepSeek-V3 serving batch.

- Dims: 576-dim keys (512 latent + 64 RoPE), V = the first 512 columns, one KV head.
- Softmax scale: DeepSeek-V3's own, ``(128 + 64) ** -0.5 * mscale ** 2`` with YaRN
  ``mscale = 0.1 * ln(40) + 1`` (rope_scaling factor 40, mscale_all_dim 1), not AITER's test
  default 1/sqrt(576).
- KV magnitudes: the latent is the output of an RMSNorm (``kv_a_layernorm``), so it is small; the
  RoPE part ``k_pe`` is not normalised and is drawn an order of magnitude larger. fp8 e4m3 uses a
  per-tensor scale = amax over both parts / 448 (real value = stored x scale).
- ``--varlen``: per-request lengths log-normal with mean ``ctx`` (a long right tail).
- Page tables: random samples of a window of a KV pool larger than L2; each timed call reads a
  different window (see :func:`rotation_plan`) so no call finds its KV in L2, as in serving,
  where each of the 61 layers reads its own cache.

The pure-Python parts (lengths, page tables, rotation plan) run on CPU and are unit-tested; the
pool and Q generators work on any torch device.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

from ..arch import KV_LORA_RANK, QK_HEAD_DIM

FP8_MAX = 448.0  # largest finite float8_e4m3fn
#: Standard deviations of the drawn values (latent, RoPE) for KV and Q.
KV_LATENT_STD, KV_ROPE_STD = 0.3, 3.0
Q_LATENT_STD, Q_ROPE_STD = 1.0, 1.0
#: Log-normal sigma of --varlen lengths: median 0.73 x mean, 1 request in 20 above 2.7 x mean.
VARLEN_SIGMA = 0.8
VARLEN_MAX_FACTOR = 8
#: Cap on distinct input sets per row and on the memory the rotated Q sets may take.
MAX_SETS = 4096
Q_SET_BUDGET_BYTES = 1 << 30
#: A window spans at least this many L2 sizes, the pool at least twice that.
WINDOW_L2_FACTOR = 4


def deepseek_v3_sm_scale() -> float:
    """DeepSeek-V3's softmax scale: ``192 ** -0.5 * (0.1 * ln 40 + 1) ** 2`` ≈ 0.13524.

    Source: DeepSeek-V3 ``modeling_deepseek.py`` (q_head_dim 192 = qk_nope 128 + rope 64 before
    weight absorption; YaRN factor 40, mscale_all_dim 1).
    """
    mscale = 0.1 * 1.0 * math.log(40.0) + 1.0
    return (128 + 64) ** -0.5 * mscale * mscale


def draw_kv_lens(batch: int, ctx: int, qlen: int, varlen: bool, seed: int) -> list[int]:
    """Per-request KV lengths in tokens.

    Uniform: ``[ctx] * batch``. Varlen: log-normal with mean ``ctx`` and sigma
    :data:`VARLEN_SIGMA`, clamped to ``[qlen, 8 * ctx]`` (a causal window of ``qlen`` queries
    needs at least ``qlen`` keys). Deterministic in ``seed``. Raises ValueError for
    ``batch < 1``, ``ctx < qlen`` or ``qlen < 1``.
    """
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    if qlen < 1:
        raise ValueError(f"qlen must be >= 1, got {qlen}")
    if ctx < qlen:
        raise ValueError(f"ctx must be >= qlen={qlen} (causal decode), got {ctx}")
    if not varlen:
        return [ctx] * batch
    rng = random.Random(seed)
    mu = math.log(ctx) - VARLEN_SIGMA ** 2 / 2  # mean of the log-normal = ctx
    hi = VARLEN_MAX_FACTOR * ctx
    return [min(hi, max(qlen, round(rng.lognormvariate(mu, VARLEN_SIGMA)))) for _ in range(batch)]


def pages_per_request(kv_lens: list[int], page_size: int) -> list[int]:
    """``ceil(kv_len / page_size)`` per request."""
    return [-(-k // page_size) for k in kv_lens]


@dataclass(frozen=True)
class Rotation:
    """How one row's timed calls rotate over the KV pool and Q sets.

    Set ``s`` reads ``kv_pool_pages[s * shift_pages : s * shift_pages + window_pages]`` through
    the row's one page table (a random sample of ``needed_pages`` pages of the window) and Q set
    ``s % n_q_sets``.
    """

    needed_pages: int
    window_pages: int
    shift_pages: int
    n_sets: int
    n_q_sets: int

    @property
    def rotated_pages(self) -> int:
        """Distinct-page upper bound read by one pass over the sets."""
        return self.n_sets * self.needed_pages


def rotation_plan(
    needed_pages: int, pool_pages: int, page_bytes: int, l2_bytes: int, q_set_bytes: int,
    max_sets: int = MAX_SETS, q_budget_bytes: int = Q_SET_BUDGET_BYTES,
) -> Rotation:
    """Choose window, shift and set counts for one row (all sizes in pages or bytes).

    The window is ``max(needed, 4 x L2)`` (capped by the pool), so a page table scatters over
    more memory than L2 holds; consecutive sets shift by ``needed_pages``, so one pass over the
    sets reads ``n_sets x needed`` pages, bounded by the pool and ``max_sets``. Q sets are capped
    at ``q_budget_bytes``. Raises ValueError when the pool is smaller than one request set.
    """
    if needed_pages < 1:
        raise ValueError(f"needed_pages must be >= 1, got {needed_pages}")
    if pool_pages < needed_pages:
        raise ValueError(f"the KV pool ({pool_pages} pages) is smaller than one input set "
                         f"({needed_pages} pages)")
    window = min(pool_pages, max(needed_pages, -(-WINDOW_L2_FACTOR * l2_bytes // page_bytes)))
    n_sets = max(1, min(max_sets, 1 + (pool_pages - window) // needed_pages))
    n_q = max(1, min(n_sets, q_budget_bytes // max(1, q_set_bytes)))
    return Rotation(needed_pages, window, needed_pages, n_sets, n_q)


def pool_tokens_for(max_needed_tokens: int, l2_bytes: int, kv_elem_bytes: int) -> int:
    """Tokens in the KV pool: the largest row's need, and at least 2 x the window's 4 x L2,
    rounded up to a multiple of 256 (so any page size up to 256 views it whole)."""
    row_bytes = QK_HEAD_DIM * kv_elem_bytes
    want = max(max_needed_tokens, -(-2 * WINDOW_L2_FACTOR * l2_bytes // row_bytes))
    return -(-want // 256) * 256


def page_table(kv_lens: list[int], page_size: int, window_pages: int, seed: int):
    """``(kv_indptr, kv_indices, kv_last_page_lens)`` as int32 CPU tensors.

    ``kv_indptr`` is in pages (AITER's unit); ``kv_indices`` is a random sample without
    replacement of ``[0, window_pages)`` (a request's pages are scattered, as a paged allocator
    leaves them); ``kv_last_page_lens`` in ``[1, page_size]``. Raises ValueError when the window
    holds fewer pages than needed or a length is < 1.
    """
    import torch

    if any(k < 1 for k in kv_lens):
        raise ValueError(f"every kv_len must be >= 1, got min {min(kv_lens)}")
    pages = pages_per_request(kv_lens, page_size)
    total = sum(pages)
    if window_pages < total:
        raise ValueError(f"window_pages={window_pages} < pages needed={total}")
    gen = torch.Generator().manual_seed(seed)
    indices = torch.randperm(window_pages, generator=gen)[:total].to(torch.int32)
    indptr = torch.zeros(len(kv_lens) + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(torch.tensor(pages, dtype=torch.int64), 0).to(torch.int32)
    last = torch.tensor([k - (p - 1) * page_size for k, p in zip(kv_lens, pages)], dtype=torch.int32)
    return indptr, indices, last


def qo_indptr(batch: int, qlen: int):
    """``[0, qlen, 2 qlen, ...]`` int32 (uniform decode / MTP lengths)."""
    import torch

    return torch.arange(0, (batch + 1) * qlen, qlen, dtype=torch.int32)


def _torch_dtype(name: str):
    import torch

    return {"fp8": torch.float8_e4m3fn, "bf16": torch.bfloat16}[name]


def _draw_rows(n: int, latent_std: float, rope_std: float, device, gen):
    """``[n, 576]`` float32 normal rows with the latent and RoPE parts at their own scales."""
    import torch

    x = torch.randn(n, QK_HEAD_DIM, device=device, dtype=torch.float32, generator=gen)
    x[:, :KV_LORA_RANK] *= latent_std
    x[:, KV_LORA_RANK:] *= rope_std
    return x


def make_kv_pool(tokens: int, kv_dtype: str, device, seed: int, chunk_tokens: int = 1 << 18):
    """A KV pool ``[tokens, 576]`` in ``kv_dtype`` and its per-tensor scale (float).

    Values are drawn in chunks (bounded temporary memory). fp8: two passes with the same
    per-chunk generator seeds, the first for the amax, so scale = amax / 448 over the whole
    pool. bf16: the drawn values rounded, scale 1.0.
    """
    import torch

    dt = _torch_dtype(kv_dtype)
    pool = torch.empty(tokens, QK_HEAD_DIM, dtype=dt, device=device)

    def chunks():
        for i, t0 in enumerate(range(0, tokens, chunk_tokens)):
            n = min(chunk_tokens, tokens - t0)
            gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + i)
            yield t0, n, _draw_rows(n, KV_LATENT_STD, KV_ROPE_STD, device, gen)

    if kv_dtype == "bf16":
        for t0, n, x in chunks():
            pool[t0:t0 + n] = x.to(dt)
        return pool, 1.0
    amax = 0.0
    for _, _, x in chunks():
        amax = max(amax, float(x.abs().amax()))
    scale = amax / FP8_MAX
    for t0, n, x in chunks():
        pool[t0:t0 + n] = (x / scale).to(dt)
    return pool, scale


def dequantize_to_bf16(pool, scale: float, chunk_tokens: int = 1 << 18):
    """bf16 copy of a pool holding stored x ``scale`` (the same real values a peer must see)."""
    import torch

    out = torch.empty(pool.shape, dtype=torch.bfloat16, device=pool.device)
    for t0 in range(0, pool.shape[0], chunk_tokens):
        out[t0:t0 + chunk_tokens] = (pool[t0:t0 + chunk_tokens].to(torch.float32) * scale).to(
            torch.bfloat16)
    return out


def make_q_sets(n: int, total_q: int, heads: int, q_dtype: str, device, seed: int,
                chunk_bytes: int = 256 << 20):
    """``n`` independent Q sets: ``(q [n, total_q, heads, 576] in q_dtype, scales [n, 1] fp32)``.

    ``q[i]`` and ``scales[i]`` are contiguous views (set i and its per-tensor scale: fp8
    amax / 448 of that set; bf16 1). Drawn in chunks of sets (bounded fp32 temporaries) with
    one host read per chunk for the scales.
    """
    import torch

    rows = total_q * heads
    q = torch.empty(n, total_q, heads, QK_HEAD_DIM, dtype=_torch_dtype(q_dtype), device=device)
    scales = torch.ones(n, 1, dtype=torch.float32, device=device)
    per_chunk = max(1, chunk_bytes // (rows * QK_HEAD_DIM * 4))
    for c, i0 in enumerate(range(0, n, per_chunk)):
        m = min(per_chunk, n - i0)
        gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + c)
        x = _draw_rows(m * rows, Q_LATENT_STD, Q_ROPE_STD, device, gen).view(m, rows, QK_HEAD_DIM)
        if q_dtype == "bf16":
            q[i0:i0 + m] = x.view(m, total_q, heads, QK_HEAD_DIM).to(torch.bfloat16)
            continue
        s = x.abs().amax(dim=(1, 2)) / FP8_MAX  # [m]
        q[i0:i0 + m] = (x / s.view(m, 1, 1)).view(m, total_q, heads, QK_HEAD_DIM).to(q.dtype)
        scales[i0:i0 + m, 0] = s
    return q, scales
