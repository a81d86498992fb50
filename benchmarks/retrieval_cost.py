"""What retrieval costs the host per request-round (parse_sglang/retrieval.py): `Retrieval.propose`
over requests whose prompts are P tokens, each round committing a tokens, with the corpus full.

    python benchmarks/retrieval_cost.py [--prompt-tokens 512 2048 8192] [--rounds 200] [--accepted 4]
        [--corpus-tokens 16384] [--vocab 32000] [--seed 0]

Per prompt length: the first round (the prompt indexed once) and the median of the later rounds
(what a round's lookups cost: the committed tokens indexed, the request's own match, the corpus
match over its last CORPUS_MATCH tokens), in microseconds, one request; tokens drawn from a
vocabulary of --vocab ids with repeats (a code-like text: a random walk over a small window).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from parse_sglang.retrieval import Retrieval  # noqa: E402


def text(rng: random.Random, n: int, vocab: int) -> list[int]:
    """n tokens that repeat themselves as code does: runs copied from earlier, or fresh ids."""
    out = [rng.randrange(vocab) for _ in range(8)]
    while len(out) < n:
        if rng.random() < 0.5:
            start = rng.randrange(len(out))
            out += out[start : start + rng.randrange(2, 16)]
        else:
            out.append(rng.randrange(vocab))
    return out[:n]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-tokens", type=int, nargs="+", default=[512, 2048, 8192])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--accepted", type=int, default=4, help="tokens a round commits")
    parser.add_argument("--corpus-tokens", type=int, default=16384)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    print(f"{'prompt':>7} {'first round us':>15} {'later rounds us (median)':>25}")
    for prompt_tokens in args.prompt_tokens:
        retrieval = Retrieval(min_match=3, corpus_tokens=args.corpus_tokens)
        while len(retrieval.corpus.index.tokens) < args.corpus_tokens - 600:
            retrieval.corpus.add(text(rng, 512, args.vocab))
        body = text(rng, prompt_tokens + args.rounds * args.accepted, args.vocab)
        req = SimpleNamespace(rid="r", origin_input_ids=body[:prompt_tokens], output_ids=[], finished=lambda: False)
        seconds = []
        for r in range(args.rounds):
            start = time.perf_counter()
            retrieval.propose([req], [32])
            seconds.append(time.perf_counter() - start)
            req.output_ids = body[prompt_tokens : prompt_tokens + (r + 1) * args.accepted]
        print(f"{prompt_tokens:>7} {seconds[0] * 1e6:>15.0f} {statistics.median(seconds[1:]) * 1e6:>25.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
