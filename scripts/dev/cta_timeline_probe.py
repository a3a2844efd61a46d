"""Where a decode call's time goes across CTAs, for any main loop (issue 6, docs/perf/notes.md
"The 128-row per-call fixed cost"): %globaltimer stamps per CTA in an instrumented copy of
templates/ (dual_timeline_probe.py does the same per warpgroup for wgmma_dual).

usage: python3 scripts/dev/cta_timeline_probe.py build OUT_TEMPLATES
       AITER_MLA_TEMPLATES_DIR=OUT_TEMPLATES python3 scripts/dev/cta_timeline_probe.py run OUTDIR
Stamps per CTA (thread 0, a consumer): entry after the PDL wait, exit. `run` prints per case the
decode + reduce, decode alone and reduce alone (CUDA graphs of 8 calls), the entry spread, the
CTAs' exit times (min / median / max from the first entry) and the slowest CTA's tiles per
microsecond against the median's (tiles from the schedule), so that a fixed cost splits into
launch, straggling lists and the reduce. CASES="fp8:128:1:64:3200,bf16:128:1:64:8192" overrides
the default cases.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
MAX_CTAS = 2048

DECL = ('#include "common/aiter_mla_common.cuh"\n'
        f'__device__ unsigned long long g_cta_tl[{MAX_CTAS}][2];\n'
        '__device__ __forceinline__ unsigned long long tl_now() { unsigned long long t; '
        'asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }\n')
EXPORT = f'''
AITER_MLA_EXPORT int aiter_mla_cta_timeline(unsigned long long* out, int reset) {{
  cudaError_t e = cudaMemcpyFromSymbol(out, g_cta_tl, sizeof(unsigned long long) * {MAX_CTAS} * 2);
  if (e == cudaSuccess && reset) {{
    static unsigned long long z[{MAX_CTAS} * 2] = {{}};
    e = cudaMemcpyToSymbol(g_cta_tl, z, sizeof(z));
  }}
  return e;
}}
'''
KERNEL_END = "    }\n  }\n}\n\n}  // namespace\n"


def build(dst):
    from probe_common import patch_decode_template
    edits = [
        ('#include "common/aiter_mla_common.cuh"\n', DECL),
        ("  aiter_mla_launch_dependents();\n", "  aiter_mla_launch_dependents();\n  const unsigned long long tl_start = tl_now();\n"),
        (KERNEL_END, "    }\n  }\n  const int tl_cta = blockIdx.x + gridDim.x * blockIdx.y;\n"
                     f"  if (threadIdx.x == 0 && tl_cta < {MAX_CTAS}) {{\n"
                     "    g_cta_tl[tl_cta][0] = tl_start; g_cta_tl[tl_cta][1] = tl_now();\n  }\n}\n\n}  // namespace\n"),
    ]
    patch_decode_template(dst, edits, EXPORT)


def run(outdir):
    import ctypes
    import statistics

    import torch
    sys.path.insert(0, os.getcwd())
    import op_tests.test_mla_persistent as T
    from graph_timing import split_times
    from probe_common import equal_length_case, timeline_cases

    rows = []
    for dt_name, h, q, b, ctx in timeline_cases("fp8:128:1:64:3200,fp8:128:1:64:8192,bf16:128:1:64:3200,"
                                                "bf16:128:1:64:8192,fp8:128:1:64:640,bf16:128:1:64:640"):
        c, bufs, mod = equal_length_case(dt_name, h, q, b, ctx)
        work_indptr, work_info_set = bufs[1], bufs[2]
        o = torch.empty((c.q.shape[0], h, 512), dtype=torch.bfloat16, device="cuda")
        full, dec_only, red_only = split_times(c, bufs, h, q)
        fn = mod.function("aiter_mla_cta_timeline", [ctypes.c_void_p, ctypes.c_int], ctypes.c_int)
        buf = (ctypes.c_ulonglong * (MAX_CTAS * 2))()
        assert fn(buf, 1) == 0
        T.decode_with(c, bufs, o, lse_out=False)
        torch.cuda.synchronize()
        assert fn(buf, 0) == 0
        recs = [(i, buf[2 * i], buf[2 * i + 1]) for i in range(MAX_CTAS) if buf[2 * i]]
        # tiles per list from the schedule (work_info: kv_start, kv_end in pages at columns 4, 5
        # of the AITER record; page 64 = one tile per page)
        wi = work_info_set.cpu().tolist()
        ind = work_indptr.cpu().tolist()
        tiles = [sum(max(0, wi[w][5] - wi[w][4]) for w in range(ind[k], ind[k + 1])) for k in range(len(ind) - 1)]
        # CTA i = blockIdx.x + gridDim.x * blockIdx.y; a 128-row work is blockIdx.y 0 / 1 of
        # column x, which runs lists x, x + grid_x, ... (not wgmma_dual: dual_timeline_probe.py)
        assert h * q > 32, "wgmma_dual shapes: use dual_timeline_probe.py"
        grid_x = (max(r[0] for r in recs) + 1) // (2 if h * q > 64 else 1)
        t0 = min(r[1] for r in recs)
        us = lambda x: x / 1000.0  # noqa: E731
        exit_ = sorted(us(r[2] - t0) for r in recs)
        entry = [us(r[1] - t0) for r in recs]
        ncl = len(ind) - 1
        rate = []
        for i, s0, s1 in recs:
            nt = sum(tiles[k] for k in range(i % grid_x, ncl, grid_x))
            if nt:
                rate.append((nt / max(1e-9, us(s1 - s0)), nt, us(s1 - s0)))
        rate.sort()
        med = statistics.median
        rows.append(f"{dt_name} ({h},{q}) b{b} c{ctx}: CTAs {len(recs)}, lists {ncl}, works {ind[-1]}, "
                    f"decode+reduce {full:.1f} us, decode {dec_only:.1f}, reduce {red_only:.1f}; entry spread "
                    f"{max(entry):.1f}; exit min {exit_[0]:.1f} med {med(exit_):.1f} max {exit_[-1]:.1f}; "
                    f"tiles/us slowest {rate[0][0]:.3f} ({rate[0][1]} tiles in {rate[0][2]:.1f} us) "
                    f"median {med(r[0] for r in rate):.3f} fastest {rate[-1][0]:.3f}; tiles/list med "
                    f"{med(r[1] for r in rate)} max {max(r[1] for r in rate)}")
        print(rows[-1], flush=True)
        del c, bufs, o
        torch.cuda.empty_cache()
    os.makedirs(outdir, exist_ok=True)
    open(os.path.join(outdir, "cta_timeline.txt"), "w").write("\n".join(rows) + "\n")


if __name__ == "__main__":
    {"build": build, "run": run}[sys.argv[1]](sys.argv[2])
