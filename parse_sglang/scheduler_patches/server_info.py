"""PARSE's server-wide totals and averages in `get_server_info()`.

Shape, per scheduler (`Engine.get_server_info()["internal_states"][i]["parse"]`, HTTP
`/server_info` likewise), counted since startup:

    {"requests": int,            # requests that ran at least one PARSE round
     "rounds": int,              # request-rounds (a request's draft + verify + accept)
     "verify_passes": int,       # target verify forwards (one per batch round)
     "graph_passes": int,        # batch rounds whose draft chain and verify both replayed a graph
     "draft_tokens": int, "accepted_exact": int, "accepted_judged": int,
     "emitted_tokens": int,      # accepted drafts + one bonus token per request-round
     "tokens_per_round": float, "tokens_per_verify_pass": float,
     "draft_tokens_per_round": float,
     "acceptance_rate": float,   # (accepted_exact + accepted_judged) / draft_tokens
     "judged_share": float}      # accepted_judged / all accepted draft tokens

Averages are 0.0 before the first round. emitted_tokens counts what the rounds produced;
SGLang drops the part of a round past a stop or max_new_tokens from the response.

What it changes: an AFTER hook on SGLang's
`SchedulerInternalStateController._add_speculative` (which adds `avg_spec_accept_length`)
adds the "parse" entry when the scheduler's draft worker is a PARSE worker.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from sglang.srt.plugins.hook_registry import HookType

from parse_sglang.scheduler_patches import register_hooks_once

TARGET = (
    "sglang.srt.managers.scheduler_components.internal_state."
    "SchedulerInternalStateController._add_speculative"
)

HOOKED_SIGNATURES = {TARGET: "(self, state: 'Dict[str, Any]') -> 'None'"}

STATE_KEY = "parse"


@dataclass
class ServerTotals:
    """Counters a PARSE worker keeps over every round it runs (host ints)."""

    requests: int = 0
    rounds: int = 0
    verify_passes: int = 0
    graph_passes: int = 0
    draft_tokens: int = 0
    accepted_exact: int = 0
    accepted_judged: int = 0

    def add_pass(self, new_requests: int, rounds: int, draft_tokens: int, exact: int, judged: int, graphed: bool) -> None:
        """One verify pass over a batch of `rounds` requests."""
        self.requests += new_requests
        self.rounds += rounds
        self.verify_passes += 1
        self.graph_passes += graphed
        self.draft_tokens += draft_tokens
        self.accepted_exact += exact
        self.accepted_judged += judged

    def summary(self) -> dict:
        accepted = self.accepted_exact + self.accepted_judged
        emitted = accepted + self.rounds
        return {
            **asdict(self),
            "emitted_tokens": emitted,
            "tokens_per_round": _ratio(emitted, self.rounds),
            "tokens_per_verify_pass": _ratio(emitted, self.verify_passes),
            "draft_tokens_per_round": _ratio(self.draft_tokens, self.rounds),
            "acceptance_rate": _ratio(accepted, self.draft_tokens),
            "judged_share": _ratio(self.accepted_judged, accepted),
        }


def _ratio(num: int, den: int) -> float:
    return num / den if den else 0.0


def add_parse_state(result, controller, state):
    """AFTER hook: state["parse"] = the PARSE worker's totals."""
    from parse_sglang.worker import ParseWorker

    worker = controller.scheduler.draft_worker
    if isinstance(worker, ParseWorker):
        state[STATE_KEY] = worker.totals.summary()
    return result


def install() -> str:
    register_hooks_once(__name__, (TARGET, add_parse_state, HookType.AFTER))
    return f"{TARGET}: AFTER hook adding PARSE's server totals as internal_state[{STATE_KEY!r}]"
