"""The start-up hook's mechanics (parse_sglang_startup), without SGLang: its finder runs the
callbacks around the one module it waits for and then leaves; both .pth lines are silent where
their module is gone. What it does with SGLang (PARSE registered, CPU runtime on, SGLang's
commands unchanged) is tested in test_sglang_tools.py."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import parse_sglang_startup as startup

ROOT = Path(__file__).resolve().parents[1]


def test_finder_runs_callbacks_around_the_module_then_leaves(tmp_path, monkeypatch):
    name = "parse_startup_probe_pkg"
    (tmp_path / name).mkdir()
    (tmp_path / name / "__init__.py").write_text("import sys\nsys._parse_probe_events.append('exec')\nVALUE = 42\n")
    (tmp_path / name / "inner.py").write_text("import sys\nsys._parse_probe_events.append('exec inner')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    events = []
    monkeypatch.setattr(sys, "_parse_probe_events", events, raising=False)
    hook = startup.ImportHook()
    hook.pending = {
        name: (lambda: events.append("before"), None),
        f"{name}.inner": (None, lambda: events.append("after")),
    }
    monkeypatch.setattr(startup, "_hook", hook)
    sys.meta_path.insert(0, hook)
    try:
        module = importlib.import_module(name)
        assert hook in sys.meta_path  # still waiting for the second module
        importlib.import_module(f"{name}.inner")
    finally:
        for key in [k for k in sys.modules if k.startswith(name)]:
            del sys.modules[key]
    assert events == ["before", "exec", "exec inner", "after"]
    assert hook not in sys.meta_path and startup._hook is None and hook.pending == {}
    assert module.VALUE == 42
    # The module keeps its real loader: source, reload and the like work as usual.
    assert type(module.__loader__).__name__ == "SourceFileLoader" and module.__spec__.loader is module.__loader__


def test_a_module_that_does_not_exist_is_left_to_python():
    hook = startup.ImportHook()
    hook.pending = {"parse_startup_no_such_module": (None, None)}
    assert hook.find_spec("parse_startup_no_such_module") is None
    assert "parse_startup_no_such_module" in hook.pending  # still waiting


@pytest.mark.parametrize(
    "value, allowed", [(None, True), ("", True), ("parse", True), ("other, parse", True), ("other", False)]
)
def test_sglang_plugins_whitelist_is_honoured(monkeypatch, value, allowed):
    if value is None:
        monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    else:
        monkeypatch.setenv("SGLANG_PLUGINS", value)
    assert startup.plugin_allowed() is allowed
    assert (startup.SERVER_ARGS in startup.ImportHook().pending) is allowed


def test_cpu_runtime_hook_waits_for_sglang_only_where_the_cpu_engine_is_asked_for(monkeypatch):
    """The CPU runtime's own start-up hook (cpu_runtime/sglang_cpu_startup.py): a finder only with
    SGLANG_USE_CPU_ENGINE=1, once, inert for every other import; at `import sglang` it enables the
    runtime and leaves (exercised end to end by test_sglang_tools.py's SGLang commands)."""
    import sglang_cpu_startup as cpu_startup

    def ours():
        return [f for f in sys.meta_path if isinstance(f, cpu_startup.EnableBeforeSGLang)]

    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if f not in ours()])
    monkeypatch.delitem(sys.modules, "sglang", raising=False)
    monkeypatch.delenv("SGLANG_USE_CPU_ENGINE", raising=False)
    cpu_startup.install()
    assert ours() == []
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    cpu_startup.install()
    cpu_startup.install()
    (finder,) = ours()
    assert finder.find_spec("json") is None and ours() == [finder]
    enabled = []
    monkeypatch.setattr("sglang_cpu.enable", lambda: enabled.append(True))
    assert finder.find_spec("sglang") is None  # the usual finders load it
    assert enabled == [True] and ours() == []


@pytest.mark.parametrize(
    "pth", [ROOT / "parse_sglang_startup.pth", ROOT / "cpu_runtime" / "sglang_cpu_startup.pth"], ids=lambda p: p.stem
)
def test_a_hook_whose_module_is_gone_starts_python_silently(tmp_path, pth):
    """A site folder holding the .pth and not its module (an editable install whose checkout was
    deleted): a fresh `python -S` that adds the folder prints nothing. With the module there, the
    line calls its install(). Control: the unguarded line `import M; M.install()` prints the
    traceback the guard prevents."""
    module, folder = pth.stem, tmp_path / "site"
    folder.mkdir()
    shutil.copy(pth, folder / pth.name)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def start() -> subprocess.CompletedProcess:
        code = f"import site; site.addsitedir({str(folder)!r})"
        command = [sys.executable, "-S", "-c", code]
        return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)

    gone = start()
    assert (gone.returncode, gone.stdout, gone.stderr) == (0, "", "")
    (folder / f"{module}.py").write_text("def install():\n    print('installed')\n")
    there = start()
    assert (there.returncode, there.stdout, there.stderr) == (0, "installed\n", "")
    (folder / f"{module}.py").unlink()
    (folder / pth.name).write_text(f"import {module}; {module}.install()\n")
    assert f"No module named '{module}'" in start().stderr
