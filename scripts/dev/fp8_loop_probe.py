"""Instrumented copy of templates/ (argv[1]; source: PROBE_SRC or templates/) for the wgmma_ovl loop
(the probes perturb timings near 5,200 cycles per tile: see docs/perf/notes.md, change 4): clock() cycles per phase,
summed over CTAs. g_phase_clk rows 0/1: consumer thread 0 of warpgroup 0/1: slot 0 wait full,
1 QK, 2 rescale+load_p, 3 wait vt_full, 4 pv issue, 5 softmax+pair_sync, 6 wait PV, 9 tiles.
Row 2: loader lane 0: 0 wait empty, 1 issue, 9 tiles; transposer warp 9 lane 0: 2 wait full,
3 wait vt_empty, 4 transpose+arrive, 8 tiles."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from probe_common import Patch  # noqa: E402

src = os.environ.get("PROBE_SRC") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "templates")
P = Patch(src, sys.argv[1])
rep = P.rep
dst = P.dst
# loader (TMA path): slot 0 = wait on empty, slot 1 = page lookups + issue, slot 9 tiles.
P.loader()
# transposer
rep("""            mla::wg::mbar_wait(bar_full + stage * 8, (u / Cfg::kStages) & 1);
            mla::wg::mbar_wait(bar_vt_empty + buf * 8, ((u >> 1) & 1) ^ 1);
            mla::ovl::transpose_v<Cfg>(smem, stage, buf, tw, lane, w.kv_tok_end - (w.kv_tok_start + t * Cfg::BN));
            mla::wg::fence_proxy_async();   // generic-proxy stores -> visible to the PV wgmma
            mla::wg::mbar_arrive(bar_vt_full + buf * 8);
            mla::wg::mbar_arrive(bar_empty + stage * 8);""", """            unsigned int q0 = clock();
            mla::wg::mbar_wait(bar_full + stage * 8, (u / Cfg::kStages) & 1);
            unsigned int q1 = clock();
            mla::wg::mbar_wait(bar_vt_empty + buf * 8, ((u >> 1) & 1) ^ 1);
            unsigned int q2 = clock();
            mla::ovl::transpose_v<Cfg>(smem, stage, buf, tw, lane, w.kv_tok_end - (w.kv_tok_start + t * Cfg::BN));
            mla::wg::fence_proxy_async();   // generic-proxy stores -> visible to the PV wgmma
            mla::wg::mbar_arrive(bar_vt_full + buf * 8);
            mla::wg::mbar_arrive(bar_empty + stage * 8);
            if (tw == 0 && lane == 0) { unsigned int q3 = clock(); atomicAdd(&g_phase_clk[2][2], (unsigned long long)(q1 - q0));
              atomicAdd(&g_phase_clk[2][3], (unsigned long long)(q2 - q1)); atomicAdd(&g_phase_clk[2][4], (unsigned long long)(q3 - q2));
              atomicAdd(&g_phase_clk[2][8], 1ull); }""")
# consumer
rep("""      auto qk_tile = [&](float (&s)[Cfg::kSTiles][4]) {
        const int stage = seq % kS;
        mla::wg::mbar_wait(bar_full + stage * 8, (seq / kS) & 1);""", """      unsigned int ph_t = clock();
      auto qk_tile = [&](float (&s)[Cfg::kSTiles][4]) {
        const int stage = seq % kS;
        PH(7)
        mla::wg::mbar_wait(bar_full + stage * 8, (seq / kS) & 1);
        PH(0)""")
rep("""        mla::wg::mbar_arrive(bar_empty + stage * 8);   // K read by QK
      };""", """        mla::wg::mbar_arrive(bar_empty + stage * 8);   // K read by QK
        PH(1)
      };""")
rep("""        mla::ovl::load_p<Cfg>(pa, smem, group, lane);
        mla::wg::mbar_wait(bar_vt_full + pb * 8, ((seq - 1) >> 1) & 1);
        mla::ovl::pv_issue<Cfg>(o, pa, smem, pb, half);
      };""", """        mla::ovl::load_p<Cfg>(pa, smem, group, lane);
        PH(2)
        mla::wg::mbar_wait(bar_vt_full + pb * 8, ((seq - 1) >> 1) & 1);
        PH(3)
        mla::ovl::pv_issue<Cfg>(o, pa, smem, pb, half);
        PH(4)
      };""")
rep("""      auto pv_prev_wait = [&]() {
        mla::wg::wgmma_wait<0>();""", """      auto pv_prev_wait = [&]() {
        PH(5)
        mla::wg::wgmma_wait<0>();""")
rep("""        mla::wg::mbar_arrive(bar_vt_empty + ((seq - 1) & 1) * 8);
      };""", """        mla::wg::mbar_arrive(bar_vt_empty + ((seq - 1) & 1) * 8);
        PH(6)
        if ((threadIdx.x & 127) == 0) atomicAdd(&g_phase_clk[threadIdx.x >> 7][9], 1ull);
      };""")
P.tma_latency("        ")
P.save()
