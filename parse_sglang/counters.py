"""PARSE's counters: per request (`meta_info["parse"]`) and per server (`get_server_info()`,
`/metrics`).

The worker counts here, from a round's host-side result (`record_round_stats`); the scheduler
patches publish what is counted (`scheduler_patches/request_stats.py`, `server_info.py`, `metrics.py`). This
module imports neither of them, nor SGLang, so the package has no import circle.

Per request, a plain dict of ints, `meta_info["parse"]`:

    {"rounds": int, "draft_length": int, "draft_tokens": int,
     "accepted_exact": int, "accepted_judged": int, "judge_probes": int,
     "head_rounds": int, "head_accepted": int, "copy_rounds": int, "copy_accepted": int}

`rounds`: the request's rounds (each one target verify forward; an adaptive server's tier-0
round of k plain decode steps counts as k rounds of L = 0); `draft_length`: the sum of its
rounds' draft lengths L (the server's, or an adaptive server's tier: draft_length / rounds is the
mean L); `draft_tokens`: the draft tokens its rounds could accept (L, cut by its budget and a stop
token); `accepted_exact`: draft tokens
the target's own next tokens confirmed; `accepted_judged`: draft tokens accepted beyond that
exact-match prefix because the judge said yes; `judge_probes`: the judge probes its rounds asked
(a round's real probes; the padding probes that keep one window width across a batch are not
counted); `head_rounds`: its rounds drafted by an EAGLE-3 head (`eagle3_head`), `head_accepted`:
the head's draft tokens they kept (counted in `accepted_exact` too); `copy_rounds`: its rounds
that verified its retrieved copy in place of a draft (`retrieval`), `copy_accepted`: the copied
tokens they kept (counted in `accepted_exact` / `accepted_judged` too). With `custom_params={"parse": {"return_probe_scores": true}}`
the dict also holds `"probe_scores"`: one entry per round, `{"length": L, "draft": [ids],
"confidence": [c], "accepted": a, "exact": e, "probes": [[b, p], ...], "tokens": [s, ...],
"copied": bool}` - the round's L, the draft tokens the round verified and the draft's top-1 probability at each, how
many of them it accepted (e of them by exact match), every real probe's boundary b and judge
score p (no probes: judge off for that round), and where a token judge ran, the score it read at
each draft token s (likelihood: the target's probability of it; divergence: the target's entropy
there; head: P(harmful)), and whether the draft was the request's retrieved copy (its confidences 1).

Per server, `ServerTotals.summary()`, counted since startup:

    {"requests": int,            # requests that ran at least one PARSE round
     "rounds": int,              # request-rounds (a request's draft + verify + accept)
     "verify_passes": int,       # target verify forwards (one per batch round; k per tier-0 round)
     "batch_rounds": int,        # the worker's rounds of a whole batch (one per scheduler decode step)
     "graph_passes": int,        # batch rounds whose draft chain and verify both replayed a graph
     "draft_length": int,        # the draft lengths L of the request-rounds, summed
     "verify_rows": int,         # window rows the verify passes ran (each request's N = 1 + L + K*m)
     "draft_tokens": int, "accepted_exact": int, "accepted_judged": int, "judge_probes": int,
     "head_rounds": int, "head_accepted": int, "copy_rounds": int, "copy_accepted": int,
     "emitted_tokens": int,      # accepted drafts + one bonus token per request-round
     "tokens_per_round": float,  # = SGLang's avg_spec_accept_length over the same rounds
     "tokens_per_verify_pass": float, "draft_tokens_per_round": float,
     "verify_rows_per_round": float,
     "mean_draft_length": float, # draft_length / rounds: L, or an adaptive server's mean tier
     "acceptance_rate": float,   # (accepted_exact + accepted_judged) / draft_tokens
     "judged_share": float}      # accepted_judged / all accepted draft tokens

Averages are 0.0 before the first round. emitted_tokens counts what the rounds produced; SGLang
drops the part of a round past a stop or max_new_tokens from the response.

`export_to(exporter)` adds a second destination for every verify pass (the Prometheus metrics
of `scheduler_patches/metrics.py`, in a scheduler process with `--enable-metrics`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, fields
from typing import Optional, Protocol, Sequence

import torch

from parse_sglang.request_state import state_of
from parse_sglang.settings import RETURN_PROBE_SCORES

STATS_KEY = "parse"
COUNTERS = (
    "rounds",
    "draft_length",
    "draft_tokens",
    "accepted_exact",
    "accepted_judged",
    "judge_probes",
    "head_rounds",
    "head_accepted",
    "copy_rounds",
    "copy_accepted",
)
PROBE_SCORES = "probe_scores"


def record_round(
    req,
    draft_length: int,
    draft_tokens: int,
    exact: int,
    judged: int,
    judge_probes: int,
    probe_round: Optional[dict],
    rounds: int = 1,
    head: bool = False,
    copied: bool = False,
) -> bool:
    """Count `rounds` identical rounds of `req` (more than one: a tier-0 round's decode steps)
    and publish its counters; returns True on its first round. copied: the round verified its copy.

    probe_round: the round's `probe_scores` entry, for requests that asked for them.
    """
    state = state_of(req)
    first = state.stats is None
    if first:
        state.stats = dict.fromkeys(COUNTERS, 0)
    stats = state.stats
    stats["rounds"] += rounds
    stats["draft_length"] += draft_length * rounds
    stats["draft_tokens"] += draft_tokens * rounds
    stats["accepted_exact"] += exact * rounds
    stats["accepted_judged"] += judged * rounds
    stats["judge_probes"] += judge_probes * rounds
    stats["head_rounds"] += rounds * head
    stats["head_accepted"] += exact * rounds * head
    stats["copy_rounds"] += rounds * copied
    stats["copy_accepted"] += (exact + judged) * rounds * copied
    if probe_round is not None:
        stats.setdefault(PROBE_SCORES, []).extend([probe_round] * rounds)
    if req.customized_info is None:
        req.customized_info = {}
    req.customized_info[STATS_KEY] = [stats]  # pickled when the request's output is sent
    return first


class Exporter(Protocol):
    def add_pass(self, counts: dict[str, int], probe_scores: Sequence[float]) -> None:
        """One verify pass: `counts` maps each ServerTotals field to its increment."""


_exporter: Optional[Exporter] = None


def export_to(exporter: Optional[Exporter]) -> None:
    """Send every later verify pass of this process to `exporter` too (None: stop)."""
    global _exporter
    _exporter = exporter


@dataclass
class ServerTotals:
    """Counters a PARSE worker keeps over every round it runs (host ints)."""

    requests: int = 0
    rounds: int = 0
    verify_passes: int = 0
    batch_rounds: int = 0
    graph_passes: int = 0
    verify_rows: int = 0
    draft_length: int = 0
    draft_tokens: int = 0
    accepted_exact: int = 0
    accepted_judged: int = 0
    judge_probes: int = 0
    head_rounds: int = 0
    head_accepted: int = 0
    copy_rounds: int = 0
    copy_accepted: int = 0

    def add_pass(
        self,
        new_requests: int,
        rounds: int,
        draft_tokens: int,
        exact: int,
        judged: int,
        probe_scores: Sequence[float],
        graphed: bool,
        verify_rows: int,
        draft_length: int,
        passes: int = 1,
        head: bool = False,
        copy_rounds: int = 0,
        copy_accepted: int = 0,
    ) -> None:
        """One worker round of `passes` identical verify passes (more than one: a tier-0 round's
        decode steps) over a batch of `rounds` requests; per pass, probe_scores: the judge score
        of each real probe; graphed: its draft chain and verify replayed graphs; verify_rows:
        the window rows it ran (rounds x N); draft_length: L x rounds; copy_rounds, copy_accepted:
        its requests that verified their copy, and the copied tokens they kept."""
        counts = dict(
            requests=new_requests,
            rounds=rounds,
            verify_passes=1,
            graph_passes=int(graphed),
            verify_rows=verify_rows,
            draft_length=draft_length,
            draft_tokens=draft_tokens,
            accepted_exact=exact,
            accepted_judged=judged,
            judge_probes=len(probe_scores),
            head_rounds=rounds * head,
            head_accepted=exact * head,
            copy_rounds=copy_rounds,
            copy_accepted=copy_accepted,
        )
        counts = {name: value if name == "requests" else value * passes for name, value in counts.items()}
        counts["batch_rounds"] = 1
        probe_scores = list(probe_scores) * passes
        for name, increment in counts.items():
            setattr(self, name, getattr(self, name) + increment)
        if _exporter is not None:
            _exporter.add_pass(counts, probe_scores)

    def summary(self) -> dict:
        accepted = self.accepted_exact + self.accepted_judged
        emitted = accepted + self.rounds
        return {
            **asdict(self),
            "emitted_tokens": emitted,
            "tokens_per_round": _ratio(emitted, self.rounds),
            "tokens_per_verify_pass": _ratio(emitted, self.verify_passes),
            "draft_tokens_per_round": _ratio(self.draft_tokens, self.rounds),
            "verify_rows_per_round": _ratio(self.verify_rows, self.rounds),
            "mean_draft_length": _ratio(self.draft_length, self.rounds),
            "acceptance_rate": _ratio(accepted, self.draft_tokens),
            "judged_share": _ratio(self.accepted_judged, accepted),
        }


TOTALS = tuple(field.name for field in fields(ServerTotals))


def _ratio(num: int, den: int) -> float:
    return num / den if den else 0.0


def record_round_stats(
    totals: ServerTotals, reqs, window, result, graphed: bool, steps: int = 1, head: bool = False
) -> None:
    """Count a round: per request and in `totals`, from the round's host plan (`window.plan`)
    and host result (`acceptance.RoundResult`); judge probes counted are the real ones (a
    boundary of a request judged with the probe). A tier-0 round of `steps` decode steps
    counts as that many rounds of L = 0, each one target forward and one token (none of them
    an accepted draft token, whatever run SGLang was handed). head: an EAGLE-3 head round
    (`head_rounds`, `head_accepted`)."""
    if steps > 1:
        zeros = [0] * len(reqs)
        result = dataclasses.replace(result, lengths=zeros, exact_tokens=zeros)
    plan = window.plan
    draft_lens = plan.draft_lens.tolist()
    real_probes = (plan.bounds > 0) & plan.probed[:, None]
    probe_counts = real_probes.sum(dim=1).tolist()
    scores = []
    if result.probe_scores is not None:
        scores = result.probe_scores[real_probes[:, : result.probe_scores.shape[1]]].tolist()
    exact, judged, copied = result.exact_tokens, result.judged_tokens, plan.copied.tolist()
    new_requests = 0
    for i, req in enumerate(reqs):
        probes = probe_round(window, result, i, head) if RETURN_PROBE_SCORES in req.parse.resolved.outputs else None
        new_requests += record_round(
            req,
            window.shape.draft_len,
            draft_lens[i],
            exact[i],
            judged[i],
            probe_counts[i],
            probes,
            steps,
            head,
            copied[i],
        )
    copy_accepted = sum(e + j for e, j, c in zip(exact, judged, copied) if c)
    totals.add_pass(
        new_requests,
        len(reqs),
        sum(draft_lens),
        sum(exact),
        sum(judged),
        scores,
        graphed,
        len(reqs) * window.shape.rows,
        len(reqs) * window.shape.draft_len,
        steps,
        head,
        sum(copied),
        copy_accepted,
    )


def probe_round(window, result, i: int, head: bool = False) -> dict:
    """Request i's `probe_scores` entry of this round (module docstring), from host data."""
    plan = window.plan
    bounds = [b for b in plan.bounds[i].tolist() if b > 0]

    def per_boundary(values: Optional[torch.Tensor], used: bool) -> list:
        return [[b, v] for b, v in zip(bounds, values[i].tolist())] if values is not None and used else []

    return {
        "length": window.shape.draft_len,  # the round's L (the adaptive tier; a head round's: k)
        "head": head,  # drafted by the EAGLE-3 head
        "draft": plan.drafts[i, : plan.draft_lens[i]].tolist(),
        "confidence": plan.confidence[i, : plan.draft_lens[i]].tolist(),
        "accepted": result.lengths[i],
        "exact": result.exact_tokens[i],
        "copied": bool(plan.copied[i]),  # the draft was the request's retrieved copy
        "probes": per_boundary(result.probe_scores, bool(plan.probed[i])),
        "tokens": (
            result.token_scores[i, : plan.draft_lens[i]].tolist()
            if result.token_scores is not None and plan.token_modes[i]
            else []
        ),
    }
