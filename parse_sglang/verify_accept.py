"""A round's acceptance in SGLang (steps 7-8): SGLang's own chain verification, then the
judge's extension, then the bonus token.

The exact part is `eagle_sample` on the chain rows (penalties, logit bias, grammar mask,
sampling; with `--speculative-use-rejection-sampling` the rejection rule against the draft's
proposals). The judge can only extend what it accepted, up to the request's acceptable length;
the bonus after a judged extension is drawn here from the target's row a with the request's
settings. a = min(max(a_exact, a_judge), acceptable length), a_judge the longest prefix of exact
matches (the target's argmax) and judged tokens; emitted: d_1..d_a, then t_a.
"""

from __future__ import annotations

from typing import Optional

import torch
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.speculative.eagle_utils import eagle_sample
from sglang.srt.speculative.spec_utils import GrammarTree, build_grammar_vocab_mask

from parse_sglang.acceptance import Accepted, accept_lengths, bonus_tokens
from parse_sglang.judge import JudgeProbe, Verdict, judge_window


def accept_round(
    batch,
    prefix_lens: torch.Tensor,  # [bs] P
    window,
    chain_logits: torch.Tensor,  # [bs * (L+1), V]
    probe_logits: Optional[torch.Tensor],  # [bs, K, V]
    chain,  # the verify input SGLang's eagle_sample reads (`ShapeConstants.chain_view`)
    proposals: Optional[torch.Tensor],  # [bs, L, V] the draft's q, or None (an all-greedy batch)
    rejection_sampling: bool,  # --speculative-use-rejection-sampling: eagle_sample reads q
    probe: Optional[JudgeProbe],
    answer_columns: Optional[torch.Tensor],
    watermark_state,
    hidden: Optional[torch.Tensor] = None,  # [bs, L+1, H] the chain rows' final hidden states (a judge head's input)
    head=None,  # the server's judge_head.JudgeHead, or None
) -> Accepted:
    bs, width = window.chain_tokens.shape
    device = chain_logits.device
    if rejection_sampling:  # the chain view is kept per shape: set (or clear) q every round
        chain.draft_probs = proposals.contiguous() if proposals is not None else None
    grammar_mask = None
    if batch.has_grammar:
        grammar_mask = build_grammar_vocab_mask(
            reqs=batch.reqs,
            tree=GrammarTree.from_linear_chain(window.chain_tokens),
            sampling_info=batch.sampling_info,
            device=device,
            barrier=None,
        )
    # SGLang's own chain verification; applies penalties / bias / grammar to chain_logits in place.
    planned = window.on_device
    predict, exact_lens, _ = eagle_sample(
        chain,
        batch,
        LogitsProcessorOutput(next_token_logits=chain_logits),
        grammar_mask,
        watermark_state=watermark_state,
    )
    if width == 1:  # tier 0: nothing drafted, nothing to judge; SGLang's sample of c_n's row is the token
        none = torch.zeros_like(planned.draft_lens)
        verdict = Verdict(None, None, torch.zeros((bs, 0), dtype=torch.bool, device=device), None)
        return Accepted(predict.view(bs, 1).to(torch.int64), none, none, verdict)
    exact = exact_lens.to(torch.int64) - 1
    drafts = window.chain_tokens[:, 1:]
    chain_logits = chain_logits.view(bs, width, -1)
    limit = torch.minimum(planned.draft_lens, planned.phase_limits)
    if not window.any_judged:  # SGLang's exact acceptance is the round's (a host-known fact)
        verdict = Verdict(None, None, torch.zeros_like(drafts, dtype=torch.bool), None)
        accepted = torch.minimum(exact, limit)
        emitted = torch.nn.functional.pad(drafts, (0, 1))
        emitted.scatter_(1, accepted[:, None], predict.view(bs, width).gather(1, accepted[:, None]).to(torch.int64))
        return Accepted(emitted, accepted, accepted, verdict)
    verdict = judge_window(window, chain_logits, probe_logits, probe, answer_columns, hidden, head)
    # Past SGLang's exact run the judge extends over the target's own (argmax) tokens and what it accepts.
    judge_len = accept_lengths(drafts, planned.draft_lens, verdict.top_tokens, verdict.passed).accepted
    judge_len = torch.where(planned.judged, judge_len, torch.zeros_like(judge_len))
    accepted = torch.minimum(torch.maximum(exact, judge_len), limit)
    # The bonus is SGLang's unless the judge took the request past its exact match: then it
    # is drawn from chain row a here.
    exact_bonus = predict.view(bs, width).gather(1, accepted[:, None]).squeeze(1).to(torch.int64)
    rows = chain_logits.gather(1, accepted[:, None, None].expand(-1, 1, chain_logits.shape[-1])).squeeze(1)
    own_bonus = bonus_tokens(batch.sampling_info, rows, prefix_lens + accepted)
    bonus = torch.where(accepted > exact, own_bonus, exact_bonus)
    emitted = torch.nn.functional.pad(drafts, (0, 1))
    emitted.scatter_(1, accepted[:, None], bonus[:, None])
    return Accepted(emitted, accepted, torch.minimum(exact, accepted), verdict)
