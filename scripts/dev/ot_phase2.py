"""Phase clocks of the wgmma_ot loop, light version (issue 6, docs/perf/notes.md): thread 0 of
each consumer warpgroup adds clock() deltas into per-CTA shared-memory counters, flushed to
global memory once per CTA at the end (the ot_phase_probe.py it replaces did a global atomic
at every stamp, which inflated every phase: docs/perf/notes.md, change 17).

usage:
  python3 scripts/dev/ot_phase2.py patch OUT_TEMPLATES SRC_TEMPLATES old|new
      old: the shipped loop (as at 82e578c: PV(t) issued before QK(t+1)); new: a templates
      folder with scripts/dev/patches/ot_pv_under_softmax.patch applied (PV(t) issued after
      QK(t+1)'s chunks, under softmax(t+1)). Slots are printed with the order's labels.
  python3 scripts/dev/ot_phase2.py run OUTDIR NAME=OUT_TEMPLATES [...]
      OUT_TEMPLATES: a folder made by `patch` (its order is read from the PHASE_ORDER file
      that `patch` writes there). Prints each arm's cycles per tile and writes
      OUTDIR/phase2.txt. env CASES (';'-separated, default
      "fp8 (128,1) b64 c8192;fp8 (128,1) b64 c3200")
Counting starts after each work's Q load (old: before QK(0); new: after tile 0's softmax and
barrier), so a work's start and epilogue are in no slot.
"""
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from probe_common import counters_export  # noqa: E402

LABELS = {
    "old": ["wait full", "QK (+ PV(t-1) ahead)", "V^T frags + release", "softmax", "fence + barrier",
            "O^T rescale", "PV issue", "-", "loop top", "tiles"],
    "new": ["wait full", "QK c0,c1 issue", "O^T rescale (under QK)", "QK rest + PV issue + S waits", "softmax (PV under it)",
            "PV wait", "V^T frags + release", "fence + barrier", "loop top", "tiles"],
}

MACRO = ('#include "common/aiter_mla_common.cuh"\n__device__ unsigned int g_ph2[2][10];\n'
         '#define PH(slot) if ((threadIdx.x & 127) == 0) { const unsigned int ph_n = clock(); '
         'ph_sm[threadIdx.x >> 7][slot] += ph_n - ph_t; ph_t = ph_n; }\n')
EXPORT = counters_export("aiter_mla_phase2", "g_ph2", "unsigned int", 20)

COMMON = [
    ("#include \"common/aiter_mla_common.cuh\"\n", MACRO),
    ("  extern __shared__ __align__(128) uint8_t smem[];\n",
     "  extern __shared__ __align__(128) uint8_t smem[];\n  __shared__ unsigned int ph_sm[2][10];\n"
     "  if (threadIdx.x < 20) ph_sm[threadIdx.x / 10][threadIdx.x % 10] = 0;\n"),
    # flush after the consumer's work loop (the kernel's last lines)
    ("""      {{ "mla::ot::write_output" if ot_like else "mla::write_output" }}<Cfg>(o, st, smem, w, row_base, p.num_heads, kv_scale, p.out, p.final_lse, p.split_out,
                             p.split_lse, group, half, lane);
{%- endif %}
    }
  }
""", """      {{ "mla::ot::write_output" if ot_like else "mla::write_output" }}<Cfg>(o, st, smem, w, row_base, p.num_heads, kv_scale, p.out, p.final_lse, p.split_out,
                             p.split_lse, group, half, lane);
{%- endif %}
    }
  }
  if ((threadIdx.x & 127) == 0 && threadIdx.x < 256)
    for (int i = 0; i < 10; ++i) atomicAdd(&g_ph2[threadIdx.x >> 7][i], ph_sm[threadIdx.x >> 7][i]);
"""),
]

EDITS = {
    "old": [
        ("""        auto qk_and_frags = [&](int t) {""", """        unsigned int ph_t = clock();
        auto qk_and_frags = [&](int t) {"""),
        ("""          const int stage = seq % kS;
          mla::wg::mbar_wait(bar_full + stage * 8, (seq / kS) & 1);
          mla::wg::QkAcc<Cfg> qk_acc;
          mla::wg::qk_begin<Cfg>(qk_acc, smem, stage, half);
          mla::wg::qk_finish<Cfg>(s, qk_acc, smem, stage, half);
          mla::wg::fence_operands(o);""", """          const int stage = seq % kS;
          PH(8)
          mla::wg::mbar_wait(bar_full + stage * 8, (seq / kS) & 1);
          PH(0)
          mla::wg::QkAcc<Cfg> qk_acc;
          mla::wg::qk_begin<Cfg>(qk_acc, smem, stage, half);
          mla::wg::qk_finish<Cfg>(s, qk_acc, smem, stage, half);
          PH(1)
          mla::wg::fence_operands(o);"""),
        ("""          mla::wg::mbar_arrive(bar_empty + stage * 8);   // K and V read
        };""", """          mla::wg::mbar_arrive(bar_empty + stage * 8);   // K and V read
          PH(2)
        };"""),
        ("""          mla::ot::softmax_p<Cfg>(s, st, smem, buf, w.kv_tok_start + t * Cfg::BN, scale_log2, group, half, lane);
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
          if ((threadIdx.x & 127) == 0) ph_sm[threadIdx.x >> 7][9] += 1;"""),
    ],
    "new": [
        ("""        for (int t = 0; t < num_tiles; ++t) {
          const int buf = t & 1;
          ++seq;                          // the stage use of tile t + 1""", """        unsigned int ph_t = clock();
        for (int t = 0; t < num_tiles; ++t) {
          const int buf = t & 1;
          ++seq;                          // the stage use of tile t + 1"""),
        ("""            const int stage = seq % kS;
            mla::wg::mbar_wait(bar_full + stage * 8, (seq / kS) & 1);
            mla::wg::QkAcc<Cfg> qk_acc;
            mla::ot::qk_around<Cfg>(s, qk_acc, smem, stage, half,
                                    [&] { mla::ot::rescale_ot<Cfg>(o, smem, buf, lane); },
                                    [&] { mla::ot::pv_issue<Cfg>(o, a, smem, buf); });""", """            const int stage = seq % kS;
            PH(8)
            mla::wg::mbar_wait(bar_full + stage * 8, (seq / kS) & 1);
            PH(0)
            mla::wg::QkAcc<Cfg> qk_acc;
            mla::ot::qk_around<Cfg>(s, qk_acc, smem, stage, half,
                                    [&] { PH(1) mla::ot::rescale_ot<Cfg>(o, smem, buf, lane); PH(2) },
                                    [&] { mla::ot::pv_issue<Cfg>(o, a, smem, buf); });
            PH(3)"""),
        ("""            mla::wg::wgmma_wait<0>();     // PV(t) done: A and P(t) are free
            mla::wg::fence_operands(o);
            frags_and_release(t + 1, stage);
            mla::wg::fence_proxy_async();   // P(t+1) -> the PV wgmma's B operand
            mla::wg::consumer_sync();       // P(t+1) and the factors of all rows written""", """            PH(4)
            mla::wg::wgmma_wait<0>();     // PV(t) done: A and P(t) are free
            mla::wg::fence_operands(o);
            PH(5)
            frags_and_release(t + 1, stage);
            PH(6)
            mla::wg::fence_proxy_async();   // P(t+1) -> the PV wgmma's B operand
            mla::wg::consumer_sync();       // P(t+1) and the factors of all rows written
            PH(7)
            if ((threadIdx.x & 127) == 0) ph_sm[threadIdx.x >> 7][9] += 1;"""),
    ],
}


def patch(dst, src, order):
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    path = os.path.join(dst, "mla_decode.cu.j2")
    s = open(path).read()
    for old, new in COMMON + EDITS[order]:
        assert s.count(old) == 1, (old[:200], s.count(old))
        s = s.replace(old, new)
    open(path, "w").write(s + EXPORT)
    open(os.path.join(dst, "PHASE_ORDER"), "w").write(order)
    print("patched", path, order)


def run(outdir, specs):
    import ctypes
    import subprocess
    import torch
    sys.path.insert(0, os.getcwd())
    import op_tests.test_mla_persistent as T
    from scripts.dev.probe_common import read_device_counters
    from scripts.dev.template_ab import parse_case, use_templates
    os.makedirs(outdir, exist_ok=True)
    arms = [(s.partition("=")[0], s.partition("=")[2]) for s in specs]
    cases = [parse_case(n) for n in os.environ.get(
        "CASES", "fp8 (128,1) b64 c8192;fp8 (128,1) b64 c3200").split(";")]
    for name, folder in arms:
        env = dict(os.environ, TEMPLATE_AB_BUILD_ONLY="1", CASES=";".join(c[0] for c in cases),
                   AITER_MLA_TEMPLATES_DIR=folder)
        subprocess.run([sys.executable, "scripts/dev/template_ab.py", outdir, f"{name}={folder}"], env=env, check=True)
    lines = []
    for cname, h, q, P, dt, b, ctx in cases:
        c = T.make_case(h, q, P, dt, [ctx] * b, seed=1, spare_pages=0)
        for name, folder in arms:
            order = open(os.path.join(folder, "PHASE_ORDER")).read().strip()
            use_templates(folder)
            buf = read_device_counters(c, T.plan(c), h, "aiter_mla_phase2", ctypes.c_uint, 20, calls=3)
            first = len(lines)
            lines.append(f"== {cname}  arm {name} ({order} order): cycles per tile, warpgroup 0 / 1")
            for slot in range(9):
                if LABELS[order][slot] == "-":
                    continue
                per = [buf[wg * 10 + slot] / max(1, buf[wg * 10 + 9]) for wg in range(2)]
                lines.append(f"  {LABELS[order][slot]:32s} {per[0]:8.0f} {per[1]:8.0f}")
            tot = [sum(buf[wg * 10 + i] for i in range(9)) / max(1, buf[wg * 10 + 9]) for wg in range(2)]
            lines.append(f"  {'sum':32s} {tot[0]:8.0f} {tot[1]:8.0f}   (tiles counted: {buf[9]}, {buf[19]})")
            print("\n".join(lines[first:]), flush=True)
        use_templates(None)
        del c
        torch.cuda.empty_cache()
    open(os.path.join(outdir, "phase2.txt"), "w").write("\n".join(lines) + "\n")


if __name__ == "__main__":
    if sys.argv[1] == "patch":
        patch(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        run(sys.argv[2], sys.argv[3:])
