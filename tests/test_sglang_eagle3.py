"""PARSE composed with an EAGLE-3 head (`eagle3_head`, parse_sglang/eagle3_head.py) on real SGLang
engines (CPU): the synthetic target, PARSE's synthetic draft and the head distilled on the
target (support/eagle3_head.py). A pinned cost table makes tier 0 win, so the target's own
stretches run as head rounds, and the controller's probes run PARSE drafting rounds between
them: both kinds must run, and every output must equal target-only's. The distilled head keeps
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
from support import eagle3_head, synthetic

PARAMS = {"max_new_tokens": 64, "temperature": 0.0}
SCORES = {"parse": {"return_probe_scores": True}}


@pytest.fixture(scope="module")
def pair_and_prompts():
    target, draft = synthetic.build(log=lambda line: None)
    enc = synthetic.Encoder(AutoTokenizer.from_pretrained(target))
    return target, draft, [enc.prompt_ids(p) for p in synthetic.problems(synthetic.TEST_SEED, 8)]


@pytest.fixture(scope="module")
def pinned_costs(tmp_path_factory) -> str:
    return write_pinned_costs(tmp_path_factory.mktemp("costs") / "costs.json", (0, 4, 8))


NEAR_TIE = 0.5  # logits: where the reference's top two are closer, SGLang's pick may differ (fp32 paths differ)


def assert_head_drafts_are_head_greedy(outs, prompts, head, target) -> tuple[int, int]:
    """Every head round's drafts are the head's own greedy chain (support.eagle3_head.Head in
    torch) over the tokens committed before that round, the target's aux states computed by
    transformers: the head's KV over every committed token (written by the prefill and by the
    extends after head rounds and PARSE rounds alike) is what a fresh head prefill of them
    gives. A draft may differ only where the reference's top two logits lie within NEAR_TIE
    (the chain is compared up to its first difference). Returns (rounds checked, near ties)."""
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


def serve(engine_factory, target, draft, prompts, head, costs):
    """(outputs, server totals) of a PARSE server with `head` (lossless, adaptive, L <= 8)."""
    config = ParseConfig(draft_budget=8, judge=False, adaptive=True, adaptive_tiers=[0, 4], cost_table=costs,
                         eagle3_head=str(head))  # fmt: skip
    with engine_factory(target, **parse_engine_kwargs(draft, config)) as engine:
        outs = engine.generate(input_ids=prompts, sampling_params={**PARAMS, "custom_params": SCORES})
        totals = engine.get_server_info()["internal_states"][0]["parse"]
    return outs, totals


@pytest.mark.sglang
def test_head_rounds_keep_the_targets_output(pair_and_prompts, pinned_costs, engine_factory, tmp_path):
    target, draft, prompts = pair_and_prompts
    with engine_factory(target) as engine:
        reference = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=PARAMS)]
    heads = {
        "distilled": eagle3_head.build(log=lambda line: None),
        "random": eagle3_head.build_random_head(tmp_path / "random", target),
    }
    per_round = {}
    for name, head in heads.items():
        outs, totals = serve(engine_factory, target, draft, prompts, head, pinned_costs)
        assert [o["output_ids"] for o in outs] == reference, name
        rounds = [r for o in outs for r in o["meta_info"]["parse"]["probe_scores"]]
        head_rounds = [r for r in rounds if r["head"]]
        assert head_rounds and any(r["length"] > 0 and not r["head"] for r in rounds), name  # both kinds ran
        assert all(r["length"] == 3 and len(r["draft"]) <= 3 for r in head_rounds)  # eagle3_steps' default
        stats = [o["meta_info"]["parse"] for o in outs]
        assert totals["head_rounds"] == sum(s["head_rounds"] for s in stats) == len(head_rounds)
        assert (
            totals["head_accepted"] == sum(s["head_accepted"] for s in stats) == sum(r["accepted"] for r in head_rounds)
        )
        per_round[name] = 1 + totals["head_accepted"] / totals["head_rounds"]  # tokens per head round
        if name == "distilled":
            hf_target = LlamaForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
            torch_head = eagle3_head.Head.load(head, target)
            checked, ties = assert_head_drafts_are_head_greedy(outs, prompts, torch_head, hf_target)
            assert checked > 50 and ties <= 0.05 * checked, (checked, ties)
    assert per_round["distilled"] > 1.3 > per_round["random"], per_round


def test_bad_head_settings_are_refused_by_name(pair_and_prompts, cpu_runtime, tmp_path):
    from parse_sglang.eagle3_head import head_aux_layers  # imports SGLang: after the CPU runtime

    target, draft, _ = pair_and_prompts
    config = json.loads((target / "config.json").read_text())
    target_config = SimpleNamespace(vocab_size=config["vocab_size"], hidden_size=config["hidden_size"],
                                    num_hidden_layers=config["num_hidden_layers"])  # fmt: skip
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
    for server, rejection, name in (
        (SimpleNamespace(**{**vars(cpu), "device": "cuda", "disable_cuda_graph": False}), False, "CUDA graphs"),
        (SimpleNamespace(**{**vars(cpu), "tp_size": 2}), False, "tensor parallelism"),
        (SimpleNamespace(**{**vars(cpu), "disaggregation_mode": "decode"}), False, "PD disaggregation"),
        (cpu, True, "--speculative-use-rejection-sampling"),
    ):
        refused(head, rf"is not supported with {name}", server=server, rejection=rejection)
    with pytest.raises(ValueError, match=r"eagle3_steps=0 is invalid: allowed is an integer in \[1, 16\]"):
        ParseConfig(eagle3_head=str(head), eagle3_steps=0)
