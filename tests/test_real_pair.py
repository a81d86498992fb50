"""The Qwen2.5-Coder pair (target 1.5B, draft 0.5B, `parse_sglang.models`), in fp32: runs only with
`-m real_pair`, where `python -m parse_sglang.models fetch qwen2.5-coder` has cached the
checkpoints (about 10 GB of memory: the pair in fp32 beside transformers' target).

- SGLang's qwen2 target-only greedy output equals transformers' on the converted target;
- PARSE with the judge off equals target-only SGLang on coding prompts, and drafted (the draft's
  tokens were kept).
"""

from __future__ import annotations

import pytest
import torch
from conftest import hf_greedy, sglang_engine, probe_config

from parse_sglang import models
from parse_sglang.settings import parse_engine_kwargs

pytestmark = [pytest.mark.real_pair, pytest.mark.sglang]

PROMPTS = [
    "Write a Python function `is_palindrome(s: str) -> bool` that ignores case and spaces.",
    'def running_max(values: list[int]) -> list[int]:\n    """Return the running maximum of values."""\n',
    "Write a function that returns the n-th Fibonacci number iteratively.",
]
MAX_NEW = 48
PAIR = dict(max_total_tokens=2048, mem_fraction_static=0.5, max_running_requests=4, context_length=2048)


@pytest.fixture(scope="module")
def pair():
    target, draft = (models.cached_checkpoint(m) for m in (models.QWEN_CODER_TARGET, models.QWEN_CODER_DRAFT))
    if target is None or draft is None:
        pytest.skip("the Qwen2.5-Coder checkpoints are not cached: python -m parse_sglang.models fetch qwen2.5-coder")
    return target, draft


@pytest.fixture(scope="module")
def prompt_ids(pair):
    from transformers import AutoTokenizer

    from parse_sglang.demo import chat_prompt_ids

    return chat_prompt_ids(AutoTokenizer.from_pretrained(pair[0]), PROMPTS)


@pytest.fixture(scope="module")
def target_only(pair, prompt_ids):
    with sglang_engine(pair[0], **PAIR) as engine:
        outs = engine.generate(input_ids=prompt_ids, sampling_params={"max_new_tokens": MAX_NEW, "temperature": 0})
    return [out["output_ids"] for out in outs]


def test_sglang_target_equals_transformers_greedy(pair, prompt_ids, target_only):
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(2)
    model = AutoModelForCausalLM.from_pretrained(pair[0], dtype=torch.float32).eval()
    for ids, got in zip(prompt_ids, target_only):
        assert got == hf_greedy(model, ids, MAX_NEW)


def test_parse_lossless_equals_target_only(pair, prompt_ids, target_only):
    config = probe_config(draft_budget=8, judge=False)
    with sglang_engine(pair[0], **PAIR, **parse_engine_kwargs(pair[1], config)) as engine:
        outs = engine.generate(input_ids=prompt_ids, sampling_params={"max_new_tokens": MAX_NEW, "temperature": 0})
    assert [out["output_ids"] for out in outs] == target_only
    assert sum(out["meta_info"]["parse"]["accepted_exact"] for out in outs) > 0


def test_demo_on_the_pair(pair):
    """`python -m parse_sglang.demo --pair qwen2.5-coder` in fp32 on its four tasks, PARSE at a fixed
    L = 8: lossless PARSE answers exactly as the target does (the demo exits 1 otherwise), every
    run's answers are graded, and STANDALONE and PARSE kept draft tokens (more than two tokens per
    target forward)."""
    import re
    import subprocess
    import sys

    argv = ["--pair", "qwen2.5-coder", "--dtype", "float32", "--max-new-tokens", "96"]
    argv += ["--parse-config", '{"draft_budget": 8, "adaptive": false}']
    command = [sys.executable, "-m", "parse_sglang.demo", *argv]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    out = proc.stdout
    assert len(re.findall(r"^--- PARSE: identical to target-only, ", out, re.M)) == 4, out[-3000:]
    rows = dict(re.findall(r"^(target only|STANDALONE|PARSE)\s+\d+\s+\d+\s+([\d.]+)\s+\d/4\s", out, re.M))
    assert float(rows["target only"]) == 1.0, out[-2000:]
    assert float(rows["STANDALONE"]) > 2.0 and float(rows["PARSE"]) > 2.0, out[-2000:]
