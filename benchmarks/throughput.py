"""End-to-end: PARSE vs target-only vs STANDALONE in SGLang, same prompts, same settings, one run.

For each mode one `sglang.Engine` serves the same batch of prompts (greedy) and the table
gives, side by side: output tokens per target forward (hardware independent: a target-only
step is one forward, a speculative round one verify forward, plus one prefill forward per
request), wall time, throughput relative to target-only, and how many outputs equal the
target-only output token for token.

Run:  python benchmarks/throughput.py --target T --draft D [--steps 8] [--max-new-tokens 64] [--chat]
      python benchmarks/throughput.py --tiny        (a tiny random pair built in a temp dir)
--chat sends each prompt as a one-turn chat (the target's chat template), as a chat
deployment does; raw prompts handicap STANDALONE, whose draft never sees a prompt's first
token (benchmarks/README.md).
On a machine without CUDA the CPU runtime is enabled and engines run on the CPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's `support` package
from sglang_cpu import engine_settings  # noqa: E402
from parse_sglang.demo import chat_prompt_ids, target_forwards  # noqa: E402
from support.tiny_models import build_pair  # noqa: E402

PROMPTS = [
    "Explain why the sky is blue in two sentences.",
    "Write a Python function that returns the sum of a list.",
    "What is 17 times 3? Answer step by step.",
    "List three uses of water.",
    "Give a short definition of a prime number.",
    "Translate 'good morning' into French and Spanish.",
    "Why do leaves change colour in autumn?",
    "Write a haiku about the sea.",
]


def modes(draft: str, steps: int, threshold: float) -> dict[str, dict]:
    spec = dict(speculative_draft_model_path=draft, speculative_num_steps=steps)
    standalone = dict(
        spec, speculative_algorithm="STANDALONE", speculative_eagle_topk=1, speculative_num_draft_tokens=steps + 1
    )
    return {
        "target-only": {},
        "STANDALONE": standalone,
        # SGLang's radix tree keys STANDALONE's shifted draft KV wrongly for prompts sharing a
        # prefix (benchmarks/README.md); without the radix cache its draft reads its own KV.
        "STANDALONE radix off": dict(standalone, disable_radix_cache=True),
        "PARSE lossless": dict(spec, speculative_algorithm="PARSE", parse_config={"judge": False}),
        f"PARSE judge tau={threshold}": dict(
            spec, speculative_algorithm="PARSE", parse_config={"threshold": threshold}
        ),
    }


def run_mode(target: str, settings: dict, prompts: list[list[int]], max_new_tokens: int, common: dict) -> dict:
    import sglang

    engine = sglang.Engine(model_path=target, **common, **settings)
    try:
        params = {"temperature": 0.0, "max_new_tokens": max_new_tokens}
        engine.generate(input_ids=prompts[:1], sampling_params={"temperature": 0.0, "max_new_tokens": 4})  # warm-up
        start = time.perf_counter()
        outputs = engine.generate(input_ids=prompts, sampling_params=params)
        seconds = time.perf_counter() - start
    finally:
        engine.shutdown()
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outputs)
    forwards = sum(target_forwards(o["meta_info"]) for o in outputs)  # prefill + decode steps / verify passes
    judged = sum((o["meta_info"].get("parse") or {}).get("accepted_judged", 0) for o in outputs)
    return dict(
        seconds=seconds, tokens=tokens, forwards=forwards, judged=judged, ids=[o["output_ids"] for o in outputs]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target")
    parser.add_argument("--draft")
    parser.add_argument(
        "--tiny", action="store_true", help="use a tiny random pair (plumbing check, not a speed claim)"
    )
    parser.add_argument("--steps", type=int, default=8, help="draft tokens per round (L) for STANDALONE and PARSE")
    parser.add_argument("--threshold", type=float, default=0.5)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--chat", action="store_true", help="prompts as one-turn chats (the target's chat template)")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    if args.tiny:
        args.target, args.draft = map(str, build_pair(tempfile.mkdtemp() + "/pair"))
    if not (args.target and args.draft):
        parser.error("--target and --draft (or --tiny) are required")
    common = dict(engine_settings(), max_running_requests=len(PROMPTS), log_level="error", decode_log_interval=1)
    if common.get("device") == "cpu":
        common.update(mem_fraction_static=0.5, max_total_tokens=8192)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.target)
    if args.chat:
        prompts = chat_prompt_ids(tokenizer, PROMPTS)
    else:
        prompts = [tokenizer(p).input_ids for p in PROMPTS]
    results = {
        name: run_mode(args.target, settings, prompts, args.max_new_tokens, common)
        for name, settings in modes(args.draft, args.steps, args.threshold).items()
    }
    base = results["target-only"]
    print(
        f"target={args.target} draft={args.draft} L={args.steps} prompts={len(PROMPTS)} chat={args.chat} "
        f"max_new_tokens={args.max_new_tokens} settings={json.dumps(common)}"
    )
    print(
        "| mode | output tokens | target forwards | tokens / target forward | judged tokens | wall s | throughput vs target-only | outputs == target-only |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    rows = []
    for name, r in results.items():
        same = sum(a == b for a, b in zip(r["ids"], base["ids"]))
        speed = (r["tokens"] / r["seconds"]) / (base["tokens"] / base["seconds"])
        rows.append(dict(mode=name, **{k: v for k, v in r.items() if k != "ids"}, speedup=speed, same=same))
        print(
            f"| {name} | {r['tokens']} | {r['forwards']} | {r['tokens'] / r['forwards']:.2f} | {r['judged']} | "
            f"{r['seconds']:.1f} | {speed:.2f}x | {same}/{len(PROMPTS)} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
