"""The engine-facing decode API: :class:`MlaDecodePlanner`, sized once, ``plan`` once per decode
step and ``run`` once per layer, in the shape of FlashInfer's ``BatchMLAPagedAttentionWrapper``
and FlashMLA's ``get_mla_metadata`` + ``flash_mla_with_kvcache``.

It is a thin owner of buffers over the AITER-compatible ops: the planner's own index and
schedule buffers never move, so every ``run`` after the first of a batch size is the decode op's
warm path (docs/DESIGN.md §4.2), and a CUDA graph captured over ``plan`` + ``run`` replays with
whatever the engine writes into its index tensors before the replay.
"""
from __future__ import annotations

import struct
from typing import Optional

import torch

from ..arch import V_HEAD_DIM
from ..scalars import require_bool, require_int, require_real
from . import decode, errors, metadata
from .metadata_reference import INT32_MAX

__all__ = ["MlaDecodePlanner"]


def _positive_int(name: str, value) -> int:
    v = require_int(f"MlaDecodePlanner: {name}", value)
    if v < 1:
        raise ValueError(f"MlaDecodePlanner: {name} must be an int >= 1, got {value!r}")
    return v


class MlaDecodePlanner:
    """MLA decode for one model shape, sized once for the largest batch.

    Args (keyword-only after ``num_heads``):
        max_batch_size: the most requests one step holds.
        num_heads: query heads on this rank (one KV head, as MLA). (num_heads, max_seqlen_q)
            must be a supported shape (``aiter_mla.ops.decode.is_supported_shape``: 1..128 heads at q length 1..16).
        sm_scale: the softmax scale applied to q.k of the real values. Required: DeepSeek-V3
            with yarn rope scaling uses ``mscale**2 / sqrt(qk_nope_head_dim + qk_rope_head_dim)``,
            not ``1 / sqrt(576)``.
        max_num_pages: the most page ids one step's ``kv_indices`` holds.
        page_size: tokens per page (a power of two 1..256), the cache's ``shape[1]``.
        max_seqlen_q: q tokens per request (1, or more with speculative tokens; causal).
        dtype: q and KV cache dtype, ``torch.bfloat16`` or ``torch.float8_e4m3fn``.
        device: the CUDA device (default: the current one).

    Buffers (allocated here, never reallocated, so CUDA-graph safe): the batch layout
    (``qo_indptr``, ``kv_indptr``, ``kv_last_page_lens``, ``kv_indices``), the six schedule
    buffers of ``get_mla_metadata_info_v1(max_batch_size, ...)`` and the split buffers. The split
    buffers dominate: about ``min(max_batch_size + C - 1, 2 (C - 1)) * num_heads * max_seqlen_q
    * 2 KiB`` on the device, C the work-list count (``aiter_mla.arch.num_clusters``; 66 at 128
    rows on an H200: 33 MiB at batch 256, (128,1)).

    Raises TypeError / ValueError naming the argument (ValueError for ``max_batch_size`` or
    ``max_num_pages`` past the scheduler's int32 bounds, or a ``device`` index that is not a
    visible CUDA device; all checked before any allocation), NotImplementedError for an
    unsupported shape or dtype (listing what is supported), RuntimeError without a CUDA device.
    """

    def __init__(self, max_batch_size: int, num_heads: int, *, sm_scale: float, max_num_pages: int,
                 page_size: int = 64, max_seqlen_q: int = 1, dtype: torch.dtype = torch.bfloat16,
                 device=None):
        self.max_batch_size = _positive_int("max_batch_size", max_batch_size)
        self.num_heads = _positive_int("num_heads", num_heads)
        self.max_num_pages = _positive_int("max_num_pages", max_num_pages)
        self.page_size = require_int("MlaDecodePlanner: page_size", page_size)
        if not 1 <= self.page_size <= 256 or self.page_size & (self.page_size - 1):
            raise ValueError(f"MlaDecodePlanner: page_size must be a power of two in 1..256, "
                             f"got {page_size!r}")
        self.max_seqlen_q = _positive_int("max_seqlen_q", max_seqlen_q)
        # the scheduler's int32 bounds, before anything is allocated (get_mla_metadata_info_v1)
        if self.max_batch_size > INT32_MAX:
            raise ValueError(f"MlaDecodePlanner: max_batch_size must be <= {INT32_MAX} (int32 work "
                             f"indices), got {self.max_batch_size}")
        if self.max_num_pages > INT32_MAX:
            raise ValueError(f"MlaDecodePlanner: max_num_pages must be <= {INT32_MAX} (int32 page "
                             f"offsets in kv_indptr), got {self.max_num_pages}")
        self.sm_scale = require_real("MlaDecodePlanner: sm_scale", sm_scale, float32=True)
        if self.sm_scale <= 0:   # a planner is for a model: its scale is positive
            raise ValueError(f"MlaDecodePlanner: sm_scale must be > 0, got {sm_scale!r}")
        if struct.unpack("f", struct.pack("f", self.sm_scale))[0] == 0.0:   # the kernels read a C float
            raise ValueError(f"MlaDecodePlanner: sm_scale must be > 0 as a float32 (at least about "
                             f"1.4e-45), got {sm_scale!r}, which rounds to 0")
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"MlaDecodePlanner: dtype must be a torch.dtype (torch.bfloat16 or "
                            f"torch.float8_e4m3fn), got {type(dtype).__name__} {dtype!r}")
        if dtype not in decode.SUPPORTED_DTYPES:
            raise NotImplementedError(f"MlaDecodePlanner: dtype must be one of "
                                      f"{sorted(map(str, decode.SUPPORTED_DTYPES))}, got {dtype}")
        self.dtype = dtype
        decode.decode_variant(self.num_heads, self.max_seqlen_q, self.page_size, dtype, dtype,
                              who="MlaDecodePlanner")
        given = device
        if device is not None:   # a wrong argument is named before the machine is asked about
            try:
                device = torch.device(device)
            except (RuntimeError, TypeError) as exc:
                raise ValueError(f"MlaDecodePlanner: device must be a CUDA device, got {device!r}") from exc
            if device.type != "cuda":
                raise ValueError(f"MlaDecodePlanner: device must be a CUDA device, got {device}")
        if not torch.cuda.is_available():
            raise RuntimeError("MlaDecodePlanner needs a CUDA device; none is visible")
        device = torch.device("cuda") if device is None else device
        self.device = device = torch.device(
            "cuda", errors.visible_index(device, given, "MlaDecodePlanner: "))
        B = self.max_batch_size
        # the int32 bound that depends on the work-list count C (works = B + C - 1), before any
        # allocation; C from the sizes of an empty plan (work_indptr has C + 1 entries)
        nc = metadata.get_mla_metadata_info_v1(0, self.max_seqlen_q, self.num_heads, dtype, dtype)[1][0][0] - 1
        if metadata.max_works(B, nc) > INT32_MAX:
            raise ValueError(f"MlaDecodePlanner: max_batch_size must be <= {INT32_MAX - nc + 1} (int32 "
                             f"work indices with {nc} work lists), got {B}")
        info = metadata.get_mla_metadata_info_v1(B, self.max_seqlen_q, self.num_heads, dtype, dtype)
        i32 = dict(dtype=torch.int32, device=device)
        self.qo_indptr = torch.zeros(B + 1, **i32)
        self.kv_indptr = torch.zeros(B + 1, **i32)
        self.kv_last_page_lens = torch.ones(B, **i32)
        self.kv_indices = torch.zeros(self.max_num_pages, **i32)
        (self.work_meta_data, self.work_indptr, self.work_info_set, self.reduce_indptr,
         self.reduce_final_map, self.reduce_partial_map) = [
            torch.empty(shape, dtype=d, device=device) for shape, d in info]
        n_partial = int(self.reduce_partial_map.shape[0]) * self.max_seqlen_q
        self.logits = torch.empty((n_partial, 1, self.num_heads, V_HEAD_DIM), dtype=torch.float32, device=device)
        self.attn_lse = torch.empty((n_partial, 1, self.num_heads, 1), dtype=torch.float32, device=device)
        self._views: dict[int, tuple] = {}   # batch -> views of the layout buffers (stable objects)
        self.batch_size: Optional[int] = None

    def layout(self, batch_size: int) -> tuple:
        """The planner's own ``(qo_indptr, kv_indptr, kv_last_page_lens)`` views for a batch of
        ``batch_size`` ([B + 1], [B + 1], [B] int32), always the same objects. An engine that
        fills these (and ``kv_indices``) in place and passes them to :meth:`plan` saves its
        copies.

        Raises TypeError when ``batch_size`` is not an int (bools and floats included) and
        ValueError when it is not in 1..max_batch_size."""
        b = _positive_int("batch_size", batch_size)
        if b > self.max_batch_size:
            raise ValueError(f"MlaDecodePlanner: batch_size must be <= max_batch_size="
                             f"{self.max_batch_size}, got {b}")
        views = self._views.get(b)
        if views is None:
            views = self._views[b] = (self.qo_indptr[:b + 1], self.kv_indptr[:b + 1],
                                      self.kv_last_page_lens[:b])
        return views

    def _source(self, t, name: str, length: Optional[int]) -> None:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"MlaDecodePlanner.plan: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.int32 or t.dim() != 1:
            raise ValueError(f"MlaDecodePlanner.plan: {name} must be a 1-D int32 tensor, got "
                             f"{t.dtype} of shape {tuple(t.shape)}")
        if t.device != self.device:
            raise ValueError(f"MlaDecodePlanner.plan: {name} must be on {self.device} (a device "
                             f"tensor: planning reads no host data), got {t.device}")
        if length is not None and t.numel() != length:
            raise ValueError(f"MlaDecodePlanner.plan: {name} must have {length} entries, got {t.numel()}")

    def plan(self, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
             kv_last_page_lens: torch.Tensor) -> None:
        """Plan one decode step: copy the batch layout into the planner's buffers (on the
        current stream; a tensor that is the planner's own buffer is not copied) and run
        ``get_mla_metadata_v1`` into its schedule buffers. No host synchronisation.

        Args: int32 device tensors of this step's B requests (1 <= B <= max_batch_size):
            qo_indptr [B + 1] (q tokens, each request 1..max_seqlen_q), kv_indptr [B + 1] (in
            pages), kv_indices [<= max_num_pages] physical page ids, kv_last_page_lens [B]
            (tokens in each request's last page, 1..page_size). Values are checked by the
            decode kernel (a bad one surfaces as DeviceIndexError, docs/DESIGN.md §5.13).

        Raises TypeError / ValueError naming the argument (type, dtype, shape, device, too many
        requests or pages); the errors of :func:`aiter_mla.get_mla_metadata_v1`.
        """
        self._source(kv_indptr, "kv_indptr", None)
        b = kv_indptr.numel() - 1
        if not 1 <= b <= self.max_batch_size:
            raise ValueError(f"MlaDecodePlanner.plan: kv_indptr must have B + 1 entries with 1 <= B "
                             f"<= max_batch_size={self.max_batch_size}, got {kv_indptr.numel()}")
        self._source(qo_indptr, "qo_indptr", b + 1)
        self._source(kv_last_page_lens, "kv_last_page_lens", b)
        self._source(kv_indices, "kv_indices", None)
        if kv_indices.numel() > self.max_num_pages:
            raise ValueError(f"MlaDecodePlanner.plan: kv_indices must have <= max_num_pages="
                             f"{self.max_num_pages} entries, got {kv_indices.numel()}")
        qo, kv, last = self.layout(b)
        for src, dst in ((qo_indptr, qo), (kv_indptr, kv), (kv_last_page_lens, last),
                         (kv_indices, self.kv_indices[:kv_indices.numel()])):
            if src.data_ptr() != dst.data_ptr():
                dst.copy_(src)
        metadata.get_mla_metadata_v1(
            qo, kv, last, self.num_heads, 1, True, self.work_meta_data, self.work_info_set,
            self.work_indptr, self.reduce_indptr, self.reduce_final_map, self.reduce_partial_map,
            page_size=self.page_size, kv_granularity=metadata.default_kv_granularity(self.page_size),
            max_seqlen_qo=self.max_seqlen_q, uni_seqlen_qo=self.max_seqlen_q, dtype_q=self.dtype,
            dtype_kv=self.dtype)
        self.batch_size = b

    def run(self, q: torch.Tensor, kv_cache: torch.Tensor, out: Optional[torch.Tensor] = None, *,
            lse: Optional[torch.Tensor] = None, return_lse: bool = False,
            q_scale: Optional[torch.Tensor] = None, kv_scale: Optional[torch.Tensor] = None):
        """Decode attention of one layer over the planned step.

        Args:
            q: [total_q, num_heads, 576] (the absorbed latent query, then the RoPE part),
                ``dtype``, contiguous; total_q = qo_indptr[-1] of the plan.
            kv_cache: this layer's [num_pages, page_size, 1, 576] cache, ``dtype`` (fill it with
                :func:`aiter_mla.concat_and_cache_mla`).
            out: optional [total_q, num_heads, 512] bf16 output, contiguous (given: nothing is
                allocated). q, kv_cache and out start 16-byte aligned (torch's allocations do);
                :func:`aiter_mla.mla_decode_fwd` names them ``q``, ``kv_buffer`` and ``o`` in
                its errors.
            lse / return_lse: a [total_q, num_heads] fp32 buffer for the LSE (natural log), or
                ``return_lse=True`` to allocate one (a bool, Python or NumPy).
            q_scale, kv_scale: fp8 per-tensor [1] fp32 scales (real = stored x scale).

        Returns ``out``, or ``(out, lse)`` when ``lse`` is given or ``return_lse``.

        Raises TypeError for a ``return_lse`` that is not a bool (``'no'`` is not read as
        truthy); RuntimeError before the first :meth:`plan`; otherwise the errors of
        :func:`aiter_mla.mla_decode_fwd` (which this calls with the planner's buffers).
        """
        if return_lse.__class__ is not bool:   # numpy bools pass (as bool); 'no' or 1 do not
            return_lse = require_bool("MlaDecodePlanner.run: return_lse", return_lse)
        if self.batch_size is None:
            raise RuntimeError("MlaDecodePlanner.run: call plan() for this step first")
        qo, kv, last = self._views[self.batch_size]
        if out is None:
            out = torch.empty((q.shape[0], self.num_heads, V_HEAD_DIM), dtype=torch.bfloat16, device=self.device)
        want_lse = return_lse or lse is not None
        _, lse = decode.mla_decode_fwd(
            q, kv_cache, out, qo, kv, self.kv_indices, last, self.max_seqlen_q,
            page_size=self.page_size, sm_scale=self.sm_scale, work_meta_data=self.work_meta_data,
            work_indptr=self.work_indptr, work_info_set=self.work_info_set,
            reduce_indptr=self.reduce_indptr, reduce_final_map=self.reduce_final_map,
            reduce_partial_map=self.reduce_partial_map, q_scale=q_scale, kv_scale=kv_scale,
            return_lse=want_lse, logits=self.logits, attn_lse=self.attn_lse, final_lse=lse)
        return (out, lse) if want_lse else out

    def __repr__(self) -> str:
        return (f"MlaDecodePlanner(max_batch_size={self.max_batch_size}, num_heads={self.num_heads}, "
                f"max_seqlen_q={self.max_seqlen_q}, page_size={self.page_size}, dtype={self.dtype}, "
                f"max_num_pages={self.max_num_pages}, sm_scale={self.sm_scale:.6g}, device={self.device})")

