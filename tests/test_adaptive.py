"""The adaptive draft length's parts without SGLang (parse_sglang/adaptive.py): the measured cost
table, the acceptance estimates, the tier choice and its exploration, and its settings refused by
name. How the controller does over whole traces against every fixed L is tests/test_replay.py's."""

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
    DECAY,
    ENDED_PRIOR,
    PRIOR_WEIGHT,
    PROBE_OVERHEAD,
    AdaptiveDraftLength,
    KeepRate,
    OutputEnds,
    PooledKeepRate,
)
from parse_sglang.cost_table import EXPLORE_SAMPLES, SAMPLES, CostTable, bucket
from parse_sglang.draft_length import DECODE, HEAD, FixedDraftLength, drafting
from parse_sglang.tools.profile_cost import main as profile_cost_main
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
    return [
        SimpleNamespace(
            budget=budget,
            judged=judged,
            left=budget + 1,
            phase=None,
            output_len=0,
            stop_ids=EOS,
            config=SimpleNamespace(probe_stride=stride),
        )
        for _ in range(n)
    ]


def rows_of(length: int) -> int:
    return length + 1


def head_round(controller, reqs, accepted: list[int], draft_s: float = 0.0, rest_s: float = 0.0):
    """One head round of `reqs` (k = controller.head_steps drafts each): their accepted lengths."""
    k = controller.head_steps
    plan = SimpleNamespace(
        draft_lens=torch.full((len(reqs),), k),
        confidence=torch.ones(len(reqs), k),
        judged=torch.zeros(len(reqs), dtype=torch.bool),
    )
    controller.observe(reqs, HEAD, k + 1, plan, SimpleNamespace(lengths=accepted), draft_s, rest_s)


def observe(
    controller, reqs, length: int, accepted: list[int], draft_s: float = 0.0, rest_s: float = 0.0, steps: int = 1
):
    """One round of `reqs` at the tier of L = `length` (0: `DECODE`), each drafting `length` tokens: their
    accepted lengths (and the round's measured seconds; a fixed table ignores them; steps: a tier-0 round's)."""
    plan = SimpleNamespace(
        draft_lens=torch.full((len(reqs),), length),
        confidence=torch.ones(len(reqs), length),
        judged=torch.zeros(len(reqs), dtype=torch.bool),
    )
    controller.observe(
        reqs, drafting(length), rows_of(length), plan, SimpleNamespace(lengths=accepted), draft_s, rest_s, steps
    )


class FakeClock:
    """The controller's `clock`: `now` seconds, moved by the test."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def timed_round(controller, clock: FakeClock, req, draft_s: float, rest_s: float, caught_up: int = 0) -> None:
    """One round of `req` at L = 4 through the controller's clock (choose, drafts on the host,
    after_round): its draft part took draft_s, the rest rest_s, and it caught up over `caught_up` tokens."""
    assert controller.choose([req], policies(1), rows_of, steps=4) == drafting(4)
    clock.now += draft_s
    controller.drafts_on_host(caught_up=caught_up)
    clock.now += rest_s
    window = SimpleNamespace(
        shape=SimpleNamespace(rows=5),
        plan=SimpleNamespace(draft_lens=torch.tensor([4]), confidence=torch.ones(1, 4), judged=torch.tensor([False])),
    )
    controller.after_round([req], window, SimpleNamespace(lengths=[4], emitted=[[7] * 5]), steps=1)


def test_bucket_is_next_power_of_two():
    assert [bucket(b) for b in (1, 2, 3, 4, 5, 8, 9, 32, 33)] == [1, 2, 4, 4, 8, 8, 16, 32, 64]


def test_cost_table_skips_warm_up_takes_medians_and_interpolates():
    table = CostTable()
    table.observe(1, drafting(8), 9, draft_s=5.0, rest_s=5.0)  # warm-up: not counted
    assert table.cost(1, drafting(8), 9) is None and table.measured_tiers(1) == set()
    table.observe(1, drafting(8), 9, draft_s=0.9, rest_s=0.1)
    assert table.cost(1, drafting(8), 9) == pytest.approx(1.0)
    table.observe(1, drafting(8), 9, draft_s=30.0, rest_s=0.1)  # a spike (a busy machine)
    table.observe(1, drafting(8), 9, draft_s=0.9, rest_s=0.1)
    assert table.draft[1, 8] == pytest.approx(0.9)  # the median of the counted rounds
    assert table.measured_tiers(1) == {drafting(8)}  # EXPLORE_SAMPLES = 3 counted rounds
    for _ in range(SAMPLES):
        table.observe(1, drafting(8), 9, draft_s=1.1, rest_s=0.1)
    assert table.draft[1, 8] == pytest.approx(1.1)  # only the last SAMPLES rounds count
    assert table.cost(1, drafting(4), 5) is None  # one tier measured: nothing to interpolate from
    for _ in range(2):
        table.observe(1, DECODE, 1, draft_s=0.1, rest_s=0.05)
    assert table.measured_tiers(1) == {drafting(8)}, "tier 0: one counted round so far"
    # draft linear in L + 1 steps between (1, 0.1) and (9, 1.1); rest linear in rows (1, 0.05) .. (9, 0.1)
    assert table.cost(1, drafting(4), 5) == pytest.approx((0.1 + 1.0 * 4 / 8) + (0.05 + 0.05 * 4 / 8))
    # extrapolated
    assert table.cost(1, drafting(16), 17) == pytest.approx((0.1 + 1.0 * 16 / 8) + (0.05 + 0.05 * 16 / 8))
    # a bucket without cells borrows the nearest one's
    assert table.cost(8, drafting(4), 5) == table.cost(1, drafting(4), 5)
    for tier in (0, 8):
        for seconds in (0.0, 1.0):
            table.observe(8, drafting(tier), tier + 1, seconds, seconds)
    assert table.cost(8, drafting(4), 5) == pytest.approx(2.0)  # its own, once it has them
    assert table.cost(4, drafting(4), 5) == pytest.approx(1.0)  # 4: nearer 8 than 1 (powers of two), scaled by 4 / 8


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
                table.observe(batch, drafting(tier), rows, draft_s, rest_s)
    assert table.cost(60, drafting(8), 9) == pytest.approx(3.0 + 2.43)  # control: its own cells
    assert table.cost(15, drafting(8), 9) == pytest.approx((3.0 + 2.43) * 16 / 64)  # bucket 16 from bucket 64
    assert table.cost(15, DECODE, 1, steps=4) == pytest.approx(0.001 + 4 * 0.32)  # tier 0: its own
    # bucket 128 from 64: unscaled (priced low already)
    assert table.cost(100, drafting(8), 9) == pytest.approx(3.0 + 2.43)
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
    chain.extends_first = False  # a graphed chain: from c_n, and a catch-up only where something is missing
    chain._extend_pieces = lambda batch, rows, extended: pieces.append(extended) or torch.zeros(2, 5)
    reqs = [SimpleNamespace(), SimpleNamespace()]
    batch = SimpleNamespace(reqs=reqs, seq_lens_cpu=torch.tensor([10, 12]))
    assert chain.catch_up(batch, rows=None) == (0, None) and not pieces  # nothing behind: no extend
    for req, behind in zip(reqs, (4, 3)):  # a tier-0 round's steps: the last few tokens
        draft_chain.state_of(req).draft_behind = behind
    assert chain.catch_up(batch, rows=None)[0] == 4 + 3 and pieces == [[(6, 10), (9, 12)]]
    chain.prefill(SimpleNamespace(reqs=reqs[:1], seq_lens_cpu=torch.tensor([10])), defer=True)
    assert chain.catch_up(batch, rows=None)[0] == 10 and pieces[-1] == [(0, 10), (11, 12)]  # a whole prompt
    chain._run_chain = lambda batch, inputs, length, first_q=None: (torch.zeros(2, length + 2), None, False)
    chain._confidence = torch.zeros(2, 10)
    draft_chain.state_of(reqs[1]).draft_behind = 1  # one tier-0 step: a catch-up all the same
    assert chain.draft(batch, torch.zeros(2), None, 8).caught_up == 1 and pieces[-1] == [(9, 10), (11, 12)]
    assert chain.draft(batch, torch.zeros(2), None, 8).caught_up == 0  # nothing behind

    # an eager chain: its first step extends over c_n (at P) every round, and over a kept d_L
    # (`draft_tail`, no catch-up: its tier's own row) and what a tier-0 round missed (a catch-up)
    chain.extends_first, pieces[:] = True, []
    chain.tiers = {8: draft_chain.ChainTier(steps=8)}
    chain.samples = False
    chain._kept_buffer = lambda name, bs, width: chain._confidence
    greedy = SimpleNamespace(is_all_greedy=True)
    batch = SimpleNamespace(
        reqs=reqs,
        seq_lens=torch.tensor([10, 12]),
        seq_lens_cpu=torch.tensor([10, 12]),
        seq_lens_sum=22,
        sampling_info=greedy,
    )
    chain.after_round(reqs, 8, [8, 3], [False, False])  # request 0 kept d_8: its KV is the next round's
    assert [draft_chain.state_of(r).draft_tail for r in reqs] == [True, False]
    draft = chain.draft(batch, torch.zeros(2), None, 8)
    assert draft.caught_up == 0 and pieces[-1] == [(9, 11), (12, 13)]  # d_8 and c_n; c_n alone
    assert batch.seq_lens.tolist() == [11, 13]  # the chain runs from d_1 at P + 1
    chain.after_round(reqs, 8, [8, 8], [False, True])  # request 1 verified a copy: the draft missed it all
    chain.idle(reqs, [2, 0])  # a tier-0 round: request 0's kept d_8 is missing too
    assert [draft_chain.state_of(r).draft_behind for r in reqs] == [3, 9]
    batch.seq_lens_cpu = torch.tensor([20, 25])
    assert chain.draft(batch, torch.zeros(2), None, 8).caught_up == 3 + 9 and pieces[-1] == [(17, 21), (16, 26)]

    for priced, median in ((False, 0.02), (True, 0.05)):
        clock = FakeClock()
        controller = AdaptiveDraftLength([4], CostTable(), clock=clock)  # every round at L = 4
        req = SimpleNamespace()
        # a caught-up round as the uncounted warm-up, two counted, then two more caught up
        rounds = ((0.5, 0.1, True), (0.02, 0.01, False), (0.02, 0.03, False), (0.08, 0.03, True), (0.08, 0.05, True))
        for draft_s, rest_s, caught_up in rounds:
            timed_round(controller, clock, req, draft_s, rest_s, caught_up=0 if priced or not caught_up else 3)
        assert controller.costs.draft[1, 4] == pytest.approx(median, abs=1e-12) and controller.costs.measured_tiers(1)
        # every round's rest counts: the median of the four after the warm-up (0.01, 0.03, 0.03, 0.05)
        assert controller.costs.rest[1, 5] == pytest.approx(0.03, abs=1e-12)
        # a catch-up: the median of the caught-up rounds' draft parts less the tier's (0.48, 0.06 twice,
        # each over 3 tokens), at least that over more tokens, in proportion over fewer
        assert controller._catch_up_seconds(10) == (0.0 if priced else pytest.approx(0.06, abs=1e-12))
        assert controller._catch_up_seconds(2) == (0.0 if priced else pytest.approx(0.06 * 2 / 3, abs=1e-12))


def test_tier_zero_is_priced_from_tier_zero_rounds_not_from_drafting_rounds():
    """A bucket that never ran tier 0 prices it (a decode step: no draft chain, one verify row)
    from the nearest bucket's tier-0 rounds: extrapolating its drafting rounds' cells down to
    L = 0 and one row keeps their fixed work (the chain's launch, the judge, the drafts' trip),
    which made a decode step at batch 32 cost 3x what it does."""
    table = CostTable()
    for n, tier, rows, draft_s, rest_s in (
        (1, 0, 1, 1e-4, 0.002),
        (16, 0, 1, 2e-4, 0.006),
        (32, 4, 5, 0.02, 0.056),
        (32, 8, 9, 0.036, 0.064),
    ):
        for _ in range(3):  # a warm-up round, then two counted
            table.observe(n, drafting(tier), rows, draft_s, rest_s)
    # the old rule extrapolated bucket 32's cells: draft 0.02 - 4 * 0.004, rest 0.056 - (0.064 - 0.056)
    assert table.cost(32, DECODE, 1, steps=4) == pytest.approx(2e-4 + 4 * 0.006)  # bucket 16's tier-0 round
    assert table.cost(2, DECODE, 1) == pytest.approx(1e-4 + 0.002)  # bucket 2 has no cells: the nearest, 1
    assert table.cost(32, drafting(16), 17) == pytest.approx(0.068 + 0.08)  # drafting tiers: still 32's own
    assert table.cost(32, drafting(8), 9) == pytest.approx(0.036 + 0.064)


def test_cost_table_load_round_trip_and_bad_files(tmp_path):
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(linear_costs().to_json()))
    loaded = CostTable.load(str(path))
    assert loaded.fixed and loaded.draft == linear_costs().draft and loaded.rest == linear_costs().rest
    loaded.observe(1, drafting(4), 5, 9.0, 9.0)
    loaded.observe(1, drafting(4), 5, 9.0, 9.0)
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
    assert table.cost(1, drafting(32), 33) == pytest.approx(0.0640 * 0.0073 / 0.0105 + 0.0117 * 0.0040 / 0.0070)
    assert table.cost(1, DECODE, 1, steps=4) == pytest.approx(0.0006 + 4 * 0.0023)
    assert table.cost(1, drafting(4), 5) == pytest.approx(0.0073 + 0.0040)


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
    # what requests are expected to emit still: the sum of `going` over the tokens each has left
    lefts = (SimpleNamespace(output_len=17, left=40), SimpleNamespace(output_len=40, left=5))
    assert ends.remaining(lefts) == pytest.approx(21 + 19 * later + 5)
    assert ends.remaining(lefts) == pytest.approx(float(ends.going([17], 39).sum()) + 5)
    assert ends.remaining([SimpleNamespace(output_len=0, left=None)]) == math.inf  # no max_new_tokens
    assert OutputEnds().remaining(lefts) == 45  # no request stopped yet: every token left


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
    assert controller.choose([SimpleNamespace()], [late], rows_of) == drafting(32)
    for _ in range(20):
        controller.ends.observe_round([stopping], SimpleNamespace(emitted=[[5, 5, 5, 5, 5, 2]], lengths=[5]))
    assert controller.choose([SimpleNamespace()], [late], rows_of) == drafting(4)
    assert controller.choose([SimpleNamespace()], [early], rows_of) == drafting(32)


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


def test_tiers_default_to_l_halved_while_at_least_four():
    assert ParseConfig(draft_budget=32, adaptive=False).tiers == (32,)
    assert ParseConfig(draft_budget=32).tiers == (0, 4, 8, 16, 32)  # adaptive is the default
    assert [ParseConfig(draft_budget=L).tiers for L in (2, 8, 12, 16, 64)] == [
        (0, 2),
        (0, 4, 8),
        (0, 6, 12),
        (0, 4, 8, 16),
        (0, 4, 8, 16, 32, 64),
    ]
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
        (["--context-tokens", "0"], "--context-tokens=0 is invalid"),
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
        return {
            "pair": "p",
            "mode": mode,
            "L": L,
            "batch": 8,
            "tokens_per_s": tps,
            "tokens_per_s_runs": [tps, tps + 1],
            "ratio_to_target_only": ratios.get("base"),
            "ratio_to_target_only_runs": [ratios.get("base")] * 2,
            "ratio_to_best_fixed": ratios.get("fixed"),
            "ratio_to_target_only_sync": ratios.get("sync"),
        }

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
        return {
            "pair": "p",
            "batch": 8,
            "mode": mode,
            "L": L,
            "tokens_per_s": statistics.median(runs),
            "tokens_per_s_runs": runs,
            "output_tokens": 80,
            "tokens_per_round": 1.0,
            "output_ids": [[1]],
            "lossless": mode in ("fixed", "adaptive"),
            "mean_L": 0.0,
        }

    rows = [
        row("target_only", None, [100, 80, 120]),
        row("target_only_sync", None, [110, 70, 130]),
        row("fixed", 4, [50, 60, 40]),
        row("fixed", 8, [55, 50, 45]),
        row("adaptive", None, [90, 88, 130]),
    ]
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
    online.observe(1, DECODE, 1, 0.001, 0.02)
    online.observe(1, DECODE, 1, 0.001, 0.02)
    online.observe(1, drafting(4), 5, 0.01, 0.022)
    online.observe(1, drafting(4), 5, 0.01, 0.022)
    untried = online.cost(1, HEAD, 4)
    # tier 0's draft part, the rest at 4 rows
    assert untried == pytest.approx(0.001 + online.cost(1, drafting(4), 4) - 0.01)
    for _ in range(EXPLORE_SAMPLES + 1):
        online.observe(1, HEAD, 4, 0.004, 0.0215)
    assert online.head == {1: 0.004} and set(online.draft) == {(1, 0), (1, 4)}  # no cell of PARSE's draft
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
    assert reqs[1].parse.head_keep_rate.expected(3, controller.head_pooled) < 2.5
    own = reqs[1].parse.keep_rate  # made when the tiers were valued, never observed by a head round
    assert own.kept == own.rejected == 0.0 and own.prior_weight == PRIOR_WEIGHT, "a head round is no round of PARSE's"
    assert controller._since["draft"] == pytest.approx(costs.cost(2, HEAD, 4)), "a head round drafts nothing of PARSE's"
    assert controller._since["head"] == 0.0
    # without a head such a batch runs tier 0
    no_head = AdaptiveDraftLength(TIERS, costs)
    for _ in range(200):
        no_head.pooled.observe(4, 0)
    assert no_head.choose([SimpleNamespace(), SimpleNamespace()], policies(2), rows_of) == DECODE
    # in a target phase (probe_stride 4) a request keeps at most what is left of it, less the bonus
    keeps_all = AdaptiveDraftLength(TIERS, costs)
    for _ in range(200):
        keeps_all.pooled.observe(32, 32)
    assert keeps_all.choose([SimpleNamespace()], policies(1), rows_of) == drafting(32)
    in_phase = [SimpleNamespace(**{**vars(p), "phase": [1, 2]}) for p in policies(1, stride=4)]
    assert keeps_all.choose([SimpleNamespace()], in_phase, rows_of) == drafting(4), "one draft token left to keep"
    at_end = [SimpleNamespace(**{**vars(p), "phase": [1, 2, 3]}) for p in policies(1, stride=4)]
    assert keeps_all.choose([SimpleNamespace()], at_end, rows_of) == DECODE, "none left: tier 0 is the cheapest"


def test_draft_length_policies_fixed_and_adaptive():
    """The worker asks one policy every round: fixed L (no TP broadcast, nothing shown), or the
    adaptive controller, whose `after_round` learns the round and times it with its own clock."""

    fixed = FixedDraftLength(8)
    assert not fixed.per_round and fixed.server_state() == {}
    assert fixed.choose([SimpleNamespace()], policies(1), rows_of, steps=4) == drafting(8)
    adaptive = AdaptiveDraftLength.of(ParseConfig(draft_budget=8, adaptive=True))
    assert adaptive.per_round and adaptive.tiers == [DECODE, drafting(4), drafting(8)]
    req = SimpleNamespace()
    tier = adaptive.choose([req], policies(1, budget=8), rows_of, steps=4)
    assert tier == drafting(4)  # nothing measured: the shortest drafting tier first
    adaptive.drafts_on_host()
    assert getattr(req, "parse", None) is None  # nothing learnt of the request before its round ends
    plan = SimpleNamespace(
        draft_lens=torch.tensor([8]), confidence=torch.full((1, 8), 0.9), judged=torch.tensor([False])
    )
    window = SimpleNamespace(shape=SimpleNamespace(draft_len=8, rows=9), plan=plan)
    adaptive.after_round([req], window, SimpleNamespace(lengths=[5], emitted=[[7] * 9]), steps=1)
    assert req.parse.keep_rate.prior_weight < KeepRate().prior_weight  # the request's own estimate saw the round
    assert req.parse.keep_rate.kept == 5 and req.parse.keep_rate.rejected == 1
    assert not adaptive.ends.finished  # 6 of its 9 tokens left: still running
    assert adaptive.server_state()["cost_table"] == adaptive.costs.to_json()


def test_a_requests_acceptance_is_a_run_at_an_unknown_rate():
    """A request keeps each reached position at a rate r ~ Beta(a, b): a (b) its kept (rejected)
    positions, decayed by DECAY a round, plus PRIOR_WEIGHT positions at the pooled rate. A round
    of L expects sum_j prod_{i<j} (a + i) / (a + b + i) tokens: the chance of a run of j, which
    is more than the mean rate to the j-th (a request that kept all so far is valued past them)."""
    pooled, own = PooledKeepRate(longest=32), KeepRate()
    assert pooled.rate() == pytest.approx(0.5)  # PRIOR_KEEP before any round

    def run(a, b, L):
        return sum(math.prod((a + i) / (a + b + i) for i in range(j)) for j in range(1, L + 1))

    assert own.expected(8, pooled) == pytest.approx(run(PRIOR_WEIGHT * 0.5, PRIOR_WEIGHT * 0.5, 8))
    assert own.expected(0, pooled) == 0.0
    own.observe(8, 8)  # kept all 8: reached 8, no rejection
    own.observe(8, 3)  # kept 3, the 4th rejected
    weight = PRIOR_WEIGHT * DECAY**2
    a, b = DECAY * 8 + 3 + weight * 0.5, 1.0 + weight * 0.5
    assert own.kept == pytest.approx(DECAY * 8 + 3) and own.rejected == pytest.approx(1.0)
    assert own.expected(16, pooled) == pytest.approx(run(a, b, 16))
    assert own.alive(pooled)[:3] == pytest.approx([1.0, a / (a + b), a * (a + 1) / ((a + b) * (a + b + 1))])
    assert own.expected(16, pooled) > sum((a / (a + b)) ** j for j in range(1, 17))  # E[r^j] > E[r]^j
    for _ in range(30):  # a request that keeps all it drafts, round after round: long tiers are worth it
        own.observe(32, 32)
    assert own.expected(32, pooled) > 28


def test_the_pool_weighs_each_requests_rounds_by_its_prior_weight():
    """The pooled rate counts a request's rounds by the weight its prior still has in it (1 for
    its first, then DECAY, DECAY^2, ...): 32 requests that keep all 32 in their first round, then
    3 stragglers that keep 6 of 32 in 20 rounds each, leave the pool nearer the 32 requests' rate
    than the same rounds counted alike do."""
    controller = AdaptiveDraftLength(TIERS, linear_costs())
    batch = [SimpleNamespace() for _ in range(32)]
    observe(controller, batch, 32, [32] * 32)
    for _ in range(20):
        observe(controller, batch[:3], 32, [6] * 3)
    alike = PooledKeepRate(longest=32)
    for _ in range(32):
        alike.observe(32, 32)
    for _ in range(60):
        alike.observe(32, 6)
    assert controller.pooled.rate() > alike.rate() + 0.03, (controller.pooled.rate(), alike.rate())


def test_the_controller_runs_the_tier_with_the_most_tokens_per_second():
    """A fixed table: a draft that keeps everything runs the longest tier, one that keeps nothing
    tier 0 (each the argmax of the rates); budgets cap what a request can keep."""
    for keep, want in ((lambda L: L, 32), (lambda L: 0, 0)):
        controller = AdaptiveDraftLength(TIERS, linear_costs())
        for _ in range(200):
            controller.pooled.observe(32, keep(32))
        rates = {}
        for tier in TIERS:
            tokens = 1 + controller.keep_rate(SimpleNamespace()).expected(tier, controller.pooled) if tier else 4
            rates[tier] = tokens / controller.costs.cost(1, drafting(tier), rows_of(tier), 4 if tier == 0 else 1)
        assert controller.choose([SimpleNamespace()], policies(1), rows_of, steps=4) == drafting(want)
        assert max(rates, key=rates.get) == want, rates
    keeps_all = AdaptiveDraftLength(TIERS, linear_costs())
    for _ in range(200):
        keeps_all.pooled.observe(32, 32)
    assert keeps_all.choose([SimpleNamespace()], policies(1, budget=5), rows_of, steps=4) == drafting(4)


def test_start_up_measures_the_shortest_drafting_tier_then_tier_zero():
    """Costs measured online: the shortest drafting tier until its cell is measured (a warm-up
    and EXPLORE_SAMPLES rounds), then tier 0 alike; after that, the best rate."""
    controller, req = AdaptiveDraftLength((0, 8, 32), CostTable()), [SimpleNamespace()]
    tiers = []
    for _ in range(2 * (1 + EXPLORE_SAMPLES) + 1):
        tiers.append(controller.choose(req, policies(1), rows_of, steps=4).length)
        seconds = (0.001, 4 * 0.012) if tiers[-1] == 0 else (0.02, 0.012)  # a decode step as dear as L = 8's verify
        observe(controller, req, tiers[-1], [8 if tiers[-1] else 3], *seconds, steps=4 if tiers[-1] == 0 else 1)
    assert tiers[:-1] == [8] * (1 + EXPLORE_SAMPLES) + [0] * (1 + EXPLORE_SAMPLES)
    assert tiers[-1] in (8, 32)  # every draft kept: a drafting tier (L = 32 priced from the measured lines)


def test_probes_out_of_tier_zero_lose_at_most_the_overhead():
    """A draft that keeps nothing: tier 0, and a probe of the shortest drafting tier once what it
    may lose against tier 0 (its seconds less its expected tokens' at tier 0's rate) is at most
    PROBE_OVERHEAD of the seconds since the last drafting round. Over 2,000 rounds the probes' loss
    is within PROBE_OVERHEAD of the run's seconds, and probes go on (a draft may get better).
    Control: a draft that keeps all it drafts leaves tier 0 at its first probe and stays."""
    costs = linear_costs()
    for keeps in (False, True):
        controller, req = AdaptiveDraftLength(TIERS, costs), [SimpleNamespace()]
        for _ in range(200):
            controller.pooled.observe(4, 0)
        tiers, lost, total = [], 0.0, 0.0
        zero = costs.cost(1, DECODE, 1, steps=4) / 4  # a decode step: tier 0's seconds per token
        for _ in range(2000):
            tier = controller.choose(req, policies(1), rows_of, steps=4).length
            tiers.append(tier)
            kept = tier if keeps else 0
            seconds = costs.cost(1, drafting(tier), rows_of(tier), 4 if tier == 0 else 1)
            total += seconds
            if tier:
                lost += seconds - (1 + kept) * zero
            observe(controller, req, tier, [kept if tier else 3], steps=4 if tier == 0 else 1)
        probes = [i for i, t in enumerate(tiers) if t]
        if keeps:
            assert probes[0] > 0 and min(tiers[probes[0] :]) > 0 and tiers[-1] == 32
        else:
            assert set(tiers) == {0, 4} and len(probes) > 10 and probes[-1] > 1800
            assert 0 < lost <= PROBE_OVERHEAD * total


def test_a_catch_up_is_priced_by_a_line_through_the_catch_ups():
    """A catch-up is one draft extend: fixed work plus work per token. Its price is a line through
    the last catch-ups' seconds beyond their tier's draft part; with one size known, that one's
    seconds times min(1, tokens / its size) (never scaled up from a small one: per token from 21
    tokens, the synthetic pair's batch of 32 priced its prompts at 0.56 s against a ~20 ms round)."""
    controller = AdaptiveDraftLength((0, 8), CostTable())
    for _ in range(1 + EXPLORE_SAMPLES):
        controller.costs.observe(1, drafting(8), 9, 0.020, 0.01)
        controller.costs.observe(32, drafting(8), 9, 0.040, 0.05)
    assert controller._catch_up_seconds(100) == 0.0  # none seen yet
    controller._catch_ups.append((1, 8, 0.020 + 0.0095, 21))  # 9.5 ms over 21 tokens
    assert controller._catch_up_seconds(1253) == pytest.approx(0.0095)
    assert controller._catch_up_seconds(7) == pytest.approx(0.0095 / 3)
    controller._catch_ups.append((32, 8, 0.040 + 0.013, 1253))  # 13 ms over 1,253
    slope = (0.013 - 0.0095) / (1253 - 21)
    assert controller._catch_up_seconds(600) == pytest.approx(0.0095 + slope * (600 - 21))
    assert controller._catch_up_seconds(0) == 0.0


def test_a_drafting_round_bears_its_catch_up_in_the_share_of_what_is_left():
    """A drafting round first catches the draft up over what the batch committed without it
    (tier-0 rounds, prompts whose draft prefill was deferred). It bears that catch-up in the share
    its tokens are of what the batch is expected to emit still (`OutputEnds.remaining`), as
    `prefills_draft` prices a prefill: behind one that costs as much as 30 decode steps, a draft
    that keeps all it drafts drafts with 4,000 tokens left, not with 33. Borne whole, a catch-up
    over tier-0 rounds' tokens grows with the seconds spent there, and a closed batch of 8 on the
    real pair that went to tier 0 on a noisy measure stayed there (GSM, 1.02x the target alone).
    Where the tier is priced from another bucket's cells (none of the batch's own), it is borne
    whole (such an estimate may be far off); a cell of the bucket's own, however few its rounds,
    is enough (an engine's batch of 8 whose warm-up left L = 4 one counted round there stayed at
    tier 0 behind its deferred prompts). Nothing behind: it drafts."""
    from parse_sglang.request_state import state_of

    costs = linear_costs()

    def controller(borrowed=(), unmeasured=()) -> AdaptiveDraftLength:
        made = AdaptiveDraftLength((0, 8), costs)
        for _ in range(200):
            made.pooled.observe(8, 8)
        own = {key: s for key, s in costs.draft.items() if key not in borrowed}
        made.costs = CostTable(draft=own, rest=dict(costs.rest))  # online: catch-ups are priced
        for key in set(own) - set(unmeasured):
            made.costs._measured.add((id(made.costs.draft), key))
        made._catch_ups.append((1, 4, costs.draft[1, 4] + 30 * costs.cost(1, DECODE, 1), 500))  # an L = 4 round's
        return made

    for behind, left, borrowed, unmeasured, want in (
        (500, 4000, (), (), 8),  # its share of 4,000 tokens
        (500, 33, (), (), 0),
        (500, 4000, (), [(1, 8)], 8),  # L = 8's cell of one round (not yet measured: EXPLORE_SAMPLES)
        (500, 4000, [(1, 8)], (), 0),  # L = 8 priced from no cell of its own
        (0, 33, [(1, 8)], (), 8),
    ):
        req, (policy,) = SimpleNamespace(), policies(1)
        state_of(req).draft_behind, policy.left = behind, left
        made = controller(borrowed, unmeasured)
        assert made.choose([req], [policy], rows_of, steps=4) == drafting(want), (behind, left, borrowed, unmeasured)


def test_a_prefill_defers_the_draft_where_drafting_would_not_repay_it():
    """The draft's prefill of requests joining a batch runs where the seconds the best measured
    drafting tier saves per output position against tier 0, times the mean output length, beat
    the catch-up line's price of those tokens; not where the draft keeps nothing, nor where outputs
    end too soon to repay it. Before the batch's bucket has tier 0 and a drafting tier measured
    (an estimate borrowed from another bucket may be far off), and for a fixed L, it runs."""
    costs = linear_costs(buckets=(1,))
    decode = costs.cost(1, DECODE, 1)  # 22.1 ms
    per_position = costs.cost(1, drafting(8), 9) / 9  # 4.3 ms: every draft kept
    ends = [(100, True)] * 4  # outputs of 100 tokens: drafting saves ~1.8 s over one

    def controller(keep: int, lengths=ends, unmeasured=()) -> AdaptiveDraftLength:
        made = AdaptiveDraftLength((0, 8), CostTable(draft=dict(costs.draft), rest=dict(costs.rest)))
        for key in set(costs.draft) - set(unmeasured):
            made.costs._measured.add((id(made.costs.draft), key))
        for _ in range(200):
            made.pooled.observe(8, keep)
        made.ends.finished.extend(lengths)
        made._catch_ups.extend([(1, 8, costs.draft[1, 8] + 0.01, 20), (1, 8, costs.draft[1, 8] + 1.01, 1020)])
        return made  # a catch-up: 10 ms + 1 ms a token

    saved = (decode - per_position) * 100
    assert controller(8)._catch_up_seconds(1500) == pytest.approx(1.49)
    assert 1.49 < saved < controller(8)._catch_up_seconds(2000)
    assert controller(8).prefills_draft(1, 1500, rows_of)
    assert not controller(8).prefills_draft(1, 2000, rows_of)  # the prefill dearer than what drafting saves
    assert not controller(0).prefills_draft(1, 10, rows_of)  # a draft that keeps nothing never repays
    assert not controller(8, [(2, True)] * 4).prefills_draft(1, 100, rows_of)  # outputs end too soon
    assert controller(8).prefills_draft(32, 10**6, rows_of)  # bucket 32: nothing measured there
    assert controller(8, unmeasured=[(1, 0)]).prefills_draft(1, 2000, rows_of)  # tier 0 not measured there
    assert AdaptiveDraftLength((0, 8), CostTable()).prefills_draft(1, 10**6, rows_of)  # nothing measured
    assert FixedDraftLength(8).prefills_draft(1, 10**6, rows_of)


def test_a_head_that_keeps_nothing_is_probed_within_the_overhead():
    """With an EAGLE-3 head that keeps nothing, tier 0 runs and the head is probed like PARSE's
    drafting tiers, each kind on its own seconds since it last ran: over 1,000 rounds the head
    rounds' loss against tier 0 is within PROBE_OVERHEAD of the run's seconds. A head that then
    keeps all it drafts is chosen outright."""
    costs = linear_costs()
    costs.head = {b: 0.004 for b in (1, 8, 32)}
    controller = AdaptiveDraftLength(TIERS, costs, head_steps=3)
    for _ in range(200):
        controller.pooled.observe(4, 0)
        controller.head_pooled.observe(3, 0)
    req, tiers, lost, total = [SimpleNamespace()], [], 0.0, 0.0
    zero = costs.cost(1, DECODE, 1, steps=4) / 4
    for _ in range(1000):
        tier = controller.choose(req, policies(1), rows_of, steps=4)
        tiers.append(tier)
        seconds = costs.cost(1, tier, 4 if tier == HEAD else rows_of(tier.length), 4 if tier == DECODE else 1)
        total += seconds
        if tier == HEAD:
            lost += seconds - zero
            head_round(controller, req, [0])
        else:
            observe(controller, req, tier.length, [0 if tier.length else 3], steps=4 if tier == DECODE else 1)
    assert tiers[0] == DECODE and HEAD in tiers and drafting(4) in tiers and tiers[-50:].count(DECODE) > 25
    assert 0 < lost <= PROBE_OVERHEAD * total
    while (tier := controller.choose(req, policies(1), rows_of, steps=4)) != HEAD:
        observe(controller, req, tier.length, [0 if tier.length else 3], steps=4 if tier == DECODE else 1)
    for _ in range(20):
        head_round(controller, req, [3])
    assert controller.choose(req, policies(1), rows_of, steps=4) == HEAD
