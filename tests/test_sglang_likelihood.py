"""SGLang tier: PARSE's likelihood judge (judge_mode "likelihood", docs/testing.md §4).

A server in likelihood mode reserves no probe rows (its verify window is the L + 1 chain
rows) and accepts the longest boundary-ending prefix whose draft tokens each have target
probability >= λ, read from those chain rows. Checked against the target's own logprobs of
the returned tokens, against the Hugging Face reference, and λ = 1 against lossless output.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from conftest import BATCH_PROMPTS, hf_greedy, probe_config
from parse_sglang.settings import parse_engine_kwargs

pytestmark = pytest.mark.sglang

MAX_NEW = 24
# The tiny target gives the draft's tokens probabilities around 0.02-0.04 (vocabulary 400): λ = 0.02
# accepts some boundary prefixes and rejects others.
LIKELIHOOD = probe_config(draft_budget=6, probe_stride=2, judge_mode="likelihood", likelihood_threshold=0.02)


def params(**parse):
    return {
        "max_new_tokens": MAX_NEW,
        "temperature": 0.0,
        "custom_params": {"parse": {"return_probe_scores": True, **parse}},
    }


@pytest.fixture(scope="module")
def likelihood_engine(tiny_pair, engine_factory):
    with engine_factory(tiny_pair[0], **parse_engine_kwargs(tiny_pair[1], LIKELIHOOD)) as engine:
        yield engine


def test_window_is_the_chain_rows_and_judged_tokens_are_likely(likelihood_engine):
    """Verify rows per round = L + 1; every round that accepted beyond the exact match accepted
    tokens whose target probability (SGLang's returned logprob) is >= λ, up to a boundary
    whose smallest probability is >= λ, and the next boundary's is below it."""
    (before,) = likelihood_engine.get_server_info()["internal_states"]
    outs = likelihood_engine.generate(BATCH_PROMPTS, params(), return_logprob=True)
    (after,) = likelihood_engine.get_server_info()["internal_states"]
    rows = after["parse"]["verify_rows"] - before["parse"]["verify_rows"]
    rounds = after["parse"]["rounds"] - before["parse"]["rounds"]
    assert rows == rounds * (LIKELIHOOD.draft_budget + 1) and after["parse"]["judge_probes"] == 0
    judged_rounds = 0
    for prompt, out in zip(BATCH_PROMPTS, outs):
        logprobs = [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]
        committed = 1
        for round_ in out["meta_info"]["parse"]["probe_scores"]:
            assert round_["probes"] == []  # no probe rows
            accepted, exact, bounds = round_["accepted"], round_["exact"], dict(round_["likelihood"])
            if accepted > exact:
                judged_rounds += 1
                assert bounds[accepted] >= LIKELIHOOD.likelihood_threshold
                assert all(math.exp(lp) >= bounds[accepted] - 1e-5 for lp in logprobs[committed : committed + accepted])
                later = [b for b in bounds if b > accepted]
                if later and accepted < len(round_["draft"]):
                    assert bounds[min(later)] < LIKELIHOOD.likelihood_threshold
            committed += accepted + 1
    assert judged_rounds >= 3


def test_likelihood_rounds_equal_reference(likelihood_engine, hf_target, hf_draft):
    from support.reference import ParseGenerator

    tokenizer, target = hf_target
    reference = ParseGenerator(target, hf_draft, tokenizer, LIKELIHOOD)
    prompts = BATCH_PROMPTS[:4]
    outs = likelihood_engine.generate(prompts, params())
    judged = 0
    for prompt, out in zip(prompts, outs):
        state = tokenizer(prompt).input_ids + out["output_ids"][:1]
        expected, stats = reference.generate(state, MAX_NEW - 1)
        assert out["output_ids"][1:] == expected, prompt
        assert out["meta_info"]["parse"]["accepted_judged"] == stats.accepted_judged
        judged += stats.accepted_judged
    assert judged > 0


def test_threshold_one_is_lossless(likelihood_engine, hf_target):
    tokenizer, model = hf_target
    outs = likelihood_engine.generate(BATCH_PROMPTS, params(likelihood_threshold=1.0))
    for prompt, out in zip(BATCH_PROMPTS, outs):
        assert out["output_ids"] == hf_greedy(model, tokenizer(prompt).input_ids, MAX_NEW), prompt
        assert out["meta_info"]["parse"]["accepted_judged"] == 0


def test_probe_requests_are_refused_by_a_likelihood_server(likelihood_engine):
    with pytest.raises(
        ValueError, match=r"judge_mode='probe' is invalid: the server's verify window has no probe rows"
    ):
        likelihood_engine.generate(BATCH_PROMPTS[0], params(judge_mode="probe"))
    assert likelihood_engine.generate(BATCH_PROMPTS[0], params())["meta_info"]["parse"]["rounds"] > 0


def test_both_mode_needs_probe_and_likelihood(tiny_pair, engine_factory, hf_target, hf_draft):
    """judge_mode "both" on a probe server: a prefix passes only if both judges pass it; the
    reference agrees token for token, and it accepts no more than either judge alone."""
    from support.reference import ParseGenerator

    both = dataclasses.replace(LIKELIHOOD, judge_mode="both", threshold=0.3)
    tokenizer, target = hf_target
    prompts = BATCH_PROMPTS[:4]
    with engine_factory(tiny_pair[0], **parse_engine_kwargs(tiny_pair[1], both)) as engine:
        outs = engine.generate(prompts, params())
        alone = {mode: engine.generate(prompts, params(judge_mode=mode)) for mode in ("probe", "likelihood")}
    reference = ParseGenerator(target, hf_draft, tokenizer, both)
    for i, (prompt, out) in enumerate(zip(prompts, outs)):
        state = tokenizer(prompt).input_ids + out["output_ids"][:1]
        assert out["output_ids"][1:] == reference.generate(state, MAX_NEW - 1)[0], prompt
        for round_ in out["meta_info"]["parse"]["probe_scores"]:
            if round_["accepted"] > round_["exact"]:
                b = round_["accepted"]
                assert dict(round_["probes"])[b] >= both.threshold
                assert dict(round_["likelihood"])[b] >= both.likelihood_threshold
    judged = {mode: sum(o["meta_info"]["parse"]["accepted_judged"] for o in outs_) for mode, outs_ in alone.items()}
    both_judged = sum(o["meta_info"]["parse"]["accepted_judged"] for o in outs)
    assert 0 < both_judged <= min(judged.values())
