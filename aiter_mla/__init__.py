"""aiter_mla: JIT-compiled MLA decode attention (DeepSeek-V3/R1: 576-dim keys, 512-dim values,
one KV head, paged KV cache), re-creating AMD AITER's "HK MLA" decode subsystem.

Public ops (AITER's names and argument orders):
``get_mla_metadata_info_v1``, ``get_mla_metadata_v1``, ``mla_decode_fwd``,
``hk_mla_decode_fwd``, ``mla_reduce_v1``; the float64 reference is :mod:`aiter_mla.reference`.
"""
__version__ = "0.1.0"
