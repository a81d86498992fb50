"""SGLang plugin entry point: `[project.entry-points."sglang.srt.plugins"] parse = "parse_sglang.plugin:register"`.

SGLang's `load_plugins()` calls `register()` in every process it starts (launch_server /
Engine, scheduler, detokenizer) and then applies the HookRegistry hooks, so whatever is
installed here exists everywhere. The CPU runtime is another distribution with its own entry
point (cpu_runtime/, `sglang_cpu`); the plug-in never imports it. The patches it installs add
capabilities, and one change for every server: requests that would kill a scheduler are
refused with a 400 (`scheduler_patches/request_validation.py`).

`INSTALLERS` is the one list of what the plug-in changes in SGLang, a line each saying what;
each module's docstring says why. Each has `HOOKED_SIGNATURES` (dotted SGLang name -> the
`inspect.signature` string it was written against) and `install() -> str` (idempotent,
returns a line saying what it installed).

Some SGLang tools resolve server arguments before they call `load_plugins()`
(`python -m sglang.benchmark.offline_throughput`). For them the start-up hook
`parse_sglang_startup` (installed with the package) calls `register_early()` as soon as a
process has imported `sglang.srt.server_args`: the part of the plugin that resolving server
arguments needs. `register()` later installs the rest, as always.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import pkgutil

logger = logging.getLogger(__name__)

_PATCHES = "parse_sglang.scheduler_patches."
INSTALLERS = [
    _PATCHES + "request_validation",  # every server, target-only too: a request that would kill a scheduler gets a 400
    "parse_sglang.spec_algo",  # --speculative-algorithm PARSE in SGLang's registry
    _PATCHES + "logits_rows",  # a verify pass computes logits only for the rows PARSE reads
    _PATCHES + "draft_kv_budget",  # the draft's KV pool priced into SGLang's KV budget
    _PATCHES + "head_prefix_cache",  # an EAGLE-3 head's server keys its radix tree by bigrams, as SGLang's EAGLE
    _PATCHES + "cli_settings",  # --parse-config on the command line, parse_config= on the Engine
    _PATCHES + "request_settings",  # custom_params["parse"] checked when a request arrives
    _PATCHES + "request_stats",  # meta_info["parse"]: a request's PARSE counters in its response
    _PATCHES + "server_info",  # get_server_info()'s "parse": the server's totals
    _PATCHES + "metrics",  # the totals on /metrics
    _PATCHES + "decode_log",  # a PARSE line in the decode log
    _PATCHES + "verify_graph",  # the verify pass under SGLang's decode CUDA graph
    _PATCHES + "pd_peer",  # a PD decode server takes requests only from prefill servers with its draft
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


def register_early() -> str:
    """What resolving SGLang server arguments needs, and nothing else: PARSE in SGLang's
    speculative registry and the `--parse-config` flag on `ServerArgs`; idempotent.

    Safe while SGLang is half-way through importing its modules (the start-up hook runs it
    right after `sglang.srt.server_args` executed, possibly inside the import of the
    scheduler): it imports `sglang.srt.speculative.spec_info`, whose own imports are loaded
    by then, and patches only `ServerArgs`. The scheduler and tokenizer-manager hooks patch
    modules that may be half-imported at that moment, so they wait for `register()`.
    """
    from sglang.srt.plugins.hook_registry import HookRegistry

    from parse_sglang import spec_algo
    from parse_sglang.scheduler_patches import cli_settings

    check_signatures({**spec_algo.REGISTRATION_SIGNATURES, **cli_settings.CLI_SIGNATURES})
    spec_algo.register_algorithm()
    cli_settings.install_cli()
    HookRegistry.apply_hooks()
    return f"speculative algorithm {spec_algo.ALGORITHM} and {cli_settings.CLI_FLAG}"


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
