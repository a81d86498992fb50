"""The start-up hook's mechanics (parse_sglang_startup), without SGLang: its finder runs the
callbacks around the one module it waits for and then leaves. What it does with SGLang (PARSE
registered, CPU runtime on, SGLang's commands unchanged) is tested in test_sglang_tools.py."""

from __future__ import annotations

import importlib
import sys

import pytest

import parse_sglang_startup as startup


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
