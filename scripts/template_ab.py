"""The A/B tool: template trees timed against each other in one process, in one run.

usage:
  python3 scripts/template_ab.py --arm base= --arm new=/path/to/worktree/templates \\
      --case "fp8 128,1 b64 c3200" --case "bf16 16,1 b128 c8192 p64" --rounds 3 -o OUTDIR

Arms (``--arm NAME=WHERE``, repeatable, at least one; the first is the baseline of the ratios):

  NAME=          the repository's own ``templates/`` (AITER_MLA_TEMPLATES_DIR unset)
  NAME=DIR       DIR when it holds ``mla_decode.cu.j2``, else ``DIR/templates`` (a git
                 worktree's root)
  NAME=git:REF   a temporary ``git worktree add --detach`` of REF (this repository's git), its
                 ``templates/``; the worktree is removed at the end

An arm is a templates folder and, when one sits beside it (a worktree's or a ``git:`` arm's
root), its ``jit_config.json``: the Python side (the ops, the host half of the scheduler,
``decode_variant``'s choice of variant) is this checkout's in every arm, so a tree must accept
the template parameters this checkout passes; its own config refuses them when it does not
(rather than letting its template render a fallback branch). A bare templates folder is checked
against this checkout's ``jit_config.json``.
NAME is letters, digits and ``_.-``.

Cases (``--case``, repeatable, at least one): ``"DTYPE HEADS,QLEN bBATCH cCTX [pPAGE] [sSPLITS] [varlen]"``,
e.g. ``"fp8 128,1 b64 c3200"`` (Q and KV both DTYPE, fp8 or bf16; page 64 unless ``pPAGE``;
``sSPLITS``: the plan's ``max_split_per_batch``, else the bench's (``sweep.max_split_per_batch``),
so one run can time two schedules of one point;
``varlen``: log-normal lengths with mean CTX, as ``aiter-mla bench --varlen``). The inputs are
the bench's row for that point (``aiter_mla.bench.sweep``: same seeds, same KV pool, page
tables and rotation), made once and shared by every arm.

What it does, all in this one process (``AITER_MLA_TEMPLATES_DIR`` and ``AITER_MLA_CONFIG`` are
process-wide, and every switch is ``os.environ`` + ``aiter_mla.jit.core.reset_state()``, which
drops the in-process memo and the ops' own module handles; :func:`arm_environment` restores
them at the end):

1. build: per arm, switch to its folder and build (or load) every variant the cases need
   (``aiter_mla.bench.variants.build_variants``); a failed build stops the run (exit 1).
2. rounds: round r visits the arms rotated by r (round r starts at arm r % arms, so no arm
   always runs first: drift and warming show as a spread instead of a bias); per visit, switch
   to the arm and, per case, plan with the arm's metadata kernel, then time decode + reduce
   (``mla_decode_fwd`` with the pre-made plan) as the bench does: CUDA-graph replays of
   back-to-back calls over rotated input sets, so no call finds its KV in L2
   (``aiter_mla.bench.timing.time_calls``; the median over replays of replay time / calls).
   The calls per graph are chosen once per case, from a nominal H200 roofline, and shared.
3. check, in round 0: each arm's output and LSE for the first ``--check-requests`` requests of
   input set 0 against the float64 reference (``aiter_mla.reference.mla_decode_ref``): the
   relative L2 error of the output, the max |LSE error| (natural log; equal infinities count
   0), and the output's relative L2 distance to the first arm's.

Output: a table (per case: each arm's µs per round in round order, its median, the ratio of
its median to the first arm's, and the SM clock's range over the case's timings, sampled by
``aiter_mla.bench.power`` while each arm is timed), printed and written to OUTDIR/ab.md and
OUTDIR/ab.json (per arm ``clock_mhz``: the median SM clock of each round, None unsampled).
Exit status: 0, 1 when a build or a run failed or an arm missed the reference tolerance
(``aiter_mla.bench.sweep.CHECK_TOL``), 2 for a bad argument or no GPU.

The pure parts (parsing arms and cases, the rotation order, the summary maths, the tables)
need no GPU and are tested in ``op_tests/test_dev_tools.py``.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:   # run as a script from anywhere: import this checkout's aiter_mla
    sys.path.insert(0, str(REPO))

DTYPES = ("fp8", "bf16")
DEFAULT_PAGE_SIZE = 64
#: Ceilings used only to pick the calls per CUDA graph of a case (the bench measures them in
#: the run; here one figure per case, the same for every arm, is all that is needed): the
#: H200's copy rate and GEMM rates as the bench measured them (README).
NOMINAL_CEILINGS = {"copy_TBps": 4.28, "bf16_TFLOPS": 786.0, "fp8_TFLOPS": 1440.0}
TEMPLATE_FILE = "mla_decode.cu.j2"
_NAME = re.compile(r"[A-Za-z0-9_.-]+")


class SpecError(ValueError):
    """A bad --arm or --case value; the message names the argument."""


# ------------------------------------------------------------------------------------------
# arguments (pure)


@dataclasses.dataclass(frozen=True)
class Arm:
    """One arm: ``kind`` "repo" (the repository's templates), "dir" (``where`` a folder) or
    "git" (``where`` a git ref)."""

    name: str
    kind: str
    where: str = ""

    @property
    def spec(self) -> str:
        return {"repo": "", "dir": self.where, "git": f"git:{self.where}"}[self.kind]


@dataclasses.dataclass(frozen=True)
class Case:
    """One timed point: Q and KV ``dtype``, heads, qlen, batch, ctx (tokens), page size."""

    dtype: str
    heads: int
    qlen: int
    batch: int
    ctx: int
    page_size: int = DEFAULT_PAGE_SIZE
    varlen: bool = False
    max_split_per_batch: int | None = None   # None: the bench's cap

    def split_cap(self, num_cu: int) -> int:
        """The plan's ``max_split_per_batch``: the case's, else the bench's for this point."""
        from aiter_mla.bench import sweep

        if self.max_split_per_batch is not None:
            return self.max_split_per_batch
        return sweep.max_split_per_batch(self.heads, self.batch, num_cu)

    @property
    def label(self) -> str:
        """The canonical spelling (parse_case(label) == self)."""
        s = f"{self.dtype} {self.heads},{self.qlen} b{self.batch} c{self.ctx}"
        if self.page_size != DEFAULT_PAGE_SIZE:
            s += f" p{self.page_size}"
        if self.max_split_per_batch is not None:
            s += f" s{self.max_split_per_batch}"
        return s + (" varlen" if self.varlen else "")

    def as_dict(self) -> dict:
        return {"case": self.label, **dataclasses.asdict(self)}


def parse_arm(text: str) -> Arm:
    """``NAME=``, ``NAME=DIR`` or ``NAME=git:REF`` -> :class:`Arm`; SpecError naming --arm."""
    name, eq, where = text.partition("=")
    if not eq:
        raise SpecError(f"--arm {text!r}: expected NAME=FOLDER, NAME= (the repository's templates) "
                        f"or NAME=git:REF")
    if not _NAME.fullmatch(name):
        raise SpecError(f"--arm {text!r}: the name {name!r} must be letters, digits and _.- "
                        f"(and not empty)")
    if not where:
        return Arm(name, "repo")
    if where.startswith("git:"):
        ref = where[4:]
        if not ref or ref.startswith("-") or any(c.isspace() for c in ref):
            raise SpecError(f"--arm {text!r}: git: needs a ref (a commit, branch or tag), got {ref!r}")
        return Arm(name, "git", ref)
    return Arm(name, "dir", where)


def parse_arms(texts) -> list[Arm]:
    """Every --arm value, in order; SpecError for a bad one, a repeated name or none."""
    arms = [parse_arm(t) for t in texts or []]
    if not arms:
        raise SpecError("--arm: give at least one arm (NAME=, NAME=FOLDER or NAME=git:REF)")
    seen = set()
    for a in arms:
        if a.name in seen:
            raise SpecError(f"--arm {a.name}=...: the name {a.name!r} is used twice")
        seen.add(a.name)
    return arms


def _int_token(text: str, token: str, prefix: str, what: str) -> int:
    try:
        v = int(token[len(prefix):])
    except ValueError:
        raise SpecError(f"--case {text!r}: {token!r} must be {prefix}N ({what})") from None
    if v < 1:
        raise SpecError(f"--case {text!r}: {what} must be >= 1, got {token!r}")
    return v


def parse_case(text: str) -> Case:
    """``"DTYPE HEADS,QLEN bBATCH cCTX [pPAGE] [sSPLITS] [varlen]"`` -> :class:`Case` (HEADS,QLEN may be
    in parentheses). SpecError naming --case for anything else. The shape is checked against
    the op's supported list by :func:`case_variants`, not here."""
    toks = text.split()
    if len(toks) < 4:
        raise SpecError(f"--case {text!r}: expected 'DTYPE HEADS,QLEN bBATCH cCTX [pPAGE] [sSPLITS] [varlen]', "
                        f"e.g. 'fp8 128,1 b64 c3200'")
    dtype, shape, rest = toks[0], toks[1], toks[2:]
    if dtype not in DTYPES:
        raise SpecError(f"--case {text!r}: the dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    try:
        heads, qlen = (int(x) for x in shape.strip("()").split(","))
    except ValueError:
        raise SpecError(f"--case {text!r}: {shape!r} must be HEADS,QLEN such as 128,1") from None
    if heads < 1 or qlen < 1:
        raise SpecError(f"--case {text!r}: heads and qlen must be >= 1, got {shape!r}")
    got: dict[str, int] = {}
    varlen = False
    for tok in rest:
        if tok == "varlen":
            if varlen:
                raise SpecError(f"--case {text!r}: varlen is given twice")
            varlen = True
            continue
        key = tok[:1]
        what = {"b": "batch", "c": "ctx in tokens", "p": "page size",
                "s": "max_split_per_batch"}.get(key)
        if what is None:
            raise SpecError(f"--case {text!r}: unknown item {tok!r} (expected bN, cN, pN, sN or varlen)")
        if key in got:
            raise SpecError(f"--case {text!r}: {what} is given twice")
        got[key] = _int_token(text, tok, key, what)
    for key, what in (("b", "batch (bN)"), ("c", "ctx (cN)")):
        if key not in got:
            raise SpecError(f"--case {text!r}: the {what} is missing")
    page = got.get("p", DEFAULT_PAGE_SIZE)
    if page > 256 or page & (page - 1):
        raise SpecError(f"--case {text!r}: the page size must be a power of two in 1..256, got {page}")
    if got["c"] < qlen:
        raise SpecError(f"--case {text!r}: ctx {got['c']} is shorter than qlen {qlen} (causal decode)")
    return Case(dtype, heads, qlen, got["b"], got["c"], page, varlen, got.get("s"))


def parse_cases(texts) -> list[Case]:
    """Every --case value, in order (a repeat is dropped); SpecError when there is none."""
    cases = list(dict.fromkeys(parse_case(t) for t in texts or []))
    if not cases:
        raise SpecError("--case: give at least one case, e.g. --case 'fp8 128,1 b64 c3200'")
    return cases


def case_variants(cases: list[Case]) -> list[dict]:
    """The ``mla_decode`` parameters of each case, from the op's own dispatch
    (``aiter_mla.bench.variants.decode_params``); SpecError naming --case for an unsupported
    shape. Needs torch, not a GPU."""
    from aiter_mla.bench.variants import decode_params

    out = []
    for c in cases:
        try:
            out.append(decode_params(c.heads, c.qlen, c.page_size, c.dtype, c.dtype))
        except (NotImplementedError, ValueError) as exc:
            raise SpecError(f"--case {c.label!r}: {exc}") from None
    return out


def recorded_path(folder) -> str:
    """An arm's folder as the record names it: relative to this checkout when inside it (a
    reader's checkout is elsewhere; docs/perf records must not hold the author's path), else
    as given."""
    from aiter_mla.paths import REPO_ROOT

    folder = Path(folder).absolute()
    try:
        return str(folder.relative_to(REPO_ROOT.absolute()))
    except ValueError:
        return str(folder)


def round_orders(n_arms: int, rounds: int) -> list[list[int]]:
    """Arm indices in visiting order per round: round r starts at arm r % n_arms
    (3 arms x 3 rounds -> [[0, 1, 2], [1, 2, 0], [2, 0, 1]])."""
    if n_arms < 1 or rounds < 1:
        raise ValueError(f"need n_arms >= 1 and rounds >= 1, got {n_arms} and {rounds}")
    return [[(r + i) % n_arms for i in range(n_arms)] for r in range(rounds)]


from aiter_mla.bench.commands import (  # noqa: E402  (the bench's own argument types and -o check)
    SEED_MAX, output_folder_message, positive_int, seed_value)


def positive_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds > 0."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}") from None
    if not (v > 0 and v != float("inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text!r}")
    return v


def add_case_arguments(p: argparse.ArgumentParser) -> None:
    """--case and --seed (shared with scripts/phase_budget.py)."""
    p.add_argument("--case", action="append", required=True, metavar="CASE",
                   help="'DTYPE HEADS,QLEN bBATCH cCTX [pPAGE] [sSPLITS] [varlen]', e.g. 'fp8 128,1 b64 c3200' "
                        "(repeatable)")
    p.add_argument("--seed", type=seed_value, default=0,
                   help=f"input seed, 0..{SEED_MAX}, as aiter-mla bench --seed (default 0)")
    p.add_argument("--commit", default=None,
                   help="commit to record as measured (default: git rev-parse HEAD of this checkout, "
                        "+ -dirty), as aiter-mla bench --commit")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="template_ab.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arm", action="append", required=True, metavar="NAME=WHERE",
                   help="NAME= (the repository's templates), NAME=FOLDER or NAME=git:REF (repeatable; "
                        "the first is the baseline)")
    add_case_arguments(p)
    p.add_argument("--rounds", type=positive_int, default=3, help="timed rounds (default 3)")
    p.add_argument("-o", "--output", type=Path, default=Path("template_ab_out"),
                   help="output folder for ab.json and ab.md (default ./template_ab_out)")
    p.add_argument("--check-requests", type=positive_int, default=2,
                   help="requests checked against the float64 reference in round 0 (default 2)")
    p.add_argument("--budget-s", type=positive_seconds, default=1.0,
                   help="wall seconds one timing may take before it stops at 10 replays (default 1.0)")
    p.add_argument("-j", "--jobs", type=positive_int, default=min(8, os.cpu_count() or 1),
                   help="parallel builds (default min(8, CPUs))")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    """The parsed command line; argparse exits 2 with a message naming the bad argument."""
    p = build_parser()
    args = p.parse_args(argv)
    try:
        args.arm = parse_arms(args.arm)
        args.case = parse_cases(args.case)
        for arm in args.arm:   # before any GPU check or build (folders: main, before the GPU check)
            check_git_ref(arm)
    except SpecError as exc:
        p.error(str(exc))
    problem = output_folder_message(args.output)
    if problem:
        p.error(problem)
    return args


# ------------------------------------------------------------------------------------------
# template folders


def resolve_templates_dir(where: str, arm_name: str = "", label: str | None = None) -> Path:
    """The templates folder an arm's ``where`` names: the folder itself when it holds
    ``mla_decode.cu.j2``, else its ``templates/`` (a worktree's root). SpecError otherwise,
    starting with ``label`` (default: ``--arm NAME=WHERE``)."""
    p = Path(where).expanduser().absolute()
    if label is None:
        label = f"--arm {arm_name}={where}" if arm_name else f"{where!r}"
    if not p.is_dir():
        raise SpecError(f"{label}: no such folder")
    if (p / TEMPLATE_FILE).is_file():
        return p
    if (p / "templates" / TEMPLATE_FILE).is_file():
        return p / "templates"
    raise SpecError(f"{label}: neither the folder nor its templates/ holds {TEMPLATE_FILE}")


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)


def check_git_ref(arm: Arm, repo: Path = REPO) -> None:
    """SpecError when a ``git:`` arm's ref names no commit of ``repo`` (a cheap check before any
    GPU work; the worktree itself is made later, in :func:`arm_folders`). Other arms pass."""
    if arm.kind == "git":
        try:
            found = _git(repo, "rev-parse", "--verify", "--quiet", f"{arm.where}^{{commit}}").returncode == 0
        except OSError as exc:
            raise SpecError(f"--arm {arm.name}=git:{arm.where}: git could not run ({exc})") from None
        if not found:
            raise SpecError(f"--arm {arm.name}=git:{arm.where}: git knows no commit {arm.where!r} in {repo}")


@contextlib.contextmanager
def arm_folders(arms: list[Arm], repo: Path = REPO):
    """``{arm name: templates folder, or None for the repository's own}``; a ``git:`` arm gets
    a detached worktree of its ref in a temporary folder, removed (with ``git worktree
    prune``) when the block ends. SpecError for a folder without the templates or a ref git
    cannot check out."""
    made: list[Path] = []
    tmp = None
    try:
        folders: dict[str, Path | None] = {}
        for arm in arms:
            if arm.kind == "repo":
                folders[arm.name] = None
            elif arm.kind == "dir":
                folders[arm.name] = resolve_templates_dir(arm.where, arm.name)
            else:
                if tmp is None:
                    tmp = Path(tempfile.mkdtemp(prefix="template_ab_"))
                path = tmp / arm.name
                r = _git(repo, "worktree", "add", "--detach", "-q", str(path), arm.where)
                if r.returncode != 0:
                    msg = (r.stderr.strip().splitlines() or ["(no message)"])[-1]
                    raise SpecError(f"--arm {arm.name}=git:{arm.where}: git worktree add failed: {msg}")
                made.append(path)
                folders[arm.name] = resolve_templates_dir(str(path), arm.name)
        yield folders
    finally:
        for path in made:
            _git(repo, "worktree", "remove", "--force", str(path))
        if made:
            _git(repo, "worktree", "prune")
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def no_gpu(prog: str) -> bool:
    """True, after printing why on stderr, when no CUDA GPU is usable (both tools exit 2 then)."""
    from aiter_mla.bench.commands import no_gpu_reason

    reason = no_gpu_reason()
    if reason:
        print(f"{prog}: no CUDA GPU visible ({reason})", file=sys.stderr)
    return reason is not None


@contextlib.contextmanager
def arm_environment():
    """Restores what :func:`use_templates` changes (``AITER_MLA_TEMPLATES_DIR``,
    ``AITER_MLA_CONFIG``) and the JIT's in-process state on the way out."""
    from aiter_mla.jit import core

    saved = {v: os.environ.get(v) for v in ("AITER_MLA_TEMPLATES_DIR", "AITER_MLA_CONFIG")}
    try:
        yield
    finally:
        for v, value in saved.items():
            if value is None:
                os.environ.pop(v, None)
            else:
                os.environ[v] = value
        core.reset_state()


def use_templates(folder: Path | None) -> None:
    """Later ``get_module`` calls of this process render from ``folder`` (None: the
    repository's templates) with the ``jit_config.json`` beside it when it has one (a worktree's
    or ``git:REF`` arm's own parameter space: a tree from before a parameter rename then refuses
    the variant instead of rendering whatever its template's fallback branch holds); the
    repository's otherwise. ``reset_state`` drops the memo and the ops' module handles."""
    from aiter_mla.jit import core

    os.environ.pop("AITER_MLA_CONFIG", None)
    if folder is None:
        os.environ.pop("AITER_MLA_TEMPLATES_DIR", None)
    else:
        os.environ["AITER_MLA_TEMPLATES_DIR"] = str(folder)
        config = Path(folder).parent / "jit_config.json"
        if config.is_file():
            os.environ["AITER_MLA_CONFIG"] = str(config)
    core.reset_state()


# ------------------------------------------------------------------------------------------
# summary (pure)


def summarize(arm_names: list[str], times: dict[str, list[float]]) -> dict[str, dict]:
    """Per arm: its µs per round (round order), their median, the ratio of that median to the
    first arm's, and the spread (max - min) / median. An arm without times gets None."""
    med = {a: (statistics.median(times[a]) if times.get(a) else None) for a in arm_names}
    base = med[arm_names[0]]
    out = {}
    for a in arm_names:
        m, ts = med[a], list(times.get(a) or [])
        out[a] = {"us": ts, "median_us": m,
                  "ratio": (m / base) if (m is not None and base) else None,
                  "spread": ((max(ts) - min(ts)) / m) if (ts and m) else None}
    return out


def _fmt(v, spec: str, none: str = "–") -> str:
    return none if v is None else format(v, spec)


def clock_range(case_arms: dict) -> str:
    """The SM clock (MHz) over a case's arms and rounds: "1980", "1830-1980", or "–" where none
    was recorded. A ratio between rows whose clocks differ mixes clock with kernel speed."""
    mhz = [c for s in case_arms.values() for c in (s.get("clock_mhz") or []) if c is not None]
    if not mhz:
        return "–"
    lo, hi = min(mhz), max(mhz)
    return f"{lo:.0f}" if lo == hi else f"{lo:.0f}-{hi:.0f}"


def render_markdown(doc: dict) -> str:
    """ab.md: the arms, the timing table (per round in round order, median, ratio to the first
    arm) and the round-0 reference check."""
    names = [a["name"] for a in doc["arms"]]
    base = names[0]
    lines = [f"# template A/B ({doc.get('commit', '?')})", ""]
    if doc.get("device"):
        lines += [f"Device: {doc['device']}.", ""]
    lines += [f"{doc['rounds']} rounds; visiting order per round: "
              + "; ".join(" ".join(names[i] for i in order) for order in doc["order"]) + ".", ""]
    lines += ["| arm | templates | tree sha256 |", "|---|---|---|"]
    for a in doc["arms"]:
        lines.append(f"| {a['name']} | `{a['spec'] or '(repository)'}` -> `{a['templates']}` | "
                     f"{(a.get('tree_sha256') or '?')[:12]} |")
    lines += ["", "decode + reduce µs per call (CUDA-graph replay median, rotated inputs); per round "
              "in round order, then the median and its ratio to the first arm's; MHz: the SM clock "
              "over every arm and round of the case (median while each was timed):", ""]
    head = ["case"] + [f"{n} µs" for n in names] + [f"{n} median" for n in names] \
        + [f"{n} / {base}" for n in names[1:]] + ["MHz"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in doc["cases"]:
        s = c["arms"]
        row = [c["case"]] + [" / ".join(f"{t:.1f}" for t in s[n]["us"]) or "–" for n in names] \
            + [_fmt(s[n]["median_us"], ".2f") for n in names] \
            + [_fmt(s[n]["ratio"], ".3f") for n in names[1:]] + [clock_range(s)]
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", f"Round-0 check against float64 (first requests of input set 0): relative L2 of "
              f"the output, max |LSE error|, relative L2 to {base}'s output:", "",
              "| case | arm | rel L2 | max abs LSE err | rel L2 vs " + base + " | ok |", "|---|---|---|---|---|---|"]
    for c in doc["cases"]:
        for n in names:
            chk = c["arms"][n].get("check") or {}
            lines.append(f"| {c['case']} | {n} | {_fmt(chk.get('rel_l2'), '.2e')} | "
                         f"{_fmt(chk.get('lse_max_abs_err'), '.2e')} | {_fmt(chk.get('rel_l2_vs_first'), '.2e')} | "
                         f"{ {True: 'yes', False: 'NO'}.get(chk.get('ok'), '–') } |")
    errs = [(c["case"], n, c["arms"][n]["error"]) for c in doc["cases"] for n in names
            if c["arms"][n].get("error")]
    if errs or doc.get("error"):
        lines += ["", "Errors:", ""] + [f"- {c} / {n}: {e}" for c, n, e in errs]
        if doc.get("error"):
            lines.append(f"- run: {doc['error']}")
    return "\n".join(lines) + "\n"


def lse_max_abs_err(lse, ref) -> float:
    """max |lse - ref| (float64); positions where both are equal (equal infinities included)
    count 0, any other non-finite difference makes it inf. Needs torch, not a GPU."""
    import torch

    a = lse.detach().to(torch.float64)
    b = ref.detach().to(device=a.device, dtype=torch.float64)
    diff = torch.where(a == b, torch.zeros_like(a), (a - b).abs())
    if diff.numel() == 0:
        return 0.0
    if not bool(torch.isfinite(diff).all()):
        return float("inf")
    return float(diff.max())


# ------------------------------------------------------------------------------------------
# the GPU side


@dataclasses.dataclass
class CaseRun:
    """A case's bench inputs, plan and timing choice (shared by every arm)."""

    case: Case
    params: dict
    spec: object        # aiter_mla.bench.sweep.RowSpec
    ri: object          # aiter_mla.bench.sweep.RowInputs
    plan: object        # aiter_mla.bench.sweep._Plan
    per_graph: int
    split_cap: int      # the plan's max_split_per_batch (Case.split_cap on this GPU)
    ref: tuple | None = None


def make_case_runs(cases: list[Case], params: list[dict], seed: int = 0) -> list[CaseRun]:
    """Bench inputs for every case on the current GPU: one KV pool per dtype sized for its
    largest case (``sweep.KVPool``), then each case's row inputs (``sweep.make_row_inputs``) and
    plan buffers (``sweep._Plan``, not yet filled)."""
    import torch

    from aiter_mla import arch
    from aiter_mla.bench import formulas, inputs, sweep

    device = torch.device("cuda", torch.cuda.current_device())
    l2 = sweep.l2_bytes(device)
    num_cu = arch.num_cu(device)
    specs = [sweep.plan_rows([(c.heads, c.qlen)], [c.batch], [c.ctx], [c.page_size], c.dtype, c.dtype,
                             c.varlen, seed)[0] for c in cases]
    ctxs = {}
    for dt in dict.fromkeys(c.dtype for c in cases):
        mine = [s for s, c in zip(specs, cases) if c.dtype == dt]
        tokens = inputs.pool_tokens_for(sweep.max_needed_tokens(mine), l2, formulas.ELEM_BYTES[dt])
        pool = sweep.KVPool(tokens, dt, device, seed)
        ctxs[dt] = sweep.SweepContext(device, pool, {}, l2, num_cu, [], check=True)
    runs = []
    for c, p, s in zip(cases, params, specs):
        ri = sweep.make_row_inputs(s, ctxs[c.dtype])
        cap = c.split_cap(num_cu)
        plan = sweep._Plan(ri, cap)
        floor = formulas.floor_us(s.flops, s.bytes, NOMINAL_CEILINGS, c.dtype, c.dtype)
        per_graph = sweep.calls_per_graph(max(1.5 * floor, 8.0))
        runs.append(CaseRun(c, p, s, ri, plan, per_graph, cap))
    return runs


def reference(run: CaseRun, n_requests: int):
    """float64 (out [rows, H, 512], lse [rows, H]) of input set 0's first ``n_requests``
    requests (as ``aiter_mla.bench.sweep._reference``, with the LSE kept)."""
    from aiter_mla.reference import mla_decode_ref

    ri = run.ri
    n = min(n_requests, ri.batch)
    rows = int(ri.qo_indptr[n])
    kv_end = int(ri.kv_indptr[n])
    return mla_decode_ref(
        ri.q(0, ri.spec.q_dtype)[:rows], ri.kv_window(0, ri.kv_dtype), ri.qo_indptr[:n + 1],
        ri.kv_indptr[:n + 1], ri.kv_indices[:kv_end], ri.kv_last_page_lens[:n],
        sm_scale=ri.sm_scale, q_scale=ri.q_scales[0], kv_scale=ri.kv_scale)


def check_arm(run: CaseRun, first_out, n_requests: int) -> tuple[dict, object]:
    """Runs input set 0 once with the arm's modules (the plan already filled) and compares it
    with the float64 reference; returns (the check dict, this arm's output rows)."""
    import torch

    from aiter_mla.bench.sweep import CHECK_TOL
    from aiter_mla.reference import relative_l2

    if run.ref is None:
        run.ref = reference(run, n_requests)
    ref_out, ref_lse = run.ref
    args, kwargs = run.plan.decode_args(0)
    _logits, lse = run.plan.fwd(*args, **kwargs, return_lse=True)
    torch.cuda.synchronize()
    rows = ref_out.shape[0]
    out = run.plan.out[:rows].clone()
    chk = {"requests": min(n_requests, run.case.batch), "rows": rows,
           "rel_l2": relative_l2(out, ref_out), "lse_max_abs_err": lse_max_abs_err(lse[:rows], ref_lse)}
    chk["rel_l2_vs_first"] = relative_l2(out, first_out) if first_out is not None else None
    chk["tol"] = CHECK_TOL[run.case.dtype]
    chk["ok"] = chk["rel_l2"] <= chk["tol"]
    return chk, out


def time_run(run: CaseRun, budget_s: float):
    """decode + reduce µs per call as the bench times it (CUDA graphs over rotated input sets)."""
    from aiter_mla.bench.sweep import _rotated_calls
    from aiter_mla.bench.timing import time_calls

    return time_calls(_rotated_calls(run.plan.decode, run.ri.rotation, run.per_graph), run.per_graph,
                      budget_s=budget_s)


def build_all(arms: list[Arm], folders: dict, params: list[dict], jobs: int) -> tuple[list[str], dict]:
    """Builds (or loads) every variant under every arm. Returns (the failures as lines,
    {arm name: the JIT cache key of each case's decode variant}: equal keys, equal code)."""
    from aiter_mla.bench.variants import Variant, build_variants
    from aiter_mla.jit.core import variant_key

    variants = list({Variant("mla_decode", p).key: Variant("mla_decode", p) for p in params}.values())
    for arch in dict.fromkeys(p["arch"] for p in params):
        variants += [Variant("mla_metadata", {"arch": arch}),
                     Variant("mla_reduce", {"arch": arch, "out_dtype": "bf16"})]
    failed, keys = [], {}
    for arm in arms:
        use_templates(folders[arm.name])
        t0 = time.perf_counter()
        results = build_variants(variants, jobs, progress=False)
        for r in results:
            if not r.ok:
                failed.append(f"arm {arm.name}: {r.variant.label()} failed: {r.error}")
                failed += [f"    {line}" for line in r.detail]
        if not failed:
            keys[arm.name] = [variant_key("mla_decode", **p)[0] for p in params]
        print(f"arm {arm.name}: {len(results)} variants ready in {time.perf_counter() - t0:.1f} s",
              flush=True)
    return failed, keys


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else '(no message)'}"


def run_ab(args, arms: list[Arm], folders: dict, params: list[dict], keys: dict | None = None) -> dict:
    """The rounds (see the module docstring); returns the results document."""
    import torch

    from aiter_mla.bench import environment
    from aiter_mla.paths import checkout_commit
    from aiter_mla.jit.key import tree_digest
    from aiter_mla.paths import TEMPLATES_DIR

    from aiter_mla.bench.power import Sampler, nvml_id, sampled

    names = [a.name for a in arms]
    order = round_orders(len(arms), args.rounds)
    sampler = Sampler(nvml_id(torch.cuda.current_device()))   # SM clock while each arm is timed
    doc = {"tool": "scripts/template_ab.py", "commit": args.commit or checkout_commit(args.output),
           "device": environment.machine(), "rounds": args.rounds, "order": order,
           "arms": [{"name": a.name, "spec": a.spec, "kind": a.kind,
                     "templates": recorded_path(folders[a.name] or TEMPLATES_DIR),
                     "tree_sha256": tree_digest(folders[a.name] or TEMPLATES_DIR),
                     "decode_keys": (keys or {}).get(a.name)} for a in arms],
           "timing": "decode + reduce (mla_decode_fwd with a pre-made plan) per call: CUDA-graph "
                     "replays of back-to-back calls over rotated input sets (aiter_mla.bench.timing."
                     "time_calls), median over replays",
           "clock_source": sampler.source,   # None: pynvml missing, no clocks recorded
           "cases": []}
    runs = make_case_runs(args.case, params, args.seed)
    times = {(ci, n): [] for ci in range(len(runs)) for n in names}
    clocks = {(ci, n): [] for ci in range(len(runs)) for n in names}   # median SM MHz per round
    checks, errors, methods = {}, {}, {}
    first_out: dict[int, object] = {}
    try:
        for r, visit in enumerate(order):
            for ai in visit:
                arm = arms[ai]
                use_templates(folders[arm.name])
                for ci, run in enumerate(runs):
                    if (ci, arm.name) in errors:
                        continue
                    try:
                        run.plan.metadata()   # this arm's scheduler kernel
                        if r == 0:
                            checks[ci, arm.name], out = check_arm(run, first_out.get(ci), args.check_requests)
                            if ai == 0:
                                first_out[ci] = out
                        with sampled(sampler) as gpu:
                            t = time_run(run, args.budget_s)
                    except Exception as exc:  # recorded; the other arms and cases go on
                        errors[ci, arm.name] = _first_line(exc)
                        torch.cuda.synchronize()
                        continue
                    times[ci, arm.name].append(t.us)
                    clocks[ci, arm.name].append((gpu["clock_mhz"] or {}).get("median"))
                    methods.setdefault((ci, arm.name), set()).add(t.method)
                    print(f"round {r} arm {arm.name:>12s} {run.case.label:28s} {t.us:9.2f} us "
                          f"({t.samples} x {t.calls_per_sample} calls, {t.method})", flush=True)
    except Exception as exc:  # a lost CUDA context ends the run; what was measured is kept
        doc["error"] = _first_line(exc)
    finally:
        use_templates(None)
    for ci, run in enumerate(runs):
        summary = summarize(names, {n: times[ci, n] for n in names})
        for n in names:
            if (ci, n) in checks:
                summary[n]["check"] = checks[ci, n]
            if (ci, n) in errors:
                summary[n]["error"] = errors[ci, n]
            summary[n]["methods"] = sorted(methods.get((ci, n), ()))
            summary[n]["clock_mhz"] = clocks[ci, n]
        doc["cases"].append({**run.case.as_dict(), "split_cap": run.split_cap,
                             "variant": run.params, "calls_per_graph": run.per_graph,
                             "rotation": {"n_sets": run.ri.rotation.n_sets,
                                          "window_pages": run.ri.rotation.window_pages},
                             "arms": summary})
    return doc


def failures(doc: dict) -> list[str]:
    """What makes the exit status 1: a run error, an arm's error, a missed reference check."""
    out = [f"run: {doc['error']}"] if doc.get("error") else []
    for c in doc["cases"]:
        for n, s in c["arms"].items():
            if s.get("error"):
                out.append(f"{c['case']} / {n}: {s['error']}")
            elif s.get("check", {}).get("ok") is False:
                out.append(f"{c['case']} / {n}: rel L2 {s['check']['rel_l2']:.3g} against float64 "
                           f"> {s['check']['tol']}")
    return out


def write_outputs(doc: dict, outdir: Path, stem: str = "ab") -> tuple[Path, Path]:
    outdir.mkdir(parents=True, exist_ok=True)
    js, md = outdir / f"{stem}.json", outdir / f"{stem}.md"
    js.write_text(json.dumps(doc, indent=1) + "\n")
    md.write_text(render_markdown(doc))
    return js, md


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        params = case_variants(args.case)
        for arm in args.arm:   # a bad folder is an argument error, before any GPU work
            if arm.kind == "dir":
                resolve_templates_dir(arm.where, arm.name)
    except SpecError as exc:
        print(f"template_ab.py: error: {exc}", file=sys.stderr)
        return 2
    if no_gpu("template_ab.py"):
        return 2
    try:
        with arm_environment(), arm_folders(args.arm) as folders:
            failed, keys = build_all(args.arm, folders, params, args.jobs)
            if failed:
                print("\n".join(failed), file=sys.stderr)
                return 1
            doc = run_ab(args, args.arm, folders, params, keys)
    except SpecError as exc:
        print(f"template_ab.py: error: {exc}", file=sys.stderr)
        return 2
    js, md = write_outputs(doc, args.output)
    print(render_markdown(doc))
    print(f"wrote {js}, {md}")
    bad = failures(doc)
    for line in bad:
        print(f"template_ab.py: {line}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
