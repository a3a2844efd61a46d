"""Instrumented copy of templates/ (argv[1]; source: PROBE_SRC or templates/) for the wgmma_ovl loop
(the probes perturb timings near 5,200 cycles per tile: see docs/perf/notes.md, change 4): clock() cycles per phase,
summed over CTAs. g_phase_clk rows 0/1: consumer thread 0 of warpgroup 0/1: slot 0 wait full,
1 QK, 2 rescale+load_p, 3 wait vt_full, 4 pv issue, 5 softmax+pair_sync, 6 wait PV, 9 tiles.
Row 2: loader lane 0: 0 wait empty, 1 issue, 9 tiles; transposer warp 9 lane 0: 2 wait full,
3 wait vt_empty, 4 transpose+arrive, 8 tiles."""
import os, shutil, sys
src = os.environ.get("PROBE_SRC") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "templates")
dst = sys.argv[1]
shutil.rmtree(dst, ignore_errors=True)
shutil.copytree(src, dst)
p = os.path.join(dst, "mla_decode.cu.j2")
s = open(p).read()
def rep(old, new, n=1):
    global s
    assert s.count(old) == n, (old, s.count(old))
    s = s.replace(old, new)
rep('#include "common/aiter_mla_common.cuh"\n', '#include "common/aiter_mla_common.cuh"\n__device__ unsigned long long g_phase_clk[3][10];\n'
    '#define PH(slot) if ((threadIdx.x & 127) == 0) { const unsigned int ph_n = clock(); atomicAdd(&g_phase_clk[threadIdx.x >> 7][slot], (unsigned long long)(ph_n - ph_t)); ph_t = ph_n; }\n')
# loader (TMA path): probes inside produce_kv_tile_tma (lane 0): 0 lookups+wait empty... split:
# slot 0 = wait on empty, slot 1 = page lookups before it + issue after it, slot 9 tiles.
h = os.path.join(dst, "common", "mla_decode_sm90_ovl.cuh")
hs = open(h).read()
old = """  wg::mbar_wait(bar_empty, empty_parity);
  if (lane == 0) mbar_arrive_expect_tx(bar_full, boxes * C::kTmaBoxBytes);"""
assert hs.count(old) == 1
hs = hs.replace(old, """  unsigned int pt1 = clock();
  wg::mbar_wait(bar_empty, empty_parity);
  unsigned int pt2 = clock();
  if (lane == 0) mbar_arrive_expect_tx(bar_full, boxes * C::kTmaBoxBytes);""")
old = """  int row[(kMaxBoxes + 31) / 32];"""
hs = hs.replace(old, """  unsigned int pt0 = clock();
  int row[(kMaxBoxes + 31) / 32];""")
old = """      tma_load_box(stage_addr + blk * (C::BN * 64) + pg * C::kTmaBoxBytes, map, blk * 64, row[i], bar_full);
    }
  }"""
assert hs.count(old) == 1
hs = hs.replace(old, old + """
  if (lane == 0) { unsigned int pt3 = clock(); atomicAdd(&g_phase_clk[2][0], (unsigned long long)(pt2 - pt1));
    atomicAdd(&g_phase_clk[2][1], (unsigned long long)(pt1 - pt0 + pt3 - pt2)); atomicAdd(&g_phase_clk[2][9], 1ull); }""")
open(h, "w").write(hs)
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
# TMA latency: loader stamps the issue clock per stage; consumer WG0/1 thread 0 adds
# (full-wait end - issue) into slot 8.
rep("""  extern __shared__ __align__(128) uint8_t smem[];""", """  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ unsigned int issue_clk[4];""")
rep("""                                             w.kv_tok_start + t * Cfg::BN, w.kv_tok_end, lane);
""", """                                             w.kv_tok_start + t * Cfg::BN, w.kv_tok_end, lane);
          if (lane == 0) issue_clk[stage] = clock();
""")
rep("""        mla::wg::mbar_wait(bar_full + stage * 8, (seq / kS) & 1);
        PH(0)""", """        mla::wg::mbar_wait(bar_full + stage * 8, (seq / kS) & 1);
        if ((threadIdx.x & 127) == 0) { const int dl = (int)(clock() - issue_clk[stage]); if (dl > 0 && dl < 1000000) atomicAdd(&g_phase_clk[threadIdx.x >> 7][8], (unsigned long long)dl); else atomicAdd(&g_phase_clk[2][7], 1ull); }
        PH(0)""")
s += '''
AITER_MLA_EXPORT int aiter_mla_phase_clocks(unsigned long long* out, int reset) {
  cudaError_t e = cudaMemcpyFromSymbol(out, g_phase_clk, sizeof(unsigned long long) * 30);
  if (e == cudaSuccess && reset) {
    unsigned long long z[30] = {};
    e = cudaMemcpyToSymbol(g_phase_clk, z, sizeof(z));
  }
  return e;
}
'''
open(p, "w").write(s)
print("patched", p)
