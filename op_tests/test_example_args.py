"""``examples/deepseek_v3_decode.py``'s command line: bad values are usage errors (exit 2, one
line naming the option), checked before anything is imported or built, with or without
transformers (the example's model tests are in test_deepseek_v3_model.py)."""
from __future__ import annotations

import pytest
from conftest import load_example


def _example():
    return load_example("deepseek_v3_decode")


@pytest.mark.parametrize("argv,message", [
    (["--steps", "0"], "--steps must be in 1..4096 (decode steps to compare), got 0"),
    (["--steps", "-2"], "--steps must be in 1..4096 (decode steps to compare), got -2"),
    (["--steps", "99999999999"], "--steps must be in 1..4096 (decode steps to compare), got 99999999999"),
    (["--page-size", "3"], "--page-size must be a power of two in 1..256, got 3"),
    (["--page-size", "512"], "--page-size must be a power of two in 1..256, got 512"),
])
def test_bad_values_exit_2_with_one_line(argv, message, capsys):
    assert _example().main([*argv, "--backend", "reference"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"deepseek_v3_decode: {message}", err


def test_run_refuses_zero_steps():
    for steps in (0, 4097):
        with pytest.raises(ValueError, match=r"steps must be in 1\.\.4096"):
            _example().run(steps=steps, backend="reference", device="cpu")
