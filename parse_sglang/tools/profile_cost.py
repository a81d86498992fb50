"""`python -m parse_sglang.tools.profile_cost`: measure what a PARSE round costs at each adaptive
tier and batch size on this machine, print the table, and write it for `cost_table`.

    python -m parse_sglang.tools.profile_cost --model-path T --draft-model-path D [--num-steps 32]
        [--parse-config JSON] [--tiers 0 8 32] [--batch 1 8 32] [--max-new-tokens 48]
        [--context-tokens N] [--out costs.json] [--engine-arg KEY=VALUE ...]

For each tier t one adaptive engine whose only tier is t (L = t; for tier 0, L = 1 and tiers
{0, 1}: L >= 1, so its rounds run at most 2 decode steps; the table keeps their rest per step,
as a server with any `tier0_steps` does; tier 0 one engine per batch size) serves batches of
concurrent requests of each size; its worker measures its own rounds (`adaptive.CostTable`: the
first round of a cell is a warm-up, not counted) and reports the table through `get_server_info()`; the tables are merged (a cell
measured by several engines: the last). Each request's prompt is PROMPT, or with
`--context-tokens N` PROMPT's tokens repeated to N: a round's cost grows with the context it
attends to, so a table meant to price a workload is measured at its contexts' mean length. Then

    --parse-config '{"adaptive": true, "cost_table": "costs.json"}'

makes a server use it, fixed (its choices then depend only on the acceptance it sees). On a
machine without CUDA the CPU runtime is turned on (cpu_runtime/, `sglang_cpu`); `--engine-arg` passes any
other `sglang.Engine` keyword (value parsed as JSON where it parses).
"""

from __future__ import annotations

import argparse
import json
import sys
from types import SimpleNamespace
from typing import Optional, Sequence

from parse_sglang.cost_table import CostTable
from parse_sglang.settings import ParseConfig, server_parse_config

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def _engine_arg(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--engine-arg {text!r} is invalid: allowed is KEY=VALUE")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def prompt_ids(model_path: str, context_tokens: Optional[int]) -> list[int]:
    """PROMPT's token ids (the target's tokenizer), with `context_tokens` repeated and cut to it."""
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(model_path).encode(PROMPT)
    return ids if context_tokens is None else (ids * (context_tokens // len(ids) + 1))[:context_tokens]


def profile(
    engine_kwargs: dict, config: ParseConfig, batches: Sequence[int], max_new_tokens: int, prompt: list[int]
) -> CostTable:
    """The merged table of one adaptive engine per tier (module docstring); every request's prompt
    is the token ids `prompt`."""
    import sglang

    from parse_sglang.settings import parse_engine_kwargs

    merged = CostTable()
    sampling = {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True}
    # Tier 0's engine (tiers 0 and 1) runs tier 0 only where its controller chooses it: one that
    # measured batch 1 first priced batch 8's tier 0 from batch 1's cells and never ran it there.
    # An engine per batch size measures it at each (its start-up runs L = 1, then tier 0).
    runs = [(tier, sizes) for tier in config.tiers for sizes in ([[b] for b in batches] if tier == 0 else [batches])]
    for tier, sizes in runs:
        values = {"adaptive": True, "adaptive_tiers": [tier], "cost_table": "", "draft_budget": max(tier, 1)}
        tier_config = ParseConfig.from_dict(values, base=config)
        engine = sglang.Engine(
            **{**engine_kwargs, **parse_engine_kwargs(engine_kwargs["speculative_draft_model_path"], tier_config)}
        )
        try:
            for batch in sizes:
                engine.generate(input_ids=[prompt] * batch, sampling_params=sampling)
            state = engine.get_server_info()["internal_states"][0]["parse"]
        finally:
            engine.shutdown()
        table = state["cost_table"]
        for cell in table["draft"]:
            merged.draft[cell["bucket"], cell["L"]] = cell["seconds"]
        for cell in table["rest"]:
            merged.rest[cell["bucket"], cell["rows"]] = cell["seconds"]
    return merged


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m parse_sglang.tools.profile_cost", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--draft-model-path", required=True)
    parser.add_argument("--num-steps", type=int, default=ParseConfig.draft_budget, help="L, the longest tier")
    parser.add_argument("--parse-config", default="{}", help="the server's other PARSE settings (JSON)")
    parser.add_argument("--tiers", type=int, nargs="+", help="default: an adaptive server's (L = 32: 0 8 32)")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--context-tokens", type=int, help="each prompt's length in tokens (default: PROMPT's own)")
    parser.add_argument("--out", help="write the table here (JSON, for cost_table)")
    parser.add_argument("--engine-arg", type=_engine_arg, action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    for flag in ("batch", "max_new_tokens", "context_tokens"):
        values = getattr(args, flag)
        if values is not None and any(v < 1 for v in (values if isinstance(values, list) else [values])):
            parser.error(f"--{flag.replace('_', '-')}={values} is invalid: allowed are integers >= 1")

    try:
        values = {**json.loads(args.parse_config), "adaptive": True, "cost_table": ""}
        if args.tiers:
            values["adaptive_tiers"] = args.tiers
        config = server_parse_config(SimpleNamespace(_parse_config=values), args.num_steps)
    except (ValueError, TypeError) as err:  # a JSON error is a ValueError too
        parser.error(f"--num-steps / --tiers / --parse-config: {err}")
    import torch

    from parse_sglang import cpu_engine_settings

    engine = dict(
        model_path=args.model_path,
        speculative_draft_model_path=args.draft_model_path,
        log_level="error",
        max_running_requests=max(args.batch),
    )
    if not torch.cuda.is_available():
        engine.update(cpu_engine_settings(), max_total_tokens=max(16384, 4 * max(args.batch) * 512))
    engine.update(dict(args.engine_arg))
    table = profile(engine, config, args.batch, args.max_new_tokens, prompt_ids(args.model_path, args.context_tokens))
    print(table.describe())
    if args.out:
        with open(args.out, "w") as f:
            json.dump(table.to_json(), f, indent=1)
        print(f'written: {args.out} (use it with --parse-config \'{{"adaptive": true, "cost_table": "{args.out}"}}\')')
    else:
        print(json.dumps(table.to_json()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
