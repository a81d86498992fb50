"""Where one PARSE round's time goes, inside SGLang, next to a target-only decode step.

One `sglang.Engine` serves a prompt target-only (greedy), then one serves it with PARSE at
the given settings (default: PARSE's defaults, L = 32, Δ = 8, judge on, τ = 0.5). The PARSE
engine's scheduler loads `benchmarks/round_timer/sitecustomize.py`, which times each step
of `ParseWorker._round` (CUDA-synchronised on a GPU). Printed: the verify window
(N_max = 1 + L + K_max·m), milliseconds per round for each step, and the round's cost in
target-only decode steps next to the tokens it yields.

Run:  python benchmarks/round_cost.py [--target DIR --draft DIR] [--steps 32] [--probe-stride 8]
                                      [--threshold 0.5 | --lossless] [--max-new-tokens 64]
Without --target/--draft: SmolLM2-135M-Instruct and its layer-dropped draft (parse_sglang.smollm2).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from parse_sglang.config import ParseConfig
from parse_sglang.cpu import engine_settings
from parse_sglang.demo import parse_engine_kwargs

TIMER_DIR = Path(__file__).resolve().parent / "round_timer"
STEP_NAMES = {
    "_draft": "draft: L+1 decode steps of the draft model",
    "_plan_window": "boundaries, probes, verify layout",
    "_verify": "ONE target verify forward (chain + probe rows)",
    "_accept": "acceptance (exact match, judge scores)",
    "_record_stats": "counters",
    "_update_target_phases": "after-rejection bookkeeping",
    "_result": "result for the scheduler",
}


def timed_generate(engine_kwargs: dict, prompt: str, sampling: dict) -> tuple[dict, float]:
    import sglang

    engine = sglang.Engine(**engine_kwargs)
    try:
        engine.generate(prompt, {**sampling, "max_new_tokens": 4})  # warm-up
        start = time.perf_counter()
        out = engine.generate(prompt, sampling)
        return out, time.perf_counter() - start
    finally:
        engine.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target")
    parser.add_argument("--draft")
    parser.add_argument("--steps", type=int, default=ParseConfig.draft_budget, help="L")
    parser.add_argument("--probe-stride", type=int, default=ParseConfig.probe_stride, help="Δ")
    judge = parser.add_mutually_exclusive_group()
    judge.add_argument("--threshold", type=float, default=ParseConfig.threshold, help="τ")
    judge.add_argument("--lossless", action="store_true", help="judge off")
    parser.add_argument("--prompt", default="Explain in a few sentences why the sky is blue.")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    if (args.target is None) != (args.draft is None):
        parser.error("--target and --draft go together")
    if args.target is None:
        from parse_sglang import smollm2

        args.target, args.draft = map(str, smollm2.model_pair())
    config = ParseConfig(draft_budget=args.steps, probe_stride=args.probe_stride, threshold=args.threshold,
                         judge=not args.lossless)
    common = dict(engine_settings(), model_path=args.target, log_level="error", max_running_requests=1)
    from parse_sglang.settings import judge_probe_for, max_probes, verify_window_max  # imports SGLang: after the CPU runtime

    suffix_len = len(judge_probe_for(args.target, config.judge_question).suffix_ids) if config.judge else 0
    if common.get("device") == "cpu":
        common.update(mem_fraction_static=0.5, max_total_tokens=8192)
    sampling = {"temperature": 0.0, "max_new_tokens": args.max_new_tokens, "ignore_eos": True}
    base, base_s = timed_generate(common, args.prompt, sampling)

    timer_out = Path(tempfile.mkdtemp()) / "round_timer.json"
    os.environ["PARSE_ROUND_TIMER_OUT"] = str(timer_out)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TIMER_DIR), os.environ.get("PYTHONPATH")]))
    out, parse_s = timed_generate({**common, **parse_engine_kwargs(args.draft, config)}, args.prompt, sampling)
    timer = json.loads(timer_out.read_text())

    # The timer counts every round since start-up (warm-up included); the request's own
    # rounds come from its counters, so per-round figures use the timer's totals / calls.
    seconds, calls = timer["seconds"], timer["calls"]
    rounds = calls["_round"]
    step_ms = base_s / (base["meta_info"]["completion_tokens"] - 1) * 1e3  # prefill gave token 1 (~ its share)
    round_ms = seconds["_round"] / rounds * 1e3
    stats = out["meta_info"]["parse"]
    tokens_per_round = (out["meta_info"]["completion_tokens"] - 1) / stats["rounds"]
    print(f"target={args.target}\ndraft={args.draft}\n"
          f"L={config.draft_budget} Δ={config.probe_stride} judge={'on, τ=' + str(config.threshold) if config.judge else 'off'} "
          f"m={suffix_len} K_max={max_probes(config)} N_max={verify_window_max(config, suffix_len)} rows; "
          f"{args.max_new_tokens} tokens, batch 1, {common.get('device', 'cuda')}\n")
    print("| step of a round | ms per round | share |")
    print("| --- | --- | --- |")
    for name, label in STEP_NAMES.items():
        ms = seconds[name] / max(calls[name], 1) * 1e3
        print(f"| {label} | {ms:.1f} | {ms / round_ms:.0%} |")
    print(f"| whole round | {round_ms:.1f} | 100% |\n")
    print(f"target-only decode step: {step_ms:.1f} ms; one PARSE round = {round_ms / step_ms:.1f} target-only steps "
          f"and yields {tokens_per_round:.2f} tokens (this request: {stats['rounds']} rounds, "
          f"{stats['accepted_exact']} exact + {stats['accepted_judged']} judged of {stats['draft_tokens']} draft tokens)")
    print(f"wall: target-only {base_s:.1f} s, PARSE {parse_s:.1f} s for {args.max_new_tokens} tokens")


if __name__ == "__main__":
    main()
