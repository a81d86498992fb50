"""Which draft prefix a round keeps: the longest in which every token is an exact match or accepted
by the judge (`judge.judge_window`), and what the round then emits.

Batched over requests with padded tensors, so the reference generator (batch of one) and the
SGLang worker run the same rule (`accept_lengths`). In the worker a round's decisions stay on the device (`Accepted`)
until one packed copy brings them to the host (`RoundResult`), where counters and target
phases are kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from parse_sglang.judge import Verdict
from parse_sglang.packing import fields_of, pack, unpack


@dataclass(frozen=True)
class AcceptedLengths:
    accepted: torch.Tensor  # [B] a: draft tokens kept
    exact: torch.Tensor  # [B] a_exact: leading draft tokens equal to the target's own
    judged: torch.Tensor  # [B] a - a_exact: tokens kept only because the judge said yes


def accept_lengths(
    draft: torch.Tensor, draft_lens: torch.Tensor, target_next: torch.Tensor, judged: torch.Tensor
) -> AcceptedLengths:
    """a: the longest prefix in which every draft token is the target's own or accepted by the judge.

    draft [B, L] (padded), draft_lens [B]; target_next [B, L+1]: t_j, the target's token after
    c_n d_1..d_j; judged [B, L] bool: the judge accepts d_j (`judge.judge_window`'s `passed`)."""
    length = draft.shape[1]
    steps = torch.arange(length, device=draft.device)
    real = steps < draft_lens[:, None]
    matches = (draft == target_next[:, :length]) & real
    exact = matches.long().cumprod(dim=1).sum(dim=1)
    accepted = ((matches | judged) & real).long().cumprod(dim=1).sum(dim=1)
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


@dataclass(frozen=True)
class Accepted:
    """What a round kept of each request's draft, on the device."""

    emitted: torch.Tensor  # [bs, L+1] int64: d_1..d_a, then the bonus t_a at column a (later columns unused)
    lengths: torch.Tensor  # [bs] int64 a: draft tokens kept
    exact_tokens: torch.Tensor  # [bs] int64: of them, the exact-match run
    verdict: Verdict

    @property
    def accept_lens(self) -> torch.Tensor:
        """[bs] int32 a + 1: tokens the round emits (SGLang's accept length, bonus included)."""
        return (self.lengths + 1).to(torch.int32)

    def accept_index(self, chain_index: torch.Tensor) -> torch.Tensor:
        """[bs, L+1] int32 flat chain rows of the emitted run, -1 padded; chain_index [bs, L+1]
        is every row's flat index (`ChainView.retrieve_index`)."""
        steps = chain_index[0]
        return torch.where(steps <= self.lengths[:, None], chain_index, -1).to(torch.int32)


@dataclass(frozen=True)
class RoundResult:
    """A round's decisions on the host: what its bookkeeping (counters, target phases,
    probe-score reports) reads. Made by ONE device-to-host copy (`round_result`)."""

    emitted: list[list[int]]  # [bs][L+1], as Accepted.emitted
    lengths: list[int]  # a per request
    exact_tokens: list[int]
    probe_scores: Optional[torch.Tensor]  # [bs, K'] (None: no probe rows this round)
    token_scores: Optional[torch.Tensor]  # [bs, L] (None: no request judged by a token judge)

    @property
    def judged_tokens(self) -> list[int]:
        return [a - e for a, e in zip(self.lengths, self.exact_tokens)]


def round_result(accepted: Accepted) -> RoundResult:
    """`accepted` on the host, in one packed copy."""
    verdict = accepted.verdict
    scores = [t for t in (verdict.probe_scores, verdict.token_scores) if t is not None]
    device = [accepted.emitted, accepted.lengths, accepted.exact_tokens, *scores]
    emitted, lengths, exact, *host_scores = unpack(pack(device).cpu(), fields_of(device))
    probe_scores = host_scores.pop(0) if verdict.probe_scores is not None else None
    token_scores = host_scores.pop(0) if verdict.token_scores is not None else None
    return RoundResult(emitted.tolist(), lengths.tolist(), exact.tolist(), probe_scores, token_scores)


def bonus_tokens(sampling_info, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """t_a from each request's chain row a, rows [bs, V] (penalties, bias and grammar already
    applied by eagle_sample): argmax for an all-greedy batch (a host-known fact), else sampled
    with each request's temperature / top-k / top-p / min-p (greedy requests have top-k 1, so
    they still get the argmax); positions [bs]: where the token goes (seeded sampling)."""
    if sampling_info.is_all_greedy:
        return rows.argmax(dim=-1)
    from sglang.srt.layers.sampler import top_k_top_p_min_p_sampling_from_probs_torch

    probs = torch.softmax(rows / sampling_info.temperatures.view(-1, 1), dim=-1)
    return top_k_top_p_min_p_sampling_from_probs_torch(
        probs,
        sampling_info.top_ks,
        sampling_info.top_ps,
        sampling_info.min_ps,
        sampling_info.need_min_p_sampling,
        sampling_info.sampling_seed,
        positions,
    ).to(torch.int64)
