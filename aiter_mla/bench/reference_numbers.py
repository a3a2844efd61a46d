"""Reference numbers measured elsewhere, shown beside ours as a labelled column.

The seed's MI355 table (AITER PR #3072, ``op_tests/test_mla_persistent.py -n 128,1 -d fp8 -kvd fp8
-blk 64`` with ``AITER_ENABLE_EXPERIMENTAL=1``): per (batch, ctx), the ASM kernel, the HK kernel
before the PR and the HK kernel after it, in µs, as the PR published it (docs/DESIGN.md §6.4).
It was not measured in the run that shows it: the report labels it so. FlashMLA is timed only in
the run, as a peer (``peers.py``): no constant of it is kept.
"""
from __future__ import annotations

import csv
import functools
import io

SEED_MI355_LABEL = "seed MI355 HK fp8"

# batch,ctx -> µs; heads 128, qlen 1, fp8 q and kv, page 64, uniform ctx.
_SEED_MI355_CSV = """\
batch,ctx,asm_us,hk_prev_us,hk_curr_us
1,23333,52.467,51.719,43.392
3,23333,54.562,54.211,46.625
5,23333,57.608,56.914,49.158
16,23333,109.965,117.610,102.786
32,23333,199.795,210.031,184.629
64,23333,403.895,395.417,350.695
128,23333,724.364,801.548,676.442
256,23333,1422.000,1583.000,1315.000
1,8192,29.806,28.896,26.926
3,8192,29.831,28.261,27.267
5,8192,31.611,29.942,28.787
16,8192,52.138,53.821,47.721
32,8192,84.845,85.508,78.311
64,8192,151.649,154.495,132.878
128,8192,267.067,280.267,246.490
256,8192,511.068,564.501,475.339
1,5200,24.606,23.708,21.910
3,5200,24.769,23.339,22.043
5,5200,26.539,24.292,22.827
16,5200,39.407,38.349,36.453
32,5200,60.707,63.077,57.899
64,5200,105.001,109.455,95.035
128,5200,182.689,191.257,171.394
256,5200,329.671,362.874,309.395
1,3200,21.044,18.331,18.795
3,3200,21.343,19.749,19.303
5,3200,22.691,20.548,20.089
16,3200,31.828,29.349,29.159
32,3200,47.726,46.249,41.648
64,3200,71.196,74.426,67.318
128,3200,122.538,126.889,109.809
256,3200,212.023,222.358,192.551
1,1200,17.863,16.587,14.627
3,1200,17.625,16.581,16.488
5,1200,18.598,16.796,16.351
16,1200,23.009,20.522,21.133
32,1200,28.852,25.879,24.562
64,1200,41.541,39.213,36.618
128,1200,60.574,63.209,56.015
256,1200,96.050,99.546,83.871
1,512,14.367,12.006,13.337
3,512,17.986,15.767,16.958
5,512,16.198,13.945,15.274
16,512,20.629,17.537,16.990
32,512,21.617,18.975,20.076
64,512,26.853,24.600,23.178
128,512,40.547,38.277,34.633
256,512,48.409,50.075,44.635
1,256,14.733,12.281,13.335
3,256,17.175,16.085,16.893
5,256,16.280,15.288,14.866
16,256,16.910,15.894,16.067
32,256,19.423,17.752,16.931
64,256,22.448,21.642,19.600
128,256,29.061,28.159,25.505
256,256,33.938,33.707,30.012
1,64,12.518,11.960,13.218
3,64,13.032,12.640,14.278
5,64,13.718,13.205,15.193
16,64,16.577,15.058,16.565
32,64,18.203,16.610,15.915
64,64,17.369,16.358,15.807
128,64,19.554,17.321,16.939
256,64,23.023,21.414,21.534
1,21,12.549,10.615,11.832
3,21,12.763,11.671,12.883
5,21,13.854,11.664,13.082
16,21,14.757,13.085,14.525
32,21,15.259,13.657,15.029
64,21,16.051,15.173,16.011
128,21,16.820,15.851,16.801
256,21,21.631,19.016,20.141
"""

@functools.lru_cache(maxsize=None)
def seed_mi355_table() -> dict[tuple[int, int], dict[str, float]]:
    """The seed's MI355 numbers: ``(batch, ctx) -> {"asm_us", "hk_prev_us", "hk_curr_us"}``."""
    table = {}
    for rec in csv.DictReader(io.StringIO(_SEED_MI355_CSV)):
        table[(int(rec["batch"]), int(rec["ctx"]))] = {
            k: float(rec[k]) for k in ("asm_us", "hk_prev_us", "hk_curr_us")
        }
    return table


def reference_columns(
    heads: int, qlen: int, batch: int, ctx: int, page_size: int, q_dtype: str, kv_dtype: str,
    varlen: bool,
) -> dict[str, float]:
    """Reference µs for one row, only where the shape matches what was measured elsewhere.

    Returns a dict with any of ``seed_mi355_us`` (HK after #3072), ``seed_mi355_asm_us``,
    ``seed_mi355_hk_prev_us`` (heads 128, qlen 1, fp8/fp8, page 64, uniform ctx). Empty when
    nothing matches.
    """
    out: dict[str, float] = {}
    if varlen or page_size != 64:
        return out
    if (heads, qlen) == (128, 1) and q_dtype == "fp8" and kv_dtype == "fp8":
        seed = seed_mi355_table().get((batch, ctx))
        if seed is not None:
            out["seed_mi355_us"] = seed["hk_curr_us"]
            out["seed_mi355_asm_us"] = seed["asm_us"]
            out["seed_mi355_hk_prev_us"] = seed["hk_prev_us"]
    return out
