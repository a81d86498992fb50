"""PARSE's per-request counters (`parse_sglang/counters.py`) in `meta_info["parse"]`: a plain
dict, sent with a request's final output (the last chunk of a stream).

What it changes, and why:
- scheduler: an AROUND hook on `SchedulerOutputStreamer.is_request_level_customized_info_key`
  answers True for "parse". SGLang slices a `req.customized_info` value by output-token
  offsets unless its key is request-level; the worker replaces the value every round and
  it must be sent whole, once, when the request finishes.
- scheduler, streams: an AFTER hook on `_GenerationStreamAccumulator.accept` (which collects
  one output chunk per request) puts the value in a stream's final chunk. SGLang sends a
  stream's request-level values with its first chunk only, which leaves the scheduler right
  after prefill, before any PARSE round; the hook touches nothing else and only chunks of
  finished stream requests that hold PARSE counters.
- main process: an AFTER hook on `TokenizerManager.update_request_meta_info` unwraps it.
  The TokenizerManager accumulates customized info by `list.extend`, so the worker sends a
  one-element list; the hook puts that element, the dict, in meta_info.
  With `--incremental-streaming-output` SGLang slices every customized-info value of a chunk
  by output-token offset, which a dict does not survive: there the hook leaves
  `meta_info["parse"]` out of stream chunks (server totals: `get_server_info()`, /metrics).
"""

from __future__ import annotations

from sglang.srt.plugins.hook_registry import HookType

from parse_sglang.counters import STATS_KEY
from parse_sglang.scheduler_patches import register_hooks_once

STREAMER_TARGET = (
    "sglang.srt.managers.scheduler_components.output_streamer."
    "SchedulerOutputStreamer.is_request_level_customized_info_key"
)
CHUNK_TARGET = "sglang.srt.managers.scheduler_components.output_streamer._GenerationStreamAccumulator.accept"
META_INFO_TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager.update_request_meta_info"

HOOKED_SIGNATURES = {
    STREAMER_TARGET: "(self, key: 'str') -> 'bool'",
    CHUNK_TARGET: "(self, *, req: 'Req') -> 'None'",
    META_INFO_TARGET: (
        "(self, meta_info: 'dict', state: 'ReqState', customized_info: 'dict', index: 'int', "
        "finish_reason: 'Optional[dict]') -> 'None'"
    ),
}


def stats_are_request_level(original, streamer, key):
    return key == STATS_KEY or original(streamer, key)


def stats_in_final_stream_chunk(result, chunk, *, req):
    """AFTER hook: a finished stream's last chunk carries its counters (column "parse" of the
    chunk's customized info: one entry per request in the chunk, [] for the others)."""
    values = (req.customized_info or {}).get(STATS_KEY)
    in_this_chunk = bool(chunk.output_reqs) and chunk.output_reqs[-1] is req
    if values is None or not (req.stream and req.finished() and in_this_chunk):
        return result
    column = chunk.customized_info.setdefault(STATS_KEY, [[] for _ in chunk.output_reqs])
    column[-1] = values
    return result


def unwrap_stats(result, manager, meta_info, state, *args, **kwargs):
    """AFTER hook: meta_info["parse"] = the dict, not SGLang's accumulated [dict]."""
    values = meta_info.get(STATS_KEY)
    if not isinstance(values, list):
        return result
    if manager.incremental_streaming_output and getattr(state.obj, "stream", False):
        del meta_info[STATS_KEY]  # SGLang would slice it by output offset (module docstring)
    elif values:
        meta_info[STATS_KEY] = values[-1]
    return result


def install() -> str:
    register_hooks_once(
        __name__,
        (STREAMER_TARGET, stats_are_request_level, HookType.AROUND),
        (CHUNK_TARGET, stats_in_final_stream_chunk, HookType.AFTER),
        (META_INFO_TARGET, unwrap_stats, HookType.AFTER),
    )
    return (
        f"{STREAMER_TARGET}: AROUND hook making customized_info[{STATS_KEY!r}] request-level; "
        f"{CHUNK_TARGET}: AFTER hook sending it with a stream's final chunk; "
        f"{META_INFO_TARGET}: AFTER hook putting it in meta_info as a dict"
    )
