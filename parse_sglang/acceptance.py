"""Which draft prefix a round keeps: a = max(exact-match prefix, judged prefix).

A boundary-ending prefix d_1..d_{b_k} passes the judge (`prefix_passes`) by its judge_mode:
"probe" — the target's answer to the judge probe after it, P(yes)/(P(yes)+P(no)) >= τ;
"likelihood" — every draft token of it has target probability >= λ under the chain rows
the verify pass computes anyway (no probe rows at all); "both" — both. The judged prefix
is the longest passing one, the first failing prefix stopping it.

Batched over requests with padded tensors, so the reference generator (batch of one)
and the SGLang worker run the same rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass(frozen=True)
class AcceptedLengths:
    accepted: torch.Tensor  # [B] a: draft tokens kept
    exact: torch.Tensor  # [B] a_exact: leading draft tokens equal to the target's own
    judged: torch.Tensor  # [B] a - a_exact: tokens kept only because the judge said yes


def likelihood_scores(token_probs: torch.Tensor, boundaries: torch.Tensor) -> torch.Tensor:
    """[B, K] the smallest target probability among d_1..d_{b_k} (0 where b_k is padding).

    token_probs [B, L]: p_j = P_target(d_j | c_n d_1..d_{j-1}); boundaries [B, K] (0-padded)."""
    running_min = token_probs.float().cummin(dim=1).values
    picked = running_min.gather(1, (boundaries - 1).clamp(min=0))
    return torch.where(boundaries > 0, picked, torch.zeros_like(picked))


def prefix_passes(
    probe_scores: torch.Tensor,
    threshold: torch.Tensor,
    likelihood: torch.Tensor,
    likelihood_threshold: torch.Tensor,
    uses_probe: torch.Tensor,
    uses_likelihood: torch.Tensor,
) -> torch.Tensor:
    """[B, K] whether each boundary-ending prefix passes its request's judge (module doc).

    probe_scores, likelihood [B, K] (`likelihood_scores`); threshold τ, likelihood_threshold
    λ [B]; uses_probe, uses_likelihood [B] bool (judge_mode "probe", "likelihood", "both")."""
    probe_ok = probe_scores >= threshold[:, None]
    likely_ok = likelihood >= likelihood_threshold[:, None]
    return (probe_ok | ~uses_probe[:, None]) & (likely_ok | ~uses_likelihood[:, None])


def accept_lengths(
    draft: torch.Tensor,
    draft_lens: torch.Tensor,
    target_next: torch.Tensor,
    boundaries: torch.Tensor,
    passed: torch.Tensor,
    judge: torch.Tensor,
) -> AcceptedLengths:
    """
    draft [B, L] (padded), draft_lens [B]; target_next [B, L+1]: t_j, the target's token
    after c_n d_1..d_j; boundaries [B, K] (padded with 0) and passed [B, K] bool, whether
    the prefix ending there passes the judge (`prefix_passes`; padding must follow a
    boundary equal to 0, whatever it says); judge [B] bool.
    """
    batch, length = draft.shape
    steps = torch.arange(length, device=draft.device)
    matches = (draft == target_next[:, :length]) & (steps < draft_lens[:, None])
    exact = matches.long().cumprod(dim=1).sum(dim=1)

    real = boundaries > 0
    passed = passed & real & judge[:, None]
    probes_passed = passed.long().cumprod(dim=1).sum(dim=1)  # the first failing probe stops it
    judged_len = torch.where(
        probes_passed > 0,
        boundaries.gather(1, (probes_passed - 1).clamp(min=0)[:, None]).squeeze(1).long(),
        torch.zeros_like(probes_passed),
    )
    accepted = torch.maximum(exact, judged_len)
    return AcceptedLengths(accepted=accepted, exact=exact, judged=accepted - exact)


def emitted_tokens(
    draft: Sequence[int], accepted: int, bonus: int, eos_ids: Sequence[int], max_new_tokens: int
) -> tuple[list[int], bool]:
    """d_1..d_a plus the bonus token t_a, cut exactly where target-only decoding would
    stop: after the first EOS, or at the remaining max_new_tokens. Returns (tokens, finished)."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens!r} is invalid: allowed is an integer >= 1")
    tokens = list(draft[:accepted]) + [int(bonus)]
    eos = set(eos_ids)
    for i, tok in enumerate(tokens):
        if tok in eos:
            return tokens[: min(i + 1, max_new_tokens)], True
    if len(tokens) >= max_new_tokens:
        return tokens[:max_new_tokens], True
    return tokens, False


def pad_ragged(rows: Sequence[Sequence[int | float]], fill: int | float, dtype: torch.dtype) -> torch.Tensor:
    """Right-pad a list of rows into one [B, max_len] tensor."""
    width = max((len(r) for r in rows), default=0)
    out = torch.full((len(rows), max(width, 1)), fill, dtype=dtype)
    for i, row in enumerate(rows):
        if len(row):
            out[i, : len(row)] = torch.as_tensor(list(row), dtype=dtype)
    return out
