"""Record a pair's lossless trace: the target's greedy outputs and, at every output position, whether
the draft's greedy token there matches the target's and the draft's confidence in it.

    python benchmarks/trace.py --pair synthetic|useless|smollm2|qwen-gsm|qwen-humaneval|qwen-edit
        [--first 0] [--count 16] [--max-new-tokens 256] [--batch 16] [--out benchmarks/traces/PAIR.json]

Two SGLang engines, one after the other, greedy:
1. the target serves every prompt (batches of --batch; stop tokens as the pair's prompts use them);
2. the draft reads each prompt + output once (`return_logprob`, `top_logprobs_num=1` from the
   prompt's last token): its top-1 token and probability at every output position, given the
   target's text before it (teacher forcing).

Lossless, the draft's chain in a round that starts at output position p is greedy on the committed
text, so it matches the target for a(p) tokens, the run of matches starting at p: that one pass fixes
what any round of any L keeps (`parse_sglang.replay`). Where the draft has parted from the target its
own chain runs on its own token, so the confidences past a round's first mismatch are the teacher-
forced ones (no controller reads them). The target reads its own
outputs the same way as a check (`self_match`: 1.0 in fp32; bf16 near-ties may part).

The qwen-* pairs serve the Qwen2.5-Coder pair on support/problems.py's suites (`problems.suite`,
chat template applied), the prompts `benchmarks/compare.py --suite humaneval|gsm|edit` sends.

The trace (JSON, `parse_sglang.replay.Trace`): per request its prompt length, `match` ("1" where
the draft's token is the target's), `confidence` (per mille), whether it ended at a stop token,
and the token ids of its prompt (`prompt_ids`) and of the target's output (`output_ids`), from
which the replay prices retrieval's copies.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from parse_sglang.tools.backends import connect, teacher_top1  # noqa: E402

PAIRS = ("synthetic", "useless", "smollm2", "qwen-gsm", "qwen-humaneval", "qwen-edit")
SUITES = {"qwen-gsm": "gsm", "qwen-humaneval": "humaneval", "qwen-edit": "edit"}  # support/problems.py's
HERE = Path(__file__).resolve().parent


def load(name: str, first: int, count: int, cache_dir=None):
    """(target, draft, dtype, prompts [ids]) of a pair."""
    if name in ("synthetic", "useless", "smollm2"):
        import adaptive

        pair = adaptive.load_pair(
            name, SimpleNamespace(cache_dir=cache_dir, batches=[first + count], open_loop=False, one_by_one=None)
        )
        return pair.target, pair.draft, pair.dtype, pair.prompts[first : first + count]
    from transformers import AutoTokenizer

    from parse_sglang import models
    from parse_sglang.demo import chat_prompt_ids
    from support import problems

    target, draft = models.pair_checkpoints("qwen2.5-coder", "bfloat16", cache_dir)
    texts, _ = problems.suite(SUITES[name], first, count, cache_dir)
    return str(target), str(draft), "bfloat16", chat_prompt_ids(AutoTokenizer.from_pretrained(target), texts)


def engine_args(model: str, dtype: str, batch: int, context: int) -> dict:
    """`sglang.Engine` arguments for one model of the pair: `batch` requests of `context` tokens."""
    return {
        "model_path": model,
        "dtype": dtype,
        "max_running_requests": batch,
        "context_length": context,
        "mem_fraction_static": 0.5,
        "max_total_tokens": max(8192, batch * context),
    }


def record(name: str, first: int, count: int, max_new: int, batch: int, cache_dir=None, log=print) -> dict:
    target, draft, dtype, prompts = load(name, first, count, cache_dir)
    context = -(-(max(map(len, prompts)) + max_new + 64) // 256) * 256
    params = {"max_new_tokens": max_new, "temperature": 0}
    start = time.perf_counter()
    with connect(None, engine_args(target, dtype, batch, context)) as model:
        outs = []
        for i in range(0, len(prompts), batch):
            outs += model.client.generate(
                input_ids=prompts[i : i + batch], sampling_params=[params] * len(prompts[i : i + batch])
            )
            log(f"trace {name}: target answered {len(outs)}/{len(prompts)} ({time.perf_counter() - start:.0f} s)")
        outputs = [o["output_ids"] for o in outs]
        own, _ = teacher_top1(model.client, prompts, outputs)
    with connect(None, engine_args(draft, dtype, batch, context)) as model:
        drafted, prefill_per_token = teacher_top1(model.client, prompts, outputs)
    log(f"trace {name}: draft read {len(prompts)} outputs ({time.perf_counter() - start:.0f} s)")
    same = sum(t == o for (tokens, _), out in zip(own, outputs) for t, o in zip(tokens, out))
    requests = []
    for prompt, out, o, (tokens, probs) in zip(prompts, outputs, outs, drafted):
        requests.append(
            {
                "prompt_len": len(prompt),
                "match": "".join("1" if t == x else "0" for t, x in zip(tokens, out)),
                "confidence": [round(1000 * p) for p in probs],
                "stopped": o["meta_info"]["finish_reason"]["type"] == "stop",
                "prompt_ids": list(prompt),
                "output_ids": list(out),
            }
        )
    return {
        "pair": name,
        "dtype": dtype,
        "first": first,
        "max_new_tokens": max_new,
        "self_match": same / max(sum(map(len, outputs)), 1),
        "draft_prefill_s_per_token": prefill_per_token,  # a wall-clock figure: the machine file's catch-up
        "command": f"python benchmarks/trace.py --pair {name} --first {first} --count {count} "
        f"--max-new-tokens {max_new} --batch {batch}",  # (no --out / --cache-dir: a machine's paths)
        "requests": requests,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", choices=PAIRS, required=True)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--count", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--out", default=None, help="default: benchmarks/traces/PAIR.json")
    args = parser.parse_args(argv)
    for flag, value in (("count", args.count), ("max-new-tokens", args.max_new_tokens), ("batch", args.batch)):
        if value < 1:
            parser.error(f"--{flag}={value}: allowed is a positive integer")
    if args.first < 0:
        parser.error(f"--first={args.first}: allowed is an integer >= 0")
    trace = record(
        args.pair,
        args.first,
        args.count,
        args.max_new_tokens,
        args.batch,
        args.cache_dir,
        log=lambda line: print(line, file=sys.stderr, flush=True),
    )
    out = Path(args.out or HERE / "traces" / f"{args.pair}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(trace, separators=(",", ":")) + "\n")
    keep = sum(r["match"].count("1") for r in trace["requests"]) / max(
        sum(len(r["match"]) for r in trace["requests"]), 1
    )
    print(
        f"{out}: {len(trace['requests'])} requests, draft matches {keep:.3f} of positions, "
        f"target self-match {trace['self_match']:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
