"""How many verify passes an exact greedy chain draft of L tokens a round needs for an engine's
outputs, with the draft reading the whole context and with it reading the context less its first
token, beside the passes the engines of a compare.py run counted.

    python benchmarks/draft_context.py --cells benchmarks/runs/compare-parity-humaneval-40.jsonl \
        [--batch 1] [--repeat 0] [--L 8] --out benchmarks/runs/draft-context-humaneval-40.json

Why: SGLang's STANDALONE drafts with EAGLE's draft worker, whose draft prefill shifts each request's
input ids left by one (`EagleDraftWorker._draft_extend_for_prefill`: EAGLE's draft reads token
p + 1 beside the target's hidden state p). A standalone draft model has no hidden state to pair:
it reads tokens 1 .. P at positions 0 .. P - 1, its context without its first token. PARSE's draft
reads the whole context. Both are greedy chains of L draft tokens a round, verified by the same
target, so with the same draft model the only difference in what they accept is that token.

Offline (transformers, the cells' dtype, no engine): for each problem, from the target's output of
the chosen cell (`parse_fixed_L`'s, which equals target-only's where the run was lossless), rounds
are replayed as a lossless chain speculator runs them: the draft's greedy L tokens from the
committed context, the longest prefix equal to the output kept, plus one token. Printed and
written per problem: the rounds with the whole context and without its first token, and the
cells' `verify_passes` of parse_fixed_L and standalone_L (summed over the problems: a cell holds
only the sum).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import compare  # noqa: E402
from support.reference import hf_greedy  # noqa: E402


def chain_rounds(draft, context: list[int], output: list[int], length: int) -> list[int]:
    """The accepted draft tokens of each round of a lossless greedy chain speculator at draft
    length `length` producing `output` after `context` (output[0] is the prefill's token)."""
    committed, accepted = 1, []
    while committed < len(output):
        # a chain draft does not stop at an end-of-sequence token
        drafted = hf_greedy(draft, context + output[:committed], length, ignore_eos=True)
        kept = 0
        while kept < length and committed + kept < len(output) and drafted[kept] == output[committed + kept]:
            kept += 1
        accepted.append(kept)
        committed += kept + 1
    return accepted


def cell_of(cells: list[dict], row: str, batch: int, repeat: int) -> dict:
    """The one cell of `row` at `batch` in pass `repeat`."""
    found = [c for c in cells if c["row"] == row and c["batch"] == batch and c["repeat"] == repeat]
    if len(found) != 1:
        raise ValueError(f"--cells: {len(found)} cells of row {row!r}, batch {batch}, pass {repeat}: allowed is one")
    return found[0]


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", required=True, help="a compare.py run with parse_fixed_L and standalone_L rows")
    parser.add_argument("--batch", type=int, default=1, help="the load whose cells are read")
    parser.add_argument("--repeat", type=int, default=0, help="the pass whose cells are read")
    parser.add_argument("--L", type=int, default=8, help="the draft length (parse_fixed_L's and standalone_L's)")
    parser.add_argument("--out", help="the per-problem rounds, JSON")
    args = parser.parse_args(argv)
    cells = compare.read_cells([args.cells])
    parse_cell = cell_of(cells, "parse_fixed_L", args.batch, args.repeat)
    standalone_cell = cell_of(cells, f"standalone_{args.L}", args.batch, args.repeat)
    if parse_cell["L"] != args.L:
        raise ValueError(f"--L {args.L}: the cells' parse_fixed_L ran at L = {parse_cell['L']}")
    bench = compare.parse_args(
        ["--suite", parse_cell["suite"], "--first", str(parse_cell["first"]), "--num-problems",
         str(parse_cell["num_problems"]), "--dtype", parse_cell["dtype"], "--max-new-tokens",
         str(parse_cell["max_new_tokens"]), "--out", "unused.jsonl"]
    )  # fmt: skip
    work = compare.load_workload(bench)
    from transformers import AutoModelForCausalLM

    draft = AutoModelForCausalLM.from_pretrained(work.draft, dtype=getattr(torch, work.dtype))
    problems = []
    for k, (prompt, output) in enumerate(zip(work.prompt_ids, parse_cell["output_ids"])):
        whole = chain_rounds(draft, list(prompt), output, args.L)
        shifted = chain_rounds(draft, list(prompt)[1:], output, args.L)
        problems.append({"problem": bench.first + k, "whole_context": whole, "without_first_token": shifted})
        print(
            f"problem {bench.first + k}: rounds {len(whole)} (whole context), {len(shifted)} (without its first token)"
        )
    result = {
        "cells": args.cells,
        "batch": args.batch,
        "repeat": args.repeat,
        "L": args.L,
        "dtype": work.dtype,
        "rounds_whole_context": sum(len(p["whole_context"]) for p in problems),
        "rounds_without_first_token": sum(len(p["without_first_token"]) for p in problems),
        "verify_passes_parse_fixed_L": parse_cell["verify_passes"],
        f"verify_passes_standalone_{args.L}": standalone_cell["verify_passes"],
        "problems": problems,
    }
    print({k: v for k, v in result.items() if k != "problems"})
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
