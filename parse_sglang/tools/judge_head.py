"""Mine, train and evaluate a judge head (`parse_sglang.judge_head`) on your target, draft, problems
and grader, against running SGLang servers or Engines started with your flags (GPU or CPU).

    python -m parse_sglang.tools.judge_head mine --prompts PROBLEMS.json --grader MODULE:FUNC
        (--url http://HOST:PORT | --engine-args '{"model_path": TARGET, ...}')
        (--draft-url http://HOST:PORT | --draft-engine-args '{"model_path": DRAFT, ...}')
        [--first K] [--count N] [--max-new-tokens 256] [--per-problem 8] [--batch 16] --out SHARD.json
    python -m parse_sglang.tools.judge_head train SHARD.json ... --target TARGET --out HEAD.json
    python -m parse_sglang.tools.judge_head eval HEAD.json SHARD.json ...

Problems and grader: `parse_sglang.tools.prompts`. The target's server must return hidden states
(`python -m sglang.launch_server --model-path TARGET --enable-return-hidden-states`; an Engine is
started with them); the draft's is any server of the draft model.

Mining labels a mismatch between the target's greedy answer y and the draft's proposal q at output
position k (the draft's top token given y_<k, teacher-forced): put q in place of y_k, let the target
finish greedily, and call it harmful iff the graded outcome changes. Per mismatch it records the
head's features (the target's final hidden state at the row that read q, log P_target(q) and
log P_target(top) there) and whether the answer was right before and after.

Training holds out whole groups (`prompts.group_of`: GSM-symbolic problems by template, so that no
held-out problem's template was seen in training), fits on the rest and writes the held-out
calibration: at each bound, the share of mismatches accepted and the harmful share among them. The
head carries no bound: a server's `head_threshold` is the bound; `train` prints the largest bound
whose held-out harmful share among accepted mismatches is at most --max-harmful-accepted.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Optional, Sequence

import torch

from parse_sglang.judge_head import JudgeHead, features, from_base64, load, to_base64
from parse_sglang.tools import backends, prompts

PROG = "python -m parse_sglang.tools.judge_head"

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
    x = features(
        torch.stack([from_base64(r["hidden"]) for r in rows]),
        torch.tensor([r["logp_draft"] for r in rows]),
        torch.tensor([r["logp_top"] for r in rows]),
    )
    return x, torch.tensor([float(r["harmful"]) for r in rows])


def split_by_group(rows: list, holdout: float = 0.25, seed: int = 0) -> tuple[list, list]:
    """(train, held out): whole groups (`prompts.group_of`) on one side, never one group's
    mismatches on both."""
    groups = sorted({json.dumps(r["group"]) for r in rows})
    random.Random(seed).shuffle(groups)
    held = set(groups[: max(1, round(holdout * len(groups)))])
    return [r for r in rows if json.dumps(r["group"]) not in held], [r for r in rows if json.dumps(r["group"]) in held]


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
    """Per bound τ (accept where P(harmful) <= τ): the share of mismatches accepted, the share of
    harmful ones accepted (false accepts) and the harmful share among those accepted."""
    out = []
    for tau in THRESHOLDS:
        ok = harm <= tau
        harmful = labels > 0.5
        out.append(
            {
                "threshold": tau,
                "accepted": round(float(ok.float().mean()), 4),
                "false_accept": round(float((ok & harmful).sum() / max(int(harmful.sum()), 1)), 4),
                "harmful_accepted": round(float((ok & harmful).sum() / max(int(ok.sum()), 1)), 4),
            }
        )
    return out


def largest_safe_bound(table: list, max_harmful_accepted: float) -> float | None:
    """The largest bound of `table` that accepts something with a harmful share among accepted
    mismatches at most `max_harmful_accepted`, or None."""
    safe = [c["threshold"] for c in table if c["harmful_accepted"] <= max_harmful_accepted and c["accepted"] > 0]
    return max(safe) if safe else None


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
        raise ValueError("label='correctness' needs mined rows with correct_before true")
    return kept


def train(
    paths: Sequence[str],
    target: str,
    max_harmful_accepted: float = 0.05,
    seed: int = 0,
    label: str = "outcome",
    log=print,
) -> tuple[JudgeHead, dict]:
    """Fit on the train groups (L2 chosen on a split of them by AUC), calibrate on the held-out
    groups. Returns (head, report); the report's `bound` is `largest_safe_bound` of the held-out
    calibration (the file does not carry it)."""
    mined = read_shards(paths)
    mined["rows"] = labelled(mined["rows"], label)
    identity = backends.target_identity(target)
    if mined["target"] != asdict(identity):
        raise ValueError(f"the shards were mined on {mined['target']}, --target is {asdict(identity)}")
    fit_rows, held = split_by_group(mined["rows"], seed=seed)
    inner, dev = split_by_group(fit_rows, seed=seed + 1)
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
    report = {
        "label": label,
        "mismatches": len(mined["rows"]),
        "harmful_share": round(sum(r["harmful"] for r in mined["rows"]) / len(mined["rows"]), 4),
        "split": "held out by group",
        "groups": len({json.dumps(r["group"]) for r in mined["rows"]}),
        "held_out_groups": len({json.dumps(r["group"]) for r in held}),
        "train": len(fit_rows),
        "held_out": len(held),
        "l2": l2,
        "dev_auc": {str(k): _rounded(v) for k, v in scored.items()},
        "held_out_auc": _rounded(auc(harm, y_held)),
    }
    recipe = {"mined": mined["commands"], **report, "train": f"{PROG} train ... --label {label}"}
    head = JudgeHead(identity, w, b, table, recipe)
    report["bound"] = largest_safe_bound(table, max_harmful_accepted)
    log(json.dumps(report))
    return head, report


def _rounded(value: float):
    """`value` to 4 places, None where it is undefined (NaN: a split with one class only)."""
    return None if value != value else round(value, 4)


def evaluate(head: JudgeHead, paths: Sequence[str], label: str = "outcome") -> dict:
    """ROC AUC and the calibration table of `head` on the mismatches in `paths` (`labelled`)."""
    x, y = _matrix(labelled(read_shards(paths)["rows"], label))
    harm = torch.sigmoid(x @ head.weights + head.bias)
    return {
        "mismatches": len(y),
        "harmful_share": round(float(y.mean()), 4),
        "auc": _rounded(auc(harm, y)),
        "calibration": calibration(harm, y),
    }


# ----- mining ---------------------------------------------------------------------------------


class Progress:
    """`done/total`, elapsed and ETA lines on stderr."""

    def __init__(self, what: str, total: int):
        self.what, self.total, self.start = what, total, time.perf_counter()

    def __call__(self, done: int) -> None:
        spent = time.perf_counter() - self.start
        eta = spent / done * (self.total - done) if done else float("nan")
        print(f"{self.what}: {done}/{self.total}, {spent:.0f} s, ETA {eta:.0f} s", file=sys.stderr, flush=True)


def _batched(client, inputs: list, params: list, batch: int) -> list:
    out = []
    for i in range(0, len(inputs), batch):
        out += client.generate(input_ids=inputs[i : i + batch], sampling_params=params[i : i + batch])
    return out


def mine(
    problems: list,
    grade,
    target: dict,
    draft: dict,
    out: str,
    first: int = 0,
    max_new_tokens: int = 256,
    per_problem: int = 8,
    batch: int = 16,
    seed: int = 0,
    command: str = "",
) -> dict:
    """Label up to `per_problem` mismatches per problem (module doc); `problems` are the file's
    first .. first + len - 1, `grade` a `prompts.load_grader` grader, `target` / `draft` the
    `backends.connect` arguments ({"url"} or {"engine_args"}). Resumable: an existing `out` is kept."""
    if Path(out).exists():
        print(f"{out} exists: kept (delete it to mine again)", file=sys.stderr)
        return json.loads(Path(out).read_text())
    from transformers import AutoTokenizer

    start = time.perf_counter()
    greedy = {"max_new_tokens": max_new_tokens, "temperature": 0}
    with backends.connect(**target, hidden=True) as model:
        tok = AutoTokenizer.from_pretrained(model.tokenizer_path)
        identity = backends.target_identity(model.model_path)
        ids = prompts.prompt_ids(problems, tok)
        answers = [o["output_ids"] for o in _batched(model.client, ids, [greedy] * len(ids), batch)]
    with backends.connect(**draft) as model:
        proposals, _ = backends.teacher_top1(model.client, ids, answers)
    picks = []  # (problem, k, proposal)
    for i, (answer, (tokens, _)) in enumerate(zip(answers, proposals)):
        where = [k for k, (q, y) in enumerate(zip(tokens, answer)) if q != y]
        rng = random.Random(f"{seed}-{first + i}")
        picks += [(i, k, tokens[k]) for k in sorted(rng.sample(where, min(per_problem, len(where))))]
    graded = [grade(p, tok.decode(a, skip_special_tokens=True)) for p, a in zip(problems, answers)]
    rows, progress = [], Progress(f"mine {first}+{len(problems)}", len(picks))
    with backends.connect(**target, hidden=True) as model:
        for n in range(0, len(picks), batch):
            group = picks[n : n + batch]
            inputs = [ids[i] + answers[i][:k] + [q] for i, k, q in group]
            feats = [
                model.client.generate(
                    input_ids=x,
                    sampling_params={"max_new_tokens": 1, "temperature": 0},
                    return_hidden_states=True,
                    return_logprob=True,
                    logprob_start_len=len(x) - 2,
                    top_logprobs_num=1,
                )["meta_info"]
                for x in inputs
            ]
            rest = [{"max_new_tokens": max(max_new_tokens - k - 1, 1), "temperature": 0} for _, k, _ in group]
            finished = model.client.generate(input_ids=inputs, sampling_params=rest)
            for (i, k, q), meta, done in zip(group, feats, finished):
                text = tok.decode(answers[i][:k] + [q] + done["output_ids"], skip_special_tokens=True)
                (outcome, right), (outcome_after, right_after) = graded[i], grade(problems[i], text)
                # return_hidden_states=True (HTTP takes no "last"): meta_info's first entry is the rows
                # the prefill computed, [rows, H]; the last is the row that read q
                states = torch.tensor(meta["hidden_states"][0], dtype=torch.float32)
                if states.shape[-1] != identity.hidden_size:
                    raise RuntimeError(
                        f"the target returned hidden states of {tuple(states.shape)}, its hidden size "
                        f"is {identity.hidden_size}: a server of another model than {model.model_path}?"
                    )
                hidden = states.reshape(-1, identity.hidden_size)[-1]
                rows.append(
                    {
                        "problem": first + i,
                        "group": prompts.group_of(problems[i], first + i),
                        "position": k,
                        "draft_token": q,
                        "target_token": answers[i][k],
                        "harmful": int(outcome_after != outcome),
                        "correct_before": right,
                        "correct_after": right_after,
                        "logp_draft": meta["input_token_logprobs"][1][0],
                        "logp_top": meta["input_top_logprobs"][1][0][0],
                        "hidden": to_base64(hidden),
                        "context": tok.decode(answers[i][max(0, k - 12) : k]),
                        "target_text": tok.decode([answers[i][k]]),
                        "draft_text": tok.decode([q]),
                    }
                )
            progress(len(rows))
    shard = {
        "target": asdict(identity),
        "command": command,
        "seconds": round(time.perf_counter() - start, 1),
        "problems": len(problems),
        "rows": rows,
    }
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(shard) + "\n")
    return shard


def _side(parser, who: str, url: Optional[str], engine_args: Optional[str]) -> dict:
    flags = f"--{who}url / --{who}engine-args"
    if (url is None) == (engine_args is None):
        parser.error(f"{flags}: give exactly one (a running server's URL, or sglang.Engine arguments as JSON)")
    if url is not None:
        return {"url": url, "engine_args": None, "flags": flags}
    try:
        return {
            "url": None,
            "engine_args": backends.parse_engine_args(engine_args, f"--{who}engine-args"),
            "flags": flags,
        }
    except ValueError as err:
        parser.error(str(err))


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("mine", help="label mismatches against SGLang servers or engines (resumable shards)")
    m.add_argument("--prompts", required=True, help="JSON list of problems (parse_sglang.tools.prompts)")
    m.add_argument("--grader", required=True, help="MODULE:FUNC, FUNC(problem, output_text) -> bool | (outcome, bool)")
    m.add_argument("--url", help="the target's running SGLang server (launched with --enable-return-hidden-states)")
    m.add_argument("--engine-args", help="or: the target's sglang.Engine arguments (JSON, with model_path)")
    m.add_argument("--draft-url", help="the draft's running SGLang server")
    m.add_argument("--draft-engine-args", help="or: the draft's sglang.Engine arguments (JSON, with model_path)")
    m.add_argument("--first", type=int, default=0, help="the first problem of the file mined")
    m.add_argument("--count", type=int, help="problems mined (default: to the end of the file)")
    m.add_argument("--out", required=True)
    m.add_argument("--max-new-tokens", type=int, default=256)
    m.add_argument("--per-problem", type=int, default=8)
    m.add_argument("--batch", type=int, default=16)
    m.add_argument("--seed", type=int, default=0, help="which mismatches of a problem are labelled")
    t = sub.add_parser("train", help="fit and calibrate a head on mined shards")
    t.add_argument("shards", nargs="+")
    t.add_argument("--target", required=True, help="the target checkpoint (folder or hub id) the shards were mined on")
    t.add_argument("--out", required=True)
    t.add_argument("--max-harmful-accepted", type=float, default=0.05, help="what the printed bound keeps to")
    t.add_argument("--label", choices=LABELS, default="outcome", help="what a harmful mismatch is (`labelled`)")
    e = sub.add_parser("eval", help="ROC AUC and false accepts of a head on mined shards")
    e.add_argument("head")
    e.add_argument("shards", nargs="+")
    e.add_argument("--label", choices=LABELS, default="outcome")
    args = parser.parse_args(argv)
    if args.command == "mine":
        for flag in ("count", "max_new_tokens", "per_problem", "batch"):
            if getattr(args, flag) is not None and getattr(args, flag) < 1:
                parser.error(f"--{flag.replace('_', '-')}={getattr(args, flag)} is invalid: allowed is an integer >= 1")
        target = _side(parser, "", args.url, args.engine_args)
        draft = _side(parser, "draft-", args.draft_url, args.draft_engine_args)
        try:
            problems = prompts.read_problems(args.prompts)
            grade = prompts.load_grader(args.grader)
        except ValueError as err:
            parser.error(str(err))
        if not 0 <= args.first < len(problems):
            parser.error(f"--first={args.first} is invalid: allowed is 0 .. {len(problems) - 1} ({args.prompts})")
        chosen = problems[args.first : None if args.count is None else args.first + args.count]
        shard = mine(
            chosen,
            grade,
            target,
            draft,
            args.out,
            args.first,
            args.max_new_tokens,
            args.per_problem,
            args.batch,
            args.seed,
            f"{PROG} {shlex.join(argv)}",
        )
        harmful = sum(r["harmful"] for r in shard["rows"])
        print(f"{args.out}: {len(shard['rows'])} mismatches ({harmful} harmful) in {shard['seconds']} s")
    elif args.command == "train":
        head, report = train(args.shards, args.target, args.max_harmful_accepted, label=args.label)
        head.save(args.out)
        bound = report["bound"]
        print(
            f"{args.out}: sha256 {hashlib.sha256(Path(args.out).read_bytes()).hexdigest()}; held-out AUC "
            f"{report['held_out_auc']}; "
            + (
                f"serve with head_threshold <= {bound} "
                f"(held-out harmful share among accepted <= {args.max_harmful_accepted})"
                if bound is not None
                else "no bound keeps the held-out harmful share among accepted "
                f"<= {args.max_harmful_accepted}: this head does not pay here"
            )
        )
    else:
        print(json.dumps(evaluate(load(args.head), args.shards, args.label), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
