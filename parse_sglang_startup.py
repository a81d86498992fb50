"""parse-sglang's start-up hook: PARSE exists in every Python process that resolves SGLang server
arguments.

Installed with the package as `parse_sglang_startup.pth` (regular and editable installs:
setup.py), a line Python runs at start-up that calls this module's `install()` where the module
can be found, and does nothing where it cannot (an editable install whose checkout is gone).
`install()` puts one finder at the front of `sys.meta_path` and imports
nothing: the finder compares each new top-level import's name with one string and acts on
that import only, then removes itself: right after `sglang.srt.server_args` executed, it calls
`parse_sglang.plugin.register_early()`, i.e. PARSE in SGLang's speculative registry and the
`--parse-config` flag. SGLang itself registers plugins with `load_plugins()` (entry point
`sglang.srt.plugins`) in launch_server, `Engine` and its subprocesses, but some of its tools
resolve server arguments before that: `python -m sglang.benchmark.offline_throughput
--speculative-algorithm PARSE` stopped with "Unknown speculative algorithm name: PARSE". The
rest of the plugin stays with `load_plugins()`, which every SGLang process that serves still
calls. (The CPU runtime, a separate distribution, has a start-up hook of its own:
cpu_runtime/sglang_cpu_startup.py.)

`SGLANG_PLUGINS` is honoured as `load_plugins()` honours it: set, and not naming "parse",
nothing is registered early. A failure is logged (as `load_plugins()` logs a failing plugin)
and never breaks the import that triggered it.

Why this and not something else:
- importing SGLang (or `parse_sglang`) from the .pth would add seconds to every interpreter,
  and binding `parse_sglang` at start-up, before the script's folder is on `sys.path`, would
  pick the installed copy over a checkout run from its own folder; the finder imports
  `parse_sglang` only when SGLang is imported, from wherever `sys.path` then finds it;
- `load_plugins()` or the whole `register()` at the `server_args` import: SGLang's scheduler
  and HTTP server import `server_args` half-way through importing modules that PARSE's other
  hooks patch (`schedule_batch`, `model_config`, ...), which would fail there;
- a lazy hook on `SpeculativeAlgorithm.from_string` would come too late for `--parse-config`,
  which the parser needs before it parses;
- `sitecustomize`: there is one per environment, shared with everything else.
"""

from __future__ import annotations

import os
import sys

SERVER_ARGS = "sglang.srt.server_args"
PLUGIN_NAME = "parse"  # the `sglang.srt.plugins` entry point's name (pyproject.toml)


def plugin_allowed() -> bool:
    """False when SGLANG_PLUGINS lists plugins and "parse" is not one of them."""
    allowed = {name.strip() for name in os.environ.get("SGLANG_PLUGINS", "").split(",") if name.strip()}
    return not allowed or PLUGIN_NAME in allowed


def _log_failure(what: str) -> None:
    import logging

    logging.getLogger(__name__).exception("parse-sglang start-up hook: %s failed", what)


def register_early() -> None:
    """After `sglang.srt.server_args` executed: PARSE and `--parse-config`."""
    try:
        from parse_sglang import plugin

        plugin.register_early()
    except Exception:
        _log_failure("parse_sglang.plugin.register_early()")


class _RunAround:
    """A module's loader that runs `before` / `after` around the module's execution; the
    module keeps the real loader (`__loader__`, `__spec__.loader`)."""

    def __init__(self, loader, before, after):
        self._loader, self._before, self._after = loader, before, after

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = module.__spec__.loader = self._loader
        if self._before is not None:
            self._before()
        self._loader.exec_module(module)
        if self._after is not None:
            self._after()

    def __getattr__(self, name):
        return getattr(self._loader, name)


class ImportHook:
    """Meta-path finder acting on the imports of `sglang` and `sglang.srt.server_args`."""

    def __init__(self):
        self.pending = {SERVER_ARGS: (None, register_early)} if plugin_allowed() else {}

    def find_spec(self, name, path=None, target=None):
        if name not in self.pending:
            return None
        spec = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None) if finder is not self else None
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        if spec is None or spec.loader is None:
            return None
        before, after = self.pending.pop(name)
        if not self.pending:
            uninstall()
        spec.loader = _RunAround(spec.loader, before, after)
        return spec


_hook: ImportHook | None = None


def install() -> None:
    """Put the finder first on sys.meta_path (once per process); what the .pth calls."""
    global _hook
    if _hook is None and SERVER_ARGS not in sys.modules and plugin_allowed():
        _hook = ImportHook()
        sys.meta_path.insert(0, _hook)


def uninstall() -> None:
    global _hook
    if _hook is not None and _hook in sys.meta_path:
        sys.meta_path.remove(_hook)
    _hook = None
