"""SGLang tier, in-process: requests that would kill a scheduler raise ValueError from
`sglang.Engine.generate`, on a target-only engine (PARSE's plugin validates every server).

One target-only `sglang.Engine` on the tiny fp32 target for the module. Each refused request
names the field, the value and what is allowed; stock SGLang 0.5.23 lets the first group
through to the scheduler, which dies (out-of-vocabulary prompt ids, an empty text prompt,
top_logprobs_num above the vocabulary size, logprob_start_len < -1, a sampled top_k >= 2**31).
After every refusal the engine still serves greedy requests exactly as transformers does.
"""

from __future__ import annotations

import math
import re

import pytest

from conftest import hf_greedy

pytestmark = pytest.mark.sglang

VOCAB = 400
IN_VOCAB = f"allowed is [0, {VOCAB}) (the model's vocabulary)"
GREEDY = {"max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def engine(tiny_pair, engine_factory):
    with engine_factory(tiny_pair[0]) as engine:
        yield engine


# (name, generate keyword arguments, the start of the ValueError message)
KILLED_STOCK_SGLANG = [
    ("oov-id", dict(input_ids=[5, 6, VOCAB]), f"input_ids[2]={VOCAB} is out of range: {IN_VOCAB}"),
    ("negative-id", dict(input_ids=[-1, 5]), f"input_ids[0]=-1 is out of range: {IN_VOCAB}"),
    ("oov-id-in-batch", dict(input_ids=[[5, 6], [7, 8, 2**40]]), f"input_ids[2]={2**40} is out of range: {IN_VOCAB}"),
    ("empty-text", dict(prompt=""), "the prompt is empty (0 tokens): allowed is a prompt of at least 1 token"),
    (
        "top-logprobs",
        dict(prompt="one", return_logprob=True, top_logprobs_num=VOCAB + 1),
        f"top_logprobs_num={VOCAB + 1} is out of range: allowed is an integer in [0, {VOCAB}]",
    ),
    (
        "logprob-start",
        dict(prompt="one", return_logprob=True, logprob_start_len=-5),
        "logprob_start_len=-5 is out of range",
    ),
    (
        "top-k",
        dict(prompt="one", sampling_params={"temperature": 1.0, "top_k": 2**31}),
        f"top_k={2**31} is out of range: allowed is -1 (no limit) or [1, {2**31 - 1}]",
    ),
]

SERVED_OR_500_BY_STOCK_SGLANG = [
    (
        "stop-token-ids",
        dict(prompt="one", sampling_params={"stop_token_ids": [3, VOCAB]}),
        f"stop_token_ids: {VOCAB} is out of range: allowed are token ids in [0, {VOCAB})",
    ),
    (
        "logit-bias-oov",
        dict(prompt="one", sampling_params={"logit_bias": {str(VOCAB): 1.0}}),
        f"logit_bias key '{VOCAB}' is out of range: allowed are token ids in [0, {VOCAB})",
    ),
    (
        "logit-bias-key",
        dict(prompt="one", sampling_params={"logit_bias": {"x1": 1.0}}),
        "logit_bias key 'x1' is not a token id",
    ),
    (
        "logit-bias-nan",
        dict(prompt="one", sampling_params={"logit_bias": {"5": math.nan}}),
        "logit_bias['5']=nan is invalid: allowed is a finite number",
    ),
    (
        "n-zero",
        dict(prompt="one", sampling_params={"n": 0}),
        "sampling_params.n=0 is out of range: allowed is an integer in [1, 128]",
    ),
    ("n-huge", dict(prompt="one", sampling_params={"n": 10**9}), "sampling_params.n=1000000000 is out of range"),
    (
        "params-per-prompt",
        dict(prompt=["one", "two"], sampling_params=[{"max_new_tokens": 2}]),
        "sampling_params has 1 entries for a batch of 2 prompts",
    ),
    (
        "int-type",
        dict(prompt="one", sampling_params={"max_new_tokens": 4.5}),
        "max_new_tokens=4.5 is invalid: allowed is an integer",
    ),
    (
        "stop-regex",
        dict(prompt="one", sampling_params={"stop_regex": "(a"}),
        "stop_regex='(a' is not a regular expression",
    ),
    (
        "custom-params",
        dict(prompt="one", sampling_params={"custom_params": 5}),
        "custom_params=5 is invalid: allowed is a JSON object",
    ),
    (
        "parse-on-target-only",
        dict(prompt="one", sampling_params={"custom_params": {"parse": {"threshold": "x"}}}),
        'custom_params["parse"] is only accepted by a server launched with --speculative-algorithm PARSE',
    ),
]


@pytest.mark.parametrize(
    "kwargs, message",
    [pytest.param(*case[1:], id=case[0]) for case in KILLED_STOCK_SGLANG + SERVED_OR_500_BY_STOCK_SGLANG],
)
def test_refused_with_value_error_naming_the_field(engine, kwargs, message):
    kwargs = {"sampling_params": dict(GREEDY), **kwargs}
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        engine.generate(**kwargs)


def test_engine_serves_exactly_after_the_refusals(engine, hf_target):
    tokenizer, model = hf_target
    prompts = ["The model is", "one two three", "def f(x):"]
    outs = engine.generate(prompts, GREEDY)
    for prompt, out in zip(prompts, outs):
        assert out["output_ids"] == hf_greedy(model, tokenizer(prompt).input_ids, 8, ignore_eos=True), prompt
    ids = [[5, 6, VOCAB - 1], [0, 1]]  # the vocabulary's edges are token ids like any other
    for prompt_ids, out in zip(ids, engine.generate(input_ids=ids, sampling_params=GREEDY)):
        assert out["output_ids"] == hf_greedy(model, prompt_ids, 8, ignore_eos=True)
