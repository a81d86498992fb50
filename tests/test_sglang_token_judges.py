"""SGLang tier: PARSE's token judges (judge_mode "likelihood", "divergence", "head"; docs/testing.md §4).

A server whose judge reads draft tokens (no probe) reserves no probe rows (its verify window is
the L + 1 chain rows) and keeps the longest prefix of exact matches and tokens its judge accepts,
read from those chain rows (and, for a judge head, their hidden states). Checked against the
target's own logprobs of the returned tokens, against the Hugging Face reference for every mode,
and λ = 1 against lossless output. The server carries a judge head with random weights for the
tiny target (what it accepts is arbitrary; that worker and reference agree is the point).
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
# Divergence: the tiny target's entropy sits near log(400) ~ 6 nats at most positions.
DIVERGENCE = {"judge_mode": "divergence", "divergence_entropy": 4.0, "divergence_window": 1}
HEAD = {"judge_mode": "head", "head_threshold": 0.5}


def random_head(target_dir, path) -> str:
    """A judge head with random weights for the tiny target, written to `path`."""
    import torch

    from parse_sglang import judge_head

    identity = judge_head.TargetIdentity.of_checkpoint(target_dir)
    weights = torch.randn(
        identity.hidden_size + len(judge_head.EXTRA_FEATURES), generator=torch.Generator().manual_seed(0)
    )
    judge_head.JudgeHead(identity, weights * 0.5, 0.0, [], {"made": "tests: random weights"}).save(str(path))
    return str(path)


def params(**parse):
    return {
        "max_new_tokens": MAX_NEW,
        "temperature": 0.0,
        "custom_params": {"parse": {"return_probe_scores": True, **parse}},
    }


@pytest.fixture(scope="module")
def head_file(tiny_pair, tmp_path_factory):
    return random_head(tiny_pair[0], tmp_path_factory.mktemp("judge_head") / "head.json")


@pytest.fixture(scope="module")
def likelihood_engine(tiny_pair, engine_factory, head_file):
    config = dataclasses.replace(LIKELIHOOD, judge_head=head_file)
    with engine_factory(tiny_pair[0], **parse_engine_kwargs(tiny_pair[1], config)) as engine:
        yield engine


def test_window_is_the_chain_rows_and_judged_tokens_are_likely(likelihood_engine):
    """Verify rows per round = L + 1; in every round the reported score of each kept draft token is
    its target probability (SGLang's returned logprob), the first token past the exact match that
    was kept is likely (>= λ), and the token that stopped a round past its exact match is not."""
    (before,) = likelihood_engine.get_server_info()["internal_states"]
    outs = likelihood_engine.generate(BATCH_PROMPTS, params(), return_logprob=True)
    (after,) = likelihood_engine.get_server_info()["internal_states"]
    rows = after["parse"]["verify_rows"] - before["parse"]["verify_rows"]
    rounds = after["parse"]["rounds"] - before["parse"]["rounds"]
    assert rows == rounds * (LIKELIHOOD.draft_budget + 1) and after["parse"]["judge_probes"] == 0
    judged_rounds = stopped = 0
    for prompt, out in zip(BATCH_PROMPTS, outs):
        logprobs = [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]
        committed = 1
        for round_ in out["meta_info"]["parse"]["probe_scores"]:
            assert round_["probes"] == []  # no probe rows
            accepted, exact, scores = round_["accepted"], round_["exact"], round_["tokens"]
            assert len(scores) == len(round_["draft"])
            for j in range(accepted):
                assert math.exp(logprobs[committed + j]) == pytest.approx(scores[j], abs=1e-4)
            if accepted > exact:
                judged_rounds += 1
                assert scores[exact] >= LIKELIHOOD.likelihood_threshold
                if accepted < len(scores):
                    stopped += 1
                    assert scores[accepted] < LIKELIHOOD.likelihood_threshold
            committed += accepted + 1
    assert judged_rounds >= 3 and stopped >= 1


@pytest.mark.parametrize("mode", ["likelihood", "divergence", "head"])
def test_token_judged_rounds_equal_reference(likelihood_engine, hf_target, hf_draft, head_file, mode):
    """Each token judge, chosen per request, gives the reference generator's output token for token
    and the same judged count, and accepts something beyond exact matches."""
    from support.reference import ParseGenerator

    settings = {"likelihood": {}, "divergence": DIVERGENCE, "head": HEAD}[mode]
    tokenizer, target = hf_target
    config = dataclasses.replace(LIKELIHOOD, judge_head=head_file, **settings)
    reference = ParseGenerator(target, hf_draft, tokenizer, config)
    prompts = BATCH_PROMPTS[:4]
    outs = likelihood_engine.generate(prompts, params(**settings))
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
                reach = 0  # the longest prefix whose probes all passed
                for bound, score in round_["probes"]:
                    if score < both.threshold:
                        break
                    reach = bound
                assert round_["exact"] < reach  # the first judged token lies within it
                assert round_["tokens"][round_["exact"]] >= both.likelihood_threshold
    judged = {mode: sum(o["meta_info"]["parse"]["accepted_judged"] for o in outs_) for mode, outs_ in alone.items()}
    both_judged = sum(o["meta_info"]["parse"]["accepted_judged"] for o in outs)
    assert 0 < both_judged <= min(judged.values())
