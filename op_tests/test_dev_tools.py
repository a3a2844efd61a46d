"""The measuring tools in scripts/: the A/B tool (template_ab.py) and the phase-stamp budget
(phase_budget.py). CPU: argument parsing (arms, cases, the errors naming the argument), the
rotation over rounds, the summary maths, the tables, git worktree arms (in a repository made
in the test), and the budget maths on a hand-built stamps array. GPU: template_ab.py end to
end with two arms on the same templates, and phase_budget.py on one small case (it needs the
kernel side of -DAITER_MLA_PHASE_STAMPS).
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
GIT = shutil.which("git")
gpu = pytest.mark.gpu


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod   # dataclasses look their module up by name
    spec.loader.exec_module(mod)
    return mod


ab = _load("template_ab")
pb = _load("phase_budget")


# ------------------------------------------------------------------------------------------
# template_ab: arms


def test_parse_arm_kinds():
    assert ab.parse_arm("base=") == ab.Arm("base", "repo", "")
    assert ab.parse_arm("new=/w/templates") == ab.Arm("new", "dir", "/w/templates")
    assert ab.parse_arm("old=git:HEAD~1") == ab.Arm("old", "git", "HEAD~1")
    assert ab.parse_arm("v1.2_x-y=rel/dir").where == "rel/dir"
    assert [a.spec for a in ab.parse_arms(["a=", "b=/t", "c=git:main"])] == ["", "/t", "git:main"]


@pytest.mark.parametrize("text, words", [
    ("base", "expected NAME=FOLDER"),
    ("=folder", "must be letters"),
    ("a b=x", "must be letters"),
    ("x=git:", "git: needs a ref"),
    ("x=git:-rf", "git: needs a ref"),
])
def test_parse_arm_errors_name_the_argument(text, words):
    with pytest.raises(ab.SpecError) as e:
        ab.parse_arm(text)
    assert str(e.value).startswith(f"--arm {text!r}") and words in str(e.value)


def test_parse_arms_refuses_repeats_and_none():
    with pytest.raises(ab.SpecError, match=r"--arm a=\.\.\.: the name 'a' is used twice"):
        ab.parse_arms(["a=", "b=", "a=/x"])
    with pytest.raises(ab.SpecError, match="--arm: give at least one arm"):
        ab.parse_arms([])


def test_command_line_errors_name_the_argument(capsys):
    with pytest.raises(SystemExit) as e:
        ab.parse_args(["--arm", "nofolder", "--case", "fp8 128,1 b1 c64"])
    assert e.value.code == 2
    assert "error: --arm 'nofolder': expected NAME=FOLDER" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ab.parse_args(["--arm", "a=", "--case", "fp16 128,1 b1 c64"])
    assert "error: --case 'fp16 128,1 b1 c64': the dtype must be one of fp8, bf16" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ab.parse_args(["--arm", "a=", "--case", "fp8 128,1 b1 c64", "--rounds", "0"])
    assert "--rounds: expected a positive integer, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ab.parse_args(["--case", "fp8 128,1 b1 c64"])
    assert "the following arguments are required: --arm" in capsys.readouterr().err
    # a bad git ref was found only after the GPU check (a fresh-user report)
    if shutil.which("git") is not None:
        with pytest.raises(SystemExit):
            ab.parse_args(["--arm", "a=git:no-such-ref-anywhere", "--case", "fp8 128,1 b1 c64"])
        assert "--arm a=git:no-such-ref-anywhere: git knows no commit 'no-such-ref-anywhere'" in capsys.readouterr().err
    # nan made the time check always false (30 replays), -1 always true (a fresh-user report)
    for bad in ("nan", "-1", "0", "inf", "x"):
        with pytest.raises(SystemExit):
            ab.parse_args(["--arm", "a=", "--case", "fp8 128,1 b1 c64", "--budget-s", bad])
        assert "--budget-s: must be a" in capsys.readouterr().err


def test_output_that_is_a_file_is_refused_before_any_run(tmp_path, capsys):
    # it was found at the write, after the whole GPU run (a traceback, the table never printed)
    afile = tmp_path / "afile"
    afile.write_text("x")
    for argv, tool in ((["--arm", "a=", "--case", "fp8 128,1 b1 c64", "-o", str(afile)], ab),
                       (["--case", "fp8 128,1 b1 c64", "-o", str(afile / "sub")], pb)):
        with pytest.raises(SystemExit) as e:
            tool.parse_args(argv)
        assert e.value.code == 2
        assert "not a folder, so the results could not be saved" in capsys.readouterr().err
    assert ab.output_folder_message(tmp_path / "new" / "deeper") is None


def test_command_line_parses(tmp_path):
    args = ab.parse_args(["--arm", "base=", "--arm", f"new={tmp_path}", "--case", "fp8 128,1 b64 c3200",
                          "--case", "bf16 16,1 b128 c8192 p64", "--case", "fp8 128,1 b64 c3200",
                          "--rounds", "3", "-o", str(tmp_path / "out")])
    assert [a.name for a in args.arm] == ["base", "new"]
    assert [c.label for c in args.case] == ["fp8 128,1 b64 c3200", "bf16 16,1 b128 c8192"]   # repeat dropped
    assert args.rounds == 3 and args.output == tmp_path / "out"


# ------------------------------------------------------------------------------------------
# template_ab: cases


def test_parse_case_values_and_label():
    c = ab.parse_case("fp8 128,1 b64 c3200")
    assert (c.dtype, c.heads, c.qlen, c.batch, c.ctx, c.page_size, c.varlen) == ("fp8", 128, 1, 64, 3200, 64, False)
    c = ab.parse_case("bf16 16,1 b128 c8192 p64")
    assert (c.dtype, c.heads, c.batch, c.ctx, c.page_size) == ("bf16", 16, 128, 8192, 64)
    assert c.label == "bf16 16,1 b128 c8192"   # the default page is not spelled
    c = ab.parse_case("fp8 (64,2) c100 b4 p16 varlen")   # the old spelling, items in any order
    assert (c.heads, c.qlen, c.batch, c.ctx, c.page_size, c.varlen) == (64, 2, 4, 100, 16, True)
    assert c.label == "fp8 64,2 b4 c100 p16 varlen" and ab.parse_case(c.label) == c
    assert c.as_dict()["case"] == c.label and c.as_dict()["page_size"] == 16
    c = ab.parse_case("bf16 16,1 b64 c3200 s2")   # a plan with its own split cap
    assert c.max_split_per_batch == 2 and c.split_cap(132) == 2
    assert c.label == "bf16 16,1 b64 c3200 s2" and ab.parse_case(c.label) == c
    # without sN: the bench's cap (32; min(ceil(num_CU / batch), 32) at >= 128 heads)
    assert ab.parse_case("bf16 16,1 b64 c3200").split_cap(132) == 32
    assert ab.parse_case("fp8 128,1 b64 c3200").split_cap(132) == 3


@pytest.mark.parametrize("text, words", [
    ("fp8 128,1 b64", "expected 'DTYPE HEADS,QLEN"),
    ("int8 128,1 b64 c10", "the dtype must be one of fp8, bf16"),
    ("fp8 128 b64 c10", "'128' must be HEADS,QLEN"),
    ("fp8 0,1 b64 c10", "heads and qlen must be >= 1"),
    ("fp8 128,1 b64 p64 c10 x3", "unknown item 'x3'"),
    ("fp8 128,1 b64 b32 c10", "batch is given twice"),
    ("fp8 128,1 b64 c10 varlen varlen", "varlen is given twice"),
    ("fp8 128,1 b0 c10", "batch must be >= 1"),
    ("fp8 128,1 bx c10", "'bx' must be bN"),
    ("fp8 128,1 c10 p64 varlen", "the batch (bN) is missing"),
    ("fp8 128,1 b4 c10 p48", "power of two in 1..256"),
    ("fp8 128,1 b4 c10 p512", "power of two in 1..256"),
    ("fp8 64,2 b4 c1", "shorter than qlen 2"),
])
def test_parse_case_errors_name_the_argument(text, words):
    with pytest.raises(ab.SpecError) as e:
        ab.parse_case(text)
    assert str(e.value).startswith(f"--case {text!r}") and words in str(e.value), str(e.value)


def test_case_variants_use_the_ops_dispatch():
    (p128, p16) = ab.case_variants([ab.parse_case("fp8 128,1 b64 c3200 p16"), ab.parse_case("bf16 16,1 b1 c64")])
    assert (p128["arch"], p128["block_m"], p128["page_size"], p128["q_dtype"], p128["mask"]) == \
        ("sm_90a", 128, 16, "fp8", "none")
    assert (p16["block_m"], p16["kv_dtype"]) == (64, "bf16")
    with pytest.raises(ab.SpecError, match=r"--case 'fp8 129,1 b1 c64': .*\(129, 1\) is not supported"):
        ab.case_variants([ab.parse_case("fp8 129,1 b1 c64")])


# ------------------------------------------------------------------------------------------
# template_ab: rotation, summary, tables


def test_recorded_arm_folders_are_repository_relative(tmp_path):
    """The A/B record named arms by the author's checkout ("/work/main/.ab/b3/templates"), which
    docs/perf may not hold: folders inside the checkout are recorded relative to it."""
    from aiter_mla.paths import REPO_ROOT, TEMPLATES_DIR

    assert ab.recorded_path(TEMPLATES_DIR) == str(TEMPLATES_DIR.relative_to(REPO_ROOT))   # "templates" here
    assert ab.recorded_path(REPO_ROOT / ".ab" / "x" / "templates") == ".ab/x/templates"
    assert ab.recorded_path(tmp_path) == str(tmp_path)


def test_round_orders():
    assert ab.round_orders(3, 3) == [[0, 1, 2], [1, 2, 0], [2, 0, 1]]
    assert ab.round_orders(2, 3) == [[0, 1], [1, 0], [0, 1]]
    assert ab.round_orders(3, 4)[3] == [0, 1, 2]
    assert ab.round_orders(1, 2) == [[0], [0]]
    # every arm leads some round once rounds >= arms
    assert {o[0] for o in ab.round_orders(4, 4)} == {0, 1, 2, 3}
    with pytest.raises(ValueError):
        ab.round_orders(0, 1)
    with pytest.raises(ValueError):
        ab.round_orders(2, 0)


def test_summarize_medians_ratios_spread():
    s = ab.summarize(["base", "new", "gone"], {"base": [10.0, 12.0, 11.0], "new": [5.5, 7.0, 6.0], "gone": []})
    assert s["base"]["us"] == [10.0, 12.0, 11.0]        # round order kept
    assert s["base"]["median_us"] == 11.0 and s["base"]["ratio"] == 1.0
    assert s["base"]["spread"] == pytest.approx(2.0 / 11.0)
    assert s["new"]["median_us"] == 6.0 and s["new"]["ratio"] == pytest.approx(6.0 / 11.0)
    assert s["new"]["spread"] == pytest.approx(1.5 / 6.0)
    assert s["gone"] == {"us": [], "median_us": None, "ratio": None, "spread": None}
    even = ab.summarize(["a", "b"], {"a": [1.0, 3.0], "b": [4.0, 8.0]})
    assert even["a"]["median_us"] == 2.0 and even["b"]["ratio"] == 3.0
    # a baseline without times leaves every ratio undefined
    assert ab.summarize(["a", "b"], {"a": [], "b": [1.0]})["b"]["ratio"] is None


def _doc():
    chk = {"rel_l2": 8.1e-3, "lse_max_abs_err": 2.0e-5, "rel_l2_vs_first": 0.0, "tol": 0.03, "ok": True}
    return {"commit": "abc1234", "device": "test", "rounds": 3, "order": ab.round_orders(2, 3),
            "arms": [{"name": "base", "spec": "", "templates": "/r/templates", "tree_sha256": "f" * 64},
                     {"name": "new", "spec": "git:HEAD", "templates": "/t/new/templates", "tree_sha256": "e" * 64}],
            "cases": [{"case": "fp8 128,1 b64 c3200",
                       "arms": {**{n: dict(v, check=dict(chk)) for n, v in
                                   ab.summarize(["base", "new"], {"base": [10.0, 12.0, 11.0],
                                                                  "new": [5.5, 7.0, 6.0]}).items()}}}]}


def test_render_markdown_table():
    md = ab.render_markdown(_doc())
    assert "visiting order per round: base new; new base; base new." in md
    assert "| case | base µs | new µs | base median | new median | new / base | MHz |" in md
    assert "| fp8 128,1 b64 c3200 | 10.0 / 12.0 / 11.0 | 5.5 / 7.0 / 6.0 | 11.00 | 6.00 | 0.545 | – |" in md
    assert "| fp8 128,1 b64 c3200 | new | 8.10e-03 | 2.00e-05 | 0.00e+00 | yes |" in md
    assert "`git:HEAD` -> `/t/new/templates` | eeeeeeeeeeee |" in md
    doc = _doc()
    doc["cases"][0]["arms"]["base"]["clock_mhz"] = [1980.0, 1965.0, None]
    doc["cases"][0]["arms"]["new"]["clock_mhz"] = [1830.0, 1980.0, 1980.0]
    assert "| 11.00 | 6.00 | 0.545 | 1830-1980 |" in ab.render_markdown(doc)


def test_clock_range():
    assert ab.clock_range({"a": {"clock_mhz": [1980.0, 1980.0]}, "b": {"clock_mhz": [1980.0]}}) == "1980"
    assert ab.clock_range({"a": {"clock_mhz": [1545.0, None]}, "b": {"clock_mhz": [1950.0]}}) == "1545-1950"
    assert ab.clock_range({"a": {"clock_mhz": [None]}, "b": {}}) == "–"


def test_failures_and_lse_error():
    doc = _doc()
    assert ab.failures(doc) == []
    doc["cases"][0]["arms"]["new"]["check"].update(ok=False, rel_l2=0.5)
    doc["cases"][0]["arms"]["base"]["error"] = "RuntimeError: boom"
    assert ab.failures(doc) == ["fp8 128,1 b64 c3200 / base: RuntimeError: boom",
                                "fp8 128,1 b64 c3200 / new: rel L2 0.5 against float64 > 0.03"]
    inf = math.inf
    lse = torch.tensor([[1.0, inf], [2.5, 3.0]], dtype=torch.float32)
    ref = torch.tensor([[1.25, inf], [2.5, 2.0]], dtype=torch.float64)
    assert ab.lse_max_abs_err(lse, ref) == 1.0        # equal +inf rows count 0
    assert ab.lse_max_abs_err(torch.tensor([inf]), torch.tensor([1.0])) == inf
    assert ab.lse_max_abs_err(torch.tensor([math.nan]), torch.tensor([1.0])) == inf


# ------------------------------------------------------------------------------------------
# template_ab: template folders


def test_resolve_templates_dir(tmp_path):
    (tmp_path / "direct").mkdir()
    (tmp_path / "direct" / ab.TEMPLATE_FILE).write_text("x")
    (tmp_path / "root" / "templates").mkdir(parents=True)
    (tmp_path / "root" / "templates" / ab.TEMPLATE_FILE).write_text("y")
    (tmp_path / "empty").mkdir()
    assert ab.resolve_templates_dir(str(tmp_path / "direct")) == tmp_path / "direct"
    assert ab.resolve_templates_dir(str(tmp_path / "root")) == tmp_path / "root" / "templates"
    assert ab.resolve_templates_dir(str(REPO)) == REPO / "templates"
    with pytest.raises(ab.SpecError, match=r"--arm e=.*empty: neither the folder nor its templates/ holds"):
        ab.resolve_templates_dir(str(tmp_path / "empty"), "e")
    with pytest.raises(ab.SpecError, match="--arm m=.*: no such folder"):
        ab.resolve_templates_dir(str(tmp_path / "missing"), "m")


def test_main_refuses_a_bad_folder_before_any_gpu_work(tmp_path, capsys):
    assert ab.main(["--arm", "a=", "--arm", f"b={tmp_path}", "--case", "fp8 128,1 b1 c64"]) == 2
    assert f"--arm b={tmp_path}: neither the folder nor its templates/ holds mla_decode.cu.j2" in capsys.readouterr().err


def _git(*args, cwd):
    return subprocess.run([GIT, "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd,
                          check=True, capture_output=True, text=True).stdout.strip()


@pytest.mark.skipif(GIT is None, reason="git is not installed")
def test_git_arms_are_temporary_worktrees(tmp_path):
    repo = tmp_path / "repo"
    (repo / "templates").mkdir(parents=True)
    _git("init", "-q", str(repo), cwd=tmp_path)
    (repo / "templates" / ab.TEMPLATE_FILE).write_text("// one\n")
    _git("add", ".", cwd=repo)
    _git("commit", "-q", "-m", "one", cwd=repo)
    (repo / "templates" / ab.TEMPLATE_FILE).write_text("// two\n")
    _git("commit", "-q", "-am", "two", cwd=repo)
    (repo / "templates" / ab.TEMPLATE_FILE).write_text("// dirty\n")   # the checkout's own, uncommitted
    arms = [ab.Arm("r", "repo"), ab.Arm("old", "git", "HEAD~1"), ab.Arm("head", "git", "HEAD"),
            ab.Arm("d", "dir", str(repo))]
    with ab.arm_folders(arms, repo=repo) as f:
        assert f["r"] is None and f["d"] == repo / "templates"
        assert (f["old"] / ab.TEMPLATE_FILE).read_text() == "// one\n"
        assert (f["head"] / ab.TEMPLATE_FILE).read_text() == "// two\n"
        made = [f["old"].parent, f["head"].parent]
        assert len(_git("worktree", "list", "--porcelain", cwd=repo).split("worktree ")) == 4
    assert not any(p.exists() for p in made)
    assert _git("worktree", "list", "--porcelain", cwd=repo).count("worktree ") == 1
    assert (repo / "templates" / ab.TEMPLATE_FILE).read_text() == "// dirty\n"   # untouched
    with pytest.raises(ab.SpecError, match=r"--arm x=git:no-such-ref: git worktree add failed"):
        with ab.arm_folders([ab.Arm("ok", "git", "HEAD"), ab.Arm("x", "git", "no-such-ref")], repo=repo):
            pass
    assert _git("worktree", "list", "--porcelain", cwd=repo).count("worktree ") == 1   # the first removed too


# ------------------------------------------------------------------------------------------
# phase_budget


def test_stamp_flag_is_appended_once():
    assert pb.with_stamp_flag(None) == "-DAITER_MLA_PHASE_STAMPS"
    assert pb.with_stamp_flag("  ") == "-DAITER_MLA_PHASE_STAMPS"
    assert pb.with_stamp_flag("-DAITER_MLA_MBAR_SPIN_LIMIT=20000000") == \
        "-DAITER_MLA_MBAR_SPIN_LIMIT=20000000 -DAITER_MLA_PHASE_STAMPS"
    assert pb.with_stamp_flag("-G -DAITER_MLA_PHASE_STAMPS") == "-G -DAITER_MLA_PHASE_STAMPS"


def test_main_sets_the_flag_before_the_jit(monkeypatch, capsys):
    from aiter_mla.bench import commands

    monkeypatch.setenv(pb.FLAGS_VAR, "-lineinfo")
    monkeypatch.setattr(commands, "no_gpu_reason", lambda: "patched for the test")
    assert pb.main(["--case", "fp8 128,1 b4 c256"]) == 2
    assert os.environ[pb.FLAGS_VAR] == "-lineinfo -DAITER_MLA_PHASE_STAMPS"
    assert "no CUDA GPU visible (patched for the test)" in capsys.readouterr().err


def test_phase_budget_arguments(tmp_path, capsys):
    args = pb.parse_args(["--case", "fp8 128,1 b64 c3200", "--calls", "7", "--templates", str(REPO)])
    assert [c.label for c in args.case] == ["fp8 128,1 b64 c3200"] and args.calls == 7
    assert args.arm == ab.Arm("stamped", "dir", str(REPO))
    assert pb.parse_args(["--case", "fp8 128,1 b1 c64"]).arm == ab.Arm("stamped", "repo")
    assert pb.parse_args(["--case", "fp8 128,1 b1 c64", "--templates", "git:HEAD"]).arm.kind == "git"
    for argv, words in ((["--case", "fp8 128,1 b1"], "error: --case 'fp8 128,1 b1': expected"),
                        (["--case", "fp8 128,1 b1 c64", "--templates", str(tmp_path)],
                         f"error: --templates '{tmp_path}': neither the folder"),
                        (["--case", "fp8 128,1 b1 c64", "--templates", "git:"],
                         "error: --templates 'git:': git: needs a ref"),
                        (["--case", "fp8 128,1 b1 c64", "--calls", "0"], "--calls: expected a positive integer"),
                        (["--case", "fp8 128,1 b1 c64", "--warmup", "-1"], "--warmup must be >= 0")):
        with pytest.raises(SystemExit) as e:
            pb.parse_args(argv)
        assert e.value.code == 2
        assert words in capsys.readouterr().err
    pb.parse_args(["--case", "fp8 128,1 b1 c64", "--calls", "100"])
    assert "the timeline keeps the first 64 of the 100 calls" in capsys.readouterr().err


def test_names_and_unflatten():
    assert pb.parse_names(b"wait_full,qk, softmax", 3) == ["wait_full", "qk", "softmax"]
    with pytest.raises(ValueError, match="gave 2 names"):
        pb.parse_names("a,b", 3)
    with pytest.raises(ValueError, match="gave 0 names"):
        pb.parse_names(None, 1)
    flat = list(range(2 * 3 * 4))
    st = pb.unflatten(flat, 2, 3, 4)
    assert st[0][0] == [0, 1, 2, 3] and st[0][2] == [8, 9, 10, 11] and st[1][1] == [16, 17, 18, 19]
    with pytest.raises(ValueError):
        pb.unflatten(flat, 2, 3, 5)


# 3 CTA slots x 3 roles x (2 phases + tiles), written out by hand:
#   slot 0: wg0 100 + 300 cycles over 2 tiles; wg1 40 + 200 / 2; producer 60 + 20 / 4
#   slot 1: wg0 300 + 300 / 4; wg1 did nothing; producer 40 + 40 / 2
#   slot 2: no tiles anywhere, but wg0 stamped cycles (a CTA whose work list was empty): left out
STAMPS = [
    [[100, 300, 2], [40, 200, 2], [60, 20, 4]],
    [[300, 300, 4], [0, 0, 0], [40, 40, 2]],
    [[999, 999, 0], [0, 0, 0], [0, 0, 0]],
]


def test_budget_table_by_hand():
    b = pb.budget_table([[list(map(int, rec)) for rec in slot] for slot in STAMPS], ["wait", "mma"], clock_mhz=2000.0)
    wg0, wg1, prod = b
    assert [r["name"] for r in b] == ["consumer wg0", "consumer wg1", "producer (score_pv: scorer)"]
    # wg0: slots 0 and 1; 400 + 600 cycles over 6 tiles; slot 2's 1,998 cycles are ignored
    assert (wg0["ctas"], wg0["tiles"], wg0["cycles"], wg0["ignored_slots"]) == (2, 6, 1000, 1)
    wait, mma = wg0["phases"]
    assert wait["phase"] == "wait" and wait["cycles_per_tile"] == pytest.approx(400 / 6)
    assert wait["share"] == pytest.approx(0.4) and mma["share"] == pytest.approx(0.6)
    assert (wait["cta_median"], wait["cta_max"]) == (62.5, 75.0)     # per CTA 50, 75
    assert (mma["cta_median"], mma["cta_max"]) == (112.5, 150.0)     # per CTA 150, 75
    assert mma["cycles_per_tile"] == pytest.approx(100.0)
    assert mma["ns_per_tile"] == pytest.approx(50.0)                 # 100 cycles at 2 GHz
    t = wg0["total"]
    assert t["cycles_per_tile"] == pytest.approx(1000 / 6) and t["share"] == 1.0
    assert (t["cta_median"], t["cta_max"]) == (175.0, 200.0)         # per CTA 200, 150
    # wg1: slot 0 only (slot 1 had no tile and no cycles: not counted as ignored)
    assert (wg1["ctas"], wg1["tiles"], wg1["ignored_slots"]) == (1, 2, 0)
    assert [p["cycles_per_tile"] for p in wg1["phases"]] == [20.0, 100.0]
    assert wg1["phases"][0]["share"] == pytest.approx(40 / 240)
    # producer: 100 + 60 cycles over 6 tiles; per CTA wait 15 and 20, mma 5 and 20
    assert [p["cycles_per_tile"] for p in prod["phases"]] == [pytest.approx(100 / 6), pytest.approx(10.0)]
    assert (prod["phases"][0]["cta_median"], prod["phases"][0]["cta_max"]) == (17.5, 20.0)
    assert (prod["phases"][1]["cta_median"], prod["phases"][1]["cta_max"]) == (12.5, 20.0)


def test_budget_table_edges():
    # no clock: no ns; a role no slot ran: None figures
    b = pb.budget_table([[[5, 1], [0, 0]]], ["only"])
    assert b[0]["phases"][0]["cycles_per_tile"] == 5.0 and b[0]["phases"][0]["ns_per_tile"] is None
    assert b[1]["ctas"] == 0 and b[1]["total"]["cycles_per_tile"] is None and b[1]["name"] == "consumer wg1"
    assert pb.budget_table([[[1, 1]] * 4], ["x"])[3]["name"] == "role 3"
    with pytest.raises(ValueError, match="slot 1: expected 2 roles x 3 fields"):
        pb.budget_table([[[1, 2, 3], [1, 2, 3]], [[1, 2, 3], [1, 2]]], ["a", "b"])
    lines = pb.render_budget(pb.budget_table(STAMPS, ["wait", "mma"], 2000.0), 2000.0)
    assert lines[2] == ("| consumer wg0 (2 CTAs, 6 tiles), 1 slots with cycles but no tile left out | wait | "
                        "66.7 | 40.0% | 62.5 | 75.0 | 33.3 |")
    assert "|  | **total** | 166.7 | 100% | 175.0 | 200.0 | 83.3 |" in lines


def test_timeline_summary_by_hand():
    # two CTAs, two calls (+ an unrecorded third); ns; marks: entry, waited, first_work,
    # last_epilogue_start, last_epilogue_end, exit
    line = [
        [[0, 1000, 3000, 10000, 12000, 12500], [11000, 14000, 16000, 20000, 21000, 21400], [0] * 6],
        [[500, 1400, 3400, 11000, 12600, 13000], [13500, 14200, 17000, 26000, 27000, 28000], [0] * 6],
        [[0] * 6, [0] * 6, [0] * 6],   # a slot past the grid
        [[600, 1200, 0, 0, 0, 1300], [13000, 14100, 0, 0, 0, 14200], [0] * 6],   # a CTA with no work
    ]
    tl = pb.timeline_summary(line)
    assert tl["calls"] == 2
    c0, c1 = tl["per_call_us"]
    assert c0["ctas"] == 3 and c0["working_ctas"] == 2 and "gap" not in c0
    assert c0["release_spread"] == pytest.approx(0.4)          # 1400 - 1000
    assert c0["fill"] == pytest.approx(2.2)                     # median(3000, 3400) - 1000
    assert c0["loop"] == pytest.approx(7.3)                     # median(10000, 11000) - 3200
    assert c0["ends_spread"] == pytest.approx(0.5)              # 11000 - 10500
    assert c0["epilogue"] == pytest.approx(1.8)                 # median(2000, 1600)
    assert c0["tail"] == pytest.approx(2.0)                     # 13000 - 11000
    assert c0["span"] == pytest.approx(12.0)                    # 13000 - 1000
    assert c0["period"] == pytest.approx(13.0)                  # 14000 - 1000
    assert c1["gap"] == pytest.approx(1.0)                      # 14000 - 13000
    assert "period" not in c1 and c1["span"] == pytest.approx(14.0)
    m = tl["median_us"]
    assert m["gap"] == pytest.approx(1.0) and m["period"] == pytest.approx(13.0)
    assert m["fill"] == pytest.approx((2.2 + 2.5) / 2)          # call 1: median(16000, 17000) - 14000
    assert pb.timeline_summary([[[0] * 6]]) is None
    idle = pb.timeline_summary([[[5, 10, 0, 0, 0, 20]]])      # no CTA ran a work
    assert idle["median_us"]["fill"] is None and idle["median_us"]["span"] == pytest.approx(0.01)
    assert pb.render_timeline(idle)[-1].startswith("| – | 0.00 | – |")
    with pytest.raises(ValueError, match="slot 0: a record of 5 marks, expected 6"):
        pb.timeline_summary([[[1, 2, 3, 4, 5]]])
    # bad input named, not a bare TypeError or a negative time (a fresh-user report)
    for bad, words in ((None, "a timeline is .slots..calls..marks. of integer ns, got NoneType"),
                       ([[1, 2, 3, 4, 5, 6]], "slot 0 is not a list of calls"),
                       ([[[1, 2, 3, 4, 5, float("nan")]]], "slot 0 call 0 has a mark that is not an integer"),
                       ([[[1, 10, 3, 4, 5, 6]]], "slot 0 call 0: marks out of order"),
                       ([[[0, 0, 0, 0, 0, 6]]], "marks out of order or the release missing")):
        with pytest.raises(ValueError, match=words):
            pb.timeline_summary(bad)
    with pytest.raises(ValueError, match="timeline names must include .*; missing exit"):
        pb.timeline_summary([[[1, 2, 3, 4, 5, 6]]], names=pb.LINE_MARKS[:5] + ("end",))
    lines = pb.render_timeline(tl)
    assert lines[-1].startswith("| 1.00 | ") and pb.render_timeline(None) == []


# ------------------------------------------------------------------------------------------
# GPU: the tools end to end


def _run_script(name: str, args: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / f"{name}.py"), *args], cwd=str(REPO),
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{name} rc={proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


@gpu
def test_template_ab_end_to_end_same_templates(tmp_path):
    out = tmp_path / "ab"
    _run_script("template_ab", ["--arm", "a=", "--arm", f"b={REPO / 'templates'}", "--case", "fp8 128,1 b8 c1024",
                                "--rounds", "2", "--budget-s", "0.3", "-o", str(out)])
    doc = json.loads((out / "ab.json").read_text())
    assert [a["name"] for a in doc["arms"]] == ["a", "b"]
    assert doc["order"] == [[0, 1], [1, 0]] and doc["rounds"] == 2
    assert doc["arms"][0]["tree_sha256"] == doc["arms"][1]["tree_sha256"]
    assert doc["arms"][0]["decode_keys"] == doc["arms"][1]["decode_keys"]   # same templates, same build
    assert [c["case"] for c in doc["cases"]] == ["fp8 128,1 b8 c1024"]
    arms = doc["cases"][0]["arms"]
    for n in ("a", "b"):
        s = arms[n]
        assert "error" not in s, s
        assert len(s["us"]) == 2 and all(0 < t < 10_000 for t in s["us"])
        assert s["median_us"] == pytest.approx(sum(s["us"]) / 2)
        assert s["methods"] == ["graph"]
        assert len(s["clock_mhz"]) == 2   # one median per round (None where pynvml is missing)
        if doc["clock_source"] is not None:
            assert all(500 < c < 3000 for c in s["clock_mhz"]), s["clock_mhz"]
        chk = s["check"]
        assert chk["ok"] and chk["rel_l2"] <= 0.03 and chk["lse_max_abs_err"] < 0.05
        # the first arm has no first arm to compare with (None, not a false 0)
        assert (chk["rel_l2_vs_first"] is None) if n == "a" else chk["rel_l2_vs_first"] <= 1e-3
    assert arms["a"]["ratio"] == 1.0 and 0.5 < arms["b"]["ratio"] < 2.0
    assert (out / "ab.md").read_text().count("| fp8 128,1 b8 c1024 |") == 3   # timing row + 2 check rows


@gpu
def test_phase_budget_end_to_end(tmp_path):
    out = tmp_path / "pb"
    _run_script("phase_budget", ["--case", "fp8 128,1 b8 c1024", "--calls", "5", "-o", str(out)])
    doc = json.loads((out / "phase_budget.json").read_text())
    assert "-DAITER_MLA_PHASE_STAMPS" in doc["nvcc_flags"].split()
    (c,) = doc["cases"]
    assert "error" not in c, c
    lay = c["layout"]
    assert lay["roles"] == 3 and lay["slots"] >= 1 and len(c["phase_names"]) == lay["fields"] - 1
    assert [r["name"] for r in c["budget"]] == ["consumer wg0", "consumer wg1", "producer (score_pv: scorer)"]
    wg0 = c["budget"][0]
    assert wg0["ctas"] > 0 and wg0["tiles"] > 0 and wg0["total"]["cycles_per_tile"] > 0
    for role in c["budget"]:
        if role["ctas"]:
            assert sum(p["share"] for p in role["phases"]) == pytest.approx(1.0)
    assert c["us_per_call"] > 0 and c["method"] == "graph"
    assert "| **total** |" in (out / "phase_budget.md").read_text()


def test_stamp_build_exports_the_layout_and_plain_build_has_none(private_cache, monkeypatch, cuobjdump):
    """A real nvcc build (no GPU needed) of a decode variant with -DAITER_MLA_PHASE_STAMPS
    exports the stamp layout phase_budget.py reads, {1024 CTA slots, 3 roles, 8 phases + the
    tile count}, with the phases' names; the plain build of the same variant (a separate cache
    entry: the flag enters the key) exports none of the three functions."""
    import ctypes
    import shutil

    import torch

    from aiter_mla.jit import core, get_module
    from aiter_mla.ops import decode

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    pb = _load("phase_budget")
    v = decode.decode_variant(128, 1, 64, torch.float8_e4m3fn, torch.float8_e4m3fn)
    plain = get_module("mla_decode", **v)
    monkeypatch.setenv("AITER_MLA_EXTRA_NVCC_FLAGS", "-DAITER_MLA_PHASE_STAMPS")
    core.reset_state()
    stamped = get_module("mla_decode", **v)
    assert stamped.key != plain.key
    lib = ctypes.CDLL(str(stamped.lib_path))
    dims = (ctypes.c_int * 3)()
    assert getattr(lib, pb.LAYOUT_FN)(dims) == 0 and list(dims) == [1024, 3, 11]
    names_fn = getattr(lib, pb.NAMES_FN)   # attribute access keeps one handle, and its restype
    names_fn.restype = ctypes.c_char_p
    names = names_fn().decode().split(",")
    assert names == ["pdl_wait", "work", "kv_wait", "qk", "softmax", "pv", "produce_wait", "produce_issue", "handover",
                     "epilogue"]
    assert getattr(lib, pb.LINE_LAYOUT_FN)(dims) == 0 and list(dims) == [1024, 64, len(pb.LINE_MARKS)]
    line_names = getattr(lib, pb.LINE_NAMES_FN)
    line_names.restype = ctypes.c_char_p
    assert tuple(line_names().decode().split(",")) == pb.LINE_MARKS
    plain_lib = ctypes.CDLL(str(plain.lib_path))
    for fn in (pb.LAYOUT_FN, pb.NAMES_FN, pb.STAMPS_FN, pb.LINE_LAYOUT_FN, pb.LINE_NAMES_FN, pb.LINE_FN):
        assert hasattr(lib, fn) and not hasattr(plain_lib, fn), fn
    # the stamp sums live in the dynamic block, not in static shared memory: static arrays sit in
    # front of the tile and moved it to 256 mod 512, under the 512-byte alignment the TMA
    # swizzle's V^T reads assume (the stamped fp8 build then computed a wrong PV)
    import re
    import subprocess

    shared = [re.findall(r"SHARED:(\d+)", subprocess.run([cuobjdump, "-res-usage", str(m.lib_path)], capture_output=True,
                                                        text=True, check=True).stdout) for m in (plain, stamped)]
    assert shared[0] and shared[0] == shared[1], shared


def test_an_arm_renders_with_its_own_config(tmp_path, monkeypatch):
    """An arm whose templates folder has a jit_config.json beside it (a worktree or git:REF arm)
    is checked against that config, so a tree from before a parameter rename refuses the
    variant instead of rendering its template's fallback branch (a git:HEAD arm from before the
    loop rename rendered the old mma.sync loop for mainloop=tile_pairs: 3.7x slower, on the
    H200); a bare templates folder and the repository's own use the repository's config."""
    ab = _load("template_ab")
    tree = tmp_path / "tree"
    (tree / "templates").mkdir(parents=True)
    (tree / "jit_config.json").write_text("{}")
    bare = tmp_path / "bare_templates"
    bare.mkdir()
    monkeypatch.setenv("AITER_MLA_CONFIG", "/somewhere/else.json")
    ab.use_templates(tree / "templates")
    assert os.environ["AITER_MLA_TEMPLATES_DIR"] == str(tree / "templates")
    assert os.environ["AITER_MLA_CONFIG"] == str(tree / "jit_config.json")
    ab.use_templates(bare)
    assert os.environ["AITER_MLA_TEMPLATES_DIR"] == str(bare) and "AITER_MLA_CONFIG" not in os.environ
    ab.use_templates(None)
    assert "AITER_MLA_TEMPLATES_DIR" not in os.environ and "AITER_MLA_CONFIG" not in os.environ
