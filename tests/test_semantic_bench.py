"""SGLang tier: benchmarks/semantic.py on the synthetic trained pair (docs/testing.md §4), every row
from real engines (target-only, STANDALONE, one PARSE engine with per-request judge settings, an
adaptive PARSE engine).

What it asserts holds for any build of the pair (the trained weights differ between machines,
so the recorded figures of benchmarks/README.md are a build's, not the test's): lossless PARSE
reproduces target-only; each judge takes tokens beyond the exact match, and fewer as its
threshold rises.
"""

from __future__ import annotations

import pytest

from conftest import load_benchmark, probe_config

pytestmark = pytest.mark.sglang

NUM_PROBLEMS = 32


@pytest.fixture(scope="module")
def semantic():
    return load_benchmark("semantic", "semantic_bench")


@pytest.fixture(scope="module")
def rows(semantic, cpu_runtime):
    work = semantic.synthetic_workload(NUM_PROBLEMS)
    return {(row["mode"], row["threshold"]): row for row in semantic.run_rows(work, probe_config(), 96)}


def test_rows_and_lossless(rows, semantic):
    parse_modes = [m for m, _, _ in semantic.parse_rows()]
    assert [key[0] for key in rows] == ["target_only", "standalone", *parse_modes, "parse_adaptive"]
    target, lossless = rows["target_only", None], rows["parse_lossless", None]
    assert lossless["output_ids"] == target["output_ids"] and lossless["accuracy"] == target["accuracy"] >= 0.9
    assert rows["parse_adaptive", None]["output_ids"] == target["output_ids"]
    assert lossless["judged_share"] == 0 and target["tokens_per_target_forward"] == 1.0
    L = probe_config().draft_budget
    assert lossless["verify_rows_per_round"] == L + 1
    for mode, threshold in rows:
        if mode == "parse_likelihood":
            assert rows[mode, threshold]["verify_rows_per_round"] == L + 1  # no probe rows
        if mode == "parse_probe":
            assert rows[mode, threshold]["verify_rows_per_round"] > L + 1


def test_judges_take_fewer_tokens_as_their_threshold_rises(rows):
    """Both judges accept tokens beyond the exact match at their lowest threshold, and a higher
    threshold (τ, λ) accepts no larger share."""
    for mode, thresholds in (("parse_probe", (0.3, 0.5, 0.7, 0.9)), ("parse_likelihood", (0.05, 0.2, 0.5))):
        shares = [rows[mode, t]["judged_share"] for t in thresholds]
        assert shares[0] > 0 and shares == sorted(shares, reverse=True), (mode, shares)


def test_nll_and_plot(rows, semantic, tmp_path):
    work = semantic.synthetic_workload(4)
    few = [dict(row, output_ids=row["output_ids"][:4]) for row in rows.values()]
    semantic.add_target_nll(few, work)
    by_key = {(r["mode"], r["threshold"]): r for r in few}
    assert by_key["parse_lossless", None]["target_nll"] == pytest.approx(by_key["target_only", None]["target_nll"])
    assert all(r["target_nll"] > 0 for r in few)
    semantic.plot(few, str(tmp_path / "curve.png"), "test")
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_of_rows_that_all_pass(semantic, tmp_path):
    """A row every answer of which passed: its Wilson bound is 1.0 give or take a rounding error."""
    rows = [
        {"mode": mode, "threshold": None, "accuracy": 1.0, "accuracy_ci95": [0.61, 1.0 - 1e-12],
         "tokens_per_target_forward": tpf}
        for mode, tpf in (("target_only", 1.0), ("parse_lossless", 8.0))
    ]  # fmt: skip
    semantic.plot(rows, str(tmp_path / "all.png"), "test")
    assert (tmp_path / "all.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--num-steps", "0"], "--num-steps / --probe-stride: draft_budget=0 is invalid"),
        (["--max-new-tokens", "0"], "--max-new-tokens=0 is invalid: allowed is an integer >= 1"),
        (["--num-problems", "0"], "--num-problems=0 is invalid"),
        (["--batch-size", "0"], "--batch-size=0 is invalid: allowed is an integer >= 1"),
        (["--temperature", "-1"], "--temperature=-1.0 / --top-p=1.0 are invalid"),
        (["--target", "T"], "--target, --draft and --prompts go together"),
    ],
)
def test_bad_arguments_are_refused(semantic, capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        semantic.main(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err
