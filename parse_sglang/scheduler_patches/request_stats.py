"""PARSE's per-request counters in `meta_info["parse"]`: a plain dict, sent once per request.

Shape (non-stream requests, at finish):

    meta_info["parse"] = {"rounds": int, "verify_passes": int, "draft_tokens": int,
                          "accepted_exact": int, "accepted_judged": int}

`accepted_exact`: draft tokens the target's own next tokens confirmed; `accepted_judged`:
draft tokens accepted beyond that exact-match prefix because the judge said yes;
`verify_passes`: target verify forwards the request took part in (one per round). With
`custom_params={"parse": {"return_probe_scores": true}}` the dict also holds
`"probe_scores"`: one entry per round, `{"draft": [ids], "accepted": a, "probes": [[b, p], ...]}`
- the draft tokens the round verified, how many of them it accepted, and every real probe's
boundary b and judge score p (no probes: judge off for that round).

What it changes, and why:
- scheduler: an AROUND hook on `SchedulerOutputStreamer.is_request_level_customized_info_key`
  answers True for "parse". SGLang slices a `req.customized_info` value by output-token
  offsets unless its key is request-level; the worker replaces the value every round and
  it must be sent whole, once, when the request finishes.
- main process: an AFTER hook on `TokenizerManager.update_request_meta_info` unwraps it.
  The TokenizerManager accumulates customized info by `list.extend`, so the worker sends a
  one-element list; the hook puts that element, the dict, in meta_info.

Stream requests get no `meta_info["parse"]`: SGLang sends a stream's request-level values
with its first chunk only, which leaves the scheduler right after prefill, before any PARSE
round. Server-wide totals are in `get_server_info()` (scheduler_patches/server_info.py).
"""

from __future__ import annotations

from typing import Optional

from sglang.srt.plugins.hook_registry import HookType

from parse_sglang.scheduler_patches import register_hooks_once

STATS_KEY = "parse"
COUNTERS = ("rounds", "verify_passes", "draft_tokens", "accepted_exact", "accepted_judged")
PROBE_SCORES = "probe_scores"

STREAMER_TARGET = (
    "sglang.srt.managers.scheduler_components.output_streamer."
    "SchedulerOutputStreamer.is_request_level_customized_info_key"
)
META_INFO_TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager.update_request_meta_info"

HOOKED_SIGNATURES = {
    STREAMER_TARGET: "(self, key: 'str') -> 'bool'",
    META_INFO_TARGET: (
        "(self, meta_info: 'dict', state: 'ReqState', customized_info: 'dict', index: 'int', "
        "finish_reason: 'Optional[dict]') -> 'None'"
    ),
}


def record_round(req, draft_tokens: int, exact: int, judged: int, probe_round: Optional[dict]) -> bool:
    """Count one round of `req` and publish its counters; returns True on its first round.

    probe_round: the round's `probe_scores` entry, for requests that asked for them.
    """
    stats = getattr(req, "parse_stats", None)
    first = stats is None
    if first:
        stats = req.parse_stats = dict.fromkeys(COUNTERS, 0)
    stats["rounds"] += 1
    stats["verify_passes"] += 1
    stats["draft_tokens"] += draft_tokens
    stats["accepted_exact"] += exact
    stats["accepted_judged"] += judged
    if probe_round is not None:
        stats.setdefault(PROBE_SCORES, []).append(probe_round)
    if req.customized_info is None:
        req.customized_info = {}
    req.customized_info[STATS_KEY] = [stats]  # pickled when the request finishes
    return first


def stats_are_request_level(original, streamer, key):
    return key == STATS_KEY or original(streamer, key)


def unwrap_stats(result, manager, meta_info, *args, **kwargs):
    """AFTER hook: meta_info["parse"] = the dict, not SGLang's accumulated [dict]."""
    values = meta_info.get(STATS_KEY)
    if isinstance(values, list) and values:
        meta_info[STATS_KEY] = values[-1]
    return result


def install() -> str:
    register_hooks_once(
        __name__,
        (STREAMER_TARGET, stats_are_request_level, HookType.AROUND),
        (META_INFO_TARGET, unwrap_stats, HookType.AFTER),
    )
    return (
        f"{STREAMER_TARGET}: AROUND hook making customized_info[{STATS_KEY!r}] request-level; "
        f"{META_INFO_TARGET}: AFTER hook putting it in meta_info as a dict"
    )
