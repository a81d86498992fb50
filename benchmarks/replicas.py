"""Data-parallel replicas: 1 vs 2 (`dp_size`), each pinned to a core, for the target alone and PARSE.

    python benchmarks/replicas.py [--requests 32] [--max-new-tokens 64] [--repeats 3] [--steps 8] [--json F]

The synthetic trained pair (support.synthetic: a stand-in with real weights, not evidence about
large models) serves `--requests` of its held-out problems at once, greedy, stopping at EOS, from
one `sglang.Engine` per (mode, layout), one engine at a time:
  layouts  1 replica on core 0 (SGLANG_CPU_OMP_THREADS_BIND="0"), and 2 replicas (`dp_size=2`),
           one per core ("0|1"): SGLang's data-parallel controller hands each request to a replica
  modes    target_only; parse_lossless (judge off); parse_judged (likelihood judge, λ = the demo's);
           both PARSE modes with `adaptive: true`, L = --steps
Each engine serves the batch once to warm up, then --repeats times timed; a row is the median
tokens/s. Ratios: `x_replicas` = 2 replicas / 1 replica of the same mode; `x_target_only` = the
mode / target_only in the same layout. Engines run one after another, minutes apart: on a shared
2-core machine, read ratios to ±15%.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # gpu_serving
sys.path.insert(0, str(HERE.parent))  # this checkout's parse_sglang and support
import gpu_serving  # noqa: E402
from parse_sglang.demo import table  # noqa: E402
from parse_sglang.settings import ParseConfig, parse_engine_kwargs  # noqa: E402

LAYOUTS = {1: "0", 2: "0|1"}  # replicas -> the cores they are pinned to


def modes(draft: str, steps: int) -> dict[str, dict]:
    def parse(**judge) -> dict:
        return parse_engine_kwargs(draft, ParseConfig(draft_budget=steps, adaptive=True, **judge))

    return {
        "target_only": {},
        "parse_lossless": parse(judge=False),
        "parse_judged": parse(judge_mode="likelihood", likelihood_threshold=gpu_serving.LIKELIHOOD_THRESHOLD),
    }


def engine_settings(args) -> dict:
    """What every engine shares: the CPU runtime's settings on a machine without CUDA, the radix
    cache off (each timed run prefills its prompts again), room for the whole batch."""
    import torch

    from parse_sglang import cpu_engine_settings

    kwargs = dict(log_level="error", disable_radix_cache=True, max_running_requests=args.requests, sleep_on_idle=True)
    if not torch.cuda.is_available():
        kwargs.update(cpu_engine_settings(), mem_fraction_static=0.5, max_total_tokens=16384)
    return kwargs


def run(pair, settings: dict, replicas: int, args) -> dict:
    import sglang
    import torch

    if not torch.cuda.is_available():  # a GPU replica has its own GPU
        from sglang_cpu import CPU_BIND_ENV

        os.environ[CPU_BIND_ENV] = LAYOUTS[replicas]  # the scheduler processes inherit it
    kwargs = {"dtype": pair.dtype, **engine_settings(args), **settings}
    engine = sglang.Engine(model_path=pair.target, dp_size=replicas, **kwargs)
    params = {"temperature": 0.0, "max_new_tokens": args.max_new_tokens}
    try:
        engine.generate(input_ids=pair.prompts, sampling_params=params)  # warm-up (an adaptive server's costs)
        rates, outputs = [], None
        for _ in range(args.repeats):
            start = time.perf_counter()
            outs = engine.generate(input_ids=pair.prompts, sampling_params=params)
            seconds = time.perf_counter() - start
            rates.append(sum(o["meta_info"]["completion_tokens"] for o in outs) / seconds)
            outputs = outputs or [o["output_ids"] for o in outs]
        states = [s.get("parse", {}) for s in engine.get_server_info()["internal_states"]]
    finally:
        engine.shutdown()
    return {
        "tokens_per_s": statistics.median(rates),
        "tokens_per_s_runs": rates,
        "replica_rounds": [s.get("rounds", 0) for s in states],
        "outputs": outputs,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/replicas.py", description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8, help="L of the PARSE modes")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    pair = gpu_serving.load_pair(
        "synthetic", SimpleNamespace(cache_dir=args.cache_dir, synthetic_dtype="float32"), args.requests
    )
    results = {
        (mode, replicas): run(pair, settings, replicas, args)
        for mode, settings in modes(pair.draft, args.steps).items()
        for replicas in LAYOUTS
    }
    rows = []
    for (mode, replicas), r in results.items():
        base = results["target_only", replicas]
        rows.append(
            {
                "mode": mode,
                "replicas": replicas,
                "tokens_per_s": r["tokens_per_s"],
                "x_replicas": r["tokens_per_s"] / results[mode, 1]["tokens_per_s"],
                "x_target_only": r["tokens_per_s"] / base["tokens_per_s"],
                "equal_to_target_only": r["outputs"] == base["outputs"] if mode != "parse_judged" else None,
                "replica_rounds": r["replica_rounds"],
                "tokens_per_s_runs": r["tokens_per_s_runs"],
            }
        )
    print(
        f"synthetic pair, {args.requests} requests, max_new_tokens={args.max_new_tokens}, L={args.steps}, "
        f"{args.repeats} timed runs each"
    )
    header = ["mode", "replicas", "tokens/s", "x 1 replica", "x target_only", "== target_only", "rounds per replica"]
    print(
        table(
            header,
            [
                [
                    row["mode"],
                    str(row["replicas"]),
                    f"{row['tokens_per_s']:.0f}",
                    f"{row['x_replicas']:.2f}",
                    f"{row['x_target_only']:.2f}",
                    str(row["equal_to_target_only"]),
                    "/".join(map(str, row["replica_rounds"])),
                ]
                for row in rows
            ],
        )
    )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
