"""The user's problems and how their answers are graded, as the tools read them.

A prompts file is a JSON list; each element is a problem: a string (a user message, sent through
the target's chat template) or an object with "question" (the same) or "input_ids" (token ids,
sent as they are), and any other fields the grader reads. An object's optional "group" keeps
problems that share it on one side of a judge head's held-out split (GSM-symbolic: the template a
problem was generated from); by default each problem is its own group.

A grader is `--grader MODULE:FUNC` (MODULE on the import path or in the current folder), called as
FUNC(problem, output_text) with the problem as the file holds it; it returns whether the answer is right (a bool), or (outcome, right) where outcome
is what a judge head's mining compares before and after a change (say, the final number: a change
is harmful where it moves the outcome; by default the outcome is the bool itself).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path
from typing import Callable


def read_problems(path: str, flag: str = "--prompts") -> list:
    """The problems in a prompts file (module doc), checked."""
    try:
        problems = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{flag}={path!r} is invalid: {err}; allowed is a JSON list of problems") from None
    if not isinstance(problems, list) or not problems:
        raise ValueError(f"{flag}={path!r} is invalid: allowed is a non-empty JSON list of problems")
    for i, p in enumerate(problems):
        ok = isinstance(p, str) or (
            isinstance(p, dict)
            and (
                isinstance(p.get("question"), str)
                or (
                    isinstance(p.get("input_ids"), list)
                    and p["input_ids"]
                    and all(isinstance(t, int) for t in p["input_ids"])
                )
            )
        )
        if not ok:
            raise ValueError(
                f"{flag}={path!r} is invalid: problem {i} is {str(p)[:80]!r}; allowed is a string or an object "
                'with "question" (a string) or "input_ids" (a list of token ids)'
            )
    return problems


def prompt_ids(problems: list, tokenizer) -> list[list[int]]:
    """Each problem's prompt token ids (a question through the chat template, ids as given)."""
    from parse_sglang.demo import chat_prompt_ids

    out = []
    for p in problems:
        if isinstance(p, dict) and "input_ids" in p:
            out.append(list(p["input_ids"]))
        else:
            out += chat_prompt_ids(tokenizer, [p if isinstance(p, str) else p["question"]])
    return out


def group_of(problem, index: int):
    """What keeps problems on one side of a held-out split: its "group", else its index."""
    return problem.get("group", index) if isinstance(problem, dict) else index


def load_grader(spec: str, flag: str = "--grader") -> Callable[[object, str], tuple[object, bool]]:
    """FUNC of MODULE:FUNC, as grade(problem, text) -> (outcome, right)."""
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"{flag}={spec!r} is invalid: allowed is MODULE:FUNC")
    if os.getcwd() not in sys.path:  # a script's sys.path starts at its own folder, not the user's
        sys.path.append(os.getcwd())
    try:
        func = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"{flag}={spec!r} is invalid: {err}") from None

    def grade(problem, text: str) -> tuple[object, bool]:
        got = func(problem, text)
        if isinstance(got, tuple) and len(got) == 2:
            return got[0], bool(got[1])
        if isinstance(got, bool):
            return got, got
        raise TypeError(f"{flag}={spec!r}: it returned {got!r}; allowed is a bool or (outcome, bool)")

    return grade
