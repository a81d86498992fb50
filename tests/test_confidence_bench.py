"""benchmarks/confidence.py's measures, without an engine (the confidences themselves are checked
against the draft's logits in test_sglang_draft_chain.py and test_sglang_graphs.py)."""

from __future__ import annotations

import random

import pytest
import torch

from conftest import load_benchmark
from parse_sglang.adaptive import KeepRate, PooledKeepRate

bench = load_benchmark("confidence")


def test_auc_separates_ranks_ties_and_needs_both_classes():
    assert bench.auc([0.9, 0.8, 0.2, 0.1], [True, True, False, False]) == 1.0
    assert bench.auc([0.1, 0.2, 0.8, 0.9], [True, True, False, False]) == 0.0  # the negative control
    assert bench.auc([0.5, 0.5], [True, False]) == 0.5
    assert bench.auc([0.9, 0.4, 0.6, 0.1], [True, True, False, False]) == 0.75
    assert bench.auc([0.9], [True]) is None


def test_reached_positions_stop_after_the_first_rejection():
    rounds = [{"confidence": [0.9, 0.8, 0.3, 0.2], "accepted": 2}, {"confidence": [0.4, 0.7], "accepted": 2}]
    assert bench.reached(rounds) == ([0.9, 0.8, 0.3, 0.4, 0.7], [True, True, False, True, True])
    assert bench.calibration(*bench.reached(rounds)) == [
        [0.3, 1, 0.0],
        [0.4, 1, 1.0],
        [0.7, 1, 1.0],
        [0.8, 1, 1.0],
        [0.9, 1, 1.0],
    ]


def test_a_draft_whose_confidence_is_its_keep_rate_is_predicted_by_it_and_not_by_counts():
    """Rounds whose tokens are kept with probability equal to their confidence, which changes from
    round to round: the calibrated confidence predicts each round's accepted length (correlation
    well above the survival counts', which see only the past); with the confidences shuffled
    against the outcomes (the negative control), it predicts nothing."""
    rng = random.Random(0)
    requests = []
    for _ in range(8):
        rounds = []
        for _ in range(40):
            level = rng.choice([0.05, 0.5, 0.95])
            conf = [min(max(level + rng.uniform(-0.04, 0.04), 0.0), 0.999) for _ in range(8)]
            accepted = next((j for j, c in enumerate(conf) if rng.random() >= c), 8)
            rounds.append({"draft": [1] * 8, "confidence": conf, "accepted": accepted})
        requests.append(rounds)
    row = bench.summarize("sim", requests, 8)
    assert row["auc"] > 0.8 and row["r_calibrated"] > 0.6 and row["r_calibrated"] > row["r_survival"] + 0.3, row
    shuffled = [[dict(r, confidence=rng.choice(rs)["confidence"]) for r in rs] for rs in requests]
    control = bench.summarize("shuffled", shuffled, 8)
    assert abs(control["r_calibrated"]) < 0.2 and abs(control["auc"] - 0.5) < 0.1, control


def test_the_survival_prediction_is_the_controllers_own():
    """The replayed survival counts are adaptive.py's KeepRate and PooledKeepRate, observed
    round by round: the first prediction is the prior's, the second has seen the first round."""
    rounds = [{"draft": [1] * 4, "confidence": [0.9] * 4, "accepted": a} for a in (4, 1, 3)]
    preds = bench.predictions([rounds], 4)
    pooled, own = PooledKeepRate(longest=4), KeepRate()
    assert preds[0][1] == pytest.approx(own.expected(4, pooled))
    own.observe(4, 4)
    pooled.observe(4, 4)
    assert preds[1][1] == pytest.approx(own.expected(4, pooled))
    assert [p[0] for p in preds] == [4, 1, 3]


def test_calibration_observes_a_round_as_one_position_at_a_time():
    """The vectorized observation of a round equals decaying and counting each reached position
    in turn (request by request, position by position), the reference written as a loop."""
    generator = torch.Generator().manual_seed(0)
    calibration, reference = bench.Calibration(), bench.Calibration()
    for _ in range(5):
        confidence = torch.rand(6, 8, generator=generator)
        drafted = torch.randint(0, 9, (6,), generator=generator)
        accepted = torch.minimum(torch.randint(0, 9, (6,), generator=generator), drafted)
        calibration.observe(confidence, drafted, accepted)
        for row, n, a in zip(confidence.tolist(), drafted.tolist(), accepted.tolist()):
            for j, c in enumerate(row[: min(a + 1, n)]):
                b = min(int(c * bench.CONFIDENCE_BINS), bench.CONFIDENCE_BINS - 1)
                reference.reached[b] = bench.CONFIDENCE_DECAY * reference.reached[b] + 1.0
                reference.kept[b] = bench.CONFIDENCE_DECAY * reference.kept[b] + float(j < a)
    assert calibration.reached == pytest.approx(reference.reached, rel=1e-12)
    assert calibration.kept == pytest.approx(reference.kept, rel=1e-12)
    assert sum(reference.reached) > 20  # the rounds reached positions in several buckets
