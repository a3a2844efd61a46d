"""Every CLI option that takes a value, fed a table of bad values: a one-line error or a normal
run, never a Python traceback (CPU; issue 23, item 4)."""
from __future__ import annotations

import argparse
import traceback
from pathlib import Path

import pytest

from aiter_mla import cli

BAD_VALUES = ["", " ", "abc", "nan", "inf", "-inf", "1e400", "-1", "0", "infG", "1e400G", "-5G",
              "99999999999999999999999", "1,2", "é", "--"]

#: Valid values for the required options of a command, so that the option under test is reached.
REQUIRED = {("jit", "gc"): {"--max-bytes": "1G"},
            ("metadata",): {"--batch": "2", "--ctx": "64"}}


def _options(parser, path=()):
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                yield from _options(sub, path + (name,))
        elif a.option_strings and a.nargs != 0 and not isinstance(a, argparse._HelpAction):
            yield path, a.option_strings[-1]


CASES = [(path, opt) for path, opt in _options(cli.build_parser())]


def test_the_table_covers_every_command_with_values():
    assert {p for p, _ in CASES} >= {("jit", "build"), ("jit", "gc"), ("metadata",), ("bench",)}


@pytest.mark.parametrize("path,opt", CASES, ids=[" ".join(p) + " " + o for p, o in CASES])
def test_bad_values_never_give_a_traceback(path, opt, tmp_path, monkeypatch, capsys):
    from aiter_mla.bench import commands as bench_commands

    # A bench whose values pass every check would run a whole sweep on a GPU machine: the sweep
    # is stood in for (after all of run()'s checks), here and on CPU machines alike.
    sweeps = []
    monkeypatch.setattr(bench_commands, "no_gpu_reason", lambda: None)
    monkeypatch.setattr(bench_commands, "bench", lambda args, variants: sweeps.append(args) or 0)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AITER_MLA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("AITER_MLA_DISABLE_JIT", "1")   # no build starts, whatever the value
    monkeypatch.setenv("CU_NUM", "132")
    required = [x for k, v in REQUIRED.get(path, {}).items() if k != opt for x in (k, v)]
    for bad in BAD_VALUES:
        argv = [*path, *required, f"{opt}={bad}"]
        try:
            rc = cli.main(argv)
        except SystemExit as e:
            rc = e.code
        except BaseException:   # noqa: BLE001 - the point: nothing else may escape
            pytest.fail(f"aiter-mla {' '.join(argv)!r} raised:\n{traceback.format_exc()}")
        out = capsys.readouterr()
        assert "Traceback" not in out.err + out.out, (argv, out.err[-1500:])
        assert rc in (0, 1, 2, None), (argv, rc)


def test_version(capsys):
    """``aiter-mla --version`` prints the package version and exits 0."""
    from aiter_mla.version import __version__

    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"aiter-mla {__version__}"


@pytest.mark.parametrize("module,fix", [
    ("torch", "this command needs PyTorch: pip install torch"),
    # the GPU host's `pip install --no-deps` leaves the wheel's other dependencies out; bench
    # then failed with a bare "No module named 'tqdm'" (a fresh-user report)
    ("tqdm", "a dependency of aiter_mla, left out by `pip install --no-deps`: pip install tqdm"),
])
def test_a_missing_module_is_named_with_the_fix(monkeypatch, capsys, module, fix):
    """A command run without a package it needs: the one-line error says how to install it."""
    from aiter_mla import env

    def missing(*_skip):
        raise ModuleNotFoundError(f"No module named '{module}'", name=module)

    monkeypatch.setattr(env, "check_values", missing)
    assert cli.main(["metadata", "--batch", "2", "--ctx", "64"]) == 1
    assert capsys.readouterr().err.strip() == f"aiter-mla metadata: error: No module named '{module}' ({fix})"


def test_the_named_dependencies_are_pyprojects():
    tomllib = pytest.importorskip("tomllib")   # Python >= 3.11
    deps = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]["dependencies"]
    names = sorted(d.split(">")[0].split("=")[0].split("<")[0].strip() for d in deps)
    from aiter_mla.cli_errors import DEPENDENCIES

    assert sorted(["torch", *DEPENDENCIES]) == names


def test_main_restores_the_callers_sigterm_handler(tmp_path, capsys):
    """``main()`` turns SIGTERM into an unwinding exception only while it runs: a program that
    calls it in-process gets its own handler back, on success and on failure."""
    import signal

    def mine(signum, frame):   # pragma: no cover - never delivered
        pass

    old = signal.signal(signal.SIGTERM, mine)
    try:
        assert cli.main(["jit", "list", "--cache-dir", str(tmp_path / "cache")]) == 0
        assert signal.getsignal(signal.SIGTERM) is mine
        assert cli.main(["metadata", "--batch", "-3", "--ctx", "64"]) == 2
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, old)
    capsys.readouterr()


@pytest.mark.parametrize("argv", [["bench"], ["metadata", "--batch", "8", "--ctx", "1-5000"]],
                         ids=["bench", "metadata"])
@pytest.mark.parametrize("seed", [str(2**63), str(2**64), "-1", str(2**32)])
def test_seed_out_of_range_is_a_usage_error(argv, seed, capsys):
    """bench --seed 2**63 (or -1 past a sweep's checks) failed deep inside torch's
    Generator.manual_seed ("Overflow when unpacking long long"): both commands take 0..2**32 - 1
    (the bench's derived generator seeds, seed * 1_000_003 + chunk, then fit), refused by
    argparse otherwise, exit 2 naming --seed and the range."""
    with pytest.raises(SystemExit) as exc:
        cli.main([*argv, "--seed", seed])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --seed: expected an integer in 0..4294967295 (2**32 - 1), got {seed}" in err, err


def test_the_largest_seed_is_taken_and_fits_the_generators(monkeypatch, capsys):
    from aiter_mla.bench import commands as bench_commands
    from aiter_mla.bench.inputs import make_kv_pool

    top = str(2**32 - 1)
    assert cli.main(["metadata", "--batch", "8", "--ctx", "1-5000", "--seed", top, "--json"]) == 0
    sweeps = []
    monkeypatch.setattr(bench_commands, "no_gpu_reason", lambda: None)
    monkeypatch.setattr(bench_commands, "bench", lambda args, variants: sweeps.append(args) or 0)
    monkeypatch.setenv("AITER_MLA_DISABLE_JIT", "1")
    assert cli.main(["bench", "--seed", top, "-b", "1", "-c", "64"]) == 0
    assert sweeps[0].seed == 2**32 - 1
    pool, _ = make_kv_pool(3, "bf16", "cpu", 2**32 - 1, chunk_tokens=1)   # three generators
    assert pool.shape == (3, 576)
    capsys.readouterr()


def test_metadata_seed_only_with_a_random_ctx(capsys):
    """``metadata --ctx 10 --seed 5`` took the seed and ignored it (it only seeds --ctx LO-HI:
    fresh-user report): a usage error naming both flags; with LO-HI it picks the lengths."""
    assert cli.main(["metadata", "--batch", "2", "--ctx", "10", "--seed", "5"]) == 2
    assert "--seed applies only to a random --ctx LO-HI, got --ctx '10' with --seed 5" in capsys.readouterr().err
    runs = []
    for seed in ("1", "1", "2"):
        assert cli.main(["metadata", "--batch", "8", "--ctx", "1-5000", "--seed", seed, "--json"]) == 0
        runs.append(capsys.readouterr().out)
    assert runs[0] == runs[1] != runs[2]
    assert cli.main(["metadata", "--batch", "8", "--ctx", "1-5000", "--json"]) == 0   # seed 0
    assert cli.main(["metadata", "--batch", "8", "--ctx", "1-5000", "--seed", "0", "--json"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == out[1]
