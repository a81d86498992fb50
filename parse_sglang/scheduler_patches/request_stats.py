"""PARSE's per-request counters in meta_info, sent once per request.

What it changes: an AROUND hook on SGLang's
`SchedulerOutputStreamer.is_request_level_customized_info_key` answers True for the
worker's `parse_stats` key.

Why: SGLang slices a `req.customized_info` value by output-token offsets unless its key is
request-level; the worker keeps one dict per request (rounds, draft tokens, accepted by
exact match / by the judge, verify passes), replaced every round, which must be sent
whole. Non-stream requests get it in `meta_info["parse_stats"]` at finish (stream
requests only with their first chunk, as SGLang does for every request-level key).
"""

from __future__ import annotations

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

STATS_KEY = "parse_stats"
TARGET = (
    "sglang.srt.managers.scheduler_components.output_streamer."
    "SchedulerOutputStreamer.is_request_level_customized_info_key"
)

HOOKED_SIGNATURES = {TARGET: "(self, key: 'str') -> 'bool'"}


def stats_are_request_level(original, streamer, key):
    return key == STATS_KEY or original(streamer, key)


_registered = False


def install() -> str:
    global _registered
    if not _registered:
        HookRegistry.register(TARGET, stats_are_request_level, HookType.AROUND)
        _registered = True
    return f"{TARGET}: AROUND hook making customized_info[{STATS_KEY!r}] request-level"
