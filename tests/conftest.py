"""Shared fixtures for the SGLang tier: a tiny target/draft pair and real SGLang engines on CPU.

Engines are real `sglang.Engine`s with the CPU settings of docs/cpu-runtime.md (fp32, torch_native
attention, no CUDA graphs, a small KV pool). Starting one costs ~15 s, so a module starts
each configuration once (`sglang_engine` as a module-scoped fixture's context manager) and
the target-only greedy outputs every parity test compares with are computed once per session
(`target_only_outputs`). `sglang_cpu.enable()` runs only when a fixture that starts
SGLang is first used, never at collection.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from parse_sglang.settings import ParseConfig
from sglang_cpu import CPU_ENGINE_SETTINGS
from support.reference import hf_greedy  # noqa: F401 (the tests' reference greedy, imported from here)
from support.tiny_models import build_pair

# Prompts that every SGLang parity test uses; the later ones repeat themselves, which gives
# NGRAM's corpus something to match.
PROMPTS = [
    "The model is",
    "Step one: add the two numbers. Step two: add the two numbers. Step",
    "def f(x): return x\ndef f(x): return x\ndef",
    "Yes No Yes No Yes No Yes",
    "one two three four one two three four one two",
]
MAX_NEW_TOKENS = 32
# Prompts of different lengths for the batch tests (>= 10, sent in one generate call); the
# last one is longer than a 64-token prefill chunk.
BATCH_PROMPTS = PROMPTS + [
    "A",
    "Is the answer correct? Yes. Is the answer correct?",
    "red green red green red green red green red green red green red",
    "the cat and the dog and the sun and the moon",
    "Finally, the result value equals three plus four, so the total is",
    "We add the numbers first, then we print the total value. " * 12 + "So",
]


BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def pytest_collection_modifyitems(config, items):
    """`real_pair` tests (minutes each, the 1.5B pair's checkpoints) run only when `-m` names them."""
    if "real_pair" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="the Qwen2.5-Coder pair's tests run with -m real_pair")
    for item in items:
        if "real_pair" in item.keywords:
            item.add_marker(skip)


def load_benchmark(name: str, module_name: str | None = None):
    """benchmarks/<name>.py imported as a module (registered in sys.modules under module_name,
    default name: dataclasses look their module up while a class is built)."""
    spec = importlib.util.spec_from_file_location(module_name or name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def engine_kwargs(model_path, **overrides) -> dict:
    """`sglang.Engine` keyword arguments for a tiny fp32 model on CPU (docs/cpu-runtime.md)."""
    kwargs = dict(
        model_path=str(model_path),
        **CPU_ENGINE_SETTINGS,
        max_total_tokens=4096,
        # The fraction only sizes the KV pool, which max_total_tokens caps; a tiny value
        # fails SGLang's "weights leave no memory" check when the machine is busy.
        mem_fraction_static=0.5,
        max_running_requests=16,
        log_level="error",
    )
    kwargs.update(overrides)
    return kwargs


def standalone_kwargs(draft_path, **overrides) -> dict:
    """Speculative settings for STANDALONE with a chain (topk=1) draft."""
    kwargs = dict(
        speculative_algorithm="STANDALONE",
        speculative_draft_model_path=str(draft_path),
        speculative_eagle_topk=1,
        speculative_num_steps=3,
        speculative_num_draft_tokens=4,
    )
    kwargs.update(overrides)
    return kwargs


def parse_server_flags(target, draft) -> list[str]:
    """Command-line flags of a PARSE server: the target, the algorithm and the draft."""
    return [
        "--model-path",
        str(target),
        "--speculative-algorithm",
        "PARSE",
        "--speculative-draft-model-path",
        str(draft),
    ]


# CPU_ENGINE_SETTINGS' device, attention backend and graphs as command-line flags (dtype and
# sleep-on-idle left to each command).
CPU_FLAGS = ["--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph"]


@contextlib.contextmanager
def sglang_engine(model_path, **overrides):
    """A real `sglang.Engine` on CPU, shut down on exit."""
    import sglang_cpu

    sglang_cpu.enable()
    import sglang

    engine = sglang.Engine(**engine_kwargs(model_path, **overrides))
    try:
        yield engine
    finally:
        engine.shutdown()


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory):
    """(target_dir, draft_dir): tiny Llama target and a 5%-noise draft sharing its tokenizer."""
    return build_pair(tmp_path_factory.mktemp("sglang_pair"), arch="llama", noise=0.05)


def target_continuations(hf_target, prompts, max_new: int) -> dict[str, list[int]]:
    """prompt -> the target's greedy continuation (max_new tokens), from transformers."""
    tokenizer, model = hf_target
    return {prompt: hf_greedy(model, tokenizer(prompt).input_ids, max_new) for prompt in prompts}


def probe_config(**values) -> ParseConfig:
    """A fixed-L server with the probe judge on (τ = 0.5; λ = 0.5 where a request picks the
    likelihood judge), `values` over it: what most engine tests exercise. The package's own
    defaults are adaptive and lossless (test_units checks them)."""
    base = {"adaptive": False, "judge": True, "judge_mode": "probe", "threshold": 0.5, "likelihood_threshold": 0.5}
    return ParseConfig(**{**base, **values})


def assert_drafts_are_draft_greedy(outs, prompt_ids, draft) -> int:
    """Every PARSE round's draft (`return_probe_scores` entries) is the draft model's own greedy
    continuation of the tokens committed before that round, as transformers computes it, and
    each draft token's confidence is its probability under the draft's logits there (the
    top-1, at temperature 1); returns how many rounds were checked. A round that verified a
    retrieved copy (`copied`) drafted nothing of the model's: it is not checked."""
    rounds = 0
    for ids, out in zip(prompt_ids, outs):
        committed = 1  # the prefill's token, then each round's accepted drafts and bonus
        for round_ in out["meta_info"]["parse"]["probe_scores"]:
            if round_.get("copied"):
                committed += round_["accepted"] + 1
                continue
            context = list(ids) + out["output_ids"][:committed]
            assert round_["draft"] == hf_greedy(draft, context, len(round_["draft"]), ignore_eos=True), committed
            with torch.no_grad():
                logits = draft(torch.tensor([context + round_["draft"]])).logits[0, len(context) - 1 : -1]
            reference = torch.softmax(logits.float(), dim=-1).amax(dim=-1)  # [len(draft)]
            assert torch.allclose(torch.tensor(round_["confidence"]), reference, rtol=0, atol=1e-4), committed
            committed += round_["accepted"] + 1
            rounds += 1
    return rounds


def write_pinned_costs(path, tiers, head: float = 0.0, draft_step: float = 0.006, row: float = 1e-4) -> str:
    """A fixed cost table (`cost_table`) of a machine where a draft step costs 0.3 of the verify
    pass (tier 0 skips the draft): a new request's prior (half its draft tokens kept) pays for
    no tier but 0, so an adaptive server starts at tier 0 and its probes draft now and then;
    head: seconds of an EAGLE-3 head's draft part (0: no head cell); draft_step: seconds of a
    draft step (a cheaper one makes probes come sooner); row: seconds of a verify row."""
    cells = [(b, L) for b in (1, 16) for L in tiers]
    table = {
        "draft": [{"bucket": b, "L": L, "seconds": draft_step * (L + 1) if L else 0.0} for b, L in cells],
        "rest": [{"bucket": b, "rows": L + 1, "seconds": 0.02 + row * (L + 1)} for b, L in cells],
        "head": [{"bucket": b, "seconds": head} for b in (1, 16)] if head else [],
    }
    Path(path).write_text(json.dumps(table))
    return str(path)


@pytest.fixture(scope="session")
def hf_draft(tiny_pair):
    """The tiny draft in transformers, fp32."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_pair[1], dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def hf_target(tiny_pair):
    """(tokenizer, model): the tiny target in transformers, fp32, the reference SGLang must match."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_pair[0])
    model = AutoModelForCausalLM.from_pretrained(tiny_pair[0], dtype=torch.float32).eval()
    return tokenizer, model


@pytest.fixture(scope="session")
def cpu_runtime():
    """Activate the CPU runtime for this test process (and the SGLang processes it starts)."""
    import sglang_cpu

    return sglang_cpu.enable()


@dataclasses.dataclass(frozen=True)
class ParityReference:
    """Target-only SGLang greedy outputs that speculative runs must reproduce exactly."""

    prompts: list[str]
    sampling_params: dict
    output_ids: list[list[int]]


@pytest.fixture(scope="session")
def engine_factory(cpu_runtime):
    """`engine_factory(model_path, **engine_overrides)`: context manager yielding a CPU `sglang.Engine`."""
    return sglang_engine


@pytest.fixture(scope="session")
def standalone_settings(tiny_pair):
    """Engine overrides for STANDALONE with the tiny draft (topk=1, 3 steps, 4 verify tokens)."""
    return standalone_kwargs(tiny_pair[1])


@pytest.fixture(scope="session")
def target_only_outputs(tiny_pair, cpu_runtime) -> ParityReference:
    """Target-only SGLang greedy outputs for PROMPTS (one engine for the whole session)."""
    params = {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 0.0}
    with sglang_engine(tiny_pair[0]) as engine:
        outputs = [out["output_ids"] for out in engine.generate(PROMPTS, params)]
    return ParityReference(list(PROMPTS), params, outputs)
