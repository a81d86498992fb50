"""PARSE settings on SGLang's two front doors: `--parse-config JSON` and `Engine(parse_config=...)`.

What it changes:
- AFTER hook on `ServerArgs.add_cli_args`: the parser gains `--parse-config JSON`;
- AFTER hook on `ServerArgs.from_cli_args`: its value becomes `server_args._parse_config`;
- `Engine.server_args_class` becomes a staticmethod that pops the keyword `parse_config`
  before building SGLang's ServerArgs from the other keywords, and stores it the same way.

Why: argparse refuses unknown flags and ServerArgs (a msgspec Struct) refuses unknown
keywords, and SGLang has no pass-through field for plugin settings. `_parse_config` is a
bookkeeping attribute: ServerArgs pickles it to the scheduler processes and lets the
speculative-algorithm hooks read it, where `parse_sglang.settings` validates it at startup.

`Engine.server_args_class` is replaced directly, not through HookRegistry: a REPLACE hook on
that attribute would also rebind every module's `ServerArgs` name to the replacement
(HookRegistry propagates patches to `from ... import` copies), and `Engine.__init__` itself
cannot be hooked for the first engine of a process, because plugins load inside it. The
attribute is read after that load (`self.server_args_class(**kwargs)`), so this works from
the first engine on; the previous value is kept and called for the real construction.
"""

from __future__ import annotations

import argparse

from sglang.srt.plugins.hook_registry import HookType

from parse_sglang.scheduler_patches import register_hooks_once

ADD_CLI_ARGS = "sglang.srt.server_args.ServerArgs.add_cli_args"
FROM_CLI_ARGS = "sglang.srt.server_args.ServerArgs.from_cli_args"
ENGINE_KEYWORD = "parse_config"
CLI_FLAG = "--parse-config"

CLI_SIGNATURES = {
    ADD_CLI_ARGS: "(parser: 'argparse.ArgumentParser')",
    FROM_CLI_ARGS: "(args: 'argparse.Namespace')",
}
HOOKED_SIGNATURES = {**CLI_SIGNATURES, "sglang.srt.entrypoints.engine.Engine.__init__": "(self, **kwargs)"}


def add_parse_flag(result, parser: argparse.ArgumentParser):
    if CLI_FLAG not in parser._option_string_actions:
        parser.add_argument(
            CLI_FLAG,
            type=str,
            default=None,
            help='PARSE settings as a JSON object, e.g. \'{"threshold": 0.7, "probe_stride": 8}\' '
            "(keys: parse_sglang.settings.ParseConfig). L is --speculative-num-steps.",
        )
    return result


def store_parse_flag(server_args, cls, args: argparse.Namespace):
    value = getattr(args, "parse_config", None)
    if value is not None:
        server_args._parse_config = value
    return server_args


def _server_args_with_parse_config(build):
    def server_args_class(**kwargs):
        parse_config = kwargs.pop(ENGINE_KEYWORD, None)
        server_args = build(**kwargs)
        if parse_config is not None:
            server_args._parse_config = parse_config
        return server_args

    server_args_class.parse_sglang_builds = build
    return staticmethod(server_args_class)


def install_cli() -> None:
    """The `--parse-config` hooks alone (registered, applied by HookRegistry.apply_hooks): all
    they touch is `sglang.srt.server_args`, so the start-up hook installs them as soon as that
    module exists."""
    register_hooks_once(
        __name__,
        (ADD_CLI_ARGS, add_parse_flag, HookType.AFTER),
        (FROM_CLI_ARGS, store_parse_flag, HookType.AFTER),
    )


def install() -> str:
    from sglang.srt.entrypoints.engine import Engine

    install_cli()
    if not hasattr(Engine.server_args_class, "parse_sglang_builds"):
        Engine.server_args_class = _server_args_with_parse_config(Engine.server_args_class)
    return f"{CLI_FLAG} flag and sglang.Engine({ENGINE_KEYWORD}=...) keyword -> server_args._parse_config"
