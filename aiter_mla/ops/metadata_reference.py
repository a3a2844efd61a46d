"""Pure-Python reference of the split-KV work scheduler (AITER ``get_mla_metadata_v1``, fast
mode ``v1_2``, same buffers and cost model), runnable on the CPU.

The schedule is *position based*: every batch's cost is laid end to end on one line and the
line is cut into ``num_splits`` equal slices of ``delta`` cost blocks. AITER's v1_2 instead
walks the clusters greedily with a budget of ``delta + OVH`` each (docs/DESIGN.md §5.6); both
give each cluster about ``delta`` blocks, but a cluster's pieces here depend only on where they
sit on the line, so the device kernel can place every piece independently (prefix sums, no
serial walk over clusters). The cut positions therefore differ from AITER's; the balance bound
is AITER's payload form (``delta + OVH`` per cluster, plus one merged tail: ``metadata.py``).

* Batch b costs ``c_b = blocks_b + OVH`` (``blocks_b = ceil(kv_pages_b / kv_granularity)``)
  and occupies ``[P_b, P_b + c_b)`` with ``P_b = sum_{i<b} c_i`` (but for the spread of
  uniform batches below): its OVH overhead units, then its blocks. ``delta = ceil(S /
  num_splits)``, ``S = sum c_b``, except for uniform batches (every ``c_b = c``), when the
  change adds at most ``min(16, ceil(S / num_splits) / 8)`` blocks to the slice
  (:func:`cost_line`):

  * ``B > num_splits / 2``: ``delta = k c``, a whole number of batches (``k =
    ceil(ceil(S / num_splits) / c)``). The lattice then falls on batch boundaries and no
    batch is split.
  * ``k = num_splits // B >= 2``: ``delta = ceil(c / k)``, and every batch spans ``k delta``
    of the line (``P_b = b k delta``; the padding after its blocks is on no cluster). Each
    batch is then cut into at most k pieces on k clusters of its own, one work a cluster
    (near-equal: the first is OVH blocks shorter; where OVH >= delta, the first OVH // delta
    clusters of each batch stay idle and it gets fewer pieces).
    The plain lattice drifts against the batches and leaves a short piece in most of them:
    at (16,1) b64 ctx 8192 on 132 lists, pieces of about 63, 63 and 3 blocks, the last a whole
    work's set-up, epilogue and merge input for 3 tiles.
  (This package's rule: with 64 equal batches on 66 clusters, ``ceil(S / N)`` is one block
  short of a batch and the plain lattice cut 63 of them in two, so the reduce read every row
  back: 17 us of a 120 us call on the H200, docs/perf/notes.md. AITER's greedy walk keeps such
  batches whole while they fit its payload.)
* A cut of batch b may sit at each multiple ``m * delta`` strictly inside its block region
  (so both sides get >= 1 block), at block offset ``m * delta - P_b - OVH``.
* A piece starting at line position ``x`` (a cut, or ``P_b + OVH`` for a batch's first piece)
  goes to cluster ``min(num_splits - 1, x // delta)``. Works are in (batch, kv) order, which
  is also cluster order.

The device kernel (``templates/mla_metadata.cu.j2``) computes the same schedule a different
way (closed-form cut counts per batch, block-wide prefix sums, one thread per work), so tests
that compare the two check one against the other.

Conventions (``docs/ARCHITECTURE.md``; units as AITER):

* ``kv_indptr``, ``kv_start``, ``kv_end``, ``kv_granularity``: pages. ``kv_offset``: tokens.
* ``OVH = max(1, ceil(16 / page_size))`` (AITER ``fixed_over_head_num_blocks``).
* ``num_splits = num_clusters`` if ``max_split_per_batch < 0`` else
  ``min(num_clusters, max_split_per_batch * num_batches)`` (a *global* cap, as AITER).
* One qo tile per batch (``num_heads * max_seqlen_qo <= MAX_TILE_ROWS``); ragged q lengths are read from
  ``qo_indptr``: a split piece takes ``qlen_b`` partial rows (rows in (batch, piece) order),
  ``reduce_final_map[b] = (qo_start_b, qo_end_b)``.
* Tail rule (ours, docs/DESIGN.md §8.4): a cut is never made when it would leave fewer than
  ``max_seqlen_qo`` KV tokens after it; the piece before it runs on (to the batch end, as
  every later cut of that batch leaves even fewer tokens). AITER applies this rule only at
  page_size 1; applying it to every page size means every q row of every split piece sees at
  least one key, so no partial row is left for the decode kernel's "no visible key" backstop
  (which still exists: ``ARCHITECTURE.md``).
* A zero-length KV batch gets one unsplit work with ``kv_start == kv_end`` (the decode kernel
  writes output 0 and final LSE +inf for its rows).
* Every tile (= batch, in batch order) gets ``reduce_final_map[b] = (qo_start, qo_end)``, also
  unsplit ones (AITER leaves those unwritten; writing them is harmless and deterministic).
  Unsplit tiles have no reduce entries (``reduce_indptr[b+1] == reduce_indptr[b]``).
"""
from __future__ import annotations

import collections.abc
from dataclasses import dataclass, field

from .. import arch as _arch
from ..work_info import WHOLE_BATCH_SLACK, WI, WORK_INFO_INTS

INT32_MAX = 2**31 - 1
#: Query rows one qo tile (one batch's q rows) may hold, as heads (per KV head) and q length:
#: the decode kernels' limits. AITER's tile holds 128 rows (``kPackedQoLenPerWg``) and splits
#: larger shapes into qo tiles; the decode kernel here runs a tile's 64-row blocks as CTAs side
#: by side instead, so the schedule never depends on the row count.
MAX_HEADS, MAX_SEQLEN_QO, MAX_TILE_ROWS = _arch.MAX_HEADS, _arch.MAX_SEQLEN_Q, _arch.MAX_ROWS


def overhead_blocks(page_size: int) -> int:
    """Per-piece overhead in cost blocks, ``max(1, ceil(16 / page_size))`` (AITER
    ``fixed_over_head_num_blocks``): 16 at page_size 1, 1 from page_size 16 on."""
    return max(1, -(-16 // page_size))


def num_splits_for(num_clusters: int, max_split_per_batch: int, num_batches: int) -> int:
    """Clusters the payload is spread over: ``num_clusters`` if ``max_split_per_batch < 0``,
    else ``min(num_clusters, max_split_per_batch * num_batches)`` (AITER's global cap), at least 1.
    """
    if max_split_per_batch < 0:
        return num_clusters
    return max(1, min(num_clusters, max_split_per_batch * num_batches))


def _is_pow2(x: int) -> bool:
    return x >= 1 and (x & (x - 1)) == 0


def check_int(name: str, value) -> None:
    """TypeError unless ``value`` is a plain integer (Python or NumPy int; not a bool, a float
    or a tensor): a float batch size would otherwise turn into float buffer shapes."""
    if type(value) is int:   # the common case, without the ABC check below (per-call path)
        return
    import numbers

    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")


def check_scalars(*, num_heads: int, num_clusters: int, page_size: int, kv_granularity: int,
                  max_seqlen_qo: int, max_split_per_batch: int, names: dict | None = None) -> None:
    """Raise TypeError / ValueError / NotImplementedError for scalar arguments outside what the
    scheduler supports (shared by the reference, the device op and the ``metadata`` command, so
    all reject the same inputs). ``names``: the caller's names for these arguments, used in the
    messages (``{"num_heads": "num_head_qo"}``; the CLI's flags), each defaulting to its own."""
    def n(key: str) -> str:
        return names.get(key, key) if names else key

    for key, value in (("num_heads", num_heads), ("num_clusters", num_clusters),
                       ("page_size", page_size), ("kv_granularity", kv_granularity),
                       ("max_seqlen_qo", max_seqlen_qo),
                       ("max_split_per_batch", max_split_per_batch)):
        if type(value) is not int:   # names resolved only for a message (per-call path)
            check_int(n(key), value)
    if num_heads < 1:
        raise ValueError(f"{n('num_heads')} must be >= 1, got {num_heads}")
    _check_max_seqlen_qo(n("max_seqlen_qo"), max_seqlen_qo)
    if num_heads > MAX_HEADS or max_seqlen_qo > MAX_SEQLEN_QO:
        raise NotImplementedError(
            f"{n('num_heads')} * {n('max_seqlen_qo')} = {num_heads} * {max_seqlen_qo} is not supported: at most "
            f"{MAX_HEADS} heads and q length {MAX_SEQLEN_QO} ({MAX_TILE_ROWS} rows a tile)")
    if num_clusters < 1:
        raise ValueError(f"{n('num_clusters')} must be >= 1, got {num_clusters}")
    # the device op passes these as int32 launch fields: the largest power of two there is 2**30
    if num_clusters > INT32_MAX:
        raise ValueError(f"{n('num_clusters')} must be <= {INT32_MAX} (int32), got {num_clusters}")
    _check_power_of_two(n("page_size"), page_size)
    _check_power_of_two(n("kv_granularity"), kv_granularity, " (pages)")
    if max_split_per_batch == 0:
        raise ValueError(f"{n('max_split_per_batch')} must be < 0 (no cap) or >= 1, got 0")


def _check_max_seqlen_qo(name: str, value) -> None:
    """TypeError / ValueError unless ``value`` is an int >= 1 (check_scalars' and
    validate_inputs' check of ``max_seqlen_qo``)."""
    check_int(name, value)
    if value < 1:
        raise ValueError(f"{name} must be >= 1 (the largest q length of any batch), got {value}")


def _check_power_of_two(name: str, value, unit: str = "") -> None:
    """TypeError / ValueError unless ``value`` is an int power of two in [1, 2**30] (the
    largest that fits an int32 launch field): ``page_size``, ``kv_granularity``."""
    check_int(name, value)
    if not _is_pow2(value) or value > 2 ** 30:
        raise ValueError(f"{name} must be a power of two in [1, 2**30]{unit}, got {value}")


def _as_list(x, name: str) -> list[int]:
    """``x`` (a 1-D integer tensor or array, or a sequence of ints) as a list of ints; a float
    or bool would otherwise be truncated to a plausible index (TypeError naming ``name``).
    ValueError for a tensor or array that is not 1-D; TypeError for anything else that is not
    a sequence of ints (None, an int, a set, a generator or other one-pass iterable, a string,
    bytes or a bytearray)."""
    if hasattr(x, "tolist"):
        ndim = getattr(x, "ndim", None)   # torch and NumPy alike (NumPy has no .dim())
        if ndim is not None and ndim != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(x.shape)}")
        dtype = getattr(x, "dtype", None)
        if dtype is not None and not _is_int_dtype(dtype):
            raise TypeError(f"{name} must be an integer tensor or array, got dtype {dtype}")
        return x.detach().cpu().tolist() if hasattr(x, "detach") else x.tolist()
    if not isinstance(x, collections.abc.Sequence) or isinstance(x, (str, bytes, bytearray)):
        raise TypeError(f"{name} must be a 1-D integer tensor or array or a sequence of ints, "
                        f"got {type(x).__name__}")
    out = list(x)
    for i, v in enumerate(out):
        check_int(f"{name}[{i}]", v)
    return [int(v) for v in out]


def _is_int_dtype(dtype) -> bool:
    """A torch or NumPy integer dtype (not bool)."""
    if hasattr(dtype, "is_floating_point"):   # torch.dtype
        return not (dtype.is_floating_point or dtype.is_complex or str(dtype) == "torch.bool")
    return getattr(dtype, "kind", "") in ("i", "u")


def validate_inputs(qo_indptr, kv_indptr, kv_last_page_lens, *, page_size: int,
                    max_seqlen_qo: int, names: tuple[str, str] = ("qo_indptr", "kv_indptr"),
                    ) -> tuple[list[int], list[int], list[int]]:
    """Check the per-batch inputs' *values* (needs them on the host) and return them as lists.

    Raises ValueError naming the argument, the expected and the actual value for:
    ``len(qo_indptr) != len(kv_indptr)``; fewer than ``B`` last-page lengths; a negative first
    entry (a start past 0 is planned, as AITER: the work records hold absolute offsets; the
    decode op needs 0); a decreasing ``kv_indptr``; a q length
    outside ``[1, max_seqlen_qo]``; a ``kv_last_page_lens[b]`` outside ``[1, page_size]`` for a
    non-empty batch (1 at page size 1, as the decode kernel checks); a value that does not fit
    int32; a batch with ``>= 2**31`` KV tokens.
    Raises TypeError naming the argument for a non-integer tensor or array, a list entry that
    is not an int (a float or a bool would be read as a truncated index), or an index input that
    is none of these (None, an int, a set, a generator, a string); ValueError for a tensor or
    array that is not 1-D. ``page_size`` and ``max_seqlen_qo`` are checked first, as
    :func:`check_scalars` checks their type and range (an int power of two in [1, 2**30]; an
    int >= 1; the limit of 16 on ``max_seqlen_qo`` is check_scalars' alone, since it names the
    head count).
    ``names``: the caller's names for the two indptrs in the messages (``get_mla_metadata_v1``
    calls them ``seqlens_qo_indptr`` / ``seqlens_kv_indptr``).
    """
    _check_power_of_two("page_size", page_size)   # as check_scalars, before they are compared
    _check_max_seqlen_qo("max_seqlen_qo", max_seqlen_qo)
    qn, kn = names
    qo = _as_list(qo_indptr, qn)
    kv = _as_list(kv_indptr, kn)
    lpl = _as_list(kv_last_page_lens, "kv_last_page_lens")
    if len(kv) < 1:
        raise ValueError(f"{kn} must have num_batches + 1 >= 1 entries, got 0")
    nb = len(kv) - 1
    if len(qo) != len(kv):
        raise ValueError(
            f"{qn} must have len({kn}) = {len(kv)} entries, got {len(qo)}")
    if len(lpl) < nb:
        raise ValueError(f"kv_last_page_lens must have >= {nb} entries, got {len(lpl)}")
    for name, arr in ((kn, kv), (qn, qo)):
        if arr[0] < 0:
            raise ValueError(f"{name}[0] must be >= 0, got {arr[0]}")
        if max(arr) > INT32_MAX:
            raise ValueError(f"{name} values must fit int32 (<= {INT32_MAX}), got {max(arr)}")
    for b in range(nb):
        kvlen = kv[b + 1] - kv[b]
        if kvlen < 0:
            raise ValueError(
                f"{kn} must be non-decreasing: {kn}[{b + 1}] = {kv[b + 1]} < "
                f"{kn}[{b}] = {kv[b]}")
        qlen = qo[b + 1] - qo[b]
        if not 1 <= qlen <= max_seqlen_qo:
            raise ValueError(
                f"q length of batch {b} ({qn}[{b + 1}] - {qn}[{b}]) must be in "
                f"[1, max_seqlen_qo={max_seqlen_qo}], got {qlen}")
        if kvlen > 0:
            if not 1 <= lpl[b] <= page_size:
                raise ValueError(
                    f"kv_last_page_lens[{b}] must be in [1, page_size={page_size}] for a "
                    f"non-empty batch, got {lpl[b]}")
            tokens = (kvlen - 1) * page_size + lpl[b]
            if tokens > INT32_MAX:
                raise ValueError(
                    f"batch {b} has {tokens} KV tokens ({kn}[{b + 1}] - {kn}[{b}] = {kvlen} pages "
                    f"of {page_size}); kv_offset is int32, so a batch must have < 2**31 tokens")
    return qo, kv, lpl


@dataclass
class Schedule:
    """A work schedule as plain Python values (the used prefixes of the six AITER buffers).

    ``work_info[w]`` is an 8-tuple in :data:`aiter_mla.work_info.WORK_INFO_FIELDS` order.
    ``cluster_cost[c]`` is cluster c's load in cost blocks (KV blocks + OVH per piece).
    ``delta`` = the spacing of the cut lattice (:func:`cost_line`: ``ceil(total cost /
    num_splits)``, or aligned to uniform batches); ``span`` = every batch's length on the line
    when uniform batches are spread over ``span // delta`` clusters each, else 0;
    ``payload`` = ``delta + overhead``, the most any cluster costs when the tail rule
    merges nothing (``metadata.py`` has the proof).
    """
    work_indptr: list[int]
    work_info: list[tuple[int, ...]]
    reduce_indptr: list[int]
    reduce_final_map: list[tuple[int, int]]
    reduce_partial_map: list[int]
    num_heads: int
    num_clusters: int
    num_splits: int
    page_size: int
    kv_granularity: int
    max_seqlen_qo: int
    batch_size: int
    overhead: int
    payload: int
    cluster_cost: list[int] = field(default_factory=list)
    delta: int = 0
    span: int = 0

    @property
    def num_works(self) -> int:
        return len(self.work_info)


def cost_line(costs: list[int], num_splits: int) -> tuple[int, int]:
    """The cost line of a schedule whose batches cost ``costs`` (cost blocks, KV blocks + OVH
    each) over ``num_splits`` clusters: ``(delta, span)``, the slice width and, when uniform
    batches are spread over ``span // delta`` clusters each, every batch's length on the line
    (else 0: batch b takes its cost ``c_b``; the metadata kernel's ``md_slice`` does the same).

    ``delta = d = ceil(S / num_splits)``, except for uniform costs ``c`` (this package's rule,
    module docstring) when the extra ``e`` over ``d`` is at most :data:`WHOLE_BATCH_SLACK`
    blocks and at most ``d / 8``:

    * more than half as many batches as clusters (``num_splits // B < 2``): ``delta = k c``
      with ``k = ceil(d / c)``, whole batches per cluster (``span = 0``);
    * ``k = num_splits // B >= 2`` clusters a batch: ``delta = ceil(c / k)`` and every batch
      spans ``k delta`` (its blocks, then up to ``k - 1`` blocks of padding, on no cluster), so
      each batch is cut into at most k pieces on k clusters of its own, one work a cluster,
      where the plain lattice leaves one short piece a batch (a whole work's set-up and
      epilogue for a few blocks).

    ``(0, 0)`` without batches.
    """
    if not costs:
        return 0, 0
    nb = len(costs)
    delta = -(-sum(costs) // num_splits)
    c = costs[0]
    if c > 0 and all(x == c for x in costs):
        k = num_splits // nb
        if k >= 2:
            width, span = -(-c // k), k * -(-c // k)
        else:
            width, span = -(-delta // c) * c, 0
        extra = width - delta
        if extra <= WHOLE_BATCH_SLACK and 8 * extra <= delta:
            return width, span
    return delta, 0


def slice_width(costs: list[int], num_splits: int) -> int:
    """The slice ``delta`` of :func:`cost_line` (0 without batches)."""
    return cost_line(costs, num_splits)[0]


def reference_schedule(qo_indptr, kv_indptr, kv_last_page_lens, *, num_heads: int,
                       num_clusters: int, page_size: int, kv_granularity: int,
                       max_seqlen_qo: int, max_split_per_batch: int = -1,
                       names: tuple[str, str] = ("qo_indptr", "kv_indptr")) -> Schedule:
    """The position-based split-KV schedule (module docstring), with this package's fixes.

    Args: ``qo_indptr`` [B+1] (q tokens), ``kv_indptr`` [B+1] (pages),
    ``kv_last_page_lens`` [>=B] (tokens in each batch's last page), as Python lists or tensors
    on any device (read on the host). ``num_heads`` = q heads per KV head;
    ``kv_granularity`` in pages; ``max_seqlen_qo`` >= every q length (it is also the tail
    threshold in tokens).

    Returns a :class:`Schedule`. Raises TypeError / ValueError / NotImplementedError as
    :func:`check_scalars` and :func:`validate_inputs` (``names`` as there).
    """
    check_scalars(num_heads=num_heads, num_clusters=num_clusters, page_size=page_size,
                  kv_granularity=kv_granularity, max_seqlen_qo=max_seqlen_qo,
                  max_split_per_batch=max_split_per_batch)
    qo, kv, lpl = validate_inputs(qo_indptr, kv_indptr, kv_last_page_lens,
                                  page_size=page_size, max_seqlen_qo=max_seqlen_qo, names=names)
    nb = len(kv) - 1
    G = kv_granularity
    ovh = overhead_blocks(page_size)
    blocks = [-(-(kv[b + 1] - kv[b]) // G) for b in range(nb)]
    nsplits = num_splits_for(num_clusters, max_split_per_batch, nb)
    delta, span = cost_line([x + ovh for x in blocks], nsplits)

    def tokens_after(b: int, page: int) -> int:
        """Real KV tokens of batch b at or after page index ``page`` (0 at the tail)."""
        end = kv[b + 1]
        if page >= end:
            return 0
        if page_size == 1:
            return end - page
        return (end - page - 1) * page_size + lpl[b]

    def cluster_at(pos: int) -> int:
        return min(nsplits - 1, pos // delta)

    # Pieces in (batch, kv) order: (batch, first block, end block, cluster).
    pieces: list[tuple[int, int, int, int]] = []
    pos = 0                  # where batch b starts on the cost line
    for b in range(nb):
        first = pos + ovh    # line position of the batch's first KV block
        cuts = []            # block offsets where the batch is cut
        m = first // delta + 1
        while m * delta < first + blocks[b]:
            beta = m * delta - first
            # tail rule: a cut leaving fewer than max_seqlen_qo tokens is dropped (the piece
            # before it runs on to the next kept cut or the batch end)
            if tokens_after(b, kv[b] + beta * G) >= max_seqlen_qo:
                cuts.append(beta)
            m += 1
        bounds = [0] + cuts + [blocks[b]]
        for j in range(len(bounds) - 1):
            pieces.append((b, bounds[j], bounds[j + 1], cluster_at(first + bounds[j])))
        pos += span or blocks[b] + ovh

    work_indptr = [0] * (num_clusters + 1)
    work_info: list[tuple[int, ...]] = []
    reduce_indptr = [0]
    reduce_final_map: list[tuple[int, int]] = []
    reduce_partial_map: list[int] = []
    cluster_cost = [0] * num_clusters
    next_partial_row = 0     # first free q-token row of the partial buffers

    by_batch: list[list[tuple[int, int, int, int]]] = [[] for _ in range(nb)]
    for p in pieces:
        by_batch[p[0]].append(p)
    for b in range(nb):
        split = len(by_batch[b]) > 1
        qlen = qo[b + 1] - qo[b]
        for _, lo, hi, cluster in by_batch[b]:
            kv_start = kv[b] + lo * G
            kv_end = min(kv[b] + hi * G, kv[b + 1])
            partial = -1
            if split:
                partial = next_partial_row
                next_partial_row += qlen
                reduce_partial_map.append(partial)
            rec = [0] * WORK_INFO_INTS   # the padding field stays 0
            rec[WI["batch_idx"]] = b
            rec[WI["partial_qo_loc"]] = partial
            rec[WI["qo_start"]] = qo[b]
            rec[WI["qo_end"]] = qo[b + 1]
            rec[WI["kv_start"]] = kv_start
            rec[WI["kv_end"]] = kv_end
            rec[WI["kv_offset"]] = tokens_after(b, kv_end)
            work_info.append(tuple(rec))
            work_indptr[cluster + 1] += 1
            cluster_cost[cluster] += hi - lo + ovh
        reduce_indptr.append(len(reduce_partial_map))
        reduce_final_map.append((qo[b], qo[b + 1]))
    for c in range(num_clusters):
        work_indptr[c + 1] += work_indptr[c]

    return Schedule(
        work_indptr=work_indptr, work_info=work_info, reduce_indptr=reduce_indptr,
        reduce_final_map=reduce_final_map, reduce_partial_map=reduce_partial_map,
        num_heads=num_heads, num_clusters=num_clusters, num_splits=nsplits,
        page_size=page_size, kv_granularity=G, max_seqlen_qo=max_seqlen_qo, batch_size=nb,
        overhead=ovh, payload=delta + ovh, cluster_cost=cluster_cost, delta=delta, span=span)


def to_buffers(schedule: Schedule, buffers) -> tuple:
    """Write ``schedule`` into the six buffers of ``get_mla_metadata_info_v1`` (any device),
    exactly as the device kernel does. (No plan record: that is the op's,
    ``get_mla_metadata_v1``, which calls this on the CPU; this module imports nothing of the
    op it checks.)

    ``buffers`` = (work_metadata_ptrs, work_indptr, work_info_set, reduce_indptr,
    reduce_final_map, reduce_partial_map), AITER's info order. Written: all of
    ``work_indptr`` and ``reduce_indptr`` (entries past the used ones repeat the last value),
    the used rows of ``work_info_set``, ``reduce_final_map[:B]``,
    ``reduce_partial_map[:entries]``, and ``work_metadata_ptrs[:2] = (&work_indptr,
    &work_info_set)``. Other entries (also those of a longer ``work_metadata_ptrs``) are left
    untouched. Raises ValueError when a buffer is too small. Returns ``buffers``.
    """
    import torch

    (work_metadata_ptrs, work_indptr, work_info_set, reduce_indptr, reduce_final_map,
     reduce_partial_map) = buffers
    s = schedule
    need = {
        "work_metadata_ptrs": (work_metadata_ptrs.numel(), 2),
        "work_indptr": (work_indptr.numel(), s.num_clusters + 1),
        "work_info_set": (work_info_set.shape[0], len(s.work_info)),
        "reduce_indptr": (reduce_indptr.numel(), s.batch_size + 1),
        "reduce_final_map": (reduce_final_map.shape[0], s.batch_size),
        "reduce_partial_map": (reduce_partial_map.numel(), len(s.reduce_partial_map)),
    }
    for name, (have, want) in need.items():
        if have < want:
            raise ValueError(f"{name} holds {have} {'entry' if have == 1 else 'entries'}, the schedule needs {want}")

    def put(dst, values, n):
        if n:
            src = torch.tensor(values, dtype=torch.int32).reshape(dst[:n].shape)
            dst[:n].copy_(src)

    wi = s.work_indptr + [s.work_indptr[-1]] * (work_indptr.numel() - len(s.work_indptr))
    put(work_indptr.view(-1), wi, len(wi))
    put(work_info_set, [list(r) for r in s.work_info], len(s.work_info))
    ri = s.reduce_indptr + [s.reduce_indptr[-1]] * (reduce_indptr.numel() - len(s.reduce_indptr))
    put(reduce_indptr.view(-1), ri, len(ri))
    put(reduce_final_map, [list(t) for t in s.reduce_final_map], s.batch_size)
    put(reduce_partial_map.view(-1), s.reduce_partial_map, len(s.reduce_partial_map))
    ptrs = torch.tensor([work_indptr.data_ptr(), work_info_set.data_ptr()], dtype=torch.int64)
    work_metadata_ptrs.view(-1)[:2].view(torch.int64).copy_(ptrs)   # [0] and [1], as the kernel
    return buffers

