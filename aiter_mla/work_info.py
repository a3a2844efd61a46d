"""The one place that knows the work record layout (AITER ``MlaWorkInfo``, 8 int32), and the
other constants the Python side and the kernels share: the scheduler's
:data:`WHOLE_BATCH_SLACK` and the kernels' dtypes (:data:`KERNEL_DTYPES`).

Python ops, the reference scheduler, the reference attention and the templates (through
:func:`template_constants` and ``jit/render.py``'s ``template_globals``, rendered into every
kernel) all read them from here. No imports: every layer may use this module.
"""
from __future__ import annotations

#: Field order of one work record in ``work_info_set[:, 8]`` (AITER csrc/include/mla.h).
WORK_INFO_FIELDS = (
    "batch_idx",       # batch index
    "partial_qo_loc",  # -1: write final output; else first q-token row in the partial buffers
    "qo_start",        # global q token, inclusive
    "qo_end",          # global q token, exclusive
    "kv_start",        # global page index (kv_indptr units), inclusive
    "kv_end",          # global page index, exclusive
    "kv_offset",       # real KV tokens of this batch after kv_end (0: the work ends at the tail)
    "padding",         # always 0
)
WORK_INFO_INTS = len(WORK_INFO_FIELDS)
WI = {name: i for i, name in enumerate(WORK_INFO_FIELDS)}

#: ``reduce_final_map[t] = (q_start, q_end)`` (AITER ``MlaPartialTileInfo``).
REDUCE_FINAL_MAP_INTS = 2

#: Most cost blocks the scheduler adds to a slice to align it to uniform batches (whole
#: batches, or k equal shares of one: ``metadata_reference.cost_line``; the metadata kernel
#: gets it as a Jinja global): 16 blocks (16 KV tiles at the decode op's granularity). A piece
#: costs a whole work's fixed part and the merge, well over the cost model's one block: whole
#: batches 9-11 blocks over the plain slice ran 0.89-0.97 of the split plan's time at (128,1),
#: and 23 blocks over lost (1.105 at bf16 b120 ctx 8192; docs/perf/k_pieces_h100.md).
WHOLE_BATCH_SLACK = 16

#: Most pieces a split tile may have for ``mla_decode_fwd`` to merge it inside the decode
#: kernel (templates/common/mla_decode_split_merge.cuh; one launch). One SM reads all of a
#: merged tile's pieces: at 4 pieces of 64 rows that added 9 µs to a 27 µs call on the H200
#: (b16 ctx1200), more than the reduce kernel costs, which spreads those reads over the GPU
#: (docs/perf/split_merge_h200.md). A schedule with a tile of more pieces gets the reduce
#: kernel; the metadata kernel counts such tiles for the op (``split_heavy_tiles``).
FUSED_MERGE_MAX_PIECES = 2

#: The q / kv dtypes the decode kernels take: torch dtype name -> template value (q and kv
#: equal). ``ops/decode.py``'s ``SUPPORTED_DTYPES`` maps the torch dtypes themselves; the
#: scheduler checks its dtype arguments against the same two without importing the decode op.
KERNEL_DTYPES = {"float8_e4m3fn": "fp8", "bfloat16": "bf16"}


def kernel_dtype_name(dtype) -> str | None:
    """``"fp8"`` / ``"bf16"`` for a torch dtype the decode kernels take (or its name), else None."""
    return KERNEL_DTYPES.get(str(dtype).removeprefix("torch."))


#: What the decode kernel checks on the device and reports in the error record
#: (``ops/errors.py`` turns a record into a ValueError; templates/common/aiter_mla_errors.cuh
#: writes it; the decode kernel checks all but "slot_mapping", which the cache-append kernel
#: checks). Code = position + 1 (0: no error); each is an ``ERR_<NAME>`` Jinja global.
DEVICE_ERRORS = (
    "kv_index",            # kv_indices[index] = value outside [0, bound = num_pages)
    "qo_indptr_start",     # qo_indptr[0] = value != 0
    "qo_indptr_end",       # qo_indptr[-1] = value != bound = query rows
    "qo_indptr_order",     # qo_indptr[index + 1] = value < qo_indptr[index] = bound
    "q_too_long",          # batch index has value q tokens > bound = max_seqlen_q
    "kv_indptr_start",     # kv_indptr[0] = value != 0
    "kv_indptr_order",     # kv_indptr[index + 1] = value < kv_indptr[index] = bound
    "kv_indptr_end",       # kv_indptr[-1] = value > bound = len(kv_indices)
    "last_page_len",       # kv_last_page_lens[index] = value outside [1, bound = page_size]
    "slot_mapping",        # slot_mapping[index] = value >= bound = cache rows (concat_and_cache_mla)
    "work_indptr_range",   # work_indptr[index] = value outside [0, bound = works]
    "work_lists_unrun",    # work_indptr[index = lists] = value != bound = work_indptr[-1]
    "work_batch",          # work_info_set[index].batch_idx = value outside [0, bound = batches)
    "work_qo",             # work_info_set[index] q rows end at value > bound = query rows
    "work_kv",             # work_info_set[index] kv pages end at value > bound = len(kv_indices)
    "work_split",          # work_info_set[index] split rows end at value > bound = split rows
)
#: The error record: two slots (0: the inputs' values, codes before "work_indptr_range"; 1: the
#: schedule's records) of four int64 words each: code, index, value, bound.
ERROR_SLOTS = 2
ERROR_SLOT_WORDS = 4
#: What a launch entry point returns besides a cudaError_t. LAUNCH_ERROR_PENDING: the error
#: record holds an error an earlier kernel found, so nothing was launched (the op raises it:
#: ops/errors.py). LAUNCH_REDUCE_FAILED + e: the decode entry launched its kernel, then its
#: chained reduce launch failed with cudaError_t e. Both lie above every cudaError_t / hipError_t.
LAUNCH_ERROR_PENDING = 1 << 16
LAUNCH_REDUCE_FAILED = 1 << 17


def template_constants() -> dict[str, int]:
    """``WI_<FIELD>`` index constants, ``ERR_<NAME>`` device error codes, the error record's
    shape, the ``LAUNCH_*`` return codes and ``FUSED_MERGE_MAX_PIECES``, handed to every
    template as Jinja globals."""
    consts = {f"WI_{name.upper()}": i for i, name in enumerate(WORK_INFO_FIELDS)}
    consts["WORK_INFO_INTS"] = WORK_INFO_INTS
    consts.update({f"ERR_{name.upper()}": i + 1 for i, name in enumerate(DEVICE_ERRORS)})
    consts["FUSED_MERGE_MAX_PIECES"] = FUSED_MERGE_MAX_PIECES
    consts.update(ERROR_SLOTS=ERROR_SLOTS, ERROR_SLOT_WORDS=ERROR_SLOT_WORDS,
                  LAUNCH_ERROR_PENDING=LAUNCH_ERROR_PENDING, LAUNCH_REDUCE_FAILED=LAUNCH_REDUCE_FAILED)
    return consts
