"""Does the draft's own confidence predict what a PARSE round keeps?

    python benchmarks/confidence.py [--pairs synthetic smollm2 qwen-gsm qwen-humaneval]
        [--num-steps 16] [--num-prompts 16] [--max-new-tokens 128] [--batch-size 8] [--json]

Each pair is served by one PARSE engine at a fixed L (`--num-steps`), greedy, every request
with `return_probe_scores`, whose per-round entries carry each draft token's confidence (the
draft's top-1 probability at that step, `draft_chain`) beside what the round kept. Lossless on
every pair; the synthetic pair is also served with its likelihood judge (λ = 0.05, its setting
in adaptive.py), as `synthetic-judged`. The Qwen pair runs in bf16.

Per pair, over the rounds' reached draft positions (a position is reached when every draft
token before it was kept; kept = the round kept it):
  positions, kept_share       how many were reached, and the share kept
  auc                         P(a kept position's confidence > an unkept one's): 0.5 = no signal
  calibration                 per confidence bucket [k/10, (k+1)/10): reached positions, share kept
And per round, three predictions of its accepted length a, each made before the round's
outcome is seen (replayed in round order, rounds of all requests interleaved as in a batch):
  survival   adaptive.py's per-request survival counts (what the controller uses today; it
             sees no confidence), E[a | L]
  product    Σ_j Π_{i≤j} c_i from the round's own raw confidences
  calibrated the same with each c mapped through `Calibration` (below) learned online from the
             rounds before
with each one's mean absolute error and Pearson correlation to the actual a (`mae_*`, `r_*`).
Nothing is timed: this is about prediction, not speed.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from parse_sglang.adaptive import KeepRate, PooledKeepRate  # noqa: E402

CONFIDENCE_BINS = 10  # buckets of the draft's top-1 probability, [k/10, (k+1)/10)
CONFIDENCE_DECAY = 0.995  # weight of the past per reached draft position


@dataclass
class Calibration:
    """P(a reached draft position is kept | the draft's confidence there): decayed counts per
    confidence bucket over every request's rounds, each bucket's prior its own midpoint (one
    position's worth). A position is reached when every draft token before it was kept."""

    reached: list = field(default_factory=lambda: [0.0] * CONFIDENCE_BINS)
    kept: list = field(default_factory=lambda: [0.0] * CONFIDENCE_BINS)

    @staticmethod
    def bin(confidence: float) -> int:
        return min(int(confidence * CONFIDENCE_BINS), CONFIDENCE_BINS - 1)

    def observe(self, confidence: torch.Tensor, drafted, accepted) -> None:
        """A round's requests at once: confidence [n, L] on the host, drafted and accepted [n]
        each; request i reached its first min(accepted + 1, drafted) positions and kept the first
        accepted. Each reached position, in request-then-position order, decays its bucket's
        counts by CONFIDENCE_DECAY and adds itself (the same as one position at a time: a
        position with r later ones in its bucket this round weighs CONFIDENCE_DECAY ** r)."""
        drafted, accepted = torch.as_tensor(drafted), torch.as_tensor(accepted)
        column = torch.arange(confidence.shape[1])
        reached = column < torch.minimum(accepted + 1, drafted)[:, None]  # [n, L]
        if not reached.any():
            return
        bins = (confidence[reached].double() * CONFIDENCE_BINS).long().clamp(0, CONFIDENCE_BINS - 1)  # [m]
        kept = (column < accepted[:, None])[reached].double()  # [m]
        seen = torch.nn.functional.one_hot(bins, CONFIDENCE_BINS).double()  # [m, bins]
        per_bin = seen.sum(dim=0)  # [bins]
        later = per_bin[bins] - seen.cumsum(dim=0).gather(1, bins[:, None]).squeeze(1)  # [m]
        weight = CONFIDENCE_DECAY**later
        fade = CONFIDENCE_DECAY**per_bin
        added = torch.zeros(CONFIDENCE_BINS, dtype=torch.float64).index_add_(0, bins, weight)
        added_kept = torch.zeros(CONFIDENCE_BINS, dtype=torch.float64).index_add_(0, bins, weight * kept)
        self.reached = (fade * torch.tensor(self.reached, dtype=torch.float64) + added).tolist()
        self.kept = (fade * torch.tensor(self.kept, dtype=torch.float64) + added_kept).tolist()

    def keep_rates(self) -> torch.Tensor:
        """[CONFIDENCE_BINS] each bucket's keep rate."""
        reached, kept = torch.tensor(self.reached), torch.tensor(self.kept)
        midpoints = (torch.arange(CONFIDENCE_BINS) + 0.5) / CONFIDENCE_BINS
        return (kept + midpoints) / (reached + 1.0)

    def keep_rate(self, confidence: float) -> float:
        return float(self.keep_rates()[self.bin(confidence)])

    def expected(self, confidence: torch.Tensor, budgets: Optional[Sequence[int]] = None) -> torch.Tensor:
        """[bs, L + 1] E[kept | length] for length = 0 .. L, confidence [bs, L] on the host: sums
        of the survival S(j), the product of the calibrated keep rates up to j, a request's
        positions past its budget (budgets [bs]) kept by none."""
        bins = (confidence.double() * CONFIDENCE_BINS).long().clamp(0, CONFIDENCE_BINS - 1)  # as `bin` does
        alive = self.keep_rates()[bins].cumprod(dim=1)  # [bs, L]
        if budgets is not None:
            alive = alive * (torch.arange(confidence.shape[1]) < torch.tensor(budgets)[:, None])
        return torch.nn.functional.pad(alive.cumsum(dim=1), (1, 0))


from parse_sglang.settings import ParseConfig, parse_engine_kwargs  # noqa: E402

HERE = Path(__file__).resolve().parent
PAIRS = ("synthetic", "synthetic-judged", "smollm2", "qwen-gsm", "qwen-humaneval")
JUDGED_LAMBDA = 0.05


def auc(scores: list[float], labels: list[bool]) -> float | None:
    """Mann-Whitney AUC (ties count half); None without both classes."""
    pos = sorted(s for s, y in zip(scores, labels) if y)
    neg = sorted(s for s, y in zip(scores, labels) if not y)
    if not pos or not neg:
        return None
    ranked = sorted([(s, 1) for s in pos] + [(s, 0) for s in neg])
    rank_sum, i = 0.0, 0
    while i < len(ranked):  # average ranks over ties
        j = i
        while j < len(ranked) and ranked[j][0] == ranked[i][0]:
            j += 1
        rank_sum += sum(y for _, y in ranked[i:j]) * (i + j + 1) / 2
        i = j
    return (rank_sum - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg))


def reached(rounds: list[dict]) -> tuple[list[float], list[bool]]:
    """(confidence, kept) of every reached draft position of `rounds`."""
    scores, labels = [], []
    for r in rounds:
        for j, c in enumerate(r["confidence"][: r["accepted"] + 1]):
            scores.append(c)
            labels.append(j < r["accepted"])
    return scores, labels


def calibration(scores: list[float], labels: list[bool]) -> list[list]:
    """[[bucket low, reached, share kept], ...] for every non-empty bucket."""
    counts = [[0, 0] for _ in range(CONFIDENCE_BINS)]
    for s, y in zip(scores, labels):
        counts[Calibration.bin(s)][0] += 1
        counts[Calibration.bin(s)][1] += y
    return [[b / CONFIDENCE_BINS, n, round(k / n, 3)] for b, (n, k) in enumerate(counts) if n]


def predictions(requests: list[list[dict]], longest: int) -> list[tuple[int, float, float, float]]:
    """(a, survival's, product's, calibrated's prediction) per round, each made before the
    round is observed; rounds replayed k-th of every request before any (k+1)-th."""
    pooled, calib = PooledKeepRate(longest=longest), Calibration()
    own = [KeepRate() for _ in requests]
    out = []
    for k in range(max(map(len, requests), default=0)):
        for i, rounds in enumerate(requests):
            if k >= len(rounds):
                continue
            r = rounds[k]
            drafted, conf = len(r["draft"]), r["confidence"]
            product, alive = 0.0, 1.0
            for c in conf:
                alive *= c
                product += alive
            calibrated = float(calib.expected(torch.tensor([conf], dtype=torch.float64))[0, -1]) if conf else 0.0
            out.append((r["accepted"], own[i].expected(drafted, pooled), product, calibrated))
            if drafted:
                own[i].observe(drafted, r["accepted"])
                pooled.observe(drafted, r["accepted"])
                calib.observe(torch.tensor([conf]), [drafted], [r["accepted"]])
    return out


def pearson(xs: list[float], ys: list[float]) -> float | None:
    if len(xs) < 2 or statistics.pstdev(xs) == 0 or statistics.pstdev(ys) == 0:
        return None
    return statistics.correlation(xs, ys)


def summarize(pair: str, requests: list[list[dict]], longest: int) -> dict:
    rounds = [r for rs in requests for r in rs if r["draft"]]
    scores, labels = reached(rounds)
    preds = predictions(requests, longest)
    actual = [p[0] for p in preds]
    row = {
        "pair": pair,
        "rounds": len(rounds),
        "positions": len(scores),
        "kept_share": round(sum(labels) / len(labels), 3) if labels else None,
        "auc": auc(scores, labels),
        "mean_accepted": statistics.mean(actual) if actual else None,
    }
    for k, name in enumerate(("survival", "product", "calibrated"), start=1):
        guess = [p[k] for p in preds]
        row[f"mae_{name}"] = statistics.mean(abs(g - a) for g, a in zip(guess, actual)) if preds else None
        row[f"r_{name}"] = pearson(guess, actual)
    row["calibration"] = calibration(scores, labels)
    return row


def workload(pair: str, num_prompts: int, cache_dir=None):
    """(target, draft, prompt ids, server ParseConfig fields, request settings, dtype)."""
    import semantic

    judged = {"judge": True, "judge_mode": "likelihood", "likelihood_threshold": JUDGED_LAMBDA}
    if pair.startswith("synthetic"):
        work = semantic.synthetic_workload(num_prompts, cache_dir)
        return (
            work.target,
            work.draft,
            work.prompt_ids,
            judged,
            ({} if pair.endswith("judged") else {"judge": False}),
            None,
        )
    if pair.startswith("qwen"):
        work = semantic.qwen_workload(pair.split("-", 1)[1], num_prompts, 0, "bfloat16", cache_dir)
        return work.target, work.draft, work.prompt_ids, {"judge": False}, {}, "bfloat16"
    from transformers import AutoTokenizer

    from parse_sglang import smollm2
    from parse_sglang.demo import chat_prompt_ids

    target, draft = smollm2.model_pair(cache_dir)
    chats = json.loads((HERE / "prompts_sharegpt.json").read_text())
    texts = [chats[i % len(chats)]["conversations"][0]["value"] for i in range(num_prompts)]
    return (
        str(target),
        str(draft),
        chat_prompt_ids(AutoTokenizer.from_pretrained(target), texts),
        {"judge": False},
        {},
        None,
    )


def serve(pair: str, args) -> list[list[dict]]:
    """Each request's `probe_scores` rounds from one PARSE engine."""
    import sglang
    import torch

    from parse_sglang.demo import engine_kwargs

    target, draft, prompts, server, request, dtype = workload(pair, args.num_prompts, args.cache_dir)
    kwargs = engine_kwargs(target, torch.cuda.is_available())
    kwargs.update(parse_engine_kwargs(draft, ParseConfig(draft_budget=args.num_steps, adaptive=False, **server)))
    kwargs["max_running_requests"] = args.batch_size
    if "max_total_tokens" in kwargs:
        kwargs["max_total_tokens"] = 32768
    if dtype:
        kwargs["dtype"] = dtype
    params = {
        "temperature": 0.0,
        "max_new_tokens": args.max_new_tokens,
        "custom_params": {"parse": {**request, "return_probe_scores": True}},
    }
    engine = sglang.Engine(**kwargs)
    try:
        outs = engine.generate(input_ids=prompts, sampling_params=params)
    finally:
        engine.shutdown()
    return [o["meta_info"]["parse"]["probe_scores"] for o in outs]


def fmt(value) -> str:
    return (
        "-" if value is None else f"{value:.3f}" if isinstance(value, float) and not math.isnan(value) else str(value)
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", nargs="+", choices=PAIRS, default=["synthetic", "synthetic-judged", "smollm2"])
    parser.add_argument("--num-steps", type=int, default=16, help="L of the PARSE engine")
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8, help="max_running_requests")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--json", action="store_true", help="one JSON object per pair")
    args = parser.parse_args(argv)
    for name, value in (
        ("--num-steps", args.num_steps),
        ("--num-prompts", args.num_prompts),
        ("--max-new-tokens", args.max_new_tokens),
        ("--batch-size", args.batch_size),
    ):
        if value < 1:
            parser.error(f"{name}={value} is invalid: allowed is an integer >= 1")
    sys.path.insert(0, str(HERE))
    keys = (
        "pair",
        "rounds",
        "positions",
        "kept_share",
        "auc",
        "mean_accepted",
        "mae_survival",
        "mae_product",
        "mae_calibrated",
        "r_survival",
        "r_product",
        "r_calibrated",
    )
    rows = []
    for pair in args.pairs:
        rows.append(summarize(pair, serve(pair, args), args.num_steps))
        if args.json:
            print(json.dumps(rows[-1]), flush=True)
    if not args.json:
        print("| " + " | ".join(keys) + " |\n|" + " --- |" * len(keys))
        for row in rows:
            print("| " + " | ".join(fmt(row[k]) for k in keys) + " |")
        for row in rows:
            print(
                f"calibration {row['pair']}: "
                + ", ".join(f"[{lo:.1f}: {n}, {k:.2f}]" for lo, n, k in row["calibration"])
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
