"""The one place that knows the work record layout (AITER ``MlaWorkInfo``, 8 int32).

Python ops, the reference scheduler, the reference attention and the templates (through
:func:`template_constants`, rendered into every kernel) all read the field order from here.
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


def template_constants() -> dict[str, int]:
    """``WI_<FIELD>`` index constants handed to every template as Jinja globals."""
    consts = {f"WI_{name.upper()}": i for i, name in enumerate(WORK_INFO_FIELDS)}
    consts["WORK_INFO_INTS"] = WORK_INFO_INTS
    return consts
