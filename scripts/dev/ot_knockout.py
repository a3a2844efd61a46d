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
"""
import os
import shutil
import sys

src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "templates")
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
}
for rel, old, new in [e for o in opt.split(",") for e in (EDITS[o] if isinstance(EDITS[o], list) else [EDITS[o]])]:
    p = os.path.join(dst, rel)
    s = open(p).read()
    assert s.count(old) == 1, (opt, old)
    open(p, "w").write(s.replace(old, new))
print("wrote", dst, opt)
