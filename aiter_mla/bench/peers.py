"""Peers timed in the same run as ours, each only if importable.

A missing or failing peer is a note in the report, never a crash: :func:`discover` turns an
import failure into a one-line note; the sweep turns a failure inside a row into a row note.

- FlashInfer ``BatchMLAPagedAttentionWrapper`` (fa3 backend on sm_90a): bf16 Q and KV, and fp8
  KV (bf16 Q, per-tensor ``ckv_scale``/``kpe_scale``) where the installed version's ``run``
  accepts it. ``plan`` runs once per row outside the timing (it copies the page table to the
  host); only ``run`` is timed, with the CUDA-graph buffers FlashInfer documents.
- FlashMLA ``flash_mla_with_kvcache`` (bf16, page 64 only).

Each peer reads the same real values as ours (the bf16 copies are dequantised from our fp8
inputs), the same page table and the same rotated KV windows and Q sets, through the row object
the sweep hands it (``aiter_mla.bench.sweep.RowInputs``).
"""
from __future__ import annotations

import inspect

from ..arch import KV_LORA_RANK, V_HEAD_DIM

FLASHINFER_WORKSPACE_BYTES = 128 << 20  # FlashInfer's documented MLA float workspace


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else '(no message)'}"


class PeerRun:
    """One peer configured for one row: ``call(s)`` runs it on input set ``s``; ``output()``
    is the ``[total_q, heads, 512]`` result of the latest call."""

    def __init__(self, call, output):
        self.call = call
        self.output = output


class FlashInferPeer:
    """FlashInfer's MLA paged decode (``flashinfer.mla.BatchMLAPagedAttentionWrapper``)."""

    name = "flashinfer"

    def __init__(self, wrapper_cls, version: str):
        self.wrapper_cls = wrapper_cls
        self.version = version
        self._workspace = None

    @classmethod
    def load(cls) -> "FlashInferPeer":
        """Import FlashInfer; raises ImportError (or whatever the import raises) when absent."""
        import flashinfer
        from flashinfer.mla import BatchMLAPagedAttentionWrapper

        return cls(BatchMLAPagedAttentionWrapper, getattr(flashinfer, "__version__", "unknown"))

    def kinds(self, row) -> tuple[list[str], list[str]]:
        """KV dtypes to run for ``row`` (its Q is always bf16) and notes for those skipped."""
        kinds, notes = ["bf16"], []
        if row.kv_dtype == "fp8":
            if "ckv_scale" in inspect.signature(self.wrapper_cls.run).parameters:
                kinds.append("fp8")
            else:
                notes.append(f"flashinfer {self.version}: run() has no ckv_scale argument, so no "
                             "fp8 KV (added in FlashInfer PR #3694)")
        return kinds, notes

    def setup(self, row, kind: str) -> PeerRun:
        """Plan once for ``row`` (CUDA-graph mode) and return its ``run`` on input set ``s``;
        ``kind`` is the KV dtype (``"bf16"`` or ``"fp8"``; Q is bf16). FlashInfer's errors
        propagate (the sweep turns them into a row note)."""
        import torch

        if self._workspace is None:
            self._workspace = torch.empty(FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8,
                                          device=row.device)
        kv_torch = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}[kind]
        # CUDA-graph mode: plan() copies the indptrs into these fixed buffers.
        wrapper = self.wrapper_cls(
            self._workspace, use_cuda_graph=True, qo_indptr=row.qo_indptr.clone(),
            kv_indptr=row.kv_indptr.clone(), kv_indices=row.kv_indices.clone(),
            kv_len_arr=row.kv_len_arr.clone(), backend="auto")
        wrapper.plan(row.qo_indptr, row.kv_indptr, row.kv_indices, row.kv_len_arr, row.heads,
                     KV_LORA_RANK, row.qk_dim - KV_LORA_RANK, row.page_size, row.causal,
                     row.sm_scale, torch.bfloat16, kv_torch)
        q_parts = []
        for i in range(row.rotation.n_q_sets):
            q = row.q(i, "bf16")
            q_parts.append((q[..., :KV_LORA_RANK].contiguous(), q[..., KV_LORA_RANK:].contiguous()))
        out = torch.empty(row.total_q, row.heads, V_HEAD_DIM, dtype=torch.bfloat16,
                          device=row.device)
        scales = {}
        if kind == "fp8":
            scales = {"ckv_scale": row.kv_scale, "kpe_scale": row.kv_scale}

        def call(s: int):
            qn, qp = q_parts[s % len(q_parts)]
            kv = row.kv_window(s, kind)[:, :, 0, :]  # [pages, page_size, 576]
            wrapper.run(qn, qp, kv[..., :KV_LORA_RANK], kv[..., KV_LORA_RANK:], out=out, **scales)

        return PeerRun(call, lambda: out)


class FlashMLAPeer:
    """FlashMLA's dense decode (``flash_mla.flash_mla_with_kvcache``): bf16, page 64 only."""

    name = "flashmla"

    def __init__(self, module, version: str):
        self.mod = module
        self.version = version

    @classmethod
    def load(cls) -> "FlashMLAPeer":
        """Import FlashMLA; raises ImportError (or whatever the import raises) when absent."""
        import flash_mla

        return cls(flash_mla, getattr(flash_mla, "__version__", "unknown"))

    def kinds(self, row) -> tuple[list[str], list[str]]:
        """``["bf16"]`` at page 64, else nothing and a note (FlashMLA's only page size)."""
        if row.page_size != 64:
            return [], [f"flashmla: page_size 64 only, row has {row.page_size}"]
        return ["bf16"], []

    def setup(self, row, kind: str) -> PeerRun:
        """Schedule once for ``row`` and return ``flash_mla_with_kvcache`` on input set ``s``
        (bf16 Q and KV, a padded ``[batch, max_pages]`` block table from our page table)."""
        import torch

        seqlens = row.kv_len_arr
        # The same positional call works for the Feb-2025 API and the lazy FlashMLASchedMeta one.
        md, num_splits = self.mod.get_mla_metadata(seqlens, row.qlen * row.heads, 1)
        pages = row.pages_per_request
        table = torch.zeros(row.batch, max(pages), dtype=torch.int32)
        flat = row.kv_indices.cpu()
        start = 0
        for b, n in enumerate(pages):
            table[b, :n] = flat[start:start + n]
            start += n
        table = table.to(row.device)
        qs = [row.q(i, "bf16").view(row.batch, row.qlen, row.heads, row.qk_dim)
              for i in range(row.rotation.n_q_sets)]
        latest = {}

        def call(s: int):
            out, _ = self.mod.flash_mla_with_kvcache(
                qs[s % len(qs)], row.kv_window(s, "bf16"), table, seqlens, V_HEAD_DIM, md,
                num_splits, softmax_scale=row.sm_scale, causal=row.causal)
            latest["out"] = out

        return PeerRun(call, lambda: latest["out"].reshape(row.total_q, row.heads, V_HEAD_DIM))


PEER_CLASSES = (FlashInferPeer, FlashMLAPeer)


def discover(classes=PEER_CLASSES) -> tuple[list, list[str]]:
    """``(peers, notes)``: every importable peer, and one line per peer that is not
    (``"flashinfer: not importable (ModuleNotFoundError: No module named 'flashinfer')"``)."""
    peers, notes = [], []
    for cls in classes:
        try:
            peers.append(cls.load())
        except Exception as exc:  # any import-time failure degrades to a note
            notes.append(f"{cls.name}: not importable ({_first_line(exc)})")
    return peers, notes
