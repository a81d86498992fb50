"""Offline batch generation with PARSE in an in-process `sglang.Engine` (no HTTP server).

    python examples/offline_batch.py --target Qwen/Qwen3-8B --draft Qwen/Qwen3-0.6B \
        [--num-steps 32] [--probe-stride 8] [--threshold 0.5 | --lossless] \
        [--max-new-tokens 128] [--max-total-tokens N] [--chat] [--prompts Q ...]

All prompts go to the engine in one `generate` call, so SGLang batches them. Printed: each
answer with its PARSE counters (`meta_info["parse"]`: rounds, draft tokens, tokens accepted
by exact match and by the judge, verify passes), then what the engine reports for the whole
run (`get_server_info()`; PARSE's totals are `internal_states[0]["parse"]`). Without CUDA
the CPU runtime is enabled first (`sglang_cpu.engine_settings()`) and the engine runs
fp32 with torch-native attention.
"""

from __future__ import annotations

import argparse
import json

DEFAULT_PROMPTS = (
    "What is 12 times 7?",
    "Name the largest planet in our solar system.",
    "Write a Python function that returns the square of a number.",
)
# On CPU SGLang sizes the KV pool from system RAM (--mem-fraction-static of it): cap it.
CPU_KV_TOKENS = 8192


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", required=True, help="target model (path or hub id)")
    parser.add_argument("--draft", required=True, help="draft model sharing the target's tokenizer")
    parser.add_argument("--prompts", nargs="+", default=list(DEFAULT_PROMPTS))
    parser.add_argument("--num-steps", type=int, default=32, help="L, draft tokens per round")
    parser.add_argument("--probe-stride", type=int, default=8, help="Δ, a judge probe about every Δ draft tokens")
    judge = parser.add_mutually_exclusive_group()
    judge.add_argument("--threshold", type=float, default=0.5, help="τ, accept a prefix when P(yes) >= τ")
    judge.add_argument("--lossless", action="store_true", help="judge off: output equals the target's greedy output")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument(
        "--max-total-tokens",
        type=int,
        default=None,
        help=f"KV pool size in tokens (default: SGLang's sizing on GPU, {CPU_KV_TOKENS} on CPU)",
    )
    parser.add_argument("--chat", action="store_true", help="wrap each prompt in the target's chat template")
    return parser.parse_args(argv)


def engine_kwargs(args: argparse.Namespace) -> dict:
    """PARSE settings, plus the CPU runtime's settings where there is no CUDA device."""
    import sglang_cpu

    # Without CUDA: enables the CPU runtime (before SGLang's runtime modules are imported)
    # and returns fp32, torch-native attention, no CUDA graphs; {} on a GPU machine.
    cpu_settings = sglang_cpu.engine_settings()
    max_total_tokens = args.max_total_tokens
    if cpu_settings and max_total_tokens is None:
        max_total_tokens = CPU_KV_TOKENS
    parse_config = (
        {"judge": False} if args.lossless else {"judge": True, "judge_mode": "probe", "threshold": args.threshold}
    )
    return dict(
        model_path=args.target,
        speculative_algorithm="PARSE",
        speculative_draft_model_path=args.draft,
        speculative_num_steps=args.num_steps,
        parse_config={**parse_config, "probe_stride": args.probe_stride},
        max_total_tokens=max_total_tokens,
        decode_log_interval=1,  # SGLang folds the accept-length average into server info at each decode log
        log_level="error",
        **cpu_settings,
    )


def chat_prompts(target: str, prompts: list[str]) -> list[str]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target)
    return [
        tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        for p in prompts
    ]


def main(argv=None) -> None:
    args = parse_args(argv)
    kwargs = engine_kwargs(args)
    import sglang

    prompts = chat_prompts(args.target, args.prompts) if args.chat else list(args.prompts)
    sampling_params = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature}
    engine = sglang.Engine(**kwargs)
    try:
        outputs = engine.generate(prompts, sampling_params)
        for question, out in zip(args.prompts, outputs):
            meta = out["meta_info"]
            print(f"Q: {question}")
            print(f"A: {out['text']!r}")
            print(f"   completion_tokens={meta['completion_tokens']} parse={json.dumps(meta.get('parse'))}")
        info = engine.get_server_info()
        state = info["internal_states"][0]
        summary = {
            "speculative_algorithm": info["speculative_algorithm"],
            "speculative_num_steps": info["speculative_num_steps"],
            "avg_spec_accept_length": state.get("avg_spec_accept_length"),
            "last_gen_throughput": state.get("last_gen_throughput"),
            "parse": state.get("parse"),  # PARSE's totals over every request since startup
        }
        print(f"server: {json.dumps(summary)}")
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()
