"""Float64 reference attention for MLA decode, independent of the kernel code.

Everything here computes in float64 on the dequantized inputs (real value = stored value x
scale), on whatever device the inputs live on (CPU or GPU). It is the yardstick the kernel
tests measure against, so it is written for clarity, not speed: dense attention per batch (or
per work), explicit gathers of the valid KV tokens only (unused page slots may hold NaN and are
never read).

Public functions:

* :func:`mla_decode_ref` - full causal MLA decode attention (AITER ``torch_mla_extend``).
* :func:`reduce_ref` - the split-KV merge by LSE (AITER ``torch_mla_reduce_v1``).
* :func:`split_reference` - replays a ``work_info_set`` work by work, producing the partials,
  the unsplit final rows and then the merge (AITER ``torch_mla_split_kv_and_reduce``).
* :func:`relative_l2` - ``||a - b|| / ||b||`` in float64.

Conventions (``docs/ARCHITECTURE.md``): LSE is a natural log of the sum of ``exp(score)`` where
score = ``sm_scale * q . k`` on real (dequantized) values; a query row that sees no key gets
output 0 and final LSE +inf (FlashMLA's convention); a split piece's row that sees no key gets
partial output 0 and partial LSE -inf.
"""
from __future__ import annotations

import math

import torch

from . import work_info
from .arch import QK_HEAD_DIM, V_HEAD_DIM
from .scalars import require_bool, require_real

__all__ = ["mla_decode_ref", "reduce_ref", "split_reference", "relative_l2"]


# --------------------------------------------------------------------------------------------
# input handling


def _require_values(t, name: str) -> None:
    """ValueError naming ``name`` for a tensor on the 'meta' device, which holds no values (torch
    said "Cannot copy out of meta tensor" or "Tensor.item() cannot be called", naming nothing)."""
    if isinstance(t, torch.Tensor) and t.is_meta:
        raise ValueError(f"{name} must hold values (a CPU or CUDA tensor), got a meta tensor")


def _int_list(t, name: str, ndim: int = 1) -> list[int]:
    """The values of an int32 / int64 tensor of ``ndim`` dimensions, flattened."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be int32 or int64, got {t.dtype}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    _require_values(t, name)
    return [int(v) for v in t.reshape(-1).tolist()]


def _scale_value(scale, name: str) -> float:
    """A per-tensor dequant scale given as None (1.0), a real number or a 1-element real
    tensor; it must be finite and > 0 (TypeError / ValueError naming ``name``)."""
    if scale is None:
        return 1.0
    if isinstance(scale, torch.Tensor):
        if scale.numel() != 1:
            raise ValueError(f"{name} must hold exactly 1 element (per-tensor scale), "
                             f"got shape {tuple(scale.shape)}")
        if scale.is_complex() or scale.dtype == torch.bool:
            raise TypeError(f"{name} must be a real tensor, got dtype {scale.dtype}")
        _require_values(scale, name)
        value = float(scale.reshape(-1)[0].item())
    else:
        value = require_real(name, scale, example="1.0, or a 1-element float32 tensor")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite scale > 0, got {value!r}")
    return value


def _check_indptr(vals: list[int], name: str, limit: int, limit_name: str) -> None:
    if not vals:
        raise ValueError(f"{name} must hold num_batches + 1 >= 1 entries, got 0")
    if vals[0] != 0:
        raise ValueError(f"{name}[0] must be 0, got {vals[0]}")
    for i in range(len(vals) - 1):
        if vals[i + 1] < vals[i]:
            raise ValueError(f"{name} must be non-decreasing, got {name}[{i}]={vals[i]} > "
                             f"{name}[{i + 1}]={vals[i + 1]}")
    if vals[-1] > limit:
        raise ValueError(f"{name}[-1]={vals[-1]} exceeds {limit_name}={limit}")


class _Problem:
    """Validated decode inputs: per-batch q ranges and the valid KV rows of each batch."""

    def __init__(self, q, kv_buffer, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens,
                 q_scale, kv_scale):
        if not isinstance(q, torch.Tensor) or q.dim() != 3 or q.shape[-1] != QK_HEAD_DIM:
            raise ValueError(f"q must be [total_q, num_heads, {QK_HEAD_DIM}], got "
                             f"{tuple(q.shape) if isinstance(q, torch.Tensor) else type(q)}")
        if not q.dtype.is_floating_point:
            raise TypeError(f"q must be a floating dtype (fp8 e4m3 / bf16 / ...), got {q.dtype}")
        _require_values(q, "q")
        _require_values(kv_buffer, "kv_buffer")
        if (not isinstance(kv_buffer, torch.Tensor) or kv_buffer.dim() != 4
                or kv_buffer.shape[2] != 1 or kv_buffer.shape[3] != QK_HEAD_DIM):
            raise ValueError(f"kv_buffer must be [num_pages, page_size, 1, {QK_HEAD_DIM}], got "
                             f"{tuple(kv_buffer.shape) if isinstance(kv_buffer, torch.Tensor) else type(kv_buffer)}")
        if not kv_buffer.dtype.is_floating_point:
            raise TypeError(f"kv_buffer must be a floating dtype, got {kv_buffer.dtype}")
        self.device = q.device
        self.total_q, self.num_heads = int(q.shape[0]), int(q.shape[1])
        self.num_pages, self.page_size = int(kv_buffer.shape[0]), int(kv_buffer.shape[1])
        self.qo = _int_list(qo_indptr, "qo_indptr")
        self.kvp = _int_list(kv_indptr, "kv_indptr")
        if not isinstance(kv_indices, torch.Tensor) or kv_indices.dtype not in (torch.int32,
                                                                                 torch.int64):
            raise TypeError(f"kv_indices must be an int32/int64 tensor, got "
                            f"{getattr(kv_indices, 'dtype', type(kv_indices).__name__)}")
        if kv_indices.dim() != 1 or kv_indices.is_meta:
            raise ValueError(f"kv_indices must be a 1-D CPU or CUDA tensor, got shape "
                             f"{tuple(kv_indices.shape)} on {kv_indices.device}")
        self.indices = kv_indices.to(device="cpu", dtype=torch.int64)
        self.last = _int_list(kv_last_page_lens, "kv_last_page_lens")
        self.batch = len(self.qo) - 1
        if self.batch < 0 or len(self.kvp) != len(self.qo):
            raise ValueError(f"qo_indptr and kv_indptr must both have batch+1 entries, got "
                             f"{len(self.qo)} and {len(self.kvp)}")
        if len(self.last) < self.batch:
            raise ValueError(f"kv_last_page_lens must have at least batch={self.batch} entries, "
                             f"got {len(self.last)}")
        _check_indptr(self.qo, "qo_indptr", self.total_q, "q.shape[0]")
        _check_indptr(self.kvp, "kv_indptr", len(self.indices), "len(kv_indices)")
        used = self.indices[:self.kvp[-1]]
        bad = ((used < 0) | (used >= self.num_pages)).nonzero()
        if bad.numel():
            i = int(bad[0])
            raise ValueError(f"kv_indices[{i}]={int(used[i])} is outside "
                             f"[0, num_pages={self.num_pages})")
        self.kv_len = []
        for b in range(self.batch):
            pages = self.kvp[b + 1] - self.kvp[b]
            if pages == 0:
                self.kv_len.append(0)  # kv_last_page_lens is ignored for empty batches
                continue
            lp = self.last[b]
            if not 1 <= lp <= self.page_size:
                raise ValueError(f"kv_last_page_lens[{b}]={lp} must be in [1, page_size="
                                 f"{self.page_size}] for a batch with {pages} page(s)")
            self.kv_len.append((pages - 1) * self.page_size + lp)
        # Dequantize once: real value = stored x scale, in float64.
        self.q = q.to(torch.float64) * _scale_value(q_scale, "q_scale")
        self.kv_flat = kv_buffer.reshape(self.num_pages * self.page_size, QK_HEAD_DIM)
        self.kv_scale = _scale_value(kv_scale, "kv_scale")

    def kv_rows(self, b: int, t0: int, t1: int) -> torch.Tensor:
        """float64 KV rows [t1 - t0, 576] of batch-local tokens [t0, t1) of batch b.

        Token v of batch b lives in page kv_indices[kv_indptr[b] + v // P], slot v % P.
        Only these rows are gathered, so NaN in unused slots is never read.
        """
        P = self.page_size
        v = torch.arange(t0, t1, dtype=torch.int64)
        rows = self.indices[self.kvp[b]:self.kvp[b + 1]][v // P] * P + v % P
        # Gather raw bits: index kernels are not built for every fp8 dtype on every device.
        raw = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[
            self.kv_flat.element_size()]
        kv = self.kv_flat.view(raw).index_select(0, rows.to(self.kv_flat.device))
        kv = kv.view(self.kv_flat.dtype)
        return kv.to(device=self.device, dtype=torch.float64) * self.kv_scale


def _attend(qb: torch.Tensor, kv: torch.Tensor, key_pos: torch.Tensor, limit: torch.Tensor,
            sm_scale: float, fp8_p: bool):
    """Dense masked attention in float64.

    qb [R, H, 576], kv [K, 576] (V = first 512 columns), key_pos [K] batch-local key indices,
    limit [R]: row r sees keys with key_pos < limit[r]. Returns (out [R, H, 512], lse [R, H])
    with out 0 and lse -inf for rows that see no key.
    """
    R, H, _ = qb.shape
    s = torch.einsum("rhd,kd->rhk", qb, kv) * sm_scale
    visible = (key_pos.view(1, -1) < limit.view(-1, 1)).view(R, 1, -1)
    s = s.masked_fill(~visible, float("-inf"))
    m = s.amax(dim=-1, keepdim=True) if s.shape[-1] > 0 else torch.full(
        (R, H, 1), float("-inf"), dtype=torch.float64, device=qb.device)
    empty = torch.isneginf(m)
    p = torch.exp(s - torch.where(empty, 0.0, m))  # masked keys -> exp(-inf) = 0
    l = p.sum(dim=-1, keepdim=True)
    if fp8_p:
        # AITER's kernel rounds the unnormalised probabilities (fp32) to fp8 e4m3 with no
        # scale before the PV product; l stays the unrounded sum (AITER torch_mla_extend).
        p = p.to(torch.float32).to(torch.float8_e4m3fn).to(torch.float64)
    o = torch.einsum("rhk,kd->rhd", p, kv[:, :V_HEAD_DIM])
    o = torch.where(empty, 0.0, o / torch.where(empty, 1.0, l))
    lse = torch.where(empty, float("-inf"), m + torch.log(torch.where(empty, 1.0, l)))
    return o, lse.squeeze(-1)


# --------------------------------------------------------------------------------------------
# public references


def mla_decode_ref(q, kv_buffer, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens, *,
                   sm_scale, q_scale=None, kv_scale=None, fp8_p=False):
    """Causal MLA decode attention in float64 (the golden reference).

    Args:
        q: [total_q, H, 576], fp8 e4m3 / bf16 / any float dtype (stored values).
        kv_buffer: [num_pages, page_size, 1, 576], any float dtype; V = first 512 columns.
        qo_indptr: [batch+1] int32/int64, q tokens per batch (qlen_b = qo_indptr[b+1]-qo_indptr[b]).
        kv_indptr: [batch+1] int32/int64, in pages (indexes kv_indices).
        kv_indices: [>= kv_indptr[-1]] page numbers.
        kv_last_page_lens: [>= batch] tokens in each batch's last page (ignored for 0 pages).
        sm_scale: softmax scale applied to q.k of the real values.
        q_scale, kv_scale: per-tensor dequant scales (None = 1; a real number or 1-element tensor,
            finite and > 0): real value = stored x scale (AITER's kernel ignores them; we
            honour them).
        fp8_p: a bool (Python or NumPy): round the unnormalised exp(s - max) to fp8 e4m3
            before P.V, as AITER's kernel and its fp8 reference do (sets the fp8 tolerance).

    Returns:
        (out float64 [total_q, H, 512], lse float64 [total_q, H]) on q's device; lse is the
        natural-log sum of exp(scores). Causal mask, bottom-right aligned: q position i of batch
        b sees keys j < kvlen_b - (qlen_b - 1 - i). Rows with no visible key (kvlen 0, or a
        causal row before the first key): out 0, lse +inf. q rows outside qo_indptr[-1]: NaN.

    Raises:
        ValueError / TypeError naming the argument for bad shapes, dtypes or index values, a
        ``sm_scale`` that is not a finite number, or a scale that is not a finite number > 0;
        TypeError for an ``fp8_p`` that is not a bool (``'no'`` is not read as truthy).

    Source: AITER ``op_tests/test_mla_persistent.py`` ``torch_mla_extend`` /
    ``ref_masked_attention`` (mask ``tril(diagonal=s_k - s_q)``, fp8 P), with real scales.
    """
    require_real("sm_scale", sm_scale, example="1/sqrt(576)")
    fp8_p = require_bool("fp8_p", fp8_p)
    pb = _Problem(q, kv_buffer, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens,
                  q_scale, kv_scale)
    H = pb.num_heads
    out = torch.full((pb.total_q, H, V_HEAD_DIM), float("nan"), dtype=torch.float64,
                     device=pb.device)
    lse = torch.full((pb.total_q, H), float("nan"), dtype=torch.float64, device=pb.device)
    for b in range(pb.batch):
        q0, q1 = pb.qo[b], pb.qo[b + 1]
        qlen, kvlen = q1 - q0, pb.kv_len[b]
        if qlen == 0:
            continue
        kv = pb.kv_rows(b, 0, kvlen)
        key_pos = torch.arange(kvlen, device=pb.device)
        limit = kvlen - (qlen - 1 - torch.arange(qlen, device=pb.device))
        o, l = _attend(pb.q[q0:q1], kv, key_pos, limit, float(sm_scale), fp8_p)
        out[q0:q1] = o
        lse[q0:q1] = torch.where(torch.isneginf(l), float("inf"), l)
    return out, lse


def _final_range(t: int, start: int, fmap, pmap) -> tuple[int, int]:
    if fmap is not None:
        return fmap[2 * t], fmap[2 * t + 1]
    # AITER without a final map: uniform qo length taken from the tile's first two partials.
    qo_len = pmap[start + 1] - pmap[start]
    return t * qo_len, (t + 1) * qo_len


def reduce_ref(partial_output, partial_lse, reduce_indptr, reduce_final_map, reduce_partial_map,
               final_output, final_lse=None):
    """Python/float64 model of :func:`aiter_mla.mla_reduce_v1` (the split-KV merge by LSE).

    Args:
        partial_output: [N, H, 512] or [N, 1, H, 512], any float dtype.
        partial_lse: N*H values ([N, H], [N, 1, H, 1], ...), natural log.
        reduce_indptr: [tiles+1] int; tile t owns entries [reduce_indptr[t], reduce_indptr[t+1]).
        reduce_final_map: [tiles, 2] int (q_start, q_end) or None (AITER: the q length is
            reduce_partial_map[start+1] - reduce_partial_map[start] and tile t covers
            [t*len, (t+1)*len)).
        reduce_partial_map: first partial q-token row of each entry.
        final_output: [total_q, H, 512] base values (e.g. what the decode wrote; poison works).
        final_lse: [total_q, H] base values or None (then NaN).

    Returns:
        (out float64 [total_q, H, 512], lse float64 [total_q, H]): copies of the bases with
        every row of every tile of >= 2 entries replaced by the merge: M = max lse_i,
        w_i = exp(lse_i - M), out = sum w_i o_i / sum w_i, lse = M + ln sum w_i; all lse_i
        -inf: out 0, lse +inf. Tiles with < 2 entries are left as the bases.

    Raises TypeError for a non-integer index tensor, and ValueError naming the argument
    when reduce_indptr is empty or decreases, an index points outside its buffer, a tile's
    q_end is below its q_start, an index tensor has the wrong number of dimensions,
    reduce_final_map is not [tiles, 2] or lacks the row of a tile that merges, or
    partial_output is not [N, H, 512] / [N, 1, H, 512], or final_output / final_lse do not
    match its heads and width; TypeError when an output or LSE tensor is not a float tensor.

    Source: AITER ``csrc/kernels/mla/reduce.cu`` semantics and the test's
    ``torch_mla_reduce_v1`` (there computed sequentially with running rescale).
    """
    for name, t in (("partial_output", partial_output), ("partial_lse", partial_lse),
                    ("final_output", final_output), ("final_lse", final_lse)):
        if t is not None and not (isinstance(t, torch.Tensor) and t.is_floating_point()):
            raise TypeError(f"{name} must be a float tensor, got "
                            f"{t.dtype if isinstance(t, torch.Tensor) else type(t).__name__}")
        _require_values(t, name)
    if (partial_output.dim() not in (3, 4) or partial_output.shape[-1] != 512
            or (partial_output.dim() == 4 and partial_output.shape[1] != 1)):
        raise ValueError(f"partial_output must be [N, H, 512] or [N, 1, H, 512], got "
                         f"{tuple(partial_output.shape)}")
    H = int(partial_output.shape[-2])
    po = partial_output.reshape(-1, H, partial_output.shape[-1]).to(torch.float64)
    N = po.shape[0]
    if partial_lse.numel() != N * H:
        raise ValueError(f"partial_lse must hold N*H={N * H} values, got {partial_lse.numel()}")
    pl = partial_lse.reshape(N, H).to(torch.float64)
    D = int(partial_output.shape[-1])
    if final_output.dim() != 3 or tuple(final_output.shape[1:]) != (H, D):
        raise ValueError(f"final_output must be [total_q, {H}, {D}] (partial_output's heads and "
                         f"width), got {tuple(final_output.shape)}")
    out = final_output.to(torch.float64).clone()
    total_q = out.shape[0]
    if final_lse is not None and tuple(final_lse.shape) != (total_q, H):
        raise ValueError(f"final_lse must be [{total_q}, {H}] (final_output's rows and heads), got "
                         f"{tuple(final_lse.shape)}")
    lse = (final_lse.to(torch.float64).clone() if final_lse is not None else
           torch.full((total_q, H), float("nan"), dtype=torch.float64, device=out.device))
    ind = _int_list(reduce_indptr, "reduce_indptr")
    if not ind:
        raise ValueError("reduce_indptr must have tiles + 1 >= 1 entries, got 0")
    pmap = _int_list(reduce_partial_map, "reduce_partial_map")
    fmap = (_int_list(reduce_final_map, "reduce_final_map", ndim=2)
            if reduce_final_map is not None else None)
    if fmap is not None and reduce_final_map.shape[1] != 2:
        raise ValueError(f"reduce_final_map must be [tiles, 2] (q_start, q_end per tile), got "
                         f"{tuple(reduce_final_map.shape)}")
    for t in range(len(ind) - 1):
        start, end = ind[t], ind[t + 1]
        if end < start:
            raise ValueError(f"reduce_indptr must be non-decreasing, got reduce_indptr[{t}]={start} "
                             f"> reduce_indptr[{t + 1}]={end}")
        if end - start < 2:
            continue
        if start < 0 or end > len(pmap):
            raise ValueError(f"reduce_indptr[{t}:{t + 2}]=({start}, {end}) is outside "
                             f"reduce_partial_map (length {len(pmap)})")
        if fmap is not None and 2 * t + 1 >= len(fmap):
            raise ValueError(f"reduce_final_map must have a row for each merging tile: "
                             f"reduce_indptr's tile {t} merges {end - start} entries, but "
                             f"reduce_final_map has rows 0..{len(fmap) // 2 - 1} only")
        qs, qe = _final_range(t, start, fmap, pmap)
        if qe < qs:
            raise ValueError(f"tile {t} covers q tokens [{qs}, {qe}): q_end < q_start"
                             + (" in reduce_final_map" if fmap is not None else
                                " (reduce_partial_map decreasing)"))
        if qe == qs:
            continue
        if qs < 0 or qe > total_q:
            raise ValueError(f"tile {t} covers q tokens [{qs}, {qe}) outside final_output "
                             f"(total_q={total_q})")
        locs = torch.tensor(pmap[start:end], dtype=torch.int64, device=po.device)
        rows = locs.view(-1, 1) + torch.arange(qe - qs, device=po.device).view(1, -1)  # [n, S]
        if int(rows.min()) < 0 or int(rows.max()) >= N:
            raise ValueError(f"tile {t}: reduce_partial_map rows {pmap[start:end]} (+ up to "
                             f"{qe - qs - 1}) fall outside partial_output (N={N})")
        lses = pl[rows]            # [n, S, H]
        outs = po[rows]            # [n, S, H, 512]
        m = lses.amax(dim=0)       # [S, H]
        empty = torch.isneginf(m)
        w = torch.exp(lses - torch.where(empty, 0.0, m))
        sw = w.sum(dim=0)
        merged = (w.unsqueeze(-1) * outs).sum(dim=0) / torch.where(empty, 1.0, sw).unsqueeze(-1)
        out[qs:qe] = torch.where(empty.unsqueeze(-1), 0.0, merged)
        lse[qs:qe] = torch.where(empty, float("inf"), m + torch.log(torch.where(empty, 1.0, sw)))
    return out, lse


def split_reference(q, kv_buffer, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens,
                    work_indptr, work_info_set, reduce_indptr, reduce_final_map,
                    reduce_partial_map, *, sm_scale, q_scale=None, kv_scale=None, fp8_p=False):
    """Replays a split-KV schedule in float64: each work, then the merge.

    For every work record ``work_info_set[work_indptr[0]:work_indptr[-1]]`` (layout in
    :mod:`aiter_mla.work_info`): q tokens [qo_start, qo_end) of batch ``batch_idx`` attend to the
    batch's KV tokens [kv_start*P - kv_indptr[b]*P, end) where end is kv_end*P when P == 1 or
    kv_offset != 0, else (kv_end-1)*P + kv_last_page_lens[b] (the decode kernel's rule,
    docs/DESIGN.md §5.7); the causal limit stays the batch's (q position i sees keys < kvlen_b - (qlen_b-1-i)).
    A work with partial_qo_loc >= 0 writes partial rows (row with no visible key: 0 / -inf);
    one with -1 writes the final rows (no visible key: 0 / +inf). Then :func:`reduce_ref`.

    Args: as :func:`mla_decode_ref`, plus the schedule (int tensors, AITER layouts).

    Returns:
        (out [total_q, H, 512], lse [total_q, H], partial_output [Np, H, 512],
        partial_lse [Np, H]) in float64; Np = max(partial_qo_loc + qo_end - qo_start) over
        split works (0 if none). Rows no work or tile writes stay NaN, so a test catches rows
        the schedule missed.

    Raises ValueError naming the argument for an inconsistent record, and the errors of
    :func:`mla_decode_ref` (``sm_scale`` and ``fp8_p`` included) and :func:`reduce_ref`;
    TypeError for a schedule argument that is not an int32 / int64 tensor.

    Source: AITER ``op_tests/test_mla_persistent.py`` ``torch_mla_split_kv_and_reduce``.
    """
    require_real("sm_scale", sm_scale, example="1/sqrt(576)")
    fp8_p = require_bool("fp8_p", fp8_p)
    pb = _Problem(q, kv_buffer, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens,
                  q_scale, kv_scale)
    P, H = pb.page_size, pb.num_heads
    wind = _int_list(work_indptr, "work_indptr")
    if not wind:
        raise ValueError("work_indptr must hold num_clusters + 1 >= 1 entries, got 0")
    for c in range(len(wind) - 1):
        if wind[c] > wind[c + 1]:
            raise ValueError(f"work_indptr must be non-decreasing, got work_indptr[{c}]={wind[c]} > "
                             f"work_indptr[{c + 1}]={wind[c + 1]}")
    flat = _int_list(work_info_set, "work_info_set", ndim=2)
    if work_info_set.shape[1] != work_info.WORK_INFO_INTS:
        raise ValueError(f"work_info_set must be [num_works, {work_info.WORK_INFO_INTS}], got "
                         f"{tuple(work_info_set.shape)}")
    n = work_info.WORK_INFO_INTS
    wis = [flat[i:i + n] for i in range(0, len(flat), n)]
    w0, w1 = wind[0], wind[-1]
    if not 0 <= w0 <= w1 <= len(wis):
        raise ValueError(f"work_indptr spans works [{w0}, {w1}) outside work_info_set "
                         f"({len(wis)} rows)")
    WI = work_info.WI
    works = [wis[i] for i in range(w0, w1)]
    # Split works' partial rows lie in [0, split works x their most rows): get_mla_metadata_v1
    # packs them, AITER steps by the q tile (a short last tile leaves a gap). Checked before the
    # buffer is made: a stray partial_qo_loc of 2**31 - 1 asked for terabytes.
    split = [w for w in works if w[WI["partial_qo_loc"]] >= 0]
    bound = len(split) * max([w[WI["qo_end"]] - w[WI["qo_start"]] for w in split], default=0)
    for i, w in enumerate(works):
        loc, rows = w[WI["partial_qo_loc"]], w[WI["qo_end"]] - w[WI["qo_start"]]
        if loc >= 0 and loc + rows > bound:
            raise ValueError(f"work {w0 + i}: partial_qo_loc={loc} puts its {rows} partial rows outside "
                             f"[0, {bound}) ({len(split)} split works x their most rows)")
    n_partial = max([w[WI["partial_qo_loc"]] + w[WI["qo_end"]] - w[WI["qo_start"]] for w in split], default=0)
    dev = pb.device
    nan = float("nan")
    out = torch.full((pb.total_q, H, V_HEAD_DIM), nan, dtype=torch.float64, device=dev)
    lse = torch.full((pb.total_q, H), nan, dtype=torch.float64, device=dev)
    p_out = torch.full((n_partial, H, V_HEAD_DIM), nan, dtype=torch.float64, device=dev)
    p_lse = torch.full((n_partial, H), nan, dtype=torch.float64, device=dev)
    for i, w in enumerate(works):
        b, loc = w[WI["batch_idx"]], w[WI["partial_qo_loc"]]
        qs, qe = w[WI["qo_start"]], w[WI["qo_end"]]
        ks, ke, koff = w[WI["kv_start"]], w[WI["kv_end"]], w[WI["kv_offset"]]
        if not 0 <= b < pb.batch:
            raise ValueError(f"work {w0 + i}: batch_idx={b} outside [0, {pb.batch})")
        if not pb.qo[b] <= qs <= qe <= pb.qo[b + 1]:
            raise ValueError(f"work {w0 + i}: q tokens [{qs}, {qe}) outside batch {b}'s "
                             f"[{pb.qo[b]}, {pb.qo[b + 1]})")
        if ke < ks:
            raise ValueError(f"work {w0 + i}: kv_end={ke} < kv_start={ks}")
        base = pb.kvp[b]
        t0 = (ks - base) * P
        if P == 1 or koff != 0:
            t1 = (ke - base) * P
        else:
            t1 = (ke - base - 1) * P + pb.last[b] if ke > ks else t0
        kvlen, qlen = pb.kv_len[b], pb.qo[b + 1] - pb.qo[b]
        if not 0 <= t0 <= t1 <= kvlen:
            raise ValueError(f"work {w0 + i}: KV tokens [{t0}, {t1}) outside batch {b}'s "
                             f"[0, {kvlen}) (kv_start={ks}, kv_end={ke}, kv_offset={koff})")
        if qe == qs:
            continue
        kv = pb.kv_rows(b, t0, t1)
        key_pos = torch.arange(t0, t1, device=dev)
        qpos = torch.arange(qs - pb.qo[b], qe - pb.qo[b], device=dev)
        o, l = _attend(pb.q[qs:qe], kv, key_pos, kvlen - (qlen - 1 - qpos), float(sm_scale), fp8_p)
        if loc >= 0:
            p_out[loc:loc + qe - qs] = o
            p_lse[loc:loc + qe - qs] = l
        else:
            out[qs:qe] = o
            lse[qs:qe] = torch.where(torch.isneginf(l), float("inf"), l)
    out, lse = reduce_ref(p_out, p_lse, reduce_indptr, reduce_final_map, reduce_partial_map,
                          out, lse)
    return out, lse, p_out, p_lse


def relative_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    """``||a - b||_2 / ||b||_2`` in float64, as a Python float.

    Positions where a and b are equal (including equal infinities, e.g. the +inf LSE of empty
    rows) count as zero difference, and ``||b||`` sums b's finite entries; any other
    non-finite difference (NaN anywhere, inf against a finite value) gives ``inf``. When
    ``||b|| == 0`` the result is 0.0 if a equals b, else ``inf``. Shapes must broadcast
    (ValueError). Inputs: tensors of any real dtype on any device (b is moved to a's), compared
    in float64.

    Source: this package's error metric for its tests and the bench's ``ref err`` column (no
    AITER / FlashMLA counterpart is matched).
    """
    for name, x in (("a", a), ("b", b)):
        if not isinstance(x, torch.Tensor) or x.is_complex():
            what = f"a complex tensor ({x.dtype})" if isinstance(x, torch.Tensor) else type(x).__name__
            raise TypeError(f"relative_l2: {name} must be a real torch.Tensor, got {what}")
        _require_values(x, f"relative_l2: {name}")
    try:
        a64, b64 = torch.broadcast_tensors(a.detach().to(torch.float64),
                                           b.detach().to(device=a.device, dtype=torch.float64))
    except RuntimeError as e:
        raise ValueError(f"relative_l2: shapes {tuple(a.shape)} and {tuple(b.shape)} do not "
                         f"broadcast") from e
    same = a64 == b64
    fin_a, fin_b = torch.isfinite(a64), torch.isfinite(b64)
    if not bool((same | (fin_a & fin_b)).all()):
        return math.inf
    # Both sides divided by their largest finite magnitude first, so that neither the
    # difference nor the sums of squares overflow (1e300) or underflow (1e-300).
    if a64.numel() == 0:
        return 0.0
    scale = float(torch.maximum(torch.where(fin_a, a64.abs(), 0.0).amax(),
                                torch.where(fin_b, b64.abs(), 0.0).amax()))
    if scale == 0.0:   # every finite entry is 0 in both, and the rest are equal
        return 0.0
    a64, b64 = a64 / scale, b64 / scale
    num = float(torch.linalg.vector_norm(torch.where(same, 0.0, a64 - b64)))
    den = float(torch.linalg.vector_norm(torch.where(fin_b, b64, 0.0)))
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den
