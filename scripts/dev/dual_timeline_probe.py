"""Where wgmma_dual's fixed ~31 us per call goes (issue 6, docs/perf/notes.md "What bounds
wgmma_dual"): per warpgroup %globaltimer stamps in an instrumented copy of templates/.

usage: python3 scripts/dev/dual_timeline_probe.py build OUT_TEMPLATES
       AITER_MLA_TEMPLATES_DIR=OUT_TEMPLATES python3 scripts/dev/dual_timeline_probe.py run OUTDIR
Stamps per (CTA, consumer warpgroup): kernel entry after the PDL wait, first KV stage ready,
last work written, exit; with tiles and works counted. `run` prints, per case, the spread of
entries, the fill (entry -> first stage), the steady rate (tiles per us), the drain (last
tile -> exit) and the list imbalance (exit spread), next to the event-timed decode alone.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

TL_DECL = ('#include "common/aiter_mla_common.cuh"\n__device__ unsigned long long g_tl[1024][2][6];\n'
           '__device__ __forceinline__ unsigned long long tl_now() { unsigned long long t; '
           'asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }\n')
TL_EXPORT = '''
AITER_MLA_EXPORT int aiter_mla_timeline(unsigned long long* out, int reset) {
  cudaError_t e = cudaMemcpyFromSymbol(out, g_tl, sizeof(unsigned long long) * 1024 * 2 * 6);
  if (e == cudaSuccess && reset) {
    static unsigned long long z[1024 * 2 * 6] = {};
    e = cudaMemcpyToSymbol(g_tl, z, sizeof(z));
  }
  return e;
}
'''


def build(dst):
    from probe_common import patch_decode_template
    edits = [
        ('#include "common/aiter_mla_common.cuh"\n', TL_DECL),
        ("  aiter_mla_launch_dependents();\n", "  aiter_mla_launch_dependents();\n  const unsigned long long tl_start = tl_now();\n"),
        ("  uint32_t seq = 0;   // consumer tile counter, over all works of this CTA\n",
         "  uint32_t seq = 0;   // consumer tile counter, over all works of this CTA\n"
         "  unsigned long long tl_first = 0, tl_last = 0, tl_tiles = 0, tl_works = 0;\n"),
        ("          mla::wg::mbar_wait(bar_full + stage * 8, (seq / kS) & 1);\n          float s[4][4];\n",
         "          mla::wg::mbar_wait(bar_full + stage * 8, (seq / kS) & 1);\n"
         "          if (tl_first == 0) tl_first = tl_now();\n          ++tl_tiles;\n          float s[4][4];\n"),
        ("                                   p.split_out, p.split_lse, group, lane);\n      }\n",
         "                                   p.split_out, p.split_lse, group, lane);\n"
         "        ++tl_works;\n        tl_last = tl_now();\n      }\n"),
        ("                             p.split_lse, group, half, lane);\n{%- endif %}\n    }\n  }\n}\n",
         "                             p.split_lse, group, half, lane);\n{%- endif %}\n    }\n  }\n"
         "  if (threadIdx.x < 256 && (threadIdx.x & 127) == 0 && blockIdx.x < 1024) {\n"
         "    unsigned long long* r = g_tl[blockIdx.x][threadIdx.x >> 7];\n"
         "    r[0] = tl_start; r[1] = tl_first; r[2] = tl_last; r[3] = tl_now(); r[4] = tl_tiles; r[5] = tl_works;\n"
         "  }\n}\n"),
    ]
    patch_decode_template(dst, edits, TL_EXPORT)


def run(outdir):
    import ctypes
    import statistics

    import torch
    sys.path.insert(0, os.getcwd())
    import aiter_mla  # noqa: F401
    import op_tests.test_mla_persistent as T
    from aiter_mla.jit import get_module
    from aiter_mla.ops import decode as dec
    from graph_timing import graph_us

    fp8 = torch.float8_e4m3fn
    rows = []
    for h, q, b, ctx in [(16, 1, 64, 3200), (16, 1, 64, 8192), (16, 1, 128, 3200), (16, 1, 128, 8192)]:
        c = T.make_case(h, q, 64, fp8, [ctx] * b, seed=1, spare_pages=0)
        bufs = T.plan(c)
        o = torch.empty((c.q.shape[0], h, 512), dtype=torch.bfloat16, device="cuda")
        T.decode_with(c, bufs, o, lse_out=False)
        torch.cuda.synchronize()
        mod = get_module("mla_decode", **dec.decode_variant(h, q, 64, fp8, fp8))
        fn = mod.function("aiter_mla_timeline", [ctypes.c_void_p, ctypes.c_int], ctypes.c_int)
        buf = (ctypes.c_ulonglong * (1024 * 2 * 6))()
        assert fn(buf, 1) == 0
        T.decode_with(c, bufs, o, lse_out=False)
        torch.cuda.synchronize()
        assert fn(buf, 0) == 0
        recs = [buf[i * 6:(i + 1) * 6] for i in range(1024 * 2)]
        recs = [r for r in recs if r[0]]
        t0 = min(r[0] for r in recs)
        us = lambda x: x / 1000.0  # noqa: E731
        busy = [r for r in recs if r[4]]
        entry = [us(r[0] - t0) for r in recs]
        fill = [us(r[1] - r[0]) for r in busy]
        drain = [us(r[3] - r[2]) for r in busy]
        exit_ = [us(r[3] - t0) for r in recs]
        rate = [r[4] / max(1e-9, us(r[2] - r[1])) for r in busy]
        decode_us = graph_us(lambda: T.decode_with(c, bufs, o, lse_out=False))
        med = statistics.median
        rows.append(f"fp8 ({h},{q}) b{b} c{ctx}: warpgroups {len(recs)} (busy {len(busy)}), decode+reduce {decode_us:.1f} us; "
                    f"entry spread {max(entry):.1f}; fill med {med(fill):.1f} max {max(fill):.1f}; "
                    f"tiles/us med {med(rate):.2f} min {min(rate):.2f} max {max(rate):.2f}; "
                    f"tiles/list med {med(r[4] for r in busy)} max {max(r[4] for r in busy)}; "
                    f"drain med {med(drain):.1f}; exit min {min(exit_):.1f} "
                    f"med {med(exit_):.1f} max {max(exit_):.1f}; works/list med {med(r[5] for r in busy)}")
        print(rows[-1], flush=True)
    os.makedirs(outdir, exist_ok=True)
    open(os.path.join(outdir, "dual_timeline.txt"), "w").write("\n".join(rows) + "\n")


if __name__ == "__main__":
    {"build": build, "run": run}[sys.argv[1]](sys.argv[2])
