"""Deliberately wrong copies of templates/ for timing what bounds the wgmma_ot loop (outputs are
garbage; never run the tests on them). usage: python3 scripts/dev/ot_knockout.py OUT_DIR OPTION
  noprom : QK without fp8 promotion (one chunk of 18 k-steps)
  noexp  : probabilities without the exponential (p = s - m)
  nopv   : no PV wgmma (fragments, barrier and rescale kept)
  noqk   : no QK wgmma (promotion adds kept)
  nopair : no row-max exchange barrier between the two warpgroups' warps (pair_sync)
  nocta  : no consumer barrier before PV (P of both warpgroups)
  nofrag : no ldmatrix for the V^T fragments (registers left as they are)
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
      wgmma_qk<C::kFp8, 0>(a.acc[kB], da, db);
    } else {
      wgmma_qk<C::kFp8, 1>(a.acc[kB], da, db);
    }""", "    (void)da; (void)db;"),
    "nopair": ("common/mla_decode_sm90.cuh", """    red_max[half * kRows + r0 + 8] = mx[1];
  }
  pair_sync(group);""", """    red_max[half * kRows + r0 + 8] = mx[1];
  }"""),
    "nocta": ("mla_decode.cu.j2", "          mla::wg::consumer_sync();       // P(t) and the factors of all rows written\n", ""),
    "nofrag": ("common/mla_decode_sm90_ot.cuh",
               "        ldmatrix_x4_trans(d, src + (x >> 2) * (C::BN * 64) + kk * 32 * 64 + ((((x & 3) ^ sw)) << 4));",
               "        d[0] = d[1] = d[2] = d[3] = src + x;"),
}
rel, old, new = EDITS[opt]
p = os.path.join(dst, rel)
s = open(p).read()
assert s.count(old) == 1, (opt, old)
open(p, "w").write(s.replace(old, new))
print("wrote", dst, opt)
