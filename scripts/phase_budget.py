"""Per-tile phase budget of the decode loop, from the timing-stamp build.

usage:
  python3 scripts/phase_budget.py --case "fp8 128,1 b64 c3200" [--case ...] [--calls 20]
      [--warmup 3] [--templates WHERE] [--raw] [-o OUTDIR]

The stamp build: ``-DAITER_MLA_PHASE_STAMPS`` (this script appends it to
``AITER_MLA_EXTRA_NVCC_FLAGS`` before the JIT is used; that variable enters the cache key, so
stamped and plain builds are separate cache entries). Without the flag the stamps are compiled
out. Only a stamped ``mla_decode`` module exports

  int aiter_mla_decode_stamp_layout(int* dims)      dims = {slots, roles, fields}; returns 0
  const char* aiter_mla_decode_stamp_names()       the phases' names, comma-separated
  int aiter_mla_decode_stamps(void* dst, long long bytes, int device, int reset)
                                                   copies uint64[slots][roles][fields] to dst,
                                                   then zeroes it when reset; a cudaError_t

Entry [s][r][k], k < phases (fields = phases + 1): SM clock cycles (clock64) that role r
(0, 1: consumer warpgroups 0 and 1; 2: the producer warp) of CTA slot s (blockIdx.y *
gridDim.x + blockIdx.x; CTAs past the last slot are not recorded) spent in phase k, summed over
every launch since the last reset; [s][r][phases]: the KV tiles that role processed meanwhile.

Per case (the syntax of scripts/template_ab.py's --case; the bench's inputs for that point):
build the decode variant (``decode_variant``) with the flag, plan once, run ``--warmup`` calls
of ``mla_decode_fwd`` with the pre-made plan, capture ``--calls`` calls (rotated input sets)
into one CUDA graph, reset the stamps, replay it once (timed with CUDA events: µs per call of
the *stamped* build, back to back as the bench runs them), read the stamps, and
print per role and phase: cycles per tile (sum of cycles / sum of tiles over the CTA slots
whose role processed tiles; slots with none are left out), the phase's share of the role's
total, the median and max over those CTAs of their own cycles per tile, and ns per tile at the
SM clock read right after the calls (``torch.cuda.clock_rate``, else ``nvidia-smi``).

The stamp build also keeps a timeline (``aiter_mla_decode_timeline``: per CTA and call, the
global timer at entry, PDL release, first work set up, last epilogue start and end, exit);
each case then gets a row of where a call's time goes between grids (:func:`timeline_summary`):
the gap from the previous grid's end to the release, the fill, the loop, the spread of the
lists' ends, the epilogue.

``--templates WHERE`` stamps another tree (``WHERE`` as an arm of template_ab.py: a folder, a
worktree's root or ``git:REF``). ``-o OUTDIR`` writes OUTDIR/phase_budget.json and .md
(``--raw`` adds the stamps themselves to the JSON). Exit status: 0; 1 when a build, a call or
the stamp read failed, or the module has no stamp exports; 2 for a bad argument or no GPU.

:func:`budget_table` (stamps -> the table) is pure and tested in op_tests/test_dev_tools.py.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

STAMP_FLAG = "-DAITER_MLA_PHASE_STAMPS"
FLAGS_VAR = "AITER_MLA_EXTRA_NVCC_FLAGS"
#: Role 2 is thread 256: the producer warp in every loop but score_pv, where it is the scorer
#: (its kv_wait / handover rows are then the PV warpgroups' P_full and F waits on roles 0 and 1).
ROLE_NAMES = ("consumer wg0", "consumer wg1", "producer (score_pv: scorer)")
LAYOUT_FN, NAMES_FN, STAMPS_FN = ("aiter_mla_decode_stamp_layout", "aiter_mla_decode_stamp_names",
                                  "aiter_mla_decode_stamps")
LINE_LAYOUT_FN, LINE_NAMES_FN, LINE_FN = ("aiter_mla_decode_timeline_layout", "aiter_mla_decode_timeline_names",
                                          "aiter_mla_decode_timeline")
#: The timeline's marks (global-timer ns of thread 0), in the order the stamp build stores them,
#: and the calls it keeps after a reset (mla_decode_stamps.cuh's kLineCalls).
LINE_MARKS = ("entry", "waited", "first_work", "last_epilogue_start", "last_epilogue_end", "exit")
LINE_CALLS = 64
#: The timeline summary's figures per call, in the order they are printed.
LINE_FIGURES = ("gap", "release_spread", "fill", "loop", "ends_spread", "epilogue", "tail", "span", "period")
HERE = Path(__file__).resolve().parent


def _template_ab():
    """scripts/template_ab.py as a module (its top level imports only the standard library)."""
    mod = sys.modules.get("template_ab")
    if mod is None:
        spec = importlib.util.spec_from_file_location("template_ab", HERE / "template_ab.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["template_ab"] = mod
        spec.loader.exec_module(mod)
    return mod


# ------------------------------------------------------------------------------------------
# pure


def with_stamp_flag(existing: str | None) -> str:
    """``existing`` nvcc flags with ``-DAITER_MLA_PHASE_STAMPS`` appended (once)."""
    flags = shlex.split(existing or "")
    if STAMP_FLAG in flags:
        return existing or STAMP_FLAG
    return f"{existing} {STAMP_FLAG}".strip() if existing and existing.strip() else STAMP_FLAG


def parse_names(text: str | bytes | None, phases: int) -> list[str]:
    """The comma-separated phase names; ValueError unless there are exactly ``phases``."""
    if isinstance(text, bytes):
        text = text.decode()
    names = [n.strip() for n in (text or "").split(",")] if text else []
    if len(names) != phases or any(not n for n in names):
        raise ValueError(f"{NAMES_FN} gave {len(names)} names ({text!r}) for {phases} phases "
                         f"(fields - 1 from {LAYOUT_FN})")
    return names


def unflatten(flat, slots: int, roles: int, fields: int) -> list[list[list[int]]]:
    """A flat uint64 sequence of ``slots * roles * fields`` values -> [slots][roles][fields]."""
    flat = list(flat)
    if len(flat) != slots * roles * fields:
        raise ValueError(f"{len(flat)} values for {slots} x {roles} x {fields}")
    per_slot = roles * fields
    return [[[int(flat[s * per_slot + r * fields + k]) for k in range(fields)] for r in range(roles)]
            for s in range(slots)]


def budget_table(stamps, names: list[str], clock_mhz: float | None = None,
                 role_names=ROLE_NAMES) -> list[dict]:
    """The per-tile budget of each role from the stamps ``[slots][roles][phases + 1]``.

    Per role: the CTA slots whose tile count (the last field) is > 0 (the others are left out;
    ``ignored_slots`` counts those that stamped cycles anyway), their tiles, and per phase:
    ``cycles_per_tile`` = sum of cycles / sum of tiles over those slots, ``share`` of the role's
    total, ``cta_median`` / ``cta_max`` of each slot's own cycles / tiles, and ``ns_per_tile``
    at ``clock_mhz`` (None without a clock). The role's total is the same figures over the sum
    of its phases. A role no slot ran has ``ctas`` 0 and None figures. ValueError when a slot
    or role has the wrong number of fields.
    """
    phases = len(names)
    roles = len(stamps[0]) if stamps else 0
    for s, slot in enumerate(stamps):
        if len(slot) != roles or any(len(rec) != phases + 1 for rec in slot):
            raise ValueError(f"slot {s}: expected {roles} roles x {phases + 1} fields "
                             f"({phases} phases + tiles)")

    def ns(cpt):
        return cpt / clock_mhz * 1e3 if (cpt is not None and clock_mhz) else None

    out = []
    for r in range(roles):
        live = [slot[r] for slot in stamps if slot[r][phases] > 0]
        ignored = sum(1 for slot in stamps if slot[r][phases] == 0 and any(slot[r][:phases]))
        tiles = sum(rec[phases] for rec in live)
        total = sum(sum(rec[:phases]) for rec in live)
        name = role_names[r] if r < len(role_names) else f"role {r}"
        row = {"role": r, "name": name, "ctas": len(live), "tiles": tiles, "ignored_slots": ignored,
               "cycles": total, "phases": []}

        def figures(cycles_of):
            if not live:
                return {"cycles_per_tile": None, "share": None, "cta_median": None, "cta_max": None,
                        "ns_per_tile": None}
            per_cta = [cycles_of(rec) / rec[phases] for rec in live]
            c = sum(cycles_of(rec) for rec in live)
            cpt = c / tiles
            return {"cycles_per_tile": cpt, "share": (c / total) if total else 0.0,
                    "cta_median": float(statistics.median(per_cta)), "cta_max": max(per_cta),
                    "ns_per_tile": ns(cpt)}

        for k, pname in enumerate(names):
            row["phases"].append({"phase": pname, **figures(lambda rec, k=k: rec[k])})
        row["total"] = figures(lambda rec: sum(rec[:phases]))
        out.append(row)
    return out


def timeline_summary(line, names=LINE_MARKS) -> dict | None:
    """Where a call's time goes, from the timeline ``[slots][calls][marks]`` (global-timer ns of
    each CTA's thread 0; a slot's call with ``exit`` 0 was not recorded).

    Per call c, with R_c = the earliest ``waited`` over its CTAs (the previous grid's end, as
    the first released CTA saw it), in µs: ``gap`` = R_c - the latest ``exit`` of call c - 1
    (the previous grid's last CTA to this grid's release; calls >= 1 only), ``release_spread``
    = latest - earliest ``waited``; over the CTAs that ran a work (``first_work`` and
    ``last_epilogue_start`` set; ``working_ctas``; the five figures are left out of a call with
    none): ``fill`` = median ``first_work`` - R_c (the first work set up as thread 0 sees it:
    after its Q in ``alternating``, after the work record in ``score_pv``, whose thread 0 is a PV
    warpgroup), ``loop`` = median ``last_epilogue_start`` - median
    ``first_work``, ``ends_spread`` = latest - median ``last_epilogue_start`` (the slowest
    list's lag), ``epilogue`` = median of (``last_epilogue_end`` - ``last_epilogue_start``),
    ``tail`` = latest ``exit`` - latest ``last_epilogue_start``, ``span`` = latest ``exit`` -
    R_c, and ``period`` = R_c+1 - R_c. Returns those per call and their medians over the calls
    that have them (None where none has), or None when no call was recorded.
    ValueError when the layout is not [slots][calls][marks] of integers >= 0, a record has the
    wrong number of marks, a recorded mark comes before an earlier one, or ``names`` lacks one of
    :data:`LINE_MARKS`.
    """
    missing = [m for m in LINE_MARKS if m not in names]
    if missing:
        raise ValueError(f"timeline names must include {', '.join(LINE_MARKS)}; missing {', '.join(missing)}")
    idx = {n: i for i, n in enumerate(names)}
    layout = "a timeline is [slots][calls][marks] of integer ns"
    if not isinstance(line, (list, tuple)):
        raise ValueError(f"{layout}, got {type(line).__name__}")
    for s, slot in enumerate(line):
        if not isinstance(slot, (list, tuple)) or any(not isinstance(rec, (list, tuple)) for rec in slot):
            raise ValueError(f"{layout}: slot {s} is not a list of calls, each a list of marks")
        for c, rec in enumerate(slot):
            if len(rec) != len(names):
                raise ValueError(f"slot {s}: a record of {len(rec)} marks, expected {len(names)}")
            if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in rec):
                raise ValueError(f"{layout}: slot {s} call {c} has a mark that is not an integer >= 0: {list(rec)}")
            # recorded marks (0: not recorded) in the order the kernel passes them
            seen = [rec[idx[m]] for m in LINE_MARKS if rec[idx[m]] > 0]
            if seen != sorted(seen) or (rec[idx["exit"]] > 0 and rec[idx["waited"]] == 0):
                raise ValueError(f"slot {s} call {c}: marks out of order or the release missing "
                                 f"({dict(zip(names, rec))})")
    ncalls = max((len(slot) for slot in line), default=0)
    calls = []
    for c in range(ncalls):
        recs = [slot[c] for slot in line if c < len(slot) and slot[c][idx["exit"]] > 0]
        if not recs:
            break
        calls.append(recs)
    if not calls:
        return None

    def col(recs, name):
        return [r[idx[name]] for r in recs]

    def med(v):
        return float(statistics.median(v))

    per_call = []
    for c, recs in enumerate(calls):
        release = min(col(recs, "waited"))
        row = {"ctas": len(recs), "release_spread": (max(col(recs, "waited")) - release) / 1e3,
               "span": (max(col(recs, "exit")) - release) / 1e3}
        # the work figures from the CTAs that ran a work (at batch 1 most have none)
        worked = [r for r in recs if r[idx["first_work"]] > 0 and r[idx["last_epilogue_start"]] > 0]
        row["working_ctas"] = len(worked)
        if worked:
            epi = col(worked, "last_epilogue_start")
            row.update({
                "fill": (med(col(worked, "first_work")) - release) / 1e3,
                "loop": (med(epi) - med(col(worked, "first_work"))) / 1e3,
                "ends_spread": (max(epi) - med(epi)) / 1e3,
                "epilogue": med([r[idx["last_epilogue_end"]] - r[idx["last_epilogue_start"]] for r in worked]) / 1e3,
                "tail": (max(col(recs, "exit")) - max(epi)) / 1e3})
        if c > 0:
            row["gap"] = (release - max(col(calls[c - 1], "exit"))) / 1e3
            per_call[-1]["period"] = (release - min(col(calls[c - 1], "waited"))) / 1e3
        per_call.append(row)
    medians = {k: (med([r[k] for r in per_call if k in r]) if any(k in r for r in per_call) else None)
               for k in LINE_FIGURES}
    return {"calls": len(per_call), "median_us": medians, "per_call_us": per_call}


def render_timeline(tl: dict | None) -> list[str]:
    """Markdown lines of a case's timeline summary (medians over its calls, µs)."""
    if not tl:
        return []
    m = tl["median_us"]
    return [f"Timeline (global timer, CTA thread 0, medians over {tl['calls']} calls, µs): gap = the "
            "previous grid's last exit to this grid's release; fill = release to the median first "
            "work set up; ends_spread = the latest list's epilogue start after the median one; "
            "tail = the latest epilogue start to the last exit; period = release to release.", "",
            "| " + " | ".join(LINE_FIGURES) + " |", "|" + "---|" * len(LINE_FIGURES),
            "| " + " | ".join(_f(m[k], ".2f") for k in LINE_FIGURES) + " |"]


def _f(v, spec):
    return "–" if v is None else format(v, spec)


def render_budget(budget: list[dict], clock_mhz: float | None) -> list[str]:
    """Markdown table lines of one case's budget."""
    lines = ["| role | phase | cycles / tile | share | CTA median | CTA max | ns / tile |",
             "|---|---|---|---|---|---|---|"]
    for role in budget:
        label = f"{role['name']} ({role['ctas']} CTAs, {role['tiles']} tiles)"
        if role["ignored_slots"]:
            label += f", {role['ignored_slots']} slots with cycles but no tile left out"
        for ph in role["phases"]:
            lines.append(f"| {label} | {ph['phase']} | {_f(ph['cycles_per_tile'], '.1f')} | "
                         f"{_f(ph['share'], '.1%')} | {_f(ph['cta_median'], '.1f')} | "
                         f"{_f(ph['cta_max'], '.1f')} | {_f(ph['ns_per_tile'], '.1f')} |")
            label = ""
        t = role["total"]
        lines.append(f"| {label} | **total** | {_f(t['cycles_per_tile'], '.1f')} | "
                     f"{_f(t['share'], '.0%')} | {_f(t['cta_median'], '.1f')} | {_f(t['cta_max'], '.1f')} | "
                     f"{_f(t['ns_per_tile'], '.1f')} |")
    return lines


def render_markdown(doc: dict) -> str:
    lines = [f"# decode phase budget ({doc.get('commit', '?')})", ""]
    if doc.get("device"):
        lines += [f"Device: {doc['device']}. nvcc extra flags: `{doc.get('nvcc_flags', '')}`.", ""]
    for c in doc["cases"]:
        lines.append(f"## {c['case']}")
        lines.append("")
        if c.get("error"):
            lines += [f"Failed: {c['error']}", ""]
            continue
        clk = c.get("clock") or {}
        lines.append(f"Variant {c['variant'].get('mainloop', '?')} ({', '.join(f'{k}={v}' for k, v in c['variant'].items())}); "
                     f"{c['calls']} calls after {c['warmup']} warm-up calls, {c['us_per_call']:.1f} µs per call "
                     f"(stamped build, {c.get('method', '?')}); SM clock {_f(clk.get('mhz'), '.0f')} MHz ({clk.get('source', 'unknown')}); "
                     f"{c['layout']['slots']} CTA slots.")
        chk = c.get("check")
        if chk:
            lines.append(f"Stamped output against float64: relative L2 {chk['rel_l2']:.2e} (bound {chk['tol']:.0e}), "
                         f"max |LSE error| {chk['lse_max_abs_err']:.2e}: {'ok' if chk['ok'] else 'FAILED'}.")
        lines.append("")
        lines += render_budget(c["budget"], clk.get("mhz"))
        lines.append("")
        if c.get("timeline"):
            lines += render_timeline(c["timeline"])
            lines.append("")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------
# the GPU side


def sm_clock(device_index: int) -> dict:
    """The SM clock now: ``torch.cuda.clock_rate`` (pynvml), else ``nvidia-smi``'s clocks.sm;
    ``max_mhz`` from nvidia-smi when it answers. {"mhz": None, ...} when neither does."""
    import torch

    out = {"mhz": None, "source": None, "max_mhz": None}
    try:
        out["mhz"], out["source"] = float(torch.cuda.clock_rate(device_index)), "torch.cuda.clock_rate"
    except Exception:   # no pynvml: nvidia-smi below
        pass
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.max.sm", "--format=csv,noheader,nounits",
                            "-i", str(device_index)], capture_output=True, text=True, timeout=20)
        cur, mx = (float(x) for x in r.stdout.strip().splitlines()[0].split(","))
        out["max_mhz"] = mx
        if out["mhz"] is None:
            out["mhz"], out["source"] = cur, "nvidia-smi clocks.sm"
    except Exception:   # no nvidia-smi, or an answer that is not two numbers
        pass
    return out


class Stamps:
    """The stamp exports of a decode module."""

    def __init__(self, mod):
        import ctypes

        from aiter_mla.jit.loader import ModuleLoadError

        try:
            self._layout = mod.function(LAYOUT_FN, [ctypes.POINTER(ctypes.c_int)], ctypes.c_int)
            self._names = mod.function(NAMES_FN, [], ctypes.c_char_p)
            self._read = mod.function(STAMPS_FN, [ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int,
                                                  ctypes.c_int], ctypes.c_int)
        except ModuleLoadError as exc:
            raise RuntimeError(f"{exc}: the decode template does not implement the {STAMP_FLAG} "
                               f"stamps (or the module was built without the flag)") from None
        self._mod = mod
        dims = (ctypes.c_int * 3)()
        rc = self._layout(dims)
        if rc != 0:
            raise RuntimeError(f"{LAYOUT_FN} returned {rc}")
        self.slots, self.roles, self.fields = (int(d) for d in dims)
        if min(self.slots, self.roles, self.fields) < 1:
            raise RuntimeError(f"{LAYOUT_FN} gave dims {list(dims)}")
        self.names = parse_names(self._names(), self.fields - 1)
        self._buf = (ctypes.c_uint64 * (self.slots * self.roles * self.fields))()

        try:   # the timeline (templates from before it have none)
            self._line_layout = mod.function(LINE_LAYOUT_FN, [ctypes.POINTER(ctypes.c_int)], ctypes.c_int)
            self._line_read = mod.function(LINE_FN, [ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int,
                                                     ctypes.c_int], ctypes.c_int)
        except ModuleLoadError:
            self._line_layout = None
        if self._line_layout is not None:
            rc = self._line_layout(dims)
            self.line_dims = tuple(int(d) for d in dims)
            if rc != 0 or self.line_dims[2] != len(LINE_MARKS):
                raise RuntimeError(f"{LINE_LAYOUT_FN} returned {rc} with dims {list(self.line_dims)}")
            self._line_buf = (ctypes.c_uint64 * (self.line_dims[0] * self.line_dims[1] * self.line_dims[2]))()

    def read(self, device_index: int, reset: bool) -> list:
        """[slots][roles][fields] now (then zeroed when ``reset``)."""
        import ctypes

        rc = self._read(self._buf, ctypes.sizeof(self._buf), device_index, 1 if reset else 0)
        if rc != 0:
            raise RuntimeError(f"{STAMPS_FN} failed: {self._mod.error_string(rc)} ({rc})")
        return unflatten(self._buf, self.slots, self.roles, self.fields)

    def read_timeline(self, device_index: int, reset: bool) -> list | None:
        """[slots][calls][marks] of global-timer ns (then zeroed when ``reset``); None when the
        module has no timeline."""
        import ctypes

        if self._line_layout is None:
            return None
        rc = self._line_read(self._line_buf, ctypes.sizeof(self._line_buf), device_index, 1 if reset else 0)
        if rc != 0:
            raise RuntimeError(f"{LINE_FN} failed: {self._mod.error_string(rc)} ({rc})")
        return unflatten(self._line_buf, *self.line_dims)


def ab_first_line(exc: BaseException) -> str:
    return _template_ab()._first_line(exc)


def measure_case(run, warmup: int, calls: int, raw: bool) -> dict:
    """One case (a template_ab CaseRun): plan, ``warmup`` eager calls, the ``calls`` timed calls
    captured into one CUDA graph (eager if capture fails), reset, one replay, read."""
    import torch

    from aiter_mla.jit import get_module

    dev = torch.cuda.current_device()
    stamps = Stamps(get_module("mla_decode", **run.params))   # the module mla_decode_fwd runs
    n_sets = run.ri.rotation.n_sets
    run.plan.metadata()
    for s in range(warmup):
        run.plan.decode(s % n_sets)
    torch.cuda.synchronize()

    def timed_calls():
        for i in range(calls):
            run.plan.decode((warmup + i) % n_sets)

    method, graph = "graph", torch.cuda.CUDAGraph()
    try:   # the calls back to back in one graph, as the bench times them (capturing runs nothing)
        with torch.cuda.graph(graph):
            timed_calls()
    except Exception as exc:  # an op that cannot be captured: the same calls, eagerly
        torch.cuda.synchronize()
        method, graph = f"eager (graph capture failed: {ab_first_line(exc)})", None
    torch.cuda.synchronize()
    stamps.read(dev, reset=True)
    stamps.read_timeline(dev, reset=True)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    if graph is not None:
        graph.replay()
    else:
        timed_calls()
    end.record()
    torch.cuda.synchronize()
    clock = sm_clock(dev)
    data = stamps.read(dev, reset=True)
    line = stamps.read_timeline(dev, reset=True)
    rec = {"us_per_call": start.elapsed_time(end) * 1e3 / calls, "method": method, "clock": clock,
           "layout": {"slots": stamps.slots, "roles": stamps.roles, "fields": stamps.fields},
           "phase_names": stamps.names, "budget": budget_table(data, stamps.names, clock["mhz"])}
    if line is not None:
        rec["timeline"] = timeline_summary(line)
    if raw:
        rec["stamps"] = data
    return rec


def build_parser() -> argparse.ArgumentParser:
    ab = _template_ab()
    p = argparse.ArgumentParser(prog="phase_budget.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    ab.add_case_arguments(p)
    p.add_argument("--calls", type=ab.positive_int, default=20, help="stamped calls (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="calls before the reset (default 3)")
    p.add_argument("--templates", default=None, metavar="WHERE",
                   help="templates to stamp: a folder, a worktree's root or git:REF (default: the "
                        "repository's)")
    p.add_argument("--raw", action="store_true", help="also write the stamps themselves to the JSON")
    p.add_argument("-o", "--output", type=Path, default=None,
                   help="write phase_budget.json and phase_budget.md here")
    p.add_argument("-j", "--jobs", type=ab.positive_int, default=min(8, os.cpu_count() or 1),
                   help="parallel builds (default min(8, CPUs))")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    ab = _template_ab()
    p = build_parser()
    args = p.parse_args(argv)
    try:
        args.case = ab.parse_cases(args.case)
    except ab.SpecError as exc:
        p.error(str(exc))
    where = args.templates or ""
    try:
        args.arm = ab.parse_arm("stamped=" + where)
        if args.arm.kind == "dir":
            ab.resolve_templates_dir(where, label=f"--templates {where!r}")
    except ab.SpecError as exc:
        msg = str(exc)
        if msg.startswith("--arm "):   # parse_arm's wording: name the option this script has
            msg = msg.split(": ", 1)[-1]
        p.error(msg if msg.startswith("--templates") else f"--templates {where!r}: {msg}")
    if args.warmup < 0:
        p.error(f"--warmup must be >= 0, got {args.warmup}")
    if args.output is not None:
        problem = ab.output_folder_message(args.output)
        if problem:
            p.error(problem)
    if args.calls > LINE_CALLS:
        print(f"phase_budget.py: note: the timeline keeps the first {LINE_CALLS} of the {args.calls} calls "
              f"(the stamp sums take them all)", file=sys.stderr)
    return args


def main(argv=None) -> int:
    # before any build: the stamp flag is part of every module this process compiles
    os.environ[FLAGS_VAR] = with_stamp_flag(os.environ.get(FLAGS_VAR))
    ab = _template_ab()
    args = parse_args(argv)
    try:
        params = ab.case_variants(args.case)
    except ab.SpecError as exc:
        print(f"phase_budget.py: error: {exc}", file=sys.stderr)
        return 2
    if ab.no_gpu("phase_budget.py"):
        return 2
    from aiter_mla.bench import environment
    from aiter_mla.paths import checkout_commit

    doc = {"tool": "scripts/phase_budget.py", "commit": args.commit or checkout_commit(args.output),
           "device": environment.machine(), "nvcc_flags": os.environ[FLAGS_VAR],
           "templates": args.templates or "", "cases": []}
    try:
        with ab.arm_environment(), ab.arm_folders([args.arm]) as folders:
            failed, _keys = ab.build_all([args.arm], folders, params, args.jobs)   # also switches to them
            if failed:
                print("\n".join(failed), file=sys.stderr)
                return 1
            for run in ab.make_case_runs(args.case, params, args.seed):
                entry = {**run.case.as_dict(), "variant": run.params, "calls": args.calls,
                         "warmup": args.warmup}
                try:
                    entry.update(measure_case(run, args.warmup, args.calls, args.raw))
                    # the stamped build must compute what the plain one does (its stamps share the
                    # CTA's shared memory): input set 0 against the float64 reference
                    entry["check"], _out = ab.check_arm(run, None, 2)
                except Exception as exc:  # recorded; the next case goes on (a lost context fails it too)
                    entry["error"] = ab._first_line(exc)
                doc["cases"].append(entry)
    except ab.SpecError as exc:
        print(f"phase_budget.py: error: {exc}", file=sys.stderr)
        return 2
    text = render_markdown(doc)
    print(text)
    if args.output is not None:
        args.output.mkdir(parents=True, exist_ok=True)
        (args.output / "phase_budget.json").write_text(json.dumps(doc, indent=1) + "\n")
        (args.output / "phase_budget.md").write_text(text)
        print(f"wrote {args.output / 'phase_budget.json'}, {args.output / 'phase_budget.md'}")
    bad = [f"{c['case']}: {c['error']}" for c in doc["cases"] if c.get("error")]
    bad += [f"{c['case']}: the stamped build's output failed its check (relative L2 {c['check']['rel_l2']:.2e})"
            for c in doc["cases"] if c.get("check") and not c["check"]["ok"]]
    for line in bad:
        print(f"phase_budget.py: {line}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
