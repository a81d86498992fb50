"""What PARSE's judge costs in answer quality: accuracy against tokens per target forward, one
row per judge setting, all in SGLang in one run.

    python benchmarks/semantic.py [--pair synthetic|smollm2|qwen2.5-coder] [--suite humaneval|gsm]
                                  [--num-problems N] [--first K] [--modes MODE ...] [--dtype D]
                                  [--batch-size B] [--json] [--no-nll]
                                  [--target DIR --draft DIR --prompts FILE [--grader MODULE:FUNC]]
                                  [--num-steps L] [--probe-stride D] [--max-new-tokens N] [--judge-head FILE]
                                  [--temperature T [--top-p P]] [--plot PNG] [--cache-dir DIR]
    python benchmarks/semantic.py --merge SHARD.jsonl ...

Rows: target_only, standalone (SGLang's STANDALONE, topk 1, radix cache off), parse_lossless,
parse_probe at τ in PROBE_THRESHOLDS, parse_likelihood at λ in LIKELIHOOD_THRESHOLDS,
parse_divergence at θ in DIVERGENCE_ENTROPIES, parse_head at HEAD_THRESHOLDS (with --judge-head),
parse_adaptive (a server with adaptive draft lengths up to L, lossless) and parse_default_judge (a
server with no setting but {"judge": true}: adaptive, as users run it). Five engines, one after
the other; the fixed-L PARSE engine serves every judged row through per-request settings. Each row runs all prompts as one batch, or in batches of
--batch-size prompts one after another (greedy, or sampled with --temperature / --top-p: then
every row samples, and lossless rows are samples of the target's distribution, not its greedy
output).

Per row: `accuracy` (share of graded answers correct; null where there is no grader) and
`accuracy_ci95` (Wilson's interval),
`tokens_per_target_forward`, `judged_share` (output tokens the judge accepted beyond exact
matches), `verify_rows_per_round` (PARSE's window rows per round), `wall_s` (the row's batches),
`output_ids`, `correct` and the raw totals (--json only: what `--merge` joins shards by), the
paired comparison against parse_lossless on the same problems (`paired`: discordant counts b and
c, McNemar's exact p, a one-sided 95% upper bound on the accuracy lost) and `target_nll` (the target's own mean negative log-likelihood per
output token, with transformers: what a judge that accepts un-target-like text costs by the
target's measure; --no-nll leaves it null, which on a 1.5B target saves most of the run).

--pair synthetic (default): held-out problems of the synthetic trained pair
(support.synthetic, a stand-in that makes the judge measurable offline, NOT evidence about
large models), graded by their answer. --pair smollm2: SmolLM2-135M-Instruct and its
layer-dropped draft on fixed questions, ungraded. --pair qwen2.5-coder: Qwen2.5-Coder-1.5B-Instruct
with Qwen2.5-Coder-0.5B-Instruct as its draft (`parse_sglang.models`, fetched when not cached) on
HumanEval problems --first K .. K+N-1 (`--suite humaneval`, support/problems.py: each answer's
code run against the problem's tests in its own process), or GSM-symbolic problems (`--suite gsm`:
reasoning-gym's generators from GSM8K's test set, graded by the answer's last number). Your own pair: --target/--draft/--prompts
FILE (a JSON list of strings, or one prompt per line, chat template applied) and optionally
--grader MODULE:FUNC, called as FUNC(prompt, output_text) -> bool.
The plot (matplotlib) is accuracy with its interval (target-only's drawn as a band), or target NLL
where ungraded, against tokens per forward.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's `support` package
from parse_sglang.demo import DEFAULT_PROMPTS, chat_prompt_ids, engine_kwargs, table, target_forwards  # noqa: E402
from parse_sglang.settings import parse_engine_kwargs  # noqa: E402
from parse_sglang.settings import ParseConfig  # noqa: E402

PROBE_THRESHOLDS = (0.3, 0.5, 0.7, 0.9)
LIKELIHOOD_THRESHOLDS = (0.05, 0.2, 0.5)
DIVERGENCE_ENTROPIES = (0.5, 1.0, 2.0)  # θ, nats; W is ParseConfig's divergence_window
HEAD_THRESHOLDS = (0.1, 0.25, 0.4)  # with --judge-head
KEYS = (
    "pair",
    "suite",
    "dtype",
    "problems",
    "mode",
    "threshold",
    "accuracy",
    "accuracy_ci95",
    "tokens_per_target_forward",
    "judged_share",
    "verify_rows_per_round",
    "wall_s",
    "target_nll",
    "paired_b",
    "paired_c",
    "mcnemar_p",
    "loss_upper95",
)
JSON_KEYS = (*KEYS, "output_ids", "correct", "tokens", "forwards", "judged", "rounds", "verify_rows")


@dataclasses.dataclass
class Workload:
    """A pair and what it answers: prompt texts, their chat-templated ids, an optional grader."""

    target: str
    draft: str
    prompts: list[str]
    prompt_ids: list[list[int]]
    grader: Callable[[int, str], bool] | None  # (prompt index, output text) -> correct
    pair: str = "user"
    suite: str | None = None


def synthetic_workload(num_problems: int, cache_dir=None) -> Workload:
    from support import synthetic
    from transformers import AutoTokenizer

    target, draft = synthetic.build(cache_dir, log=lambda line: print(line, file=sys.stderr, flush=True))
    items = synthetic.problems(synthetic.TEST_SEED, num_problems)
    enc = synthetic.Encoder(AutoTokenizer.from_pretrained(target))
    return Workload(
        str(target),
        str(draft),
        [p.prompt for p in items],
        [enc.prompt_ids(p) for p in items],
        lambda i, text: synthetic.grade(items[i], text),
    )


def qwen_workload(suite: str, num_problems: int, first: int, dtype: str, cache_dir=None) -> Workload:
    """The Qwen2.5-Coder pair in `dtype` on `suite`'s problems first .. first + num_problems - 1."""
    from support import problems
    from transformers import AutoTokenizer

    from parse_sglang import models

    target, draft = models.pair_checkpoints("qwen2.5-coder", dtype, cache_dir)
    if suite == "humaneval":
        code = problems.humaneval(first, num_problems, cache_dir)
        questions = [item.question() for item in code]
        grade = lambda i, text: problems.passes(code[i], text)  # noqa: E731
    else:
        math_problems = problems.gsm(first, num_problems, cache_dir)
        questions = [item.question for item in math_problems]
        grade = lambda i, text: math_problems[i].passes(text)  # noqa: E731
    ids = chat_prompt_ids(AutoTokenizer.from_pretrained(target), questions)
    return Workload(str(target), str(draft), questions, ids, grade, "qwen2.5-coder", suite)


def user_workload(target: str, draft: str, prompts: list[str], grader: str | None) -> Workload:
    from transformers import AutoTokenizer

    func = None
    if grader:
        module, _, name = grader.partition(":")
        func = getattr(importlib.import_module(module), name)
    ids = chat_prompt_ids(AutoTokenizer.from_pretrained(target), prompts)
    return Workload(target, draft, prompts, ids, None if func is None else lambda i, text: bool(func(prompts[i], text)))


def read_prompts(path: str) -> list[str]:
    text = Path(path).read_text()
    try:
        prompts = json.loads(text)
    except ValueError:
        prompts = [line for line in text.splitlines() if line.strip()]
    if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
        raise ValueError(f"--prompts {path}: allowed is a JSON list of strings or one prompt per line")
    return prompts


def parse_rows(head: bool = True) -> list[tuple[str, float | None, dict]]:
    """(mode, threshold, per-request PARSE settings) of every PARSE row (the head's with `head`)."""
    rows = [("parse_lossless", None, {"judge": False})]
    rows += [("parse_probe", t, {"judge_mode": "probe", "threshold": t}) for t in PROBE_THRESHOLDS]
    rows += [
        ("parse_likelihood", t, {"judge_mode": "likelihood", "likelihood_threshold": t}) for t in LIKELIHOOD_THRESHOLDS
    ]
    rows += [
        ("parse_divergence", t, {"judge_mode": "divergence", "divergence_entropy": t}) for t in DIVERGENCE_ENTROPIES
    ]
    if head:
        rows += [("parse_head", t, {"judge_mode": "head", "head_threshold": t}) for t in HEAD_THRESHOLDS]
    return rows


MODES = ("target_only", "standalone", *dict.fromkeys(mode for mode, _, _ in parse_rows()), "parse_adaptive",
         "parse_default_judge")  # fmt: skip


def _server_parse_totals(engine) -> dict:
    return engine.get_server_info()["internal_states"][0].get("parse") or {}


def run_batch(engine, work: Workload, sampling: dict, batch_size: int | None = None) -> tuple[list[dict], float, dict]:
    """All prompts, `batch_size` per generate call (all in one by default): (outputs, wall seconds,
    PARSE server counters they added)."""
    before = _server_parse_totals(engine)
    step = batch_size or len(work.prompt_ids)
    outs, start = [], time.perf_counter()
    for i in range(0, len(work.prompt_ids), step):
        outs += engine.generate(input_ids=work.prompt_ids[i : i + step], sampling_params=sampling)
    wall = time.perf_counter() - start
    after = _server_parse_totals(engine)
    added = {k: after[k] - before.get(k, 0) for k in ("rounds", "verify_rows") if k in after}
    return outs, wall, added


def summarize(mode: str, threshold, work: Workload, outs: list[dict], wall: float, added: dict) -> dict:
    """A row from its outputs: raw totals (what shards merge by) and the figures derived from them."""
    return derive({
        "pair": work.pair,
        "suite": work.suite,
        "problems": len(outs),
        "mode": mode,
        "threshold": threshold,
        "correct": None if work.grader is None else [bool(work.grader(i, o["text"])) for i, o in enumerate(outs)],
        "tokens": sum(o["meta_info"]["completion_tokens"] for o in outs),
        "forwards": sum(target_forwards(o["meta_info"]) for o in outs),
        "judged": sum((o["meta_info"].get("parse") or {}).get("accepted_judged", 0) for o in outs),
        "rounds": added.get("rounds", 0),
        "verify_rows": added.get("verify_rows", 0),
        "wall_s": wall,
        "output_ids": [o["output_ids"] for o in outs],
    })  # fmt: skip


def derive(row: dict) -> dict:
    """The row's figures from its totals (accuracy with Wilson's interval, tokens per forward...)."""
    from support.problems import wilson

    correct = row["correct"]
    row["problems"] = len(row["output_ids"])
    row["accuracy"] = None if correct is None else sum(correct) / len(correct)
    row["accuracy_ci95"] = None if correct is None else list(wilson(sum(correct), len(correct)))
    row["tokens_per_target_forward"] = row["tokens"] / max(row["forwards"], 1)
    row["judged_share"] = row["judged"] / max(row["tokens"], 1)
    row["verify_rows_per_round"] = row["verify_rows"] / row["rounds"] if row["rounds"] else None
    return row


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k), X ~ Binomial(n, p)."""
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))


def paired(rows: list[dict], against: str = "parse_lossless") -> None:
    """Each graded row against the `against` row on the same problems: b (it right, this row wrong),
    c (the reverse), McNemar's exact two-sided p, and a one-sided 95% upper bound on the accuracy
    lost, (b - c) / n: given the b + c discordant problems, b's share π has the Clopper-Pearson
    upper bound π_U (P(X <= b | π_U) = 0.05), and the loss is at most (b + c)(2 π_U - 1) / n."""
    base = next((r for r in rows if r["mode"] == against and r["correct"] is not None), None)
    for row in rows:
        row.update(paired_b=None, paired_c=None, mcnemar_p=None, loss_upper95=None)
        if base is None or row["correct"] is None or len(row["correct"]) != len(base["correct"]):
            continue
        b = sum(x and not y for x, y in zip(base["correct"], row["correct"]))
        c = sum(y and not x for x, y in zip(base["correct"], row["correct"]))
        n, d = len(row["correct"]), b + c
        p = min(1.0, 2 * binomial_tail(max(b, c), d, 0.5)) if d else 1.0
        low, high = 0.0, 1.0  # π_U by bisection: 1 - P(X >= b + 1 | π) = 0.05
        for _ in range(60):
            mid = (low + high) / 2
            low, high = (mid, high) if 1 - binomial_tail(b + 1, d, mid) > 0.05 else (low, mid)
        row.update(paired_b=b, paired_c=c, mcnemar_p=p, loss_upper95=d * (2 * high - 1) / n if d else 0.0)


def merge(paths: Sequence[str]) -> list[dict]:
    """Rows of shards (--json output of runs on consecutive problem ranges) joined per (mode,
    threshold, dtype): their totals added, their per-problem lists concatenated in file order."""
    joined: dict = {}
    for path in paths:
        for line in Path(path).read_text().splitlines():
            row = json.loads(line)
            key = (row["mode"], row["threshold"], row["dtype"])
            if key not in joined:
                joined[key] = row
                continue
            into = joined[key]
            for field in ("tokens", "forwards", "judged", "rounds", "verify_rows", "wall_s"):
                into[field] += row[field]
            into["output_ids"] += row["output_ids"]
            into["correct"] = (
                None if into["correct"] is None or row["correct"] is None else into["correct"] + row["correct"]
            )
    rows = [derive(row) for row in joined.values()]
    paired(rows)
    return rows


def run_rows(work: Workload, config: ParseConfig, max_new_tokens: int, progress=None, temperature: float = 0.0,
             top_p: float = 1.0, modes: Sequence[str] | None = None, dtype: str | None = None,
             batch_size: int | None = None, thresholds: Sequence[float] | None = None) -> list[dict]:  # fmt: skip
    """Every row (or those of `modes`, judged ones only at `thresholds`), engines started one after
    another (never two at once)."""
    import sglang
    import torch

    base = engine_kwargs(work.target, torch.cuda.is_available())
    if dtype is not None:
        base["dtype"] = dtype
    base["max_running_requests"] = min(len(work.prompt_ids), 64)
    if "max_total_tokens" in base:  # CPU: room for a full batch of windows
        base["max_total_tokens"] = 32768
    sampling = {"temperature": temperature, "top_p": top_p, "max_new_tokens": max_new_tokens}
    L = config.draft_budget
    standalone = dict(
        speculative_algorithm="STANDALONE",
        speculative_draft_model_path=work.draft,
        speculative_num_steps=L,
        speculative_eagle_topk=1,
        speculative_num_draft_tokens=L + 1,
        disable_radix_cache=True,
    )
    plan = [
        ("target_only", base, [("target_only", None, sampling)]),
        ("standalone", {**base, **standalone}, [("standalone", None, sampling)]),
        (
            "parse",
            {**base, **parse_engine_kwargs(work.draft, config)},
            [
                (mode, t, {**sampling, "custom_params": {"parse": settings}})
                for mode, t, settings in parse_rows(bool(config.judge_head))
            ],  # fmt: skip
        ),
        (
            "parse_adaptive",
            {**base, **parse_engine_kwargs(work.draft, dataclasses.replace(config, adaptive=True, judge=False))},
            [("parse_adaptive", None, sampling)],
        ),
        (  # as a user turns the judge on: a server with no other setting
            "parse_default_judge",
            {**base, **parse_engine_kwargs(work.draft, ParseConfig(judge=True))},
            [("parse_default_judge", None, sampling)],
        ),
    ]
    rows = []
    for _, kwargs, batches in plan:
        batches = [batch for batch in batches if (modes is None or batch[0] in modes)
                   and (thresholds is None or batch[1] is None or batch[1] in thresholds)]  # fmt: skip
        if not batches:
            continue
        engine = sglang.Engine(**kwargs)
        try:
            engine.generate(input_ids=work.prompt_ids[0], sampling_params={**sampling, "max_new_tokens": 4})
            for mode, threshold, params in batches:
                rows.append(summarize(mode, threshold, work, *run_batch(engine, work, params, batch_size)))
                rows[-1]["dtype"] = kwargs.get("dtype")
                if progress is not None:
                    progress.update(1)
        finally:
            engine.shutdown()
    paired(rows)
    return rows


def add_target_nll(rows: list[dict], work: Workload) -> None:
    """row["target_nll"]: the target's mean NLL per output token (teacher-forced, prompt as context)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(work.target, dtype=torch.float32).eval()
    summed: dict[tuple[int, tuple[int, ...]], float] = {}  # rows often share outputs: one forward each

    def nll_sum(i: int, out: list[int]) -> float:
        key = (i, tuple(out))
        if key not in summed:
            prompt = work.prompt_ids[i]
            ids = torch.tensor([prompt + out])
            with torch.no_grad():
                logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
            summed[key] = float(torch.nn.functional.cross_entropy(logits, ids[0, len(prompt) :], reduction="sum"))
        return summed[key]

    for row in rows:
        outs = [(i, out) for i, out in enumerate(row["output_ids"]) if out]
        count = sum(len(out) for _, out in outs)
        row["target_nll"] = sum(nll_sum(i, out) for i, out in outs) / count if count else math.nan


def plot(rows: list[dict], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    graded = rows[0]["accuracy"] is not None
    key, label = (
        ("accuracy", "answer accuracy") if graded else ("target_nll", "target NLL per output token (lower is better)")
    )
    fig, ax = plt.subplots(figsize=(7, 4.5))
    target = next((row for row in rows if row["mode"] == "target_only"), None)
    if graded and target is not None:  # target-only's Wilson interval, the band a judge should stay in
        ax.axhspan(*target["accuracy_ci95"], color="tab:gray", alpha=0.15, label="target-only, Wilson 95%")
        ax.legend(fontsize=7, loc="lower left")
    for row in rows:
        name = row["mode"] + ("" if row["threshold"] is None else f" {row['threshold']:g}")
        ax.scatter(row["tokens_per_target_forward"], row[key])
        if graded:
            low, high = row["accuracy_ci95"]
            # Wilson's bound can land a rounding error inside a share of 1.0 (or 0.0): clamp at 0
            below, above = max(row[key] - low, 0.0), max(high - row[key], 0.0)
            ax.errorbar(row["tokens_per_target_forward"], row[key], yerr=[[below], [above]],
                        fmt="none", ecolor="tab:gray", elinewidth=0.6, capsize=2)  # fmt: skip
        ax.annotate(
            name, (row["tokens_per_target_forward"], row[key]), fontsize=7, xytext=(3, 3), textcoords="offset points"
        )
    ax.set_xlabel("output tokens per target forward")
    ax.set_ylabel(label)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def fmt(value) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/semantic.py", description=__doc__.splitlines()[0])
    parser.add_argument("--pair", choices=("synthetic", "smollm2", "qwen2.5-coder"), default="synthetic")
    parser.add_argument("--suite", choices=("humaneval", "gsm"), default="humaneval", help="qwen2.5-coder's problems")
    parser.add_argument("--num-problems", type=int, default=200, help="problems (synthetic, qwen2.5-coder)")
    parser.add_argument("--first", type=int, default=0, help="the first problem of the suite (qwen2.5-coder)")
    parser.add_argument("--modes", nargs="+", choices=MODES, help="rows to run (default: all)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), help="the engines' dtype (default: the pair's)")
    parser.add_argument("--batch-size", type=int, help="prompts per generate call (default: all at once)")
    parser.add_argument("--target")
    parser.add_argument("--draft")
    parser.add_argument("--prompts", help="JSON list of prompts, or one per line (with --target/--draft)")
    parser.add_argument("--grader", help="MODULE:FUNC, FUNC(prompt, output_text) -> bool")
    parser.add_argument("--num-steps", type=int, default=32, help="draft tokens per round (L), PARSE and STANDALONE")
    parser.add_argument("--probe-stride", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--plot", help="PNG path (default benchmarks/semantic_<pair>.png)")
    parser.add_argument("--cache-dir", help="cache root of built models")
    parser.add_argument("--json", action="store_true", help="one JSON object per row on stdout")
    parser.add_argument("--no-nll", action="store_true", help="no target_nll column (a real target takes long)")
    parser.add_argument("--thresholds", nargs="+", type=float, help="judged rows only at these thresholds")
    parser.add_argument("--judge-head", default="", help="a judge head file for the target: adds the parse_head rows")
    parser.add_argument("--merge", nargs="+", metavar="JSONL", help="join shards' --json rows and print the table")
    args = parser.parse_args(argv)
    if args.merge:
        rows = merge(args.merge)
        print(table(KEYS, [[fmt(row.get(key)) for key in KEYS] for row in rows]))
        return 0
    if (args.target is None) != (args.draft is None) or (args.target is not None) != (args.prompts is not None):
        parser.error("--target, --draft and --prompts go together")
    for flag in ("num_problems", "max_new_tokens", "batch_size"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')}={getattr(args, flag)} is invalid: allowed is an integer >= 1")
    if args.temperature < 0 or not 0 < args.top_p <= 1:
        parser.error(
            f"--temperature={args.temperature} / --top-p={args.top_p} are invalid: allowed are a "
            "temperature >= 0 and a top-p in (0, 1]"
        )
    try:
        # Fixed L, the probe judge on: every judged row's request may pick its judge and threshold.
        config = ParseConfig(draft_budget=args.num_steps, probe_stride=args.probe_stride, adaptive=False, judge=True,
                             judge_mode="probe", judge_head=args.judge_head)  # fmt: skip
    except ValueError as err:  # draft_budget is --num-steps, probe_stride --probe-stride
        parser.error(f"--num-steps / --probe-stride: {err}")
    import sglang_cpu
    import torch

    if not torch.cuda.is_available():
        sglang_cpu.enable()
    if args.target:
        name, work = "user", user_workload(args.target, args.draft, read_prompts(args.prompts), args.grader)
    elif args.pair == "qwen2.5-coder":
        name = "qwen2.5-coder"
        work = qwen_workload(args.suite, args.num_problems, args.first, args.dtype or "float32", args.cache_dir)
    elif args.pair == "smollm2":
        from parse_sglang import smollm2

        target, draft = smollm2.model_pair(args.cache_dir)
        name, work = "smollm2", user_workload(str(target), str(draft), list(DEFAULT_PROMPTS), None)
    else:
        name, work = "synthetic", synthetic_workload(args.num_problems, args.cache_dir)
    from tqdm import tqdm

    modes = args.modes or MODES
    total = sum(m in modes for m in ("target_only", "standalone", "parse_adaptive", "parse_default_judge"))
    total += sum(m in modes and (args.thresholds is None or t is None or t in args.thresholds)
                 for m, t, _ in parse_rows(bool(args.judge_head)))  # fmt: skip
    with tqdm(total=total, desc="rows", file=sys.stderr) as progress:
        rows = run_rows(work, config, args.max_new_tokens, progress, args.temperature, args.top_p, args.modes,
                        args.dtype, args.batch_size, args.thresholds)  # fmt: skip
    if args.no_nll:
        for row in rows:
            row["target_nll"] = None
    else:
        add_target_nll(rows, work)
    title = (
        f"{name}: {len(work.prompt_ids)} prompts, L={config.draft_budget}, Δ={config.probe_stride}"
        + (f", temperature {args.temperature}, top-p {args.top_p}" if args.temperature else "")
        + (" (synthetic stand-in, not evidence about large models)" if name == "synthetic" else "")
    )
    path = args.plot or str(Path(__file__).with_name(f"semantic_{name}.png"))
    if args.json:
        for row in rows:
            print(json.dumps({key: row[key] for key in JSON_KEYS}))
    else:
        print(title)
        print(table(KEYS, [[fmt(row[key]) for key in KEYS] for row in rows]))
        print(f"plot: {path}")
    sys.stdout.flush()  # the rows are out before the plot can fail
    plot(rows, path, title)
    return 0


if __name__ == "__main__":
    sys.exit(main())
