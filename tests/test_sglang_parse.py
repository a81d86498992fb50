"""SGLang tier, PARSE: `--speculative-algorithm PARSE` in a real `sglang.Engine` on CPU.

Two engines per module on the tiny fp32 pair (draft = target + 5% weight noise):
- lossless: the judge off (`parse_config={"judge": False}`), L = 4: token-level
  speculative decoding, whose greedy output must equal the target's, with at most 4
  running requests (others join mid-flight) and chunked prefill;
- judged: the judge on with τ = 0 and a probe every 2 draft tokens, L = 6; requests
  change τ, the judge and the after-rejection policy per request
  (`custom_params={"parse": {...}}`), and the reference implementation
  (support.reference, Hugging Face) must reproduce them token for token, down to
  every judge score.
Responses carry `meta_info["parse"]` (per-request counters) and `get_server_info()` the
server's PARSE totals.
"""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch

from conftest import BATCH_PROMPTS, PROMPTS, engine_kwargs, parse_server_flags, target_continuations, probe_config
from parse_sglang.settings import parse_engine_kwargs
from parse_sglang.counters import COUNTERS

pytestmark = pytest.mark.sglang

MAX_NEW = 32
LOSSLESS = probe_config(draft_budget=4, judge=False)
JUDGED = probe_config(draft_budget=6, probe_stride=2, threshold=0.0)


def greedy(params, **extra):
    return {"max_new_tokens": MAX_NEW, "temperature": 0.0, **params, **extra}


@pytest.fixture(scope="module")
def target_greedy(hf_target):
    """prompt -> the target's greedy continuation (MAX_NEW tokens), from transformers."""
    return target_continuations(hf_target, BATCH_PROMPTS, MAX_NEW)


@pytest.fixture(scope="module")
def lossless_engine(tiny_pair, engine_factory):
    with engine_factory(
        tiny_pair[0],
        **parse_engine_kwargs(tiny_pair[1], LOSSLESS),
        decode_log_interval=1,  # SGLang folds accept-length totals into server info at each log
        max_running_requests=4,  # requests queue and join the running batch mid-flight
        chunked_prefill_size=64,  # the long prompt is prefilled (target and draft) in chunks
    ) as engine:
        yield engine


@pytest.fixture(scope="module")
def judged_engine(tiny_pair, engine_factory):
    with engine_factory(
        tiny_pair[0],
        **parse_engine_kwargs(tiny_pair[1], JUDGED),
        # JSON without free whitespace: else the random tiny target fills max_new_tokens with newlines
        constrained_json_disable_any_whitespace=True,
    ) as engine:
        yield engine


def stop_string_cases(tokenizer, outputs: dict, count: int = 6) -> list[tuple[str, str]]:
    """(prompt, stop) pairs: the text of two tokens of the prompt's greedy output
    (`outputs[prompt]`), every third token of the output's printable ASCII start."""
    cases = []
    for prompt, ids in outputs.items():
        for end in range(2, len(ids), 3):
            head = tokenizer.decode(ids[:end])
            if not (head.isascii() and head.isprintable()):
                break
            piece = tokenizer.decode(ids[end - 2 : end]).strip()
            if len(piece) >= 3:
                cases.append((prompt, piece))
    assert len(cases) >= 2, "the tiny target's outputs hold too few ASCII stop strings"
    return cases[:count]


def cut_at_stop_string(tokenizer, ids: list[int], stop: str) -> tuple[list[int], str]:
    """SGLang's stop-string rule: output_ids end with the first token that completes `stop`,
    the text right before `stop`."""
    for end in range(1, len(ids) + 1):
        text = tokenizer.decode(ids[:end])
        if stop in text:
            return ids[:end], text[: text.index(stop)]
    raise AssertionError(f"{stop!r} is not in the output")


def emitted_by_rounds(meta) -> int:
    """Tokens PARSE produced: the prefill token, then a bonus plus the accepted drafts per round."""
    stats = meta["parse"]
    return 1 + stats["rounds"] + stats["accepted_exact"] + stats["accepted_judged"]


# ----- lossless (judge off) -------------------------------------------------------------


def test_lossless_batch_equals_target_greedy(lossless_engine, target_greedy):
    outs = lossless_engine.generate(BATCH_PROMPTS, greedy({}))
    for prompt, out in zip(BATCH_PROMPTS, outs):
        assert out["output_ids"] == target_greedy[prompt], prompt
        stats = out["meta_info"]["parse"]
        assert set(stats) == set(COUNTERS) and all(type(value) is int for value in stats.values()), stats
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
        cut_inside += "parse" in out["meta_info"] and emitted_by_rounds(out["meta_info"]) > n
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


def test_lossless_stop_string_inside_accepted_draft(lossless_engine, hf_target, target_greedy):
    """A stop string completed inside a round's accepted tokens ends the output exactly where
    the target alone would have stopped (ids through the completing token, text before it)."""
    tokenizer, _ = hf_target
    cases = stop_string_cases(tokenizer, target_greedy)
    outs = lossless_engine.generate([p for p, _ in cases], [greedy({}, stop=[stop]) for _, stop in cases])
    cut_inside = 0
    for (prompt, stop), out in zip(cases, outs):
        ids, text = cut_at_stop_string(tokenizer, target_greedy[prompt], stop)
        assert (out["output_ids"], out["text"]) == (ids, text), (prompt, stop)
        assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
        cut_inside += emitted_by_rounds(out["meta_info"]) > len(ids)
    assert cut_inside >= 1


def test_server_info_reports_parse_totals(lossless_engine):
    """get_server_info()["internal_states"][0]["parse"]: the worker's totals, which grow by
    exactly the per-request counters of the requests served in between."""

    def totals() -> dict:
        (state,) = lossless_engine.get_server_info()["internal_states"]
        json.dumps(state["parse"])  # JSON-serialisable as /server_info sends it
        return state["parse"]

    before = totals()
    outs = lossless_engine.generate(BATCH_PROMPTS, greedy({}))
    after = totals()
    stats = [out["meta_info"]["parse"] for out in outs]
    delta = {name: after[name] - before[name] for name in (*COUNTERS, "requests", "verify_passes", "emitted_tokens")}
    assert delta["requests"] == len(outs)
    for name in ("rounds", "draft_tokens", "accepted_exact", "accepted_judged"):
        assert delta[name] == sum(s[name] for s in stats), name
    assert delta["emitted_tokens"] == sum(emitted_by_rounds(out["meta_info"]) - 1 for out in outs)
    # Passes verify several requests at once (max_running_requests=4), so fewer passes than
    # request-rounds; not all 11 at once, so more passes than any one request's rounds.
    assert max(s["rounds"] for s in stats) < delta["verify_passes"] < delta["rounds"]
    accepted = after["accepted_exact"] + after["accepted_judged"]
    assert after["tokens_per_round"] == pytest.approx(after["emitted_tokens"] / after["rounds"])
    assert after["tokens_per_verify_pass"] == pytest.approx(after["emitted_tokens"] / after["verify_passes"])
    assert after["draft_tokens_per_round"] == pytest.approx(after["draft_tokens"] / after["rounds"])
    assert after["acceptance_rate"] == pytest.approx(accepted / after["draft_tokens"])
    assert after["judged_share"] == 0.0 and after["tokens_per_round"] > 1.2


def test_draft_kv_is_priced_into_the_pool_budget(lossless_engine, tiny_pair):
    """SGLang sizes the target's KV pool at what one token costs in the target's AND the
    draft's pools (scheduler_patches/draft_kv_budget.py): unpriced, the draft pool came on
    top of --mem-fraction-static and ran out of GPU memory. The draft's bytes are its own
    config's (fp32: 4 bytes x K and V x KV heads x head_dim x layers), not the target's."""
    (state,) = lossless_engine.get_server_info()["internal_states"]
    kv = state["parse"]["kv_bytes_per_token"]
    config = json.loads((tiny_pair[1] / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    heads = config.get("num_key_value_heads", config["num_attention_heads"])
    assert kv["draft"] == 4 * 2 * heads * head_dim * config["num_hidden_layers"]
    assert kv["priced"] == kv["target"] + kv["draft"]


# ----- judge on -------------------------------------------------------------------------


def test_judge_accepts_beyond_exact_match(judged_engine):
    outs = judged_engine.generate(BATCH_PROMPTS, greedy({}))
    for out in outs:
        meta = out["meta_info"]
        assert meta["completion_tokens"] == MAX_NEW == len(out["output_ids"])
        assert meta["spec_verify_ct"] < meta["completion_tokens"]
    judged = sum(out["meta_info"]["parse"]["accepted_judged"] for out in outs)
    verifies = sum(out["meta_info"]["spec_verify_ct"] for out in outs)
    # τ = 0 accepts every full draft: L + 1 tokens per verify, bar the final cut.
    assert (MAX_NEW - 1) * len(outs) / verifies > JUDGED.draft_budget
    assert judged > 0


def test_judge_off_requests_in_a_judged_batch_stay_lossless(judged_engine, target_greedy):
    """Per-request judge off, batched with judged requests (whose probes pad every window)."""
    off = {"custom_params": {"parse": {"judge": False}}}
    params = [greedy(off) if i % 2 == 0 else greedy({}) for i in range(len(BATCH_PROMPTS))]
    outs = judged_engine.generate(BATCH_PROMPTS, params)
    for i, (prompt, out) in enumerate(zip(BATCH_PROMPTS, outs)):
        if i % 2 == 0:
            assert out["output_ids"] == target_greedy[prompt], prompt
            assert out["meta_info"]["parse"]["accepted_judged"] == 0
        else:
            assert out["meta_info"]["parse"]["accepted_judged"] > 0


@pytest.mark.parametrize("after_rejection", ["redraft", "target_to_delimiter"])
def test_judged_rounds_equal_reference(judged_engine, hf_target, hf_draft, after_rejection):
    """τ = 0.3 (per request) rejects some probes and accepts others; the Hugging Face
    reference of the same rounds, started from SGLang's state after prefill (prompt plus the
    target's first token), must emit the same tokens, with either policy after a rejection."""
    from support.reference import ParseGenerator

    tokenizer, target = hf_target
    draft = hf_draft
    settings = {"threshold": 0.3, "after_rejection": after_rejection}
    config = dataclasses.replace(JUDGED, **settings)
    reference = ParseGenerator(target, draft, tokenizer, config)
    prompts = BATCH_PROMPTS[:4]
    outs = judged_engine.generate(prompts, greedy({"custom_params": {"parse": settings}}))
    redraft = ParseGenerator(target, draft, tokenizer, dataclasses.replace(config, after_rejection="redraft"))
    judged = exact = policy_mattered = 0
    for prompt, out in zip(prompts, outs):
        state = tokenizer(prompt).input_ids + out["output_ids"][:1]
        expected, stats = reference.generate(state, MAX_NEW - 1)
        assert out["output_ids"][1:] == expected, prompt
        assert out["meta_info"]["parse"]["accepted_judged"] == stats.accepted_judged
        judged, exact = judged + stats.accepted_judged, exact + stats.accepted_exact
        if after_rejection != "redraft":
            policy_mattered += redraft.generate(state, MAX_NEW - 1)[0] != expected
    assert judged > 0 and exact > 0  # both kinds of acceptance happened
    if after_rejection != "redraft":
        assert policy_mattered > 0  # the target phases changed the output, and SGLang followed


def test_judge_scores_equal_reference(judged_engine, hf_target):
    """Every judge score SGLang's verify pass read (`return_probe_scores`) equals the Hugging
    Face reference's `parallel_verify` + `judge_scores` on the same committed context, draft
    and boundaries within 1e-3."""
    from parse_sglang.judge import build_judge_probe, judge_scores
    from support.reference import parallel_verify

    tokenizer, target = hf_target
    probe = build_judge_probe(tokenizer, probe_config().judge_question)
    prompts = BATCH_PROMPTS[:3]
    settings = {"threshold": 0.3, "return_probe_scores": True}
    outs = judged_engine.generate(prompts, greedy({"custom_params": {"parse": settings}}))
    compared, accepted_judged = 0, 0
    for prompt, out in zip(prompts, outs):
        stats, output = out["meta_info"]["parse"], out["output_ids"]
        assert set(stats) == {*COUNTERS, "probe_scores"} and len(stats["probe_scores"]) == stats["rounds"]
        committed = 1  # the prefill's token, then a round's accepted drafts and its bonus token
        for round_ in stats["probe_scores"]:
            draft, accepted, probes = round_["draft"], round_["accepted"], round_["probes"]
            assert output[committed : committed + accepted] == draft[:accepted]
            if probes:
                context = tokenizer(prompt).input_ids + output[:committed]
                bounds = [b for b, _ in probes]
                with torch.no_grad():
                    _, probe_logits = parallel_verify(target, context, draft, bounds, probe.suffix_ids)
                expected = judge_scores(probe_logits, probe)
                got = torch.tensor([score for _, score in probes])
                assert torch.allclose(got, expected, rtol=0, atol=1e-3), (prompt, bounds, got, expected)
                compared += len(probes)
            committed += accepted + 1
        assert committed >= len(output)
        accepted_judged += stats["accepted_judged"]
    assert compared >= 10 and accepted_judged > 0


def test_judged_stop_string_inside_accepted_draft(judged_engine, hf_target):
    """A stop string completed inside judge-accepted tokens cuts the judged output (which a
    stop string cannot change before it) exactly as SGLang cuts any output."""
    tokenizer, _ = hf_target
    full = judged_engine.generate(BATCH_PROMPTS, greedy({}))
    cases = stop_string_cases(tokenizer, {p: out["output_ids"] for p, out in zip(BATCH_PROMPTS, full)})
    outs = judged_engine.generate([p for p, _ in cases], [greedy({}, stop=[stop]) for _, stop in cases])
    by_prompt = dict(zip(BATCH_PROMPTS, full))
    cut_inside = judged = 0
    for (prompt, stop), out in zip(cases, outs):
        ids, text = cut_at_stop_string(tokenizer, by_prompt[prompt]["output_ids"], stop)
        assert (out["output_ids"], out["text"]) == (ids, text), (prompt, stop)
        cut_inside += emitted_by_rounds(out["meta_info"]) > len(ids)
        judged += out["meta_info"]["parse"]["accepted_judged"]
    assert cut_inside >= 1 and judged > 0


def test_sampled_and_greedy_requests_share_a_batch(judged_engine):
    """Sampled requests speculate on CPU as on a GPU (SGLang's sampling verification, the CPU
    runtime's torch kernels; the judge on): they draft, the judge extends what the target-only
    rule accepted, and their logprobs are the emitted tokens'. Greedy requests in the same
    batch keep their judged drafts. (Their distributions: tests/test_sglang_sampling.py.)"""
    prompts = BATCH_PROMPTS[:4]
    sampled = {"max_new_tokens": 12, "temperature": 1.0, "top_p": 0.95, "ignore_eos": True}
    batch = [p for p in prompts for _ in range(2)]
    params = [greedy({}, max_new_tokens=12, ignore_eos=True), sampled] * len(prompts)
    outs = judged_engine.generate(batch, params, return_logprob=True)
    for out in outs:
        meta = out["meta_info"]
        assert meta["completion_tokens"] == 12
        logprobs = meta["output_token_logprobs"]
        assert [tok for _, tok, _ in logprobs] == out["output_ids"]
        assert all(lp <= 0.0 for lp, _, _ in logprobs)
    for kind in (0, 1):  # greedy, sampled
        stats = [out["meta_info"]["parse"] for out in outs[kind::2]]
        assert sum(s["draft_tokens"] for s in stats) > 0 and sum(s["accepted_judged"] for s in stats) > 0, kind
        assert sum(s["rounds"] for s in stats) < 11 * len(stats), kind  # more than one token per round


def test_constrained_requests_are_served(judged_engine):
    """Regex and JSON-schema requests: the grammar holds on every emitted token (the judge
    is off for them: it cannot check a grammar)."""
    regex = "(yes|no), (yes|no)\\."
    out = judged_engine.generate(BATCH_PROMPTS[1], greedy({}, regex=regex, max_new_tokens=20))
    assert re.fullmatch(regex, out["text"]), out["text"]
    assert out["meta_info"]["parse"]["accepted_judged"] == 0
    schema = {
        "type": "object",
        "properties": {"answer": {"enum": ["yes", "no"]}, "count": {"enum": [1, 2, 3]}},
        "required": ["answer", "count"],
        "additionalProperties": False,
    }
    out = judged_engine.generate(BATCH_PROMPTS[2], greedy({}, json_schema=json.dumps(schema), max_new_tokens=40))
    value = json.loads(out["text"])
    assert set(value) == {"answer", "count"} and value["answer"] in ("yes", "no") and value["count"] in (1, 2, 3)
    assert out["meta_info"]["parse"]["accepted_judged"] == 0


def test_bad_request_settings_are_refused_by_name(judged_engine):
    for bad, named in (
        ({"threshold": 2}, "threshold=2"),
        ({"judge_question": "Ok?"}, "judge_question"),
        ({"draft_budget": JUDGED.draft_budget + 1}, f"draft_budget={JUDGED.draft_budget + 1}"),
        ({"probe_stride": 1}, "probe_stride=1"),
        ({"return_probe_scores": 1}, "return_probe_scores=1 is invalid: allowed is true or false"),
        ({"nope": 1}, r"unknown key\(s\) \['nope'\]: allowed are .*'return_probe_scores'"),
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
        ({"pp_size": 2}, "--pp-size=2: allowed is 1"),
        ({"enable_lora": True}, r"--enable-lora=True: allowed is off"),
        ({"speculative_eagle_topk": 2}, r"--speculative-eagle-topk=2: allowed is 1 \(a chain\)"),
        (
            {"speculative_num_draft_tokens": 3},
            r"--speculative-num-draft-tokens=3: allowed is --speculative-num-steps \+ 1",
        ),
        ({"speculative_accept_threshold_acc": 0.5}, "--speculative-accept-threshold-acc=0.5: allowed is 1.0"),
        ({"skip_tokenizer_init": True}, r"--skip-tokenizer-init=True: allowed is off \(the judge reads text\)"),
        ({"enable_return_hidden_states": True}, "--enable-return-hidden-states=True: allowed is off"),
        ({"enable_hierarchical_cache": True}, "--enable-hierarchical-cache=True: allowed is off"),
        (
            {"speculative_adaptive": True},
            r"--speculative-adaptive=True: allowed is off \(EAGLE's\); PARSE's adaptive draft length is --parse-config",
        ),
        ({"speculative_accept_threshold_single": 0.5}, "judge threshold τ is --parse-config"),
        (
            {"parse_config": {"adaptive": False, "tier0_steps": 2}},
            r"--parse-config tier0_steps=2: allowed is unset unless \"adaptive\"",
        ),
        (
            {"parse_config": {"adaptive": False, "cost_table": "c.json"}},
            r"--parse-config cost_table='c.json': allowed is unset unless",
        ),
    ],
)
def test_startup_refuses_bad_settings_by_name(tiny_pair, cpu_runtime, settings, message):
    import sglang

    if settings:  # every case but the first has a draft model
        settings = {"speculative_draft_model_path": str(tiny_pair[1]), **settings}
    with pytest.raises(ValueError, match=message):
        sglang.Engine(**engine_kwargs(tiny_pair[0], speculative_algorithm="PARSE", **settings))


def test_startup_refuses_draft_with_other_vocabulary(tiny_pair, cpu_runtime, tmp_path_factory):
    """Refused in the caller's process, naming the draft and both vocabulary sizes."""
    import sglang

    from support.tiny_models import build_model

    draft = str(build_model(tmp_path_factory.mktemp("draft_vocab300"), vocab_size=300))
    named = f"--speculative-draft-model-path={draft!r}: its vocabulary size 300 differs from the target's 400"
    with pytest.raises(ValueError, match=re.escape(named)):
        sglang.Engine(**engine_kwargs(tiny_pair[0], speculative_algorithm="PARSE", speculative_draft_model_path=draft))


def test_cli_flag_carries_parse_config(tiny_pair, cpu_runtime):
    from sglang.srt.server_args import prepare_server_args

    from parse_sglang.plugin import register

    register()
    argv = [*parse_server_flags(*tiny_pair), "--device", "cpu", "--parse-config", '{"threshold": 1.5}']
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


def test_server_settings_are_parsed_once_per_process(monkeypatch):
    """Every request reads the server's settings (scheduler_patches/request_settings.py): the same
    settings and L give the same parsed object, other settings or L another, a refusal every time."""
    from parse_sglang import settings

    parsed = []
    real = settings._parse_server_config
    monkeypatch.setattr(settings, "_parse_server_config", lambda raw, n: parsed.append(raw) or real(raw, n))
    monkeypatch.setattr(settings, "_server_configs", {})
    first = settings.server_parse_config(_Args('{"threshold": 0.25}'), num_steps=6)
    assert settings.server_parse_config(_Args('{"threshold": 0.25}'), num_steps=6) is first
    assert settings.server_parse_config(_Args({"threshold": 0.25}), num_steps=6) is first  # Engine(parse_config=)
    assert settings.server_parse_config(_Args({"threshold": 0.5}), num_steps=6).threshold == 0.5
    assert settings.server_parse_config(_Args('{"threshold": 0.25}'), num_steps=7).draft_budget == 7
    assert len(parsed) == 3
    for _ in range(2):
        with pytest.raises(ValueError, match="threshold=2 is invalid"):
            settings.server_parse_config(_Args('{"threshold": 2}'), num_steps=6)
    assert len(parsed) == 5


def test_request_settings_may_only_narrow_the_server_window():
    from parse_sglang.settings import request_parse_config

    server = probe_config(draft_budget=8, probe_stride=4)
    assert request_parse_config(None, server) is server
    narrowed = request_parse_config({"parse": {"threshold": 0.9, "draft_budget": 5, "probe_stride": 6}}, server)
    assert (narrowed.threshold, narrowed.draft_budget, narrowed.probe_stride) == (0.9, 5, 6)
    with pytest.raises(ValueError, match=r"judge=true is invalid"):
        request_parse_config({"parse": {"judge": True}}, probe_config(judge=False))
    with pytest.raises(ValueError, match=r"\['delimiters'\] can only be set for the whole server"):
        request_parse_config({"parse": {"delimiters": ["\n"]}}, server)


def test_request_output_options_are_not_settings():
    from parse_sglang.settings import request_outputs, request_parse_config

    server = probe_config(draft_budget=8, probe_stride=4)
    asked = {"parse": {"return_probe_scores": True, "threshold": 0.9}}
    assert request_outputs(asked) == {"return_probe_scores"}
    assert request_parse_config(asked, server) == dataclasses.replace(server, threshold=0.9)
    assert request_parse_config({"parse": {"return_probe_scores": False}}, server) is server
    assert request_outputs({"parse": {"threshold": 0.9}}) == request_outputs(None) == frozenset()
    with pytest.raises(ValueError, match=r"return_probe_scores='yes' is invalid"):
        request_outputs({"parse": {"return_probe_scores": "yes"}})


def test_window_bound_holds_for_every_boundary_placement():
    """N_max must hold every window the worker builds: K never exceeds max_probes."""
    import random

    from parse_sglang.boundaries import probe_stride, select_boundaries
    from parse_sglang.attention.window import WindowGeometry

    rng = random.Random(0)
    for _ in range(300):
        config = probe_config(draft_budget=rng.randint(1, 40), probe_stride=rng.randint(1, 10))
        texts = [rng.choice(["a", "b.", " c", "\n", "! ", "d"]) for _ in range(config.draft_budget)]
        bounds = select_boundaries(texts, probe_stride(config.probe_stride, config.draft_budget), config.delimiters)
        assert len(bounds) <= WindowGeometry(config, 40).max_probes()
    geometry = WindowGeometry(probe_config(draft_budget=32, probe_stride=8), 40)
    assert geometry.max_probes() == 4 and geometry.max_rows == 193
    # at L = 8, Δ is at most 4: two probes
    assert geometry.rows(8, probes=True) == 1 + 8 + 2 * 40 and geometry.rows(8, probes=False) == 9
    assert WindowGeometry(probe_config(draft_budget=32, judge=False), 40).max_rows == 33
