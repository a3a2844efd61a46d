"""Deliberately wrong copies of templates/ for timing what bounds the wgmma_ot loop (outputs are
garbage; never run the tests on them). usage: python3 scripts/dev/ot_knockout.py OUT_DIR OPTION[,OPTION...]
  noprom : QK without fp8 promotion (one chunk of 18 k-steps)
  noexp  : probabilities without the exponential (p = s - m)
  nopv   : no PV wgmma (fragments, barrier and rescale kept)
  noqk   : no QK wgmma (promotion adds kept)
  nopair : no row-max exchange barrier between the two warpgroups' warps (pair_sync)
  nocta  : no consumer barrier before PV (P of both warpgroups)
  nofrag : no ldmatrix for the V^T fragments (registers left as they are)
  norescale: never rescale O^T (a mutant: test_row_max_moves_mid_work must fail on it)
  memonly: consumers only wait for each KV stage and release it (no QK, fragments, softmax, PV):
           the time the loader and the memory path alone need for the schedule
  nomem  : the loader issues no TMA copy (it arrives on the stage's full barrier at once): the
           consumers compute on whatever the stages hold (the compute side and its barriers alone)
  onecta : the second 64-row CTA of a 128-row work exits at once (half the L2 -> SM traffic of
           (128,1), the same work per SM; no effect at block_m 64, which has no second CTA)
  stages3: 3 KV stages instead of wgmma_ot's 4
  nosoftmax: no softmax_p and no O^T rescale (P and its factors keep whatever they hold); with
           nomem and nofrag: the loop's wgmmas, barriers and stage protocol alone
  warparrive: (not wrong, a candidate) one arrival per consumer warp on a stage's empty barrier
           (8) instead of one per thread (256)
"""
import os
import shutil
import sys

# KO_SRC: the templates folder to copy (default: the repository's)
src = os.environ.get("KO_SRC") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "templates")
dst, opt = sys.argv[1], sys.argv[2]
shutil.rmtree(dst, ignore_errors=True)
shutil.copytree(src, dst)
EDITS = {
    "noprom": ("common/mla_decode_sm90_wgmma.cuh", "C::kFp8 ? 3 : C::kKSteps", "C::kKSteps"),
    "noexp": ("common/mla_decode_sm90.cuh", "  asm(\"ex2.approx.ftz.f32 %0, %1;\\n\" : \"=f\"(y) : \"f\"(x));",
              "  y = x;"),
    "nopv": ("common/mla_decode_sm90_ot.cuh", "  pv_issue_blocks<C, 0>(o, a, smem_addr(smem + C::kOffP + buf * C::kPBytes));",
             ""),
    "noqk": ("common/mla_decode_sm90_wgmma.cuh", """    if (i == 0) {
      wgmma_qk<Fp8, 0>(acc, da, db);
    } else {
      wgmma_qk<Fp8, 1>(acc, da, db);
    }""", "    (void)da; (void)db;"),
    "nopair": ("common/mla_decode_sm90.cuh", """    red_max[half * kRows + r0 + 8] = mx[1];
  }
  pair_sync(group);""", """    red_max[half * kRows + r0 + 8] = mx[1];
  }"""),
    "nocta": ("mla_decode.cu.j2", "          mla::wg::consumer_sync();       // P(t) and the factors of all rows written\n", ""),
    "nofrag": ("common/mla_decode_sm90_ot.cuh",
               "        ldmatrix_x4_trans(d, src + (x >> 2) * (C::BN * 64) + kk * 32 * 64 + ((((x & 3) ^ sw)) << 4));",
               "        d[0] = d[1] = d[2] = d[3] = src + x;"),
    "norescale": ("common/mla_decode_sm90_ot.cuh", "  if (__any_sync(0xffffffffu, any)) {   // skipping factors of exactly 1 is exact",
                  "  if (__any_sync(0xffffffffu, any) && false) {"),
    "memonly": [("mla_decode.cu.j2", """          mla::wg::QkAcc<Cfg> qk_acc;
          mla::wg::qk_begin<Cfg>(qk_acc, smem, stage, half);
          mla::wg::qk_finish<Cfg>(s, qk_acc, smem, stage, half);
          mla::wg::fence_operands(o);
          mla::wg::fence_operands(a[0]);
          mla::ot::load_vt_frags<Cfg>(a, smem, stage, half, group, lane, w.kv_tok_end - (w.kv_tok_start + t * Cfg::BN));
""", "          (void)t;\n"),
                ("mla_decode.cu.j2", """          mla::ot::softmax_p<Cfg>(s, st, smem, buf, w.kv_tok_start + t * Cfg::BN, scale_log2, group, half, lane);
          mla::wg::fence_proxy_async();   // P (st.shared) -> the PV wgmma's B operand
          mla::wg::consumer_sync();       // P(t) and the factors of all rows written
          mla::ot::rescale_ot<Cfg>(o, smem, buf, lane);
          mla::ot::pv_issue<Cfg>(o, a, smem, buf);
""", "          (void)buf;\n")],
    "nomem": [("common/mla_decode_sm90_wgmma.cuh",
               "  if (lane == 0) mbar_arrive_expect_tx(bar_full, boxes * C::kTmaBoxBytes);",
               "  if (lane == 0) mbar_arrive(bar_full);"),
              ("common/mla_decode_sm90_wgmma.cuh",
               "      tma_load_box(stage_addr + blk * (C::BN * 64) + pg * C::kTmaBoxBytes, map, blk * 64, row[i], bar_full);",
               "      (void)blk; (void)pg; (void)map;")],
    "onecta": ("mla_decode.cu.j2", "  aiter_mla_launch_dependents();\n",
               "  aiter_mla_launch_dependents();\n  if (blockIdx.y == 1) return;\n"),
    # (S stays live through an impossible store, else ptxas drops the QK wgmmas as dead code)
    "nosoftmax": [("mla_decode.cu.j2", "          mla::ot::softmax_p<Cfg>(s, st, smem, buf, w.kv_tok_start + t * Cfg::BN, scale_log2, group, half, lane);\n",
                   "          if (w.kv_tok_start < 0) { float x = 0.f; for (int j = 0; j < Cfg::kSTiles; ++j) x += s[j][0] + s[j][1] + s[j][2] + s[j][3];"
                   " reinterpret_cast<float*>(smem)[threadIdx.x] = x; }\n"),
                  ("mla_decode.cu.j2", "          mla::ot::rescale_ot<Cfg>(o, smem, buf, lane);\n", "")],
    "stages3": ("common/mla_decode_sm90_ot.cuh", "  static constexpr int kStages = 4; ", "  static constexpr int kStages = 3; "),
    "warparrive": [("mla_decode.cu.j2", "  constexpr int kEmptyArrivals = mla::kThreads / kRings;",
                    "  constexpr int kEmptyArrivals = {{ '8' if mainloop == 'wgmma_ot' else 'mla::kThreads / kRings' }};"),
                   ("mla_decode.cu.j2", "w.kv_tok_end - (w.kv_tok_start + t * Cfg::BN));\n          mla::wg::mbar_arrive(bar_empty + stage * 8);",
                    "w.kv_tok_end - (w.kv_tok_start + t * Cfg::BN));\n          __syncwarp();\n          if (lane == 0) mla::wg::mbar_arrive(bar_empty + stage * 8);")],
}
for rel, old, new in [e for o in opt.split(",") for e in (EDITS[o] if isinstance(EDITS[o], list) else [EDITS[o]])]:
    p = os.path.join(dst, rel)
    s = open(p).read()
    assert s.count(old) == 1, (opt, old)
    open(p, "w").write(s.replace(old, new))
print("wrote", dst, opt)
