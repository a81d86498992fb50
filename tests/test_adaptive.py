"""The adaptive draft length's parts without SGLang (parse_sglang/adaptive.py): the measured cost
table, the acceptance estimates, the tier choice, and its settings refused by name."""

from __future__ import annotations

import json
import math
import re
import statistics
from types import SimpleNamespace

import pytest
import torch

from conftest import load_benchmark
from parse_sglang.adaptive import (
    ENDED_PRIOR,
    OutputEnds,
    EXPLORE_MARGIN,
    EXPLORE_SAMPLES,
    HEAD,
    IDLE_S,
    LONGER_MARGIN,
    POOL_HEARD,
    PROBE_BACKOFF_MAX,
    PROBE_OVERHEAD,
    RECHECK_MARGIN,
    SAMPLES,
    STALE_ROUNDS,
    Acceptance,
    AdaptiveDraftLength,
    CostTable,
    bucket,
    running_steps,
)
from parse_sglang.profile_cost import main as profile_cost_main
from parse_sglang.request_state import state_of
from parse_sglang.settings import ParseConfig, server_parse_config

TIERS = (0, 4, 8, 16, 32)


def linear_costs(step_s: float = 0.002, verify_s: float = 0.02, row_s: float = 1e-4, buckets=(1, 8, 32)) -> CostTable:
    """A fixed table: each draft step `step_s`, the verify `verify_s` + `row_s` per row."""
    return CostTable(
        draft={(b, L): step_s * (L + 1) for b in buckets for L in TIERS},
        rest={(b, L + 1): verify_s + row_s * (L + 1) for b in buckets for L in TIERS},
        fixed=True,
    )


EOS = frozenset({2})


def policies(n: int, budget: int = 32, judged: bool = False, stride: int = 4):
    """RequestPolicy's fields the controller reads: a request with `budget + 1` tokens left."""
    return [SimpleNamespace(budget=budget, judged=judged, left=budget + 1, phase=None, output_len=0, stop_ids=EOS,
                            config=SimpleNamespace(probe_stride=stride)) for _ in range(n)]  # fmt: skip


def rows_of(tier: int) -> int:
    return tier + 1


def head_round(controller, reqs, accepted: list[int], draft_s: float = 0.0, rest_s: float = 0.0):
    """One head round of `reqs` (k = controller.head_steps drafts each): their accepted lengths."""
    k = controller.head_steps
    plan = SimpleNamespace(draft_lens=torch.full((len(reqs),), k), confidence=torch.ones(len(reqs), k),
                           judged=torch.zeros(len(reqs), dtype=torch.bool))  # fmt: skip
    controller.observe(reqs, HEAD, k + 1, plan, SimpleNamespace(lengths=accepted), draft_s, rest_s)


def observe(controller, reqs, tier: int, accepted: list[int], draft_s: float = 0.0, rest_s: float = 0.0,
            steps: int = 1):  # fmt: skip
    """One round of `reqs` at `tier`, each drafting `tier` tokens: their accepted lengths (and
    the round's measured seconds; a fixed table ignores them; steps: a tier-0 round's)."""
    plan = SimpleNamespace(draft_lens=torch.full((len(reqs),), tier), confidence=torch.ones(len(reqs), tier),
                           judged=torch.zeros(len(reqs), dtype=torch.bool))  # fmt: skip
    controller.observe(reqs, tier, rows_of(tier), plan, SimpleNamespace(lengths=accepted), draft_s, rest_s, steps)


def test_draft_length_policies_fixed_and_adaptive():
    """The worker asks one policy every round: fixed L (no TP broadcast, nothing shown), or the
    adaptive controller, whose `after_round` learns the round and times it with its own clock."""
    from parse_sglang.draft_length import FixedDraftLength

    fixed = FixedDraftLength(8)
    assert not fixed.per_round and fixed.server_state() == {}
    assert fixed.choose([SimpleNamespace()], policies(1), rows_of, steps=4) == 8
    adaptive = AdaptiveDraftLength.of(ParseConfig(draft_budget=8, adaptive=True))
    assert adaptive.per_round and adaptive.tiers == [0, 8]
    req = SimpleNamespace()
    tier = adaptive.choose([req], policies(1, budget=8), rows_of, steps=4)
    assert tier == 8  # nothing measured: the shortest drafting tier first
    adaptive.drafts_on_host()
    assert getattr(req, "parse", None) is None  # nothing learnt of the request before its round ends
    plan = SimpleNamespace(
        draft_lens=torch.tensor([8]), confidence=torch.full((1, 8), 0.9), judged=torch.tensor([False])
    )
    window = SimpleNamespace(shape=SimpleNamespace(draft_len=8, rows=9), plan=plan)
    adaptive.after_round([req], window, SimpleNamespace(lengths=[5], emitted=[[7] * 9]), steps=1)
    assert req.parse.acceptance.prior_weight < Acceptance().prior_weight  # the request's own curve saw the round
    assert not adaptive.ends.finished  # 6 of its 9 tokens left: still running
    assert sum(adaptive.calibration.reached) == pytest.approx(6, abs=0.1)  # and the calibration: 6 reached, 5 kept
    assert adaptive.server_state()["cost_table"] == adaptive.costs.to_json()


def test_bucket_is_next_power_of_two():
    assert [bucket(b) for b in (1, 2, 3, 4, 5, 8, 9, 32, 33)] == [1, 2, 4, 4, 8, 8, 16, 32, 64]


def timed_round(controller, req, draft_s: float, caught_up: int = 0, idle_s: float = 0.0) -> None:
    """One round of `req` at L = 4 through the controller's own clock (choose, drafts on the host,
    after_round): its draft part took draft_s, it caught up over `caught_up` tokens, and the
    server had idled idle_s seconds before it."""
    if controller._last_end is not None:
        controller._last_end -= idle_s
    assert controller.choose([req], policies(1), rows_of, steps=4) == 4
    controller._clock["start"] -= draft_s
    controller.drafts_on_host(caught_up=caught_up)
    window = SimpleNamespace(shape=SimpleNamespace(rows=5), plan=SimpleNamespace(
        draft_lens=torch.tensor([4]), confidence=torch.ones(1, 4), judged=torch.tensor([False])))  # fmt: skip
    controller.after_round([req], window, SimpleNamespace(lengths=[4], emitted=[[7] * 5]), steps=1)


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
    assert table.cost(4, 4, 5) == pytest.approx(1.0)  # 4: nearer 8 than 1 (powers of two), scaled by 4 / 8


def test_a_round_is_priced_at_its_own_batch_size_within_its_bucket(tmp_path):
    """A bucket's cell holds rounds of any size in it: a round is priced between the mean size of
    the cell's samples and that of the same cell in the neighbouring bucket on its side, the two
    cells' seconds interpolated, never beyond them. Each cell at its own sizes: in the synthetic
    pair's open loop at batch 32 (CPU), priced per bucket, L = 8 low in a bucket cost 0.80 of its
    price and L = 32 1.00, and L = 32 ran there. Controls: at the cell's own size, and where the
    neighbour on that side has no cell, the cell itself; a loaded table, its cells."""
    table = CostTable()
    cells = {  # (batch size, L) -> (draft part, rest) seconds
        (4, 8): (0.040, 0.010),
        (8, 8): (0.060, 0.014),
        (6, 32): (0.120, 0.020),  # bucket 8's L = 32 ran at batch 6
        (3, 32): (0.090, 0.016),
    }
    for (bs, L), (draft_s, rest_s) in cells.items():
        for _ in range(1 + EXPLORE_SAMPLES):
            table.observe(bs, L, L + 1, draft_s, rest_s)
    assert table.cost(8, 8, 9) == pytest.approx(0.074)  # control: the cell's own size
    # batch 5: 3/4 of the way from bucket 8's size (8) to bucket 4's (4)
    assert table.cost(5, 8, 9) == pytest.approx(0.074 + 0.75 * (0.050 - 0.074))
    # L = 32 at batch 5: a third of the way from its cell's size (6) to bucket 4's (3)
    assert table.cost(5, 32, 33) == pytest.approx(0.140 + (0.106 - 0.140) / 3)
    assert table.cost(8, 32, 33) == pytest.approx(0.140)  # above its size: no bucket 16 cell, the cell itself
    assert table.cost(3, 32, 33) == pytest.approx(0.106)
    assert table.cost(4, 8, 9) == pytest.approx(0.050)
    # L = 8's rate (9 tokens a round kept whole) against L = 32's (33) at batch 5: a fifth above the per-bucket prices'
    assert (9 / table.cost(5, 8, 9)) / (33 / table.cost(5, 32, 33)) > (9 / 0.074) / (33 / 0.140) * 1.2
    (tmp_path / "costs.json").write_text(json.dumps(table.to_json()))
    loaded = CostTable.load(str(tmp_path / "costs.json"))
    assert loaded.cost(5, 8, 9) == pytest.approx(0.074)  # control: a loaded table has no sizes


def test_a_smaller_bucket_prices_a_larger_ones_drafting_rounds_in_proportion():
    """A bucket that has run only tier 0 prices a drafting tier from a larger bucket scaled down in
    proportion to the batch (low: tried, and so measured), from a smaller one unscaled. The real
    pair's figures (CPU, seconds): batch 60's L = 8 round (3.0 s draft, 2.43 s verify) had priced
    its later batches of 13-32 at 5.4 s against their tier 0 of 1.3-1.8 s, and they never drafted.
    Control: the bucket that measured them prices them as measured."""
    table = CostTable()
    for batch, cells in ((60, ((8, 9, 3.0, 2.43), (0, 1, 0.001, 0.52))), (15, ((0, 1, 0.001, 0.32),))):
        for tier, rows, draft_s, rest_s in cells:
            for _ in range(2):
                table.observe(batch, tier, rows, draft_s, rest_s)
    assert table.cost(60, 8, 9) == pytest.approx(3.0 + 2.43)  # control: its own cells
    assert table.cost(15, 8, 9) == pytest.approx((3.0 + 2.43) * 16 / 64)  # bucket 16 from bucket 64
    assert table.cost(15, 0, 1, steps=4) == pytest.approx(0.001 + 4 * 0.32)  # tier 0: its own
    assert table.cost(100, 8, 9) == pytest.approx(3.0 + 2.43)  # bucket 128 from 64: unscaled (priced low already)
    for _ in range(2):
        table.observe(60, HEAD, 9, 1.0, 2.43)  # a head round: its draft part 1.0 s, 9 verify rows
    assert table.cost(15, HEAD, 9) == pytest.approx((1.0 + 2.43) * 16 / 64)  # the head tier alike


def test_a_round_that_caught_up_is_no_sample_of_its_tier(cpu_runtime, monkeypatch):
    """A drafting round after deferred prefills, or after tier-0 rounds, first extends the draft
    over what it missed (`DraftChain.catch_up`, which says over how much): its draft part is what
    switching costs, no cost of its tier, however little it caught up over; its rest still is.
    Control: the same rounds priced count (the cell's median moves)."""
    from parse_sglang import draft_chain

    monkeypatch.setattr(draft_chain, "get_schedule", lambda: SimpleNamespace(chunked_prefill_size=0))
    chain, pieces = draft_chain.DraftChain.__new__(draft_chain.DraftChain), []
    chain._extend_pieces = lambda batch, rows, extended: pieces.append(extended)
    reqs = [SimpleNamespace(), SimpleNamespace()]
    batch = SimpleNamespace(reqs=reqs, seq_lens_cpu=torch.tensor([10, 12]))
    assert chain.catch_up(batch, rows=None) == 0 and not pieces  # nothing behind: no extend
    for req, behind in zip(reqs, (4, 3)):  # a tier-0 round's steps: the last few tokens
        draft_chain.state_of(req).draft_behind = behind
    assert chain.catch_up(batch, rows=None) == 4 + 3 and pieces == [[(6, 10), (9, 12)]]
    chain.prefill(SimpleNamespace(reqs=reqs[:1], seq_lens_cpu=torch.tensor([10])), defer=True)
    assert chain.catch_up(batch, rows=None) == 10 and pieces[-1] == [(0, 10), (11, 12)]  # a whole prompt
    chain._run_chain = lambda batch, last, length: (torch.zeros(2, length + 2), None, False)
    chain._confidence = torch.zeros(2, 10)
    draft_chain.state_of(reqs[1]).draft_behind = 1  # one tier-0 step: a catch-up all the same
    assert chain.draft(batch, torch.zeros(2), None, 8).caught_up == 1 and pieces[-1] == [(9, 10), (11, 12)]
    assert chain.draft(batch, torch.zeros(2), None, 8).caught_up == 0  # nothing behind

    for priced, median in ((False, 0.02), (True, 0.05)):
        controller = AdaptiveDraftLength([4], CostTable())  # every round at L = 4
        req = SimpleNamespace()
        # a caught-up round as the uncounted warm-up, two counted, then two more caught up
        for draft_s, caught_up in ((0.5, True), (0.02, False), (0.02, False), (0.08, True), (0.08, True)):
            timed_round(controller, req, draft_s, caught_up=0 if priced or not caught_up else 3)
        assert controller.costs.draft[1, 4] == pytest.approx(median, rel=0.2) and controller.costs.measured_tiers(1)
        assert len(controller.costs._samples[id(controller.costs.rest), (1, 5)]) == 5  # every round's rest counts
        # a catch-up: the median of the caught-up rounds' draft parts less the tier's (0.48, 0.06 twice,
        # each over 3 tokens), at least that over more tokens, in proportion over fewer
        assert controller._catch_up_seconds(10) == (0.0 if priced else pytest.approx(0.06, rel=0.2))
        assert controller._catch_up_seconds(2) == (0.0 if priced else pytest.approx(0.06 * 2 / 3, rel=0.2))


def test_a_round_after_the_server_idled_is_no_cost_sample():
    """The first round after a gap of more than IDLE_S (an idle server, a long prefill) is no
    sample of its draft part or its rest: it paid what waking up costs (1.37x its steady cost at
    batch 32, synthetic pair, CPU). A catch-up it held still prices catch-ups (a batch's first
    round after its prompts' prefill is where the draft catches up over them). The warm-up round
    and the rounds after it count. Control: the same slow round without the gap counts."""
    for idle in (False, True):
        controller, req = AdaptiveDraftLength([4], CostTable()), SimpleNamespace()
        for _ in range(3):  # the warm-up, then two counted rounds
            timed_round(controller, req, 0.02)
        draft = controller.costs._samples[id(controller.costs.draft), (1, 4)]  # [warm-up, counted seconds]
        rest = controller.costs._samples[id(controller.costs.rest), (1, 5)]
        assert len(draft) == len(rest) == 3
        timed_round(controller, req, 0.5, idle_s=2 * IDLE_S if idle else 0.0)  # a slow round
        timed_round(controller, req, 0.5, caught_up=7, idle_s=2 * IDLE_S if idle else 0.0)  # one that caught up
        assert (len(draft), len(rest)) == ((3, 3) if idle else (4, 5))
        assert max(draft[1:]) == pytest.approx(0.02 if idle else 0.5, rel=0.2)
        assert controller._catch_up_seconds(7) == pytest.approx(0.48, rel=0.2)  # either way
        timed_round(controller, req, 0.02)  # the round after: counted again
        assert (len(draft), len(rest)) == ((4, 4) if idle else (5, 6))


def test_a_catch_up_is_priced_from_the_catch_ups_nearest_in_size_never_per_token_from_a_smaller_one():
    """A catch-up is one draft extend: fixed work plus work per token. Priced per token from a
    small one, the synthetic pair's batch of 32 (CPU) priced its prompts' 1,253 tokens from batch
    1's 21 at 0.45 ms each, 0.56 s against a ~20 ms round, and never drafted. Now: from the
    catch-ups nearest in count, at least what they took over more tokens, in proportion over
    fewer. Control: a catch-up of that size, once measured, prices its neighbours."""
    controller = AdaptiveDraftLength((0, 8), CostTable())
    for _ in range(1 + EXPLORE_SAMPLES):
        controller.costs.observe(1, 8, 9, 0.020, 0.01)
        controller.costs.observe(32, 8, 9, 0.040, 0.05)
    controller._caught_up(1, 8, 0.020 + 0.0095, 21)  # 9.5 ms over 21 tokens: 0.45 ms a token
    assert controller._catch_up_seconds(1253) == pytest.approx(0.0095)  # not 1253 x 0.45 ms = 0.57 s
    assert controller._catch_up_seconds(7) == pytest.approx(0.0095 / 3)
    controller._caught_up(32, 8, 0.040 + 0.013, 1253)  # the batch of 32's prompts: 13 ms
    assert controller._catch_up_seconds(1100) == pytest.approx(0.013 * 1100 / 1253)
    assert controller._catch_up_seconds(5000) == pytest.approx(0.013)
    assert controller._catch_up_seconds(16) == pytest.approx(0.0095 * 16 / 21)  # the small one still
    assert controller._catch_up_seconds(0) == 0.0


def test_tier_zero_is_priced_from_tier_zero_rounds_not_from_drafting_rounds():
    """A bucket that never ran tier 0 prices it (a decode step: no draft chain, one verify row)
    from the nearest bucket's tier-0 rounds: extrapolating its drafting rounds' cells down to
    L = 0 and one row keeps their fixed work (the chain's launch, the judge, the drafts' trip),
    which made a decode step at batch 32 cost 3x what it does."""
    table = CostTable()
    for n, tier, rows, draft_s, rest_s in ((1, 0, 1, 1e-4, 0.002), (16, 0, 1, 2e-4, 0.006),
                                           (32, 4, 5, 0.02, 0.056), (32, 8, 9, 0.036, 0.064)):  # fmt: skip
        for _ in range(3):  # a warm-up round, then two counted
            table.observe(n, tier, rows, draft_s, rest_s)
    # the old rule extrapolated bucket 32's cells: draft 0.02 - 4 * 0.004, rest 0.056 - (0.064 - 0.056)
    assert table.cost(32, 0, 1, steps=4) == pytest.approx(2e-4 + 4 * 0.006)  # bucket 16's tier-0 round
    assert table.cost(2, 0, 1) == pytest.approx(1e-4 + 0.002)  # bucket 2 has no cells: the nearest, 1
    assert table.cost(32, 16, 17) == pytest.approx(0.068 + 0.08)  # drafting tiers: still 32's own
    assert table.cost(32, 8, 9) == pytest.approx(0.036 + 0.064)


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


def test_drafting_rounds_are_not_priced_from_decode_steps():
    """Batch 1 ran tier 0 (0.6 ms a step's draft part, 2.3 ms its rest) and L = 4 (7.3 ms, 4 ms
    at 5 rows); batch 8 ran L = 4 .. 32. Batch 1's L = 32 is batch 8's curve scaled to batch 1's
    L = 4 cell (the synthetic pair on CPU: a line through the decode step's cell priced it near
    twice its cost, and its batch of 1 ran tier 0). Tier 0 is still priced from its own cells."""
    table = CostTable(fixed=True)
    table.draft.update({(1, 0): 0.0006, (1, 4): 0.0073})
    table.rest.update({(1, 1): 0.0023, (1, 5): 0.0040})
    for L, draft_s, rest_s in ((4, 0.0105, 0.0070), (8, 0.0154, 0.0065), (16, 0.0303, 0.0085), (32, 0.0640, 0.0117)):
        table.draft[8, L], table.rest[8, L + 1] = draft_s, rest_s
    assert table.cost(1, 32, 33) == pytest.approx(0.0640 * 0.0073 / 0.0105 + 0.0117 * 0.0040 / 0.0070)
    assert table.cost(1, 0, 1, steps=4) == pytest.approx(0.0006 + 4 * 0.0023)
    assert table.cost(1, 4, 5) == pytest.approx(0.0073 + 0.0040)


def test_expected_acceptance_is_the_sum_of_the_survival_curve():
    controller = AdaptiveDraftLength(TIERS, linear_costs())
    req = SimpleNamespace()
    est = controller.acceptance(req)
    assert est.expected(3, controller.pooled) == pytest.approx(0.5 + 0.25 + 0.125)  # the prior: keep rate 1/2
    assert est.expected(0, controller.pooled) == 0.0
    for _ in range(40):  # every round drafts 8 and keeps exactly 4, and so does a new request's first
        observe(controller, [req, SimpleNamespace()], 8, [4, 4])
    # (the request's last rounds outweigh its prior, aged down to PRIOR_WEIGHT_MIN rounds)
    expected = [est.expected(L, controller.pooled) for L in (2, 4, 8, 32)]
    assert expected[0] == pytest.approx(2, rel=0.02) and expected[1] == pytest.approx(4, rel=0.02)
    assert expected[2] == pytest.approx(4, rel=0.02), "position 5 is reached and never kept"
    assert expected[3] == pytest.approx(expected[2], abs=0.01)
    # positions no round of the request reached keep the pooled prior: a fresh request sees the pool
    fresh = controller.acceptance(SimpleNamespace())
    assert fresh.expected(4, controller.pooled) == pytest.approx(4, abs=0.2)
    assert fresh.expected(32, controller.pooled) < 4.5
    for _ in range(40):
        observe(controller, [req], 16, [16])
    long_rounds = est.expected(16, controller.pooled)
    assert long_rounds > 15.5  # its own rounds, not the pool (which remembers the rounds that stopped at 4)
    observe(controller, [req], 16, [2])  # one miss at position 3 pulls every longer length down
    assert est.expected(16, controller.pooled) < long_rounds - 3
    assert est.expected(2, controller.pooled) == pytest.approx(2, rel=0.01)
    # a request's text changes as it goes: rounds that stop at 4 age what the long ones saw
    # further on, until the request values those positions as the server's requests keep them
    for _ in range(20):
        observe(controller, [req], 4, [4])
    pooled = controller.acceptance(SimpleNamespace()).expected(16, controller.pooled)
    assert est.expected(16, controller.pooled) == pytest.approx(pooled, rel=0.1)
    assert pooled < long_rounds - 2


def test_a_new_request_starts_from_what_requests_keep_in_their_first_rounds():
    """The pooled curve counts a request's rounds by its prior's weight in it (1, 0.6, 0.36, ...):
    the synthetic pair's closed batch of 32 ended in ~50 rounds of its few stragglers, and the
    next request, a batch of 1 that keeps all of L = 32, started at L = 4 from them. Here 32
    requests keep all 32 in their first two rounds, then 3 stragglers run 20 rounds each keeping
    6 of 32: a new request starts at L = 32. Control: the same rounds counted alike (the pool
    before) start it at L = 8."""
    controller = AdaptiveDraftLength(TIERS, linear_costs())
    batch = [SimpleNamespace() for _ in range(32)]
    for _ in range(2):
        observe(controller, batch, 32, [32] * 32)
    for _ in range(20):
        observe(controller, batch[:3], 32, [6] * 3)
    assert controller.choose([SimpleNamespace()], policies(1), rows_of) == 32
    alike = AdaptiveDraftLength(TIERS, linear_costs())
    for _ in range(2 * 32):
        alike.pooled.observe(32, 32)
    for _ in range(20 * 3):
        alike.pooled.observe(32, 6)
    assert alike.choose([SimpleNamespace()], policies(1), rows_of) == 8


def test_output_ends_are_a_product_limit_estimate_of_finished_lengths():
    """10 requests stopped at 38 tokens and 10 were cut at max_new_tokens = 64 (censored): a
    request 17 tokens out emits tokens 18..38 for sure and each later one with P(F > 38 | F > 17)
    = 1 - 10 / (20 + ENDED_PRIOR); one 40 tokens out has passed every end seen. No request
    stopped yet, or only cuts: no estimate (every token counts)."""
    ends = OutputEnds()
    assert ends.going([17], 32) is None
    cut = SimpleNamespace(left=4, output_len=60, stop_ids=EOS)
    for _ in range(10):
        ends.observe_round([cut], SimpleNamespace(emitted=[[5, 6, 7, 8, 9]], lengths=[4]))  # cut at 64
    assert ends.going([17], 32) is None and list(ends.finished)[-1] == (64, False)
    running, stopping = (
        SimpleNamespace(left=30, output_len=30, stop_ids=EOS),
        SimpleNamespace(left=30, output_len=32, stop_ids=EOS),
    )
    for _ in range(10):  # a stop token as the 6th emitted: output ends at 38; the other request goes on
        ends.observe_round(
            [running, stopping], SimpleNamespace(emitted=[[5] * 9, [5, 5, 5, 5, 5, 2, 5, 5, 5]], lengths=[8, 8])
        )
    assert list(ends.finished).count((38, True)) == 10 and len(ends.finished) == 20
    going = ends.going([17, 40], 32)
    later = 1 - 10 / (20 + ENDED_PRIOR)
    assert going[0, :21].tolist() == [1.0] * 21 and going[0, 21:] == pytest.approx(
        torch.full((12,), later, dtype=torch.float64)
    )
    assert going[1].tolist() == [1.0] * 33


def test_draft_tokens_past_where_outputs_end_are_worth_nothing():
    """Every draft kept, and past requests ended at 38 tokens: a request 33 tokens out (5 left
    to write) is not drafted for at L = 32 but at L = 4; one 1 token out still at L = 32. Control:
    without the ends, L = 32 for both."""
    controller = AdaptiveDraftLength(TIERS, linear_costs())
    for _ in range(50):
        observe(controller, [SimpleNamespace()], 32, [32])
    stopping = SimpleNamespace(left=30, output_len=32, stop_ids=EOS)
    late, early = policies(2, budget=32)
    late.output_len, late.left = 33, 64 - 33
    assert controller.choose([SimpleNamespace()], [late], rows_of) == 32
    for _ in range(20):
        controller.ends.observe_round([stopping], SimpleNamespace(emitted=[[5, 5, 5, 5, 5, 2]], lengths=[5]))
    assert controller.choose([SimpleNamespace()], [late], rows_of) == 4
    assert controller.choose([SimpleNamespace()], [early], rows_of) == 32


def test_tier_zero_rounds_stop_where_the_batch_more_likely_ended():
    """A tier-0 round runs its decode steps up to the first whose token every request of the batch
    more likely than not no longer needs (past requests stopped at 38 tokens, 15 of 20): a request
    36 tokens out runs 2 of 4 steps (tokens 37 and 38), one 17 out all 4, and a batch of the two
    all 4 (its steps still serve the earlier request). Control: no ends seen, all 4."""
    assert running_steps(None, 4) == 4
    assert running_steps(torch.tensor([[1.0, 0.9, 0.6, 0.4, 0.2]]), 4) == 3
    assert running_steps(torch.tensor([[1.0, 0.1, 0.1, 0.1, 0.1]]), 4) == 1  # at least one
    assert running_steps(torch.tensor([[1.0, 0.4, 0.4, 0.4], [1.0, 0.4, 0.4, 0.4]]), 4) == 4  # P(any) = 0.64
    controller = AdaptiveDraftLength([0, 8], linear_costs())
    near, far = policies(2, budget=8)
    near.output_len, far.output_len = 36, 17
    for reqs, steps in (([near], 4), ([far], 4), ([near, far], 4)):
        controller.choose([SimpleNamespace() for _ in reqs], reqs, rows_of, steps=4)
        assert controller.decode_steps(4) == steps, "no ends seen: every step"
    stopping, cut = (
        SimpleNamespace(left=30, output_len=32, stop_ids=EOS),
        SimpleNamespace(left=4, output_len=60, stop_ids=EOS),
    )
    for i in range(20):  # 15 stopped at 38, 5 cut at 64: P(F > 38 | F > 36) = 1 - 15 / (20 + ENDED_PRIOR)
        ended = (stopping, [[5, 5, 5, 5, 5, 2]], [5]) if i < 15 else (cut, [[5, 6, 7, 8, 9]], [4])
        controller.ends.observe_round([ended[0]], SimpleNamespace(emitted=ended[1], lengths=ended[2]))
    for reqs, steps in (([near], 2), ([far], 4), ([near, far], 4)):
        controller.choose([SimpleNamespace() for _ in reqs], reqs, rows_of, steps=4)
        assert controller.decode_steps(4) == steps and controller.decode_steps(1) == 1


def test_a_request_that_stops_keeping_its_drafts_leaves_long_tiers_at_once():
    """A bad stretch of text in a server whose requests keep nearly every draft token: the
    request's last rounds decide against the pooled prior (with the first version's slow ageing,
    DECAY = 0.8 and a prior that never aged, a request that kept 14 of 32 and then 1 of 21 stayed
    at L = 16 and 8 for five more rounds of 0-2 tokens, measured on the synthetic pair; that
    ageing, in this test, runs 8, 4, 4, 4, 4)."""
    controller = AdaptiveDraftLength(TIERS, linear_costs(step_s=0.003, verify_s=0.005))
    for _ in range(200):  # the server: every round keeps what it drafts
        controller.pooled.observe(16, 16)
    req = SimpleNamespace()
    assert controller.choose([req], policies(1), rows_of) >= 16  # L = 32 pays by less than LONGER_MARGIN here
    observe(controller, [req], 32, [14])
    observe(controller, [req], 32, [1])
    chosen = []
    for accepted in (2, 0, 1, 1, 0):
        chosen.append(controller.choose([req], policies(1), rows_of))
        if chosen[-1]:
            observe(controller, [req], chosen[-1], [min(accepted, chosen[-1])])
    assert chosen[0] <= 8 and chosen[1] <= 4 and chosen[2:] == [0] * 3, chosen


def test_a_request_that_keeps_everything_at_a_short_tier_is_not_locked_in():
    """The batch-1 lock-in on the synthetic pair (L = 8 in 2 of 4 runs where L = 32 was best): the
    start-up's two rounds at L = 32 kept 8 of 32; later rounds at L = 8 keep all 8, which says
    nothing of position 9 on, so the pooled curve's two failures there never aged and priced
    every longer tier below L = 8 for good. Positions no round reaches age with the pooled curve
    now, so a request that keeps everything tries the longer tiers again (here after ~100
    rounds of 9 tokens) and stays at the longest once it keeps that too."""
    controller = AdaptiveDraftLength(TIERS, linear_costs())
    req = SimpleNamespace()
    observe(controller, [req], 32, [8])
    observe(controller, [req], 32, [8])
    chosen = []
    for _ in range(300):
        chosen.append(controller.choose([req], policies(1), rows_of))
        observe(controller, [req], chosen[-1], [chosen[-1]])  # keeps everything it drafts
    assert chosen[0] == 8, chosen[:5]
    first_long = next(i for i, tier in enumerate(chosen) if tier > 8)
    assert first_long <= 200 and chosen[-20:] == [32] * 20, (first_long, chosen[-20:])


def test_positions_past_a_requests_frontier_keep_at_its_rate_by_succession():
    """Past the furthest position a request has reached (8: it keeps 8 of 8), every position keeps
    at one unknown rate r, the frontier's, whose counts (a kept of n reached, the prior's share
    included) make it Beta(a, n - a): the chance of keeping k more is E[r^k] = B(a + k, n - a) /
    B(a, n - a), a reference computed here from the Beta function; E[r]^k, what a product of the
    frontier's mean rate gave, valued its 32nd position at less than half of that (here 0.37)."""
    controller = AdaptiveDraftLength(TIERS, linear_costs())
    for _ in range(30):  # other requests' rounds at L = 32 fail at 7: the pooled rate from there is low
        observe(controller, [SimpleNamespace()], 32, [6])
    req = SimpleNamespace()
    for _ in range(3):
        observe(controller, [req], 8, [8])
    own, priors = controller.acceptance(req), controller.pooled.keep_rates()
    a, n = own.survival.counts(7, priors[7], own.prior_weight)  # 3 rounds' 8th position, the prior's share added
    assert len(own.survival.reached) == 8 and max(priors[8:]) < a / n  # the frontier's rate rules past it
    alive = own.alive(controller.pooled)  # [1, S(1), ..., S(32)]
    for k in range(1, 25):
        moment = math.exp(math.lgamma(a + k) - math.lgamma(a) + math.lgamma(n) - math.lgamma(n + k))  # E[r^k]
        assert alive[8 + k] == pytest.approx(alive[8] * moment, rel=1e-9), k
    assert alive[32] > 2 * alive[8] * (a / n) ** 24  # the mean's power: the old valuation
    assert own.expected(32, controller.pooled) == pytest.approx(sum(alive[1:33]))
    # a request that failed at its frontier keeps its low rate there: the succession starts from it
    failing = SimpleNamespace()
    for _ in range(3):
        observe(controller, [failing], 8, [7])
    assert controller.acceptance(failing).alive(controller.pooled)[32] < 0.01


def test_the_verify_stops_where_calibrated_confidence_says_the_draft_will_not_survive():
    """After L = 32 is drafted, the verify keeps the tier whose expected tokens (sums of the
    calibrated confidences' products) per second of the whole round are the best: where a row
    costs as much as a draft step and every request's confidence drops after position 4, it
    verifies 4; where it stays high, all 32 (or the requests' budget); before the calibration
    has seen enough positions, all 32."""
    confident = [0.95] * 4 + [0.05] * 28
    reqs = [SimpleNamespace() for _ in range(2)]
    controller = AdaptiveDraftLength(TIERS, linear_costs(step_s=0.002, verify_s=0.004, row_s=0.002))
    assert controller.verify_length(policies(2), torch.tensor([confident] * 2), rows_of) == 32  # not calibrated
    for _ in range(20):  # high confidence is kept, low is not
        controller.calibration.observe(torch.tensor([[0.95] * 4 + [0.05]]), [5], [4])
    assert controller.calibration.keep_rate(0.95) > 0.9 and controller.calibration.keep_rate(0.05) < 0.1
    assert controller.verify_length(policies(2), torch.tensor([confident] * 2), rows_of) == 4
    assert controller.verify_length(policies(2), torch.tensor([[0.95] * 32] * 2), rows_of) == 32
    assert controller.verify_length(policies(2, budget=8), torch.tensor([[0.95] * 32] * 2), rows_of) == 8
    # what a round verified is what the calibration and the survival curves learn from
    plan = SimpleNamespace(draft_lens=torch.tensor([4, 4]), confidence=torch.tensor([[0.55] * 4] * 2),
                           judged=torch.tensor([False, True]))  # fmt: skip
    before = list(controller.calibration.reached)
    controller.observe(reqs, 32, rows_of(4), plan, SimpleNamespace(lengths=[2, 4]), 0.0, 0.0)
    assert sum(controller.calibration.reached) - sum(before) == pytest.approx(3, abs=0.5)  # the judged one: not
    assert controller.verify_length(policies(2, judged=True), torch.tensor([confident] * 2), rows_of) == 32


def test_calibration_observes_a_round_as_one_position_at_a_time():
    """The vectorized observation of a round equals decaying and counting each reached position
    in turn (request by request, position by position), the reference written as a loop."""
    from parse_sglang.adaptive import CONFIDENCE_BINS, CONFIDENCE_DECAY, Calibration

    generator = torch.Generator().manual_seed(0)
    calibration, reference = Calibration(), Calibration()
    for _ in range(5):
        confidence = torch.rand(6, 8, generator=generator)
        drafted = torch.randint(0, 9, (6,), generator=generator)
        accepted = torch.minimum(torch.randint(0, 9, (6,), generator=generator), drafted)
        calibration.observe(confidence, drafted, accepted)
        for row, n, a in zip(confidence.tolist(), drafted.tolist(), accepted.tolist()):
            for j, c in enumerate(row[: min(a + 1, n)]):
                b = min(int(c * CONFIDENCE_BINS), CONFIDENCE_BINS - 1)
                reference.reached[b] = CONFIDENCE_DECAY * reference.reached[b] + 1.0
                reference.kept[b] = CONFIDENCE_DECAY * reference.kept[b] + float(j < a)
    assert calibration.reached == pytest.approx(reference.reached, rel=1e-12)
    assert calibration.kept == pytest.approx(reference.kept, rel=1e-12)
    assert sum(reference.reached) > 20  # the rounds reached positions in several buckets


def test_a_request_that_keeps_all_it_drafts_is_valued_past_its_reach_by_its_own_rate():
    """The server's pooled curve says position 9 on is rarely kept (other requests' text); a
    request that keeps all 8 of its L = 8 drafts round after round is valued past position 8 at its
    own rate, not the pool's, so it tries the longest tier at once; where it then fails at 12, its
    own curve prices the tiers from what it saw and leaves L = 32."""
    controller = AdaptiveDraftLength(TIERS, linear_costs())
    others = [SimpleNamespace() for _ in range(8)]
    for _ in range(20):
        observe(controller, others, 32, [8] * 8)  # the server: kept 8, lost the 9th
    req = SimpleNamespace()
    assert controller.choose([req], policies(1), rows_of) == 8  # a new request: the pool's curve
    observe(controller, [req], 8, [8])
    observe(controller, [req], 8, [8])
    assert controller.choose([req], policies(1), rows_of) == 32
    for _ in range(3):
        observe(controller, [req], 32, [12])
    assert controller.acceptance(req).expected(32, controller.pooled) == pytest.approx(12, abs=1.0)
    assert controller.choose([req], policies(1), rows_of) in (8, 16)  # 13 tokens at 16 cost what 9 do at 8


def test_a_longer_drafting_tier_is_chosen_only_where_it_pays_by_the_margin(monkeypatch):
    """Eight requests that keep all they draft: L = 32 is chosen over L = 8 where its expected
    rate is LONGER_MARGIN times L = 8's or more, and L = 8 where it is ahead by less (the synthetic
    pair's closed batch of 8 chose L = 32 at 1.03x and lost to fixed L = 8 by its straggler).
    Tier 0 is priced out of the way; control: without the margin the longer tier wins at 1.03x."""
    reqs = [SimpleNamespace() for _ in range(8)]
    controller = AdaptiveDraftLength((0, 8, 32), linear_costs())
    for _ in range(6):
        observe(controller, reqs, 32, [32] * 8)
    tokens = {t: controller._expected_tokens(t, reqs, policies(8), 1, None) for t in (8, 32)}
    assert tokens[32] > 3 * tokens[8]  # the requests keep what they draft

    def choice(ratio: float) -> int:
        """The choice where L = 32's rate is `ratio` times L = 8's (1 token per ms at L = 8)."""
        seconds = {8: tokens[8] / 1000, 32: tokens[32] / (1000 * ratio)}
        controller.costs = CostTable(draft={(8, 0): 1.0, **{(8, t): 0.0 for t in seconds}},
                                     rest={(8, 1): 1.0, **{(8, t + 1): s for t, s in seconds.items()}},
                                     fixed=True)  # fmt: skip
        return controller.choose(reqs, policies(8), rows_of)

    assert [choice(r) for r in (1.03, 0.99 * LONGER_MARGIN, 1.01 * LONGER_MARGIN, 2.0)] == [8, 8, 32, 32]
    assert choice(0.97) == 8
    monkeypatch.setattr("parse_sglang.adaptive.LONGER_MARGIN", 1.0)
    assert choice(1.03) == 32


def test_judged_jumps_are_valued_by_where_they_land():
    """A judged request that stops at its first boundary (8) or passes every one: the survival
    curve values L = 8 at 8 and L = 32 at 8 too; a geometric per-token model would value L = 32
    above L = 8 (the first version of the controller did, and over-chose long tiers)."""
    req = SimpleNamespace()
    controller = AdaptiveDraftLength(TIERS, linear_costs(step_s=0.001))
    for _ in range(30):
        observe(controller, [req], 32, [8])
    est = controller.acceptance(req)
    assert est.expected(8, controller.pooled) == pytest.approx(8, rel=0.04)
    assert est.expected(32, controller.pooled) == pytest.approx(est.expected(8, controller.pooled), abs=0.05)
    assert controller.choose([req], policies(1), rows_of) == 8


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


def test_online_costs_explore_the_shortest_tier_then_tier_zero_then_close_tiers():
    controller = AdaptiveDraftLength(TIERS, CostTable())
    reqs = [SimpleNamespace()]
    chosen = []

    def round_(batch=reqs, accepted=0):
        tier = controller.choose(batch, policies(len(batch)), rows_of)
        chosen.append(tier)
        observe(controller, batch, tier, [min(tier, accepted)] * len(batch), 0.002 * (tier + 1), 0.02)

    for _ in range(2 * (1 + EXPLORE_SAMPLES)):
        round_()
    assert chosen == [4] * (1 + EXPLORE_SAMPLES) + [0] * (1 + EXPLORE_SAMPLES)  # a warm-up round each
    assert controller.costs.measured_tiers(1) == {0, 4}
    # 8 new requests: the pool has heard from one request, so their first round drafts (see
    # test_a_pool_that_has_heard_from_few_requests_does_not_keep_a_new_one_from_drafting) ...
    first = [SimpleNamespace() for _ in range(8)]
    assert controller.choose(first, policies(8), rows_of) == 4
    observe(controller, first, 4, [0] * 8)  # its bucket's warm-up round: no sample
    # ... then another bucket borrows the costs instead of exploring again: its choice is by cost
    # at once (exploring, it would run tier 4; by cost, with nothing accepted so far, tier 0 wins)
    assert controller.choose([SimpleNamespace() for _ in range(8)], policies(8), rows_of) == 0
    assert controller.costs.measured_tiers(8) == set() and controller.costs.explored()
    # a draft that keeps 6 of each round: tier 8 (extrapolated cost) comes close to the measured 4;
    # it is measured before the choice settles on the best by measured costs
    chosen.clear()
    for _ in range(60):
        round_(accepted=6)
    assert 8 in chosen, chosen
    assert controller.costs.measured_tiers(1) >= {0, 4, 8}
    assert chosen[-5:] == [8] * 5, chosen


def test_a_measured_tier_priced_too_high_is_measured_again_once_its_price_is_stale():
    """A measured tier priced too high (L = 8 at batch 4 from two of the server's first rounds, in
    the synthetic pair's open loop at batch 8) is never run while another tier looks better, so its
    price is never corrected. Once its cell has gone STALE_ROUNDS rounds without a sample, it runs
    again where its rate is within RECHECK_MARGIN of the best and what its round may lose against
    the best is at most PROBE_OVERHEAD of the rounds' seconds since its last sample; that round's
    sample replaces the old ones. Controls: a stale tier further below the best is not run, nor one
    whose loss the seconds since cannot pay (the rounds since were no cost samples: idle gaps).
    Only its bucket's rounds age a cell: rounds at batch 32 in between leave it fresh (counted in
    the server's rounds, the synthetic bar's closed batch of 8 re-checked tier 0 in its runs, its
    cells aged by the batches of 32 and the open loops between them)."""
    true_s, l32_s = 0.05, 0.1  # L = 8 emits 9 tokens a request, L = 32 13 (it keeps 12)
    for overpriced_s, timed, rechecked in ((0.08, True, True), (0.14, True, False), (0.08, False, False)):
        controller, reqs = AdaptiveDraftLength((0, 8, 32), CostTable()), [SimpleNamespace() for _ in range(4)]
        for tier, seconds in ((0, 0.04), (8, overpriced_s), (32, l32_s)):
            for _ in range(1 + EXPLORE_SAMPLES):
                observe(controller, reqs, tier, [min(tier, 12)] * 4, seconds, 0.0)
        assert controller.costs.measured_tiers(4) == {0, 8, 32}
        others = [SimpleNamespace() for _ in range(32)]
        for _ in range(2 * STALE_ROUNDS):
            observe(controller, others, 8, [8] * 32, 0.2, 0.1)
        assert controller.costs.stale_tiers(4) == {} and controller.costs.stale_tiers(32) == {}
        rates = {t: controller._expected_tokens(t, reqs, policies(4), 1, None)
                 / controller.costs.cost(4, t, rows_of(t)) for t in (8, 32)}  # fmt: skip
        assert (rates[8] / rates[32] >= RECHECK_MARGIN) == (overpriced_s < 0.1) and rates[8] < rates[32], rates
        assert rates[8] * overpriced_s / true_s > rates[32]  # priced right, L = 8 wins
        chosen = []
        for _ in range(2 * STALE_ROUNDS):
            chosen.append(controller.choose(reqs, policies(4), rows_of))
            seconds = true_s if chosen[-1] == 8 else l32_s
            observe(
                controller, reqs, chosen[-1], [min(chosen[-1], 12)] * 4, *((seconds, 0.0) if timed else (None, None))
            )
        if not rechecked:
            assert chosen == [32] * 2 * STALE_ROUNDS
            continue
        # L = 8 last sampled in round 2 (1 + EXPLORE_SAMPLES) of 3 (1 + EXPLORE_SAMPLES) before the loop:
        # stale from the loop's round `first` on, where 3 (1 + E) + first - 2 (1 + E) > STALE_ROUNDS
        first = chosen.index(8)
        assert chosen[:first] == [32] * first and first == STALE_ROUNDS + 1 - (1 + EXPLORE_SAMPLES), chosen
        assert controller.costs.draft[4, 8] == pytest.approx(true_s)  # its old samples replaced
        assert chosen[first + 1] == 8 and chosen[first:].count(8) > 2 * chosen[first:].count(32), chosen  # by its price


def test_a_tier_a_bucket_runs_once_a_visit_is_measured_across_visits():
    """A closed batch of 8 runs L = 32 once a visit, and between visits the server runs 64
    rounds at batch 32. Its cell's samples add up across visits to a measured cost: counted in
    the server's rounds, the cell was stale at each visit, its one sample replaced by the next, so
    it was never measured and explored again at every visit (the synthetic bar's closed batches
    of 8 and 32 ran L = 32 at every run's first round)."""
    costs = CostTable()
    for visit in range(1 + EXPLORE_SAMPLES):
        assert costs.measured_tiers(8) == set(), visit
        costs.observe(8, 32, 33, 0.2, 0.05, 0.25)
        for _ in range(2 * STALE_ROUNDS):
            costs.observe(32, 8, 9, 0.1, 0.05, 0.15)
    assert costs.measured_tiers(8) == {32} and costs.draft[8, 32] == pytest.approx(0.2)


def test_a_tier_priced_from_other_cells_is_not_explored_in_a_round_that_catches_up():
    """A round that first catches the draft up (over a deferred prefill's prompt, or tokens
    committed at tier 0) is no sample of its tier's draft part: a tier explored there stays
    unmeasured and is explored again (the synthetic pair's closed batches of 8 ran L = 32 at each
    batch's first round, its prefill's draft deferred, three visits without a sample). There the
    best tier runs; the next round, caught up, explores, and its sample counts. Control: the same
    prices with nothing behind explore at once; a stale tier alike."""
    controller = AdaptiveDraftLength((0, 8, 32), CostTable())
    batch, others = [SimpleNamespace() for _ in range(8)], [SimpleNamespace() for _ in range(32)]
    for tier, seconds in ((0, 0.03), (8, 0.06), (32, 0.075)):  # batch 32 measured every tier
        for _ in range(1 + EXPLORE_SAMPLES):
            observe(controller, others, tier, [min(tier, 12)] * 32, seconds, 0.05)
    for tier, seconds in ((0, 0.02), (8, 0.04)):  # batch 8 tiers 0 and 8
        for _ in range(1 + EXPLORE_SAMPLES):
            observe(controller, batch, tier, [min(tier, 7)] * 8, seconds, 0.03)
    assert controller.costs.measured_tiers(8) == {0, 8}
    rates = {t: controller._expected_tokens(t, batch, policies(8), 1, None)
             / controller.costs.cost(8, t, rows_of(t)) for t in (8, 32)}  # fmt: skip
    assert EXPLORE_MARGIN <= rates[32] / rates[8] < LONGER_MARGIN, rates  # close, not chosen by its rate
    for req in batch:
        state_of(req).draft_behind = 40
    assert controller.choose(batch, policies(8), rows_of) == 8
    for req in batch:  # control: caught up, it is explored
        state_of(req).draft_behind = 0
    assert controller.choose(batch, policies(8), rows_of) == 32
    for _ in range(1 + EXPLORE_SAMPLES):
        observe(controller, batch, 32, [7] * 8, 0.06, 0.03)
    assert controller.costs.measured_tiers(8) == {0, 8, 32}
    for _ in range(2 * STALE_ROUNDS):  # L = 32 stale (L = 8 each round)
        observe(controller, batch, 8, [7] * 8, 0.04, 0.03)
    assert 32 in controller.costs.stale_tiers(8)
    rates = {t: controller._expected_tokens(t, batch, policies(8), 1, None)
             / controller.costs.cost(8, t, rows_of(t)) for t in (8, 32)}  # fmt: skip
    assert RECHECK_MARGIN <= rates[32] / rates[8] < 1, rates  # below the best: only a re-check runs it
    for req in batch:
        state_of(req).draft_behind = 40
    assert controller.choose(batch, policies(8), rows_of) == 8
    for req in batch:
        state_of(req).draft_behind = 0
    assert controller.choose(batch, policies(8), rows_of) == 32


def test_a_pool_that_has_heard_from_few_requests_does_not_keep_a_new_one_from_drafting():
    """Costs measured online; the start-up explores on one request whose draft keeps nothing (as
    SGLang's warm-up request, whose text the synthetic draft keeps 1, 0 and 0 of), so the pool
    says drafts keep nothing and tier 0 wins by cost. Until the pool has heard from POOL_HEARD
    requests, a new request's first round still drafts, the shortest tier; its own rounds then
    decide. Controls: a new request with 1 token of budget left (it could not pay kept whole);
    the request after POOL_HEARD were heard; a loaded table (no exploration) heard from one."""
    costs = dict(step_s=0.01, verify_s=0.02, row_s=0.0)  # a probe must emit 3.5 tokens to pay
    controller = AdaptiveDraftLength(TIERS[:2], CostTable())

    def rounds(reqs, keep: int, n: int, budget: int = 32) -> list[int]:
        tiers = []
        for _ in range(n):
            tiers.append(controller.choose(reqs, policies(len(reqs), budget), rows_of))
            draft_s = costs["step_s"] * (tiers[-1] + 1) if tiers[-1] else 0.0
            observe(controller, reqs, tiers[-1], [min(keep, tiers[-1])] * len(reqs), draft_s, costs["verify_s"])
        return tiers

    explored = 1 + EXPLORE_SAMPLES  # a warm-up round, then the counted ones
    explorer = SimpleNamespace()
    assert rounds([explorer], keep=0, n=2 * explored) == [4] * explored + [0] * explored  # the start-up
    assert controller._break_even_of(1, 4, rows_of) == pytest.approx(3.5)
    assert rounds([SimpleNamespace()], keep=0, n=1, budget=1) == [0]  # control: it could not pay
    # control: a new request that cannot draft (no budget left), in a batch that could pay: it would never
    # be heard from, so a first round for it would come every round
    batch = policies(4)
    batch[3].budget = 0
    assert controller.choose([explorer] * 3 + [SimpleNamespace()], batch, rows_of) == 0
    for _ in range(POOL_HEARD - 1):
        assert rounds([SimpleNamespace()], keep=0, n=3) == [4, 0, 0]  # its first round, then its own evidence
    assert rounds([SimpleNamespace()], keep=0, n=3) == [0, 0, 0]  # control: the pool has heard enough
    loaded = AdaptiveDraftLength(TIERS[:2], linear_costs(**costs))
    observe(loaded, [SimpleNamespace()], 4, [0])
    assert loaded.choose([SimpleNamespace()], policies(1), rows_of) == 0  # control: a loaded table
    # the first rounds are `new`'s: without it no probe is due this early
    assert controller._probe_due(policies(1), rows_of) is None
    assert controller._probe_due(policies(1), rows_of, new=True) == 4


def test_tier_zero_is_probed_again_at_a_bounded_cost_with_backoff():
    reqs = [SimpleNamespace()]
    costs = linear_costs()
    controller = AdaptiveDraftLength(TIERS, costs)
    for _ in range(200):  # the server's requests keep nothing: a probe is expected to emit ~1 token
        controller.pooled.observe(4, 0)
    keeps = controller.acceptance(SimpleNamespace()).expected(4, controller.pooled)
    assert keeps < 0.05
    tiers = []
    for _ in range(2000):
        tier = controller.choose(reqs, policies(1), rows_of)
        tiers.append(tier)
        observe(controller, reqs, tier, [0])
    probes = [i for i, t in enumerate(tiers) if t > 0]
    assert all(tiers[i] == 4 for i in probes)  # probes: the shortest drafting tier
    assert tiers[0] == 0, "the pool says drafts keep nothing: tier 0 from the first round"
    gaps = [probes[0]] + [b - a - 1 for a, b in zip(probes, probes[1:]) if b - a > 1]
    first = gaps[0]  # tier-0 rounds that pay for one probe's loss at PROBE_OVERHEAD
    ratio = costs.cost(1, 4, 5) / costs.cost(1, 0, 1)
    assert first == pytest.approx((ratio - 1 - keeps) / PROBE_OVERHEAD, abs=1)
    assert gaps[:4] == [first, 2 * first, 4 * first, 8 * first], tiers  # failing probes back off
    assert max(gaps) == PROBE_BACKOFF_MAX * first
    # what the probes cost after the first ones: at most PROBE_OVERHEAD of the tier-0 time
    tail = tiers[probes[1] :]
    spent = sum(costs.cost(1, t, rows_of(t)) for t in tail)
    assert spent / (len(tail) * costs.cost(1, 0, 1)) < 1 + PROBE_OVERHEAD
    # a probe that pays for itself (5 tokens where tier 0 emits `ratio` in its time) resets the spacing
    while controller.choose(reqs, policies(1), rows_of) == 0:
        observe(controller, reqs, 0, [0])
    observe(controller, reqs, 4, [4])
    assert controller._backoff == 1


def test_the_probes_budget_is_seconds_so_a_small_batchs_cheap_steps_do_not_pay_a_big_batchs_probe():
    """A probe's loss is priced in its batch's decode steps, the budget that pays it in the seconds
    of the tier-0 rounds since the last drafting round, each at its own batch size. A batch of 32,
    whose decode step costs 4 of a batch of 1's, probes after as many seconds of anyone's rounds:
    4x the steps where a batch of 1 ran them. Counted in steps of any size (the last version), the
    batch of 1's cheap steps had paid for the batch of 32's probes one for one. Control: a batch of
    32's steps pay for a batch of 1's probe four times over."""
    scale = {1: 1.0, 8: 2.0, 32: 4.0}
    costs = CostTable(
        draft={(b, L): 0.002 * (L + 1) * k for b, k in scale.items() for L in TIERS},
        rest={(b, L + 1): (0.02 + 1e-4 * (L + 1)) * k for b, k in scale.items() for L in TIERS},
        fixed=True,
    )

    def server():
        controller = AdaptiveDraftLength(TIERS, costs)
        for _ in range(200):  # the server's requests keep nothing: only probes draft
            controller.pooled.observe(4, 0)
        return controller

    controller = server()
    keeps = controller._typical.expected(4, controller.pooled)
    steps = math.ceil((costs.cost(32, 4, 5) / costs.cost(32, 0, 1) - 1 - keeps) / PROBE_OVERHEAD)
    assert steps == math.ceil((costs.cost(1, 4, 5) / costs.cost(1, 0, 1) - 1 - keeps) / PROBE_OVERHEAD)
    small, big = [SimpleNamespace()], [SimpleNamespace() for _ in range(32)]
    for _ in range(steps):
        observe(controller, small, 0, [0])
    assert controller._probe_due(policies(1), rows_of) == 4, "the batch of 1's own probe is due"
    assert controller._probe_due(policies(32), rows_of) is None, "a quarter of the batch of 32's budget"
    for _ in range(3 * steps - 1):
        observe(controller, small, 0, [0])
    assert controller._probe_due(policies(32), rows_of) is None
    observe(controller, small, 0, [0])
    assert controller._probe_due(policies(32), rows_of) == 4
    controller = server()  # control: the batch of 32's steps
    for _ in range(math.ceil(steps / 4)):
        observe(controller, big, 0, [0] * 32)
    assert controller._probe_due(policies(1), rows_of) == 4
    assert controller._probe_due(policies(32), rows_of) is None


def one_request_rounds(costs, keep: int, rounds: int, budget: int = 32, controller=None):
    """(controller, tiers): `rounds` choices for one request whose draft keeps `keep` of each
    round (within its tier), in a server whose pool says drafts keep nothing (a new one unless
    `controller`): a server whose first rounds ran on SGLang's warm-up request."""
    if controller is None:
        controller = AdaptiveDraftLength(TIERS, costs)
        for _ in range(200):
            controller.pooled.observe(4, 0)
    req, tiers = [SimpleNamespace()], []
    for _ in range(rounds):
        tiers.append(controller.choose(req, policies(1, budget), rows_of))
        observe(controller, req, tiers[-1], [min(keep, tiers[-1])])
    return controller, tiers


def test_a_probe_that_the_batchs_budgets_keep_from_paying_waits_for_one_that_can_pay():
    """The pool says drafts keep nothing, so the choice is tier 0 and only probes draft. A probe
    due where the request's budget lets it emit no more than tier 0 in the probe's time waits,
    however long the streak, for a request that can keep it: it could not pay, and would have
    spaced the next ones out (a probe at a request's last 2 tokens, the synthetic pair on CPU).
    Control: with its whole budget left, the request probes once tier-0 rounds paid for the
    probe's loss at PROBE_OVERHEAD."""
    costs = linear_costs(step_s=0.004, verify_s=0.005)
    ratio = costs.cost(1, 4, 5) / costs.cost(1, 0, 1)  # tokens a probe must emit to pay
    assert 2 < ratio < 3

    _, tiers = one_request_rounds(costs, keep=0, rounds=150)
    first = tiers.index(4)
    assert first == pytest.approx((ratio - 1) / PROBE_OVERHEAD, abs=2), tiers
    # one token left (budget 1): a probe emits at most 2 < ratio
    controller, tiers = one_request_rounds(costs, keep=0, rounds=3 * first, budget=1)
    assert set(tiers) == {0}, tiers
    _, tiers = one_request_rounds(costs, keep=0, rounds=1, controller=controller)  # the next request, whole budget
    assert tiers == [4]


def test_a_round_that_paid_drafts_again_while_what_it_kept_beats_tier_zero():
    """The pool says drafts keep nothing (a server whose first rounds ran on SGLang's warm-up
    request), so only probes leave tier 0. A probe that keeps all it drafts paid: the next round
    drafts again, valued by what it kept, and so does every round after it while they pay; the
    request's own rounds then outweigh the pool. Controls: after a probe that keeps nothing,
    tier 0; after one that paid, a batch whose budgets leave 1 token a request (what it kept,
    valued within its reach, does not beat tier 0) runs tier 0 too."""
    costs = linear_costs(step_s=0.004, verify_s=0.005)
    ratio = costs.cost(1, 4, 5) / costs.cost(1, 0, 1)  # tokens a round of L = 4 must emit to pay
    assert 2 < ratio < 3

    _, tiers = one_request_rounds(costs, keep=32, rounds=150)
    first = tiers.index(4)  # the first probe
    assert 0 not in tiers[first:] and tiers[-1] == 16, tiers  # L = 32 pays 1.03x L = 16: within LONGER_MARGIN
    _, tiers = one_request_rounds(costs, keep=0, rounds=first + 2)
    assert tiers[first:] == [4, 0], tiers
    controller, tiers = one_request_rounds(costs, keep=32, rounds=first + 1)
    assert tiers[-1] == 4 and controller._kept == (4, 4)
    _, tiers = one_request_rounds(costs, keep=32, rounds=1, budget=1, controller=controller)
    assert tiers == [0]


def test_a_probe_pays_for_its_catch_up_and_where_that_alone_costs_more_than_the_overhead_none_comes():
    """A probe first extends the draft over every token the batch's tier-0 rounds committed: its
    cost grows with the stretch it ends. Priced in (per token, from earlier catch-ups), the first
    probe comes later; where a decode step's catch-up alone costs more than PROBE_OVERHEAD of the
    step, never (the real pair on CPU at batch 60: 66 ms a step against 2% of 0.61 s). Control: with no
    catch-up measured yet, the first probe comes where its round's loss alone is paid for."""
    bs, step_s, verify_s = 8, 0.001, 0.01
    costs = CostTable()
    for _ in range(EXPLORE_SAMPLES + 1):  # measured online: a warm-up round, then counted ones
        costs.observe(bs, 0, 1, 0.0, verify_s)
        costs.observe(bs, 4, 5, 5 * step_s, verify_s + 0.002)
    break_even = costs.cost(bs, 4, 5) / costs.cost(bs, 0, 1)
    first_probe = {}
    for name, per_token in {
        "unknown": None,
        "cheap": PROBE_OVERHEAD * verify_s / bs / 4,
        "dear": PROBE_OVERHEAD * verify_s / bs * 2,
    }.items():
        controller = AdaptiveDraftLength(TIERS[:2], costs)
        for _ in range(200):
            controller.pooled.observe(4, 0)  # drafts keep nothing
        controller._heard = 200  # (heard from as many requests)
        if per_token is not None:  # an earlier catch-up over more tokens than any stretch below
            controller._caught_up(bs, 4, costs.draft[bucket(bs), 4] + 20_000 * per_token, 20_000)
        reqs = [SimpleNamespace() for _ in range(bs)]
        for n in range(2000):
            if controller.choose(reqs, policies(bs), rows_of) > 0:
                first_probe[name] = n
                break
            observe(controller, reqs, 0, [0] * bs, rest_s=verify_s)  # an online table: its cells stay
            for req in reqs:  # the worker's `DraftChain.idle`: each tier-0 step's token missed by the draft
                state_of(req).draft_behind += 1
    keeps = controller.acceptance(SimpleNamespace()).expected(4, controller.pooled)
    assert first_probe["unknown"] == pytest.approx((break_even - 1 - keeps) / PROBE_OVERHEAD, abs=1)
    # cheap: a step's catch-up costs a quarter of the overhead, so the loss is paid by 3/4 of it
    assert first_probe["cheap"] == pytest.approx((break_even - 1 - keeps) / (0.75 * PROBE_OVERHEAD), abs=2)
    assert "dear" not in first_probe, first_probe


def test_a_drafting_tier_priced_from_another_bucket_is_not_measured_in_place_of_tier_zero():
    """Out of tier 0, a drafting round first catches the draft up over every token the batch
    committed without it: only a probe, which prices that catch-up, leaves tier 0. A drafting tier
    priced from another bucket that merely comes close to tier 0 (within EXPLORE_MARGIN) is not
    measured there. Control: once tier-0 steps have paid for a probe, the same tier runs as one."""
    controller = AdaptiveDraftLength((0, 8), CostTable())
    small, big = [SimpleNamespace() for _ in range(15)], [SimpleNamespace() for _ in range(60)]
    for _ in range(1 + EXPLORE_SAMPLES):  # bucket 16 ran tier 0 only; bucket 64 both, L = 8 last
        observe(controller, small, 0, [0] * 15, 0.001, 4 * 0.335, steps=4)
    for _ in range(1 + EXPLORE_SAMPLES):
        observe(controller, big, 0, [0] * 60, 0.001, 4 * 0.52, steps=4)
    for _ in range(1 + EXPLORE_SAMPLES):
        observe(controller, big, 8, [3] * 60, 3.0, 2.43)
    rates = {
        tier: controller._expected_tokens(tier, small, policies(15), 4, None)
        / controller.costs.cost(15, tier, rows_of(tier), 4 if tier == 0 else 1)
        for tier in (0, 8)
    }
    assert controller.costs.measured_tiers(15) == {0}  # L = 8 there: bucket 64's cells scaled down
    assert EXPLORE_MARGIN <= rates[8] / rates[0] < 1, rates  # close to tier 0, below it
    for req in small:
        state_of(req).draft_behind = 340
    assert controller.choose(small, policies(15), rows_of, steps=4) == 0
    probe_after = None
    for n in range(1, 400):
        observe(controller, small, 0, [0] * 15, 0.001, 4 * 0.335, steps=4)
        if controller.choose(small, policies(15), rows_of, steps=4) == 8:
            probe_after = n
            break
    keeps = controller.acceptance(SimpleNamespace()).expected(8, controller.pooled)
    loss = controller._break_even_of(15, 8, rows_of) - 1 - keeps  # in decode steps (no catch-up measured yet)
    steps = controller.costs.cost(15, 0, 1, steps=4) / controller.costs.cost(15, 0, 1)  # a 4-step round's: ~4
    assert probe_after == math.ceil(math.ceil(loss / PROBE_OVERHEAD) / steps), (probe_after, loss, steps)


def test_a_drafting_tier_pays_its_catch_up_whole_where_borrowed_and_its_share_where_measured():
    """A drafting round first catches the draft up over what the batch committed at tier 0, and
    that is priced in. A tier this bucket has not measured (priced from other cells) bears it
    whole: behind the real pair's 8,192 tokens at batch 32 it loses to tier 0, where its borrowed
    price alone beat it twice over. A measured one bears the share its round's tokens are of
    what the batch has left (the catch-up is paid once for every round after it): with 33 tokens
    left a request, twice tier 0's rate pays back 6.8 s of catch-up (7.5 s + 6.8 s for the
    batch's 1,056 tokens against tier 0's 14.9 s); with 9 left it does not (the real pair's batch
    of 60 on CPU had run a measured L = 8 behind 7,680 tokens, 35 s for a round of ~470 tokens).
    Controls: with nothing behind, the same prices win, borrowed or measured."""
    controller = AdaptiveDraftLength((0, 8), CostTable())
    batch, big = [SimpleNamespace() for _ in range(32)], [SimpleNamespace() for _ in range(60)]
    for _ in range(1 + EXPLORE_SAMPLES):  # bucket 32 ran tier 0 only; bucket 64 both
        observe(controller, batch, 0, [0] * 32, 0.001, 4 * 0.45, steps=4)
    for _ in range(1 + EXPLORE_SAMPLES):
        observe(controller, big, 0, [0] * 60, 0.001, 4 * 0.52, steps=4)
    for _ in range(1 + EXPLORE_SAMPLES):
        observe(controller, big, 8, [3] * 60, 0.8, 1.0)
    controller._caught_up(60, 8, controller.costs.draft[64, 8] + 6153 * 0.0011, 6153)
    assert controller.costs.measured_tiers(32) == {0}

    def rates_without_catch_up():
        return {
            tier: controller._expected_tokens(tier, batch, policies(32), 4, None)
            / controller.costs.cost(32, tier, rows_of(tier), 4 if tier == 0 else 1)
            for tier in (0, 8)
        }

    rates = rates_without_catch_up()
    assert rates[8] / rates[0] > 1.9, rates  # unpriced, L = 8 wins outright
    assert controller.choose(batch, policies(32), rows_of, steps=4) == 8  # control: nothing behind
    for req in batch:
        state_of(req).draft_behind = 256  # 8,192 tokens, ~6.8 s of catch-up
    assert controller._catch_up_seconds(256 * 32) == pytest.approx(6153 * 0.0011)
    assert controller.choose(batch, policies(32), rows_of, steps=4) == 0
    for _ in range(1 + EXPLORE_SAMPLES):  # L = 8 measured at batch 32, at the same cost
        observe(controller, batch, 8, [3] * 32, controller.costs.cost(32, 8, rows_of(8)) - 1.0, 1.0)
    assert controller.costs.measured_tiers(32) == {0, 8}
    assert rates_without_catch_up()[8] / rates[0] > 1.9  # without its catch-up it still wins outright
    assert controller.choose(batch, policies(32), rows_of, steps=4) == 8  # 33 tokens left a request
    assert controller.choose(batch, policies(32, budget=8), rows_of, steps=4) == 0  # 9 left
    for req in batch:  # control: caught up (a probe's round), the measured tier drafts on
        state_of(req).draft_behind = 0
    assert controller.choose(batch, policies(32, budget=8), rows_of, steps=4) == 8


def test_where_requests_keep_their_drafts_a_request_at_tier_zero_probes_again_soon():
    """A request fell to tier 0 on a bad stretch in a server whose requests keep nearly every
    draft token: a probe is expected to emit 5 tokens for the price of `ratio` < 5 decode steps,
    so it comes after one round of decode steps; a probe that keeps a token but emits fewer
    than tier 0 would have in its time does not pay, and the next ones space out, until a
    drafting round pays (the spacing is the server's: without that, one batch's stragglers
    would leave the next batch's probing once in 32 rounds; seen on the synthetic pair)."""
    costs = linear_costs(step_s=0.004, verify_s=0.005)
    ratio = costs.cost(1, 4, 5) / costs.cost(1, 0, 1)
    assert 2 < ratio < 5
    controller = AdaptiveDraftLength(TIERS, costs)
    for _ in range(200):
        controller.pooled.observe(16, 16)
    req = [SimpleNamespace()]
    for _ in range(4):
        observe(controller, req, 16, [0])  # the request's bad stretch
    tiers = []
    for _ in range(20):
        tiers.append(controller.choose(req, policies(1), rows_of, steps=4))
        observe(controller, req, tiers[-1], [min(1, tiers[-1])], steps=4 if tiers[-1] == 0 else 1)
    assert tiers[:2] == [0, 4], tiers  # the probe: after one tier-0 round
    # each keeps 1 (2 tokens < ratio): the spacing doubles, 2, 4, 8, 16 decode steps' seconds, where a
    # round of 4 steps costs 2.68 (its draft part once): 1, 2, 3 and 6 rounds
    assert costs.cost(1, 0, 1, steps=4) / costs.cost(1, 0, 1) == pytest.approx(2.68, abs=0.01)
    assert tiers[2:] == [0, 4, 0, 0, 4, 0, 0, 0, 4] + [0] * 6 + [4, 0, 0], tiers
    assert controller._backoff == 32
    # the next batch drafts and its round pays: the spacing starts over for its own bad stretches
    nxt = [SimpleNamespace()]
    tier = controller.choose(nxt, policies(1), rows_of)
    observe(controller, nxt, tier, [1])
    assert tier > 0 and controller._backoff == 32, "2 tokens do not pay for a drafting round"
    tier = controller.choose(nxt, policies(1), rows_of)
    observe(controller, nxt, tier, [tier])
    assert tier > 0 and controller._backoff == 1


def test_a_new_batch_after_one_that_ended_at_tier_zero_runs_its_best_tier_not_a_probe():
    """The last round of a batch often runs at tier 0 (each request one token from its end), so
    the next batch starts with tier-0 steps behind it and a probe due. A probe replaces a tier-0
    round only: where the choice drafts anyway, the round shows the acceptance itself (seen on
    the synthetic pair: 3 of 5 timed batches of 32 in a trace began with a round at L = 4)."""
    costs = linear_costs(step_s=0.004, verify_s=0.005)
    controller = AdaptiveDraftLength(TIERS, costs)
    for _ in range(200):
        controller.pooled.observe(32, 32)
    ending = [SimpleNamespace() for _ in range(8)]
    tail = policies(8, budget=0)  # one token left each: tier 0 emits it for the whole batch
    assert controller.choose(ending, tail, rows_of, steps=1) == 0
    observe(controller, ending, 0, [0] * 8, steps=1)
    assert controller._probe_due(policies(8), rows_of) == 4, "tier-0 steps behind: a probe would be due"
    fresh = [SimpleNamespace() for _ in range(8)]
    assert controller.choose(fresh, policies(8), rows_of) == 16  # L = 32 pays 1.03x L = 16: within LONGER_MARGIN
    # where the choice is tier 0 the probe still replaces it (a request left at tier 0)
    stuck = [SimpleNamespace()]
    for _ in range(4):
        observe(controller, stuck, 16, [0])
    assert controller.choose(stuck, policies(1), rows_of, steps=4) == 0
    observe(controller, stuck, 0, [0], steps=4)
    assert controller.choose(stuck, policies(1), rows_of, steps=4) == 4


def test_tier_zero_decode_steps_are_priced_per_step_and_pay_the_round_once():
    """A tier-0 round of k decode steps: its measured rest is kept per step (the one-row verify
    cell), it is priced as the round's fixed part plus k steps and valued at k tokens per request
    (at most a request's budget + 1), and its price counts towards the next probe."""
    online = AdaptiveDraftLength((0, 4), CostTable())
    req = [SimpleNamespace()]
    zero = SimpleNamespace(draft_lens=torch.zeros(1, dtype=torch.int64))
    for _ in range(2):  # the warm-up, then a counted round
        online.observe(req, 0, 1, zero, SimpleNamespace(lengths=[3]), draft_s=0.05, rest_s=0.04, steps=4)
    assert online.costs.rest[1, 1] == pytest.approx(0.01) and online.costs.draft[1, 0] == pytest.approx(0.05)
    assert online.costs.cost(1, 0, 1, steps=4) == pytest.approx(0.05 + 4 * 0.01)
    # the warm-up round, not counted, by what it took; the next by its price: 0.09 s each
    assert online._zero_streak == pytest.approx(2 * 0.09)
    # a round's fixed part (0.05 s) outweighs a step (0.01 s): one step per round loses to tier 4
    # (the prior's 0.94 expected tokens over 72 ms), four steps per round win
    costs = CostTable(draft={(1, 0): 0.05, (1, 4): 0.06}, rest={(1, 1): 0.01, (1, 5): 0.012}, fixed=True)
    assert AdaptiveDraftLength((0, 4), costs).choose(req, policies(1), rows_of, steps=1) == 4
    assert AdaptiveDraftLength((0, 4), costs).choose(req, policies(1), rows_of, steps=4) == 0
    # a request with two tokens left gets two of the four steps' tokens
    assert AdaptiveDraftLength((0, 4), costs).choose(req, policies(1, budget=1), rows_of, steps=4) == 0
    rates = 2 / costs.cost(1, 0, 1, steps=4), 4 / costs.cost(1, 0, 1, steps=4)
    assert rates[0] < rates[1]


@pytest.mark.parametrize(
    "values, message",
    [
        ({"adaptive": "yes"}, "adaptive='yes' is invalid: allowed is true or false"),
        (
            {"adaptive": True, "adaptive_tiers": [4, -1]},
            r"adaptive_tiers=\[4, -1\] is invalid: allowed is a list of integers",
        ),
        ({"adaptive": True, "adaptive_tiers": "0,4"}, "adaptive_tiers='0,4' is invalid"),
        (
            {"adaptive": True, "adaptive_tiers": [0, 64]},
            r"adaptive_tiers=\[0, 64\] is invalid: \[64\] exceed the draft budget L=32",
        ),
        ({"adaptive": True, "cost_table": 3}, "cost_table=3 is invalid: allowed is a file path"),
        ({"adaptive": True, "tier0_steps": 0}, r"tier0_steps=0 is invalid: allowed is an integer in \[1, 64\]"),
        ({"adaptive": True, "tier0_steps": 2.5}, r"tier0_steps=2.5 is invalid"),
    ],
)
def test_bad_adaptive_settings_are_refused_by_name(values, message):
    with pytest.raises(ValueError, match=message):
        server_parse_config(SimpleNamespace(_parse_config=values), 32)


def test_tiers_default_to_l_divided_by_four_while_at_least_four():
    assert ParseConfig(draft_budget=32, adaptive=False).tiers == (32,)
    assert ParseConfig(draft_budget=32).tiers == (0, 8, 32)  # adaptive is the default
    assert [ParseConfig(draft_budget=L).tiers for L in (2, 8, 12, 16, 64)] == [
        (0, 2), (0, 8), (0, 12), (0, 4, 16), (0, 4, 16, 64)
    ]  # fmt: skip
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


def test_benchmark_merges_runs_by_the_median_run(tmp_path):
    """`benchmarks/adaptive.py --merge`: per row the run with the median tokens/s, each ratio the
    median of the runs' own (already paired), every run's rounds kept; one file merges to itself."""
    bench = load_benchmark("adaptive", "adaptive_benchmark")

    def row(mode, L, tps, **ratios):
        return {"pair": "p", "mode": mode, "L": L, "batch": 8, "tokens_per_s": tps, "tokens_per_s_runs": [tps, tps + 1],
                "ratio_to_target_only": ratios.get("base"), "ratio_to_target_only_runs": [ratios.get("base")] * 2,
                "ratio_to_best_fixed": ratios.get("fixed"), "ratio_to_target_only_sync": ratios.get("sync")}  # fmt: skip

    files = []
    for i, (base, sync, fixed, adaptive) in enumerate([(100, 75, 50, 90), (80, 60, 60, 70), (120, 90, 40, 130)]):
        path = tmp_path / f"run{i}.jsonl"
        path.write_text(
            "\n".join(
                json.dumps(r)
                for r in (
                    row("target_only", None, base, base=1.0),
                    row("target_only_sync", None, sync, base=sync / base),
                    row("fixed", 4, fixed, base=fixed / base),
                    row("adaptive", None, adaptive, base=adaptive / base, fixed=adaptive / fixed, sync=adaptive / sync),
                )
            )
        )
        files.append(str(path))
    merged = {r["mode"]: r for r in bench.merge(files)}
    assert [merged[m]["tokens_per_s"] for m in ("target_only", "target_only_sync", "fixed", "adaptive")] == [
        100,
        75,
        50,
        90,
    ]
    adaptive = merged["adaptive"]
    assert adaptive["ratio_to_target_only"] == pytest.approx(0.9)  # median of 0.9, 0.875, 1.083
    assert adaptive["ratio_to_target_only_runs"] == pytest.approx([0.9, 0.9, 0.875, 0.875, 130 / 120, 130 / 120])
    assert adaptive["ratio_to_best_fixed"] == pytest.approx(90 / 50)
    assert adaptive["ratio_to_best_fixed_runs"] == pytest.approx([90 / 50, 70 / 60, 130 / 40])
    assert adaptive["ratio_to_target_only_sync"] == pytest.approx(1.2)  # median of 1.2, 1.167, 1.444
    assert adaptive["tokens_per_s_runs"] == [90, 91, 70, 71, 130, 131]
    assert merged["fixed"]["ratio_to_target_only_sync"] is None
    alone = {r["mode"]: r for r in bench.merge(files[:1])}
    assert alone["adaptive"]["ratio_to_best_fixed"] == pytest.approx(90 / 50)
    assert alone["adaptive"]["tokens_per_s_runs"] == [90, 91]


def test_benchmark_pairs_ratios_round_by_round():
    """`benchmarks/adaptive.py`: the engines take turns, so a ratio is paired within a round (to
    the best fixed engine of that round) and the row's ratio is the median of the rounds'."""
    bench = load_benchmark("adaptive", "adaptive_benchmark")

    def row(mode, L, runs):
        return {"pair": "p", "batch": 8, "mode": mode, "L": L, "tokens_per_s": statistics.median(runs),
                "tokens_per_s_runs": runs, "output_tokens": 80, "tokens_per_round": 1.0, "output_ids": [[1]],
                "lossless": mode in ("fixed", "adaptive"), "mean_L": 0.0}  # fmt: skip

    rows = [row("target_only", None, [100, 80, 120]), row("target_only_sync", None, [110, 70, 130]),
            row("fixed", 4, [50, 60, 40]), row("fixed", 8, [55, 50, 45]), row("adaptive", None, [90, 88, 130])]  # fmt: skip
    bench.derive(rows)
    adaptive = rows[-1]
    assert adaptive["ratio_to_target_only_runs"] == pytest.approx([0.9, 1.1, 130 / 120])
    assert adaptive["ratio_to_target_only"] == pytest.approx(130 / 120)
    assert adaptive["ratio_to_best_fixed_runs"] == pytest.approx([90 / 55, 88 / 60, 130 / 45])  # best per round
    assert adaptive["ratio_to_best_fixed"] == pytest.approx(90 / 55)
    assert adaptive["ratio_to_target_only_sync_runs"] == pytest.approx([90 / 110, 88 / 70, 1.0])
    assert adaptive["ratio_to_target_only_sync"] == pytest.approx(1.0)
    assert adaptive["L"] is None and adaptive["equal_to_target_only"] is True
    assert rows[2]["ratio_to_best_fixed"] is None and rows[2]["ratio_to_target_only"] == pytest.approx(0.5)
    assert rows[0]["mean_L"] is None and rows[1]["ratio_to_target_only_sync"] is None


def test_the_head_tier_has_its_own_cost_cells_and_acceptance(tmp_path):
    """An EAGLE-3 head (`eagle3_head`) is the tier HEAD: its draft part is a cost cell of its own
    (the rest shares the verify cells by rows), priced before it ran as a tier-0 round of its
    rows (so it is tried), kept in the table's JSON; what head rounds keep is learnt on curves of
    their own, never on PARSE's draft's."""
    online = CostTable()
    online.observe(1, 0, 1, 0.001, 0.02)
    online.observe(1, 0, 1, 0.001, 0.02)
    online.observe(1, 4, 5, 0.01, 0.022)
    online.observe(1, 4, 5, 0.01, 0.022)
    untried = online.cost(1, HEAD, 4)
    assert untried == pytest.approx(0.001 + online.cost(1, 4, 4) - 0.01)  # tier 0's draft part, the rest at 4 rows
    for _ in range(EXPLORE_SAMPLES + 1):
        online.observe(1, HEAD, 4, 0.004, 0.0215)
    assert online.head == {1: 0.004} and (1, HEAD) not in online.draft
    assert online.cost(1, HEAD, 4) == pytest.approx(0.004 + 0.0215) and online.cost(8, HEAD, 4) == pytest.approx(0.0255)
    assert HEAD in online.measured_tiers(1)
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(online.to_json()))
    assert CostTable.load(str(path)).head == {1: 0.004}

    costs = linear_costs()  # tier 0: 22.1 ms, tier 4: 30.5 ms
    costs.head = {b: 0.004 for b in (1, 8, 32)}  # a head round: 24.4 ms
    controller = AdaptiveDraftLength(TIERS, costs, head_steps=3)
    for _ in range(200):  # PARSE's draft keeps nothing, the head keeps all it drafts
        controller.pooled.observe(4, 0)
        controller.head_pooled.observe(3, 3)
    reqs = [SimpleNamespace(), SimpleNamespace()]
    assert controller.choose(reqs, policies(2), rows_of) == HEAD
    head_round(controller, reqs, [3, 1])
    assert reqs[1].parse.head_acceptance.expected(3, controller.head_pooled) < 2.5
    assert reqs[1].parse.acceptance.survival.reached == [], "a head round is no round of PARSE's draft"
    assert controller._zero_streak == pytest.approx(costs.cost(2, HEAD, 4)), "a head round drafts nothing of PARSE's"
    # without a head such a batch runs tier 0
    no_head = AdaptiveDraftLength(TIERS, costs)
    for _ in range(200):
        no_head.pooled.observe(4, 0)
    assert no_head.choose([SimpleNamespace(), SimpleNamespace()], policies(2), rows_of) == 0
    # in a target phase (probe_stride 4) a request keeps at most what is left of it, less the bonus
    keeps_all = AdaptiveDraftLength(TIERS, costs)
    for _ in range(200):
        keeps_all.pooled.observe(32, 32)
    assert keeps_all.choose([SimpleNamespace()], policies(1), rows_of) == 32
    in_phase = [SimpleNamespace(**{**vars(p), "phase": [1, 2]}) for p in policies(1, stride=4)]
    assert keeps_all.choose([SimpleNamespace()], in_phase, rows_of) == 4, "one draft token left to keep"
    at_end = [SimpleNamespace(**{**vars(p), "phase": [1, 2, 3]}) for p in policies(1, stride=4)]
    assert keeps_all.choose([SimpleNamespace()], at_end, rows_of) == 0, "none left: tier 0 is the cheapest"


def test_a_head_that_keeps_nothing_leaves_the_choice_to_tier_zero_and_is_probed_with_backoff():
    costs = linear_costs()
    costs.head = {b: 0.004 for b in (1, 8, 32)}
    controller = AdaptiveDraftLength(TIERS, costs, head_steps=3)
    for _ in range(200):
        controller.pooled.observe(4, 0)
        controller.head_pooled.observe(3, 0)
    req = [SimpleNamespace()]
    tiers = []
    for _ in range(60):
        tiers.append(controller.choose(req, policies(1), rows_of))
        if tiers[-1] == HEAD:
            head_round(controller, req, [0])
        else:
            observe(controller, req, tiers[-1], [0])
    assert tiers[0] == 0
    ratio = costs.cost(1, HEAD, 4) / costs.cost(1, 0, 1)  # a head round in decode steps: 1.10
    keeps = Acceptance().expected(3, controller.head_pooled)  # ~0.01
    first = math.ceil((ratio - 1 - keeps) / PROBE_OVERHEAD)  # tier-0 steps that pay for a probe's loss
    heads = [i for i, t in enumerate(tiers) if t == HEAD]
    assert heads[0] == first, tiers
    gaps = [tiers[a:b].count(0) for a, b in zip(heads, heads[1:])]  # tier-0 steps between head probes
    assert gaps[:2] == [2 * first, 4 * first], tiers  # failing probes back off (drafting probes between them apart)
    assert 4 in tiers, "PARSE's drafting probes go on beside the head's"
    assert controller._head_backoff > 1
    while (tier := controller.choose(req, policies(1), rows_of)) != HEAD:
        observe(controller, req, tier, [0])
    head_round(controller, req, [3])  # a head round that pays resets the spacing
    assert controller._head_backoff == 1
