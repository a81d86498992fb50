"""SGLang tier: PARSE's draft through SGLang's EAGLE topk=1 chain machinery (draft_chain.py),
eager, at the shortest chain (L = 1: three EAGLE steps) and a long one (L = 16). Every
round's draft must be the draft model's own greedy continuation, as transformers computes
it (the graphed chain is checked in test_sglang_graphs.py, SmolLM2's in test_real_model.py).
"""

from __future__ import annotations

import pytest

from conftest import BATCH_PROMPTS, assert_drafts_are_draft_greedy, probe_config
from parse_sglang.settings import parse_engine_kwargs

pytestmark = pytest.mark.sglang

LOSSLESS = {
    "max_new_tokens": 24,
    "temperature": 0.0,
    "custom_params": {"parse": {"judge": False, "return_probe_scores": True}},
}


@pytest.fixture(scope="module", params=[1, 16])
def chain_engine(request, tiny_pair, engine_factory):
    """An eager PARSE engine with draft budget L (the chain is L + 2 EAGLE steps)."""
    config = probe_config(draft_budget=request.param, judge=False)
    with engine_factory(tiny_pair[0], **parse_engine_kwargs(tiny_pair[1], config)) as engine:
        yield engine


def test_eager_drafts_are_the_draft_models_greedy(chain_engine, hf_target, hf_draft):
    """Each round's draft is the draft model's greedy continuation of the committed tokens."""
    prompts = BATCH_PROMPTS[:4]
    outs = chain_engine.generate(prompts, LOSSLESS)
    assert assert_drafts_are_draft_greedy(outs, [hf_target[0](p).input_ids for p in prompts], hf_draft) >= 4
