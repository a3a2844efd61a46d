"""The bench's outputs: ``results.json`` (docs/DESIGN.md §6.3), ``results.md``, the stdout table.

Pure Python; works on synthetic rows (tests) as on measured ones. File names take an optional
tag (``results_<tag>.json``) so several sweeps can share one folder (``docs/perf/``).
"""
from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

from . import formulas, reference_numbers

#: Keys docs/DESIGN.md §6.3 fixes; extra keys are allowed beside them.
TOP_KEYS = ("commit", "machine", "versions", "ceilings", "rows")
CEILING_KEYS = ("read_TBps", "copy_TBps", "bf16_TFLOPS", "fp8_TFLOPS")
#: Ceilings that older results lack (``read_TBps``: before issue 25, their floor is from
#: ``copy_TBps``, see :func:`aiter_mla.bench.formulas.memory_rate_tbps`); still numbers if there.
OPTIONAL_CEILING_KEYS = ("read_TBps",)
ROW_KEYS = ("heads", "qlen", "batch", "ctx", "page_size", "dtype", "varlen", "us", "tflops",
            "tbps", "frac_floor", "peers")


def build_results(commit: str, machine: str, versions: dict, ceilings: dict, rows: list[dict],
                  **extra) -> dict:
    """The results document: the keys of docs/DESIGN.md §6.3 first, then ``extra`` (config,
    notes, jit, ...). ``ceilings`` keeps :data:`CEILING_KEYS` only; KeyError if one that is
    not optional is missing."""
    kept = {k: ceilings[k] for k in CEILING_KEYS
            if k not in OPTIONAL_CEILING_KEYS or ceilings.get(k) is not None}
    doc = {"commit": commit, "machine": machine, "versions": versions, "ceilings": kept, "rows": rows}
    doc.update(extra)
    return doc


def validate_results(doc: dict) -> None:
    """Raise ValueError naming the first missing or mistyped docs/DESIGN.md §6.3 field.

    A row that failed (``"error"`` set) may have ``us`` etc. as None; every other row needs
    numbers. Ceilings of :data:`OPTIONAL_CEILING_KEYS` may be missing (older results).
    """
    for k in TOP_KEYS:
        if k not in doc:
            raise ValueError(f"results is missing top-level key {k!r}")
    for k in CEILING_KEYS:
        if k in OPTIONAL_CEILING_KEYS and k not in doc["ceilings"]:
            continue
        if not isinstance(doc["ceilings"].get(k), (int, float)):
            raise ValueError(f"ceilings[{k!r}] must be a number, got {doc['ceilings'].get(k)!r}")
    if not isinstance(doc["rows"], list):
        raise ValueError("rows must be a list")
    for i, row in enumerate(doc["rows"]):
        for k in ROW_KEYS:
            if k not in row:
                raise ValueError(f"rows[{i}] is missing {k!r}")
        if not isinstance(row["peers"], dict):
            raise ValueError(f"rows[{i}]['peers'] must be a dict of name -> us")
        if row.get("error"):
            continue
        for k in ("us", "tflops", "tbps", "frac_floor"):
            if not isinstance(row[k], (int, float)) or not math.isfinite(row[k]):
                raise ValueError(f"rows[{i}][{k!r}] must be a finite number, got {row[k]!r}")


def file_names(tag: str = "") -> dict[str, str]:
    """Output file names for a tag: json, md, latency plot, fraction-of-floor heat map."""
    sfx = f"_{tag}" if tag else ""
    return {"json": f"results{sfx}.json", "md": f"results{sfx}.md",
            "latency_png": f"latency_vs_ctx{sfx}.png", "frac_png": f"frac_floor{sfx}.png"}


def group_key(row: dict) -> tuple:
    """A row's table: (heads, qlen, dtype, page_size, varlen)."""
    return (row["heads"], row["qlen"], row["dtype"], row["page_size"], row["varlen"])


def group_title(key: tuple) -> str:
    """Heading of a group's table and plot panel."""
    heads, qlen, dtype, page, varlen = key
    return (f"heads {heads}, qlen {qlen}, {dtype}, page {page}, "
            f"{'varlen (log-normal) ctx' if varlen else 'uniform ctx'}")


def groups(rows: list[dict]) -> dict[tuple, list[dict]]:
    """Rows by (heads, qlen, dtype, page_size, varlen), in first-seen order."""
    out: dict[tuple, list[dict]] = {}
    for row in rows:
        out.setdefault(group_key(row), []).append(row)
    return out


def _f(v, digits: int = 1) -> str:
    if v is None:
        return "–"
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return f"{v:.{digits}f}"


def _err(v) -> str:
    return "–" if v is None else f"{v:.1e}"


def _table(rows: list[dict], short: bool = False) -> tuple[list[str], list[list[str]]]:
    """Headers and cells of one group's table (peer and reference columns only if present).

    ``short``: terse headers for the terminal, where failed rows are listed below the table.
    """
    peer_cols = list(dict.fromkeys(c for r in rows for c in r.get("peers", {})))
    has_seed = any("seed_mi355_us" in r for r in rows)
    varlen = any(r["varlen"] for r in rows)
    has_step = any("step_us" in r for r in rows)
    has_gpu = any("clock_mhz" in r or "power_w" in r for r in rows)
    if short:
        names = ["meta µs", "dec+red µs", "layer µs", "total µs", "TFLOPS", "TB/s", "floor µs",
                 "frac", "ref err"]
    else:
        names = ["metadata µs", "decode+reduce µs", "per-layer µs", "total µs", "TFLOPS", "TB/s",
                 "floor µs", "frac floor", "ref rel-L2"]
    if has_step:   # after "total": the same step chained in one graph
        names.insert(names.index("total µs") + 1, "step µs")
    if has_gpu:    # while the decode was timed: median SM clock, median/max board power
        names += ["MHz", "W"] if short else ["SM MHz", "board W (med/max)"]
    headers = ["batch", "ctx"] + (["Σkv", "max kv"] if varlen else []) + names
    peer_mhz = {c for r in rows for c in r.get("peer_clock_mhz", {})}
    for c in peer_cols:
        headers += [f"{c} µs", f"ours/{c}"] + ([f"{c} MHz"] if c in peer_mhz else [])
    if has_seed:
        headers.append("MI355 µs (ref)" if short else f"{reference_numbers.SEED_MI355_LABEL} µs (ref)")
    cells = []
    for r in rows:
        line = [str(r["batch"]), str(r["ctx"])]
        if varlen:
            line += [str(r.get("kv_len_sum", "")), str(r.get("kv_len_max", ""))]
        if r.get("error"):
            if not short:
                line += [f"ERROR: {r['error']}"] + [""] * (len(headers) - len(line) - 1)
                cells.append(line)
            continue
        ref = _err(r.get("ref_rel_err"))
        if r.get("ref_ok") is False:
            ref += " FAIL"
        line += [_f(r.get("metadata_us")), _f(r["us"]), _f(r.get("per_layer_us")), _f(r.get("total_us"))]
        if has_step:
            line.append(_f(r.get("step_us")))
        line += [_f(r["tflops"], 0), _f(r["tbps"], 2), _f(r.get("floor_us")), _f(r["frac_floor"], 2), ref]
        if has_gpu:
            clock, watts = r.get("clock_mhz"), r.get("power_w")
            line += [_f(clock["median"], 0) if clock else "–",
                     f"{watts['median']:.0f}/{watts['max']:.0f}" if watts else "–"]
        for c in peer_cols:
            line += [_f(r["peers"].get(c)), _f(r.get("peer_ratio", {}).get(c), 2)]
            if c in peer_mhz:   # the SM clock while the peer was timed (median)
                line.append(_f(r.get("peer_clock_mhz", {}).get(c), 0))
        if has_seed:
            line.append(_f(r.get("seed_mi355_us")))
        cells.append(line)
    return headers, cells


def markdown_table(rows: list[dict]) -> str:
    """One group's rows as a markdown table (failed rows show their error)."""
    headers, cells = _table(rows)
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(c) + " |" for c in cells]
    return "\n".join(out)


def text_table(rows: list[dict]) -> str:
    """Aligned plain text; failed rows follow the table, one line each."""
    headers, cells = _table(rows, short=True)
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(headers)]
    fmt = "  ".join(f"{{:>{w}}}" for w in widths)
    out = [fmt.format(*headers)] + [fmt.format(*c) for c in cells]
    out += [f"batch {r['batch']} ctx {r['ctx']}: ERROR: {r['error']}" for r in rows if r.get("error")]
    return "\n".join(out)


def collect_notes(doc: dict) -> list[str]:
    """Run-level notes, then each distinct row note with how many rows it applies to."""
    notes = list(doc.get("notes", []))
    counts = Counter(n for r in doc["rows"] for n in r.get("notes", []))
    notes += [f"{n} ({c} row{'s' if c > 1 else ''})" for n, c in counts.items()]
    return notes


def _ceilings_lines(c: dict) -> list[str]:
    read = f"{c['read_TBps']:.2f} TB/s" if c.get("read_TBps") is not None else "not measured"
    return ["| read only (`read_bandwidth` kernel) | device copy (read + write) | bf16 GEMM 8192³ "
            "| fp8 GEMM 8192³ (`torch._scaled_mm`) |",
            "|---|---|---|---|",
            f"| {read} | {c['copy_TBps']:.2f} TB/s | {c['bf16_TFLOPS']:.0f} TFLOPS "
            f"| {c['fp8_TFLOPS']:.0f} TFLOPS |"]


def _floor_text(c: dict) -> str:
    """How the floor's memory term was formed: the read rate, or the copy rate for results
    without one (:func:`aiter_mla.bench.formulas.memory_rate_tbps`)."""
    if formulas.memory_rate_tbps(c)[0] == "read_TBps":
        return ("Floor = max(bytes / read bandwidth, FLOPs / GEMM rate), the read bandwidth from a "
                "kernel that only reads, as decode reads its KV (16-byte non-caching loads, 8 in "
                "flight per thread, over 2 GiB; the copy figure counts its writes too, and a "
                "decode kernel outran it and `torch.sum`)")
    return ("Floor = max(bytes / copy bandwidth, FLOPs / GEMM rate) (no read-only figure in "
            "these results)")


def _jit_lines(jit: dict) -> list[str]:
    lines = []
    variants = jit.get("variants", [])
    if variants:
        lines += ["| variant | cold build s (fresh cache, new process) | warm load ms (new process, "
                  "after import) | `import aiter_mla, aiter_mla.jit` s |", "|---|---|---|---|"]
        for v in variants:
            cold, warm = v.get("cold", {}), v.get("warm", {})
            cold_s = f"error: {cold['error']}" if "error" in cold else _f(cold.get("cold_build_s"), 2)
            if cold.get("not_cold"):
                cold_s += " (not cold: " + cold["not_cold"] + ")"
            warm_s = f"error: {warm['error']}" if "error" in warm else _f(warm.get("warm_load_ms"), 2)
            lines.append(f"| `{v['label']}` | {cold_s} | {warm_s} | {_f(warm.get('import_s'), 2)} |")
    d = jit.get("dispatch")
    if d:
        if "error" in d:
            lines.append(f"\nHost time per call: not measured ({d['error']}).")
        else:
            lines.append("\n" + host_time_text(d))
    for n in jit.get("notes", []):
        lines.append(f"\n{n}")
    return lines


def host_time_text(d: dict) -> str:
    """One paragraph of :func:`aiter_mla.bench.host_time.host_times` figures."""
    s = d["shape"]

    def us(name):
        r = d.get(name)
        return f"{r['us']:.1f} µs" if r else "not measured"

    return (f"Host time per warm eager call (`aiter_mla.bench.host_time`: heads {s['heads']}, qlen "
            f"{s['qlen']}, batch {s['batch']}, ctx {s['ctx']}, {s['dtype']}, GPU idle between calls, "
            f"no build running; median of {d['reps']} rounds of {d['calls']} calls): "
            f"`get_mla_metadata_v1` **{us('get_mla_metadata_v1')}**, `mla_decode_fwd` with a "
            f"caller-made plan **{us('mla_decode_fwd_no_alloc')}** with caller-given split buffers "
            f"(split merge {d.get('split_merge', 'chained')}; "
            f"{us('mla_decode_fwd_no_alloc_chained')} with the reduce kernel chained), "
            f"{us('mla_decode_fwd_alloc')} with AITER's freshly allocated ones, `mla_reduce_v1` "
            f"**{us('mla_reduce_v1')}**; `MlaDecodePlanner.plan` {us('planner_plan')}, `run` "
            f"{us('planner_run')}; the decode launch alone {us('launch_floor')}; "
            f"`get_module` memo hit {d['get_module_memo_us']:.2f} µs"
            + (f"; this process's interpreter reference {d['python_ref_us']:.2f} µs (30 `id` / "
               f"`data_ptr` into a tuple: a slower process shows here)" if "python_ref_us" in d else "")
            + ".")


def render_markdown(doc: dict, tag: str = "") -> str:
    """``results.md``: header (commit, machine, versions, ceilings), notes, JIT figures, then a
    table and the plots per group."""
    names = file_names(tag)
    v = doc["versions"]
    out = [f"# aiter_mla decode benchmark{f' ({tag})' if tag else ''}", "",
           f"- commit measured: `{doc['commit']}`", f"- machine: {doc['machine']}",
           "- versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if val),
           ]
    cfg = doc.get("config", {})
    if cfg.get("command"):
        out.append(f"- command: `{cfg['command']}`")
    out += ["", "## Ceilings (measured in this run)", "", *_ceilings_lines(doc["ceilings"]), "",
            _floor_text(doc["ceilings"]) + ", with the fp8 rate when Q and "
            "KV are both fp8, else bf16's. FLOPs = 2·Σ(qlen·kv_len)·heads·(576+512); bytes = KV "
            "read once + Q + O (bf16). frac floor = floor / measured (1.0 is the limit). "
            "decode+reduce is `mla_decode_fwd` with a plan (what `us`, TFLOPS, TB/s and frac floor "
            f"use); per-layer = decode+reduce + metadata / {cfg.get('layers', 61)} (one plan serves "
            "every layer of a decode step); total = metadata + decode+reduce, timed apart; step = "
            "the same three kernels chained in one CUDA graph (rows with a floor under "
            f"{cfg.get('step_max_floor_us', 20):g} µs), where each may start while the one before it "
            "finishes." + (" SM MHz (median) and board W (median/max) were sampled while the row's "
                          "decode was timed (`aiter_mla.bench.power`)."
                          if any("clock_mhz" in r for r in doc["rows"]) else ""),
            "", "Timing: " + cfg.get("timing", ""), ""]
    notes = collect_notes(doc)
    out += ["## Peers and notes", ""]
    out += [f"- {n}" for n in notes] or ["- none"]
    if doc.get("jit"):
        out += ["", "## JIT", "", *_jit_lines(doc["jit"])]
    for key, rows in groups(doc["rows"]).items():
        out += ["", f"## {group_title(key)}", "", markdown_table(rows)]
    out += ["", f"![latency vs ctx]({names['latency_png']})", "",
            f"![fraction of floor]({names['frac_png']})", "",
            "Columns marked (ref) were measured elsewhere, not in this run: "
            f"{reference_numbers.SEED_MI355_LABEL} = the seed's MI355 HK kernel (AITER #3072). "
            "Peers (FlashInfer, FlashMLA) are timed in this run only. "
            "ours/peer < 1 means ours is faster.", ""]
    return "\n".join(out)


def ceilings_text(c: dict) -> str:
    """One line: ``read 4.40 TB/s, copy 4.10 TB/s (r+w), bf16 800 TFLOPS, fp8 1600 TFLOPS``
    (no read figure for results without one)."""
    read = f"read {c['read_TBps']:.2f} TB/s, " if c.get("read_TBps") is not None else ""
    return (f"{read}copy {c['copy_TBps']:.2f} TB/s (r+w), bf16 {c['bf16_TFLOPS']:.0f} TFLOPS, "
            f"fp8 {c['fp8_TFLOPS']:.0f} TFLOPS")


def render_stdout(doc: dict) -> str:
    """Ceilings line, notes and a plain-text table per group."""
    out = [f"commit {doc['commit']} | {doc['machine']}", "ceilings: " + ceilings_text(doc["ceilings"])]
    out += [f"note: {n}" for n in collect_notes(doc)]
    for key, rows in groups(doc["rows"]).items():
        out += ["", group_title(key), text_table(rows)]
    return "\n".join(out)


def _finite(obj):
    """JSON has no NaN or infinity: such floats become null (e.g. the rel-L2 of a NaN output,
    whose row also says ``ref_ok: false``)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def write_outputs(doc: dict, out_dir: Path, tag: str = "") -> dict[str, Path]:
    """Validate, then write json, md and the two plots into ``out_dir``; returns their paths."""
    from . import plots

    validate_results(doc)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    names = file_names(tag)
    paths = {k: out_dir / n for k, n in names.items()}
    paths["json"].write_text(json.dumps(_finite(doc), indent=1, allow_nan=False) + "\n")
    panels = {group_title(key): rows for key, rows in groups(doc["rows"]).items()}
    plots.latency_vs_ctx(panels, paths["latency_png"], doc.get("machine", ""))
    plots.frac_floor_heatmap(panels, paths["frac_png"], doc.get("machine", ""))
    paths["md"].write_text(render_markdown(doc, tag))
    return paths
