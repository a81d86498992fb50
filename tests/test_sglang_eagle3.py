"""PARSE composed with an EAGLE-3 head (`eagle3_head`, parse_sglang/eagle3_head.py) on real SGLang
engines (CPU): the synthetic target, PARSE's synthetic draft and the head distilled on the
target (support/eagle3_head.py). A pinned cost table prices a head round at 2.5 tier-0 rounds, so the controller's choice moves between head rounds and tier 0 with what each
request's head keeps, and its probes run PARSE drafting rounds between them: every kind must
run, every output must equal target-only's, and every head round's drafts must be what a fresh
head over the committed tokens drafts, also after judged acceptances. The distilled head keeps
more than 1.3 tokens per head round, a random head (the negative control) does not. Bad head
settings are refused by name."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoTokenizer, LlamaForCausalLM

from conftest import write_pinned_costs
from parse_sglang.settings import ParseConfig, parse_engine_kwargs
from sglang_cpu import CPU_GRAPHS_ENV
from support import eagle3_head, synthetic

PARAMS = {"max_new_tokens": 64, "temperature": 0.0}
SCORES = {"parse": {"return_probe_scores": True}}
# A head round 42 ms (its verify 20 ms), a tier-0 step 20 ms, a round of L = 4 43 ms: under the prior each
# loses a quarter of a decode step to tier 0, so probes of either kind come every ~12 tier-0 steps
# (PROBE_OVERHEAD 2%) and a 64-token output runs all three kinds.
HEAD_SECONDS = 0.022
DRAFT_STEP = 0.0045
JUDGED = {"judge": True, "judge_mode": "likelihood", "likelihood_threshold": 0.05}  # the synthetic-judged pair's


@pytest.fixture(scope="module")
def pair_and_prompts():
    target, draft = synthetic.build(log=lambda line: None)
    enc = synthetic.Encoder(AutoTokenizer.from_pretrained(target))
    return target, draft, [enc.prompt_ids(p) for p in synthetic.problems(synthetic.TEST_SEED, 8)]


@pytest.fixture(scope="module")
def pinned_costs(tmp_path_factory) -> str:
    return write_pinned_costs(
        tmp_path_factory.mktemp("costs") / "costs.json", (0, 4, 8), head=HEAD_SECONDS, draft_step=DRAFT_STEP
    )


@pytest.fixture(scope="module")
def distilled_head():
    return eagle3_head.build(log=lambda line: None)


NEAR_TIE = 0.5  # logits: where the reference's top two are closer, SGLang's pick may differ (fp32 paths differ)


def assert_head_drafts_are_head_greedy(outs, prompts, head_path, target_path) -> tuple[int, int]:
    """Every head round's drafts are the head's own greedy chain (support.eagle3_head.Head in
    torch) over the tokens committed before that round, the target's aux states computed by
    transformers: the head's KV over every committed token (written by the prefill and by the
    extends after head rounds, tier-0 decode steps and PARSE rounds alike) is what a fresh head
    prefill of them gives. A draft may differ only where the reference's top two logits lie
    within NEAR_TIE (the chain is compared up to its first difference). Returns (rounds
    checked, near ties)."""
    target = LlamaForCausalLM.from_pretrained(target_path, dtype=torch.float32).eval()
    head = eagle3_head.Head.load(head_path, target_path)
    checked = ties = 0
    for ids, out in zip(prompts, outs):
        committed = 1  # the prefill's token, then each round's accepted drafts and bonus
        for round_ in out["meta_info"]["parse"]["probe_scores"]:
            if round_["head"] and round_["draft"]:
                context = list(ids) + out["output_ids"][:committed]  # x_0 .. x_P, x_P the round's input
                aux, _ = eagle3_head.aux_states(target, torch.tensor([context[:-1]]), head.aux)
                expected, margins = head.greedy_chain(aux[0], torch.tensor(context[1:]), len(round_["draft"]))
                for got, want, margin in zip(round_["draft"], expected, margins):
                    if got != want:
                        assert margin < NEAR_TIE, (committed, round_, expected, margins)
                        ties += 1
                        break
                checked += 1
            committed += round_["accepted"] + 1
    return checked, ties


def head_config(costs, head, **settings) -> ParseConfig:
    """Adaptive PARSE with `head` over tiers 0 and 4 (L <= 8), priced by `costs`; lossless unless
    `settings` say otherwise."""
    return ParseConfig(
        **{"judge": False, **settings},
        draft_budget=8,
        adaptive=True,
        adaptive_tiers=[0, 4],
        cost_table=costs,
        eagle3_head=str(head),
    )


def serve(engine_factory, target, draft, prompts, head, costs, engine_settings=(), params=(), **settings):
    """(outputs, server totals) of a PARSE server with `head_config(costs, head, **settings)`
    (engine_settings: more sglang.Engine arguments; params: PARAMS' changes)."""
    config = head_config(costs, head, **settings)
    with engine_factory(target, **parse_engine_kwargs(draft, config), **dict(engine_settings)) as engine:
        outs = engine.generate(input_ids=prompts, sampling_params={**PARAMS, "custom_params": SCORES, **dict(params)})
        totals = engine.get_server_info()["internal_states"][0]["parse"]
    return outs, totals


def kinds(outs) -> dict:
    """Rounds per kind: head rounds, PARSE's drafting rounds and tier-0 decode steps."""
    rounds = [r for o in outs for r in o["meta_info"]["parse"]["probe_scores"]]
    return {
        "head": sum(r["head"] for r in rounds),
        "drafting": sum(r["length"] > 0 and not r["head"] for r in rounds),
        "tier 0": sum(r["length"] == 0 for r in rounds),
    }


@pytest.fixture(scope="module")
def reference(pair_and_prompts, engine_factory) -> list:
    """Target-only greedy outputs of the prompts."""
    target, _, prompts = pair_and_prompts
    with engine_factory(target) as engine:
        return [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=PARAMS)]


@pytest.mark.sglang
def test_head_rounds_keep_the_targets_output(
    pair_and_prompts, pinned_costs, distilled_head, engine_factory, reference, tmp_path
):
    target, draft, prompts = pair_and_prompts
    heads = {"distilled": distilled_head, "random": eagle3_head.build_random_head(tmp_path / "random", target)}
    per_round = {}
    for name, head in heads.items():
        outs, totals = serve(engine_factory, target, draft, prompts, head, pinned_costs)
        assert [o["output_ids"] for o in outs] == reference, name
        ran = kinds(outs)
        assert all(ran.values()), (name, ran)  # head rounds, PARSE drafting rounds and tier 0 all ran
        head_rounds = [r for o in outs for r in o["meta_info"]["parse"]["probe_scores"] if r["head"]]
        assert all(r["length"] == 3 and len(r["draft"]) <= 3 for r in head_rounds)  # eagle3_steps' default
        stats = [o["meta_info"]["parse"] for o in outs]
        assert totals["head_rounds"] == sum(s["head_rounds"] for s in stats) == len(head_rounds)
        assert (
            totals["head_accepted"] == sum(s["head_accepted"] for s in stats) == sum(r["accepted"] for r in head_rounds)
        )
        assert any(c["seconds"] == HEAD_SECONDS for c in totals["cost_table"]["head"])  # the head's own cell
        kv, config = totals["kv_bytes_per_token"], json.loads((head / "config.json").read_text())
        head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
        assert kv["head"] == 4 * 2 * config["num_key_value_heads"] * head_dim  # fp32 K and V, one layer
        assert kv["priced"] == kv["target"] + kv["draft"] + kv["head"]  # the head's pool in the KV budget
        per_round[name] = 1 + totals["head_accepted"] / totals["head_rounds"]  # tokens per head round
        if name == "distilled":
            checked, ties = assert_head_drafts_are_head_greedy(outs, prompts, head, target)
            assert checked > 20 and ties <= 0.05 * checked, (checked, ties)
    assert per_round["distilled"] > 1.3 > per_round["random"], per_round


@pytest.mark.sglang
def test_head_rounds_replay_graphs(pair_and_prompts, pinned_costs, distilled_head, engine_factory, reference):
    """The GPU graph path through the CPU graph stand-in: SGLang's EAGLE draft-chain graph of the
    head's k steps, and the target's verify graphs captured with the aux hidden-state capture the
    head reads (the head round's k + 1 chain rows among their widths). Every round of every kind
    replays graphs, the outputs are target-only's, and the head's drafts are still a fresh head's
    (the aux states the graphs hand back are the verify's own)."""
    target, draft, prompts = pair_and_prompts
    graphs = dict(disable_cuda_graph=False, disable_prefill_cuda_graph=True, cuda_graph_bs_decode=[1, 2, 4, 8])
    with pytest.MonkeyPatch.context() as env:
        env.setenv(CPU_GRAPHS_ENV, "1")  # read by this process's server-argument resolution and the scheduler
        outs, totals = serve(engine_factory, target, draft, prompts, distilled_head, pinned_costs, graphs.items())
    assert [o["output_ids"] for o in outs] == reference
    assert all(kinds(outs).values()), kinds(outs)
    assert totals["graph_passes"] == totals["verify_passes"] > 0, totals
    checked, ties = assert_head_drafts_are_head_greedy(outs, prompts, distilled_head, target)
    assert checked > 20 and ties <= 0.05 * checked, (checked, ties)


@pytest.mark.sglang
def test_the_heads_kv_follows_judged_acceptances(pair_and_prompts, distilled_head, engine_factory, tmp_path):
    """Under the judge a kept draft token need not be the target's prediction: the head is
    extended over what the round emitted, so its drafts after judged rounds are still a fresh
    head's over the committed text. (A head round at 1.5 tier-0 rounds: head rounds run first, and
    long outputs let the probes of PARSE's judged drafting come in between.)"""
    target, draft, prompts = pair_and_prompts
    costs = write_pinned_costs(tmp_path / "costs.json", (0, 4, 8), head=0.01, draft_step=DRAFT_STEP)
    long = {"max_new_tokens": 256, "ignore_eos": True}.items()
    outs, _ = serve(engine_factory, target, draft, prompts, distilled_head, costs, params=long, **JUDGED)
    rounds = [r for o in outs for r in o["meta_info"]["parse"]["probe_scores"]]
    assert any(r["accepted"] > r["exact"] for r in rounds), "no judged acceptance ran"
    assert kinds(outs)["head"], kinds(outs)
    checked, ties = assert_head_drafts_are_head_greedy(outs, prompts, distilled_head, target)
    assert checked > 10 and ties <= 0.05 * checked, (checked, ties)


def shared_prefix(a, b) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


@pytest.mark.sglang
def test_a_prefix_shared_with_another_request_is_matched_one_token_short(
    pair_and_prompts, distilled_head, engine_factory, tmp_path
):
    """Two prompts sharing their first n tokens, served one after the other: on a head server the
    second finds n - 1 tokens cached, not n (the radix tree keyed by bigrams as SGLang's EAGLE:
    the head's KV in the n-th shared slot holds the first prompt's token n + 1,
    scheduler_patches/head_prefix_cache.py), and its head drafts are a fresh head's over its
    own text. Control: a target-only server finds all n cached."""
    target, draft, prompts = pair_and_prompts
    first, second = max(((a, b) for a in prompts for b in prompts if a is not b), key=lambda p: shared_prefix(*p))
    shared = shared_prefix(first, second)
    assert shared >= 2, shared  # the synthetic prompts share a few tokens
    costs = write_pinned_costs(tmp_path / "costs.json", (0, 4, 8), head=0.01)
    config = head_config(costs, distilled_head)
    cached = {}
    for name, settings in {"head": parse_engine_kwargs(draft, config), "target only": {}}.items():
        with engine_factory(target, **settings) as engine:
            engine.generate(input_ids=[first], sampling_params=PARAMS)
            params = {**PARAMS, "custom_params": SCORES} if settings else PARAMS
            out = engine.generate(input_ids=[second], sampling_params=params)[0]
        cached[name] = out["meta_info"]["cached_tokens"]
        if name == "head":
            checked, ties = assert_head_drafts_are_head_greedy([out], [second], distilled_head, target)
            assert checked > 0 and ties == 0, (checked, ties)
    assert cached == {"head": shared - 1, "target only": shared}, (shared, cached)


KINDS = {  # batches whose every step's token reaches the host before the next is sampled
    "logprobs": ({}, {"return_logprob": True}),
    "grammar": ({"regex": "[a-z0-9 =+*-]+"}, {}),
}


@pytest.mark.sglang
def test_logprob_and_grammar_batches_keep_their_outputs(pair_and_prompts, distilled_head, engine_factory, tmp_path):
    """Head rounds in batches with logprobs or a grammar: SGLang's chain verification applies the
    grammar's mask to the head's drafts as to PARSE's, so every output (and logprob) is
    target-only's with the same settings, and head rounds ran in each kind of batch. (Penalties
    are not compared: SGLang's speculative verification applies them relaxed, every row of a
    round with the round's penalty state (eagle_utils.py), under EAGLE as under PARSE.)"""
    target, draft, prompts = pair_and_prompts
    prompts = prompts[:4]
    kinds_params = {name: ({**PARAMS, "max_new_tokens": 24, **extra}, call) for name, (extra, call) in KINDS.items()}
    with engine_factory(target) as engine:
        reference = {
            name: engine.generate(input_ids=prompts, sampling_params=params, **call)
            for name, (params, call) in kinds_params.items()
        }
    costs = write_pinned_costs(tmp_path / "costs.json", (0, 4, 8), head=0.0)  # a head round as cheap as tier 0
    config = head_config(costs, distilled_head)
    with engine_factory(target, **parse_engine_kwargs(draft, config)) as engine:
        for name, (params, call) in kinds_params.items():
            outs = engine.generate(input_ids=prompts, sampling_params=params, **call)
            assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in reference[name]], name
            assert sum(o["meta_info"]["parse"]["head_rounds"] for o in outs) > 0, name
            if "return_logprob" in call:
                for out, ref in zip(outs, reference[name]):
                    got = [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]
                    want = [lp for lp, _, _ in ref["meta_info"]["output_token_logprobs"]]
                    assert got == pytest.approx(want, abs=1e-3)


SAMPLES = 2000  # sampled outputs per source


@pytest.mark.sglang
def test_sampled_head_rounds_keep_the_targets_distribution(pair_and_prompts, distilled_head, engine_factory, tmp_path):
    """Sampled requests in head rounds: SGLang's target-only rule keeps a head draft token only
    where the target's own sample is that token, so one prompt's whole outputs (4 tokens, T = 1)
    from a server running head rounds are distributed as target-only's: test_sglang_sampling's
    two-sample chi-square and bound (p >= ALPHA), and the head rounds kept tokens (else the
    comparison says nothing of them). Negative control of the statistic at this sample size:
    target-only at T = 0.7 against T = 1 is rejected (p < ALPHA)."""
    from test_sglang_sampling import ALPHA, homogeneity

    target, draft, prompts = pair_and_prompts

    def draw(engine, temperature: float) -> list[tuple]:
        params = {"temperature": temperature, "max_new_tokens": 4, "ignore_eos": True}
        return [
            tuple(o["output_ids"]) for o in engine.generate(input_ids=[prompts[0]] * SAMPLES, sampling_params=params)
        ]

    common = dict(max_running_requests=64, max_total_tokens=16384)
    with engine_factory(target, random_seed=1, **common) as engine:
        reference, cooler = draw(engine, 1.0), draw(engine, 0.7)
    costs = write_pinned_costs(tmp_path / "costs.json", (0, 4, 8), head=0.0)  # a head round as cheap as tier 0
    config = head_config(costs, distilled_head)
    with engine_factory(target, random_seed=2, **common, **parse_engine_kwargs(draft, config)) as engine:
        sampled = draw(engine, 1.0)
        totals = engine.get_server_info()["internal_states"][0]["parse"]
    report = {"head rounds": homogeneity(sampled, reference), "control T=0.7": homogeneity(cooler, reference)}
    assert report["head rounds"][0] >= ALPHA, report
    assert report["control T=0.7"][0] < ALPHA, report
    assert totals["head_accepted"] > 0.2 * totals["head_rounds"] > 0, totals


def test_bad_head_settings_are_refused_by_name(pair_and_prompts, cpu_runtime, tmp_path):
    from parse_sglang.eagle3_head import head_aux_layers  # imports SGLang: after the CPU runtime

    target, draft, _ = pair_and_prompts
    config = json.loads((target / "config.json").read_text())
    target_config = SimpleNamespace(
        vocab_size=config["vocab_size"],
        hidden_size=config["hidden_size"],
        num_hidden_layers=config["num_hidden_layers"],
    )
    model = SimpleNamespace(set_eagle3_layers_to_capture=None)
    cpu = SimpleNamespace(disable_cuda_graph=True, device="cpu", tp_size=1, disaggregation_mode="null")
    head = eagle3_head.build_random_head(tmp_path / "head", target, aux_layer_ids=(0, 2, 4))
    assert head_aux_layers(str(head), target_config, model, cpu, False) == [0, 2, 4]

    def refused(path, match, server=cpu, rejection=False, target_model=model):
        with pytest.raises(ValueError, match=match):
            head_aux_layers(str(path), target_config, target_model, server, rejection)

    refused(tmp_path / "missing", r"eagle3_head='.*missing' is invalid \(FileNotFoundError\): allowed is an EAGLE-3")
    refused(draft, r"its architecture 'LlamaForCausalLM' is not an EAGLE-3 head")
    for key, value, match in (
        ("vocab_size", 7, r"its vocabulary \(7, draft .*\) is not the target's"),
        ("draft_vocab_size", 7, r"is not the target's .*: allowed is a head over the target's vocabulary"),
        ("target_hidden_size", 7, r"its target_hidden_size is not the target's hidden size"),
        ("eagle_config", {"eagle_aux_hidden_state_layer_ids": [0, 5]}, r"allowed are distinct layer ids in \[-1, 4\]"),
    ):
        bad = tmp_path / key
        bad.mkdir()
        changed = {**json.loads((head / "config.json").read_text()), key: value}
        (bad / "config.json").write_text(json.dumps(changed))
        refused(bad, match)
    refused(head, r"cannot capture EAGLE-3 hidden states", target_model=SimpleNamespace())
    graphs = SimpleNamespace(**{**vars(cpu), "device": "cuda", "disable_cuda_graph": False})
    assert head_aux_layers(str(head), target_config, model, graphs, False) == [0, 2, 4]  # graphs: built
    for server, rejection, name in (
        (SimpleNamespace(**{**vars(cpu), "tp_size": 2}), False, "tensor parallelism"),
        (SimpleNamespace(**{**vars(cpu), "disaggregation_mode": "decode"}), False, "PD disaggregation"),
        (cpu, True, "--speculative-use-rejection-sampling"),
    ):
        refused(head, rf"is not supported with {name}", server=server, rejection=rejection)
    with pytest.raises(ValueError, match=r"eagle3_steps=0 is invalid: allowed is an integer in \[1, 16\]"):
        ParseConfig(eagle3_head=str(head), eagle3_steps=0)
