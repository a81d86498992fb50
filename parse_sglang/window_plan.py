"""Steps 2-5 of a PARSE round: where each request's probes go, and the batch's verify window.

The host's share is O(batch x window): the draft tokens come over once (their text places
the boundaries), the boundaries go back once as a [bs, K] tensor, plus a few per-request
flags. The window itself is built on the device (`ParseVerifyInput.for_round`). The host
decisions (`ProbePlan`) are what a tensor-parallel server's ranks take from rank 0
(`plan_window`'s `share`, parse_sglang.tp_sync), so their windows are the same.

Every request of a batch gets K probes (SGLang needs one window length per batch):
requests with fewer real boundaries, or with the judge off, get padding probes at unused
draft positions, whose scores are never read. K is the batch's largest real count, or
K_max every round when the window is fixed (what a captured CUDA graph replays).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from parse_sglang.acceptance import pad_ragged
from parse_sglang.attention.window import WindowShape
from parse_sglang.boundaries import draft_boundaries
from parse_sglang.config import ParseConfig
from parse_sglang.verify_input import ParseVerifyInput


@dataclass(frozen=True)
class RequestPolicy:
    """What a round needs to know about one request (resolved on the host, O(1) each)."""

    config: ParseConfig
    budget: int  # draft tokens worth writing (L, capped by the output left)
    judged: bool  # the judge may extend this request's acceptance (its config says how)
    sampled: bool  # sampled on CPU: served target-only (worker docstring)
    stop_ids: frozenset  # token ids that end the output (EOS, stop_token_ids); empty: ignore_eos


@dataclass(frozen=True)
class Window:
    """The verify window of a round and what acceptance needs to read it."""

    verify_input: ParseVerifyInput
    shape: WindowShape
    chain_tokens: torch.Tensor  # [bs, L+1] c_n, d_1..d_L
    draft_lens: torch.Tensor  # [bs] draft tokens that may be accepted (budget, stop token)
    boundaries: torch.Tensor  # [bs, K'] real boundaries b_k the judge decides at, padded with 0
    probe_slots: torch.Tensor  # [bs, K'] index of each boundary's probe among the request's window probes
    judged: torch.Tensor  # [bs] bool
    uses_probe: torch.Tensor  # [bs] bool: judged with the probe (its boundaries have probe rows)
    uses_likelihood: torch.Tensor  # [bs] bool: judged by the draft tokens' target probabilities
    sampled: torch.Tensor  # [bs] bool
    thresholds: torch.Tensor  # [bs] τ
    likelihood_thresholds: torch.Tensor  # [bs] λ
    configs: list  # [bs] ParseConfig

    @property
    def width(self) -> int:
        return self.chain_tokens.shape[1]


def cut_at_stop(draft: Sequence[int], stop_ids: frozenset) -> int:
    """Length of `draft` up to and including its first stop token (the acceptable length)."""
    for j, token in enumerate(draft):
        if token in stop_ids:
            return j + 1
    return len(draft)


def with_padding_probes(bounds: list[int], count: int, length: int) -> list[int]:
    """`bounds` plus the smallest unused draft positions, sorted, `count` in all (≤ length)."""
    taken = set(bounds)
    extra = [b for b in range(1, length + 1) if b not in taken][: count - len(bounds)]
    return sorted(bounds + extra)


@dataclass(frozen=True)
class ProbePlan:
    """Steps 1-2 of a round as host data: the drafts and where their probes go, the
    round's decisions taken on the host (the boundaries come from the draft's text). A
    tensor-parallel server builds every rank's window from rank 0's (`tp_sync`)."""

    drafts: torch.Tensor  # [bs, L] int64, d_1..d_L
    draft_lens: torch.Tensor  # [bs] int64, draft tokens that may be accepted (budget, stop token)
    judged: torch.Tensor  # [bs] bool, the judge may extend this request's acceptance
    probed: torch.Tensor  # [bs] bool, its boundaries get probe rows (judge_mode "probe" / "both")
    bounds: torch.Tensor  # [bs, L] int64, real boundaries b_1 < ... < b_K, then 0s

    def real_bounds(self) -> list[list[int]]:
        return [[b for b in row if b > 0] for row in self.bounds.tolist()]


def place_probes(drafts_host: torch.Tensor, policies: Sequence[RequestPolicy], tokenizer) -> ProbePlan:
    """Each request's acceptable draft length and real probe boundaries (host work)."""
    rows = drafts_host.tolist()
    length = drafts_host.shape[1]
    draft_lens = [0 if p.sampled else cut_at_stop(row[: p.budget], p.stop_ids) for row, p in zip(rows, policies)]
    bounds = [
        draft_boundaries(tokenizer, row[:n], p.config.probe_stride, p.config.delimiters) if p.judged else []
        for row, n, p in zip(rows, draft_lens, policies)
    ]
    return ProbePlan(
        drafts=drafts_host,
        draft_lens=torch.tensor(draft_lens, dtype=torch.int64),
        judged=torch.tensor([p.judged for p in policies], dtype=torch.bool),
        probed=torch.tensor([p.judged and p.config.uses_probe for p in policies], dtype=torch.bool),
        bounds=torch.tensor([b + [0] * (length - len(b)) for b in bounds], dtype=torch.int64).view(len(rows), length),
    )


def plan_window(
    *,
    drafts: torch.Tensor,
    drafts_host: torch.Tensor,
    last_tokens: torch.Tensor,
    prefix_lens: torch.Tensor,
    prefix_sum: int,
    policies: Sequence[RequestPolicy],
    tokenizer,
    suffix_ids: Optional[torch.Tensor],
    fixed_probes: Optional[int],
    full_mask_form: bool,
    share: Callable[[ProbePlan], ProbePlan] = lambda plan: plan,
) -> Window:
    """drafts [bs, L] and last_tokens / prefix_lens [bs] on the device, drafts_host the
    same drafts on the host; suffix_ids [m] on the device (None: no judge on this server);
    fixed_probes: K_max for a fixed window, None for the batch's own K; share: the plan
    every rank builds its window from (`TpSync.share_plan`: rank 0's)."""
    device = drafts.device
    length = drafts.shape[1]
    plan = share(place_probes(drafts_host, policies, tokenizer))
    if plan.drafts is not drafts_host:  # another rank's drafts
        drafts = plan.drafts.to(device)
    bounds = plan.real_bounds()
    probed = [b if p else [] for b, p in zip(bounds, plan.probed.tolist())]
    num_probes = max(map(len, probed)) if fixed_probes is None else fixed_probes
    window_bounds = [with_padding_probes(b, num_probes, length) for b in probed]
    shape = WindowShape(length, num_probes, len(suffix_ids) if num_probes else 0)
    chain_tokens = torch.cat([last_tokens[:, None], drafts], dim=1)
    # Same width as the boundaries; a request judged without probes reads none (uses_probe off).
    probe_slots = [[wb.index(b) for b in p] if p else [0] * len(b) for b, p, wb in zip(bounds, probed, window_bounds)]
    return Window(
        verify_input=ParseVerifyInput.for_round(
            shape,
            prefix_lens=prefix_lens,
            prefix_sum=prefix_sum,
            chain_tokens=chain_tokens,
            boundaries=torch.tensor(window_bounds, dtype=torch.int64).view(len(bounds), num_probes).to(device),
            suffix_ids=suffix_ids if suffix_ids is not None else torch.zeros(0, dtype=torch.int64, device=device),
            full_mask_form=full_mask_form,
        ),
        shape=shape,
        chain_tokens=chain_tokens,
        draft_lens=plan.draft_lens.to(device),
        boundaries=pad_ragged(bounds, 0, torch.int64).to(device),
        probe_slots=pad_ragged(probe_slots, 0, torch.int64).to(device),
        judged=plan.judged.to(device),
        uses_probe=plan.probed.to(device),
        uses_likelihood=torch.tensor([p.config.uses_likelihood for p in policies], device=device) & plan.judged.to(device),
        sampled=torch.tensor([p.sampled for p in policies], device=device),
        thresholds=torch.tensor([p.config.threshold for p in policies], device=device),
        likelihood_thresholds=torch.tensor([p.config.likelihood_threshold for p in policies], device=device),
        configs=[p.config for p in policies],
    )
