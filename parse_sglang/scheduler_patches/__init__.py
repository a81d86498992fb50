"""Patches of SGLang internals, one file per patched concern.

Each patch module has `HOOKED_SIGNATURES` (checked by `parse_sglang.plugin` before
anything is installed) and an idempotent `install() -> str`.
"""

from __future__ import annotations

_registered: set[str] = set()


def register_hooks_once(owner: str, *hooks) -> None:
    """Register `(dotted_target, hook, HookType)` triples with SGLang's HookRegistry the
    first time `owner` (a patch module's name) asks; later calls do nothing, so `install()`
    can run in every process and every test without stacking hooks."""
    if owner in _registered:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry

    for target, hook, kind in hooks:
        HookRegistry.register(target, hook, kind)
    _registered.add(owner)
