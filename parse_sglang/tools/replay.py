"""The replay's command (`parse_sglang.replay`): replay traces under a machine's costs, or write a
machine file from `parse_sglang.tools.profile_cost` tables.

    python -m parse_sglang.tools.replay run TRACE.json [...] --machine MACHINE.json [--batches 8 32]
        [--no-one-by-one] [--open-loop F] [--tiers 0 8 32] [--fixed 4 8 16 32] [--no-retrieval] [--json]
    python -m parse_sglang.tools.replay machine --tables COSTS.json [...] [--context-tokens N [...]]
        --catch-up FIXED_S PER_TOKEN_S --source TEXT --out MACHINE.json [--batch-sizes bucket|line]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from parse_sglang.cost_table import CostTable
from parse_sglang.replay import Machine, Trace, replay
from parse_sglang.settings import ParseConfig


def make_machine(
    tables: Sequence[str],
    catch_up_fixed: float,
    catch_up_per_token: float,
    source: str,
    batch_sizes: str = "bucket",
    contexts: Sequence[int] = (),
) -> dict:
    """A machine file's JSON: `profile_cost` tables merged (a cell in several: the last), or with
    `contexts` each table the costs at its context length (`Machine.contexts`, one per table, two or
    more); the catch-up; how batch sizes between the measured ones are priced (`Machine.batch_line`)."""
    if contexts and (len(contexts) != len(tables) or len(set(contexts)) < 2):
        raise ValueError(
            f"--context-tokens {' '.join(map(str, contexts))} is invalid for {len(tables)} tables: allowed is one "
            "context length per table, two or more different"
        )
    if contexts:
        made = {
            "tables": [{"context_tokens": c, "table": CostTable.load(p).to_json()} for c, p in zip(contexts, tables)]
        }
    else:
        merged = CostTable()
        for path in tables:
            table = CostTable.load(path)
            merged.draft.update(table.draft)
            merged.rest.update(table.rest)
            merged.head.update(table.head)
        made = {"table": merged.to_json()}
    return {
        "source": source,
        **made,
        "catch_up_fixed": catch_up_fixed,
        "catch_up_per_token": catch_up_per_token,
        "batch_sizes": batch_sizes,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m parse_sglang.tools.replay",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="replay traces under a machine's costs")
    run.add_argument("traces", nargs="+")
    run.add_argument("--machine", required=True, help="cost JSON (`Machine.load`)")
    run.add_argument("--batches", type=int, nargs="*", default=[8, 32])
    run.add_argument("--no-one-by-one", action="store_true")
    run.add_argument(
        "--open-loop", type=float, default=None, help="F: arrivals at F x the target's closed batch-8 rate"
    )
    run.add_argument("--fixed", type=int, nargs="+", default=[4, 8, 16, 32])
    run.add_argument("--tiers", type=int, nargs="+", default=None, help="the adaptive tiers (default: the package's)")
    run.add_argument(
        "--no-retrieval", action="store_true", help="adaptive without copies (a trace with token ids prices them)"
    )
    run.add_argument("--json", action="store_true")
    machine = sub.add_parser("machine", help="write a machine file from profile_cost tables")
    machine.add_argument("--tables", nargs="+", required=True, help="profile_cost --out files, later ones winning")
    machine.add_argument(
        "--context-tokens",
        type=int,
        nargs="+",
        default=(),
        help="each table's --context-tokens: a round priced on a line in its context (default: the tables merged)",
    )
    machine.add_argument("--catch-up", type=float, nargs=2, metavar=("FIXED_S", "PER_TOKEN_S"), required=True)
    machine.add_argument("--source", required=True, help="what was measured, where and how")
    machine.add_argument("--out", required=True)
    machine.add_argument(
        "--batch-sizes",
        choices=("bucket", "line"),
        default="bucket",
        help="a batch size between measured ones: its bucket's cost, or a line through the two nearest",
    )
    args = parser.parse_args(argv)
    if args.command == "machine":
        try:
            made = make_machine(args.tables, *args.catch_up, args.source, args.batch_sizes, args.context_tokens)
        except ValueError as err:
            parser.error(str(err))
        Path(args.out).write_text(json.dumps(made, indent=1) + "\n")
        return 0
    config = ParseConfig.from_dict(
        {"adaptive": True, "retrieval": not args.no_retrieval, **({"adaptive_tiers": args.tiers} if args.tiers else {})}
    )
    machine = Machine.load(args.machine)
    loads = ([] if args.no_one_by_one else ["one_by_one"]) + [f"batch:{b}" for b in args.batches]
    loads += [f"open:{args.open_loop}"] if args.open_loop else []
    for path in args.traces:
        trace = Trace.load(path)
        for load in loads:
            row = replay(trace, machine, load, config, args.fixed)
            if args.json:
                print(json.dumps(row))
                continue
            cells = "  ".join(
                f"{k} {v['x_target']:.3f}" for k, v in row.items() if isinstance(v, dict) and "x_target" in v
            )
            print(
                f"{trace.pair:>16} {load:>11}  {cells}  adaptive/best fixed ({row['best_fixed']}) "
                f"{row['adaptive_x_best_fixed']:.3f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
