"""``aiter-mla bench``: formulas against hand-computed numbers, the reference columns, the input
generators, the results schema and files, peers degrading to notes, the no-GPU exit, and
--compile-only's failure path. All CPU except the last test (a small real sweep, GPU only).
"""
from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys

import pytest
import torch

from aiter_mla.bench import commands, formulas, inputs, peers, power, reference_numbers, report, sweep
from aiter_mla.bench.timing import Timing, calls_per_graph, median
from aiter_mla.bench.variants import BuildResult, Variant, sweep_variants
from aiter_mla.cli import main

CEIL = {"copy_TBps": 4.0, "bf16_TFLOPS": 800.0, "fp8_TFLOPS": 1600.0}   # as older results: no read
CEIL_READ = {**CEIL, "read_TBps": 5.0}


# ------------------------------------------------------------------------------------------
# formulas


def test_flops_bytes_floor_hand_computed():
    # 2 requests, qlen 2, kv 100 and 50, 16 heads.
    # FLOPs = 2 * (2*100 + 2*50) * 16 * 1088 = 10,444,800
    # bytes (fp8) = KV 150*576 = 86,400 + Q 4*16*576 = 36,864 + O 4*16*512*2 = 65,536 = 188,800
    assert formulas.flops([2, 2], [100, 50], 16) == 10_444_800
    assert formulas.bytes_moved([2, 2], [100, 50], 16, "fp8", "fp8") == 188_800
    # bf16 Q and KV double the KV and Q parts: 172,800 + 73,728 + 65,536
    assert formulas.bytes_moved([2, 2], [100, 50], 16, "bf16", "bf16") == 312_064
    # floor: memory 188,800 B / 4e12 B/s = 0.0472 us; compute 10,444,800 / 1.6e15 = 0.006528 us
    assert formulas.floor_us(10_444_800, 188_800, CEIL, "fp8", "fp8") == pytest.approx(0.0472)
    # a compute-bound case picks the GEMM rate: fp8 only when both are fp8
    assert formulas.floor_us(1.6e9, 1.0, CEIL, "fp8", "fp8") == pytest.approx(1.0)
    assert formulas.floor_us(1.6e9, 1.0, CEIL, "bf16", "fp8") == pytest.approx(2.0)
    assert formulas.floor_us(1.6e9, 1.0, CEIL, "bf16", "bf16") == pytest.approx(2.0)


def test_floor_uses_read_rate_when_present_else_copy():
    """Memory term = bytes / read_TBps; results without read_TBps (docs/perf up to issue 24)
    keep bytes / copy_TBps. Compute-bound rows are unchanged."""
    n_flops, n_bytes = 10_444_800, 188_800
    # 188,800 B / 5e12 B/s = 0.03776 us (read) against 188,800 / 4e12 = 0.0472 us (copy)
    assert formulas.floor_us(n_flops, n_bytes, CEIL_READ, "fp8", "fp8") == pytest.approx(0.03776)
    assert formulas.floor_us(n_flops, n_bytes, CEIL, "fp8", "fp8") == pytest.approx(0.0472)
    assert formulas.floor_us(n_flops, n_bytes, {**CEIL, "read_TBps": None}, "fp8", "fp8") == pytest.approx(0.0472)
    assert formulas.memory_rate_tbps(CEIL_READ) == ("read_TBps", 5.0)
    assert formulas.memory_rate_tbps(CEIL) == ("copy_TBps", 4.0)
    assert formulas.floor_us(1.6e9, 1.0, CEIL_READ, "fp8", "fp8") == pytest.approx(1.0)
    m = formulas.row_metrics(0.1, n_flops, n_bytes, CEIL_READ, "fp8", "fp8")
    assert m["floor_us"] == pytest.approx(0.03776) and m["frac_floor"] == pytest.approx(0.3776)
    with pytest.raises(ValueError, match="read_TBps=0.0"):
        formulas.floor_us(1, 1, {**CEIL, "read_TBps": 0.0}, "fp8", "fp8")


def test_committed_results_without_read_rate_still_load_and_render():
    """An older committed results file (no read_TBps): it validates, renders with the copy
    floor named, and its stored floors are bytes / copy_TBps or FLOPs / GEMM rate, recomputed
    here by hand."""
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "docs" / "perf" / "results_n16_q1.json"
    doc = json.loads(path.read_text())
    assert "read_TBps" not in doc["ceilings"]
    report.validate_results(doc)
    c = doc["ceilings"]
    checked = 0
    for r in doc["rows"]:
        if r.get("error") or r.get("floor_us") is None:
            continue
        rate = c["fp8_TFLOPS"] if r["q_dtype"] == r["kv_dtype"] == "fp8" else c["bf16_TFLOPS"]
        by_hand = max(r["bytes"] / (c["copy_TBps"] * 1e12), r["flops"] / (rate * 1e12)) * 1e6
        assert r["floor_us"] == pytest.approx(by_hand, rel=1e-9)
        assert formulas.floor_us(r["flops"], r["bytes"], c, r["q_dtype"], r["kv_dtype"]) == pytest.approx(by_hand)
        checked += 1
    assert checked > 10
    md = report.render_markdown(doc)
    assert "| not measured | " in md and "Floor = max(bytes / copy bandwidth" in md
    assert "| SM MHz |" not in md   # no clock / power columns for rows that never had them
    assert report.render_stdout(doc).splitlines()[1] == (
        f"ceilings: copy {c['copy_TBps']:.2f} TB/s (r+w), bf16 {c['bf16_TFLOPS']:.0f} TFLOPS, "
        f"fp8 {c['fp8_TFLOPS']:.0f} TFLOPS")


def test_report_with_read_rate_clock_and_power(tmp_path):
    rows = synthetic_rows()
    rows[0].update(clock_mhz={"min": 1700.0, "median": 1755.0}, power_w={"median": 612.4, "max": 655.2},
                   gpu_samples=4)
    rows[1].update(clock_mhz=None, power_w=None, gpu_samples=0)
    doc = report.build_results("c", "m", {}, {**CEIL_READ, "read_error": "x"}, rows)
    assert doc["ceilings"] == {"read_TBps": 5.0, "copy_TBps": 4.0, "bf16_TFLOPS": 800.0, "fp8_TFLOPS": 1600.0}
    paths = report.write_outputs(doc, tmp_path)
    assert json.loads(paths["json"].read_text())["rows"][0]["power_w"] == {"median": 612.4, "max": 655.2}
    md = paths["md"].read_text()
    assert "| 5.00 TB/s | 4.00 TB/s | 800 TFLOPS | 1600 TFLOPS |" in md
    assert "Floor = max(bytes / read bandwidth, FLOPs / GEMM rate)" in md
    assert "| SM MHz | board W (med/max) |" in md
    assert md.count("| 1755 | 612/655 |") == 1 and "| – | – |" in md
    out = report.render_stdout(doc)
    assert "ceilings: read 5.00 TB/s, copy 4.00 TB/s (r+w), bf16 800 TFLOPS, fp8 1600 TFLOPS" in out
    header = next(line for line in out.splitlines() if line.lstrip().startswith("batch"))
    assert re.search(r"ref err\s+MHz\s+W\s", header), header
    assert any(re.search(r"\s1755\s+612/655\s", line) for line in out.splitlines())
    # a read rate that is there must be a number; a missing one is accepted
    bad = report.build_results("c", "m", {}, CEIL_READ, synthetic_rows())
    bad["ceilings"]["read_TBps"] = "fast"
    with pytest.raises(ValueError, match="read_TBps"):
        report.validate_results(bad)
    report.validate_results(report.build_results("c", "m", {}, CEIL, synthetic_rows()))


def test_row_metrics_and_seed_shape():
    # heads 128, qlen 1, batch 64, ctx 8192, fp8: the sm90 notes' fp8 floor is ~113 us with
    # 1350 TFLOPS; with 1600 here: 2*64*8192*128*1088 / 1.6e15 s
    f = formulas.flops([1] * 64, [8192] * 64, 128)
    assert f == 2 * 64 * 8192 * 128 * 1088
    b = formulas.bytes_moved([1] * 64, [8192] * 64, 128, "fp8", "fp8")
    m = formulas.row_metrics(200.0, f, b, CEIL, "fp8", "fp8")
    assert m["tflops"] == pytest.approx(f / 200e-6 / 1e12)
    assert m["tbps"] == pytest.approx(b / 200e-6 / 1e12)
    assert m["floor_us"] == pytest.approx(f / 1.6e15 * 1e6)
    assert m["frac_floor"] == pytest.approx(m["floor_us"] / 200.0)


def test_formula_errors():
    with pytest.raises(ValueError, match="one entry per request"):
        formulas.flops([1, 1], [5], 16)
    with pytest.raises(ValueError, match="q_dtype"):
        formulas.bytes_moved([1], [5], 16, "fp16", "fp8")
    with pytest.raises(ValueError, match="us must be > 0"):
        formulas.row_metrics(0.0, 1, 1, CEIL, "fp8", "fp8")


# ------------------------------------------------------------------------------------------
# reference columns


def test_seed_table_matches_shared_csv_values():
    t = reference_numbers.seed_mi355_table()
    assert len(t) == 72  # 8 batches x 9 ctx
    assert t[(64, 8192)] == {"asm_us": 151.649, "hk_prev_us": 154.495, "hk_curr_us": 132.878}
    assert t[(256, 23333)]["hk_curr_us"] == 1315.0
    assert t[(1, 21)]["hk_curr_us"] == 11.832


def test_reference_columns_only_where_shape_matches():
    """The seed's MI355 column at its own shape (128 heads, qlen 1, fp8, page 64, uniform ctx)
    only; no FlashMLA constant is kept (FlashMLA is timed in the run, as a peer)."""
    cols = reference_numbers.reference_columns(128, 1, 64, 8192, 64, "fp8", "fp8", False)
    assert cols == {"seed_mi355_us": 132.878, "seed_mi355_asm_us": 151.649,
                    "seed_mi355_hk_prev_us": 154.495}
    assert reference_numbers.reference_columns(128, 1, 64, 8192, 64, "bf16", "bf16", False) == {}
    assert reference_numbers.reference_columns(16, 1, 128, 8192, 64, "fp8", "fp8", False) == {}
    assert reference_numbers.reference_columns(128, 1, 64, 8192, 1, "fp8", "fp8", False) == {}
    assert reference_numbers.reference_columns(128, 1, 64, 8192, 64, "fp8", "fp8", True) == {}
    assert reference_numbers.reference_columns(128, 1, 7, 8192, 64, "fp8", "fp8", False) == {}
    assert not hasattr(reference_numbers, "FLASHMLA_H200_BF16_US")


# ------------------------------------------------------------------------------------------
# inputs


def test_kv_lens_uniform_and_varlen():
    assert inputs.draw_kv_lens(3, 100, 1, False, 0) == [100, 100, 100]
    a = inputs.draw_kv_lens(4000, 1000, 4, True, 7)
    assert a == inputs.draw_kv_lens(4000, 1000, 4, True, 7)  # deterministic
    assert min(a) >= 4 and max(a) <= 8000
    assert statistics.mean(a) == pytest.approx(1000, rel=0.05)
    assert statistics.median(a) < 0.8 * statistics.mean(a)  # long right tail
    with pytest.raises(ValueError, match="ctx must be >= qlen"):
        inputs.draw_kv_lens(1, 2, 4, False, 0)


def test_page_table():
    lens = [1, 64, 65, 200]
    indptr, indices, last = inputs.page_table(lens, 64, 50, seed=3)
    assert indptr.tolist() == [0, 1, 2, 4, 8]
    assert last.tolist() == [1, 64, 1, 8]
    assert indices.dtype == torch.int32 and len(set(indices.tolist())) == 8
    assert 0 <= min(indices.tolist()) and max(indices.tolist()) < 50
    with pytest.raises(ValueError, match="window_pages"):
        inputs.page_table(lens, 64, 7, seed=3)


def test_rotation_plan_defeats_l2():
    l2 = 50 << 20
    page_bytes = 64 * 576
    # tiny row: 1 page; the window scatters over >= 4 x L2 and the sets rotate over >= 2 x L2
    pool = inputs.pool_tokens_for(64, l2, 1) // 64
    r = inputs.rotation_plan(1, pool, page_bytes, l2, q_set_bytes=128 * 576)
    assert r.window_pages * page_bytes >= 4 * l2
    assert r.n_sets == inputs.MAX_SETS
    assert r.window_pages + (r.n_sets - 1) * r.shift_pages <= pool
    # large row: a single set bigger than the window minimum
    big = 93440
    r = inputs.rotation_plan(big, big, page_bytes, l2, q_set_bytes=256 * 128 * 576)
    assert (r.window_pages, r.n_sets, r.n_q_sets) == (big, 1, 1)
    # medium row: rotated footprint >= 2 x L2, Q sets capped by the budget
    need = 2000
    pool = inputs.pool_tokens_for(need * 64, l2, 1) // 64
    r = inputs.rotation_plan(need, pool, page_bytes, l2, q_set_bytes=400 << 20)
    assert r.rotated_pages * page_bytes >= 2 * l2
    assert r.n_sets == 3 and r.n_q_sets == 2  # 1 GiB budget / 400 MiB
    assert r.window_pages + (r.n_sets - 1) * r.shift_pages <= pool
    with pytest.raises(ValueError, match="smaller than one input set"):
        inputs.rotation_plan(10, 5, page_bytes, l2, 1)


def test_kv_pool_fp8_scale_and_magnitudes():
    pool, scale = inputs.make_kv_pool(5000, "fp8", "cpu", seed=1, chunk_tokens=1024)
    assert pool.dtype == torch.float8_e4m3fn and pool.shape == (5000, 576)
    real = pool.float() * scale
    # scale = amax / 448: the largest stored magnitude is exactly 448
    assert float(pool.float().abs().max()) == 448.0
    latent, rope = real[:, :512].std().item(), real[:, 512:].std().item()
    assert latent == pytest.approx(inputs.KV_LATENT_STD, rel=0.05)
    assert rope == pytest.approx(inputs.KV_ROPE_STD, rel=0.05)
    # same seed, same pool; bf16 copy holds the same real values
    pool2, scale2 = inputs.make_kv_pool(5000, "fp8", "cpu", seed=1, chunk_tokens=1024)
    assert scale2 == scale and torch.equal(pool.view(torch.uint8), pool2.view(torch.uint8))
    bf = inputs.dequantize_to_bf16(pool, scale, chunk_tokens=999)
    assert torch.allclose(bf.float(), real, rtol=2 ** -8, atol=0)
    q, qs = inputs.make_q_sets(5, 3, 16, "fp8", "cpu", seed=2, chunk_bytes=2 * 3 * 16 * 576 * 4)
    assert q.shape == (5, 3, 16, 576) and qs.shape == (5, 1)
    for i in range(5):  # every set has its own per-tensor scale: amax / 448
        assert float(q[i].float().abs().max()) == 448.0 and q[i].is_contiguous()
    assert len({float(v) for v in qs.flatten()}) == 5
    real = q[1].float() * qs[1]
    assert real[..., :512].std().item() == pytest.approx(inputs.Q_LATENT_STD, rel=0.1)
    qb, sb = inputs.make_q_sets(2, 3, 16, "bf16", "cpu", seed=2)
    assert qb.dtype == torch.bfloat16 and torch.equal(sb, torch.ones(2, 1))


def test_deepseek_sm_scale():
    assert inputs.deepseek_v3_sm_scale() == pytest.approx(192 ** -0.5 * (0.1 * math.log(40) + 1) ** 2)


# ------------------------------------------------------------------------------------------
# sweep planning


def test_default_sweep_is_the_seed_table():
    args = main_parser().parse_args(["bench"])
    assert args.kv_dtype is None   # -kvd defaults to -d (bench.commands.run)
    specs = sweep.plan_rows(args.heads_qlen, args.batch, args.ctx, args.page_size, args.dtype,
                            args.dtype, args.varlen)
    assert len(specs) == 72
    assert {(s.batch, s.ctx) for s in specs} == set(reference_numbers.seed_mi355_table())
    assert all((s.heads, s.qlen, s.page_size, s.q_dtype, s.kv_dtype) == (128, 1, 64, "fp8", "fp8")
               for s in specs)
    # every default row has a seed column
    assert all("seed_mi355_us" in s.base_row() for s in specs)
    # ctx < qlen rows are left out
    assert [s.ctx for s in sweep.plan_rows([(16, 4)], [1], [2, 4, 64], [64], "fp8", "fp8", False)] == [4, 64]
    # a value given twice counts once, at its first place (`-b 1 1` times no row twice)
    rows = sweep.plan_rows([(16, 1), (128, 1), (16, 1)], [8, 1, 8], [21, 21], [64, 64], "fp8",
                           "fp8", False)
    assert [(s.heads, s.batch, s.ctx, s.page_size) for s in rows] == [
        (16, 8, 21, 64), (16, 1, 21, 64), (128, 8, 21, 64), (128, 1, 21, 64)]


def test_max_split_per_batch_follows_aiter_test():
    assert sweep.max_split_per_batch(128, 1, 132) == 32
    assert sweep.max_split_per_batch(128, 64, 132) == 3
    assert sweep.max_split_per_batch(16, 64, 132) == 32


def test_calls_per_graph():
    assert calls_per_graph(0.1) == 64
    assert calls_per_graph(100.0) == 4
    assert calls_per_graph(5000.0) == 1
    assert median([3.0, 1.0, 2.0]) == 2.0


def test_sweep_variants_per_tile_shape():
    vs = sweep_variants([(128, 1), (16, 4), (64, 1)], [64], "fp8", "fp8")
    decode = [v.params for v in vs if v.name == "mla_decode"]
    assert [(p["block_m"], p["mask"]) for p in decode] == [(128, "none"), (64, "causal"), (64, "none")]
    # the metadata, reduce and read-ceiling modules the GPU run loads, so that a cache built by
    # --compile-only serves it under AITER_MLA_DISABLE_JIT=1
    assert [v.name for v in vs[3:]] == ["mla_metadata", "mla_reduce", "read_bandwidth"]
    assert vs[4].params == {"arch": "sm_90a", "out_dtype": "bf16"}
    assert vs[5].params == {"arch": "sm_90a"}


# ------------------------------------------------------------------------------------------
# results files


def synthetic_rows():
    rows = []
    for spec in sweep.plan_rows([(128, 1)], [1, 64], [21, 8192], [64], "fp8", "fp8", False):
        row = spec.base_row()
        us = 10.0 + spec.batch * spec.ctx / 4000
        row.update(formulas.row_metrics(us, spec.flops, spec.bytes, CEIL, "fp8", "fp8"))
        row.update(us=us, decode_us=us, metadata_us=3.0, total_us=us + 3, per_layer_us=us + 3 / 61,
                   ref_rel_err=0.012, ref_ok=True, notes=["flashinfer_fp8: RuntimeError: boom"],
                   peers={"flashinfer_bf16": 2 * us}, peer_ratio={"flashinfer_bf16": 0.5})
        rows.append(row)
    failed = sweep.plan_rows([(128, 1)], [3], [64], [64], "fp8", "fp8", False)[0].base_row()
    failed.update(error="RuntimeError: launch failed", notes=[])
    rows.append(failed)
    rows[0]["ref_rel_err"], rows[0]["ref_ok"] = float("inf"), False
    return rows


def test_results_json_schema_md_and_plots(tmp_path):
    doc = report.build_results("abc123-dirty", "NVIDIA H200 (test)", {"torch": "x"}, CEIL,
                               synthetic_rows(), notes=["flashmla: not importable (x)"],
                               jit={"variants": [{"label": "mla_decode(...)", "cold": {"cold_build_s": 12.5},
                                                  "warm": {"warm_load_ms": 3.2, "import_s": 1.1}}]},
                               config={"command": "aiter-mla bench", "timing": "graphs"})
    paths = report.write_outputs(doc, tmp_path / "out", tag="n128_q1")
    assert {p.name for p in paths.values()} == {
        "results_n128_q1.json", "results_n128_q1.md", "latency_vs_ctx_n128_q1.png",
        "frac_floor_n128_q1.png"}
    loaded = json.loads(paths["json"].read_text())
    assert list(loaded)[:5] == ["commit", "machine", "versions", "ceilings", "rows"]
    assert set(loaded["ceilings"]) == {"copy_TBps", "bf16_TFLOPS", "fp8_TFLOPS"}
    for row in loaded["rows"]:
        assert set(report.ROW_KEYS) <= set(row)
    assert loaded["rows"][0]["ref_rel_err"] is None  # inf is not JSON: null, with ref_ok false
    assert loaded["rows"][-1]["us"] is None and loaded["rows"][-1]["error"]
    for key in ("latency_png", "frac_png"):
        assert paths[key].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = paths["md"].read_text()
    assert "4.00 TB/s" in md and "800 TFLOPS" in md and "1600 TFLOPS" in md
    assert "flashmla: not importable (x)" in md
    assert "flashinfer_fp8: RuntimeError: boom (4 rows)" in md
    assert "heads 128, qlen 1, fp8, page 64, uniform ctx" in md
    assert "seed MI355 HK fp8 µs (ref)" in md and "132.9" in md  # batch 64 ctx 8192
    assert "ERROR: RuntimeError: launch failed" in md and "FAIL" in md
    assert "12.50" in md and "3.20" in md
    assert "abc123-dirty" in report.render_stdout(doc)


def test_validate_results_names_the_missing_field():
    doc = report.build_results("c", "m", {}, CEIL, synthetic_rows())
    del doc["rows"][1]["frac_floor"]
    with pytest.raises(ValueError, match="rows\\[1\\] is missing 'frac_floor'"):
        report.validate_results(doc)
    doc = report.build_results("c", "m", {}, CEIL, synthetic_rows())
    doc["rows"][1]["us"] = None
    with pytest.raises(ValueError, match="rows\\[1\\]\\['us'\\] must be a finite number"):
        report.validate_results(doc)


# ------------------------------------------------------------------------------------------
# peers


def test_missing_peer_is_a_note(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # import flashinfer -> ImportError
    monkeypatch.setitem(sys.modules, "flash_mla", None)
    found, notes = peers.discover()
    assert found == []
    assert notes[0].startswith("flashinfer: not importable (ModuleNotFoundError: import of flashinfer")
    assert notes[1].startswith("flashmla: not importable (")

    class Broken:
        name = "broken"

        @classmethod
        def load(cls):
            raise RuntimeError("CUDA driver too old\nsecond line")

    found, notes = peers.discover((Broken,))
    assert found == [] and notes == ["broken: not importable (RuntimeError: CUDA driver too old)"]


class _FakeRow:
    rotation = inputs.Rotation(needed_pages=1, window_pages=4, shift_pages=1, n_sets=3, n_q_sets=1)
    kv_dtype = "fp8"


class _FakePeer:
    def __init__(self, name, fail_setup=False):
        self.name, self.fail_setup, self.calls = name, fail_setup, []

    def kinds(self, row):
        return ["bf16", "fp8"], ([f"{self.name}: fp8 skipped"] if self.fail_setup else [])

    def setup(self, row, kind):
        if self.fail_setup and kind == "bf16":
            raise RuntimeError("plan failed: unsupported page size")
        out = torch.ones(2, 4, 512, dtype=torch.float64)
        return peers.PeerRun(lambda s: self.calls.append(s), lambda: out)


def test_failing_peer_in_a_row_is_a_note_not_a_crash():
    row = {"notes": [], "peers": {}}
    good, bad = _FakePeer("good"), _FakePeer("bad", fail_setup=True)
    ref = torch.ones(2, 4, 512, dtype=torch.float64) * 1.01

    def timer(fns, per_sample):
        for fn in fns:
            fn()
        return Timing(8.0, 10, per_sample, "graph")

    sweep.measure_peers([bad, good], _FakeRow(), ref, 2, 4.0, row, timer=timer, sync=lambda: None)
    assert row["peers"] == {"bad_fp8": 8.0, "good_bf16": 8.0, "good_fp8": 8.0}
    assert row["peer_ratio"] == {"bad_fp8": 0.5, "good_bf16": 0.5, "good_fp8": 0.5}
    assert row["peer_ref_rel_err"]["good_bf16"] == pytest.approx(0.01 / 1.01)
    assert "bad_bf16: RuntimeError: plan failed: unsupported page size" in row["notes"]
    assert "bad: fp8 skipped" in row["notes"]
    # each timed peer visited every input set: 3 sets in whole graphs of 2 -> 4 calls (+1 check)
    assert good.calls[:5] == [0, 0, 1, 2, 0]


class _FakeSampler:
    """A power.Sampler stand-in: each stop() reports the next clock."""
    source = "fake"

    def __init__(self, clocks):
        self.clocks = list(clocks)

    def start(self):
        pass

    def stop(self):
        c = self.clocks.pop(0)
        return power.summarize([(c, 600.0), (c + 10.0, 650.0), (c - 10.0, 700.0)])


def test_peer_clock_is_sampled_and_shown_beside_its_ratio():
    """At the power cap the clock moves between our timing and the peer's: each peer column
    gets the median SM clock sampled while it was timed, in the row and in the tables."""
    row = {"notes": [], "peers": {}}
    good = _FakePeer("good")

    def timer(fns, per_sample):
        for fn in fns:
            fn()
        return Timing(8.0, 10, per_sample, "graph")

    sweep.measure_peers([good], _FakeRow(), None, 2, 4.0, row, timer=timer, sync=lambda: None,
                        sampler=_FakeSampler([1500.0, 1900.0]))
    assert row["peer_clock_mhz"] == {"good_bf16": 1500.0, "good_fp8": 1900.0}
    rows = synthetic_rows()
    rows[0].update(peers={"good_bf16": 8.0}, peer_ratio={"good_bf16": 0.5},
                   peer_clock_mhz={"good_bf16": 1500.0})
    headers, cells = report._table(rows)
    i = headers.index("good_bf16 MHz")
    assert headers[i - 2:i] == ["good_bf16 µs", "ours/good_bf16"]
    # rows without a peer clock show "–" (a failed row's cells are blank)
    assert cells[0][i] == "1500" and all(c[i] in ("–", "") for c in cells[1:]), [c[i] for c in cells]
    assert "–" in [c[i] for c in cells[1:]]
    no_clock = synthetic_rows()
    no_clock[0].update(peers={"good_bf16": 8.0}, peer_ratio={"good_bf16": 0.5})
    assert "good_bf16 MHz" not in report._table(no_clock)[0]   # no sampler: no column


# ------------------------------------------------------------------------------------------
# command line


def main_parser():
    from aiter_mla.cli import build_parser

    return build_parser()


def test_no_gpu_exits_2_with_one_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    rc = main(["bench", "-o", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1
    assert err[0].startswith("aiter-mla bench: error: no CUDA GPU visible (")   # argparse's form
    assert err[0].endswith("); use --compile-only to build the variants")
    assert not (tmp_path / "r").exists()


def test_unsupported_shape_is_named_before_the_gpu_check(monkeypatch, capsys, tmp_path):
    """-n 129,1 without a GPU said only "no CUDA GPU visible" (--compile-only named the shape): the
    shape is an argument error, named first (fresh-user trial)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    rc = main(["bench", "-n", "129,1", "-o", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert rc == 2
    assert "(num_heads, max_seqlen_q) = (129, 1)" in err and "no CUDA GPU" not in err


def test_bad_flags_are_rejected(capsys):
    for argv in (["bench", "-n", "128"], ["bench", "--page-size", "48"], ["bench", "-b", "0"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
    assert "power of two" in capsys.readouterr().err


def test_command_line_round_trips():
    args = main_parser().parse_args(["bench", "-n", "16,1", "64,1", "-b", "1", "2", "--varlen",
                                     "-o", "docs/perf", "--tag", "x"])
    cmd = commands.command_line(args)
    assert cmd == ("aiter-mla bench -n 16,1 64,1 -b 1 2 -c 21 64 256 512 1200 3200 5200 8192 23333 "
                   "--page-size 64 -d fp8 --varlen -o docs/perf --tag x")
    again = main_parser().parse_args(cmd.split()[1:])
    assert vars(again) == vars(args)


def test_compile_only_reports_a_missing_template(monkeypatch, capsys):
    from aiter_mla.bench import variants

    def fake_build(vs, jobs, progress=True):
        return [BuildResult(v, 0.5, "" if v.name != "mla_decode" else
                            "template 'mla_decode.cu.j2' does not exist (TemplateNotFound)")
                for v in vs]

    monkeypatch.setattr(variants, "build_variants", fake_build)
    rc = main(["bench", "--compile-only", "-n", "128,1", "--no-progress"])
    out, err = capsys.readouterr()
    assert rc == 1
    assert "mla_decode(arch=sm_90a, block_m=128" in out and "FAILED" in out
    # the table gives the error; stderr does not repeat it (it printed each failure twice)
    assert "does not exist (TemplateNotFound)" in out
    assert "TemplateNotFound" not in err and "1 of 4 variants failed" in err


def test_compile_only_prints_a_failed_builds_compiler_output_once(monkeypatch, capsys):
    from aiter_mla.bench import variants

    def fake_build(vs, jobs, progress=True):
        return [BuildResult(v, 0.5, "" if v.name != "mla_reduce" else "BuildError: nvcc failed (rc 2)",
                            [] if v.name != "mla_reduce" else ["x.cu(3): error: bad line"]) for v in vs]

    monkeypatch.setattr(variants, "build_variants", fake_build)
    assert main(["bench", "--compile-only", "-n", "128,1", "--no-progress"]) == 1
    out, err = capsys.readouterr()
    assert out.count("BuildError: nvcc failed (rc 2)") == 1
    assert err.count("x.cu(3): error: bad line") == 1 and "1 of 4 variants failed" in err


def test_compile_only_builds_one_decode_variant_per_tile_shape(tmp_path):
    """The main job's JIT half runs everywhere (CI has nvcc, no GPU): a real, cold build of the
    128-row (m16x8) and 64-row (m16x4) decode variants plus metadata, reduce and the read
    ceiling's module."""
    import os
    import subprocess

    from aiter_mla.jit.toolchain import ToolchainError, find_compiler

    try:
        find_compiler("sm_90a", None)
    except ToolchainError as exc:
        pytest.skip(f"nvcc not available: {exc}")
    env = dict(os.environ, AITER_MLA_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run(
        [sys.executable, "-m", "aiter_mla", "bench", "--compile-only", "-n", "128,1", "64,1",
         "--no-progress", "-j", "2"], capture_output=True, text=True, env=env, timeout=1200)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "block_m=128" in proc.stdout and "block_m=64" in proc.stdout, proc.stdout
    metas = list((tmp_path / "cache").rglob("meta.json"))
    modules = sorted(json.loads(m.read_text())["module"] for m in metas)
    assert modules.count("mla_decode") == 2, modules
    assert "mla_metadata" in modules and "mla_reduce" in modules, modules
    assert "read_bandwidth" in modules, modules   # the GPU run's read ceiling loads it


def test_compile_only_unsupported_shape(capsys):
    # an argument error: exit 2, as for a bad size (it was 1)
    assert main(["bench", "--compile-only", "-n", "129,1", "--no-progress"]) == 2
    assert "(129, 1) is not supported" in capsys.readouterr().err


def test_build_variants_turns_exceptions_into_results(monkeypatch):
    import aiter_mla.jit as jit
    from aiter_mla.bench import variants

    def fake_get_module(name, **params):
        if name == "mla_reduce":
            raise RuntimeError("nvcc failed\nerror: line 1\nerror: line 2")
        return object()

    monkeypatch.setattr(jit, "get_module", fake_get_module)
    vs = [Variant("mla_metadata", {"arch": "sm_90a"}), Variant("mla_reduce", {"arch": "sm_90a"})]
    res = variants.build_variants(vs, jobs=2, progress=False)
    assert [r.ok for r in res] == [True, False]
    assert res[1].error == "RuntimeError: nvcc failed" and res[1].detail == ["error: line 1", "error: line 2"]


# ------------------------------------------------------------------------------------------
# GPU: a small real sweep end to end


@pytest.mark.gpu
def test_small_sweep_on_gpu(tmp_path):
    rc = main(["bench", "-b", "1", "16", "-c", "64", "1200", "-o", str(tmp_path), "--tag", "t",
               "--no-jit-figures", "--no-progress"])
    doc = json.loads((tmp_path / "results_t.json").read_text())
    assert rc == 0, [r.get("error") or r.get("ref_rel_err") for r in doc["rows"]]
    assert len(doc["rows"]) == 4
    assert doc["ceilings"]["read_TBps"] > 1.0   # the floor's memory term (H200: ~4.3-4.8)
    sampled = doc["config"]["gpu_sampling"]["source"] is not None
    for row in doc["rows"]:
        if sampled:
            assert 500 < row["clock_mhz"]["median"] < 3000 and row["power_w"]["max"] > 0
        assert row["us"] > 0 and 0 < row["frac_floor"] <= 1.0
        assert row["ref_ok"] and row["ref_rel_err"] < sweep.CHECK_TOL["fp8"]
        assert row["metadata_us"] > 0 and row["per_layer_us"] < row["total_us"]


def test_row_inputs_plan_and_reference_slice_on_cpu(monkeypatch):
    """The GPU row path's host half on CPU tensors: rotated windows, bf16 copies for peers, the
    plan (CPU reference scheduler) and the reference slice equal to the full-batch reference."""
    from aiter_mla.reference import mla_decode_ref

    monkeypatch.setenv("CU_NUM", "132")
    spec = sweep.plan_rows([(16, 2)], [3], [300], [16], "fp8", "fp8", True, seed=5)[0]
    l2 = 1 << 20
    pool = sweep.KVPool(inputs.pool_tokens_for(sweep.max_needed_tokens([spec]), l2, 1), "fp8",
                        "cpu", seed=1)
    ctx = sweep.SweepContext("cpu", pool, CEIL, l2, 132, [])
    ri = sweep.make_row_inputs(spec, ctx)
    rot = ri.rotation
    assert rot.n_sets > 1 and rot.window_pages * 16 * 576 >= 4 * l2
    w0, w1 = ri.kv_window(0, "fp8"), ri.kv_window(1, "fp8")
    assert w0.shape == (rot.window_pages, 16, 1, 576) and w0.is_contiguous()
    assert w1.data_ptr() - w0.data_ptr() == rot.shift_pages * 16 * 576
    assert int(ri.kv_indices.max()) < rot.window_pages
    assert ri.kv_len_arr.tolist() == spec.kv_lens
    # peers' bf16 copies hold the same real values
    real_q = ri.q_sets[0].float() * ri.q_scales[0]
    assert torch.allclose(ri.q(0, "bf16").float(), real_q, rtol=2 ** -8, atol=0)
    assert torch.allclose(ri.kv_window(1, "bf16").float(), w1.float() * pool.scale, rtol=2 ** -8, atol=0)

    plan = sweep._Plan(ri, sweep.max_split_per_batch(16, 3, 132))
    plan.metadata()
    assert int(plan.work_indptr[-1]) >= spec.batch  # every batch got at least one work

    ref = sweep._reference(ri)
    full, _ = mla_decode_ref(ri.q_sets[0], w0, ri.qo_indptr, ri.kv_indptr, ri.kv_indices,
                             ri.kv_last_page_lens, sm_scale=ri.sm_scale, q_scale=ri.q_scales[0],
                             kv_scale=pool.scale)
    assert ref.shape == (2 * 2, 16, 512)
    # the same rows of the same reference: torch.equal failed about 1 run in 5 on the 2-core CPU
    # box with differences up to 2e-6 relative (cause not found; wrong rows would differ by O(1))
    assert torch.isfinite(ref).all()
    torch.testing.assert_close(ref, full[:4], rtol=1e-5, atol=1e-7)


def test_sweep_orchestration_on_cpu_with_a_stand_in_op(monkeypatch, tmp_path):
    """run_sweep -> rows -> report on CPU, with the GPU-only pieces replaced: the decode op by
    the float64 reference (so the spot check must pass), CUDA-graph timing by fixed numbers per
    call kind, CUDA syncs by no-ops. A row whose op raises records the error; the rest go on."""
    from aiter_mla.ops import decode as decode_ops
    from aiter_mla.ops import metadata as md_ops
    from aiter_mla.reference import mla_decode_ref

    monkeypatch.setenv("CU_NUM", "132")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)

    def stand_in(q, kv, o, qo, kvp, kvi, last, max_seqlen_q, *, page_size, sm_scale, q_scale,
                 kv_scale, work_info_set, **_):
        assert md_ops.lookup_plan(work_info_set) is not None  # planned before every call
        if kvp.numel() - 1 == 3:
            raise RuntimeError("launch failed: stand-in error")
        out, _ = mla_decode_ref(q, kv, qo, kvp, kvi, last, sm_scale=sm_scale, q_scale=q_scale,
                                kv_scale=kv_scale)
        o.copy_(out)

    monkeypatch.setattr(decode_ops, "mla_decode_fwd", stand_in)

    def timer(fns, per_sample, **_):
        func = getattr(fns[0], "func", None)
        for fn in fns[:2]:
            fn()
        if func is md_ops.get_mla_metadata_v1:
            return Timing(2.0, 10, per_sample, "graph")
        name = getattr(func, "__name__", "")
        return Timing({"decode": 20.0, "step": 15.0}.get(name, 40.0), 10, per_sample, "graph")

    monkeypatch.setattr(sweep, "time_calls", timer)

    class ZeroPeer:
        name, version = "zero", "0"

        def kinds(self, row):
            return ["bf16"], []

        def setup(self, row, kind):
            out = torch.zeros(row.total_q, row.heads, 512)
            return peers.PeerRun(lambda s: None, lambda: out)

    class CannedSampler:   # what power.Sampler.stop() would summarise, around the decode timing only
        source = "canned"

        def __init__(self):
            self.windows, self.open = [], False

        def start(self):
            assert not self.open
            self.open = True

        def stop(self):
            self.open = False
            self.windows.append(len(self.windows))
            return power.summarize([(1980.0, 400.0), (1755.0, 610.0), (1830.0, 500.0)])

    specs = sweep.plan_rows([(16, 1)], [1, 3, 4], [40, 100], [16], "bf16", "bf16", False)
    l2 = 1 << 20
    pool = sweep.KVPool(inputs.pool_tokens_for(sweep.max_needed_tokens(specs), l2, 2), "bf16",
                        "cpu", seed=1)
    sampler = CannedSampler()
    ctx = sweep.SweepContext("cpu", pool, CEIL_READ, l2, 132, [ZeroPeer()], sampler=sampler)
    rows = sweep.run_sweep(specs, ctx, progress=False)
    assert len(rows) == 6
    # two windows per row that was timed: our decode's, then the peer's
    assert len(sampler.windows) == 8 and not sampler.open
    for row in rows:
        if row["batch"] == 3:
            assert row["error"] == "RuntimeError: launch failed: stand-in error" and row["us"] is None
            continue
        assert "error" not in row, row.get("error")
        assert row["us"] == 20.0 and row["metadata_us"] == 2.0
        assert row["per_layer_us"] == pytest.approx(20.0 + 2.0 / 61)
        # tiny rows (floor < STEP_MAX_FLOOR_US) also time the whole step in one graph
        assert row["floor_us"] < sweep.STEP_MAX_FLOOR_US and row["step_us"] == 15.0
        assert row["ref_ok"] and row["ref_rel_err"] < 4e-3  # bf16 rounding of the output only
        assert row["peers"] == {"zero_bf16": 40.0} and row["peer_ratio"] == {"zero_bf16": 0.5}
        assert row["peer_clock_mhz"] == {"zero_bf16": 1830.0}
        assert row["peer_ref_rel_err"]["zero_bf16"] == pytest.approx(1.0)
        assert row["frac_floor"] == pytest.approx(row["floor_us"] / 20.0)
        assert row["max_split_per_batch"] == 32
        assert row["clock_mhz"] == {"min": 1755.0, "median": 1830.0}
        assert row["power_w"] == {"median": 500.0, "max": 610.0} and row["gpu_samples"] == 3
        # floor from the read rate, 5 TB/s, and the bf16 GEMM rate, computed by hand
        by_hand = max(row["bytes"] / 5e12, row["flops"] / 800e12) * 1e6
        assert row["floor_us"] == pytest.approx(by_hand)
    doc = report.build_results("c", "cpu stand-in", {}, CEIL_READ, rows)
    paths = report.write_outputs(doc, tmp_path)
    assert json.loads(paths["json"].read_text())["rows"][2]["error"].startswith("RuntimeError")
    md_text = paths["md"].read_text()
    assert "| step µs |" in md_text and "| 15.0 |" in md_text
    assert "| 1830 | 500/610 |" in md_text


def test_bad_arguments_exit_2_before_building(monkeypatch, capsys):
    """A bad dtype pair, size or tag exits 2 before building anything."""
    from aiter_mla.bench import commands

    built = []
    monkeypatch.setattr(commands, "compile_only", lambda args, variants: built.append(args) or 0)
    parser = argparse.ArgumentParser()
    commands.add_arguments(parser)
    for argv, needle in [(["-d", "bf16", "-kvd", "fp8"], "-d bf16 with -kvd fp8: the kernels take Q and KV of one dtype"),
                         (["-kvd", "bf16"], "give -d and -kvd the same value"),
                         (["-b", "1", "-c", "1000000000", "--varlen"], "--varlen draws up to 8 x ctx"),
                         (["-b", "1", "-c", "3000000000"], "a request must have < 2**31 KV tokens"),
                         (["-b", "1000000000", "-c", "21", "--page-size", "1"], "up to 21000000000 KV pages"),
                         # the results are written after the sweep: a bad tag is refused first
                         (["--tag", "a/b"], "--tag 'a/b': it becomes part of file names"),
                         # a tag whose plot name passes 255 bytes (fresh-user report: accepted,
                         # then the results could not be written)
                         (["--tag", "x" * 240], "--tag: 240 bytes make the file name latency_vs_ctx_xxxxxxxxx... "
                                                "259 bytes long, over the 255")]:
        assert commands.run(parser.parse_args(["--compile-only", *argv])) == 2
        assert needle in capsys.readouterr().err
    assert built == []
    # -kvd defaults to -d: "-d bf16" alone is bf16 Q and KV (it was refused as bf16 Q, fp8 KV)
    assert commands.run(parser.parse_args(["--compile-only", "-d", "bf16"])) == 0
    assert built[-1].kv_dtype == "bf16"
    # so is an -o that cannot be made, but only for a sweep: --compile-only writes nothing there
    monkeypatch.setattr(commands, "compile_only", lambda args, variants: 0)
    assert commands.run(parser.parse_args(["--compile-only", "-o", "/proc/version/x"])) == 0
    assert commands.run(parser.parse_args(["-o", "/proc/version/x"])) == 2
    assert "-o /proc/version/x: /proc/version exists and is not a folder" in capsys.readouterr().err
    assert commands._tag_message(parser.parse_args(["--tag", "h200+pdl run.1"])) is None   # any other name part
    assert commands._tag_message(parser.parse_args(["--tag", "x" * 236])) is None   # 255 bytes: fits


def test_bench_jobs_default_to_max_jobs(monkeypatch, capsys):
    """MAX_JOBS sets bench's parallel builds when -j is not given, as for jit build (bench
    checked MAX_JOBS but ignored it); -j still wins."""
    from aiter_mla.bench import commands

    seen = []
    monkeypatch.setattr(commands, "compile_only", lambda args, variants: seen.append(args.jobs) or 0)
    parser = argparse.ArgumentParser()
    commands.add_arguments(parser)
    monkeypatch.setenv("MAX_JOBS", "3")
    assert commands.run(parser.parse_args(["--compile-only"])) == 0
    assert commands.run(parser.parse_args(["--compile-only", "-j", "5"])) == 0
    monkeypatch.setenv("MAX_JOBS", "0")
    assert commands.run(parser.parse_args(["--compile-only"])) == 0
    import os
    assert seen == [3, 5, min(8, os.cpu_count() or 1)]


def test_repeated_list_flags_add_up():
    """-n 128,1 -n 16,1 benchmarked only (16,1): the second use replaced the first, silently."""
    p = argparse.ArgumentParser()
    commands.add_arguments(p)
    a = p.parse_args(["-n", "128,1", "-n", "16,1", "-b", "1", "-b", "2", "3", "-c", "21", "--page-size", "1",
                      "--page-size", "64"])
    assert a.heads_qlen == [(128, 1), (16, 1)] and a.batch == [1, 2, 3] and a.ctx == [21]
    assert a.page_size == [1, 64]
    d = p.parse_args([])   # the defaults stay as they were, not extended by the earlier parse
    assert d.heads_qlen == [(128, 1)] and d.batch == [1, 3, 5, 16, 32, 64, 128, 256] and d.page_size == [64]


# ------------------------------------------------------------------------------------------
# the commit a result records


def _git(cwd, *args):
    import subprocess
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


needs_git = pytest.mark.skipif(__import__("shutil").which("git") is None, reason="needs git on PATH")


@needs_git
def test_commit_is_unknown_when_the_package_sits_inside_another_repository(tmp_path, monkeypatch):
    """An installed wheel's site-packages may lie inside an unrelated git repository: its HEAD
    is not the code measured."""
    from aiter_mla import paths

    other = tmp_path / "project"
    (other / ".venv" / "site-packages").mkdir(parents=True)
    _git(other, "init", "-q")
    (other / "f.txt").write_text("x")
    _git(other, "add", "f.txt")
    _git(other, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    assert _git(other, "rev-parse", "HEAD")   # a real commit that must not be reported
    monkeypatch.setattr(paths, "REPO_ROOT", other / ".venv" / "site-packages")
    assert paths.checkout_commit() == "unknown"
    # the repository's own top level is reported, with -dirty for an untracked file
    monkeypatch.setattr(paths, "REPO_ROOT", other)
    head = _git(other, "rev-parse", "HEAD")
    assert paths.checkout_commit() == head
    (other / "new.txt").write_text("y")
    assert paths.checkout_commit() == head + "-dirty"
    # ... except inside the excluded output folder
    (other / "new.txt").unlink()
    (other / "out").mkdir()
    (other / "out" / "r.json").write_text("{}")
    assert paths.checkout_commit(exclude=other / "out") == head
    assert paths.checkout_commit() == head + "-dirty"


@needs_git
def test_commit_outside_any_repository_or_in_a_subfolder_of_one_is_unknown(tmp_path, monkeypatch):
    """No repository at all; and REPO_ROOT a tracked subfolder of a repository (a package
    vendored into another project): neither is this package's checkout."""
    from aiter_mla import paths

    monkeypatch.setattr(paths, "REPO_ROOT", tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert paths.checkout_commit() == "unknown"
    repo = tmp_path / "vendoring"
    (repo / "third_party" / "aiter_mla").mkdir(parents=True)
    (repo / "third_party" / "aiter_mla" / "pyproject.toml").write_text("[project]\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    monkeypatch.setattr(paths, "REPO_ROOT", repo / "third_party" / "aiter_mla")
    assert paths.checkout_commit() == "unknown"


@needs_git
def test_commit_of_a_checkout_whose_path_is_not_utf8(tmp_path, monkeypatch):
    """git prints the top level's path: bytes that are not UTF-8 must not raise (the bench
    records the commit after its sweep)."""
    import os

    from aiter_mla import paths

    raw = os.fsencode(str(tmp_path)) + b"/r\xff"
    try:
        os.mkdir(raw)
    except (OSError, UnicodeError):
        pytest.skip("this file system takes only UTF-8 names")
    repo = __import__("pathlib").Path(os.fsdecode(raw))
    _git(repo, "init", "-q")
    (repo / "f").write_text("x")
    _git(repo, "add", "f")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    monkeypatch.setattr(paths, "REPO_ROOT", repo)
    assert paths.checkout_commit() == _git(repo, "rev-parse", "HEAD")
