"""Instrumented / altered copies of templates/ for the wgmma_seesaw loop (issue 6, change 6).

usage: python3 scripts/dev/seesaw_probe.py OUT_DIR [probe] [chunk6]
  probe : clock() cycles per phase of CTA (0, 0), thread 0 of each consumer warpgroup, summed
          over its pairs into g_ss_clk[2][8] (read by aiter_mla_ss_clocks(host_ptr, reset));
          role A slots: 0 QK(a) 1 softmax(a) 2 PV(a) frags+issue 3 wait kBarB 4 wait PV(a)
          5 PV(b) frags+issue+wait; role B: 0 QK(b) 1 wait kBarA 2 PV(a) frags+issue
          3 softmax(b) 4 wait PV(a) 5 PV(b); slot 7 pairs. One CTA only: no atomics contention.
  chunk6: QK promotion every 6 k-steps instead of 3 (timing experiment).
  qk2set: the seesaw QK on wgmma_ot's two alternating accumulator sets (pipelined; spills).
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

if "probe" in opts:
    H = "common/mla_decode_sm90_seesaw.cuh"
    patch(H, [
        ("namespace mla {\nnamespace seesaw {\n",
         "__device__ unsigned long long g_ss_clk[2][8];\n"
         "#define SS_PH(slot) if (ss_on) { const unsigned int n_ = clock(); "
         "g_ss_clk[threadIdx.x >> 7][slot] += n_ - ss_t; ss_t = n_; }\n"
         "namespace mla {\nnamespace seesaw {\n"),
    ])
    # role A
    patch(H, [
        ("""  const int r0 = group * 16 + (lane >> 2);
  {
    float s[C::kSTiles][4];
    qk_tile<C>(s, smem, bar_full, su_a);""",
         """  const int r0 = group * 16 + (lane >> 2);
  const bool ss_on = blockIdx.x == 0 && blockIdx.y == 0 && (threadIdx.x & 127) == 0;
  unsigned int ss_t = clock();
  {
    float s[C::kSTiles][4];
    qk_tile<C>(s, smem, bar_full, su_a);
    SS_PH(0)"""),
        ("""  bar_arrive(kBarA);
  pv_tile<C>(o, a, smem, bar_full, bar_empty, su_a, 0, 0, group, lane, valid_a);
  bar_wait(kBarB);           // P_b, f_b, m_b written; role B's PV_a done
  pv_wait<C>(o, a);""",
         """  bar_arrive(kBarA);
  SS_PH(1)
  pv_tile<C>(o, a, smem, bar_full, bar_empty, su_a, 0, 0, group, lane, valid_a);
  SS_PH(2)
  bar_wait(kBarB);           // P_b, f_b, m_b written; role B's PV_a done
  SS_PH(3)
  pv_wait<C>(o, a);
  SS_PH(4)"""),
        ("""    pv_tile<C>(o, a, smem, bar_full, bar_empty, su_b, 1, 0, group, lane, valid_b);
    pv_wait<C>(o, a);
  }
}""", """    pv_tile<C>(o, a, smem, bar_full, bar_empty, su_b, 1, 0, group, lane, valid_b);
    pv_wait<C>(o, a);
  }
  SS_PH(5)
  if (ss_on) g_ss_clk[0][7] += 1;
}"""),
    ])
    # role B
    patch(H, [
        ("""  float mx[2] = {-INFINITY, -INFINITY};
  if (has_b) {""", """  float mx[2] = {-INFINITY, -INFINITY};
  const bool ss_on = blockIdx.x == 0 && blockIdx.y == 0 && (threadIdx.x & 127) == 0;
  unsigned int ss_t = clock();
  if (has_b) {"""),
        ("""  bar_wait(kBarA);           // P_a, f_a, m_a written
  pv_tile<C>(o, a, smem, bar_full, bar_empty, su_a, 0, 1, group, lane, valid_a);""",
         """  SS_PH(0)
  bar_wait(kBarA);           // P_a, f_a, m_a written
  SS_PH(1)
  pv_tile<C>(o, a, smem, bar_full, bar_empty, su_a, 0, 1, group, lane, valid_a);
  SS_PH(2)"""),
        ("""  wg::wg_sync(1);            // P_b and f_b of all 64 rows, for this warpgroup's own PV_b
  pv_wait<C>(o, a);          // PV_a done: role A may rewrite P_a, f_a, m_a after kBarB
  bar_arrive(kBarB);""", """  wg::wg_sync(1);            // P_b and f_b of all 64 rows, for this warpgroup's own PV_b
  SS_PH(3)
  pv_wait<C>(o, a);          // PV_a done: role A may rewrite P_a, f_a, m_a after kBarB
  bar_arrive(kBarB);
  SS_PH(4)"""),
        ("""    pv_tile<C>(o, a, smem, bar_full, bar_empty, su_b, 1, 1, group, lane, valid_b);
    pv_wait<C>(o, a);
  }
}

}  // namespace seesaw""", """    pv_tile<C>(o, a, smem, bar_full, bar_empty, su_b, 1, 1, group, lane, valid_b);
    pv_wait<C>(o, a);
  }
  SS_PH(5)
  if (ss_on) g_ss_clk[1][7] += 1;
}

}  // namespace seesaw"""),
    ])
    patch("mla_decode.cu.j2", [
        ("// Shared-memory bytes one CTA of this variant uses (for tests and reports).",
         "{%- if mainloop == \"wgmma_seesaw\" %}\n"
         "AITER_MLA_EXPORT int aiter_mla_ss_clocks(unsigned long long* host, int reset) {\n"
         "  cudaError_t e = cudaMemcpyFromSymbol(host, g_ss_clk, sizeof(g_ss_clk));\n"
         "  if (reset) { unsigned long long z[16] = {}; e = cudaMemcpyToSymbol(g_ss_clk, z, sizeof(z)); }\n"
         "  return e;\n}\n{%- endif %}\n"
         "// Shared-memory bytes one CTA of this variant uses (for tests and reports)."),
    ])
print("wrote", dst, sorted(opts))
