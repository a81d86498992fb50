"""Tier 2: the reference generator on tiny HF models — one masked forward == K separate
forwards, lossless mode == the target's greedy output, judged acceptance, bad input."""

import json
import random

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from support import reference
from conftest import probe_config
from support.reference import ParseGenerator, parallel_verify
from support.tiny_models import build_model, build_pair

PROMPTS = [
    "The model is correct. So we add",
    "def f(x):\n  return x",
    "One two three",
    "Finally the result equals the sum of",
    "Question: is the answer yes? Answer:",
    "A",
]


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def pair(request, tmp_path_factory):
    target_dir, draft_dir = build_pair(tmp_path_factory.mktemp(request.param), arch=request.param)
    tok = AutoTokenizer.from_pretrained(target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32).eval()
    return tok, target, draft, target_dir, draft_dir


def _last_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1]


def test_parallel_verify_equals_separate_forwards(pair):
    tok, target, _, _, _ = pair
    rng = random.Random(0)
    vocab = target.config.vocab_size
    for trial in range(4):
        context = [rng.randrange(vocab) for _ in range(rng.randint(1, 20))]
        length = rng.choice([1, rng.randint(2, 64), 64])
        draft = [rng.randrange(vocab) for _ in range(length)]
        bounds = sorted(rng.sample(range(1, length + 1), rng.randint(1, min(length, 6))))
        suffix = [rng.randrange(vocab) for _ in range(rng.randint(1, 8))]
        as_tensor = trial % 2 == 1  # lists and 1-D tensors both work
        args = [torch.tensor(x) if as_tensor else x for x in (context, draft, bounds, suffix)]
        with torch.no_grad():
            chain, probes = parallel_verify(target, *args)
        assert chain.shape == (length + 1, vocab) and probes.shape == (len(bounds), vocab)
        for j in range(length + 1):
            assert (chain[j] - _last_logits(target, context + draft[:j])).abs().max() <= 1e-4
        for k, b in enumerate(bounds):
            assert (probes[k] - _last_logits(target, context + draft[:b] + suffix)).abs().max() <= 1e-4


def _greedy(model, ids, n):
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)
    return out[0, len(ids) :].tolist()


def test_lossless_mode_equals_target_greedy(pair):
    tok, target, draft, _, _ = pair
    gen = ParseGenerator(target, draft, tok, probe_config(judge=False, draft_budget=6))
    for prompt in PROMPTS:
        ids = tok(prompt)["input_ids"]
        out, stats = gen.generate(ids, 40)
        assert out == _greedy(target, ids, 40), prompt
        assert stats.accepted_judged == 0 and stats.target_forwards == stats.rounds
        # each round emits its accepted tokens + 1, the last round possibly cut by max_new_tokens
        assert stats.generated == len(out) <= stats.rounds + stats.accepted_exact


def test_lossless_stops_at_eos_inside_an_accepted_draft(pair, tmp_path):
    tok, target, _, target_dir, _ = pair
    # A draft identical to the target accepts every draft token, so the EOS below is
    # emitted from inside an accepted draft (not as a bonus token).
    twin = AutoModelForCausalLM.from_pretrained(
        build_model(tmp_path / "twin", arch=target.config.model_type, noise_of=target_dir, noise=0.0)
    ).eval()
    ids = tok(PROMPTS[0])["input_ids"]
    free = _greedy(target, ids, 30)
    budget = 4
    pos = next(p for p in range(3, 30) if (p + 1) % (budget + 1) != 0 and free[p] not in free[:p])
    eos = free[pos]
    old = target.generation_config.eos_token_id
    target.generation_config.eos_token_id = eos
    try:
        out, stats = ParseGenerator(target, twin, tok, probe_config(judge=False, draft_budget=budget)).generate(ids, 30)
        assert out == _greedy(target, ids, 30) == free[: pos + 1]
        assert stats.rounds == pos // (budget + 1) + 1
    finally:
        target.generation_config.eos_token_id = old


def test_max_new_tokens_cuts_inside_a_round(pair):
    tok, target, draft, _, _ = pair
    ids = tok(PROMPTS[1])["input_ids"]
    for n in (1, 2, 7):
        out, _ = ParseGenerator(target, draft, tok, probe_config(judge=False, draft_budget=5)).generate(ids, n)
        assert out == _greedy(target, ids, n)


def test_judge_with_tau_zero_accepts_whole_drafts(pair):
    tok, target, draft, _, _ = pair
    ids = tok(PROMPTS[0])["input_ids"]
    out, stats = ParseGenerator(target, draft, tok, probe_config(threshold=0.0, draft_budget=8)).generate(ids, 40)
    assert len(out) == 40
    assert stats.rounds == 5  # every round keeps all 8 draft tokens + 1 bonus token
    assert stats.accepted_judged > 0 and stats.accepted_exact + stats.accepted_judged == 40 - stats.rounds


def test_target_to_delimiter_after_rejection_keeps_greedy_output(pair):
    tok, target, draft, _, _ = pair
    # tau = 1 rejects every judged prefix, so every token is the target's own greedy one.
    cfg = probe_config(threshold=1.0, draft_budget=6, probe_stride=2, after_rejection="target_to_delimiter")
    ids = tok(PROMPTS[2])["input_ids"]
    out, stats = ParseGenerator(target, draft, tok, cfg).generate(ids, 30)
    assert out == _greedy(target, ids, 30)
    assert stats.target_forwards > stats.rounds and stats.accepted_judged == 0


def test_bad_inputs_are_clear_errors(pair, tmp_path):
    tok, target, _, _, _ = pair
    with pytest.raises(ValueError, match="draft"):
        parallel_verify(target, [1, 2], [], [1], [3])
    with pytest.raises(ValueError, match="boundaries"):
        parallel_verify(target, [1, 2], [4, 5, 6], [0, 3], [3])
    with pytest.raises(ValueError, match="boundaries"):
        parallel_verify(target, [1, 2], [4, 5, 6], [2, 4], [3])
    with pytest.raises(ValueError, match="boundaries"):
        parallel_verify(target, [1, 2], [4, 5, 6], [2, 2], [3])
    with pytest.raises(ValueError, match="suffix"):
        parallel_verify(target, [1, 2], [4, 5, 6], [2, 3], [])
    with pytest.raises(ValueError, match="context_ids is empty"):
        parallel_verify(target, [], [4], [1], [3])
    other = AutoModelForCausalLM.from_pretrained(build_model(tmp_path / "v", vocab_size=300)).eval()
    with pytest.raises(ValueError, match="draft vocabulary size .* differs from target vocabulary size"):
        ParseGenerator(target, other, tok)


def test_cli_json_lossless_matches_greedy_and_refuses_bad_threshold(pair, capsys):
    tok, target, _, target_dir, draft_dir = pair
    prompt = PROMPTS[3]
    argv = ["--target", str(target_dir), "--draft", str(draft_dir), "--prompt", prompt, "--max-new-tokens", "12"]
    assert reference.main(argv + ["--lossless", "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["token_ids"] == _greedy(target, tok(prompt)["input_ids"], 12)
    assert result["text"] == tok.decode(result["token_ids"], skip_special_tokens=True)
    assert result["stats"]["generated"] == 12 and result["stats"]["accepted_judged"] == 0
    assert reference.main(argv + ["--threshold", "1.5"]) == 2
    assert "threshold=1.5 is invalid: allowed is a number in [0, 1]" in capsys.readouterr().err
