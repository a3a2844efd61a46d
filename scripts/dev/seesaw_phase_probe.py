"""Where the fixed part of a wgmma_seesaw call goes (issue 6, docs/perf/notes.md): six
%globaltimer stamps per CTA in an instrumented copy of templates/, read after the decode-alone
CUDA graph of scripts/dev/graph_timing.py (so the stamped call follows another decode, as in a
serving step).

usage: python3 scripts/dev/seesaw_phase_probe.py build OUT_TEMPLATES
       AITER_MLA_TEMPLATES_DIR=OUT_TEMPLATES python3 scripts/dev/seesaw_phase_probe.py run OUTDIR
Stamps (thread 0, consumer warp 0): entry (before the PDL wait), after the PDL wait, Q landed
(first work), after the first pair, after the last pair, exit; in the fill, the first work's
record read, Q issued, this thread's Q landed, the first pair's two KV stages full; the
producer's lane 0: its record read and its first TMA issue. `run` prints per case the
graph times (decode + reduce, decode alone, reduce alone) and the medians / maxima over CTAs
of each phase, with the steady pair time (last - first pair) / (pairs - 1).
CASES="fp8:128:1:64:3200,fp8:128:1:64:8192" (the default) picks the cases.
"""
import ctypes
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from probe_common import counters_export, equal_length_case, patch_decode_template, timeline_cases  # noqa: E402
MAX_CTAS = 512
N = 13

DECL = ('#include "common/aiter_mla_common.cuh"\n'
        f'__device__ unsigned long long g_ph[{MAX_CTAS}][{N}];\n'
        '__device__ __forceinline__ unsigned long long ph_now() { unsigned long long t; '
        'asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }\n')
EXPORT = counters_export("aiter_mla_phase_stamps", "g_ph", "unsigned long long", MAX_CTAS * N)
KERNEL_END = "    }\n  }\n}\n\n}  // namespace\n"
# g_ph[cta][0 .. 10], written by thread 0 at the kernel's end (11, 12: the producer's, below)
CONSUMER_STAMPS = ("ph0", "ph1", "ph2", "ph3", "ph4", "ph_now()", "pc1", "pc2", "pc3", "pc4", "pc5")


def build(dst):
    edits = [
        ('#include "common/aiter_mla_common.cuh"\n', DECL),
        ("  extern __shared__ __align__(128) uint8_t smem[];\n",
         "  extern __shared__ __align__(128) uint8_t smem[];\n  const unsigned long long ph0 = ph_now();\n"),
        ("  aiter_mla_launch_dependents();\n",
         "  aiter_mla_launch_dependents();\n  const unsigned long long ph1 = ph_now();\n"
         "  unsigned long long ph2 = 0, ph3 = 0, ph4 = 0, pc1 = 0, pc2 = 0, pc3 = 0, pc4 = 0, pc5 = 0;\n"),
        # consumer: the first work's record read (the stamp waits for num_tiles, so for the loads)
        ("      const int num_tiles = (w.kv_tok_end - w.kv_tok_start + Cfg::BN - 1) / Cfg::BN;\n{%- if dual %}",
         "      const int num_tiles = (w.kv_tok_end - w.kv_tok_start + Cfg::BN - 1) / Cfg::BN;\n"
         "      if (pc1 == 0 && num_tiles >= 0) pc1 = ph_now();\n{%- if dual %}"),
        # consumer: Q issued, this thread's Q landed, all of Q landed (ph2)
        ("        mla::wg::cp_async_wait<0>();\n"
         "        mla::wg::fence_proxy_async();   // own Q bytes -> async proxy, before the barrier\n"
         "        mla::wg::consumer_sync();       // Q landed for all threads\n        uint32_t fa",
         "        if (pc2 == 0) pc2 = ph_now();\n        mla::wg::cp_async_wait<0>();\n"
         "        if (pc3 == 0) pc3 = ph_now();\n"
         "        mla::wg::fence_proxy_async();   // own Q bytes -> async proxy, before the barrier\n"
         "        mla::wg::consumer_sync();       // Q landed for all threads\n        uint32_t fa"),
        ("        uint32_t fa[Cfg::kMBlocks][Cfg::BN / 32][4], fb[Cfg::kMBlocks][Cfg::BN / 32][4];",
         "        if (ph2 == 0) ph2 = ph_now();\n"
         "        if (pc4 == 0 && num_tiles >= 2) {   // the first pair's stages (waits the pair repeats)\n"
         "          mla::wg::mbar_wait(bar_full + (seq % kS) * 8, (seq / kS) & 1);\n          pc4 = ph_now();\n"
         "          mla::wg::mbar_wait(bar_full + ((seq + 1) % kS) * 8, ((seq + 1) / kS) & 1);\n          pc5 = ph_now();\n"
         "        }\n"
         "        uint32_t fa[Cfg::kMBlocks][Cfg::BN / 32][4], fb[Cfg::kMBlocks][Cfg::BN / 32][4];"),
        ("          seq += 2;\n", "          seq += 2;\n          ph4 = ph_now();\n          if (ph3 == 0) ph3 = ph4;\n"),
        # producer: its first record read, its first TMA issue
        ("    uint32_t pseq = 0;\n", "    uint32_t pseq = 0;\n    unsigned long long pp1 = 0, pp2 = 0;\n"),
        ("        const int num_tiles = (w.kv_tok_end - w.kv_tok_start + Cfg::BN - 1) / Cfg::BN;\n"
         "        for (int t = 0; t < num_tiles; ++t, ++pseq) {",
         "        const int num_tiles = (w.kv_tok_end - w.kv_tok_start + Cfg::BN - 1) / Cfg::BN;\n"
         "        if (pp1 == 0 && num_tiles >= 0) pp1 = ph_now();\n"
         "        for (int t = 0; t < num_tiles; ++t, ++pseq) {"),
        ("                                            {{ \"pseq == 0\" if q_first else \"false\" }});\n",
         "                                            {{ \"pseq == 0\" if q_first else \"false\" }});\n"
         "          if (pp2 == 0) pp2 = ph_now();\n"),
        ("    mla::wg::cp_async_wait<0>();   // no copy outlives its issuing thread\n",
         "    mla::wg::cp_async_wait<0>();   // no copy outlives its issuing thread\n"
         "    if (lane == 0 && blockIdx.x + gridDim.x * blockIdx.y < " + str(MAX_CTAS) + ") {\n"
         "      g_ph[blockIdx.x + gridDim.x * blockIdx.y][11] = pp1; g_ph[blockIdx.x + gridDim.x * blockIdx.y][12] = pp2;\n"
         "    }\n"),
        (KERNEL_END, "    }\n  }\n  const int ph_cta = blockIdx.x + gridDim.x * blockIdx.y;\n"
                     f"  if (threadIdx.x == 0 && ph_cta < {MAX_CTAS}) {{\n"
                     + "".join(f"    g_ph[ph_cta][{k}] = {v};\n" for k, v in enumerate(CONSUMER_STAMPS))
                     + "  }\n}\n\n}  // namespace\n"),
    ]
    patch_decode_template(dst, edits, EXPORT)


def run(outdir):
    sys.path.insert(0, os.getcwd())
    import torch
    from graph_timing import split_times

    rows = []
    for dt_name, h, q, b, ctx in timeline_cases("fp8:128:1:64:3200,fp8:128:1:64:8192"):
        c, bufs, mod = equal_length_case(dt_name, h, q, b, ctx)
        fn = mod.function("aiter_mla_phase_stamps", [ctypes.c_void_p, ctypes.c_int], ctypes.c_int)
        buf = (ctypes.c_ulonglong * (MAX_CTAS * N))()
        assert fn(buf, 1) == 0
        full, dec_only, red_only = split_times(c, bufs, h, q)   # the last decode run is dec_only's
        torch.cuda.synchronize()
        assert fn(buf, 0) == 0
        recs = [[buf[N * i + k] for k in range(N)] for i in range(MAX_CTAS) if buf[N * i]]
        recs = [r for r in recs if r[3]]   # CTAs that ran at least one pair
        t0 = min(r[0] for r in recs)
        us = lambda x: x / 1000.0  # noqa: E731
        pairs = ctx // 128   # one unsplit work per CTA at these shapes (uniform batches, b <= 66)
        ph = {
            "entry (from first CTA)": [us(r[0] - t0) for r in recs],
            "PDL wait": [us(r[1] - r[0]) for r in recs],
            "setup + Q": [us(r[2] - r[1]) for r in recs],
            "first pair": [us(r[3] - r[2]) for r in recs],
            "steady pair": [us(r[4] - r[3]) / max(1, pairs - 1) for r in recs],
            "epilogue": [us(r[5] - r[4]) for r in recs],
            "exit (from first CTA)": [us(r[5] - t0) for r in recs],
            "after PDL: consumer record": [us(r[6] - r[1]) for r in recs],
            "after PDL: Q issued": [us(r[7] - r[1]) for r in recs],
            "after PDL: own Q landed": [us(r[8] - r[1]) for r in recs],
            "after PDL: all Q landed": [us(r[2] - r[1]) for r in recs],
            "after PDL: stage a full": [us(r[9] - r[1]) for r in recs],
            "after PDL: stage b full": [us(r[10] - r[1]) for r in recs],
            "after PDL: producer record": [us(r[11] - r[1]) for r in recs if r[11]],
            "after PDL: first TMA issued": [us(r[12] - r[1]) for r in recs if r[12]],
        }
        med = statistics.median
        line = (f"{dt_name} ({h},{q}) b{b} c{ctx}: CTAs {len(recs)}, pairs {pairs}; decode+reduce {full:.1f} us, "
                f"decode {dec_only:.1f}, reduce {red_only:.1f}\n" +
                "\n".join(f"  {k:24s} med {med(v):8.2f}  min {min(v):8.2f}  max {max(v):8.2f}" for k, v in ph.items()))
        rows.append(line)
        print(line, flush=True)
        del c, bufs
        torch.cuda.empty_cache()
    os.makedirs(outdir, exist_ok=True)
    open(os.path.join(outdir, "seesaw_phases.txt"), "w").write("\n".join(rows) + "\n")


if __name__ == "__main__":
    {"build": build, "run": run}[sys.argv[1]](sys.argv[2])
