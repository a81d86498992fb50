"""A round's counters: per request (`meta_info["parse"]`, and its `probe_scores` entry when
asked for) and the server's totals (get_server_info, /metrics); counters.py holds them."""

from __future__ import annotations

from typing import Optional

import torch

from parse_sglang.accepted import Accepted
from parse_sglang.counters import ServerTotals, record_round
from parse_sglang.settings import RETURN_PROBE_SCORES
from parse_sglang.window_plan import Window


def record_round_stats(totals: ServerTotals, reqs, window: Window, accepted: Accepted, graphed: bool) -> None:
    """Judge probes counted are the real ones (a boundary of a request judged with the probe)."""
    draft_lens, exact, judged = window.draft_lens.tolist(), accepted.exact.tolist(), accepted.judged.tolist()
    real_probes = (window.boundaries > 0) & window.uses_probe[:, None]
    probe_counts = real_probes.sum(dim=1).tolist()
    scores = accepted.scores[real_probes].tolist() if accepted.scores is not None else []
    new_requests = 0
    for i, req in enumerate(reqs):
        probes = probe_round(window, accepted, i) if RETURN_PROBE_SCORES in req.parse_outputs else None
        new_requests += record_round(req, draft_lens[i], exact[i], judged[i], probe_counts[i], probes)
    totals.add_pass(
        new_requests, len(reqs), sum(draft_lens), sum(exact), sum(judged), scores, graphed, len(reqs) * window.shape.rows
    )


def probe_round(window: Window, accepted: Accepted, i: int) -> dict:
    """Request i's `probe_scores` entry of this round: the draft it verified, how much of it
    was accepted (and how much by exact match), [boundary, judge score] of each real probe
    and [boundary, smallest draft-token probability up to it] where the likelihood judge ran."""

    def per_boundary(values: Optional[torch.Tensor], used: torch.Tensor) -> list:
        if values is None or not bool(used[i]):
            return []
        return [[b, v] for b, v in zip(window.boundaries[i].tolist(), values[i].tolist()) if b > 0]

    return {
        "draft": window.chain_tokens[i, 1 : 1 + int(window.draft_lens[i])].tolist(),
        "accepted": int(accepted.exact[i] + accepted.judged[i]),
        "exact": int(accepted.exact[i]),
        "probes": per_boundary(accepted.scores, window.uses_probe),
        "likelihood": per_boundary(accepted.likelihood, window.uses_likelihood),
    }
