"""PARSE's counters in the scheduler's log, next to SGLang's own decode-batch line.

SGLang logs a line every `--decode-log-interval` decode batches (default 40) with, for a
speculative algorithm, "accept len: X" (tokens per request-round over those batches). Right
after it, on the same rank, this patch logs PARSE's view of the same batches and the totals:

    PARSE last 40 decode batches: 95 rounds, accept len 3.12 = 1 + 1.50 exact + 0.62 judged
        per round, mean L 4.0, 380 draft tokens, 120 judge probes | since start: 16 requests, 310 rounds,
        946 tokens, accept len 3.05, acceptance rate 0.52, judged share 0.19, 402 judge probes

(one line; with an EAGLE-3 head it ends ", 120 head rounds keeping 250 (last batches: 30, 61)"). "accept len" is computed from PARSE's counters (`parse_sglang/counters.py`: one
bonus token plus the accepted draft tokens per round; "tokens" are those the rounds emitted),
SGLang's from the accept lengths the worker hands back, over the same batches, so the two are
equal, and "rounds" equals the sum of SGLang's "#running-req" over those batches (except on an
adaptive server whose tier-0 rounds run k decode steps: SGLang counts such a round as one of k
tokens, PARSE as k rounds of one token, one per target forward). It is where
a user of a tool that shows no accept length (`python -m sglang.benchmark.offline_throughput`)
reads PARSE's.

What it changes: an AFTER hook on `SchedulerMetricsReporter.report_decode_stats`, which logs
when SGLang's own line was due and the scheduler's draft worker keeps PARSE totals.
"""

from __future__ import annotations

import dataclasses
import logging

from sglang.srt.plugins.hook_registry import HookType

from parse_sglang.counters import ServerTotals
from parse_sglang.scheduler_patches import register_hooks_once

logger = logging.getLogger(__name__)

TARGET = "sglang.srt.managers.scheduler_components.metrics_reporter.SchedulerMetricsReporter.report_decode_stats"

HOOKED_SIGNATURES = {
    TARGET: "(self, can_run_cuda_graph: 'bool', running_batch: 'ScheduleBatch' = None, num_generated_tokens: 'int' = 0)"
}

_logged = ServerTotals()  # this process's totals at its last PARSE log line


def totals_line(now: ServerTotals, before: ServerTotals, batches: int) -> str:
    """The log line for the rounds between `before` and `now` (and the totals `now`)."""
    step = ServerTotals(**{f.name: getattr(now, f.name) - getattr(before, f.name) for f in dataclasses.fields(now)})
    per_round = step.summary()
    total = now.summary()
    rounds = max(step.rounds, 1)
    head = ""  # an EAGLE-3 head's rounds (`eagle3_head`), on a server that ran any
    if now.head_rounds:
        head = f", {now.head_rounds} head rounds keeping {now.head_accepted} (last batches: {step.head_rounds}, {step.head_accepted})"
    return (
        f"PARSE last {batches} decode batches: {step.rounds} rounds, accept len {per_round['tokens_per_round']:.2f} "
        f"= 1 + {step.accepted_exact / rounds:.2f} exact + {step.accepted_judged / rounds:.2f} judged per round, "
        f"mean L {per_round['mean_draft_length']:.1f}, {step.draft_tokens} draft tokens, {step.judge_probes} judge "
        f"probes | since start: {now.requests} "
        f"requests, {now.rounds} rounds, {total['emitted_tokens']} tokens, accept len {total['tokens_per_round']:.2f}, "
        f"acceptance rate {total['acceptance_rate']:.2f}, judged share {total['judged_share']:.2f}, "
        f"{now.judge_probes} judge probes{head}"
    )


def log_parse_totals(result, reporter, *args, **kwargs):
    """AFTER hook: SGLang logged its decode line (same condition) -> log PARSE's."""
    global _logged
    if reporter.forward_ct_decode % reporter.decode_log_interval != 0 or not reporter.is_stats_logging_rank:
        return result
    totals = getattr(reporter.scheduler.draft_worker, "totals", None)
    if isinstance(totals, ServerTotals) and totals.rounds > _logged.rounds:
        logger.info(totals_line(totals, _logged, reporter.decode_log_interval))
        _logged = dataclasses.replace(totals)
    return result


def install() -> str:
    register_hooks_once(__name__, (TARGET, log_parse_totals, HookType.AFTER))
    return f"{TARGET}: AFTER hook logging PARSE's counters after SGLang's decode-batch line"
