"""The rounds a PARSE worker runs that are not PARSE rounds: tier 0's plain decode steps and the
EAGLE-3 head's rounds (`ParseWorker._round` dispatches to them by the round's `Tier`).

Both reuse the PARSE round's parts (`_plan_window`, `_verify`, `_accept`, `_result`, `_record`
on `ParseWorker`): a window of c_n alone or of the head's k drafts is a verify window like any
other, so SGLang commits, counts and logs them as it does a PARSE round.
"""

from __future__ import annotations

import dataclasses

import torch
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.managers.utils import GenerationBatchResult

from parse_sglang.acceptance import Accepted
from parse_sglang.draft_chain import Draft
from parse_sglang.verify_pass import Committed, set_lengths


class OtherRounds:
    """`ParseWorker`'s tier-0 and head rounds (a mixin: it reads the worker's parts)."""

    def _head_round(self, batch: ScheduleBatch, committed: Committed, policies) -> GenerationBatchResult:
        """The tier HEAD: the EAGLE-3 head's k drafts from each request's carried input, one
        chain-only verify (no judge: the head drafts the target's own text, a target phase's
        included), SGLang's exact acceptance; the PARSE draft idles over what it emits."""
        set_lengths(batch, committed)
        drafts, head_graphed = self.head.draft(batch, committed, self.req_to_token_pool)  # [bs, k]
        exact = [dataclasses.replace(p, judged=False) for p in policies]
        no_confidence = torch.ones_like(drafts, dtype=torch.float32)  # the head's confidence is not read
        window = self._plan_window(committed, Draft(drafts, no_confidence, None, head_graphed), exact)
        chain_logits, probe_logits, verify_graphed = self._verify(batch, committed, window)
        accepted = self._accept(batch, committed, window, chain_logits, probe_logits, None)
        accepted = self.tp.share_accepted(accepted)
        graphed = head_graphed and verify_graphed
        result = self._result(batch, committed, window, accepted, chain_logits, graphed)
        lengths = self._record(batch.reqs, window, accepted, graphed, head=True)
        self._draft_worker.idle(batch.reqs, [kept + 1 for kept in lengths])
        return result

    def _decode_steps(self, batch: ScheduleBatch, committed: Committed, policies, steps: int):
        """Tier 0: `steps` plain decode steps for the batch, back to back on the device: each a
        verify window of c alone at P + j (SGLang's own zero-step EAGLE round) and SGLang's
        sampling of its row, whose token is the next step's c. SGLang commits the steps' tokens
        as one run (the KV of c_n and the first steps - 1 tokens is written); the result comes
        to the host once, and each step is counted as a round of L = 0."""
        bs = len(batch.reqs)
        nothing = torch.empty((bs, 0), dtype=torch.int64)  # on the host: nothing to copy (nor confidence)
        no_drafts = Draft(nothing, nothing, None, True)
        no_proposals = None  # the rejection rule's q of a sampled batch: [bs, 0, V]
        if self.rejection_sampling and not batch.sampling_info.is_all_greedy:
            no_proposals = torch.empty((bs, 0, self.model_runner.model_config.vocab_size), device=self.device)
        tokens, graphed, aux = [committed.last_tokens], True, []
        for j in range(steps):
            step = Committed(committed.seq_lens + j, committed.seq_lens_cpu + j, committed.rows, tokens[-1])
            window = self._plan_window(step, no_drafts, policies)
            chain_logits, probe_logits, step_graphed = self._verify(batch, step, window)
            accepted = self._accept(batch, step, window, chain_logits, probe_logits, no_proposals)
            accepted = self.tp.share_accepted(accepted)
            tokens.append(accepted.emitted[:, 0])
            graphed = graphed and step_graphed
            if self.head:  # a copy: a replayed graph hands back its static buffer, which the next step overwrites
                aux.append(self._verify_aux.clone())
        if self.head:  # the head extends over every step's row
            self._verify_aux = torch.cat(aux, dim=1)  # [bs, steps, K*H]
        if steps > 1:  # every step's token kept: a = steps - 1 per request, a constant per shape
            kept = self.constants.cached(
                ("decode_steps", bs, steps), lambda: torch.full((bs,), steps - 1, device=self.device)
            )
            accepted = Accepted(torch.stack(tokens[1:], dim=1), kept, kept, accepted.verdict)
        self._draft_worker.idle(batch.reqs, [steps] * bs)
        for req in batch.reqs:  # SGLang counts one verify (of 0 correct drafts) per round; each step is one
            req.spec_verify_ct += steps - 1
            for _ in range(steps - 1):
                req.update_spec_correct_drafts_histogram(0)
        result = self._result(batch, committed, window, accepted, chain_logits, graphed, steps)
        self._record(batch.reqs, window, accepted, graphed, steps)
        return result
