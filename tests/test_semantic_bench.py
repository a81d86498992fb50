"""SGLang tier: benchmarks/semantic.py on the synthetic trained pair (docs/testing.md §4), every row
from real engines (target-only, STANDALONE, one PARSE engine with per-request judge settings, an
adaptive PARSE engine).

What it asserts holds for any build of the pair (the trained weights differ between machines,
so the recorded figures of benchmarks/README.md are a build's, not the test's): lossless PARSE
reproduces target-only; each judge takes tokens beyond the exact match, and fewer as its
threshold rises.
"""

from __future__ import annotations

import json

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
    parse_modes = [m for m, _, _ in semantic.parse_rows(head=False)]
    assert [key[0] for key in rows] == [
        "target_only",
        "standalone",
        *parse_modes,
        "parse_adaptive",
        "parse_default_judge",
    ]
    target, lossless = rows["target_only", None], rows["parse_lossless", None]
    assert lossless["output_ids"] == target["output_ids"] and lossless["accuracy"] == target["accuracy"] >= 0.9
    assert rows["parse_adaptive", None]["output_ids"] == target["output_ids"]
    assert lossless["judged_share"] == 0 and target["tokens_per_target_forward"] == 1.0
    L = probe_config().draft_budget
    assert lossless["verify_rows_per_round"] == L + 1
    for mode, threshold in rows:
        if mode in ("parse_likelihood", "parse_divergence"):
            assert rows[mode, threshold]["verify_rows_per_round"] == L + 1  # no probe rows
        if mode == "parse_probe":
            assert rows[mode, threshold]["verify_rows_per_round"] > L + 1
        row = rows[mode, threshold]  # paired against lossless on the same problems
        b = sum(x and not y for x, y in zip(lossless["correct"], row["correct"]))
        c = sum(y and not x for x, y in zip(lossless["correct"], row["correct"]))
        assert (row["paired_b"], row["paired_c"]) == (b, c) and row["loss_upper95"] >= (b - c) / len(row["correct"])
    right = sum(lossless["correct"])  # against itself: no discordant pair, and still a bound above 0
    assert (lossless["paired_b"], lossless["paired_c"]) == (0, 0)
    no_loss = semantic.paired_difference_interval(right, 0, 0, len(lossless["correct"]) - right, level=0.90)[1]
    assert lossless["loss_upper95"] == no_loss > 0


def test_judges_take_fewer_tokens_as_their_threshold_rises(rows):
    """Every judge accepts tokens beyond the exact match at its lowest threshold, and a higher
    threshold (τ, λ, θ) accepts no larger share."""
    for mode, thresholds in (
        ("parse_probe", (0.3, 0.5, 0.7, 0.9)),
        ("parse_likelihood", (0.05, 0.2, 0.5)),
        ("parse_divergence", (0.5, 1.0, 2.0)),
    ):
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
        {
            "mode": mode,
            "threshold": None,
            "accuracy": 1.0,
            "accuracy_ci95": [0.61, 1.0 - 1e-12],
            "tokens_per_target_forward": tpf,
        }
        for mode, tpf in (("target_only", 1.0), ("parse_lossless", 8.0))
    ]
    semantic.plot(rows, str(tmp_path / "all.png"), "test")
    assert (tmp_path / "all.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_paired_bound_and_merge(semantic, tmp_path):
    """McNemar's exact p and the one-sided bound (Newcombe's interval: tests/test_paired_bound.py) on
    hand-counted tables, and two shards merged into the rows of one run (totals added, per-problem
    lists joined)."""

    def row(mode, correct, tokens=10, forwards=5):
        return {
            "mode": mode,
            "threshold": None,
            "dtype": "bfloat16",
            "correct": correct,
            "tokens": tokens,
            "forwards": forwards,
            "judged": 1,
            "rounds": 2,
            "verify_rows": 10,
            "wall_s": 1.0,
            "output_ids": [[1]] * len(correct),
        }

    base, judge = row("parse_lossless", [True] * 4 + [False]), row("parse_likelihood", [False] + [True] * 4)
    semantic.paired([base, judge])
    assert (judge["paired_b"], judge["paired_c"], judge["mcnemar_p"]) == (1, 1, 1.0)
    assert judge["loss_upper95"] == pytest.approx(0.42992, abs=5e-5)  # (e, f, g, h) = (3, 1, 1, 0), 90% two-sided
    base, judge = row("parse_lossless", [True] * 100), row("parse_head", [False] * 10 + [True] * 90)
    semantic.paired([base, judge])
    assert judge["mcnemar_p"] == pytest.approx(2 * 0.5**10)
    assert judge["loss_upper95"] == pytest.approx(0.16036, abs=5e-5)  # 10 lost in 100 bound the loss at 16 points
    shards = []
    for i, part in enumerate(([True, False], [True, True, False])):
        path = tmp_path / f"shard{i}.jsonl"
        path.write_text("\n".join(json.dumps(r) for r in (row("parse_lossless", part), row("parse_head", part[::-1]))))
        shards.append(str(path))
    merged = {r["mode"]: r for r in semantic.merge(shards)}
    assert merged["parse_lossless"]["correct"] == [True, False, True, True, False]
    assert (merged["parse_head"]["tokens"], merged["parse_head"]["problems"]) == (20, 5)
    assert merged["parse_head"]["tokens_per_target_forward"] == 2.0
    assert (merged["parse_head"]["paired_b"], merged["parse_head"]["paired_c"]) == (2, 2)


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
