"""What PARSE's judge costs in answer quality: accuracy against tokens per target forward, one
row per judge setting, all in SGLang in one run.

    python benchmarks/semantic.py [--pair synthetic|smollm2|qwen2.5-coder] [--suite humaneval|gsm]
                                  [--num-problems N] [--first K] [--modes MODE ...] [--dtype D]
                                  [--batch-size B] [--json] [--no-nll]
                                  [--target DIR --draft DIR --prompts FILE [--grader MODULE:FUNC]]
                                  [--url http://HOST:PORT --prompts FILE [--grader MODULE:FUNC]]
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
c, McNemar's exact p, a one-sided 95% upper bound on the accuracy lost from Newcombe's paired
interval) and `target_nll` (the target's own mean negative log-likelihood per output token, with
transformers: what a judge that accepts un-target-like text costs by the target's measure;
--no-nll leaves it null, which on a 1.5B target saves most of the run).

--pair synthetic (default): held-out problems of the synthetic trained pair
(support.synthetic, a stand-in that makes the judge measurable offline, NOT evidence about
large models), graded by their answer. --pair smollm2: SmolLM2-135M-Instruct and its
layer-dropped draft on fixed questions, ungraded. --pair qwen2.5-coder: Qwen2.5-Coder-1.5B-Instruct
with Qwen2.5-Coder-0.5B-Instruct as its draft (`parse_sglang.models`, fetched when not cached) on
HumanEval problems --first K .. K+N-1 (`--suite humaneval`, support/problems.py: each answer's
code run against the problem's tests in its own process), or GSM-symbolic problems (`--suite gsm`:
reasoning-gym's generators from GSM8K's test set, graded by the answer's last number). Your own pair: --target/--draft/--prompts
FILE and optionally --grader MODULE:FUNC (`parse_sglang.tools.prompts`: a JSON list of problems,
FUNC(problem, output_text) -> bool, or (outcome, bool)). Your own running server: --url and
--prompts [--grader]: a PARSE server launched with the judge on at a fixed L, e.g. --parse-config
'{"judge": true, "judge_mode": "probe", "adaptive": false}' (and its judge_head, given here too as
--judge-head), serves the rows a request picks (parse_lossless and the judged rows) over HTTP, the
paired comparison among them; no engine is started and no CPU runtime is needed here.
The plot (matplotlib) is accuracy with its interval (target-only's drawn as a band), or target NLL
where ungraded, against tokens per forward.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
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
    prompts: list  # the problems (`parse_sglang.tools.prompts`)
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


def user_workload(target: str, draft: str, problems: list, grader: str | None) -> Workload:
    """`problems` (`parse_sglang.tools.prompts`) on the target's tokenizer, graded by `grader`."""
    from transformers import AutoTokenizer

    from parse_sglang.tools.prompts import load_grader, prompt_ids

    grade = load_grader(grader) if grader else None
    ids = prompt_ids(problems, AutoTokenizer.from_pretrained(target))
    return Workload(
        target, draft, problems, ids, None if grade is None else lambda i, text: grade(problems[i], text)[1]
    )


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


MODES = (
    "target_only",
    "standalone",
    *dict.fromkeys(mode for mode, _, _ in parse_rows()),
    "parse_adaptive",
    "parse_default_judge",
)


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
    return derive(
        {
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
        }
    )


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


def paired_difference_interval(e: int, f: int, g: int, h: int, level: float = 0.95) -> tuple[float, float]:
    """Newcombe's hybrid score interval (Stat Med 1998;17:2635, his method 10) at two-sided `level`
    for p1 - p2 on n = e + f + g + h pairs: e both succeed, f only the first, g only the second, h
    neither: the Wilson intervals of p1 = (e + f) / n and p2 = (e + g) / n squared and added,
    corrected by the table's phi coefficient (continuity-corrected; 0 where a margin is 0)."""
    from support.problems import wilson

    if min(e, f, g, h) < 0 or e + f + g + h == 0 or not 0 < level < 1:
        allowed = "allowed are counts >= 0, at least one pair, and 0 < level < 1"
        raise ValueError(f"paired counts e={e} f={f} g={g} h={h}, level={level}: {allowed}")
    n = e + f + g + h
    z = statistics.NormalDist().inv_cdf((1 + level) / 2)
    p1, p2 = (e + f) / n, (e + g) / n
    (l1, u1), (l2, u2) = wilson(e + f, n, z), wilson(e + g, n, z)
    margins = (e + f) * (g + h) * (e + g) * (f + h)
    cross = e * h - f * g
    corrected = cross - n / 2 if cross > n / 2 else min(cross, 0)
    phi = corrected / math.sqrt(margins) if margins else 0.0
    low = p1 - p2 - math.sqrt((p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2)
    high = p1 - p2 + math.sqrt((p2 - l2) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1) + (u1 - p1) ** 2)
    return low, high


def paired(rows: list[dict], against: str = "parse_lossless") -> None:
    """Each graded row against the `against` row on the same problems: b (it right, this row wrong),
    c (the reverse), McNemar's exact two-sided p, and `loss_upper95`, a one-sided 95% upper bound on
    the accuracy lost (its accuracy minus this row's): the upper end of Newcombe's two-sided 90%
    hybrid score interval for paired proportions (`paired_difference_interval`)."""
    base = next((r for r in rows if r["mode"] == against and r["correct"] is not None), None)
    for row in rows:
        row.update(paired_b=None, paired_c=None, mcnemar_p=None, loss_upper95=None)
        if base is None or row["correct"] is None or len(row["correct"]) != len(base["correct"]):
            continue
        pairs = list(zip(base["correct"], row["correct"]))
        e, b = sum(x and y for x, y in pairs), sum(x and not y for x, y in pairs)
        c, h = sum(y and not x for x, y in pairs), sum(not (x or y) for x, y in pairs)
        p = min(1.0, 2 * binomial_tail(max(b, c), b + c, 0.5)) if b + c else 1.0
        loss_upper95 = paired_difference_interval(e, b, c, h, level=0.90)[1]
        row.update(paired_b=b, paired_c=c, mcnemar_p=p, loss_upper95=loss_upper95)


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


def per_request_rows(head: bool, sampling: dict) -> list[tuple[str, float | None, dict]]:
    """(mode, threshold, sampling params) of the rows one PARSE server serves by per-request settings."""
    return [(mode, t, {**sampling, "custom_params": {"parse": settings}}) for mode, t, settings in parse_rows(head)]


def wanted(mode: str, threshold, modes: Sequence[str] | None, thresholds: Sequence[float] | None) -> bool:
    """Whether a row is run: its mode among `modes` and, judged, its threshold among `thresholds`."""
    return (modes is None or mode in modes) and (thresholds is None or threshold is None or threshold in thresholds)


def run_server_rows(
    url: str,
    work: Workload,
    head: bool,
    max_new_tokens: int,
    progress=None,
    temperature: float = 0.0,
    top_p: float = 1.0,
    modes: Sequence[str] | None = None,
    batch_size: int | None = None,
    thresholds: Sequence[float] | None = None,
) -> list[dict]:
    """The rows a running PARSE server at `url` serves by per-request settings (parse_lossless and
    the judged rows, the head's with `head`), one after another, over HTTP."""
    from parse_sglang.tools.backends import HttpServer

    server = HttpServer(url)
    dtype = server.get_server_info().get("dtype")
    sampling = {"temperature": temperature, "top_p": top_p, "max_new_tokens": max_new_tokens}
    server.generate(input_ids=work.prompt_ids[0], sampling_params={**sampling, "max_new_tokens": 4})
    rows = []
    for mode, threshold, params in per_request_rows(head, sampling):
        if wanted(mode, threshold, modes, thresholds):
            rows.append(
                {**summarize(mode, threshold, work, *run_batch(server, work, params, batch_size)), "dtype": dtype}
            )
            if progress is not None:
                progress.update(1)
    paired(rows)
    return rows


def run_rows(
    work: Workload,
    config: ParseConfig,
    max_new_tokens: int,
    progress=None,
    temperature: float = 0.0,
    top_p: float = 1.0,
    modes: Sequence[str] | None = None,
    dtype: str | None = None,
    batch_size: int | None = None,
    thresholds: Sequence[float] | None = None,
) -> list[dict]:
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
            per_request_rows(bool(config.judge_head), sampling),
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
        batches = [batch for batch in batches if wanted(batch[0], batch[1], modes, thresholds)]
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
            ax.errorbar(
                row["tokens_per_target_forward"],
                row[key],
                yerr=[[below], [above]],
                fmt="none",
                ecolor="tab:gray",
                elinewidth=0.6,
                capsize=2,
            )
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
    parser.add_argument("--prompts", help="JSON list of problems (with --target/--draft or --url)")
    parser.add_argument("--grader", help="MODULE:FUNC, FUNC(problem, output_text) -> bool | (outcome, bool)")
    parser.add_argument("--url", help="a running PARSE server (judge on, fixed L): its per-request rows over HTTP")
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
    if args.url is not None:
        served = {mode for mode, _, _ in parse_rows()}
        if args.target is not None or args.draft is not None or args.prompts is None:
            parser.error("--url goes with --prompts (and --grader), not --target / --draft: the server has its models")
        if args.modes and not set(args.modes) <= served:
            parser.error(
                f"--modes {' '.join(args.modes)} is invalid with --url: allowed are {' '.join(sorted(served))}"
            )
    elif (args.target is None) != (args.draft is None) or (args.target is not None) != (args.prompts is not None):
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
        config = ParseConfig(
            draft_budget=args.num_steps,
            probe_stride=args.probe_stride,
            adaptive=False,
            judge=True,
            judge_mode="probe",
            judge_head=args.judge_head,
        )
    except ValueError as err:  # draft_budget is --num-steps, probe_stride --probe-stride
        parser.error(f"--num-steps / --probe-stride: {err}")
    import torch

    from parse_sglang import cpu_engine_settings
    from parse_sglang.tools.backends import HttpServer
    from parse_sglang.tools.prompts import read_problems

    try:
        if args.url is None and not torch.cuda.is_available():
            cpu_engine_settings()  # the CPU runtime on, before SGLang is imported
        problems = read_problems(args.prompts) if args.prompts else None
    except (RuntimeError, ValueError) as err:
        parser.error(str(err))
    if args.url:
        target = HttpServer(args.url).get_server_info()["model_path"]
        name, work = "server", user_workload(target, "", problems, args.grader)
    elif args.target:
        name, work = "user", user_workload(args.target, args.draft, problems, args.grader)
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

    total = sum(wanted(m, t, args.modes, args.thresholds) for m, t, _ in parse_rows(bool(args.judge_head)))
    if not args.url:  # the rows of engines of their own
        total += sum(
            wanted(m, None, args.modes, None)
            for m in ("target_only", "standalone", "parse_adaptive", "parse_default_judge")
        )
    with tqdm(total=total, desc="rows", file=sys.stderr) as progress:
        if args.url:
            rows = run_server_rows(
                args.url,
                work,
                bool(args.judge_head),
                args.max_new_tokens,
                progress,
                args.temperature,
                args.top_p,
                args.modes,
                args.batch_size,
                args.thresholds,
            )
        else:
            rows = run_rows(
                work,
                config,
                args.max_new_tokens,
                progress,
                args.temperature,
                args.top_p,
                args.modes,
                args.dtype,
                args.batch_size,
                args.thresholds,
            )
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
