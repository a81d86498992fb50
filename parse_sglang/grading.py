"""Grading a coding answer: its Python code run against tests in a separate process.

The program is the answer's code, then the tests, then a print of a random token the answer
cannot know; it passes when the process exits 0 and printed the token (an answer that exits
early with status 0 does not pass). It runs as `python -I` in an empty temporary folder with
a timeout: never inside the server or the process that asked.
"""

from __future__ import annotations

import re
import secrets
import subprocess
import sys
import tempfile

GRADE_TIMEOUT_S = 10.0
CODE_BLOCK = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)


def answer_code(text: str) -> str:
    """The code of an answer: its first ```python block, or the whole text without one."""
    match = CODE_BLOCK.search(text)
    return match.group(1) if match else text


def passes(code: str, tests: str, timeout: float = GRADE_TIMEOUT_S) -> bool:
    """Whether `code` followed by `tests` runs to its end in its own process within `timeout` s."""
    token = secrets.token_hex(16)
    program = f"{code}\n\n{tests}\n\nprint({token!r})\n"
    with tempfile.TemporaryDirectory(prefix="parse-grade-") as folder:
        try:
            done = subprocess.run(
                [sys.executable, "-I", "-c", program],
                cwd=folder,
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            return False
    return done.returncode == 0 and token in done.stdout
