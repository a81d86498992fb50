"""Per-request PARSE settings, refused in the main process before any compute.

What it changes: an AFTER hook on SGLang's `SamplingParams.verify` (called by the
TokenizerManager for every request) validates `custom_params["parse"]` against the
server's PARSE settings when the server runs PARSE.

Why: a bad per-request setting should fail that request with a ValueError naming the
setting (HTTP 400 / an exception from `Engine.generate`), not reach the scheduler, where
the worker could only abort it mid-flight.
"""

from __future__ import annotations

from collections.abc import Mapping

from sglang.srt.plugins.hook_registry import HookType

from parse_sglang.scheduler_patches import register_hooks_once

from parse_sglang.settings import REQUEST_KEY, request_parse_config, server_parse_config

TARGET = "sglang.srt.sampling.sampling_params.SamplingParams.verify"

HOOKED_SIGNATURES = {TARGET: "(self, vocab_size)"}


def verify_parse_params(result, sampling_params, vocab_size):
    """AFTER hook: raise ValueError for an invalid `custom_params["parse"]`."""
    custom = sampling_params.custom_params
    if not isinstance(custom, Mapping) or REQUEST_KEY not in custom:
        return result  # a non-object custom_params is refused by request_validation.py
    from sglang.srt.runtime_context import get_server_args, get_spec

    spec = get_spec()
    if (spec.speculative_algorithm or "").upper() != "PARSE":
        raise ValueError(
            f'custom_params["{REQUEST_KEY}"] is only accepted by a server launched with '
            f"--speculative-algorithm PARSE (this one runs {spec.speculative_algorithm})"
        )
    request_parse_config(custom, server_parse_config(get_server_args(), spec.speculative_num_steps))
    return result


def install() -> str:
    register_hooks_once(__name__, (TARGET, verify_parse_params, HookType.AFTER))
    return f'{TARGET}: AFTER hook validating custom_params["{REQUEST_KEY}"]'
