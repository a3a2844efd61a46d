"""Phase clocks of the wgmma_seesaw loop, light version (issue 6, docs/perf/notes.md change 17).
This is ot_phase2.py's method: thread 0 of each consumer warpgroup adds clock() deltas into
shared-memory counters, which are flushed to global memory once per CTA. It replaces the
removed `seesaw_probe.py probe` (a global read-modify-write at every stamp). Unlike
ot_phase2.py, the clock reference is taken at kernel entry, so "between pairs" also holds each CTA's start, each work's Q load and
the previous work's epilogue.

usage:
  python3 scripts/dev/seesaw_phase2.py patch OUT_TEMPLATES [SRC_TEMPLATES]
  python3 scripts/dev/seesaw_phase2.py run OUTDIR OUT_TEMPLATES
      (forces wgmma_seesaw; prints and writes OUTDIR/seesaw_phase2.txt)
      env CASES (';'-separated, default "fp8 (128,1) b64 c8192;fp8 (128,1) b64 c3200")
Slots (cycles per tile pair): see LABELS; role A = warpgroup 0, role B = warpgroup 1.
"""
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from probe_common import counters_export  # noqa: E402

LABELS = [
    ["QK_a (full wait + 18 wgmmas, waited)", "softmax_a + publish", "fence, wg barrier, arrive A",
     "PV_a tile (full wait, frags, rescale, issue)", "wait for B", "PV_a wait", "l, m from B",
     "PV_b tile", "PV_b wait", "between pairs"],
    ["QK_b", "wait for A", "PV_a tile (full wait, frags, rescale, issue)", "softmax_b + publish",
     "fence, wg barrier", "PV_a wait", "arrive B", "PV_b tile", "PV_b wait", "between pairs"],
]

HEADER = '''#pragma once
__device__ unsigned int g_ss2[2][12];
__shared__ unsigned int ss_clk[2][12];
__shared__ unsigned int ss_last[2];
#define SS(slot) if ((threadIdx.x & 127) == 0) { const unsigned int n_ = clock(); \\
  ss_clk[threadIdx.x >> 7][slot] += n_ - ss_last[threadIdx.x >> 7]; ss_last[threadIdx.x >> 7] = n_; }
'''

SEESAW_EDITS = [
    ("#pragma once\n", HEADER),
    # role A
    ("""  const int r0 = group * 16 + (lane >> 2);
  {
    float s[C::kSTiles][4];
    qk_tile<C>(s, smem, bar_full, su_a);""", """  const int r0 = group * 16 + (lane >> 2);
  SS(9)
  {
    float s[C::kSTiles][4];
    qk_tile<C>(s, smem, bar_full, su_a);
    SS(0)"""),
    ("""    publish_rows<C>(smem, 0, f, st.m, r0, lane);
  }
  wg::fence_proxy_async();   // P_a (st.shared) -> the PV wgmmas' B operand
  wg::wg_sync(0);            // P_a and f_a of all 64 rows, for this warpgroup's own PV_a
  bar_arrive(kBarA);
  pv_tile<C>(o, a, smem, bar_full, bar_empty, su_a, 0, 0, group, lane, valid_a);
  bar_wait(kBarB);           // P_b, f_b, m_b written; role B's PV_a done
  pv_wait<C>(o, a);""", """    publish_rows<C>(smem, 0, f, st.m, r0, lane);
  }
  SS(1)
  wg::fence_proxy_async();   // P_a (st.shared) -> the PV wgmmas' B operand
  wg::wg_sync(0);            // P_a and f_a of all 64 rows, for this warpgroup's own PV_a
  bar_arrive(kBarA);
  SS(2)
  pv_tile<C>(o, a, smem, bar_full, bar_empty, su_a, 0, 0, group, lane, valid_a);
  SS(3)
  bar_wait(kBarB);           // P_b, f_b, m_b written; role B's PV_a done
  SS(4)
  pv_wait<C>(o, a);
  SS(5)"""),
    ("""    st.m[h] = row_max<C>(smem, 1)[r0 + 8 * h];
  }
  if (has_b) {
    pv_tile<C>(o, a, smem, bar_full, bar_empty, su_b, 1, 0, group, lane, valid_b);
    pv_wait<C>(o, a);
  }
}""", """    st.m[h] = row_max<C>(smem, 1)[r0 + 8 * h];
  }
  SS(6)
  if (has_b) {
    pv_tile<C>(o, a, smem, bar_full, bar_empty, su_b, 1, 0, group, lane, valid_b);
    SS(7)
    pv_wait<C>(o, a);
    SS(8)
  }
  if ((threadIdx.x & 127) == 0) ss_clk[0][10] += 1;
}"""),
    # role B
    ("""  float sc = 1.f;
  if (has_b) {
    qk_tile<C>(s, smem, bar_full, su_b);
    sc = masked_quad_max<C>(s, st, tok_b + (lane & 3) * 2, tok_b + C::BN, scale_log2, mx);
  }
  bar_wait(kBarA);           // P_a, f_a, m_a written
  pv_tile<C>(o, a, smem, bar_full, bar_empty, su_a, 0, 1, group, lane, valid_a);""", """  float sc = 1.f;
  SS(9)
  if (has_b) {
    qk_tile<C>(s, smem, bar_full, su_b);
    sc = masked_quad_max<C>(s, st, tok_b + (lane & 3) * 2, tok_b + C::BN, scale_log2, mx);
  }
  SS(0)
  bar_wait(kBarA);           // P_a, f_a, m_a written
  SS(1)
  pv_tile<C>(o, a, smem, bar_full, bar_empty, su_a, 0, 1, group, lane, valid_a);
  SS(2)"""),
    ("""  publish_rows<C>(smem, 1, f, st.m, r0, lane);
  wg::fence_proxy_async();   // P_b -> the PV wgmmas
  wg::wg_sync(1);            // P_b and f_b of all 64 rows, for this warpgroup's own PV_b
  pv_wait<C>(o, a);          // PV_a done: role A may rewrite P_a, f_a, m_a after kBarB
  bar_arrive(kBarB);
  if (has_b) {
    pv_tile<C>(o, a, smem, bar_full, bar_empty, su_b, 1, 1, group, lane, valid_b);
    pv_wait<C>(o, a);
  }
}""", """  publish_rows<C>(smem, 1, f, st.m, r0, lane);
  SS(3)
  wg::fence_proxy_async();   // P_b -> the PV wgmmas
  wg::wg_sync(1);            // P_b and f_b of all 64 rows, for this warpgroup's own PV_b
  SS(4)
  pv_wait<C>(o, a);          // PV_a done: role A may rewrite P_a, f_a, m_a after kBarB
  SS(5)
  bar_arrive(kBarB);
  SS(6)
  if (has_b) {
    pv_tile<C>(o, a, smem, bar_full, bar_empty, su_b, 1, 1, group, lane, valid_b);
    SS(7)
    pv_wait<C>(o, a);
    SS(8)
  }
  if ((threadIdx.x & 127) == 0) ss_clk[1][10] += 1;
}"""),
]

KERNEL_EDITS = [
    ("  extern __shared__ __align__(128) uint8_t smem[];\n",
     "  extern __shared__ __align__(128) uint8_t smem[];\n"
     "  if (threadIdx.x < 24) ss_clk[threadIdx.x / 12][threadIdx.x % 12] = 0;\n"
     "  if (threadIdx.x < 2) ss_last[threadIdx.x] = clock();\n"),
    ("""                             p.split_lse, group, half, lane);
{%- endif %}
    }
  }
""", """                             p.split_lse, group, half, lane);
{%- endif %}
    }
  }
  if ((threadIdx.x & 127) == 0 && threadIdx.x < 256)
    for (int i = 0; i < 12; ++i) atomicAdd(&g_ss2[threadIdx.x >> 7][i], ss_clk[threadIdx.x >> 7][i]);
"""),
]

EXPORT = counters_export("aiter_mla_seesaw2", "g_ss2", "unsigned int", 24)


def apply(path, edits, tail=""):
    s = open(path).read()
    for old, new in edits:
        assert s.count(old) == 1, (path, old[:160], s.count(old))
        s = s.replace(old, new)
    open(path, "w").write(s + tail)


def patch(dst, src):
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    apply(os.path.join(dst, "common", "mla_decode_sm90_seesaw.cuh"), SEESAW_EDITS)
    apply(os.path.join(dst, "mla_decode.cu.j2"), KERNEL_EDITS, EXPORT)
    print("patched", dst)


def run(outdir, folder):
    import ctypes
    import subprocess
    sys.path.insert(0, os.getcwd())
    import op_tests.test_mla_persistent as T
    from aiter_mla.ops import decode as dec
    from scripts.dev.probe_common import read_device_counters
    from scripts.dev.template_ab import parse_case, use_templates
    os.makedirs(outdir, exist_ok=True)
    cases = [parse_case(n) for n in os.environ.get(
        "CASES", "fp8 (128,1) b64 c8192;fp8 (128,1) b64 c3200").split(";")]
    dec.force_mainloop("fp8", "wgmma_seesaw")
    env = dict(os.environ, AITER_MLA_TEMPLATES_DIR=folder)
    code = ("import sys, torch; sys.path.insert(0, '.'); from aiter_mla.ops import decode as dec; "
            "from aiter_mla.jit import get_module; dec.force_mainloop('fp8', 'wgmma_seesaw'); "
            + "; ".join(f"get_module('mla_decode', **dec.decode_variant({h}, {q}, {P}, torch.float8_e4m3fn, "
                        f"torch.float8_e4m3fn))" for _n, h, q, P, _dt, _b, _c in cases))
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    use_templates(folder)
    lines = []
    for cname, h, q, P, dt, b, ctx in cases:
        c = T.make_case(h, q, P, dt, [ctx] * b, seed=1, spare_pages=0)
        v = read_device_counters(c, T.plan(c), h, "aiter_mla_seesaw2", ctypes.c_uint, 24, calls=3)
        lines.append(f"== {cname} (wgmma_seesaw): cycles per tile pair")
        for wg in (0, 1):
            pairs = max(1, v[wg * 12 + 10])
            lines.append(f"  role {'AB'[wg]} (pairs counted: {v[wg * 12 + 10]})")
            for slot, label in enumerate(LABELS[wg]):
                lines.append(f"    {label:46s} {v[wg * 12 + slot] / pairs:8.0f}")
            lines.append(f"    {'sum':46s} {sum(v[wg * 12 + i] for i in range(10)) / pairs:8.0f}")
        print("\n".join(lines[-(2 * 12 + 1):]), flush=True)
    use_templates(None)
    open(os.path.join(outdir, "seesaw_phase2.txt"), "w").write("\n".join(lines) + "\n")


if __name__ == "__main__":
    if sys.argv[1] == "patch":
        patch(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else
              os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "templates"))
    else:
        run(sys.argv[2], sys.argv[3])
