"""Every judge mode's acceptance against a brute-force reference on random tensors (one request,
one token at a time, in plain Python), and the judge head's file: written, read back, refused when
damaged or made for another target."""

import json
import math
import random
from pathlib import Path

import pytest
import torch

from parse_sglang import judge, judge_head
from parse_sglang.settings import ParseConfig
from parse_sglang.tools import judge_head as head_tools
from parse_sglang.acceptance import accept_lengths

MODES = {"probe": (True, 0), "likelihood": (False, 1), "both": (True, 1), "divergence": (False, 2), "head": (False, 3)}


def brute_force(logits, draft, n, mode, threshold, window, tau, bounds, probe_scores, harm, judged=True):
    """(a, exact) for one request by the module doc's rule, token by token."""
    probs = [torch.softmax(row.double(), -1).tolist() for row in logits]
    top = [max(range(len(p)), key=p.__getitem__) for p in probs]
    entropy = [-sum(q * math.log(q) for q in p if q > 0) for p in probs]
    probed, token_mode = MODES[mode]
    reach = 0
    for b, score in zip(bounds, probe_scores):
        if score < tau:
            break
        reach = b
    match = [draft[j] == top[j] for j in range(n)]

    def token_ok(j):
        if token_mode == 1:
            return probs[j][draft[j]] >= threshold
        if token_mode == 2:
            return entropy[j] >= threshold and j + window < n and all(match[j + 1 : j + window + 1])
        if token_mode == 3:
            return harm[j] <= threshold
        return True

    kept = 0
    while kept < n and (match[kept] or (judged and (not probed or kept < reach) and token_ok(kept))):
        kept += 1
    exact = 0
    while exact < n and match[exact]:
        exact += 1
    return kept, exact


def batched(logits, drafts, lens, modes, thresholds, windows, taus, bounds, scores, harm, judged):
    stats = judge.chain_statistics(logits, drafts)
    matches = drafts == stats.top_tokens[:, :-1]
    reach = judge.probe_reach(scores, taus, bounds)
    token_modes = torch.tensor([MODES[m][1] for m in modes])
    ok, _ = judge.token_passes(stats, matches, lens, token_modes, thresholds, windows, harm)
    probed = torch.tensor([MODES[m][0] for m in modes])
    passed = judge.judged_tokens(drafts.shape[1], judged, probed, reach, ok)
    return accept_lengths(drafts, lens, stats.top_tokens, passed)


def test_every_judge_mode_equals_the_brute_force_rule(monkeypatch):
    """Random logits made peaked so that drafts drawn near the target's top tokens give runs of
    matches, mismatches and every judge's both answers; chunks of 3 rows exercise the bounded read."""
    monkeypatch.setattr(judge, "_LOGSUMEXP_ELEMENTS", 3 * 13)
    judged_sum = rejected = 0
    for seed in range(12):
        got, lens = _one_batch(seed)
        judged_sum += int(got.judged.sum())
        rejected += int((got.accepted < lens).sum())
    assert judged_sum > 10 and rejected > 10  # the judges accept mismatches, and refuse some (not vacuous)


def _one_batch(seed: int):
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    batch, length, vocab = 10, 9, 13
    logits = torch.randn(batch, length + 1, vocab, generator=gen) * torch.rand(batch, length + 1, 1, generator=gen) * 4
    top = logits.argmax(-1)
    drafts = torch.where(
        torch.rand(batch, length, generator=gen) < 0.7,
        top[:, :-1],
        torch.randint(0, vocab, (batch, length), generator=gen),
    )
    lens = torch.tensor([rng.randint(1, length) for _ in range(batch)])
    modes = [rng.choice(list(MODES)) for _ in range(batch)]
    thresholds = torch.tensor(
        [rng.choice([0.05, 0.3, 0.6]) if m != "divergence" else rng.choice([0.2, 0.8, 1.5]) for m in modes],
        dtype=torch.float32,
    )
    windows = torch.tensor([rng.randint(1, 3) for _ in range(batch)])
    taus = torch.tensor([rng.choice([0.3, 0.6]) for _ in range(batch)])
    bounds_py = [sorted(rng.sample(range(1, n + 1), rng.randint(1, n)) if n else []) for n in lens.tolist()]
    bounds = torch.tensor([b + [0] * (length - len(b)) for b in bounds_py])
    scores = torch.rand(batch, length, generator=gen)
    harm = torch.rand(batch, length, generator=gen)
    judged = torch.tensor([rng.random() < 0.85 for _ in range(batch)])
    got = batched(logits, drafts, lens, modes, thresholds, windows, taus, bounds, scores, harm, judged)
    for i in range(batch):
        n = int(lens[i])
        want = brute_force(
            logits[i],
            drafts[i].tolist(),
            n,
            modes[i],
            float(thresholds[i]),
            int(windows[i]),
            float(taus[i]),
            bounds_py[i],
            scores[i].tolist(),
            harm[i].tolist(),
            bool(judged[i]),
        )
        assert (int(got.accepted[i]), int(got.exact[i])) == want, (seed, i, modes[i])
    return got, lens


def test_chain_statistics_equal_the_full_softmax(monkeypatch):
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 5, 11, generator=gen) * 3
    drafts = torch.randint(0, 11, (2, 4), generator=gen)
    probs = logits.softmax(-1)
    for chunk in (1 << 24, 22):  # one read, and two rows at a time
        monkeypatch.setattr(judge, "_LOGSUMEXP_ELEMENTS", chunk)
        stats = judge.chain_statistics(logits, drafts)
        assert stats.top_tokens.tolist() == logits.argmax(-1).tolist()
        assert torch.allclose(stats.draft_probs, probs[:, :-1].gather(-1, drafts[..., None]).squeeze(-1), atol=1e-6)
        assert torch.allclose(stats.top_probs, probs[:, :-1].max(-1).values, atol=1e-6)
        assert torch.allclose(stats.entropy, -(probs * probs.log()).sum(-1)[:, :-1], atol=1e-5)


def test_divergence_needs_the_next_w_tokens_to_match_and_room_for_them():
    """FLy's window: d_2 mismatches at high entropy; it passes only when d_3..d_{2+W} match and lie
    inside the draft (no relaxing in the last W positions), never at low entropy."""
    matches = torch.tensor([[True, False, True, True, False, True]])
    entropy = torch.tensor([[2.0, 2.0, 2.0, 2.0, 2.0, 0.1]])
    lens = torch.tensor([6])
    for window, want in (
        (1, [False, True, True, False, True, False]),
        (2, [False, True, False, False, False, False]),
        (3, [False, False, False, False, False, False]),
    ):
        got = judge.divergence_passes(matches, entropy, torch.tensor([1.0]), torch.tensor([window]), lens)
        assert got[0].tolist() == want, window
    low = judge.divergence_passes(matches, entropy, torch.tensor([5.0]), torch.tensor([1]), lens)
    assert not low.any()


# ----- the head's file ------------------------------------------------------------------------

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "vocab_size": 32,
    "intermediate_size": 8,
}


def _head(config=CONFIG) -> judge_head.JudgeHead:
    identity = judge_head.TargetIdentity.of_config(config)
    return judge_head.JudgeHead(
        identity,
        torch.tensor([0.5, -1.0, 0.0, 2.0, 0.25, -0.5]),
        0.1,
        [{"threshold": 0.2, "accepted": 0.5, "false_accept": 0.1, "harmful_accepted": 0.05}],
        {"mined": ["test"]},
    )


def test_head_file_round_trips_and_scores_with_its_features(tmp_path):
    path = tmp_path / "head.json"
    _head().save(str(path))
    head = judge_head.load(str(path), CONFIG)
    want = _head()
    assert torch.equal(head.weights, want.weights)
    assert (head.target, head.bias, head.calibration) == (want.target, want.bias, want.calibration)
    assert "threshold" not in json.loads(path.read_text())  # the bound is the server's head_threshold
    hidden, lp, lt = torch.tensor([[1.0, 2.0, 3.0, 4.0]]), torch.tensor([math.log(0.5)]), torch.tensor([0.0])
    z = 0.5 * 1 - 1.0 * 2 + 0 + 2.0 * 4 + 0.25 * math.log(0.5) - 0.5 * 0 + 0.1
    assert head.harm(hidden, lp, lt).item() == pytest.approx(1 / (1 + math.exp(-z)), rel=1e-6)


def test_damaged_or_foreign_heads_are_refused_by_name(tmp_path):
    path = tmp_path / "head.json"
    _head().save(str(path))
    raw = json.loads(path.read_text())
    raw["bias"] = 3.0  # one number changed: the sha256 no longer matches
    damaged = tmp_path / "damaged.json"
    damaged.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=r"judge_head='.*damaged.json' is invalid: the file is damaged"):
        judge_head.load(str(damaged))
    cut = tmp_path / "cut.json"
    cut.write_text(path.read_text()[:100])
    with pytest.raises(ValueError, match=r"judge_head='.*cut.json' is invalid: the file cannot be read"):
        judge_head.load(str(cut))
    other = {**CONFIG, "hidden_size": 8}
    with pytest.raises(
        ValueError, match=r"judge_head='.*head.json' is invalid: it was made for .* the server's target is"
    ):
        judge_head.load(str(path), other)
    with pytest.raises(ValueError, match=r"judge_head='.*missing.json' is invalid"):
        judge_head.load(str(tmp_path / "missing.json"))


def test_shipped_head_loads_and_accepts_nothing_at_the_default_bound():
    """benchmarks/judge_heads/ (docs/judge.md): its held-out calibration at the server's default
    head_threshold accepts no mismatch, so a server with it and no head_threshold is lossless."""
    path = Path(__file__).resolve().parents[1] / "benchmarks/judge_heads/qwen2.5-coder-1.5b-instruct-gsm.json"
    head = judge_head.load(str(path))
    at_default = next(c for c in head.calibration if c["threshold"] == ParseConfig.head_threshold)
    assert at_default["accepted"] == 0.0 and head.target.hidden_size == 1536
    assert "upper estimate" in head.recipe["split"]  # its split was by problem, not by GSM template


def test_split_holds_out_whole_groups():
    """Rows of one group (a GSM template) never land on both sides, though its problems differ."""
    rows = [{"problem": i, "group": f"template {i % 5}"} for i in range(40)]
    train, held = head_tools.split_by_group(rows, holdout=0.25, seed=3)
    assert {r["group"] for r in train}.isdisjoint({r["group"] for r in held})
    assert len(train) + len(held) == 40 and len({r["group"] for r in held}) == 1  # round(0.25 * 5) groups


def test_training_separates_a_planted_signal_and_calibrates_on_held_out_problems(tmp_path):
    """Mismatches whose harm is a planted function of the hidden state: the head learns it (held-out
    AUC > 0.9); labels shuffled (a negative control) give AUC near 0.5 (bound: |AUC - 0.5| < 0.15
    at 400 held-out-sized samples)."""
    gen = torch.Generator().manual_seed(0)
    identity = judge_head.TargetIdentity.of_config(CONFIG)

    def shard(shuffle: bool) -> str:
        hidden = torch.randn(800, 4, generator=gen)
        harmful = (hidden[:, 0] + 0.5 * hidden[:, 1] > 0.3).int().tolist()
        if shuffle:
            random.Random(1).shuffle(harmful)
        rows = [
            {
                "problem": i // 4,
                "group": i // 4,
                "harmful": h,
                "hidden": judge_head.to_base64(x),
                "logp_draft": -1.0,
                "logp_top": -0.1,
            }
            for i, (x, h) in enumerate(zip(hidden, harmful))
        ]
        path = tmp_path / f"shard-{shuffle}.json"
        path.write_text(json.dumps({"target": identity.__dict__, "command": "test", "rows": rows}))
        return str(path)

    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    head, report = head_tools.train([shard(False)], str(tmp_path), log=lambda _: None)
    assert report["held_out_auc"] > 0.9 and report["bound"] is not None and len(head.calibration) == 8
    _, control = head_tools.train([shard(True)], str(tmp_path), log=lambda _: None)
    assert abs(control["held_out_auc"] - 0.5) < 0.15


def test_labels_outcome_or_correctness():
    rows = [
        {"harmful": 1, "correct_before": False, "correct_after": False},  # another wrong answer: costs nothing
        {"harmful": 1, "correct_before": True, "correct_after": False},
        {"harmful": 0, "correct_before": True, "correct_after": True},
    ]
    assert head_tools.labelled(rows, "outcome") == rows
    assert [r["harmful"] for r in head_tools.labelled(rows, "correctness")] == [1, 0]
    with pytest.raises(ValueError, match=r"label='vote' is invalid: allowed is one of \('outcome', 'correctness'\)"):
        head_tools.labelled(rows, "vote")
    with pytest.raises(ValueError, match="needs mined rows with correct_before"):
        head_tools.labelled([{"harmful": 1}], "correctness")
