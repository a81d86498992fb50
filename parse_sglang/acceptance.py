"""Which draft prefix a round keeps: a = max(exact-match prefix, judged prefix).

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


def accept_lengths(
    draft: torch.Tensor,
    draft_lens: torch.Tensor,
    target_next: torch.Tensor,
    boundaries: torch.Tensor,
    scores: torch.Tensor,
    threshold: torch.Tensor,
    judge: torch.Tensor,
) -> AcceptedLengths:
    """
    draft [B, L] (padded), draft_lens [B]; target_next [B, L+1]: t_j, the target's token
    after c_n d_1..d_j; boundaries [B, K] (padded with 0) and scores [B, K] (padded with
    any value: only the first num-boundaries entries are read; padding must follow a
    boundary equal to 0); threshold [B] float; judge [B] bool.
    """
    batch, length = draft.shape
    steps = torch.arange(length, device=draft.device)
    matches = (draft == target_next[:, :length]) & (steps < draft_lens[:, None])
    exact = matches.long().cumprod(dim=1).sum(dim=1)

    real = boundaries > 0
    passed = (scores >= threshold[:, None]) & real & judge[:, None]
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
