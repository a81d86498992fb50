"""The repository's problem sets as `python -m parse_sglang.tools.judge_head` reads any user's: a
prompts file (`parse_sglang.tools.prompts`) and a grader, FUNC(problem, output_text) -> (outcome,
right) with the outcome a head's mining compares (the final number, the tests' verdict).

    python -m support.judge_suites gsm|humaneval|synthetic [--first K] [--count N] --out PROBLEMS.json
    python -m parse_sglang.tools.judge_head mine --prompts PROBLEMS.json --grader support.judge_suites:gsm ...

GSM-symbolic problems are drawn at GSM_MINING_SEED, a seed no benchmark scores, each in the group of
its template (a head's held-out split then holds out whole templates); HumanEval's are the file's,
each its own group; synthetic ones (support/synthetic.py) at SYNTHETIC_MINING_SEED, as token ids of
the synthetic pair, whose folders this prints.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional, Sequence

GSM_MINING_SEED = 1_000_000  # GSM-symbolic seeds no benchmark scores (scored sets: problems.GSM_SEED + index)
SYNTHETIC_MINING_SEED = 30_000  # synthetic problems no test scores (synthetic.TEST_SEED is 10,000)
SUITES = ("gsm", "humaneval", "synthetic")


def problems(suite: str, first: int, count: int, cache_dir=None, log=print) -> list[dict]:
    """The suite's problems first .. first + count - 1, as a prompts file holds them."""
    from support import problems as problem_sets

    if suite == "gsm":
        return [
            {"question": p.question, "answer": p.answer, "group": f"gsm template {p.template}"}
            for p in problem_sets.gsm(first, count, cache_dir, seed=GSM_MINING_SEED)
        ]
    if suite == "humaneval":
        return [
            {
                "question": p.question(),
                "group": p.task_id,
                "task_id": p.task_id,
                "prompt": p.prompt,
                "test": p.test,
                "entry_point": p.entry_point,
            }
            for p in problem_sets.humaneval(first, count, cache_dir)
        ]
    from transformers import AutoTokenizer

    from support import synthetic

    target, draft = synthetic.build(cache_dir, log=log)
    log(f"synthetic pair: target {target}, draft {draft}")
    enc = synthetic.Encoder(AutoTokenizer.from_pretrained(target))
    items = synthetic.problems(SYNTHETIC_MINING_SEED, first + count)[first:]
    return [{"input_ids": enc.prompt_ids(p), "answer": p.answer} for p in items]


def gsm(problem: dict, text: str) -> tuple:
    """(the answer's last number, whether it is the problem's answer)."""
    from support.problems import final_number

    number = final_number(text)
    return number, number == problem["answer"]


def humaneval(problem: dict, text: str) -> tuple:
    """(whether the answer's code passes the problem's tests, the same)."""
    from support.problems import CodeProblem, passes

    ok = passes(CodeProblem(problem["task_id"], problem["prompt"], problem["test"], problem["entry_point"]), text)
    return ok, ok


def synthetic(problem: dict, text: str) -> tuple:
    """(the stated final answer, whether it is the problem's answer)."""
    from support.synthetic import final_answer

    answer = final_answer(text)
    return answer, answer == problem["answer"]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m support.judge_suites", description=__doc__.splitlines()[0])
    parser.add_argument("suite", choices=SUITES)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--count", type=int, default=16)
    parser.add_argument("--out", required=True)
    parser.add_argument("--cache-dir", default=None)
    args = parser.parse_args(argv)
    if args.first < 0 or args.count < 1:
        parser.error(f"--first={args.first} / --count={args.count} are invalid: allowed are >= 0 and >= 1")
    items = problems(args.suite, args.first, args.count, args.cache_dir, log=lambda line: print(line, file=sys.stderr))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(items) + "\n")
    print(f"{args.out}: {len(items)} {args.suite} problems; grader support.judge_suites:{args.suite}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
