"""Retrieval in a real SGLang engine (CPU, fp32, tiny models, greedy): rounds that verify copies
and rounds that draft with the model, mixed, keep the target's output token for token; a copy
is the continuation of the request's longest earlier match; after copies the draft's KV is
caught up (each drafting round's draft is the draft model's own greedy continuation); finished
outputs feed later requests' copies; a request may turn retrieval off."""

from __future__ import annotations

import pytest

from conftest import (
    BATCH_PROMPTS,
    assert_drafts_are_draft_greedy,
    hf_greedy,
    target_continuations,
    write_pinned_costs,
)
from parse_sglang.retrieval import SuffixAutomaton, continuation
from parse_sglang.settings import ParseConfig, parse_engine_kwargs

pytestmark = pytest.mark.sglang

MAX_NEW = 48
TIERS = (0, 2, 4, 8)  # L = 8
SCORES = {"parse": {"return_probe_scores": True}}


def config(costs: str, **values) -> ParseConfig:
    return ParseConfig(draft_budget=8, adaptive_tiers=list(TIERS[:-1]), cost_table=costs, **values)


@pytest.fixture(scope="module")
def pinned_costs(tmp_path_factory) -> str:
    return write_pinned_costs(tmp_path_factory.mktemp("costs") / "costs.json", TIERS)


@pytest.fixture(scope="module")
def served(tiny_pair, pinned_costs, engine_factory, hf_target):
    """BATCH_PROMPTS at once on a server copying from the requests' own text only, then one
    request that turns retrieval off."""
    tokenizer, _ = hf_target
    kwargs = parse_engine_kwargs(tiny_pair[1], config(pinned_costs, retrieval_corpus=0))
    with engine_factory(tiny_pair[0], **kwargs) as engine:
        outs = engine.generate(BATCH_PROMPTS, {"max_new_tokens": MAX_NEW, "temperature": 0.0, "custom_params": SCORES})
        off = {"parse": {**SCORES["parse"], "retrieval": False}}
        opted_out = engine.generate(
            BATCH_PROMPTS[-1], {"max_new_tokens": MAX_NEW, "temperature": 0.0, "custom_params": off}
        )
        totals = engine.get_server_info()["internal_states"][0]["parse"]
    return outs, opted_out, totals, [tokenizer(p).input_ids for p in BATCH_PROMPTS]


def test_copies_and_drafts_mixed_keep_the_targets_output(served, hf_target):
    outs, opted_out, totals, _ = served
    greedy = target_continuations(hf_target, BATCH_PROMPTS, MAX_NEW)
    for prompt, out in zip(BATCH_PROMPTS, outs):
        assert out["output_ids"] == greedy[prompt], prompt
    assert opted_out["output_ids"] == greedy[BATCH_PROMPTS[-1]]
    rounds = [r for out in outs for r in out["meta_info"]["parse"]["probe_scores"]]
    copied = [r for r in rounds if r["copied"]]
    drafted = [r for r in rounds if not r["copied"] and r["draft"]]
    assert copied and drafted, [(r["length"], r["copied"]) for r in rounds]
    assert totals["copy_rounds"] == len(copied) + opted_out["meta_info"]["parse"]["copy_rounds"]
    assert totals["copy_accepted"] == sum(r["accepted"] for r in copied)
    assert any(r["accepted"] >= 4 for r in copied)  # a long copy kept
    assert sum(out["meta_info"]["parse"]["copy_rounds"] for out in outs) == len(copied)


def test_a_copy_is_what_followed_the_longest_earlier_match(served):
    """Each copied round's draft: the tokens after the first earlier occurrence of the longest
    suffix (>= retrieval_min_match tokens) of the request's prompt and output so far."""
    outs, _, _, prompt_ids = served
    checked = 0
    for ids, out in zip(prompt_ids, outs):
        committed = 1
        for round_ in out["meta_info"]["parse"]["probe_scores"]:
            if round_["copied"]:
                text = list(ids) + out["output_ids"][:committed]
                matched, end = SuffixAutomaton(text).earlier()
                assert matched >= ParseConfig().retrieval_min_match
                copy = continuation(text, end, len(round_["draft"]))
                assert round_["draft"] == list(copy) and round_["draft"], committed
                checked += 1
            committed += round_["accepted"] + 1
    assert checked


def test_the_drafts_after_copies_are_the_drafts_own(served, hf_draft):
    """Copies commit tokens the draft model never read: the next round that drafts first extends
    the draft over them, so its draft is the draft model's greedy continuation of everything
    committed (as transformers computes it from scratch)."""
    outs, _, _, prompt_ids = served
    after_copy = 0
    for out in outs:
        rounds = out["meta_info"]["parse"]["probe_scores"]
        after_copy += sum(a["copied"] and not b["copied"] and bool(b["draft"]) for a, b in zip(rounds, rounds[1:]))
    assert after_copy
    assert assert_drafts_are_draft_greedy(outs, prompt_ids, hf_draft) > 0


def test_a_request_can_turn_retrieval_off(served):
    _, opted_out, _, _ = served
    assert opted_out["meta_info"]["parse"]["copy_rounds"] == 0
    assert not any(r["copied"] for r in opted_out["meta_info"]["parse"]["probe_scores"])


def test_finished_outputs_are_copied_by_later_requests(tiny_pair, tmp_path, engine_factory, hf_target):
    """A second request that repeats a finished request's prompt and the start of its output
    copies the rest of that output from the corpus."""
    tokenizer, model = hf_target
    free_rows = write_pinned_costs(tmp_path / "free_rows.json", TIERS, row=0.0)  # any copy pays: it costs nothing
    first_ids = tokenizer("the cat and the dog").input_ids
    greedy = target_continuations(hf_target, ["the cat and the dog"], 40)["the cat and the dog"]
    with engine_factory(tiny_pair[0], **parse_engine_kwargs(tiny_pair[1], config(free_rows))) as engine:
        first = engine.generate(
            input_ids=first_ids, sampling_params={"max_new_tokens": 40, "temperature": 0.0, "ignore_eos": True}
        )
        assert first["output_ids"] == greedy
        second_ids = first_ids + first["output_ids"][:6]  # a second turn: its own text holds no earlier match
        second = engine.generate(
            input_ids=second_ids, sampling_params={"max_new_tokens": 24, "temperature": 0.0, "custom_params": SCORES}
        )
    rounds = second["meta_info"]["parse"]["probe_scores"]
    copied = [r for r in rounds if r["copied"]]
    assert copied, [(r["length"], r["copied"]) for r in rounds]
    assert copied[0]["draft"] == first["output_ids"][7 : 7 + len(copied[0]["draft"])]  # after its c_n, output[6]
    assert second["output_ids"] == hf_greedy(model, second_ids, 24)
