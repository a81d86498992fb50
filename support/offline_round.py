"""One round's window planning outside SGLang's scheduler, on whichever device the caller
names (`meta` to count bytes without a GPU): what tests/test_window.py and
benchmarks/metadata_cost.py measure. The CPU runtime must be on (the planner builds SGLang's
verify input)."""

from __future__ import annotations

import torch

from parse_sglang.attention.window import FullMaskBuffer, ShapeConstants
from parse_sglang.boundaries import TokenTexts
from parse_sglang.window_plan import RequestPolicy, Window, plan_window


class OfflineRound:
    """A batch of `batch` requests with one policy and `context` committed tokens each, and the
    per-process state a worker keeps (token texts, per-shape constants, the FULL-mask buffer,
    sized for `max_context`)."""

    def __init__(
        self, tokenizer, policy: RequestPolicy, batch: int, suffix_len: int, max_rows: int, max_context: int, device
    ):
        self.texts = TokenTexts(tokenizer, len(tokenizer))
        self.policy, self.batch, self.suffix_len, self.device = policy, batch, suffix_len, device
        self.constants = ShapeConstants(device)
        self.mask_buffer = FullMaskBuffer.for_pools(max_rows, batch, batch * max_context, max_context, device)

    def plan(self, drafts_host: torch.Tensor, context: int, fixed_probes: int) -> Window:
        return plan_window(
            drafts_host=drafts_host,
            confidence_host=torch.ones(drafts_host.shape),
            last_tokens=torch.zeros(self.batch, dtype=torch.int64, device=self.device),
            prefix_lens=torch.full((self.batch,), context, dtype=torch.int64, device=self.device),
            prefix_sum=self.batch * context,
            policies=[self.policy] * self.batch,
            texts=self.texts,
            suffix_ids=torch.zeros(self.suffix_len, dtype=torch.int64, device=self.device),
            fixed_probes=fixed_probes,
            constants=self.constants,
            mask_buffer=self.mask_buffer,
        )
