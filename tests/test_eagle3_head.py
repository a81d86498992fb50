"""The synthetic target's EAGLE-3 head (support/eagle3_head.py, distilled on the target's own
greedy solutions), served by SGLang's own EAGLE3 on CPU: what a PARSE + EAGLE-3 composition
drafts its token-level stretches with. The head reproduces SGLang's `LlamaForCausalLMEagle3`
in plain torch; if its computation (aux layers, the token shift, RoPE, norms, residual) differed
from SGLang's, the distilled weights would draft nothing SGLang's target keeps. A random head
is the negative control."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from conftest import standalone_kwargs
from support import eagle3_head, synthetic

pytestmark = pytest.mark.sglang

PARAMS = {"max_new_tokens": 64, "temperature": 0.0}


@pytest.fixture(scope="module")
def served(engine_factory, tmp_path_factory):
    """{"target_only" | "distilled" | "random": (output ids, avg_spec_accept_length)} on 16
    held-out problems at once."""
    target, _ = synthetic.build(log=lambda line: None)
    enc = synthetic.Encoder(AutoTokenizer.from_pretrained(target))
    prompts = [enc.prompt_ids(p) for p in synthetic.problems(synthetic.TEST_SEED, 16)]
    heads = {
        "distilled": eagle3_head.build(log=lambda line: None),
        "random": eagle3_head.build_random_head(tmp_path_factory.mktemp("head") / "random", target),
    }
    runs = {"target_only": {}} | {
        name: {**standalone_kwargs(head, speculative_algorithm="EAGLE3"), "decode_log_interval": 1}
        for name, head in heads.items()
    }
    results = {}
    for name, settings in runs.items():
        with engine_factory(target, **settings) as engine:
            outs = engine.generate(input_ids=prompts, sampling_params=PARAMS)
            state = engine.get_server_info()["internal_states"][0]
        results[name] = ([o["output_ids"] for o in outs], state.get("avg_spec_accept_length"))
    return results


def test_eagle3_heads_keep_the_targets_output(served):
    for name in ("distilled", "random"):
        assert served[name][0] == served["target_only"][0], name


def test_distilled_head_drafts_what_the_target_keeps(served):
    """3 head steps per round (at most 4 tokens): the distilled head keeps most (3.3 measured),
    a random one almost nothing."""
    assert served["distilled"][1] > 2.5, served["distilled"][1]
    assert 1.0 <= served["random"][1] < 1.3, served["random"][1]
