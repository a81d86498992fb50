"""The adaptive controller's rules, each taken out in turn, replayed over every trace, machine and load.

    python benchmarks/ablation.py [--traces benchmarks/traces/*.json] [--machines benchmarks/machines/*.json]
        [--loads one_by_one batch:8 batch:32 open:0.5] [--only NAME ...] [--noise SIGMA --seeds N]
        [--warm-up pass|bench] [--json] [--against JSONL]

`parse_sglang.replay` serves each trace under each machine's costs with the worker's
`AdaptiveDraftLength` as it is ("full") and with one rule neutralised (`ABLATIONS`: a constant set to
the value at which the rule never fires, or a method that skips it). A cell is tokens/s against
"full" (> 1: the controller does better without the rule). A rule stays where it earns >= 2% on some
cell without costing >= 1% on another (docs/adaptive.md). A cell's figure is `Served.speed`:
tokens/s over a closed load, 1 / mean latency over an open one. No clock: every figure is exact.
--noise SIGMA: each cell under N seeds of a `NoisyMachine` (every priced part times exp(N(0, SIGMA))),
"full" and each rule taken out under the same seed, and no best fixed L (rules a noiseless replay
cannot tell apart may differ in what a busy machine's measurements lead them to). --warm-up bench:
closed batches warmed up and timed as compare.py serves them on an engine (`replay.as_the_bench`).
--against JSONL: each cell's "full" over the same cell of another run's --json lines (the same
arguments at another commit: a change of the controller replayed cell by cell).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from parse_sglang import adaptive  # noqa: E402
from parse_sglang.draft_length import FixedDraftLength  # noqa: E402
from parse_sglang.replay import (  # noqa: E402
    Machine,
    as_the_bench,
    NoisyMachine,
    Trace,
    arrivals_of,
    open_rate,
    policies,
    replay,
    serve,
    serve_as_the_bench,
)
from parse_sglang.settings import ParseConfig  # noqa: E402

HERE = Path(__file__).resolve().parent
MISSING = object()


def _probes_without_catch_up() -> dict:
    """`_explore` judging a probe by its round alone: each drafting tier's seconds less the round's
    catch-up (the value `_best_tier` last asked `_catch_up_seconds` for)."""
    catch_up, explore = adaptive.AdaptiveDraftLength._catch_up_seconds, adaptive.AdaptiveDraftLength._explore

    def kept(self, tokens):
        self._ablation_catch_up = catch_up(self, tokens)
        return self._ablation_catch_up

    def probe(self, best, rate, tokens, seconds):
        less = getattr(self, "_ablation_catch_up", 0.0)
        return explore(self, best, rate, tokens, {t: s - less * (t.kind == "draft") for t, s in seconds.items()})

    return {"AdaptiveDraftLength._catch_up_seconds": kept, "AdaptiveDraftLength._explore": probe}


# name -> {adaptive's attribute ("Class.attr" for a class's): the value at which its rule never fires}
ABLATIONS = {
    "catch-up priced": {"AdaptiveDraftLength._catch_up_seconds": lambda self, tokens: 0.0},
    "a catch-up paid off by what is left": {"OutputEnds.remaining": lambda self, policies: 0.0},  # borne whole
    "probes": {"PROBE_OVERHEAD": 0.0},  # after start-up, tier 0 is never left on a probe
    "probe backoff": {"PROBE_BACKOFF_MAX": 1},
    "a probe charged its catch-up": _probes_without_catch_up(),
    "output ends": {"OutputEnds.going": lambda self, lens, horizon: None},
}


@contextlib.contextmanager
def without(overrides: dict):
    """adaptive's module attributes set to `overrides` inside (class attributes as "Class.name")."""
    saved = {}
    try:
        for key, value in overrides.items():
            owner, name = (getattr(adaptive, key.split(".")[0]), key.split(".")[1]) if "." in key else (adaptive, key)
            saved[owner, name] = owner.__dict__.get(name, MISSING) if isinstance(owner, type) else getattr(owner, name)
            setattr(owner, name, value)
        yield
    finally:
        for (owner, name), value in saved.items():
            if value is MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, value)


def adaptive_speed(trace: Trace, machine: Machine, load: str, config: ParseConfig, bench: bool = False) -> float:
    """`replay`'s adaptive figure alone: one warm-up pass, then the scored one; bench: a closed
    batch warmed up and timed as `compare.py` serves it (`as_the_bench`)."""
    clock = [0.0]
    policy = policies(config, [])["adaptive"](clock)
    if bench:
        return serve_as_the_bench(policy, trace, machine, config, int(load.split(":")[1]), clock).speed(load)
    arrivals, concurrency = arrivals_of(load, len(trace.requests), open_rate(trace, machine, load, config))
    drafted = serve(policy, trace, machine, config, arrivals, concurrency, clock).drafted_last
    return serve(policy, trace, machine, config, arrivals, concurrency, clock, drafting=drafted).speed(load)


def target_speed(trace: Trace, machine: Machine, load: str, config: ParseConfig, bench: bool = False) -> float:
    """The target alone's `Served.speed` at the load (bench: over `as_the_bench`'s timed batch)."""
    if bench:
        trace = as_the_bench(trace, int(load.split(":")[1]))[2]
    arrivals, concurrency = arrivals_of(load, len(trace.requests), open_rate(trace, machine, load, config))
    served = serve(FixedDraftLength(0), trace, machine, config, arrivals, concurrency, target_only=True)
    return served.speed(load)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", nargs="+", default=sorted(str(p) for p in (HERE / "traces").glob("*.json")))
    parser.add_argument("--machines", nargs="+", default=sorted(str(p) for p in (HERE / "machines").glob("*.json")))
    parser.add_argument("--loads", nargs="+", default=["one_by_one", "batch:8", "batch:32", "open:0.5"])
    parser.add_argument("--only", nargs="*", default=None, help="ablations to run (default: all)")
    parser.add_argument("--noise", type=float, default=0.0, help="SIGMA of a NoisyMachine (0: exact)")
    parser.add_argument("--seeds", type=int, default=1, help="seeds of the noise per cell")
    parser.add_argument(
        "--warm-up",
        choices=("pass", "bench"),
        default="pass",
        help="closed batches: a pass of the load, or as_the_bench",
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--against", help="--json lines of the same grid at another commit")
    args = parser.parse_args(argv)
    if args.noise < 0 or args.seeds < 1:
        parser.error(f"--noise={args.noise} --seeds={args.seeds} are invalid: allowed are SIGMA >= 0 and N >= 1")
    if args.warm_up == "bench" and not all(load.startswith("batch:") for load in args.loads):
        parser.error(f"--warm-up bench with --loads {args.loads} is invalid: allowed are closed batches (batch:B)")
    config = ParseConfig.from_dict({"adaptive": True})
    names = ["full", *(args.only if args.only is not None else ABLATIONS)]
    rows = []
    before = [json.loads(line) for line in Path(args.against).read_text().splitlines()] if args.against else None
    for machine_path in args.machines:
        machine = Machine.load(machine_path)
        for trace_path in args.traces:
            trace = Trace.load(trace_path)
            for load, seed in itertools.product(args.loads, range(args.seeds)):
                row = {"machine": Path(machine_path).stem, "trace": trace.pair, "load": load}
                row["trace_file"] = Path(trace_path).stem
                bench = args.warm_up == "bench"
                # the same draws for each policy
                priced = lambda: NoisyMachine.of(machine, args.noise, seed) if args.noise else machine  # noqa: E731
                if args.noise or bench:
                    row.update(noise=args.noise, seed=seed, warm_up=args.warm_up)
                    row["full"] = adaptive_speed(trace, priced(), load, config, bench)
                    row["full_x_target"] = row["full"] / target_speed(trace, priced(), load, config, bench)
                else:
                    full = replay(trace, machine, load, config, [4, 8, 16, 32], oracle=False)
                    row["full"], row["full_x_best_fixed"] = full["adaptive"]["speed"], full["adaptive_x_best_fixed"]
                    row["full_x_target"] = full["adaptive"]["x_target"]
                    row["best_fixed"], row["best_fixed_x_target"] = (
                        full["best_fixed"],
                        full[full["best_fixed"]]["x_target"],
                    )
                for name in names[1:]:
                    with without(ABLATIONS[name]):
                        row[name] = adaptive_speed(trace, priced(), load, config, bench)
                if before is not None:
                    row["against"] = row["full"] / _same_cell(before, len(rows), row, args.against)["full"]
                rows.append(row)
                cells = " ".join(f"{n} {row[n] / row['full']:.3f}" for n in names[1:])
                cells += f" against {row['against']:.3f}" if before is not None else ""
                fixed = f"{row['full_x_best_fixed']:.3f}x best fixed" if "full_x_best_fixed" in row else f"seed {seed}"
                line = (
                    f"{row['machine']:>8} {row['trace']:>15} {load:>10} full {row['full_x_target']:.3f}x target "
                    f"{fixed} | {cells}"
                )
                print(json.dumps(row) if args.json else line, flush=True)
    if not args.json:
        for name in names[1:]:
            ratios = [r[name] / r["full"] for r in rows]
            print(f"{name:>24}: without it {min(ratios):.3f}-{max(ratios):.3f}x full")
        if before is not None:
            ratios = [r["against"] for r in rows]
            print(
                f"full against {args.against}: {min(ratios):.3f}-{max(ratios):.3f}x, "
                f"{sum(r >= 1.02 for r in ratios)} cells >= 2% faster, {sum(r <= 0.99 for r in ratios)} >= 1% slower"
            )
    return 0


def _same_cell(before: list, index: int, row: dict, path: str) -> dict:
    """The index-th line of another run's --json lines, which must be the same cell as `row`."""
    keys = ("machine", "trace", "load", "seed")
    if index >= len(before) or any(before[index].get(k) != row.get(k) for k in keys):
        got = {k: before[index].get(k) for k in keys} if index < len(before) else "no line"
        cell = {k: row.get(k) for k in keys}
        raise SystemExit(
            f"--against {path}: line {index + 1} is {got}, not the cell {cell}: "
            "allowed is --json output of the same arguments"
        )
    return before[index]


if __name__ == "__main__":
    sys.exit(main())
