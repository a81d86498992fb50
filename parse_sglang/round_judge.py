"""The judge's verdict on one round's window: each boundary-ending prefix's probe score
(from its probe row), its likelihood score (from the chain rows, no extra rows) and whether
it passes its request's judge (judge_mode, τ, λ)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from parse_sglang.acceptance import likelihood_scores, prefix_passes
from parse_sglang.judge import JudgeProbe, judge_scores
from parse_sglang.window_plan import Window


@dataclass(frozen=True)
class Verdict:
    probe_scores: Optional[torch.Tensor]  # [bs, K'] P(yes)/(P(yes)+P(no)) at each boundary (None: no probes)
    likelihood: Optional[torch.Tensor]  # [bs, K'] min target probability of d_1..d_{b_k} (None: not asked)
    passed: torch.Tensor  # [bs, K'] bool, the prefix ending at b_k passes its request's judge


def judge_window(window: Window, chain_logits: torch.Tensor, probe_logits: torch.Tensor,
                 probe: Optional[JudgeProbe]) -> Verdict:
    """chain_logits [bs, L+1, V], probe_logits [bs, K, V] of the round's verify pass."""
    bounds = window.boundaries
    zeros = torch.zeros(bounds.shape, device=bounds.device)
    probe_scores = likelihood = None
    if window.shape.num_probes:
        probe_scores = judge_scores(probe_logits, probe).gather(1, window.probe_slots)
    if bool(window.uses_likelihood.any()):
        drafts = window.chain_tokens[:, 1:]
        token_probs = torch.softmax(chain_logits[:, :-1].float(), dim=-1).gather(-1, drafts[..., None]).squeeze(-1)
        likelihood = likelihood_scores(token_probs, bounds)
    passed = prefix_passes(
        probe_scores if probe_scores is not None else zeros,
        window.thresholds,
        likelihood if likelihood is not None else zeros,
        window.likelihood_thresholds,
        window.uses_probe,
        window.uses_likelihood,
    )
    return Verdict(probe_scores, likelihood, passed)
