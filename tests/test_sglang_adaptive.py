"""The adaptive draft length on real SGLang engines (CPU): outputs stay the target's while the
tiers switch; a useless draft is driven to tier 0 and a draft identical to the target to the
longest tier within a few rounds (a pinned cost table: the choices are then deterministic); the
profiling command writes a table a server loads."""

from __future__ import annotations

import math
import shutil
from types import SimpleNamespace

import pytest

from conftest import (
    BATCH_PROMPTS,
    assert_drafts_are_draft_greedy,
    probe_config,
    target_continuations,
    write_pinned_costs,
)
from parse_sglang.adaptive import PROBE_OVERHEAD, AdaptiveDraftLength
from parse_sglang.cost_table import EXPLORE_SAMPLES, CostTable, bucket
from parse_sglang.draft_length import DECODE, drafting
from parse_sglang.settings import parse_engine_kwargs
from parse_sglang.tools.profile_cost import main as profile_cost_main
from parse_sglang.settings import ParseConfig
from support.tiny_models import build_model

pytestmark = pytest.mark.sglang

MAX_NEW = 48
TIERS = (0, 2, 4, 8)  # L = 8
SCORES = {"parse": {"return_probe_scores": True}}  # each round's entry carries its L ("length")


def adaptive(cost_table: str = "", **judge) -> ParseConfig:
    """The draft model's tiers alone (copies are test_sglang_retrieval.py's)."""
    judge = judge or {"judge": False}
    return probe_config(
        draft_budget=8, adaptive=True, adaptive_tiers=list(TIERS[:-1]), cost_table=cost_table, retrieval=False, **judge
    )


@pytest.fixture(scope="module")
def target_greedy(hf_target):
    return target_continuations(hf_target, BATCH_PROMPTS, MAX_NEW)


@pytest.fixture(scope="module")
def drafts(tiny_pair, tmp_path_factory):
    """{"useless": a random-weight draft of the target's shape, "identical": the target's copy}."""
    root = tmp_path_factory.mktemp("adaptive_drafts")
    return {
        "useless": build_model(root / "useless", seed=11),
        "identical": shutil.copytree(tiny_pair[0], root / "identical"),
    }


@pytest.fixture(scope="module")
def pinned_costs(tmp_path_factory) -> str:
    return write_pinned_costs(tmp_path_factory.mktemp("costs") / "costs.json", TIERS)


def serve(engine_factory, target, draft, config):
    """All of BATCH_PROMPTS at once; (outputs, each request's round lengths, the server's totals)."""
    with engine_factory(target, **parse_engine_kwargs(draft, config)) as engine:
        outs = engine.generate(BATCH_PROMPTS, {"max_new_tokens": MAX_NEW, "temperature": 0.0, "custom_params": SCORES})
        totals = engine.get_server_info()["internal_states"][0]["parse"]
    lengths = [[r["length"] for r in out["meta_info"]["parse"]["probe_scores"]] for out in outs]
    for out, per_round in zip(outs, lengths):
        assert set(per_round) <= set(TIERS), per_round
        assert out["meta_info"]["parse"]["draft_length"] == sum(per_round)
        assert out["meta_info"]["parse"]["rounds"] == len(per_round)
    return outs, lengths, totals


def assert_lossless(outs, target_greedy):
    for prompt, out in zip(BATCH_PROMPTS, outs):
        assert out["output_ids"] == target_greedy[prompt], prompt


def test_lossless_while_tiers_switch(tiny_pair, engine_factory, target_greedy):
    """Costs measured online: the controller explores (the shortest drafting tier, then tier 0)
    and then chooses; every output is the target's greedy one."""
    outs, lengths, totals = serve(engine_factory, tiny_pair[0], tiny_pair[1], adaptive())
    assert_lossless(outs, target_greedy)
    for per_round in lengths:
        explored = 1 + EXPLORE_SAMPLES  # a warm-up round, then the counted ones
        assert per_round[: 2 * explored] == [2] * explored + [0] * explored, per_round
        assert len(set(per_round)) >= 2
    assert 0 < totals["mean_draft_length"] < 8
    measured = {c["L"] for c in totals["cost_table"]["draft"] if c["bucket"] == bucket(len(BATCH_PROMPTS))}
    assert {0, 2} <= measured
    # where each output ended, as SGLang finished it: at a stop token, or cut at max_new_tokens
    reasons = [out["meta_info"]["finish_reason"]["type"] for out in outs]
    assert totals["output_ends"] == {"stopped": reasons.count("stop"), "cut": reasons.count("length")}


def test_useless_draft_runs_tier_zero(tiny_pair, drafts, pinned_costs, engine_factory, target_greedy):
    """Judged by likelihood at λ = 1 (lossless): tier-0 rounds have nothing to judge."""
    likelihood = dict(judge_mode="likelihood", likelihood_threshold=1.0)
    outs, lengths, totals = serve(engine_factory, tiny_pair[0], drafts["useless"], adaptive(pinned_costs, **likelihood))
    assert_lossless(outs, target_greedy)
    for per_round in lengths:
        first_zero = per_round.index(0)
        assert first_zero <= 4, per_round  # the prior's rounds, then tier 0
        later = per_round[first_zero:]
        assert later.count(0) >= 0.9 * len(later), per_round  # only the (spaced, backed-off) probes draft
        assert all(t == 2 for t in later if t), per_round  # a re-probe runs the smallest positive tier
    assert totals["mean_draft_length"] < 1.0


def test_tier_zero_runs_its_decode_steps_back_to_back(tiny_pair, drafts, pinned_costs, engine_factory, target_greedy):
    """tier0_steps = 4: a tier-0 round is up to 4 decode steps in one scheduler round, each
    counted as a round of L = 0 (by PARSE and in SGLang's spec_verify_ct and acceptance
    histogram: one per target forward); outputs stay the target's. A batch with penalties
    steps one token per round (each step's penalties need the tokens before it). The server
    has the probe judge and its requests turn it off: a batch in which no request probes is
    priced by its chain rows alone."""
    config = adaptive(pinned_costs, judge_mode="probe", tier0_steps=4)
    lossless = {"parse": {**SCORES["parse"], "judge": False}}
    with engine_factory(tiny_pair[0], **parse_engine_kwargs(drafts["useless"], config)) as engine:
        outs = engine.generate(
            BATCH_PROMPTS, {"max_new_tokens": MAX_NEW, "temperature": 0.0, "custom_params": lossless}
        )
        stepped = engine.get_server_info()["internal_states"][0]["parse"]
        engine.generate(BATCH_PROMPTS, {"max_new_tokens": 16, "temperature": 0.0, "frequency_penalty": 0.5})
        penalized = engine.get_server_info()["internal_states"][0]["parse"]
    assert_lossless(outs, target_greedy)
    for out in outs:
        meta = out["meta_info"]
        assert meta["spec_verify_ct"] == meta["parse"]["rounds"] == meta["completion_tokens"] - 1  # nothing accepted
        assert sum(meta["spec_correct_drafts_histogram"]) == meta["spec_verify_ct"]
        lengths = [r["length"] for r in meta["parse"]["probe_scores"]]
        assert lengths.count(0) >= 0.8 * len(lengths), lengths
    assert stepped["verify_passes"] > 2 * stepped["batch_rounds"], stepped
    passes, rounds = (penalized[k] - stepped[k] for k in ("verify_passes", "batch_rounds"))
    assert passes == rounds > 0


def test_identical_draft_runs_the_longest_tier(tiny_pair, drafts, pinned_costs, engine_factory, target_greedy):
    """From tier 0 (the prior) to the longest tier once a probe keeps everything; each round that
    drafts again after tier-0 rounds first extends the draft over the tokens they committed
    (without that its drafts would miss their KV and not be the target's own tokens). The first
    probe comes when tier-0 rounds have paid for its loss at PROBE_OVERHEAD (by the pinned costs,
    less what a new server's prior expects it to keep, in tier-0 rounds of 4 steps)."""
    costs, n = CostTable.load(pinned_costs), len(BATCH_PROMPTS)
    fresh = AdaptiveDraftLength(TIERS, costs)  # the server's tiers: adaptive_tiers and L
    keeps = fresh.keep_rate(SimpleNamespace()).expected(2, fresh.pooled)
    zero = costs.cost(n, DECODE, 1, steps=4)  # a tier-0 round: 4 decode steps, each a round of L = 0
    loss = costs.cost(n, drafting(2), 3) - (1 + keeps) * zero / 4  # a probe's seconds less its tokens' at tier 0's rate
    first_probe = 4 * math.ceil(loss / (PROBE_OVERHEAD * zero))
    outs, lengths, totals = serve(engine_factory, tiny_pair[0], drafts["identical"], adaptive(pinned_costs))
    assert_lossless(outs, target_greedy)
    for out, per_round in zip(outs, lengths):
        rounds = out["meta_info"]["parse"]["probe_scores"]
        assert [r["accepted"] for r in rounds[:-1]] == per_round[:-1]  # every draft token kept (the last: budget)
        assert per_round[0] == 0 and any(a == 0 < b for a, b in zip(per_round, per_round[1:])), per_round
        longest = per_round.index(8)
        assert longest <= first_probe + 3, per_round
        done = 1 + sum(r["accepted"] + 1 for r in rounds[:longest])  # the prefill's token, then each round's
        for tier, r in zip(per_round[longest:], rounds[longest:]):
            assert tier == 8 or MAX_NEW - done <= 8, (per_round, done)  # shorter only where the budget ends
            done += r["accepted"] + 1
        assert per_round.count(8) * 8 >= 0.6 * sum(per_round), per_round  # most draft tokens: the longest tier
    assert totals["mean_draft_length"] > 0.5


def test_deferred_draft_prefill_and_reused_slots(tiny_pair, drafts, pinned_costs, engine_factory, hf_target):
    """The pinned costs start at tier 0: a first turn of short requests runs tier 0 only, so
    neither their prompts (deferred prefills) nor their outputs have draft KV. A long driver then
    brings the server to drafting, and while it drafts a second turn arrives, each prompt its first
    turn's prompt and output: a radix hit on those slots. Its prefill must defer too: its first
    drafting round extends the draft over the whole context, in pieces (chunked_prefill_size 32:
    at most 16 tokens of each request per extend). Checked: every round's draft is the draft's
    own greedy continuation (the identical draft's: the target's)."""
    tokenizer, target = hf_target
    first_ids = [tokenizer(p).input_ids for p in BATCH_PROMPTS]
    short = {"max_new_tokens": 5, "temperature": 0.0, "custom_params": SCORES}
    long = {"max_new_tokens": 400, "temperature": 0.0, "ignore_eos": True}
    config = adaptive(pinned_costs)
    with engine_factory(
        tiny_pair[0], chunked_prefill_size=32, **parse_engine_kwargs(drafts["identical"], config)
    ) as engine:
        first = engine.generate(input_ids=first_ids, sampling_params=short)
        second_ids = [ids + out["output_ids"] for ids, out in zip(first_ids, first)]

        async def second_turn_while_drafting():
            driver = await engine.async_generate(
                input_ids=tokenizer("Once upon").input_ids, sampling_params=long, stream=True
            )
            async for chunk in driver:
                if chunk["meta_info"]["completion_tokens"] >= 150:  # drafting at L = 8 by now
                    break
            turn = {**short, "max_new_tokens": 24}
            second = await engine.async_generate(input_ids=second_ids, sampling_params=turn)
            async for _ in driver:
                pass
            return second

        second = engine.loop.run_until_complete(second_turn_while_drafting())
    rounds = [[r["length"] for r in out["meta_info"]["parse"]["probe_scores"]] for out in first]
    assert all(not any(per_round) for per_round in rounds), rounds  # tier 0 only: no draft KV written
    rounds = [[r["length"] for r in out["meta_info"]["parse"]["probe_scores"]] for out in second]
    assert all(per_round[0] > 0 for per_round in rounds), rounds  # drafting from their first round
    assert sum(out["meta_info"]["cached_tokens"] for out in second) >= sum(len(ids) for ids in first_ids)
    assert_drafts_are_draft_greedy(second, second_ids, target)


def test_profile_cost_writes_a_table_a_server_loads(tiny_pair, cpu_runtime, tmp_path, capsys):
    path = tmp_path / "costs.json"
    argv = [
        "--model-path",
        str(tiny_pair[0]),
        "--draft-model-path",
        str(tiny_pair[1]),
        "--num-steps",
        "2",
        "--tiers",
        "0",
        "2",
        "--batch",
        "1",
        "2",
        "--max-new-tokens",
        "12",
        "--context-tokens",
        "40",
        "--out",
        str(path),
        "--parse-config",
        '{"judge": false}',  # verify rows: L + 1 (the judge's probe adds its suffix)
        "--engine-arg",
        "mem_fraction_static=0.5",
        "--engine-arg",
        "max_total_tokens=4096",
    ]
    assert profile_cost_main(argv) == 0
    printed = capsys.readouterr().out
    table = CostTable.load(str(path))
    # tier 0 measured at each batch size (an engine per size: its L = 1 too), tier 2 at each
    assert table.fixed and set(table.draft) == {(b, L) for b in (1, 2) for L in (0, 1, 2)}
    assert set(table.rest) == {(b, rows) for b in (1, 2) for rows in (1, 2, 3)}
    assert all(0 < s < 10 for s in [*table.draft.values(), *table.rest.values()])
    assert table.describe() in printed and f"written: {path}" in printed
