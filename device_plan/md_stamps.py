"""Diagnostic (exp/md-stamps): run the metadata kernel built with -DAITER_MLA_MD_STAMPS eagerly,
20 calls per batch size (synchronised), so its printf lines give thread 0's clock64 phases."""
import torch, aiter_mla
from aiter_mla.ops.metadata import get_mla_metadata_info_v1, get_mla_metadata_v1, default_kv_granularity

i32 = dict(dtype=torch.int32, device="cuda")
for B, ctx in ((1, 21), (16, 3200), (64, 3200), (256, 3200), (1024, 3200)):
    P = 64
    n = -(-ctx // P)
    info = get_mla_metadata_info_v1(B, 1, 128, torch.float8_e4m3fn, torch.float8_e4m3fn)
    bufs = [torch.empty(s, dtype=d, device="cuda") for s, d in info]
    qo = torch.arange(B + 1, **i32)
    kv = torch.arange(B + 1, **i32) * n
    last = torch.full((B,), ctx - (n - 1) * P, **i32)
    for it in range(20):
        get_mla_metadata_v1(qo, kv, last, 128, 1, False, bufs[0], bufs[2], bufs[1], bufs[3], bufs[4],
                            bufs[5], page_size=P, kv_granularity=default_kv_granularity(P), max_seqlen_qo=1)
        torch.cuda.synchronize()
    print(f"== B={B} ctx={ctx} done", flush=True)
