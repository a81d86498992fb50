"""PARSE's server counters on SGLang's Prometheus endpoint (`--enable-metrics`, `GET /metrics`).

Metrics, with the labels of SGLang's own scheduler metrics (model_name, engine_type, tp_rank, ...):

    sglang:parse_requests_total          requests that ran at least one PARSE round
    sglang:parse_rounds_total            request-rounds
    sglang:parse_verify_passes_total     target verify forwards (one per batch round, k per tier-0
                                         round of k decode steps)
    sglang:parse_batch_rounds_total      the worker's rounds of a whole batch (scheduler decode steps)
    sglang:parse_draft_length_total      the draft lengths L of the request-rounds, summed (/ rounds:
                                         the mean L, an adaptive server's mean tier)
    sglang:parse_draft_tokens_total      draft tokens verified
    sglang:parse_accepted_exact_total    draft tokens accepted by exact match
    sglang:parse_accepted_judged_total   draft tokens accepted because the judge said yes
    sglang:parse_judge_probes_total      judge probes asked (real probes, not window padding)
    sglang:parse_probe_score             histogram of the judge score of every probe
                                         (its _count equals parse_judge_probes_total)

They count what `ServerTotals` (`parse_sglang/counters.py`) counts, since startup, so they
equal `/server_info`'s `internal_states[i]["parse"]` and the sum of the requests'
`meta_info["parse"]`. SGLang's own speculative metrics (`sglang:spec_accept_length`,
`sglang:spec_accept_rate`, `sglang:spec_verify_calls_total`, ...) stay as they are next to them.

What it changes, and why: an AFTER hook on `SchedulerMetricsCollector.__init__` creates these
metrics when SGLang creates its scheduler metrics, in the scheduler process, the way that
collector creates its own: prometheus_client in multiprocess mode (SGLang points
PROMETHEUS_MULTIPROC_DIR at one folder for all its processes and serves /metrics from the HTTP
process with a MultiProcessCollector), or the collector's own metric classes where a stat
logger replaces them (`_counter_cls`, `_histogram_cls`: Ray). The worker's `ServerTotals` then
reports every verify pass to them (`counters.export_to`). Without `--enable-metrics` SGLang
creates no collector and nothing here runs.
"""

from __future__ import annotations

from sglang.srt.plugins.hook_registry import HookType

from parse_sglang import counters
from parse_sglang.scheduler_patches import register_hooks_once

TARGET = "sglang.srt.observability.metrics_collector.SchedulerMetricsCollector.__init__"

HOOKED_SIGNATURES = {
    TARGET: (
        "(self, labels: 'Dict[str, str]', server_args: 'ServerArgs', enable_lora: 'bool' = False, "
        "enable_hierarchical_cache: 'bool' = False, enable_streaming_session: 'bool' = False) -> 'None'"
    )
}

PREFIX = "sglang:parse_"
DOCS = {
    "requests": "Requests that ran at least one PARSE round.",
    "rounds": "PARSE request-rounds (draft, one verify pass, accept).",
    "verify_passes": "PARSE target verify forwards (one per batch round, k per tier-0 round of k decode steps).",
    "batch_rounds": "PARSE rounds of a whole batch (one per scheduler decode step).",
    "graph_passes": "PARSE batch rounds whose draft chain and verify pass both replayed CUDA graphs.",
    "verify_rows": "Window rows PARSE's verify passes ran (requests x N = 1 + L + K*m each).",
    "draft_length": "Draft lengths L of PARSE's request-rounds, summed (divided by the rounds: the mean L).",
    "draft_tokens": "Draft tokens PARSE verified.",
    "accepted_exact": "Draft tokens PARSE accepted because the target would have emitted them (exact match).",
    "accepted_judged": "Draft tokens PARSE accepted beyond the exact match because the judge said yes.",
    "judge_probes": "Judge probes PARSE asked (one per real boundary; window padding not counted).",
    "head_rounds": "PARSE request-rounds drafted by the EAGLE-3 head (eagle3_head).",
    "head_accepted": "Draft tokens of the EAGLE-3 head's rounds the target kept.",
    "copy_rounds": "PARSE request-rounds that verified the request's retrieved copy (retrieval).",
    "copy_accepted": "Copied tokens of those rounds PARSE kept.",
}
PROBE_SCORE = PREFIX + "probe_score"
PROBE_SCORE_BUCKETS = tuple(round(0.1 * i, 1) for i in range(1, 11))


class PrometheusExport:
    """PARSE's metrics, labelled like the scheduler collector they are created next to."""

    def __init__(self, collector):
        from prometheus_client import Counter, Histogram  # after SGLang set PROMETHEUS_MULTIPROC_DIR

        Counter = collector._counter_cls or Counter
        Histogram = collector._histogram_cls or Histogram
        labels = dict(collector.labels)
        self.counters = {
            name: Counter(name=f"{PREFIX}{name}_total", documentation=DOCS[name], labelnames=labels.keys()).labels(
                **labels
            )
            for name in counters.TOTALS
        }
        self.probe_score = Histogram(
            name=PROBE_SCORE,
            documentation="Judge score P(yes) / (P(yes) + P(no)) of every PARSE judge probe.",
            labelnames=labels.keys(),
            buckets=PROBE_SCORE_BUCKETS,
        ).labels(**labels)

    def add_pass(self, counts: dict[str, int], probe_scores) -> None:
        for name, increment in counts.items():
            if increment:
                self.counters[name].inc(increment)
        for score in probe_scores:
            self.probe_score.observe(score)


def export_parse_metrics(result, collector, *args, **kwargs):
    """AFTER hook: the scheduler's collector exists; PARSE's totals report to metrics next to it
    (one set per process, as SGLang makes one scheduler collector per scheduler process)."""
    if counters._exporter is None:
        counters.export_to(PrometheusExport(collector))
    return result


def install() -> str:
    register_hooks_once(__name__, (TARGET, export_parse_metrics, HookType.AFTER))
    return f"{TARGET}: AFTER hook exporting PARSE's server counters as {PREFIX}* Prometheus metrics"
