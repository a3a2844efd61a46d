"""Every environment variable the package reads is declared once in aiter_mla/env.py as
key-changing or neutral (Triton's CACHE_INVALIDATING / CACHE_NEUTRAL split; the gap behind
intel-xpu-backend-for-triton #6790 was a Python-only knob missing from the key)."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from aiter_mla import env

PKG = Path(__file__).resolve().parent.parent / "aiter_mla"
SOURCES = sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts)
_DIRECT = re.compile(r"\bos\.environ\b|\bos\.getenv\b|\bgetenv\s*\(|\benviron\.get\b|\bputenv\b")
_READERS = {"get", "get_int", "get_flag", "is_set", "is_blank"}


def test_no_environment_access_outside_env_py():
    offenders = []
    for path in SOURCES:
        if path == PKG / "env.py":
            continue
        for no, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if _DIRECT.search(code):
                offenders.append(f"{path.relative_to(PKG.parent)}:{no}: {line.strip()}")
    assert not offenders, ("read environment variables through aiter_mla.env (declare them "
                           "there):\n" + "\n".join(offenders))


def _literal_reads():
    for path in SOURCES:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in _READERS and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "env" and node.args
                    and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[0].value, str)):
                yield path, node.lineno, node.args[0].value


def test_every_literal_read_is_declared():
    reads = list(_literal_reads())
    assert reads, "the scan found no env reads at all: the pattern is broken"
    undeclared = [f"{p.relative_to(PKG.parent)}:{ln}: {name}" for p, ln, name in reads
                  if name not in env.registry()]
    assert not undeclared, "undeclared env vars (add them to aiter_mla/env.py):\n" + \
        "\n".join(undeclared)


def test_every_declared_variable_is_used_somewhere():
    text = "\n".join(p.read_text() for p in SOURCES if p != PKG / "env.py")
    unused = [n for n in env.registry() if f'"{n}"' not in text]
    assert not unused, f"declared in env.py but read nowhere: {unused}"


def test_undeclared_read_fails_at_run_time():
    with pytest.raises(KeyError, match="not declared in aiter_mla/env.py"):
        env.get("AITER_MLA_NO_SUCH_VARIABLE")


def test_declarations_are_documented_and_classified():
    for name, var in env.registry().items():
        assert var.doc.strip(), f"{name} has no doc"
        assert isinstance(var.key_changing, bool)
    assert set(env.key_items()) == {n for n, v in env.registry().items() if v.key_changing}


def test_int_parsing_follows_aiter(monkeypatch):
    # C atoi: the leading [+-]digits count ("2x" is 2 and on, "0x1" is 0 and off)
    for value, on in (("0", False), ("", False), ("abc", False), ("1", True), (" 2 ", True),
                      ("2x", True), ("0x1", False), ("+1", True), ("-3junk", True), ("x1", False)):
        monkeypatch.setenv("AITER_ENABLE_EXPERIMENTAL", value)
        assert env.get_flag("AITER_ENABLE_EXPERIMENTAL") is on


@pytest.mark.parametrize("value", ["abc", "0", "-4", "1.5", "1_0", "\uff11\uff12", "0x10"])
def test_cu_num_must_be_a_positive_integer(monkeypatch, value):
    """CU_NUM sizes the schedule: a value that is not a positive integer is an error naming it
    (it used to read 0 as "unset" and then say CU_NUM was unset). ASCII decimal only: Python's
    int() read "1_0" as 10 and full-width digits as 12 (a break test)."""
    from aiter_mla import arch

    monkeypatch.setenv("CU_NUM", value)
    with pytest.raises(ValueError, match=f"CU_NUM must be .*{value!r}"):
        arch.num_cu()
    monkeypatch.setenv("CU_NUM", "80")
    assert arch.num_cu() == 80


@pytest.mark.parametrize("value", ["", "   "])
def test_cu_num_set_but_empty_is_said_so(monkeypatch, value):
    """An empty or blank CU_NUM counts as unset for the count, but the no-GPU error said
    "CU_NUM is unset" of a variable the user had set (a break test)."""
    import torch

    from aiter_mla import arch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("CU_NUM", value)
    with pytest.raises(RuntimeError, match="no CUDA device is visible and CU_NUM is set but empty or blank: set CU_NUM"):
        arch.num_cu()
    assert env.is_blank("CU_NUM") and not env.is_set("CU_NUM")
    monkeypatch.delenv("CU_NUM")
    with pytest.raises(RuntimeError, match="no CUDA device is visible and CU_NUM is unset: set CU_NUM"):
        arch.num_cu()
    assert not env.is_blank("CU_NUM")


def test_every_variable_has_a_kind():
    assert {v.kind for v in env.registry().values()} <= {"flag", "int", "positive int", "seconds", "words", "path",
                                                             "text"}


@pytest.mark.parametrize("name, bad, good", [
    ("AITER_MLA_LOCK_TIMEOUT", "-1", "5"), ("AITER_MLA_VERBOSE", "maybe", "yes"), ("CU_NUM", "0", "132"),
    ("MAX_JOBS", "x", "0"), ("AITER_MLA_LINEINFO", "2x", "1"), ("AITER_MLA_DISABLE_JIT", "maybe", "0"),
    # a new-user pass found these accepted: a flag of 2 (the message says 0 or 1), a negative
    # MAX_JOBS, and a CU_NUM that sizes schedule buffers in the billions
    ("AITER_MLA_DISABLE_JIT", "2", "on"), ("AITER_MLA_LINEINFO", "2", "off"), ("MAX_JOBS", "-2", "3"),
    ("CU_NUM", "2000000000", "4096"),
    # an unbalanced quote surfaced as shlex's "No closing quotation", naming nothing
    ("AITER_MLA_EXTRA_NVCC_FLAGS", "-DX='a", "-DX='a b'"), ("AITER_MLA_EXTRA_HIP_FLAGS", '"-O3', "-O3"),
    # a ~user with no home folder: pathlib's "Could not determine home directory." named nothing
    ("AITER_MLA_CACHE_DIR", "~aiter_mla_no_such_user_x/c", "~/c"),
])
def test_check_values_names_a_malformed_variable(monkeypatch, capsys, name, bad, good):
    """Every command checks every set variable by its kind first (`aiter-mla info` with
    AITER_MLA_LOCK_TIMEOUT=-1 used to pass, and the first build failed later); `info` reports
    it among the rest and exits 1."""
    from aiter_mla.cli import main

    monkeypatch.setenv(name, bad)
    with pytest.raises(ValueError, match=f"{name} must .*{re.escape(repr(bad))}"):
        env.check_values()
    assert main(["jit", "list"]) == 1
    assert name in capsys.readouterr().err
    assert main(["info", "--json"]) == 1
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert len(problems) == 1 and name in problems[0]
    monkeypatch.setenv(name, good)
    env.check_values()


def test_aiter_knobs_keep_atoi(monkeypatch):
    monkeypatch.setenv("AITER_REBUILD", "abc")
    monkeypatch.setenv("AITER_ENABLE_EXPERIMENTAL", "on")
    env.check_values()
    assert not env.get_flag("AITER_REBUILD") and not env.get_flag("AITER_ENABLE_EXPERIMENTAL")


def test_flag_spellings_share_one_cache_key(monkeypatch):
    """A key-changing flag enters the key by its meaning (AITER_MLA_LINEINFO=yes and =1 made
    two entries of one build)."""
    keys = {}
    for value in ("1", "yes", "true", "ON"):
        monkeypatch.setenv("AITER_MLA_LINEINFO", value)
        keys[value] = env.key_items()["AITER_MLA_LINEINFO"]
    assert set(keys.values()) == {"1"}
    for value in ("0", "false", "off", ""):
        monkeypatch.setenv("AITER_MLA_LINEINFO", value)
        assert env.key_items()["AITER_MLA_LINEINFO"] == "0"


def test_extra_flags_enter_the_key_by_their_words(monkeypatch):
    """" -DFOO " and "-DFOO" are the same compiler command: one cache key (they made two)."""
    keys = []
    for value in ("-DFOO", " -DFOO  ", "-DFOO -DBAR"):
        monkeypatch.setenv("AITER_MLA_EXTRA_NVCC_FLAGS", value)
        keys.append(env.key_items()["AITER_MLA_EXTRA_NVCC_FLAGS"])
    assert keys[0] == keys[1] != keys[2]


def test_extra_flags_split_as_shell_words(monkeypatch):
    """The compilers get the flags variables' shell words; quoting keeps a spaced value whole."""
    monkeypatch.setenv("AITER_MLA_EXTRA_NVCC_FLAGS", "-Xptxas -v  -DMSG='a b'")
    assert env.get_words("AITER_MLA_EXTRA_NVCC_FLAGS") == ["-Xptxas", "-v", "-DMSG=a b"]
    monkeypatch.delenv("AITER_MLA_EXTRA_NVCC_FLAGS")
    assert env.get_words("AITER_MLA_EXTRA_NVCC_FLAGS") == []
    monkeypatch.setenv("AITER_MLA_EXTRA_NVCC_FLAGS", "-DMSG='a b")
    with pytest.raises(ValueError, match="AITER_MLA_EXTRA_NVCC_FLAGS must split into shell words"):
        env.get_words("AITER_MLA_EXTRA_NVCC_FLAGS")
