"""The installed package is the server: importing the worker loads nothing of the checkout's
`support`, the CPU runtime (`sglang_cpu`) or the tools (`parse_sglang.tools`); no module of the
package imports `support`, or `sglang_cpu` outside a guard that catches its absence; and the
repository's own modules import each other without a circle (every import counted, lazy ones too).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import site
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# import name -> folder of the repository's own modules
PACKAGES = {
    "parse_sglang": ROOT / "parse_sglang",
    "support": ROOT / "support",
    "benchmarks": ROOT / "benchmarks",
    "sglang_cpu": ROOT / "cpu_runtime" / "sglang_cpu",
}
FOREIGN = ("support", "sglang_cpu")  # what a machine with only the installed plug-in lacks

# Run with `python -S`: no .pth hook has run yet. The finder refuses `support` and `sglang_cpu`
# (as a machine without them would), then site-packages and its .pth hooks are added (the
# plug-in's own start-up hook runs; the CPU runtime's acts only with SGLANG_USE_CPU_ENGINE=1,
# unset here). SGLang needs torchvision: where it is not installed, the CPU runtime's stand-in
# folder plays it (a plain package that imports nothing of `sglang_cpu`).
CHECK = """
import site, sys
class Missing:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {foreign!r}:
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Missing())
for folder in {sites!r}:
    site.addsitedir(folder)
sys.path[1:1] = {extra!r}
import parse_sglang.worker
bad = [m for m in sys.modules if m.split(".")[0] in {foreign!r} or m.startswith("parse_sglang.tools")]
assert not bad, bad
print("worker imported:", parse_sglang.worker.__file__)
"""


def test_worker_imports_nothing_of_support_the_cpu_runtime_or_the_tools():
    spec = importlib.util.find_spec("torchvision")  # the stand-in, where an earlier test turned the runtime on
    torchvision_missing = spec is None or "standin_torchvision" in (spec.origin or "")
    extra = [str(PACKAGES["sglang_cpu"] / "standin_torchvision")] if torchvision_missing else []
    code = CHECK.format(foreign=FOREIGN, sites=site.getsitepackages(), extra=extra)
    env = {k: v for k, v in os.environ.items() if k not in ("SGLANG_USE_CPU_ENGINE", "PYTHONPATH")}
    done = subprocess.run(
        [sys.executable, "-S", "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"worker imported: {ROOT / 'parse_sglang' / 'worker.py'}" in done.stdout


def modules() -> dict[str, Path]:
    """Dotted name -> file of every module of PACKAGES (a benchmark script is benchmarks.NAME)."""
    out = {}
    for top, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            out[".".join((top, *(parts[:-1] if parts[-1] == "__init__" else parts)))] = path
    return out


def imports(name: str, path: Path) -> list[tuple[str, ast.AST]]:
    """(imported dotted name, node) of every import in the file, anywhere in it; relative ones
    resolved; in benchmarks/ a bare name of a sibling script (its folder is on sys.path) is it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    siblings = {p.stem for p in PACKAGES["benchmarks"].glob("*.py")}
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for n in names:
            if name.startswith("benchmarks.") and n.split(".")[0] in siblings:
                n = "benchmarks." + n
            found.append((n, node))
    return found


def test_no_import_circle_among_the_repositorys_modules():
    """Tarjan's strongly connected components of the import graph: every one a single module."""
    mods = modules()

    def resolve(n: str):  # the deepest of our modules `n` names (a.b.c where c is a function: a.b)
        while n and n not in mods:
            n = n.rpartition(".")[0]
        return n or None

    graph = {m: sorted({t for n, _ in imports(m, p) if (t := resolve(n)) and t != m}) for m, p in mods.items()}
    index, low, stack, on, circles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on.discard(component[-1])
            if len(component) > 1:
                circles.append({m: [t for t in graph[m] if t in component] for m in sorted(component)})

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))
    for v in graph:
        if v not in index:
            visit(v)
    assert circles == []
    assert "benchmarks.adaptive" in graph["benchmarks.trace"]  # a bare sibling import is resolved


def _guarded(path: Path) -> set[tuple[int, int]]:
    """(line, column) of the imports inside a `try` that catches ImportError or ModuleNotFoundError."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Try) and {getattr(h.type, "id", None) for h in node.handlers} & {
            "ImportError",
            "ModuleNotFoundError",
        }:
            out |= {
                (n.lineno, n.col_offset)
                for stmt in node.body
                for n in ast.walk(stmt)
                if isinstance(n, (ast.Import, ast.ImportFrom))
            }
    return out


def test_the_package_imports_support_never_and_the_cpu_runtime_only_guarded():
    offending = []
    for name, path in modules().items():
        if not name.startswith("parse_sglang"):
            continue
        guarded = _guarded(path)
        for target, node in imports(name, path):
            where = f"{path.relative_to(ROOT)}:{node.lineno} imports {target}"
            top = target.split(".")[0]
            if top == "support" or (top == "sglang_cpu" and (node.lineno, node.col_offset) not in guarded):
                offending.append(where)
            if target.startswith("parse_sglang.tools") and not name.startswith("parse_sglang.tools"):
                offending.append(where + " (a tool, outside the tools)")
    assert offending == []
    assert _guarded(ROOT / "parse_sglang" / "__init__.py")  # cpu_engine_settings' guarded import, seen as one
