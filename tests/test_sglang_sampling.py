"""SGLang tier: sampled requests speculate, and PARSE's lossless mode keeps the target's
sampling distribution (real SGLang engines on CPU, its sampling verification run by the CPU
runtime's torch versions of the kernels).

The pair is the tiny one with a sharpened lm_head (`logit_scale`: a few likely tokens per
step, so output distributions can be estimated from a few thousand samples) and a draft far
from its target (50% weight noise: its proposal q differs visibly from the target's p, so an
acceptance rule that lets q through shows). For each of two sampling settings (temperature 1;
temperature 0.7 with top-p 0.9), SAMPLES short continuations of one prompt are drawn from
target-only decoding and from PARSE lossless with each verification rule (the target-only rule;
`--speculative-use-rejection-sampling`), and the empirical distributions of the first token
PARSE emits and of whole outputs are compared with a two-sample chi-square test of homogeneity
(categories seen fewer than MIN_COUNT times in both samples pooled). Bound: p >= ALPHA for every
comparison of a lossless rule (a false alarm rate of at most 8 * ALPHA = 0.08% over the eight).
Negative control, in the same test: PARSE with the judge made to accept every round's whole
draft (τ = 0) must be rejected by the same statistic, p < ALPHA.
"""

from __future__ import annotations

import collections
import math

import pytest
import torch

from conftest import BATCH_PROMPTS, hf_greedy, probe_config
from parse_sglang.settings import parse_engine_kwargs
from support.tiny_models import build_pair

pytestmark = pytest.mark.sglang

SAMPLES = 3000
MAX_NEW = 3  # the prefill's token, then PARSE's rounds
PROMPT = "The model is"
ALPHA = 1e-4
MIN_COUNT = 10
SETTINGS = {"T=1": {"temperature": 1.0}, "T=0.7, top-p 0.9": {"temperature": 0.7, "top_p": 0.9}}
# The server's judge is on, so sampled requests draft by sampling (draft_chain.py); lossless
# requests turn it off per request, the biased control sets τ = 0 (accept every whole draft).
SERVER = probe_config(draft_budget=4, probe_stride=2, threshold=0.5)
LOSSLESS, BIASED = {"judge": False}, {"threshold": 0.0}
RULES = ("target_only_rule", "rejection_rule")


def homogeneity(a: list, b: list) -> tuple[float, float]:
    """(p-value, total variation distance) of a two-sample chi-square test that the draws `a`
    and `b` come from one distribution; categories with fewer than MIN_COUNT draws in both
    samples together are pooled into one."""
    ca, cb = collections.Counter(a), collections.Counter(b)
    na, nb = len(a), len(b)
    kept = sorted((k for k in ca.keys() | cb.keys() if ca[k] + cb[k] >= MIN_COUNT), key=repr)
    cells = [(ca[k], cb[k]) for k in kept]
    rest = (na - sum(x for x, _ in cells), nb - sum(y for _, y in cells))
    if sum(rest):
        cells.append(rest)
    stat = sum((x * math.sqrt(nb / na) - y * math.sqrt(na / nb)) ** 2 / (x + y) for x, y in cells)
    dof = len(cells) - 1
    p_value = float(
        torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64))
    )
    tv = 0.5 * sum(abs(ca[k] / na - cb[k] / nb) for k in ca.keys() | cb.keys())
    return p_value, tv


def test_homogeneity_statistic():
    """The statistic on known distributions: equal ones pass, a 10-point shift of one
    category's mass is found at this sample size."""
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([0.4, 0.3, 0.2, 0.1])
    q = torch.tensor([0.3, 0.3, 0.2, 0.2])
    draw = lambda probs: torch.multinomial(probs, SAMPLES, replacement=True, generator=g).tolist()  # noqa: E731
    same, shifted = homogeneity(draw(p), draw(p)), homogeneity(draw(p), draw(q))
    assert same[0] > ALPHA and same[1] < 0.05
    assert shifted[0] < ALPHA and 0.05 < shifted[1] < 0.15


@pytest.fixture(scope="module")
def sharp_pair(tmp_path_factory):
    return build_pair(tmp_path_factory.mktemp("sharp_pair"), noise=0.5, logit_scale=6.0)


def draw(engine, sampling: dict, parse: dict | None = None, n: int = SAMPLES) -> list[tuple]:
    params = {**sampling, "max_new_tokens": MAX_NEW, "ignore_eos": True}
    if parse is not None:
        params["custom_params"] = {"parse": parse}
    return [tuple(out["output_ids"]) for out in engine.generate([PROMPT] * n, params)]


@pytest.fixture(scope="module")
def samples(sharp_pair, engine_factory):
    """{(source, setting): SAMPLES outputs}; sources: target-only, PARSE lossless under each
    rule, and the biased control; plus each PARSE engine's server totals."""
    target, draft = sharp_pair
    common = dict(max_running_requests=64, max_total_tokens=16384)
    out, totals = {}, {}
    with engine_factory(target, random_seed=1, **common) as engine:
        for name, sampling in SETTINGS.items():
            out["target_only", name] = draw(engine, sampling)
    for rule, extra in zip(RULES, ({}, {"speculative_use_rejection_sampling": True})):
        with engine_factory(target, random_seed=2, **common, **parse_engine_kwargs(draft, SERVER), **extra) as engine:
            for name, sampling in SETTINGS.items():
                out[rule, name] = draw(engine, sampling, LOSSLESS)
                if rule == "target_only_rule":
                    out["biased", name] = draw(engine, sampling, BIASED)
            totals[rule] = engine.get_server_info()["internal_states"][0]["parse"]
    return out, totals


@pytest.mark.parametrize("rule", RULES)
def test_lossless_sampling_keeps_the_target_distribution(samples, rule):
    """Both rules, both settings: the first token PARSE emits and whole outputs are
    distributed as target-only's (p >= ALPHA), and the rule accepted draft tokens; the biased
    control's whole outputs are not (p < ALPHA)."""
    out, totals = samples
    report = {}
    for name in SETTINGS:
        reference = out["target_only", name]
        for what, pick in (("first PARSE token", lambda o: o[1]), ("whole output", lambda o: o)):
            report[rule, name, what] = homogeneity([pick(o) for o in out[rule, name]], [pick(o) for o in reference])
            report["biased", name, what] = homogeneity(
                [pick(o) for o in out["biased", name]], [pick(o) for o in reference]
            )
    print("\n" + "\n".join(f"{key}: p={p:.3g}, TV={tv:.3f}" for key, (p, tv) in report.items()))
    for (source, name, what), (p_value, _) in report.items():
        if source == rule:
            assert p_value >= ALPHA, (source, name, what, p_value)
        elif what == "whole output":
            assert p_value < ALPHA, ("the biased control passed", name, p_value)
    assert totals[rule]["accepted_exact"] > 0


def test_judged_samples_of_one_prompt_differ(sharp_pair, engine_factory):
    """N = 32 samples of one prompt at temperature 1 with the judge on (τ = 0: it accepts every
    boundary, so every round's whole draft is the judge's): as many distinct
    outputs as target-only's N samples give, up to a third fewer, and among samples whose
    first token agrees, the first round's judged spans differ (a draft's argmax would give all
    of them one span: their contexts are equal)."""
    target, draft = sharp_pair
    n, max_new = 32, 8
    sampling = {"temperature": 1.0, "max_new_tokens": max_new, "ignore_eos": True}
    judged = {**sampling, "custom_params": {"parse": {"threshold": 0.0, "return_probe_scores": True}}}
    with engine_factory(target, random_seed=3, **parse_engine_kwargs(draft, SERVER)) as engine:
        outs = engine.generate([PROMPT] * n, judged)
        reference = engine.generate([PROMPT] * n, {**sampling, "custom_params": {"parse": LOSSLESS}})
    distinct, distinct_reference = (
        len({tuple(o["output_ids"]) for o in outs}),
        len({tuple(o["output_ids"]) for o in reference}),
    )
    assert distinct >= min(distinct_reference, n) * 2 / 3 and distinct > n // 2, (distinct, distinct_reference)
    spans = collections.defaultdict(list)
    for out in outs:
        first = out["meta_info"]["parse"]["probe_scores"][0]
        if first["accepted"] > first["exact"]:
            spans[out["output_ids"][0]].append(tuple(first["draft"][first["exact"] : first["accepted"]]))
    largest = max(spans.values(), key=len)
    assert len(largest) >= 4 and len(set(largest)) > 1, spans


def test_low_temperature_sampling_is_the_target_greedy(tiny_pair, engine_factory, hf_target):
    """Temperature 0.001 goes through the sampling path (not a greedy batch) and is greedy in
    effect: with each rule, PARSE's outputs equal the target's greedy continuation, and greedy
    requests in the same batch are unchanged (argmax drafts, greedy verification)."""
    tokenizer, model = hf_target
    prompts = BATCH_PROMPTS[:6]
    expected = [hf_greedy(model, tokenizer(p).input_ids, 16, ignore_eos=True) for p in prompts]
    cold = {"temperature": 0.001, "top_p": 0.95, "max_new_tokens": 16, "ignore_eos": True}
    greedy = {"temperature": 0.0, "max_new_tokens": 16, "ignore_eos": True}
    for extra in ({}, {"speculative_use_rejection_sampling": True}):
        with engine_factory(tiny_pair[0], **parse_engine_kwargs(tiny_pair[1], SERVER), **extra) as engine:
            lossless = {"custom_params": {"parse": LOSSLESS}}
            outs = engine.generate(
                prompts * 2, [{**cold, **lossless}] * len(prompts) + [{**greedy, **lossless}] * len(prompts)
            )
        assert [o["output_ids"] for o in outs] == expected * 2, extra
        assert sum(o["meta_info"]["parse"]["accepted_exact"] for o in outs[: len(prompts)]) > 0
