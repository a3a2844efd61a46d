"""The sweep: one row per (heads, qlen, batch, ctx, page_size), measured on the GPU.

Per row: build the inputs (:mod:`.inputs`), plan once (``get_mla_metadata_v1``), run the op
once and check a slice against the float64 reference, then time the metadata and the decode +
reduce (``mla_decode_fwd`` with the plan) over CUDA-graph replays (:mod:`.timing`), sampling
SM clock and board power meanwhile (:mod:`.power`), then each peer on the same inputs. A row
that fails records its error and the sweep goes on.

:func:`plan_rows` and :class:`RowSpec` are pure Python (CPU-tested); the rest needs a GPU.
"""
from __future__ import annotations

import functools
import sys
import zlib
from dataclasses import dataclass, field

from ..arch import QK_HEAD_DIM, V_HEAD_DIM
from . import formulas, inputs, power, reference_numbers
from .timing import calls_per_graph, time_calls

#: Layers of DeepSeek-V3 that one decode step's plan serves (the metadata is amortised over them).
LAYERS = 61
#: Rows whose requested ctx exceeds this skip the float64 spot check (time, memory).
CHECK_MAX_CTX = 8192
CHECK_REQUESTS = 2
#: rel-L2 of our output vs the float64 reference above which a row is flagged.
CHECK_TOL = {"fp8": 0.03, "bf16": 0.01}
METADATA_CALLS_PER_GRAPH = 16
#: Rows whose floor is below this (µs) also time a whole decode step, metadata + decode +
#: reduce chained in one graph (issue 6's tiny-case target): at that size the launches, not the
#: kernels, set the time, and the kernels overlap their neighbours (programmatic dependent
#: launch), so the step is less than the sum of its separately timed parts.
STEP_MAX_FLOOR_US = 20.0


@dataclass
class RowSpec:
    """One benchmark row (what to run; all sizes in tokens)."""

    heads: int
    qlen: int
    batch: int
    ctx: int
    page_size: int
    q_dtype: str
    kv_dtype: str
    varlen: bool
    kv_lens: list[int]
    seed: int

    @property
    def total_q(self) -> int:
        return self.batch * self.qlen

    @property
    def qlens(self) -> list[int]:
        return [self.qlen] * self.batch

    @property
    def needed_pages(self) -> int:
        return sum(inputs.pages_per_request(self.kv_lens, self.page_size))

    @property
    def flops(self) -> int:
        return formulas.flops(self.qlens, self.kv_lens, self.heads)

    @property
    def bytes(self) -> int:
        return formulas.bytes_moved(self.qlens, self.kv_lens, self.heads, self.q_dtype, self.kv_dtype)

    @property
    def dtype(self) -> str:
        return self.q_dtype if self.q_dtype == self.kv_dtype else f"{self.q_dtype}/{self.kv_dtype}"

    def base_row(self) -> dict:
        """The row's identity and static figures, as stored in results.json."""
        row = {
            "heads": self.heads, "qlen": self.qlen, "batch": self.batch, "ctx": self.ctx,
            "page_size": self.page_size, "dtype": self.dtype, "q_dtype": self.q_dtype,
            "kv_dtype": self.kv_dtype, "varlen": self.varlen,
            "kv_len_sum": sum(self.kv_lens), "kv_len_max": max(self.kv_lens),
            "flops": self.flops, "bytes": self.bytes,
            # filled by the measurement; None in a row that failed
            "us": None, "tflops": None, "tbps": None, "frac_floor": None, "peers": {},
        }
        row.update(reference_numbers.reference_columns(
            self.heads, self.qlen, self.batch, self.ctx, self.page_size, self.q_dtype,
            self.kv_dtype, self.varlen))
        return row


def plan_rows(pairs, batches, ctxs, page_sizes, q_dtype: str, kv_dtype: str, varlen: bool,
              seed: int = 0) -> list[RowSpec]:
    """Every (pair, page, batch, ctx) row in table order, with its drawn KV lengths.

    A value given twice in one list counts once (its first place), so no row is timed twice.
    Rows where ctx < qlen (a causal window longer than the context) are left out. Raises
    ValueError for non-positive sizes.
    """
    pairs, page_sizes, batches, ctxs = (list(dict.fromkeys(v)) for v in (pairs, page_sizes,
                                                                          batches, ctxs))
    specs = []
    for heads, qlen in pairs:
        if heads < 1 or qlen < 1:
            raise ValueError(f"heads and qlen must be >= 1, got ({heads}, {qlen})")
        for page in page_sizes:
            for batch in batches:
                for ctx in ctxs:
                    if ctx < qlen:
                        continue
                    row_seed = zlib.crc32(repr((seed, heads, qlen, page, batch, ctx)).encode())
                    lens = inputs.draw_kv_lens(batch, ctx, qlen, varlen, row_seed)
                    specs.append(RowSpec(heads, qlen, batch, ctx, page, q_dtype, kv_dtype,
                                         varlen, lens, row_seed))
    return specs


def max_split_per_batch(heads: int, batch: int, num_cu: int) -> int:
    """AITER test_mla_persistent.py's split cap, which the seed's numbers were measured with:
    32, reduced to ``min(ceil(num_CU / batch), 32)`` for 128 heads or more."""
    if heads >= 128:
        return min(-(-num_cu // batch), 32)
    return 32


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else '(no message)'}"


class KVPool:
    """The sweep's KV pool (tokens x 576) in the rows' KV dtype, plus a lazily made bf16 copy
    of the same real values for peers that read bf16."""

    def __init__(self, tokens: int, kv_dtype: str, device, seed: int):
        self.kv_dtype = kv_dtype
        self.tokens = tokens
        self.native, self.scale = inputs.make_kv_pool(tokens, kv_dtype, device, seed)
        self._bf16 = None

    def flat(self, kind: str):
        """The pool as ``[tokens, 576]`` in ``kind`` (the native dtype, or the bf16 copy)."""
        if kind == self.kv_dtype:
            return self.native
        if kind == "bf16":
            if self._bf16 is None:
                self._bf16 = inputs.dequantize_to_bf16(self.native, self.scale)
            return self._bf16
        raise ValueError(f"the pool holds {self.kv_dtype} KV; cannot serve {kind}")

    def pages(self, kind: str, page_size: int):
        """``[tokens / page_size, page_size, 1, 576]`` view."""
        return self.flat(kind).view(-1, page_size, 1, QK_HEAD_DIM)


@dataclass
class RowInputs:
    """One row's device inputs, shared by our op and the peers."""

    spec: RowSpec
    device: object
    pool: KVPool
    rotation: inputs.Rotation
    qo_indptr: object
    kv_indptr: object
    kv_indices: object
    kv_last_page_lens: object
    kv_len_arr: object
    q_sets: list
    q_scales: list
    sm_scale: float
    _q_bf16: dict = field(default_factory=dict)

    heads = property(lambda self: self.spec.heads)
    qlen = property(lambda self: self.spec.qlen)
    batch = property(lambda self: self.spec.batch)
    page_size = property(lambda self: self.spec.page_size)
    kv_dtype = property(lambda self: self.spec.kv_dtype)
    total_q = property(lambda self: self.spec.total_q)
    causal = property(lambda self: self.spec.qlen > 1)
    qk_dim = QK_HEAD_DIM

    @property
    def kv_scale(self) -> float:
        return self.pool.scale

    @property
    def pages_per_request(self) -> list[int]:
        return inputs.pages_per_request(self.spec.kv_lens, self.spec.page_size)

    def kv_window(self, s: int, kind: str):
        """Input set ``s``'s KV buffer ``[window_pages, page_size, 1, 576]`` (a contiguous view)."""
        r = self.rotation
        start = (s % r.n_sets) * r.shift_pages
        return self.pool.pages(kind, self.page_size)[start:start + r.window_pages]

    def q(self, i: int, kind: str):
        """Q set ``i``; ``kind="bf16"`` gives the dequantised bf16 copy (same real values)."""
        i %= self.rotation.n_q_sets
        if kind == self.spec.q_dtype:
            return self.q_sets[i]
        if kind != "bf16":
            raise ValueError(f"Q is {self.spec.q_dtype}; cannot serve {kind}")
        if i not in self._q_bf16:
            import torch

            self._q_bf16[i] = (self.q_sets[i].to(torch.float32) * self.q_scales[i]).to(torch.bfloat16)
        return self._q_bf16[i]


@dataclass
class SweepContext:
    """What every row shares: device, pool, ceilings, L2 size, peers, options; ``sampler``
    (a :class:`aiter_mla.bench.power.Sampler`, or None: not sampled) records SM clock and
    board power while each row's decode is timed."""

    device: object
    pool: KVPool
    ceilings: dict
    l2_bytes: int
    num_cu: int
    peers: list
    check: bool = True
    sm_scale: float = field(default_factory=inputs.deepseek_v3_sm_scale)
    sampler: object = None


def make_row_inputs(spec: RowSpec, ctx: SweepContext) -> RowInputs:
    """Page table, rotation plan and Q sets of one row on ``ctx.device`` (see :mod:`.inputs`)."""
    import torch

    dev = ctx.device
    kvb = formulas.ELEM_BYTES[spec.kv_dtype]
    qb = formulas.ELEM_BYTES[spec.q_dtype]
    pool_pages = ctx.pool.tokens // spec.page_size
    rot = inputs.rotation_plan(
        spec.needed_pages, pool_pages, spec.page_size * QK_HEAD_DIM * kvb, ctx.l2_bytes,
        spec.total_q * spec.heads * QK_HEAD_DIM * qb)
    indptr, indices, last = inputs.page_table(spec.kv_lens, spec.page_size, rot.window_pages,
                                              spec.seed)
    q_all, scales = inputs.make_q_sets(rot.n_q_sets, spec.total_q, spec.heads, spec.q_dtype, dev,
                                       spec.seed)
    return RowInputs(
        spec, dev, ctx.pool, rot, inputs.qo_indptr(spec.batch, spec.qlen).to(dev), indptr.to(dev),
        indices.to(dev), last.to(dev), torch.tensor(spec.kv_lens, dtype=torch.int32, device=dev),
        list(q_all), list(scales), ctx.sm_scale)


def _reference(ri: RowInputs):
    """float64 reference output ``[rows, heads, 512]`` of input set 0 for the first requests."""
    from ..reference import mla_decode_ref

    n = min(CHECK_REQUESTS, ri.batch)
    rows = n * ri.qlen
    kv_end = int(ri.kv_indptr[n])
    ref, _ = mla_decode_ref(
        ri.q(0, ri.spec.q_dtype)[:rows], ri.kv_window(0, ri.kv_dtype), ri.qo_indptr[:n + 1],
        ri.kv_indptr[:n + 1], ri.kv_indices[:kv_end], ri.kv_last_page_lens[:n],
        sm_scale=ri.sm_scale, q_scale=ri.q_scales[0], kv_scale=ri.kv_scale)
    return ref


class _Plan:
    """The row's schedule buffers and the two calls we time."""

    def __init__(self, ri: RowInputs, msb: int):
        import torch

        from ..ops import metadata as md
        from ..ops.decode import mla_decode_fwd
        from .variants import torch_dtype

        s = ri.spec
        qdt, kvdt = torch_dtype(s.q_dtype), torch_dtype(s.kv_dtype)
        info = md.get_mla_metadata_info_v1(s.batch, s.qlen, s.heads, qdt, kvdt, is_sparse=False,
                                           fast_mode=True)
        (self.work_meta_data, self.work_indptr, self.work_info_set, self.reduce_indptr,
         self.reduce_final_map, self.reduce_partial_map) = [
            torch.empty(shape, dtype=dtype, device=ri.device) for shape, dtype in info]
        self.out = torch.empty(s.total_q, s.heads, V_HEAD_DIM, dtype=torch.bfloat16, device=ri.device)
        self.kv_scale = torch.full((1,), ri.kv_scale, dtype=torch.float32, device=ri.device)
        self.metadata = functools.partial(
            md.get_mla_metadata_v1, ri.qo_indptr, ri.kv_indptr, ri.kv_last_page_lens, s.heads, 1,
            ri.causal, self.work_meta_data, self.work_info_set, self.work_indptr,
            self.reduce_indptr, self.reduce_final_map, self.reduce_partial_map,
            page_size=s.page_size, kv_granularity=md.default_kv_granularity(s.page_size),
            max_seqlen_qo=s.qlen, uni_seqlen_qo=s.qlen, fast_mode=True, max_split_per_batch=msb,
            dtype_q=qdt, dtype_kv=kvdt)
        self._ri = ri
        self.fwd = mla_decode_fwd

    def decode_args(self, s: int) -> tuple[tuple, dict]:
        """``mla_decode_fwd`` arguments for input set ``s`` (persistent mode, with the plan)."""
        ri = self._ri
        i = s % ri.rotation.n_q_sets
        args = (ri.q_sets[i], ri.kv_window(s, ri.kv_dtype), self.out, ri.qo_indptr, ri.kv_indptr,
                ri.kv_indices, ri.kv_last_page_lens, ri.qlen)
        kwargs = dict(page_size=ri.page_size, nhead_kv=1, sm_scale=ri.sm_scale,
                      work_meta_data=self.work_meta_data, work_indptr=self.work_indptr,
                      work_info_set=self.work_info_set, reduce_indptr=self.reduce_indptr,
                      reduce_final_map=self.reduce_final_map,
                      reduce_partial_map=self.reduce_partial_map, q_scale=ri.q_scales[i],
                      kv_scale=self.kv_scale)
        return args, kwargs

    def decode(self, s: int) -> None:
        """decode + reduce on input set ``s`` (AITER's persistent-mode ``mla_decode_fwd``)."""
        args, kwargs = self.decode_args(s)
        self.fwd(*args, **kwargs)

    def step(self, s: int) -> None:
        """One decode step on input set ``s``: plan (metadata), then decode + reduce."""
        self.metadata()
        self.decode(s)


def _rotated_calls(call, rot: inputs.Rotation, per_graph: int) -> list:
    """Enough calls to visit every input set once, in whole graphs of ``per_graph``."""
    n_graphs = -(-rot.n_sets // per_graph)
    return [functools.partial(call, s % rot.n_sets) for s in range(n_graphs * per_graph)]


def run_row(spec: RowSpec, ctx: SweepContext) -> dict:
    """Measure one row; never raises for a failure of our op or a peer (recorded in the row)."""
    import torch

    row = spec.base_row()
    row["notes"] = []
    try:
        _measure(spec, ctx, row)
    except Exception as exc:  # the sweep goes on; the report shows the failure
        row["error"] = _first_line(exc)
    try:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    except Exception as exc:  # a sticky error (e.g. illegal address) ends every later row too
        row.setdefault("error", _first_line(exc))
        raise ContextLost(_first_line(exc), row) from exc
    return row


class ContextLost(RuntimeError):
    """The CUDA context is unusable after a row; ``row`` is that row's record."""

    def __init__(self, message: str, row: dict):
        super().__init__(message)
        self.row = row


def _measure(spec: RowSpec, ctx: SweepContext, row: dict) -> None:
    import torch

    ri = make_row_inputs(spec, ctx)
    msb = max_split_per_batch(spec.heads, spec.batch, ctx.num_cu)
    row["max_split_per_batch"] = msb
    row["rotation"] = {"window_pages": ri.rotation.window_pages, "n_sets": ri.rotation.n_sets,
                       "n_q_sets": ri.rotation.n_q_sets}
    plan = _Plan(ri, msb)
    plan.metadata()
    plan.decode(0)
    torch.cuda.synchronize()
    ref = None
    if ctx.check and spec.ctx <= CHECK_MAX_CTX:
        from ..reference import relative_l2

        ref = _reference(ri)
        err = relative_l2(plan.out[:ref.shape[0]], ref)
        row["ref_rel_err"] = err
        row["ref_ok"] = err <= CHECK_TOL[spec.kv_dtype]
        row["ref_requests"] = min(CHECK_REQUESTS, spec.batch)

    meta = time_calls([plan.metadata] * METADATA_CALLS_PER_GRAPH, METADATA_CALLS_PER_GRAPH)
    floor = formulas.floor_us(spec.flops, spec.bytes, ctx.ceilings, spec.q_dtype, spec.kv_dtype)
    per_graph = calls_per_graph(max(1.5 * floor, 8.0))
    with power.sampled(ctx.sampler) as gpu:   # clock_mhz, power_w, gpu_samples
        dec = time_calls(_rotated_calls(plan.decode, ri.rotation, per_graph), per_graph)
    row.update(gpu)
    if getattr(ctx.sampler, "source", None) and not gpu["gpu_samples"]:
        row["notes"].append(f"no SM clock / power sample from {ctx.sampler.source}")
    row.update(formulas.row_metrics(dec.us, spec.flops, spec.bytes, ctx.ceilings, spec.q_dtype,
                                    spec.kv_dtype))
    row.update({
        "us": dec.us, "decode_us": dec.us, "metadata_us": meta.us, "total_us": dec.us + meta.us,
        "per_layer_us": dec.us + meta.us / LAYERS,
        "timing": {"decode": dec.as_dict(), "metadata": meta.as_dict()},
    })
    timings = [dec, meta]
    if floor < STEP_MAX_FLOOR_US:
        step = time_calls(_rotated_calls(plan.step, ri.rotation, per_graph), per_graph)
        row["step_us"] = step.us
        row["timing"]["step"] = step.as_dict()
        timings.append(step)
    for t in timings:
        if t.note:
            row["notes"].append(t.note)

    measure_peers(ctx.peers, ri, ref, per_graph, dec.us, row, sampler=ctx.sampler)


def measure_peers(peers, ri, ref, per_graph: int, ours_us: float, row: dict, timer=None,
                  sync=None, sampler=None) -> None:
    """Time every peer kind on the row's inputs into ``row["peers"]`` (µs), ``row["peer_ratio"]``
    (ours / peer) and ``row["peer_ref_rel_err"]``; a peer that fails adds a row note instead.

    ``ref`` is the float64 reference of the first requests (or None: no check); ``timer`` and
    ``sync`` default to :func:`time_calls` and ``torch.cuda.synchronize``. ``sampler`` (a
    :class:`.power.Sampler`, or None) samples the SM clock while each peer is timed, into
    ``row["peer_clock_mhz"]`` (median MHz per peer column): at the power cap the clock moves
    between our timing and the peer's, and a ratio then mixes clock with kernel speed.
    """
    from ..reference import relative_l2

    timer = timer or time_calls
    if sync is None:
        import torch

        sync = torch.cuda.synchronize
    ratios, peer_err = {}, {}
    for peer in peers:
        kinds, notes = peer.kinds(ri)
        row["notes"].extend(notes)
        for kind in kinds:
            col = f"{peer.name}_{kind}"
            try:
                run = peer.setup(ri, kind)
                run.call(0)
                sync()
                if ref is not None:
                    peer_err[col] = relative_l2(run.output()[:ref.shape[0]], ref)
                with power.sampled(sampler) as gpu:
                    t = timer(_rotated_calls(run.call, ri.rotation, per_graph), per_graph)
            except Exception as exc:  # a failing peer is a note, not a crash
                row["notes"].append(f"{col}: {_first_line(exc)}")
                continue
            row["peers"][col] = t.us
            if gpu["clock_mhz"]:
                row.setdefault("peer_clock_mhz", {})[col] = gpu["clock_mhz"]["median"]
            ratios[col] = ours_us / t.us
            if t.note:
                row["notes"].append(f"{col}: {t.note}")
    if ratios:
        row["peer_ratio"] = ratios
    if peer_err:
        row["peer_ref_rel_err"] = peer_err


def run_sweep(specs: list[RowSpec], ctx: SweepContext, progress: bool = True) -> list[dict]:
    """All rows in order, with a progress bar on stderr."""
    from tqdm import tqdm

    rows = []
    bar = tqdm(specs, desc="sweep", unit="row", file=sys.stderr, disable=not progress)
    for i, spec in enumerate(bar):
        bar.set_postfix_str(f"H{spec.heads} q{spec.qlen} b{spec.batch} c{spec.ctx}")
        try:
            row = run_row(spec, ctx)
        except ContextLost as lost:
            rows.append(lost.row)
            for rest in specs[i + 1:]:
                skipped = rest.base_row()
                skipped.update(notes=[], error=f"not run: CUDA context lost in an earlier row ({lost})")
                rows.append(skipped)
            break
        rows.append(row)
        if row["us"] is not None:
            bar.set_postfix_str(f"H{spec.heads} q{spec.qlen} b{spec.batch} c{spec.ctx} "
                                f"{row['us']:.1f}us {row['frac_floor']:.2f}floor")
    bar.close()
    return rows


def max_needed_tokens(specs: list[RowSpec]) -> int:
    """Pool tokens the largest row needs (pages rounded up)."""
    return max(s.needed_pages * s.page_size for s in specs)


def l2_bytes(device) -> int:
    """The GPU's L2 size (torch's device properties), 50 MiB if torch does not say."""
    import torch

    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "L2_cache_size", 0) or (50 << 20))

