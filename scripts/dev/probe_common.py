"""Shared pieces of the phase-clock probes (fp8_loop_probe.py; ot_phase_probe.py until change 17,
which replaced it by ot_phase2.py: a global atomic at every stamp distorts the phases): a patched
copy of templates/, the PH(slot) clock macro over g_phase_clk[3][10], and the host export that
fp8_loop_check.py's phase mode reads."""
import os
import shutil

PH_MACRO = ('#include "common/aiter_mla_common.cuh"\n__device__ unsigned long long g_phase_clk[3][10];\n'
            '#define PH(slot) if ((threadIdx.x & 127) == 0) { const unsigned int ph_n = clock(); '
            'atomicAdd(&g_phase_clk[threadIdx.x >> 7][slot], (unsigned long long)(ph_n - ph_t)); ph_t = ph_n; }\n')

def counters_export(fn, symbol, ctype, n):
    """Host export ``fn(out, reset)`` of an instrumented decode module: copies the ``n``
    ``ctype`` counters of device array ``symbol`` to ``out`` and zeroes them when ``reset``
    (read by read_device_counters)."""
    return f'''
AITER_MLA_EXPORT int {fn}({ctype}* out, int reset) {{
  cudaError_t e = cudaMemcpyFromSymbol(out, {symbol}, sizeof({ctype}) * {n});
  if (e == cudaSuccess && reset) {{
    {ctype} z[{n}] = {{}};
    e = cudaMemcpyToSymbol({symbol}, z, sizeof(z));
  }}
  return e;
}}
'''


EXPORT = counters_export("aiter_mla_phase_clocks", "g_phase_clk", "unsigned long long", 30)


class Patch:
    """A copy of the templates at src in dst; .rep(old, new, n) edits the decode template's text
    (exactly n occurrences), .save() writes it back with the export appended."""

    def __init__(self, src, dst):
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst)
        self.dst = dst
        self.path = os.path.join(dst, "mla_decode.cu.j2")
        self.s = open(self.path).read()
        self.rep('#include "common/aiter_mla_common.cuh"\n', PH_MACRO)

    def rep(self, old, new, n=1):
        assert self.s.count(old) == n, (old, self.s.count(old))
        self.s = self.s.replace(old, new)

    def loader(self):
        """TMA loader lane 0 (row 2 of g_phase_clk): slot 0 wait on empty, 1 page lookups +
        issue, 9 tiles (inside wg::produce_kv_tile_tma)."""
        h = os.path.join(self.dst, "common", "mla_decode_sm90_wgmma.cuh")
        hs = open(h).read()
        edits = [("""  wg::mbar_wait(bar_empty, empty_parity);
  if (lane == 0) mbar_arrive_expect_tx(bar_full, boxes * C::kTmaBoxBytes);""", """  unsigned int pt1 = clock();
  wg::mbar_wait(bar_empty, empty_parity);
  unsigned int pt2 = clock();
  if (lane == 0) mbar_arrive_expect_tx(bar_full, boxes * C::kTmaBoxBytes);"""),
                 ("""  int row[(kMaxBoxes + 31) / 32];""", """  unsigned int pt0 = clock();
  int row[(kMaxBoxes + 31) / 32];"""),
                 ("""      tma_load_box(stage_addr + blk * (C::BN * 64) + pg * C::kTmaBoxBytes, map, blk * 64, row[i], bar_full);
    }
  }""", """      tma_load_box(stage_addr + blk * (C::BN * 64) + pg * C::kTmaBoxBytes, map, blk * 64, row[i], bar_full);
    }
  }
  if (lane == 0) { unsigned int pt3 = clock(); atomicAdd(&g_phase_clk[2][0], (unsigned long long)(pt2 - pt1));
    atomicAdd(&g_phase_clk[2][1], (unsigned long long)(pt1 - pt0 + pt3 - pt2)); atomicAdd(&g_phase_clk[2][9], 1ull); }""")]
        for old, new in edits:
            assert hs.count(old) == 1, old
            hs = hs.replace(old, new)
        open(h, "w").write(hs)

    def tma_latency(self, indent):
        """The loader stamps each stage's TMA issue clock; consumer thread 0 of each warpgroup adds
        (its full-wait end - issue) into slot 8 of its row (row 2 slot 7 counts unusable stamps).
        indent: the consumer's `mbar_wait(bar_full ...)` line indentation, followed by PH(0)."""
        self.rep("""  extern __shared__ __align__(128) uint8_t smem[];""", """  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ unsigned int issue_clk[8];""")
        self.rep("""                                            w.kv_tok_start + t * Cfg::BN, w.kv_tok_end, lane);
""", """                                            w.kv_tok_start + t * Cfg::BN, w.kv_tok_end, lane);
          if (lane == 0) issue_clk[stage] = clock();
""")
        wait = indent + "mla::wg::mbar_wait(bar_full + stage * 8, (seq / kS) & 1);\n"
        self.rep(wait + indent + "PH(0)", wait + indent + "if ((threadIdx.x & 127) == 0) { const int dl = (int)(clock() - issue_clk[stage]); "
                 "if (dl > 0 && dl < 1000000) atomicAdd(&g_phase_clk[threadIdx.x >> 7][8], (unsigned long long)dl); "
                 "else atomicAdd(&g_phase_clk[2][7], 1ull); }\n" + indent + "PH(0)")

    def save(self):
        open(self.path, "w").write(self.s + EXPORT)
        print("patched", self.path)


def patch_decode_template(dst, edits, export):
    """A copy of templates/ at dst whose decode template has each (old, new) of ``edits``
    applied (each old must occur exactly once) and ``export`` appended (the timeline probes)."""
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "templates")
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    path = os.path.join(dst, "mla_decode.cu.j2")
    s = open(path).read()
    for old, new in edits:
        assert s.count(old) == 1, (old, s.count(old))
        s = s.replace(old, new)
    open(path, "w").write(s + export)
    print("patched", path)


def read_device_counters(c, bufs, heads, export, ctype, n, calls=1):
    """Runs case ``c`` (``T.plan`` buffers ``bufs``) once to warm up, resets the instrumented
    decode module's counters through its ``export(out, reset)`` function, runs ``calls`` more
    decodes and returns the ``n`` counters (``ctype`` each) as a list."""
    import ctypes
    import torch
    import op_tests.test_mla_persistent as T
    from aiter_mla.jit import get_module
    from aiter_mla.ops import decode as dec
    o = torch.empty((c.q.shape[0], heads, 512), dtype=torch.bfloat16, device="cuda")
    T.decode_with(c, bufs, o, lse_out=False)
    torch.cuda.synchronize()
    mod = get_module("mla_decode", **dec.decode_variant(heads, c.max_seqlen_q, int(c.kv.shape[1]), c.q.dtype, c.kv.dtype))
    fn = mod.function(export, [ctypes.c_void_p, ctypes.c_int], ctypes.c_int)
    buf = (ctype * n)()
    fn(buf, 1)
    for _ in range(calls):
        T.decode_with(c, bufs, o, lse_out=False)
    torch.cuda.synchronize()
    assert fn(buf, 0) == 0
    return list(buf)


def timeline_cases(default):
    """(dtype name, heads, qlen, batch, ctx) per item of env CASES, else of ``default``
    ("fp8:128:1:64:3200,bf16:128:1:64:8192": equal-length batches, page size 64)."""
    for item in os.environ.get("CASES", default).split(","):
        dt, h, q, b, ctx = item.split(":")
        yield dt, int(h), int(q), int(b), int(ctx)


def equal_length_case(dt_name, heads, qlen, batch, ctx):
    """A timeline probe's case: ``batch`` batches of ``ctx`` tokens at page size 64 (seed 1, no
    spare pages), its ``T.plan`` buffers and the (instrumented) decode module that runs it."""
    import torch
    import op_tests.test_mla_persistent as T
    from aiter_mla.jit import get_module
    from aiter_mla.ops import decode as dec
    dt = {"fp8": torch.float8_e4m3fn, "bf16": torch.bfloat16}[dt_name]
    c = T.make_case(heads, qlen, 64, dt, [ctx] * batch, seed=1, spare_pages=0)
    return c, T.plan(c), get_module("mla_decode", **dec.decode_variant(heads, qlen, 64, dt, dt))
