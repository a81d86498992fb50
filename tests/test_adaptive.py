"""The adaptive draft length's parts without SGLang (parse_sglang/adaptive.py): the measured cost
table, the acceptance estimates, the tier choice, and its settings refused by name."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
import torch

from parse_sglang.adaptive import (
    EXPLORE_SAMPLES, PROBE_AFTER, PROBE_AFTER_MAX, SAMPLES, AdaptiveDraftLength, CostTable, Survival, bucket,
)
from parse_sglang.profile_cost import main as profile_cost_main
from parse_sglang.settings import ParseConfig, server_parse_config

TIERS = (0, 4, 8, 16, 32)


def linear_costs(step_s: float = 0.002, verify_s: float = 0.02, row_s: float = 1e-4, buckets=(1, 8, 32)) -> CostTable:
    """A fixed table: each draft step `step_s`, the verify `verify_s` + `row_s` per row."""
    return CostTable(
        draft={(b, L): step_s * (L + 1) for b in buckets for L in TIERS},
        rest={(b, L + 1): verify_s + row_s * (L + 1) for b in buckets for L in TIERS},
        fixed=True,
    )


def policies(n: int, budget: int = 32, judged: bool = False, stride: int = 4):
    return [SimpleNamespace(budget=budget, judged=judged, config=SimpleNamespace(probe_stride=stride)) for _ in range(n)]


def rows_of(tier: int) -> int:
    return tier + 1


def observe(controller, reqs, tier: int, exact: list[int], accepted: list[int] | None = None, bounds=None, judged=False):
    """One round of `reqs` at `tier`: exact-match lengths (and judged lengths, boundaries)."""
    n = len(reqs)
    plan = SimpleNamespace(
        draft_lens=torch.full((n,), tier),
        judged=torch.full((n,), judged),
        real_bounds=lambda: bounds or [[]] * n,
    )
    result = SimpleNamespace(exact_tokens=exact, lengths=accepted or exact)
    controller.observe(reqs, tier, rows_of(tier), plan, result, draft_s=0.0, rest_s=0.0)


def test_bucket_is_next_power_of_two():
    assert [bucket(b) for b in (1, 2, 3, 4, 5, 8, 9, 32, 33)] == [1, 2, 4, 4, 8, 8, 16, 32, 64]


def test_cost_table_skips_warm_up_takes_medians_and_interpolates():
    table = CostTable()
    table.observe(1, 8, 9, draft_s=5.0, rest_s=5.0)  # warm-up: not counted
    assert table.cost(1, 8, 9) is None and table.measured_tiers(1) == set()
    table.observe(1, 8, 9, draft_s=0.9, rest_s=0.1)
    assert table.cost(1, 8, 9) == pytest.approx(1.0)
    table.observe(1, 8, 9, draft_s=30.0, rest_s=0.1)  # a spike (a busy machine)
    table.observe(1, 8, 9, draft_s=0.9, rest_s=0.1)
    assert table.draft[1, 8] == pytest.approx(0.9)  # the median of the counted rounds
    assert table.measured_tiers(1) == {8}  # EXPLORE_SAMPLES = 3 counted rounds
    for _ in range(SAMPLES):
        table.observe(1, 8, 9, draft_s=1.1, rest_s=0.1)
    assert table.draft[1, 8] == pytest.approx(1.1)  # only the last SAMPLES rounds count
    assert table.cost(1, 4, 5) is None  # one tier measured: nothing to interpolate from
    for _ in range(2):
        table.observe(1, 0, 1, draft_s=0.1, rest_s=0.05)
    assert table.measured_tiers(1) == {8}, "tier 0: one counted round so far"
    # draft linear in L + 1 steps between (1, 0.1) and (9, 1.1); rest linear in rows (1, 0.05) .. (9, 0.1)
    assert table.cost(1, 4, 5) == pytest.approx((0.1 + 1.0 * 4 / 8) + (0.05 + 0.05 * 4 / 8))
    assert table.cost(1, 16, 17) == pytest.approx((0.1 + 1.0 * 16 / 8) + (0.05 + 0.05 * 16 / 8))  # extrapolated
    assert table.cost(8, 4, 5) == table.cost(1, 4, 5)  # a bucket without cells borrows the nearest one's
    for tier in (0, 8):
        for seconds in (0.0, 1.0):
            table.observe(8, tier, tier + 1, seconds, seconds)
    assert table.cost(8, 4, 5) == pytest.approx(2.0)  # its own, once it has them
    assert table.cost(4, 4, 5) == pytest.approx(2.0)  # 4: as near 8 as 1 (powers of two); the larger wins


def test_cost_table_load_round_trip_and_bad_files(tmp_path):
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(linear_costs().to_json()))
    loaded = CostTable.load(str(path))
    assert loaded.fixed and loaded.draft == linear_costs().draft and loaded.rest == linear_costs().rest
    loaded.observe(1, 4, 5, 9.0, 9.0)
    loaded.observe(1, 4, 5, 9.0, 9.0)
    assert loaded.draft[1, 4] == pytest.approx(0.01), "a loaded table is fixed"
    lines = loaded.describe().splitlines()
    assert lines[0] == (
        "batch <= 1: draft ms [L=0: 2.0, L=4: 10.0, L=8: 18.0, L=16: 34.0, L=32: 66.0]; "
        "verify and the rest ms [1 rows: 20.1, 5 rows: 20.5, 9 rows: 20.9, 17 rows: 21.7, 33 rows: 23.3]"
    )
    assert len(lines) == 3
    for text, problem in (
        ("{not json", "JSONDecodeError"),
        (json.dumps({"draft": []}), "KeyError"),
        (json.dumps({"draft": [{"bucket": 1, "L": 4}], "rest": []}), "KeyError"),
        (json.dumps({"draft": [], "rest": []}), "holds no measured cells"),
    ):
        path.write_text(text)
        with pytest.raises(ValueError, match=f"cost_table='{path}' is invalid.*{problem}"):
            CostTable.load(str(path))
    with pytest.raises(ValueError, match="cost_table='/nonexistent/costs.json' is invalid .*FileNotFoundError"):
        CostTable.load("/nonexistent/costs.json")


def test_expected_acceptance():
    controller = AdaptiveDraftLength(TIERS, linear_costs())
    est = controller.acceptance(SimpleNamespace())
    assert est.exact.rate == est.boundary.rate == 0.5  # the pooled prior before any round
    est.exact = Survival(1.0, 0.0)
    assert est.expected(8, 4, judged=False) == 8.0
    est.exact = Survival(0.0, 1.0)
    assert est.expected(8, 4, judged=False) == 0.0
    est.exact = Survival(1.0, 1.0)
    assert est.expected(3, 4, judged=False) == pytest.approx(0.5 + 0.25 + 0.125)
    est.boundary = Survival(3.0, 1.0)  # beta = 0.75: boundaries every 4 tokens
    assert est.expected(8, 4, judged=True) == pytest.approx(0.75 * 4 + 0.75**2 * 4)
    assert est.expected(8, 4, judged=False) == pytest.approx(sum(0.5**j for j in range(1, 9)))
    assert est.expected(0, 4, judged=True) == 0.0


def test_controller_picks_tier_zero_for_a_useless_draft_and_the_longest_for_a_perfect_one():
    reqs = [SimpleNamespace() for _ in range(4)]  # a request keeps its estimate on itself
    good_reqs = [SimpleNamespace() for _ in range(4)]
    useless = AdaptiveDraftLength(TIERS, linear_costs())
    perfect = AdaptiveDraftLength(TIERS, linear_costs())
    chosen = {"useless": [], "perfect": []}
    for _ in range(6):
        tier = useless.choose(reqs, policies(4), rows_of)
        chosen["useless"].append(tier)
        observe(useless, reqs, tier, [0] * 4)
        tier = perfect.choose(good_reqs, policies(4), rows_of)
        chosen["perfect"].append(tier)
        observe(perfect, good_reqs, tier, [tier] * 4)
    assert chosen["useless"][-4:] == [0] * 4, chosen
    assert chosen["perfect"][-3:] == [32] * 3 and chosen["perfect"][0] < 32, chosen  # learnt from the prior
    # the same inputs give the same choices (a fixed table: a deterministic function of acceptance)
    again, fresh = AdaptiveDraftLength(TIERS, linear_costs()), [SimpleNamespace() for _ in range(4)]
    replay = []
    for _ in range(6):
        replay.append(again.choose(fresh, policies(4), rows_of))
        observe(again, fresh, replay[-1], [0] * 4)
    assert replay == chosen["useless"]
    # a request's budget caps what a tier can buy: at budget 4 the longer tiers cost more for nothing
    assert perfect.choose(good_reqs, policies(4, budget=4), rows_of) == 4


def test_judged_acceptance_counts_boundaries_passed():
    reqs = [SimpleNamespace()]
    controller = AdaptiveDraftLength(TIERS, linear_costs(step_s=0.01))
    for _ in range(8):  # exact match keeps nothing, the judge passes every boundary
        observe(controller, reqs, 16, [0], [16], bounds=[[4, 8, 12, 16]], judged=True)
    est = controller.acceptance(reqs[0])
    assert est.exact.rate < 0.05 and est.boundary.rate > 0.95  # the prior decays (0.8 per round)
    assert controller.choose(reqs, policies(1, judged=True), rows_of) == 32
    assert controller.choose(reqs, policies(1, judged=False), rows_of) == 0  # unjudged: exact match only


def test_online_costs_explore_the_longest_tier_then_tier_zero():
    controller = AdaptiveDraftLength(TIERS, CostTable())
    reqs = [SimpleNamespace()]
    chosen = []
    for _ in range(2 * (1 + EXPLORE_SAMPLES)):
        chosen.append(controller.choose(reqs, policies(1), rows_of))
        controller.costs.observe(1, chosen[-1], rows_of(chosen[-1]), 0.01 * (chosen[-1] + 1), 0.02)
    assert chosen == [32] * (1 + EXPLORE_SAMPLES) + [0] * (1 + EXPLORE_SAMPLES)  # a warm-up round each
    assert controller.costs.measured_tiers(1) == {0, 32}
    # another bucket borrows them instead of exploring again: its choice is by cost at once
    # (exploring, it would run the longest tier; by cost, at the prior α = 0.5, tier 0 wins)
    assert controller.choose([SimpleNamespace() for _ in range(8)], policies(8), rows_of) == 0
    assert controller.costs.measured_tiers(8) == set() and controller.costs.explored()


def test_tier_zero_is_probed_again_with_backoff():
    reqs = [SimpleNamespace()]
    controller = AdaptiveDraftLength(TIERS, linear_costs())
    tiers = []
    for _ in range(PROBE_AFTER * 10):
        tier = controller.choose(reqs, policies(1), rows_of)
        tiers.append(tier)
        observe(controller, reqs, tier, [0])
    probes = [i for i, t in enumerate(tiers) if t > 0]
    assert all(tiers[i] == 4 for i in probes)  # the prior's rounds, then re-probes: the smallest positive tier
    gaps = [b - a - 1 for a, b in zip(probes, probes[1:]) if b - a > 1]
    assert gaps == [PROBE_AFTER, 2 * PROBE_AFTER, 4 * PROBE_AFTER], tiers  # failing probes back off
    assert PROBE_AFTER_MAX >= 4 * PROBE_AFTER


@pytest.mark.parametrize(
    "values, message",
    [
        ({"adaptive": "yes"}, "adaptive='yes' is invalid: allowed is true or false"),
        ({"adaptive": True, "adaptive_tiers": [4, -1]}, r"adaptive_tiers=\[4, -1\] is invalid: allowed is a list of integers"),
        ({"adaptive": True, "adaptive_tiers": "0,4"}, "adaptive_tiers='0,4' is invalid"),
        ({"adaptive": True, "adaptive_tiers": [0, 64]}, r"adaptive_tiers=\[0, 64\] is invalid: \[64\] exceed the draft budget L=32"),
        ({"adaptive": True, "cost_table": 3}, "cost_table=3 is invalid: allowed is a file path"),
    ],
)
def test_bad_adaptive_settings_are_refused_by_name(values, message):
    with pytest.raises(ValueError, match=message):
        server_parse_config(SimpleNamespace(_parse_config=values), 32)


def test_tiers_default_to_the_standard_set_up_to_l():
    assert ParseConfig(draft_budget=32).tiers == (32,)
    assert ParseConfig(draft_budget=32, adaptive=True).tiers == (0, 4, 8, 16, 32)
    assert ParseConfig(draft_budget=12, adaptive=True).tiers == (0, 4, 8, 12)
    assert ParseConfig(draft_budget=12, adaptive=True, adaptive_tiers=[2, 0]).tiers == (0, 2, 12)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--batch", "0"], r"--batch=\[0\] is invalid: allowed are integers >= 1"),
        (["--tiers", "0", "64"], r"adaptive_tiers=\[0, 64\] is invalid"),
        (["--parse-config", "{bad"], "--parse-config"),
        (["--parse-config", '{"judge": "maybe"}'], "judge='maybe' is invalid"),
        (["--engine-arg", "novalue"], "--engine-arg 'novalue' is invalid: allowed is KEY=VALUE"),
        (["--max-new-tokens", "0"], "--max-new-tokens=0 is invalid"),
    ],
)
def test_profile_cost_refuses_bad_arguments_by_name(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        profile_cost_main(["--model-path", "T", "--draft-model-path", "D", *argv])
    assert exit_.value.code == 2
    assert re.search(message, capsys.readouterr().err)
