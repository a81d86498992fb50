"""The judge head (`judge_mode: "head"`): a logistic regression on the target's own hidden state at
a draft token that differs from the target's, P(harmful) from features the verify pass already
computes, and the commands that train it (AutoJudge, arXiv 2504.20039, mined with SGLang engines).

    python -m parse_sglang.judge_head mine --suite gsm|humaneval|synthetic --first K --count N --out SHARD.json
    python -m parse_sglang.judge_head train SHARD.json ... --target DIR --out HEAD.json
    python -m parse_sglang.judge_head eval HEAD.json SHARD.json ...

Features of draft token d_j (`features`): the target's final hidden state at chain row j (the row
that read d_j), log P_target(d_j) and log P_target(its own top token) at row j-1. Mining labels a
mismatch between the target's greedy answer y and the draft's proposal q at output position k: put
q in place of y_k, let the target finish greedily, and call it harmful iff the graded outcome
changes (GSM and synthetic: the final answer; code: whether the tests pass). `mine` runs from a
checkout (its problem sets are support/problems.py and support/synthetic.py).

The head file (JSON) carries its weights (standardisation folded in), the target it was made for
(`TargetIdentity`), its calibration on held-out mismatches, its recipe and a sha256 of the rest:
a server refuses a head for another target or a damaged file at start-up (`load`).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional, Sequence

import torch

FORMAT = "parse-sglang-judge-head/1"
LAYER = "final"  # the hidden state SGLang's logits processor hands to the lm_head (after the last norm)
EXTRA_FEATURES = ("logp_draft", "logp_top")  # after the hidden state
IDENTITY_KEYS = ("architectures", "hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
                 "intermediate_size")  # fmt: skip
GSM_MINING_SEED = 1_000_000  # GSM-symbolic seeds no benchmark scores (scored sets: support.problems.GSM_SEED + index)
SYNTHETIC_MINING_SEED = 30_000  # synthetic problems no test scores (support.synthetic.TEST_SEED is 10,000)
SETTING = "judge_head"


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.to(torch.float32).contiguous().numpy().tobytes()).decode()


def _unb64(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.float32).clone()


@dataclass(frozen=True)
class TargetIdentity:
    """What a head is bound to: the target's architecture, hidden size, the layer read and a hash of
    its config's shape fields (dtype and paths excluded: a bf16 and an fp32 copy share a head)."""

    architecture: str
    hidden_size: int
    layer: str
    config_hash: str

    @classmethod
    def of_config(cls, config) -> "TargetIdentity":
        """From a transformers config (SGLang's `model_config.hf_config`) or its dict."""
        values = config if isinstance(config, dict) else config.to_dict()
        shape = {k: values.get(k) for k in IDENTITY_KEYS}
        digest = hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:16]
        return cls(str((values.get("architectures") or ["?"])[0]), int(values["hidden_size"]), LAYER, digest)

    @classmethod
    def of_checkpoint(cls, path: str) -> "TargetIdentity":
        return cls.of_config(json.loads((Path(path) / "config.json").read_text()))


@dataclass(frozen=True, eq=False)
class JudgeHead:
    target: TargetIdentity
    weights: torch.Tensor  # [hidden_size + len(EXTRA_FEATURES)] fp32, standardisation folded in
    bias: float
    threshold: float  # the calibrated default P(harmful) bound (a request's head_threshold overrides)
    calibration: list  # [{threshold, accepted, false_accept, harmful_accepted}] on held-out mismatches
    recipe: dict  # the commands, data sizes and costs that made it

    def harm(self, hidden: torch.Tensor, logp_draft: torch.Tensor, logp_top: torch.Tensor) -> torch.Tensor:
        """P(harmful) [...] from hidden [..., H] and log-probabilities [...] (host or device)."""
        return torch.sigmoid(features(hidden, logp_draft, logp_top) @ self.weights.to(hidden.device) + self.bias)

    def to_json(self) -> dict:
        body = {
            "format": FORMAT,
            "target": asdict(self.target),
            "features": ["hidden", *EXTRA_FEATURES],
            "weights": _b64(self.weights),
            "bias": self.bias,
            "threshold": self.threshold,
            "calibration": self.calibration,
            "recipe": self.recipe,
        }
        return {**body, "sha256": _digest(body)}

    def save(self, path: str) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")


def _digest(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def features(hidden: torch.Tensor, logp_draft: torch.Tensor, logp_top: torch.Tensor) -> torch.Tensor:
    """[..., H + 2] fp32: the hidden state, then log P(d_j) and log P(top) (clamped at -30)."""
    extra = torch.stack([logp_draft.float().clamp(min=-30.0), logp_top.float().clamp(min=-30.0)], dim=-1)
    return torch.cat([hidden.float(), extra], dim=-1)


def load(path: str, target_config=None) -> JudgeHead:
    """The head in `path`, checked whole (format, sha256, weights' size) and, given the serving
    target's config, against it; any defect is a ValueError naming the setting, the file and what
    is wrong."""
    where = f"{SETTING}={path!r}"
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{where} is invalid: the file cannot be read as a judge head ({e})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        got = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
        raise ValueError(f"{where} is invalid: format is {got!r}, allowed is {FORMAT!r}")
    body = {k: v for k, v in raw.items() if k != "sha256"}
    if raw.get("sha256") != _digest(body):
        raise ValueError(f"{where} is invalid: the file is damaged (its sha256 does not match its contents)")
    try:
        head = JudgeHead(TargetIdentity(**raw["target"]), _unb64(raw["weights"]), float(raw["bias"]),
                         float(raw["threshold"]), list(raw["calibration"]), dict(raw["recipe"]))  # fmt: skip
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{where} is invalid: a field is missing or malformed ({e})") from None
    if head.weights.numel() != head.target.hidden_size + len(EXTRA_FEATURES):
        raise ValueError(
            f"{where} is invalid: {head.weights.numel()} weights for hidden size {head.target.hidden_size}"
        )
    if target_config is not None:
        serving = TargetIdentity.of_config(target_config)
        if serving != head.target:
            raise ValueError(
                f"{where} is invalid: it was made for {asdict(head.target)}, but the server's target is "
                f"{asdict(serving)}; allowed is a head trained on this target (python -m parse_sglang.judge_head)"
            )
    return head


# ----- training -------------------------------------------------------------------------------


def read_shards(paths: Sequence[str]) -> dict:
    """Merged mined mismatches: {"target", "rows": [...]} (every shard must share the target)."""
    rows, target, recipes = [], None, []
    for path in paths:
        shard = json.loads(Path(path).read_text())
        if target is not None and shard["target"] != target:
            raise ValueError(f"{path}: mined on target {shard['target']}, the others on {target}")
        target = shard["target"]
        rows += shard["rows"]
        recipes.append(shard["command"])
    if not rows:
        raise ValueError(f"no mined mismatches in {list(paths)}")
    return {"target": target, "rows": rows, "commands": recipes}


def _matrix(rows: list) -> tuple[torch.Tensor, torch.Tensor]:
    x = features(torch.stack([_unb64(r["hidden"]) for r in rows]),
                 torch.tensor([r["logp_draft"] for r in rows]), torch.tensor([r["logp_top"] for r in rows]))  # fmt: skip
    return x, torch.tensor([float(r["harmful"]) for r in rows])


def split_by_problem(rows: list, holdout: float = 0.25, seed: int = 0) -> tuple[list, list]:
    """(train, held out): whole problems on one side, never one problem's mismatches on both."""
    problems = sorted({(r["suite"], r["problem"]) for r in rows})
    random.Random(seed).shuffle(problems)
    held = set(problems[: max(1, round(holdout * len(problems)))])
    return [r for r in rows if (r["suite"], r["problem"]) not in held], [
        r for r in rows if (r["suite"], r["problem"]) in held
    ]


def fit(x: torch.Tensor, y: torch.Tensor, l2: float) -> tuple[torch.Tensor, float]:
    """L2-regularised logistic regression on standardised x; returns (weights, bias) on raw x."""
    mean, std = x.mean(0), x.std(0).clamp(min=1e-6)
    z = (x - mean) / std
    w = torch.zeros(x.shape[1], requires_grad=True)
    b = torch.zeros(1, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=200, line_search_fn="strong_wolfe")

    def loss():
        opt.zero_grad()
        value = torch.nn.functional.binary_cross_entropy_with_logits(z @ w + b, y) + l2 * (w * w).sum()
        value.backward()
        return value

    opt.step(loss)
    w = w.detach() / std
    return w, float(b.detach() - (w * mean).sum())


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """ROC AUC (Mann-Whitney, ties half): P(score of a harmful > score of a harmless)."""
    pos, neg = scores[labels > 0.5], scores[labels <= 0.5]
    if not len(pos) or not len(neg):
        return float("nan")
    greater = (pos[:, None] > neg[None, :]).float().sum() + 0.5 * (pos[:, None] == neg[None, :]).float().sum()
    return float(greater / (len(pos) * len(neg)))


THRESHOLDS = (0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5)


def calibration(harm: torch.Tensor, labels: torch.Tensor) -> list:
    """Per threshold τ (accept where P(harmful) <= τ): the share of mismatches accepted, the share of
    harmful ones accepted (false accepts) and the harmful share among those accepted."""
    out = []
    for tau in THRESHOLDS:
        ok = harm <= tau
        harmful = labels > 0.5
        out.append({
            "threshold": tau,
            "accepted": round(float(ok.float().mean()), 4),
            "false_accept": round(float((ok & harmful).sum() / max(int(harmful.sum()), 1)), 4),
            "harmful_accepted": round(float((ok & harmful).sum() / max(int(ok.sum()), 1)), 4),
        })  # fmt: skip
    return out


LABELS = ("outcome", "correctness")


def labelled(rows: list, label: str) -> list:
    """The rows a head learns from: "outcome", every mismatch, harmful where the graded outcome
    changed; "correctness", the mismatches of answers that were right, harmful where the answer
    became wrong (what costs accuracy: a wrong answer's changes cost nothing)."""
    if label == "outcome":
        return rows
    if label != "correctness":
        raise ValueError(f"label={label!r} is invalid: allowed is one of {LABELS}")
    kept = [dict(r, harmful=int(not r["correct_after"])) for r in rows if r.get("correct_before")]
    if not kept:
        raise ValueError("label='correctness' needs mined rows with correct_before true (mined by this version)")
    return kept


def train(paths: Sequence[str], target_dir: str, max_harmful_accepted: float = 0.05, seed: int = 0,
          label: str = "outcome", log=print) -> tuple[JudgeHead, dict]:  # fmt: skip
    """Fit on the train problems (L2 chosen on a split of them by AUC), calibrate on the held-out
    problems; the default threshold is the largest whose held-out harmful share among accepted
    mismatches is at most `max_harmful_accepted`. Returns (head, report)."""
    mined = read_shards(paths)
    mined["rows"] = labelled(mined["rows"], label)
    identity = TargetIdentity.of_checkpoint(target_dir)
    if mined["target"] != asdict(identity):
        raise ValueError(f"the shards were mined on {mined['target']}, --target is {asdict(identity)}")
    fit_rows, held = split_by_problem(mined["rows"], seed=seed)
    inner, dev = split_by_problem(fit_rows, seed=seed + 1)
    x_in, y_in = _matrix(inner)
    x_dev, y_dev = _matrix(dev)
    scored = {}
    for l2 in (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0):
        w, b = fit(x_in, y_in, l2)
        scored[l2] = auc(x_dev @ w + b, y_dev)
    l2 = max(scored, key=lambda k: (scored[k] if scored[k] == scored[k] else -1, k))
    w, b = fit(*_matrix(fit_rows), l2)
    x_held, y_held = _matrix(held)
    harm = torch.sigmoid(x_held @ w + b)
    table = calibration(harm, y_held)
    safe = [c["threshold"] for c in table if c["harmful_accepted"] <= max_harmful_accepted and c["accepted"] > 0]
    report = {
        "label": label,
        "mismatches": len(mined["rows"]),
        "harmful_share": round(sum(r["harmful"] for r in mined["rows"]) / len(mined["rows"]), 4),
        "train": len(fit_rows),
        "held_out": len(held),
        "l2": l2,
        "dev_auc": {str(k): _rounded(v) for k, v in scored.items()},
        "held_out_auc": _rounded(auc(harm, y_held)),
    }
    recipe = {"mined": mined["commands"], **report,
              "train": f"python -m parse_sglang.judge_head train ... --label {label} "
                       f"--max-harmful-accepted {max_harmful_accepted}"}  # fmt: skip
    head = JudgeHead(identity, w, b, max(safe) if safe else 0.0, table, recipe)
    log(json.dumps(report))
    return head, report


def _rounded(value: float):
    """`value` to 4 places, None where it is undefined (NaN: a split with one class only)."""
    return None if value != value else round(value, 4)


def evaluate(head: JudgeHead, paths: Sequence[str], label: str = "outcome") -> dict:
    """ROC AUC and the calibration table of `head` on the mismatches in `paths` (`labelled`)."""
    x, y = _matrix(labelled(read_shards(paths)["rows"], label))
    harm = torch.sigmoid(x @ head.weights + head.bias)
    return {"mismatches": len(y), "harmful_share": round(float(y.mean()), 4), "auc": _rounded(auc(harm, y)),
            "calibration": calibration(harm, y)}  # fmt: skip


# ----- mining ---------------------------------------------------------------------------------


@dataclass
class Suite:
    """Problems to mine on: prompt ids, outcome(i, text), the graded result a label compares, and
    correct(i, text), whether that result is right (recorded beside the label)."""

    target: str
    draft: str
    dtype: str
    prompts: list
    outcome: object  # (problem index, output text) -> hashable
    correct: object  # (problem index, output text) -> bool


def load_suite(name: str, first: int, count: int, dtype: str, cache_dir=None) -> Suite:
    sys.path.insert(0, str(Path.cwd()))  # the checkout's `support` package
    try:
        from support import problems as problem_sets
        from support import synthetic
    except ImportError as e:
        raise SystemExit(f"judge_head mine runs from a parse-sglang checkout (support/ not found: {e})") from None
    from transformers import AutoTokenizer

    from parse_sglang import models
    from parse_sglang.demo import chat_prompt_ids

    if name == "synthetic":
        target, draft = synthetic.build(cache_dir, log=lambda line: print(line, file=sys.stderr, flush=True))
        items = synthetic.problems(SYNTHETIC_MINING_SEED, first + count)[first:]
        enc = synthetic.Encoder(AutoTokenizer.from_pretrained(target))
        return Suite(str(target), str(draft), "float32", [enc.prompt_ids(p) for p in items],
                     lambda i, text: synthetic.final_answer(text), lambda i, text: synthetic.grade(items[i], text))  # fmt: skip
    target, draft = models.pair_checkpoints("qwen2.5-coder", dtype, cache_dir)
    tok = AutoTokenizer.from_pretrained(target)
    if name == "gsm":
        math_items = problem_sets.gsm(first, count, cache_dir, seed=GSM_MINING_SEED)
        return Suite(str(target), str(draft), dtype, chat_prompt_ids(tok, [p.question for p in math_items]),
                     lambda i, text: problem_sets.final_number(text), lambda i, text: math_items[i].passes(text))  # fmt: skip
    code = problem_sets.humaneval(first, count, cache_dir)
    passes = lambda i, text: problem_sets.passes(code[i], text)  # noqa: E731
    return Suite(str(target), str(draft), dtype, chat_prompt_ids(tok, [p.question() for p in code]), passes, passes)


def engine(model: str, dtype: str, batch: int, context: int, hidden: bool = False):
    import sglang
    from sglang_cpu import engine_settings

    return sglang.Engine(**{**engine_settings(), "model_path": model, "dtype": dtype, "log_level": "error",
                            "max_running_requests": batch, "context_length": context, "mem_fraction_static": 0.5,
                            "max_total_tokens": max(8192, batch * context), "enable_return_hidden_states": hidden})  # fmt: skip


def teacher_top1(eng, prompts: list, outputs: list) -> tuple[list, float]:
    """Per request, the model's top-1 token and its probability at each output position given the
    text before it (teacher forcing, one prefill each); and the seconds per token of these prefills."""
    got, tokens, start = [], 0, time.perf_counter()
    for prompt, output in zip(prompts, outputs):
        meta = eng.generate(input_ids=prompt + output, sampling_params={"max_new_tokens": 1, "temperature": 0},
                            return_logprob=True, logprob_start_len=len(prompt) - 1, top_logprobs_num=1)["meta_info"]  # fmt: skip
        tops = meta["input_top_logprobs"][1 : len(output) + 1]  # [0] is the prompt's last token's own
        got.append(([t[0][1] for t in tops], [math.exp(t[0][0]) for t in tops]))
        tokens += len(prompt) + len(output)
    return got, (time.perf_counter() - start) / max(tokens, 1)


class Progress:
    """`done/total`, elapsed and ETA lines on stderr."""

    def __init__(self, what: str, total: int):
        self.what, self.total, self.start = what, total, time.perf_counter()

    def __call__(self, done: int) -> None:
        spent = time.perf_counter() - self.start
        eta = spent / done * (self.total - done) if done else float("nan")
        print(f"{self.what}: {done}/{self.total}, {spent:.0f} s, ETA {eta:.0f} s", file=sys.stderr, flush=True)


def mine(suite_name: str, first: int, count: int, out: str, max_new_tokens: int = 256, per_problem: int = 8,
         batch: int = 16, dtype: str = "bfloat16", seed: int = 0, cache_dir=None) -> dict:  # fmt: skip
    """Label up to `per_problem` mismatches per problem (module doc); resumable: an existing `out`
    is kept as it is."""
    if Path(out).exists():
        print(f"{out} exists: kept (delete it to mine again)", file=sys.stderr)
        return json.loads(Path(out).read_text())
    suite = load_suite(suite_name, first, count, dtype, cache_dir)
    context = -(-(max(map(len, suite.prompts)) + max_new_tokens + 64) // 256) * 256
    greedy = {"max_new_tokens": max_new_tokens, "temperature": 0}
    start = time.perf_counter()
    eng = engine(suite.target, suite.dtype, batch, context)
    try:
        answers = []
        for i in range(0, len(suite.prompts), batch):
            answers += [o["output_ids"] for o in eng.generate(input_ids=suite.prompts[i : i + batch],
                                                                sampling_params=[greedy] * len(suite.prompts[i : i + batch]))]  # fmt: skip
    finally:
        eng.shutdown()
    eng = engine(suite.draft, suite.dtype, batch, context)
    try:
        proposals, _ = teacher_top1(eng, suite.prompts, answers)
    finally:
        eng.shutdown()
    tok = _tokenizer(suite.target)
    picks = []  # (problem, k, proposal)
    for i, (answer, (tokens, _)) in enumerate(zip(answers, proposals)):
        where = [k for k, (q, y) in enumerate(zip(tokens, answer)) if q != y]
        rng = random.Random(f"{seed}-{suite_name}-{first + i}")
        picks += [(i, k, tokens[k]) for k in sorted(rng.sample(where, min(per_problem, len(where))))]
    rows, progress = [], Progress(f"mine {suite_name} {first}+{count}", len(picks))
    eng = engine(suite.target, suite.dtype, batch, context, hidden=True)
    try:
        for n in range(0, len(picks), batch):
            group = picks[n : n + batch]
            inputs = [suite.prompts[i] + answers[i][:k] + [q] for i, k, q in group]
            feats = [eng.generate(input_ids=ids, sampling_params={"max_new_tokens": 1, "temperature": 0},
                                  return_hidden_states="last", return_logprob=True, logprob_start_len=len(ids) - 2,
                                  top_logprobs_num=1)["meta_info"] for ids in inputs]  # fmt: skip
            rest = [{"max_new_tokens": max(max_new_tokens - k - 1, 1), "temperature": 0} for _, k, _ in group]
            finished = eng.generate(input_ids=inputs, sampling_params=rest)
            for (i, k, q), meta, done in zip(group, feats, finished):
                before = tok.decode(answers[i], skip_special_tokens=True)
                after = tok.decode(answers[i][:k] + [q] + done["output_ids"], skip_special_tokens=True)
                original, changed = suite.outcome(i, before), suite.outcome(i, after)
                rows.append({
                    "suite": suite_name, "problem": first + i, "position": k, "draft_token": q,
                    "target_token": answers[i][k], "harmful": int(changed != original),
                    "correct_before": bool(suite.correct(i, before)), "correct_after": bool(suite.correct(i, after)),
                    "logp_draft": meta["input_token_logprobs"][1][0], "logp_top": meta["input_top_logprobs"][1][0][0],
                    "hidden": _b64(torch.tensor(meta["hidden_states"], dtype=torch.float32)),
                    "context": tok.decode(answers[i][max(0, k - 12) : k]), "target_text": tok.decode([answers[i][k]]),
                    "draft_text": tok.decode([q]),
                })  # fmt: skip
            progress(len(rows))
    finally:
        eng.shutdown()
    shard = {
        "target": asdict(TargetIdentity.of_checkpoint(suite.target)),
        "command": f"python -m parse_sglang.judge_head mine --suite {suite_name} --first {first} --count {count} "
        f"--max-new-tokens {max_new_tokens} --per-problem {per_problem} --dtype {dtype}",
        "seconds": round(time.perf_counter() - start, 1),
        "problems": count,
        "rows": rows,
    }
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(shard) + "\n")
    return shard


def _tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m parse_sglang.judge_head", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("mine", help="label mismatches with SGLang engines (resumable shards)")
    m.add_argument("--suite", choices=("gsm", "humaneval", "synthetic"), required=True)
    m.add_argument("--first", type=int, default=0)
    m.add_argument("--count", type=int, default=16)
    m.add_argument("--out", required=True)
    m.add_argument("--max-new-tokens", type=int, default=256)
    m.add_argument("--per-problem", type=int, default=8)
    m.add_argument("--batch", type=int, default=16)
    m.add_argument("--dtype", default="bfloat16")
    m.add_argument("--cache-dir", default=None)
    t = sub.add_parser("train", help="fit and calibrate a head on mined shards")
    t.add_argument("shards", nargs="+")
    t.add_argument("--target", required=True, help="the target checkpoint directory (its config.json)")
    t.add_argument("--out", required=True)
    t.add_argument("--max-harmful-accepted", type=float, default=0.05)
    t.add_argument("--label", choices=LABELS, default="outcome", help="what a harmful mismatch is (`labelled`)")
    e = sub.add_parser("eval", help="ROC AUC and false accepts of a head on mined shards")
    e.add_argument("head")
    e.add_argument("shards", nargs="+")
    e.add_argument("--label", choices=LABELS, default="outcome")
    args = parser.parse_args(argv)
    if args.command == "mine":
        for flag in ("count", "max_new_tokens", "per_problem", "batch"):
            if getattr(args, flag) < 1:
                parser.error(f"--{flag.replace('_', '-')}={getattr(args, flag)}: allowed is a positive integer")
        shard = mine(args.suite, args.first, args.count, args.out, args.max_new_tokens, args.per_problem, args.batch,
                     args.dtype, cache_dir=args.cache_dir)  # fmt: skip
        harmful = sum(r["harmful"] for r in shard["rows"])
        print(f"{args.out}: {len(shard['rows'])} mismatches ({harmful} harmful) in {shard['seconds']} s")
    elif args.command == "train":
        head, _ = train(args.shards, args.target, args.max_harmful_accepted, label=args.label)
        head.save(args.out)
        print(
            f"{args.out}: threshold {head.threshold}, sha256 {hashlib.sha256(Path(args.out).read_bytes()).hexdigest()}"
        )
    else:
        print(json.dumps(evaluate(load(args.head), args.shards, args.label), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
