"""SGLang tier, PARSE: `--speculative-algorithm PARSE` in a real `sglang.Engine` on CPU.

Two engines per module on the tiny fp32 pair (draft = target + 5% weight noise):
- lossless: the judge off (`parse_config={"judge": False}`), L = 4: token-level
  speculative decoding, whose greedy output must equal the target's, with at most 4
  running requests (others join mid-flight) and chunked prefill;
- judged: the judge on with τ = 0 and a probe every 2 draft tokens, L = 6; requests
  change τ, the judge and the after-rejection policy per request
  (`custom_params={"parse": {...}}`), and the reference implementation
  (parse_sglang.reference, Hugging Face) must reproduce them token for token.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from conftest import PROMPTS, engine_kwargs

pytestmark = pytest.mark.sglang

# Prompts of different lengths for the batch tests (>= 8, sent in one generate call).
BATCH_PROMPTS = PROMPTS + [
    "A",
    "Is the answer correct? Yes. Is the answer correct?",
    "red green red green red green red green red green red green red",
    "the cat and the dog and the sun and the moon",
    "Finally, the result value equals three plus four, so the total is",
    "We add the numbers first, then we print the total value. " * 12 + "So",  # chunked prefill
]
MAX_NEW = 32
LOSSLESS_STEPS = 4
JUDGED_STEPS, JUDGED_STRIDE = 6, 2


def greedy(params, **extra):
    return {"max_new_tokens": MAX_NEW, "temperature": 0.0, **params, **extra}


@pytest.fixture(scope="module")
def hf_target(tiny_pair):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_pair[0])
    model = AutoModelForCausalLM.from_pretrained(tiny_pair[0], dtype=torch.float32).eval()
    return tokenizer, model


@pytest.fixture(scope="module")
def target_greedy(hf_target):
    """prompt -> the target's greedy continuation (MAX_NEW tokens), from transformers."""
    tokenizer, model = hf_target
    out = {}
    for prompt in BATCH_PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            gen = model.generate(ids, max_new_tokens=MAX_NEW, do_sample=False)
        out[prompt] = gen[0, ids.shape[1] :].tolist()
    return out


@pytest.fixture(scope="module")
def lossless_engine(tiny_pair, engine_factory):
    with engine_factory(
        tiny_pair[0],
        speculative_algorithm="PARSE",
        speculative_draft_model_path=str(tiny_pair[1]),
        speculative_num_steps=LOSSLESS_STEPS,
        parse_config={"judge": False},
        decode_log_interval=1,  # SGLang folds accept-length totals into server info at each log
        max_running_requests=4,  # requests queue and join the running batch mid-flight
        chunked_prefill_size=64,  # the long prompt is prefilled (target and draft) in chunks
    ) as engine:
        yield engine


@pytest.fixture(scope="module")
def judged_engine(tiny_pair, engine_factory):
    with engine_factory(
        tiny_pair[0],
        speculative_algorithm="PARSE",
        speculative_draft_model_path=str(tiny_pair[1]),
        speculative_num_steps=JUDGED_STEPS,
        parse_config={"threshold": 0.0, "probe_stride": JUDGED_STRIDE},
    ) as engine:
        yield engine


def emitted_by_rounds(meta) -> int:
    """Tokens PARSE produced: the prefill token, then a bonus plus the accepted drafts per round."""
    stats = meta["parse_stats"][0]
    return 1 + stats["rounds"] + stats["accepted_exact"] + stats["accepted_judged"]


# ----- lossless (judge off) -------------------------------------------------------------


def test_lossless_batch_equals_target_greedy(lossless_engine, target_greedy):
    outs = lossless_engine.generate(BATCH_PROMPTS, greedy({}))
    for prompt, out in zip(BATCH_PROMPTS, outs):
        assert out["output_ids"] == target_greedy[prompt], prompt
        stats = out["meta_info"]["parse_stats"][0]
        assert stats["accepted_judged"] == 0
        assert stats["rounds"] == out["meta_info"]["spec_verify_ct"]
    tokens = sum(out["meta_info"]["completion_tokens"] for out in outs)
    verifies = sum(out["meta_info"]["spec_verify_ct"] for out in outs)
    assert tokens / verifies > 1.2, (tokens, verifies)
    (state,) = lossless_engine.get_server_info()["internal_states"]
    assert state["avg_spec_accept_length"] > 1.2


def test_lossless_max_new_tokens_inside_accepted_draft(lossless_engine, target_greedy):
    prompt = BATCH_PROMPTS[2]
    limits = list(range(1, 9))
    outs = lossless_engine.generate([prompt] * len(limits), [greedy({}, max_new_tokens=n) for n in limits])
    cut_inside = 0
    for n, out in zip(limits, outs):
        assert out["output_ids"] == target_greedy[prompt][:n], n
        assert out["meta_info"]["finish_reason"]["type"] == "length"
        cut_inside += "parse_stats" in out["meta_info"] and emitted_by_rounds(out["meta_info"]) > n
    assert cut_inside >= 2  # some rounds emitted more tokens than were left


def test_lossless_stop_token_inside_accepted_draft(lossless_engine, target_greedy):
    prompt = BATCH_PROMPTS[2]
    expected = target_greedy[prompt]
    stops = [tok for j, tok in enumerate(expected) if j >= 2 and tok not in expected[:j]][:4]
    outs = lossless_engine.generate([prompt] * len(stops), [greedy({}, stop_token_ids=[tok]) for tok in stops])
    cut_inside = 0
    for tok, out in zip(stops, outs):
        end = expected.index(tok) + 1
        assert out["output_ids"][:end] == expected[:end], tok
        assert len(out["output_ids"]) in (end - 1, end)  # the matched stop token may be stripped
        assert out["meta_info"]["finish_reason"]["type"] == "stop"
        cut_inside += emitted_by_rounds(out["meta_info"]) > end
    assert cut_inside >= 1


# ----- judge on -------------------------------------------------------------------------


def test_judge_accepts_beyond_exact_match(judged_engine):
    outs = judged_engine.generate(BATCH_PROMPTS, greedy({}))
    for out in outs:
        meta = out["meta_info"]
        assert meta["completion_tokens"] == MAX_NEW == len(out["output_ids"])
        assert meta["spec_verify_ct"] < meta["completion_tokens"]
    judged = sum(out["meta_info"]["parse_stats"][0]["accepted_judged"] for out in outs)
    verifies = sum(out["meta_info"]["spec_verify_ct"] for out in outs)
    # τ = 0 accepts every full draft: L + 1 tokens per verify, bar the final cut.
    assert sum(MAX_NEW - 1 for _ in outs) / verifies > JUDGED_STEPS
    assert judged > 0


def test_judge_off_requests_in_a_judged_batch_stay_lossless(judged_engine, target_greedy):
    """Per-request judge off, batched with judged requests (whose probes pad every window)."""
    off = {"custom_params": {"parse": {"judge": False}}}
    params = [greedy(off) if i % 2 == 0 else greedy({}) for i in range(len(BATCH_PROMPTS))]
    outs = judged_engine.generate(BATCH_PROMPTS, params)
    for i, (prompt, out) in enumerate(zip(BATCH_PROMPTS, outs)):
        if i % 2 == 0:
            assert out["output_ids"] == target_greedy[prompt], prompt
            assert out["meta_info"]["parse_stats"][0]["accepted_judged"] == 0
        else:
            assert out["meta_info"]["parse_stats"][0]["accepted_judged"] > 0


@pytest.mark.parametrize("after_rejection", ["redraft", "target_to_delimiter"])
def test_judged_rounds_equal_reference(judged_engine, tiny_pair, hf_target, after_rejection):
    """τ = 0.3 (per request) rejects some probes and accepts others; the Hugging Face
    reference of the same rounds, started from SGLang's state after prefill (prompt plus the
    target's first token), must emit the same tokens, with either policy after a rejection."""
    from transformers import AutoModelForCausalLM

    from parse_sglang.config import ParseConfig
    from parse_sglang.reference import ParseGenerator

    tokenizer, target = hf_target
    draft = AutoModelForCausalLM.from_pretrained(tiny_pair[1], dtype=torch.float32).eval()
    settings = {"threshold": 0.3, "after_rejection": after_rejection}
    config = ParseConfig(draft_budget=JUDGED_STEPS, probe_stride=JUDGED_STRIDE, **settings)
    reference = ParseGenerator(target, draft, tokenizer, config)
    prompts = BATCH_PROMPTS[:4]
    outs = judged_engine.generate(prompts, greedy({"custom_params": {"parse": settings}}))
    redraft = ParseGenerator(target, draft, tokenizer, dataclasses.replace(config, after_rejection="redraft"))
    judged = exact = policy_mattered = 0
    for prompt, out in zip(prompts, outs):
        state = tokenizer(prompt).input_ids + out["output_ids"][:1]
        expected, stats = reference.generate(state, MAX_NEW - 1)
        assert out["output_ids"][1:] == expected, prompt
        assert out["meta_info"]["parse_stats"][0]["accepted_judged"] == stats.accepted_judged
        judged, exact = judged + stats.accepted_judged, exact + stats.accepted_exact
        if after_rejection != "redraft":
            policy_mattered += redraft.generate(state, MAX_NEW - 1)[0] != expected
    assert judged > 0 and exact > 0  # both kinds of acceptance happened
    if after_rejection != "redraft":
        assert policy_mattered > 0  # the target phases changed the output, and SGLang followed


def test_sampling_logprobs_and_grammar_requests_are_served(judged_engine):
    sampled = greedy({}, temperature=0.8, top_p=0.9, max_new_tokens=12)
    out = judged_engine.generate(BATCH_PROMPTS[0], sampled, return_logprob=True)
    assert out["meta_info"]["completion_tokens"] == 12
    assert len(out["meta_info"]["output_token_logprobs"]) == 12
    regex = "(yes|no), (yes|no)\\."
    out = judged_engine.generate(BATCH_PROMPTS[1], greedy({}, regex=regex, max_new_tokens=20))
    assert re.fullmatch(regex, out["text"]), out["text"]
    assert out["meta_info"]["parse_stats"][0]["accepted_judged"] == 0  # the judge is off for grammars


def test_bad_request_settings_are_refused_by_name(judged_engine):
    for bad, named in (
        ({"threshold": 2}, "threshold=2"),
        ({"judge_question": "Ok?"}, "judge_question"),
        ({"draft_budget": JUDGED_STEPS + 1}, f"draft_budget={JUDGED_STEPS + 1}"),
        ({"probe_stride": 1}, "probe_stride=1"),
    ):
        with pytest.raises(ValueError, match=named):
            judged_engine.generate(PROMPTS[0], greedy({"custom_params": {"parse": bad}}))


# ----- startup errors -------------------------------------------------------------------


@pytest.mark.parametrize(
    "settings, message",
    [
        ({}, "--speculative-draft-model-path=None"),
        ({"parse_config": {"threshold": 1.5}}, r"threshold=1.5 is invalid: allowed is a number in \[0, 1\]"),
        ({"parse_config": {"thresh": 0.5}}, r"unknown PARSE setting\(s\) \['thresh'\]"),
        ({"parse_config": {"draft_budget": 5}, "speculative_num_steps": 4}, "--speculative-num-steps=4 and"),
        ({"page_size": 16}, "--page-size=16: allowed is 1"),
        ({"speculative_accept_threshold_single": 0.5}, "judge threshold τ is --parse-config"),
    ],
)
def test_startup_refuses_bad_settings_by_name(tiny_pair, cpu_runtime, settings, message):
    import sglang

    if settings:  # every case but the first has a draft model
        settings = {"speculative_draft_model_path": str(tiny_pair[1]), **settings}
    with pytest.raises(ValueError, match=message):
        sglang.Engine(**engine_kwargs(tiny_pair[0], speculative_algorithm="PARSE", **settings))


def test_cli_flag_carries_parse_config(tiny_pair, cpu_runtime):
    from sglang.srt.server_args import prepare_server_args

    from parse_sglang.plugin import register

    register()
    argv = ["--model-path", str(tiny_pair[0]), "--speculative-algorithm", "PARSE",
            "--speculative-draft-model-path", str(tiny_pair[1]), "--device", "cpu",
            "--parse-config", '{"threshold": 1.5}']  # fmt: skip
    server_args = prepare_server_args(argv)
    assert server_args._parse_config == '{"threshold": 1.5}'
    with pytest.raises(ValueError, match=r"threshold=1.5 is invalid"):
        server_args.resolve_once()


# ----- settings (no engine) -------------------------------------------------------------


class _Args:
    """The two things `server_parse_config` reads from a server-args record."""

    def __init__(self, parse_config=None):
        if parse_config is not None:
            self._parse_config = parse_config


def test_server_settings_merge_cli_json_and_num_steps():
    from parse_sglang.settings import server_parse_config

    config = server_parse_config(_Args('{"threshold": 0.7, "probe_stride": 4}'), num_steps=12)
    assert (config.threshold, config.probe_stride, config.draft_budget) == (0.7, 4, 12)
    assert server_parse_config(_Args({"draft_budget": 9}), num_steps=None).draft_budget == 9
    with pytest.raises(ValueError, match="not valid JSON"):
        server_parse_config(_Args("{threshold: 1}"), num_steps=None)


def test_request_settings_may_only_narrow_the_server_window():
    from parse_sglang.config import ParseConfig
    from parse_sglang.settings import request_parse_config

    server = ParseConfig(draft_budget=8, probe_stride=4)
    assert request_parse_config(None, server) is server
    narrowed = request_parse_config({"parse": {"threshold": 0.9, "draft_budget": 5, "probe_stride": 6}}, server)
    assert (narrowed.threshold, narrowed.draft_budget, narrowed.probe_stride) == (0.9, 5, 6)
    with pytest.raises(ValueError, match=r"judge=true is invalid"):
        request_parse_config({"parse": {"judge": True}}, ParseConfig(judge=False))
    with pytest.raises(ValueError, match=r"\['delimiters'\] can only be set for the whole server"):
        request_parse_config({"parse": {"delimiters": ["\n"]}}, server)


def test_window_bound_holds_for_every_boundary_placement():
    """N_max must hold every window the worker builds: K never exceeds max_probes."""
    import random

    from parse_sglang.boundaries import select_boundaries
    from parse_sglang.config import ParseConfig
    from parse_sglang.settings import max_probes, verify_window_max

    rng = random.Random(0)
    for _ in range(300):
        config = ParseConfig(draft_budget=rng.randint(1, 40), probe_stride=rng.randint(1, 10))
        texts = [rng.choice(["a", "b.", " c", "\n", "! ", "d"]) for _ in range(config.draft_budget)]
        bounds = select_boundaries(texts, config.probe_stride, config.delimiters)
        assert len(bounds) <= max_probes(config)
    config = ParseConfig(draft_budget=32, probe_stride=8)
    assert max_probes(config) == 4 and verify_window_max(config, 40) == 193
    assert verify_window_max(ParseConfig(draft_budget=32, judge=False), 40) == 33
