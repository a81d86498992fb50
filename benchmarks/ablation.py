"""The adaptive controller's rules, each taken out in turn, replayed over every trace, machine and load.

    python benchmarks/ablation.py [--traces benchmarks/traces/*.json] [--machines benchmarks/machines/*.json]
        [--loads one_by_one batch:8 batch:32 open:0.5] [--json]

`parse_sglang.replay` serves each trace under each machine's costs with the worker's
`AdaptiveDraftLength` as it is ("full") and with one rule neutralised (`ABLATIONS`: a constant set to
the value at which the rule never fires, or a method that skips it). A cell is tokens/s against
"full" (> 1: the controller does better without the rule). A rule stays where it earns >= 2% on some
cell without costing >= 1% on another (docs/adaptive.md). A cell's figure is `Served.speed`:
tokens/s over a closed load, 1 / mean latency over an open one. No clock: every figure is exact.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from parse_sglang import adaptive  # noqa: E402
from parse_sglang.replay import Machine, Trace, arrivals_of, open_rate, policies, replay, serve  # noqa: E402
from parse_sglang.settings import ParseConfig  # noqa: E402

HERE = Path(__file__).resolve().parent
MISSING = object()

# name -> {adaptive's attribute ("Class.attr" for a class's): the value at which its rule never fires}
ABLATIONS = {
    "catch-up priced": {"AdaptiveDraftLength._catch_up_seconds": lambda self, tokens: 0.0},
    "probes": {"PROBE_OVERHEAD": 0.0},  # after start-up, tier 0 is never left on a probe
    "probe backoff": {"PROBE_BACKOFF_MAX": 1},
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


def adaptive_speed(trace: Trace, machine: Machine, load: str, config: ParseConfig) -> float:
    """`replay`'s adaptive figure alone: one warm-up pass, then the scored one."""
    arrivals, concurrency = arrivals_of(load, len(trace.requests), open_rate(trace, machine, load, config))
    clock = [0.0]
    policy = policies(config, [])["adaptive"](clock)
    serve(policy, trace, machine, config, arrivals, concurrency, clock)
    return serve(policy, trace, machine, config, arrivals, concurrency, clock).speed(load)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", nargs="+", default=sorted(str(p) for p in (HERE / "traces").glob("*.json")))
    parser.add_argument("--machines", nargs="+", default=sorted(str(p) for p in (HERE / "machines").glob("*.json")))
    parser.add_argument("--loads", nargs="+", default=["one_by_one", "batch:8", "batch:32", "open:0.5"])
    parser.add_argument("--only", nargs="*", default=None, help="ablations to run (default: all)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    config = ParseConfig.from_dict({"adaptive": True})
    names = ["full", *(args.only if args.only is not None else ABLATIONS)]
    rows = []
    for machine_path in args.machines:
        machine = Machine.load(machine_path)
        for trace_path in args.traces:
            trace = Trace.load(trace_path)
            for load in args.loads:
                row = {"machine": Path(machine_path).stem, "trace": trace.pair, "load": load}
                full = replay(trace, machine, load, config, [4, 8, 16, 32], oracle=False)
                row["full"], row["full_x_best_fixed"] = full["adaptive"]["speed"], full["adaptive_x_best_fixed"]
                row["full_x_target"] = full["adaptive"]["x_target"]
                for name in names[1:]:
                    with without(ABLATIONS[name]):
                        row[name] = adaptive_speed(trace, machine, load, config)
                rows.append(row)
                cells = " ".join(f"{n} {row[n] / row['full']:.3f}" for n in names[1:])
                line = (
                    f"{row['machine']:>8} {row['trace']:>15} {load:>10} full {row['full_x_target']:.3f}x target "
                    f"{row['full_x_best_fixed']:.3f}x best fixed | {cells}"
                )
                print(json.dumps(row) if args.json else line, flush=True)
    if not args.json:
        for name in names[1:]:
            ratios = [r[name] / r["full"] for r in rows]
            print(f"{name:>24}: without it {min(ratios):.3f}-{max(ratios):.3f}x full")
    return 0


if __name__ == "__main__":
    sys.exit(main())
