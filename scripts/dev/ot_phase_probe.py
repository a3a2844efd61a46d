"""Instrumented copy of templates/ (argv[1]) for the wgmma_ot loop: clock() cycles per phase,
summed over CTAs (issue 6; docs/perf/notes.md, "what bounds wgmma_ot"). g_phase_clk rows 0/1:
consumer thread 0 of warpgroup 0/1: slot 0 wait full, 1 QK (its waits also cover PV(t-1)),
2 V^T fragments + stage release, 3 softmax_p (with the pair barrier), 4 fence + consumer
barrier, 5 O^T rescale, 6 PV issue, 7 loop overhead up to the next full wait, 8 TMA issue to
full-wait end, 9 tiles. Row 2 (loader lane 0): 0 wait on empty, 1 page lookups + TMA issue, 9 tiles.
Run: python3 scripts/dev/ot_phase_probe.py OUT_TEMPLATES [SRC_TEMPLATES], then
AITER_MLA_TEMPLATES_DIR=OUT_TEMPLATES OVL_LOOP=wgmma_ot python3 scripts/dev/fp8_loop_check.py phase OUTDIR
(its slot labels are wgmma_ovl's; read the slots as above)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from probe_common import Patch  # noqa: E402

# argv[2] (optional): the templates to instrument, e.g. an ot_knockout.py copy (default: the
# repo's). The nocta and memonly knock-outs delete lines this probe stamps, so it refuses them.
P = Patch(sys.argv[2] if len(sys.argv) > 2 else
          os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "templates"), sys.argv[1])
rep = P.rep
dst = P.dst
rep("""        auto qk_and_frags = [&](int t) {
          const int stage = seq % kS;
          mla::wg::mbar_wait(bar_full + stage * 8, (seq / kS) & 1);
          mla::wg::QkAcc<Cfg> qk_acc;
          mla::wg::qk_begin<Cfg>(qk_acc, smem, stage, half);
          mla::wg::qk_finish<Cfg>(s, qk_acc, smem, stage, half);""", """        unsigned int ph_t = clock();
        auto qk_and_frags = [&](int t) {
          const int stage = seq % kS;
          PH(7)
          mla::wg::mbar_wait(bar_full + stage * 8, (seq / kS) & 1);
          PH(0)
          mla::wg::QkAcc<Cfg> qk_acc;
          mla::wg::qk_begin<Cfg>(qk_acc, smem, stage, half);
          mla::wg::qk_finish<Cfg>(s, qk_acc, smem, stage, half);
          PH(1)""")
rep("""          mla::wg::mbar_arrive(bar_empty + stage * 8);   // K and V read
        };
        qk_and_frags(0);""", """          mla::wg::mbar_arrive(bar_empty + stage * 8);   // K and V read
          PH(2)
        };
        qk_and_frags(0);""")
rep("""          mla::ot::softmax_p<Cfg>(s, st, smem, buf, w.kv_tok_start + t * Cfg::BN, scale_log2, group, half, lane);
          mla::wg::fence_proxy_async();   // P (st.shared) -> the PV wgmma's B operand
          mla::wg::consumer_sync();       // P(t) and the factors of all rows written
          mla::ot::rescale_ot<Cfg>(o, smem, buf, lane);
          mla::ot::pv_issue<Cfg>(o, a, smem, buf);""", """          mla::ot::softmax_p<Cfg>(s, st, smem, buf, w.kv_tok_start + t * Cfg::BN, scale_log2, group, half, lane);
          PH(3)
          mla::wg::fence_proxy_async();   // P (st.shared) -> the PV wgmma's B operand
          mla::wg::consumer_sync();       // P(t) and the factors of all rows written
          PH(4)
          mla::ot::rescale_ot<Cfg>(o, smem, buf, lane);
          PH(5)
          mla::ot::pv_issue<Cfg>(o, a, smem, buf);
          PH(6)
          if ((threadIdx.x & 127) == 0) atomicAdd(&g_phase_clk[threadIdx.x >> 7][9], 1ull);""")
# Loader (row 2): slot 0 wait on empty, 1 page lookups + TMA issue, 9 tiles; TMA latency: the
# loader stamps each stage's issue clock, consumer thread 0 of each warpgroup adds (full-wait
# end - issue) into slot 8 of its row.
P.loader()
P.tma_latency("          ")
P.save()
