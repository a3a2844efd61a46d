"""Our decode op inside transformers' DeepSeek-V3 (issue 23, item 6): every layer's attention
output against transformers' own, the greedy tokens of a bf16 run against transformers alone,
our op's call count per layer, and a negative control (sm_scale = 1/sqrt(576) must fail).
Runs ``examples/deepseek_v3_decode.py``; skips where transformers is missing."""
from __future__ import annotations

import pytest
from conftest import load_example

pytest.importorskip("transformers", reason="transformers is not installed (the GPU host has it)")
import torch  # noqa: E402


def _example():
    return load_example("deepseek_v3_decode")


def test_token_divergence_is_read_at_the_first_difference():
    """divergences / tokens_agree: only a row's first differing step counts, judged by the
    reference's margin there; a difference at a clear margin fails."""
    ex = _example()
    ref, margins = [[1, 2, 3], [4, 5, 6]], [[9.0, 9.0], [1.0, 9.0], [9.0, 9.0]]
    res = {"divergences": ex.divergences(ref, [[1, 7, 8], [4, 5, 6]], margins)}
    assert res["divergences"] == [{"row": 0, "step": 1, "ref_margin_ulps": 1.0}] and ex.tokens_agree(res)
    res = {"divergences": ex.divergences(ref, [[1, 2, 3], [4, 7, 6]], margins)}
    assert res["divergences"] == [{"row": 1, "step": 1, "ref_margin_ulps": 9.0}] and not ex.tokens_agree(res)
    assert ex.divergences(ref, ref, margins) == []


def test_adapter_with_the_float64_reference_matches_transformers():
    """The adapter itself (absorption, rope, paged cache, scale) with the reference in place of
    the op, on the CPU: within the bf16 tolerance, and the wrong scale is caught."""
    ex = _example()
    res = ex.run("bf16", 64, steps=2, backend="reference", device="cpu")
    assert res["calls_per_layer"] == [2, 2, 2]
    assert max(res["max_rel_l2_per_layer"]) <= ex.TOLERANCE["bf16"], res["max_rel_l2_per_layer"]
    assert abs(res["sm_scale"] - res["model_scaling"]) < 1e-12 and res["sm_scale"] > 0.13
    bad = ex.run("bf16", 64, steps=1, backend="reference", device="cpu", wrong_scale=True)
    assert max(bad["max_rel_l2_per_layer"]) > 10 * ex.TOLERANCE["bf16"]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,page", [("bf16", 64), ("bf16", 1), ("fp8", 64), ("fp8", 1)])
def test_our_op_in_every_layer_matches_transformers(dtype, page):
    ex = _example()
    steps = 8
    res = ex.run(dtype, page, steps=steps, backend="aiter")
    print(f"{dtype} page {page}: per-layer max rel L2 {res['max_rel_l2_per_layer']}, "
          f"tokens match {res['tokens_match']}, first differences {res['divergences']}")
    assert res["calls_per_layer"] == [steps] * 3   # our op ran in every layer, every step
    assert max(res["max_rel_l2_per_layer"]) <= ex.TOLERANCE[dtype], res["max_rel_l2_per_layer"]
    if dtype == "bf16":
        # our op's greedy tokens against those of the same engine with the float64 reference op
        # in its place: each row's first difference, if any, must fall on a rounding tie of
        # that engine (top-2 margin <= ENGINE_TIE_ULPS bf16 spacings). Against transformers
        # alone (its own bf16 attention) the first differences are printed above; a near-tie
        # flipped there too (one step of 8 in one row at 4 bf16 spacings, docs/perf).
        exact = ex.run(dtype, page, steps=steps, backend="reference")
        diff = ex.divergences(exact["our_tokens"], res["our_tokens"], exact["our_margin_ulps"])
        print(f"against the float64 reference engine: first differences {diff}")
        assert ex.tokens_agree({"divergences": diff}, ex.ENGINE_TIE_ULPS), (diff, res["our_tokens"], exact["our_tokens"])


@pytest.mark.gpu
def test_the_wrong_softmax_scale_fails_the_comparison():
    ex = _example()
    res = ex.run("bf16", 64, steps=2, backend="aiter", wrong_scale=True)
    assert res["calls_per_layer"] == [2, 2, 2]
    assert max(res["max_rel_l2_per_layer"]) > 10 * ex.TOLERANCE["bf16"], res["max_rel_l2_per_layer"]
    assert torch.cuda.is_available()
