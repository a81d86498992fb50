"""What a PARSE round decided for each request (`Accepted`: emitted tokens, accept lengths,
exact vs judged counts, the judge's scores) and how its bonus token is drawn when SGLang's
chain verification did not give it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from sglang.srt.layers.sampler import top_k_top_p_min_p_sampling_from_probs_torch


@dataclass(frozen=True)
class Accepted:
    predict: torch.Tensor  # [bs * (L+1)] int32, emitted token at each chain node
    accept_index: torch.Tensor  # [bs, L+1] int32, flat chain rows of the emitted run, -1 padded
    accept_lens: torch.Tensor  # [bs] int32, a + 1
    exact: torch.Tensor  # [bs] draft tokens accepted by exact match
    judged: torch.Tensor  # [bs] draft tokens accepted only because the judge said yes
    scores: Optional[torch.Tensor]  # [bs, K'] judge score of each real probe (None: no probes)
    likelihood: Optional[torch.Tensor]  # [bs, K'] smallest draft-token probability up to each boundary


def bonus_tokens(batch, chain_logits: torch.Tensor, accepted: torch.Tensor) -> torch.Tensor:
    """t_a from chain row a (penalties, bias and grammar already applied by eagle_sample):
    argmax for an all-greedy batch, else sampled with each request's temperature / top-k /
    top-p / min-p (greedy requests have top-k 1, so they still get the argmax)."""
    rows = chain_logits.gather(1, accepted[:, None, None].expand(-1, 1, chain_logits.shape[-1])).squeeze(1)
    info = batch.sampling_info
    if info.is_all_greedy:
        return rows.argmax(dim=-1)
    probs = torch.softmax(rows / info.temperatures.view(-1, 1), dim=-1)
    return top_k_top_p_min_p_sampling_from_probs_torch(
        probs,
        info.top_ks,
        info.top_ps,
        info.min_ps,
        info.need_min_p_sampling,
        info.sampling_seed,
        batch.seq_lens + accepted,
    ).to(torch.int64)
