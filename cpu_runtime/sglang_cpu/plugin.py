"""The CPU runtime's SGLang plugin entry point (`sglang_cpu = "sglang_cpu.plugin:register"`).

SGLang's `load_plugins()` calls `register()` in every process it starts. Where the runtime is on
(`SGLANG_USE_CPU_ENGINE=1` and no CUDA device: `sglang_cpu.runtime_active()`) it checks each of
the runtime's patch modules against the SGLang signatures they were written for and installs
them (`sglang_cpu.patches()`: torch versions of what SGLang's GPU path runs); elsewhere, a GPU
server among them, it installs nothing.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import pkgutil

logger = logging.getLogger(__name__)

_installed: list[str] | None = None


def signature_mismatches(expected: dict[str, str]) -> list[str]:
    """'name: expected X, found Y' for each SGLang callable whose signature is not the one given."""
    found = {dotted: str(inspect.signature(pkgutil.resolve_name(dotted))) for dotted in expected}
    return [f"{name}: expected {want}, found {found[name]}" for name, want in expected.items() if found[name] != want]


def register() -> list[str]:
    """Check and install the patches this process needs, then apply SGLang's hooks; idempotent.
    Returns (and logs) one line per installed patch."""
    global _installed
    if _installed is not None:
        return _installed
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_cpu import patches

    modules = [importlib.import_module(name) for name in patches()]
    for module in modules:
        wrong = signature_mismatches(module.HOOKED_SIGNATURES)
        if wrong:
            raise RuntimeError(f"sglang_cpu was written against sglang 0.5.23; this SGLang differs: {wrong[0]}")
    _installed = [module.install() for module in modules]
    HookRegistry.apply_hooks()
    for line in _installed:
        logger.info("sglang_cpu plugin installed: %s", line)
    return _installed
