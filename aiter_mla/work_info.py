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

#: Most cost blocks the scheduler adds to a slice to keep uniform batches whole
#: (``metadata_reference.slice_width``; the metadata kernel gets it as a Jinja global): 8
#: blocks (8 KV tiles at the decode op's granularity) cost about what the reduce of the split
#: batches does (~15-20 us at 128 rows on the H200, docs/perf/notes.md).
WHOLE_BATCH_SLACK = 8

#: The q / kv dtypes the decode kernels take: torch dtype name -> template value (q and kv
#: equal). ``ops/decode.py``'s ``SUPPORTED_DTYPES`` maps the torch dtypes themselves; the
#: scheduler checks its dtype arguments against the same two without importing the decode op.
KERNEL_DTYPES = {"float8_e4m3fn": "fp8", "bfloat16": "bf16"}


def template_constants() -> dict[str, int]:
    """``WI_<FIELD>`` index constants handed to every template as Jinja globals."""
    consts = {f"WI_{name.upper()}": i for i, name in enumerate(WORK_INFO_FIELDS)}
    consts["WORK_INFO_INTS"] = WORK_INFO_INTS
    return consts
