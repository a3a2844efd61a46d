"""Altered copies of templates/ for the wgmma_seesaw loop (issue 6, change 6).

usage: python3 scripts/dev/seesaw_probe.py OUT_DIR [chunk6] [qk2set]
  chunk6: QK promotion every 6 k-steps instead of 3 (timing experiment).
  qk2set: the seesaw QK on wgmma_ot's two alternating accumulator sets (pipelined; spills).
(Its former "probe" option, a clock() probe of CTA (0, 0) read by seesaw_phase.py, was removed
in change 17 for scripts/dev/seesaw_phase2.py, shared-memory counters on the roles A / B loop;
that one was removed in change 18 with the loop it instrumented: git show 93369de:scripts/dev/seesaw_phase2.py.)
"""
import os
import shutil
import sys

src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "templates")
dst = sys.argv[1]
opts = set(sys.argv[2:])
shutil.rmtree(dst, ignore_errors=True)
shutil.copytree(src, dst)


def patch(rel, pairs):
    p = os.path.join(dst, rel)
    s = open(p).read()
    for old, new in pairs:
        assert s.count(old) == 1, (rel, old)
        s = s.replace(old, new)
    open(p, "w").write(s)


if "chunk6" in opts:
    patch("common/mla_decode_sm90_wgmma.cuh", [("C::kFp8 ? 3 : C::kKSteps", "C::kFp8 ? 6 : C::kKSteps")])

if "qk2set" in opts:
    patch("common/mla_decode_sm90_seesaw.cuh", [("""  float acc[C::kSTiles][4];
  qk_chunk<C, 0>(s, q_addr, k_addr);
  qk_rest<C, 1>(s, acc, q_addr, k_addr);""", """  wg::QkAcc<C> acc;
  wg::qk_begin<C>(acc, smem, su.stage, 0);
  wg::qk_finish<C>(s, acc, smem, su.stage, 0);""")])

print("wrote", dst, sorted(opts))
