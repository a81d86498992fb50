"""PARSE as an SGLang speculative worker (`--speculative-algorithm PARSE`).

`ParseWorker._round` is one PARSE round (docs/design.md §1) for a whole decode batch: the
draft writes d_1..d_L, boundaries are placed, ONE target TARGET_VERIFY forward reads the
chain rows and every probe, the longest acceptable prefix plus a bonus token is kept.
The rest of the class is SGLang bookkeeping around it.

Conventions this worker keeps with SGLang's scheduler (sync V2 schema, no overlap):
- `batch.seq_lens[i]` = P = committed tokens with KV; the round's input c_n (the last emitted
  token) is `batch.spec_info.bonus_tokens[i]`, on the device: every round and the prefill
  return it as `next_draft_input` (an `EagleDraftInput`, which SGLang filters and merges with
  the batch). The verify window occupies req_to_token[P : P + N] (SGLang over-allocates
  2 * N_max slots per decode round), chain rows first, so the KV of the accepted prefix
  c_n, d_1..d_a is already in place and SGLang's `kv_committed_len += a + 1` commits it.
- The draft has its own KV pool over the same slots, un-shifted: slot p holds the draft's
  KV of token p. Its steps run as SGLang's EAGLE topk=1 chain (`draft_chain.DraftChain`): on
  a GPU one CUDA-graph replay of L+1 decode steps (inputs c_n, d_1..d_L), so its KV exists for
  every slot that can become committed; eagerly L forwards, the first an extend over c_n and
  a kept d_L of the round before. An adaptive server's tier-0 rounds, copies and deferred
  prefills (`_defers_draft`) skip the draft, and the round that drafts again first extends the
  draft over what they committed (`DraftChain.catch_up`).
- Host and device meet three times a round (docs/gpu.md §9): the drafts come to the host (their
  text places the boundaries) packed with their confidences (where an adaptive server's verify
  stops), the round's plan goes to the device as one packed tensor (`window_plan`), and after
  acceptance its result comes back as one packed tensor (`acceptance.round_result`), from which
  counters and target phases are kept.
- The verify window is built on the device (`window_plan`, `attention.window`); it has a
  fixed shape (K_max probes, N_max rows) whenever the target's decode CUDA graph can replay
  it (`verify_window` "auto"), else the batch's own probe count; a batch in which no request
  probes verifies only its L+1 chain rows (captured as a graph of its own).
- The round's L is the draft-length policy's (`draft_length.py`): the server's, or with
  `adaptive` the tier `adaptive.AdaptiveDraftLength` chooses for the batch, from the costs it measured at the round's host/device crossings and
  the acceptance it saw. Tier 0 (`_decode_steps`): up to `tier0_steps` plain decode steps back
  to back on the device, the draft idle, the result on the host once.
- With an EAGLE-3 head (`eagle3_head`, parse_sglang/eagle3_head.py) the controller's tier `HEAD`
  runs head rounds (`_head_round`: the head's k drafts, a chain-only verify, exact acceptance)
  beside tier 0 and the drafting tiers, every verify and prefill captures the target's aux states,
  and `_result` extends the head after every round over what it emitted.
- Output: `next_token_ids` is [bs * (L+1)], request i's emitted tokens d_1..d_a, t_a at
  i*(L+1) .. i*(L+1)+a; `accept_lens` = a + 1 (bonus included).
- The exact part of acceptance is SGLang's own chain verification (`eagle_sample` on the
  chain rows: penalties, logit bias, grammar mask, sampling; on CPU its sampling rules run as
  the CPU runtime's torch versions): for a sampled request, the target-only rule, or with
  `--speculative-use-rejection-sampling` the rejection rule against the draft's proposal
  distribution (`draft_chain`: a sampled request's draft samples). The judge can only extend
  what it accepted; the bonus token after a judged extension is sampled from the target's row
  with the request's settings (seeded where the request has a `sampling_seed`).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Optional

import torch
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.layers.logprob_processor import compute_spec_logprobs
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.managers.tp_worker import TpModelWorker
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
from sglang.srt.runtime_context import get_device, get_model, get_serving, get_spec
from sglang.srt.server_args import ServerArgs
from sglang.srt.speculative.base_spec_worker import BaseSpecWorker

from parse_sglang.acceptance import Accepted, round_result
from parse_sglang.adaptive import AdaptiveDraftLength
from parse_sglang.draft_length import HEAD, KINDS, Tier
from parse_sglang.attention.window import WindowGeometry, shape_constants
from parse_sglang.boundaries import TokenTexts
from parse_sglang.counters import ServerTotals, record_round_stats
from parse_sglang.draft_chain import Draft, DraftChain
from parse_sglang.draft_length import FixedDraftLength
from parse_sglang.eagle3_head import HeadChain
from parse_sglang.judge import answer_columns
from parse_sglang.judge_head import load as load_judge_head
from parse_sglang.other_rounds import OtherRounds
from parse_sglang.packing import fields_of, pack, unpack
from parse_sglang.retrieval import Retrieval, copy_budgets, window_length, with_copies
from parse_sglang.verify_accept import accept_round
from parse_sglang.scheduler_patches.verify_graph import VerifyGraphs
from parse_sglang.settings import (
    ParseConfig,
    judge_probe_for,
    server_parse_config,
    target_tokenizer,
)
from parse_sglang.target_phase import update_target_phases
from parse_sglang.tp_sync import TpSync
from parse_sglang.verify_pass import Committed, next_round_input, set_lengths, target_verify
from parse_sglang.worker_setup import WorkerSetup
from parse_sglang.window_plan import Window, plan_window, request_policy

logger = logging.getLogger(__name__)


class ParseWorker(OtherRounds, WorkerSetup, BaseSpecWorker):
    def __init__(self, server_args: ServerArgs, gpu_id: int, nccl_port: int, target_worker: TpModelWorker):
        super().__init__()
        self.server_args = server_args
        self._target_worker = target_worker
        self.device = get_device().device
        spec = get_spec()
        self.config: ParseConfig = server_parse_config(server_args, spec.speculative_num_steps)
        self.speculative_num_steps = self.config.draft_budget
        self.speculative_num_draft_tokens = self.config.draft_budget + 1  # chain width; meta_info divides by it
        tokenizer_path, trust = get_serving().tokenizer_path, get_model().trust_remote_code
        self.texts = TokenTexts(target_tokenizer(tokenizer_path, trust), self.model_runner.model_config.vocab_size)
        self.probe = (
            judge_probe_for(tokenizer_path, self.config.judge_question, trust) if self.config.uses_probe else None
        )
        self.suffix_ids = None
        self.answer_columns = None
        if self.probe:
            self.suffix_ids = torch.tensor(self.probe.suffix_ids, dtype=torch.int64, device=self.device)
            self.answer_columns = answer_columns(self.probe, self.device)
        self.geometry = WindowGeometry(self.config, len(self.probe.suffix_ids) if self.probe else 0)
        self.window_max = self.geometry.max_rows
        reserved = spec.max_speculative_num_draft_tokens
        if reserved is not None and reserved < self.window_max:
            raise ValueError(
                f"max_speculative_num_draft_tokens={reserved} is below PARSE's "
                f"verify window {self.window_max}; the KV over-allocation would not hold a round"
            )
        if target_worker.model_runner.is_hybrid_swa:
            raise ValueError("PARSE does not support hybrid sliding-window targets: allowed are full-attention models")
        self.constants = shape_constants(self.model_runner)  # per-shape tensors, kept for the process
        self.mask_buffer = None  # the FULL-mask buffer, reserved with the memory pools (GPU backends)
        self.verify_graphs = VerifyGraphs(self.model_runner)
        self.rejection_sampling = spec.speculative_use_rejection_sampling
        self._draft_worker = DraftChain(
            server_args,
            gpu_id,
            nccl_port,
            target_worker,
            self.config.chain_lengths,
            samples=self.config.judge or self.rejection_sampling,
        )
        self.draft_length = (
            AdaptiveDraftLength.of(self.config) if self.config.adaptive else FixedDraftLength(self.config.draft_budget)
        )
        self.head = None  # the EAGLE-3 head that runs tier 0 (`eagle3_head`)
        if self.config.eagle3_head:
            if not self.config.adaptive:
                raise ValueError("eagle3_head needs adaptive: true (head rounds run where the target would run alone)")
            self.head = HeadChain(
                server_args, gpu_id, nccl_port, target_worker, self.config.eagle3_head, self.config.eagle3_steps
            )
        self.judge_head = None  # judge_mode "head": P(harmful) from the verify's hidden states (`judge_head`)
        if self.config.judge_head:
            self.judge_head = load_judge_head(self.config.judge_head, self.model_runner.model_config.hf_config)
            self.judge_head = dataclasses.replace(self.judge_head, weights=self.judge_head.weights.to(self.device))
        self.retrieval = None  # copies of text a request has seen (`retrieval`: an adaptive server's choice)
        if self.config.retrieval and self.config.adaptive:
            self.retrieval = Retrieval(self.config.retrieval_min_match, self.config.retrieval_corpus)
        self.totals = ServerTotals()  # get_server_info()'s "parse" entry
        self.tp = TpSync.of_tp_group()  # rank 0's plan and decisions on every TP rank
        # The last verify's captured hidden states: the EAGLE-3 head's aux states, or the judge head's final ones.
        self._verify_aux = None
        self._drafting = False  # the last round drafted (`_defers_draft`)
        self._decode_bs = 0  # the last round's batch size (`_defers_draft`)
        logger.info(
            "PARSE worker: L=%d, probe_stride=%d, judge=%s, threshold=%.3f, probe suffix m=%d, N_max=%d, window=%s",
            self.config.draft_budget,
            self.config.probe_stride,
            self.config.judge,
            self.config.threshold,
            len(self.probe.suffix_ids) if self.probe else 0,
            self.window_max,
            self.config.verify_window,
        )

    # ----- one PARSE round --------------------------------------------------------------

    def _round(self, batch: ScheduleBatch) -> GenerationBatchResult:
        """One PARSE round for every request of a decode batch (docs/design.md §1, steps 1-9)."""
        committed = Committed.of(batch, self.device)
        policies = [request_policy(req, self.config) for req in batch.reqs]
        copies = self._copies(batch, policies)  # each request's retrieved continuation, on the host
        tier, steps, width = self._draft_length(batch, policies, copies)  # the round's tier; the window's L
        if tier == HEAD:  # the EAGLE-3 head's k drafts, verified exactly
            return self._head_round(batch, committed, policies)
        if width == 0:  # tier 0: plain decode steps, the draft idle
            return self._decode_steps(batch, committed, policies, steps)
        draft = self._draft(batch, committed, tier.length)  # 1. d_1..d_L, their confidence (and their q)
        window = self._plan_window(committed, draft, policies, copies, width)  # 2.-5. copies, boundaries, probes
        chain_logits, probe_logits, verify_graphed = self._verify(batch, committed, window)  # 6. ONE forward
        accepted = self._accept(batch, committed, window, chain_logits, probe_logits, draft.proposals)  # 7.-8.
        accepted = self.tp.share_accepted(accepted)  # TP: rank 0's decisions on every rank
        graphed = draft.graphed and verify_graphed
        result = self._result(batch, committed, window, accepted, chain_logits, graphed)  # 9. SGLang commits
        kept = self._record(batch.reqs, window, accepted, graphed)  # counters, target phases, the round's costs
        # the draft's KV holds its own chain, not a copy: it catches up over what a copy committed
        self._draft_worker.after_round(batch.reqs, tier.length, kept, window.plan.copied.tolist())
        return result

    def _copies(self, batch: ScheduleBatch, policies) -> Optional[list]:
        """Each request's `retrieval.Copy` (or None), at most its budget; None where the server does
        not retrieve, or the rejection rule would read a copy's q, which no model proposed."""
        if self.retrieval is None or (self.rejection_sampling and not batch.sampling_info.is_all_greedy):
            return None
        return self.retrieval.propose(batch.reqs, copy_budgets(policies))

    def _draft_length(self, batch: ScheduleBatch, policies, copies) -> tuple[Tier, int, int]:
        """The round's `Tier`: the server's L, or the tier the adaptive controller chooses (rank 0's
        on a tensor-parallel server: its costs are its own measurements); the window's L, which
        holds the copies the controller chose to verify (`retrieval.window_length`); and the decode steps
        a tier-0 round runs: `tier0_steps`, at most L + 1 (the slots SGLang reserves per round)
        and the longest output a request has left, and 1 where a step's token must reach the host before
        the next is sampled (a grammar, penalties) or logprobs are returned (every rank knows the
        same of its batch)."""
        info = batch.sampling_info
        stepwise = (
            batch.has_grammar
            or batch.return_logprob
            or (info.acc_additive_penalties is not None or info.acc_scaling_penalties is not None)
        )
        longest = max(self.config.tier0_steps if p.left is None else p.left for p in policies)
        steps = 1 if stepwise else max(min(self.config.tier0_steps, self.config.draft_budget + 1, longest), 1)
        tier = self.draft_length.choose(batch.reqs, policies, self._rows_of(policies), steps, copies)
        copying = self.draft_length.copying
        width = window_length(self.config.tiers, tier.length, copies, copying) if any(copying) else tier.length
        kind, length, steps, width = self._shared(KINDS.index(tier.kind), tier.length, steps, width)
        tier = Tier(KINDS[kind], length)
        self._drafting = tier.kind == "draft"  # what the next prefill defers by (the same on every TP rank)
        self._decode_bs = len(batch.reqs)
        return tier, steps, width

    def _rows_of(self, policies):
        """L -> the verify rows per request of this batch at draft length L."""
        probes = self.probe is not None and any(p.judged and p.config.uses_probe for p in policies)
        return lambda L: self.geometry.rows(L, probes)

    def _shared(self, *values: int) -> tuple[int, ...]:
        """What the policy chose per round (its tier, tier 0's steps, the window): rank 0's on every TP rank."""
        return self.tp.share_choice(*values) if self.draft_length.per_round else values

    def _draft(self, batch: ScheduleBatch, committed: Committed, length: int) -> Draft:
        """d_1..d_L from c_n, with each one's confidence and proposal distribution, and whether
        the draft ran as one graph replay (`DraftChain.draft`: L + 1 draft decode steps in one
        replay, or eagerly L forwards, the first an extend); L = 0 (a
        round of copies alone): nothing, on the host."""
        if length == 0:
            nothing = torch.empty((len(batch.reqs), 0), dtype=torch.int64)
            return Draft(nothing, nothing.float(), None, True)
        set_lengths(batch, committed)
        return self._draft_worker.draft(batch, committed.last_tokens, committed.rows, length)

    def _plan_window(self, committed: Committed, draft: Draft, policies, copies=None, width: int = 0) -> Window:
        """Boundaries per request (the drafts' and their confidences' one trip to the host, packed),
        then one device-built window for all of them (the plan's one trip to the device). The
        window holds the L drafts or, where the controller chose copies (`copying`), `width` rows
        of drafts and copies."""
        drafted = [draft.tokens, draft.confidence]  # [bs, L] each
        drafts_host, confidence_host = unpack(pack(drafted).cpu(), fields_of(drafted))
        self.draft_length.drafts_on_host(draft.caught_up)  # the end of the round's draft part (its measured cost)
        copying, counts = self.draft_length.copying, None
        if any(copying):  # [bs, width]: each row its draft or its copy, then padding no request may keep
            drafts_host, confidence_host, counts = with_copies(drafts_host, confidence_host, copies, copying, width)
        return plan_window(
            drafts_host=drafts_host,
            confidence_host=confidence_host,
            last_tokens=committed.last_tokens,
            prefix_lens=committed.seq_lens,
            prefix_sum=int(committed.seq_lens_cpu.sum()),
            policies=policies,
            texts=self.texts,
            suffix_ids=self.suffix_ids,
            fixed_probes=self.geometry.max_probes(drafts_host.shape[1]) if self._fixed_window() else None,
            constants=self.constants,
            mask_buffer=self.mask_buffer,
            share=self.tp.share_plan,  # TP: rank 0's drafts and boundaries on every rank
            drafted=counts,
            copied=list(copying) if counts else None,
        )

    def _verify(self, batch: ScheduleBatch, committed: Committed, window: Window):
        """6. ONE target forward over every request's window (`verify_pass.target_verify`)."""
        req_to_token = self.req_to_token_pool.req_to_token
        # The heads' input: the target's hidden states of the window's rows.
        aux = self.head is not None or self.judge_head is not None
        chain, probes, graphed, aux = target_verify(
            self.target_worker, self.verify_graphs, req_to_token, batch, committed, window, aux
        )
        if aux is not None:  # [bs, chain rows, K*H]: the rows the head extends over
            self._verify_aux = aux.view(len(batch.reqs), window.shape.rows, -1)[:, : window.chain_rows]
        return chain, probes, graphed

    def _accept(self, batch, committed: Committed, window: Window, chain_logits, probe_logits, proposals):
        """7.-8. SGLang's chain verification, the judge's extension, the bonus (`verify_accept`);
        proposals: [bs, L, V] of every draft token, the verified ones read."""
        chain = self.constants.chain_view(window.chain_tokens)
        if proposals is not None:
            proposals = proposals[:, : window.shape.draft_len]
        watermark = self.target_worker.model_runner.watermark_state
        hidden = self._verify_aux if self.judge_head is not None else None
        return accept_round(
            batch,
            committed.seq_lens,
            window,
            chain_logits,
            probe_logits,
            chain,
            proposals,
            self.rejection_sampling,
            self.probe,
            self.answer_columns,
            watermark,
            hidden,
            self.judge_head,
        )

    def _record(self, reqs, window: Window, accepted: Accepted, graphed: bool, steps: int = 1, head: bool = False):
        """The round's result on the host (its one copy back): counters, target phases, and
        what the draft-length policy learns (an adaptive server's: the round's costs, each request's acceptance;
        called after `_result`, so that the head's extend is in the round's measured cost);
        steps: the verify passes of a tier-0 round; head: a head round. Returns each request's kept drafts."""
        result = round_result(accepted)
        self.draft_length.after_round(reqs, window, result, steps)
        record_round_stats(self.totals, reqs, window, result, graphed, steps, head)
        update_target_phases(
            self.texts,
            reqs,
            window.configs,
            window.plan.judged.tolist(),
            window.plan.draft_lens.tolist(),
            result.lengths,
            result.emitted,
        )
        return result.lengths

    def _result(
        self,
        batch,
        committed: Committed,
        window: Window,
        accepted: Accepted,
        chain_logits,
        graphed: bool,
        steps: int = 1,
    ):
        """What SGLang's scheduler commits; `graphed` (the draft chain and the verify both ran
        as graph replays) is what its decode log and metrics report as "cuda graph"; steps:
        the tokens per request that are no accepted draft (the bonus, or a tier-0 round's
        decode steps)."""
        width = accepted.emitted.shape[1]
        chain_output = LogitsProcessorOutput(next_token_logits=chain_logits)
        next_token_ids = accepted.emitted.reshape(-1).to(torch.int32)
        if batch.return_logprob:
            accept_index = accepted.accept_index(self.constants.chain_view(window.chain_tokens).retrieve_index)
            compute_spec_logprobs(batch, chain_output, next_token_ids, accept_index=accept_index)
        bonus = accepted.emitted.gather(1, accepted.lengths[:, None]).squeeze(1)
        result = GenerationBatchResult(
            logits_output=chain_output,
            next_token_ids=next_token_ids,
            accept_lens=accepted.accept_lens,
            new_seq_lens=committed.seq_lens + accepted.accept_lens,
            next_draft_input=next_round_input(bonus),
            speculative_num_draft_tokens=width,
            num_non_draft_tokens_per_req=steps,
            can_run_cuda_graph=graphed,
        )
        if self.head:  # every round: the head's KV over what it emitted, its next input on next_draft_input
            req_to_token = self.req_to_token_pool.req_to_token
            self.head.extend(batch, committed, req_to_token, self._verify_aux, accepted, result.next_draft_input)
        return result

    # ----- SGLang bookkeeping around the round ------------------------------------------

    def forward_batch_generation(
        self, batch: ScheduleBatch, on_publish=None, pp_proxy_tensors=None
    ) -> GenerationBatchResult:
        if batch.forward_mode.is_extend():
            return self._prefill(batch)
        return self._round(batch)

    def _prefill(self, batch: ScheduleBatch) -> GenerationBatchResult:
        """Target prefill (samples the first token, the first round's c_n), then the draft
        over the same slots, or not yet (`_defers_draft`)."""
        aux = CaptureHiddenMode.FULL if self.head else None  # the head reads every prompt row's aux states
        result = self.target_worker.forward_batch_generation(batch, capture_hidden_mode=aux)
        self._draft_worker.prefill(batch, defer=self._defers_draft(batch))
        result.new_seq_lens = batch.seq_lens
        if self.head:  # never deferred: its inputs exist only during this forward
            result.next_draft_input = self.head.prefill(
                batch, result.logits_output.hidden_states, result.next_token_ids
            )
        else:
            result.next_draft_input = next_round_input(result.next_token_ids)
        return result

    def _defers_draft(self, batch: ScheduleBatch) -> bool:
        """Whether the draft skips this prefill, its first drafting round extending it over the
        whole sequence instead (`DraftChain.catch_up`); on an adaptive server only, not a PD
        prefill server's (its decode server reads the draft KV it transfers):
        - while the last round ran tier 0: the draft may never be needed (a draft costing 0.9 of
          its target held SmolLM2's default server at 0.86x target-only by its prefills alone);
        - where the controller does not expect drafting to repay the draft's prefill in the batch
          these requests join (`AdaptiveDraftLength.prefills_draft`; rank 0's on a TP server);
        - where a request reuses cached slots: tier-0 rounds and deferred prefills commit tokens
          without draft KV, and a radix hit on them would feed the draft another request's
          missing KV (drafts wrong, output still the target's)."""
        if not self.config.adaptive or self.server_args.disaggregation_mode == "prefill":
            return False
        if not self._drafting or any(batch.prefix_lens):
            return True
        bs, tokens = self._decode_bs + len(batch.reqs), sum(batch.extend_lens)
        (prefills,) = self._shared(self.draft_length.prefills_draft(bs, tokens, self._rows_of(())))
        return not prefills

    def _fixed_window(self) -> bool:
        """K_max probes every round a request probes: "fixed", or "auto" when the target's
        decode CUDA graph replays the verify (its captured width is N_max)."""
        mode = self.config.verify_window
        return mode == "fixed" or (mode == "auto" and self.verify_graphs.captured)
