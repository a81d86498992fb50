"""An SGLang frontend program (`sgl.function`) run against a PARSE server.

    python examples/frontend_program.py --url http://127.0.0.1:30000 [--max-tokens 64]

Start the server first (examples/launch_server.md). The program is a two-step Q&A in one
conversation: the second question sees the first answer, so the server's radix cache
reuses the shared prefix. PARSE is transparent to the frontend: every `sgl.gen` is an
ordinary /generate request, and its meta_info carries PARSE's per-request counters under
"parse", read here with `state.get_meta_info(name)`.

Limits: the frontend's `sgl.gen` has no way to pass `custom_params`, so per-request PARSE
settings (threshold, judge on/off, ...) are not reachable from here: a program runs with
the server's `--parse-config` (send them with /generate instead, examples/launch_server.md).
Streamed gens (`run(stream=True)`) carry no "parse" counters, and `sgl.gen(choices=...)`
scores its choices by prefill alone, so no PARSE round runs for it.
"""

from __future__ import annotations

import argparse
import json

import sglang as sgl


@sgl.function
def two_step_qa(s, question: str, follow_up: str, max_tokens: int):
    s += sgl.system("You are a helpful assistant. Answer briefly.")
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=max_tokens, temperature=0))
    s += sgl.user(follow_up)
    s += sgl.assistant(sgl.gen("follow_up_answer", max_tokens=max_tokens, temperature=0))


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:30000", help="base URL of the PARSE server")
    parser.add_argument("--max-tokens", type=int, default=64, help="max new tokens per answer")
    parser.add_argument("--question", default="What is 12 times 7?")
    parser.add_argument("--follow-up", default="Now divide that by 4.")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    sgl.set_default_backend(sgl.RuntimeEndpoint(args.url))
    state = two_step_qa.run(question=args.question, follow_up=args.follow_up, max_tokens=args.max_tokens)
    for name in ("answer", "follow_up_answer"):
        meta = state.get_meta_info(name)
        print(f"[{name}] {state[name]!r}")
        print(f"[{name}] completion_tokens={meta['completion_tokens']} parse={json.dumps(meta.get('parse'))}")


if __name__ == "__main__":
    main()
