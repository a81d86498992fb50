"""SGLang plugin entry point: `[project.entry-points."sglang.srt.plugins"] parse = "parse_sglang.plugin:register"`.

SGLang's `load_plugins()` calls `register()` in every process it starts (launch_server /
Engine, scheduler, detokenizer) and then applies the HookRegistry hooks, so whatever is
installed here exists everywhere. It does not enable the CPU runtime (that is
`parse_sglang.cpu.enable()`, or `python -m parse_sglang.launch_server`). The patches it
installs add capabilities, and one change for every server: requests that would kill a
scheduler are refused with a 400 (`scheduler_patches/request_validation.py`).

Each module in `INSTALLERS` (to add one, append it) has `HOOKED_SIGNATURES` (dotted SGLang
name -> the `inspect.signature` string it was written against) and `install() -> str`
(idempotent, returns a line saying what it installed).
"""

from __future__ import annotations

import importlib
import inspect
import logging
import pkgutil

logger = logging.getLogger(__name__)

INSTALLERS = [
    "parse_sglang.scheduler_patches.request_validation",  # every server, target-only too
    "parse_sglang.scheduler_patches.torch_native_verify",
    "parse_sglang.scheduler_patches.torch_native_draft",
    "parse_sglang.spec_algo",
]

_installed: list[str] | None = None


class SGLangSignatureMismatch(RuntimeError):
    """An SGLang internal that parse-sglang hooks no longer has the signature it was written for."""


def check_signatures(expected: dict[str, str]) -> None:
    """Raise SGLangSignatureMismatch naming the first SGLang callable whose signature differs."""
    for dotted, want in expected.items():
        found = str(inspect.signature(pkgutil.resolve_name(dotted)))
        if found != want:
            raise SGLangSignatureMismatch(
                f"{dotted}: expected signature {want}, found {found}. parse-sglang was written "
                "against sglang 0.5.23; this SGLang changed an internal it patches."
            )


def register() -> list[str]:
    """Check and install every patch in INSTALLERS, then apply SGLang's hooks; idempotent.

    Returns (and logs) one line per installed patch.
    """
    global _installed
    if _installed is not None:
        return _installed
    from sglang.srt.plugins.hook_registry import HookRegistry

    modules = [importlib.import_module(name) for name in INSTALLERS]
    for module in modules:
        check_signatures(module.HOOKED_SIGNATURES)
    installed = [module.install() for module in modules]
    HookRegistry.apply_hooks()
    for line in installed:
        logger.info("parse-sglang plugin installed: %s", line)
    _installed = installed
    return installed
