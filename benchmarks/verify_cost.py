"""Verify cost: one PARSE pass with K probes vs K sequential judge passes vs a plain draft prefill.

All three start from the same committed context already in the target's KV cache and
read the same answers (next-token logits after every draft prefix; the judge's answer
after every boundary-ending prefix), on Hugging Face models on this machine:

  parse       ONE forward over [c_n, d_1..d_L, K probe blocks] with the PARSE mask
  sequential  K forwards (SpecReason-style): extend the draft to b_k, append the probe,
              read the answer, drop the probe's KV, go on
  prefill     ONE forward over [c_n, d_1..d_L] — token-level verification, no judge

Run:  python benchmarks/verify_cost.py [--target DIR] [--context 256] [--draft 64] [--stride 8]
Without --target a tiny random Llama is built in a temp dir (shapes only, not a real model).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's `support` package
from parse_sglang.judge import build_judge_probe  # noqa: E402
from support.reference import _masked_forward, _window  # noqa: E402
from support.tiny_models import build_model  # noqa: E402


def _median_ms(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _prefilled_cache(model, context):
    cache = DynamicCache()
    with torch.no_grad():
        model(torch.tensor([context[:-1]]), past_key_values=cache, use_cache=True)
    return cache


def _crop(cache, length):
    excess = cache.get_seq_length() - length
    if excess > 0:
        cache.crop(-excess)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", help="HF model directory (default: a tiny random Llama)")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--draft", type=int, default=64)
    parser.add_argument("--stride", type=int, default=8, help="a probe every `stride` draft tokens")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target_dir = args.target or build_model(tempfile.mkdtemp() + "/tiny", hidden_size=256, num_layers=4)
    tok = AutoTokenizer.from_pretrained(target_dir)
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    suffix = list(build_judge_probe(tok).suffix_ids)
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    context = torch.randint(0, vocab, (args.context,), generator=gen).tolist()
    draft = torch.randint(0, vocab, (args.draft,), generator=gen).tolist()
    bounds = list(range(args.stride, args.draft, args.stride)) + [args.draft]
    prefix_len = len(context) - 1
    cache = _prefilled_cache(model, context)

    layout, allowed, rows = _window(prefix_len, context[-1], draft, bounds, suffix)

    @torch.no_grad()
    def parse_pass():
        _masked_forward(model, layout.input_ids, layout.positions, allowed, rows, cache)
        _crop(cache, prefix_len)

    @torch.no_grad()
    def sequential_passes():
        done = 0
        pending = [context[-1]]
        for b in bounds:
            ids = pending + draft[done:b] + suffix
            model(torch.tensor([ids]), past_key_values=cache, use_cache=True, logits_to_keep=len(ids))
            _crop(cache, prefix_len + 1 + b)  # keep c_n, d_1..d_b; drop the probe
            done, pending = b, []
        _crop(cache, prefix_len)

    @torch.no_grad()
    def plain_prefill():
        model(torch.tensor([[context[-1]] + draft]), past_key_values=cache, use_cache=True)
        _crop(cache, prefix_len)

    results = [
        ("parse (1 pass)", 1, int(layout.window_lens[0]), _median_ms(parse_pass, args.repeats)),
        (
            f"sequential ({len(bounds)} passes)",
            len(bounds),
            1 + args.draft + len(bounds) * len(suffix),
            _median_ms(sequential_passes, args.repeats),
        ),
        ("plain draft prefill", 1, 1 + args.draft, _median_ms(plain_prefill, args.repeats)),
    ]
    base = results[0][3]
    print(
        f"model={args.target or 'tiny random llama (hidden 256, 4 layers)'} context={args.context} "
        f"L={args.draft} K={len(bounds)} m={len(suffix)} threads={args.threads}"
    )
    print("| method | target forwards | rows | median ms | vs parse |")
    print("| --- | --- | --- | --- | --- |")
    for name, passes, nrows, ms in results:
        print(f"| {name} | {passes} | {nrows} | {ms:.1f} | {ms / base:.2f}x |")


if __name__ == "__main__":
    main()
