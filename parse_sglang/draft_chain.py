"""Step 1 of a PARSE round, the draft's L+1 decode steps, run by SGLang's own EAGLE
multi-step draft machinery, so that on a GPU the whole loop is ONE CUDA-graph replay.

PARSE's draft is EAGLE's topk=1 chain with `num_steps = L + 2`: the chain starts at
c_n (the round's input token, at position P = the committed length), step i writes the
draft's KV of its input at `req_to_token[P + i]` and attends to `[0, P + i]`, and
`draft_tokens` = [c_n, d_1 .. d_{L+1}] (the last step's output d_{L+1} is unused: that
step runs only to write d_L's draft KV, so every slot that can become committed has it).
`DraftChain` is SGLang's `StandaloneDraftWorker` (its own draft model, no shared embeddings,
an `EagleDraftWorker`) configured for that chain, and runs
- `prepare_for_draft` (per-step write slots, positions, the draft ForwardBatch),
- on a GPU with graphs, `EAGLEDraftCudaGraphRunner` replaying `draft_forward` for the
  batch's padded size, with the multi-step attention metadata planned out of the graph
  (`FlashInferMultiStepDraftBackend` / Triton, built by SGLang's `DraftBackendFactory`);
- otherwise the same `draft_forward` eagerly (on CPU: the torch-native multi-step draft
  backend of cpu/torch_native_draft.py), which is what CI executes.
The draft's KV pool is un-shifted over the target's slots (slot p holds the draft's KV of
token p): the prompt is prefilled over the target's slots (`prefill`), and no draft-extend
graph or backend exists.

An adaptive server drafts at several lengths (tiers, parse_sglang/adaptive.py): each tier L
has its own chain of L + 2 steps, with its own multi-step attention backend, topk=1 chain
buffers and graphs (`ChainTier`, all kept: a captured graph reads its buffers at their
addresses), and `draft(..., length)` runs the tier's. Tier 0 (plain decode steps) has no
chain: the draft idles (`idle` counts the tokens it missed) and is extended over them when
drafting resumes (`catch_up`, draft extends); so is a request whose prefill the worker deferred
(`prefill(..., defer=True)`: the whole sequence).

Each drafted token's confidence, the draft's top-1 probability at its step (softmax of the
step's logits, at temperature 1), is written on the device by the chain itself
(`draft_forward`: inside the captured graph on a GPU) into a buffer kept for the process, and
travels to the host with the drafts in the one copy the round makes before its verify.

Greedy requests draft the argmax. Where drafts are sampled (`samples`: the server's judge is
on, so that samples of one prompt do not share the draft's argmax text as their judged spans,
or `--speculative-use-rejection-sampling` is on, whose rule needs the draft's distribution), a
sampled request's draft samples each step with the request's temperature (SGLang's
`sample_draft_proposal`, drawn on the device inside the chain) and keeps its proposal
distribution q: the rejection rule accepts with min(1, p/q); the target-only rule takes the
draft tokens as point proposals, which keeps the target's distribution for any proposal (but
accepts an argmax proposal more often: a lossless server without rejection sampling drafts the
argmax, as STANDALONE does). SGLang's chain samples only under that switch, so a sampling chain
(its capture and its rounds) runs with it on (`sampled_proposals`): an all-greedy batch still
replays the argmax chain, as SGLang captures it, token for token.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import logging
from dataclasses import dataclass
from typing import NamedTuple, Optional, Sequence

import torch
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.managers.tp_worker import TpModelWorker
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
from sglang.srt.runtime_context import get_context, get_schedule, get_spec
from sglang.srt.server_args import ServerArgs
from sglang.srt.speculative.draft_utils import DraftBackendFactory
from sglang.srt.speculative.eagle_info import EagleDraftInput
from sglang.srt.speculative.eagle_worker_common import prepare_for_draft
from sglang.srt.speculative.standalone_worker_v2 import StandaloneDraftWorker

from parse_sglang.request_state import state_of

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def sampled_proposals(samples: bool):
    """With `samples`, SGLang's `speculative_use_rejection_sampling` on while the draft chain
    captures or runs (its runtime-context override, as SGLang's adaptive-steps worker changes
    its step count), so that a sampled batch's draft samples and keeps q; the user's own
    setting is restored after, and is what the target's verification reads."""
    if not samples or get_spec().speculative_use_rejection_sampling:
        yield
        return
    get_context().override("parse.draft_chain", speculative_use_rejection_sampling=True)
    try:
        yield
    finally:
        get_context().override("parse.draft_chain", speculative_use_rejection_sampling=False)


class Draft(NamedTuple):
    """Step 1's output: what the round verifies, on the device."""

    tokens: torch.Tensor  # [bs, L] int64 d_1..d_L
    confidence: torch.Tensor  # [bs, L] float32, the draft's top-1 probability at each step
    proposals: Optional[torch.Tensor]  # [bs, L, V] q of each d_j (None: an all-greedy batch)
    graphed: bool  # the chain ran as one graph replay
    caught_up: int = 0  # tokens the draft first extended over, missed before (`catch_up`): 0, or no cost of its tier


@dataclass
class ChainTier:
    """What the chain of one draft length L runs with (kept for the life of the worker)."""

    steps: int  # L + 2
    parents: Optional[torch.Tensor] = None  # SGLang's topk=1 chain buffers for this step count
    score_indices: Optional[torch.Tensor] = None
    backend: object = None  # the multi-step draft attention backend
    graphs: object = None  # its EAGLEDraftCudaGraphRunner (None: eager)


class DraftChain(StandaloneDraftWorker):
    """The draft model and its multi-step decode (see the module docstring)."""

    def __init__(
        self,
        server_args: ServerArgs,
        gpu_id: int,
        nccl_port: int,
        target_worker: TpModelWorker,
        lengths: Sequence[int],
        samples: bool,
    ):
        """SGLang's STANDALONE draft worker (its own model, on the target's TP group, its own
        KV pool over the target's slots), set to PARSE's chain of L + 2 steps for each draft
        length L in `lengths`; `samples`: sampled requests draft by sampling (module docstring)."""
        super().__init__(server_args, gpu_id, nccl_port, target_worker)
        self.samples = samples
        self.tiers = {L: ChainTier(steps=L + 2) for L in lengths}
        for L in self.tiers:
            self._use(L)
            self._rebuild_topk1_chain_buffers()
            self.tiers[L].parents, self.tiers[L].score_indices = (
                self._topk1_parents_prealloc, self._topk1_score_indices_prealloc)  # fmt: skip
        self._no_proposal = None  # [max_bs, V] zeros: the q of c_n, which no one drafted
        self._confidence = None  # [max_bs, L_max + 1] each chain step's top-1 probability (kept: graphs write it)

    def _use(self, length: int) -> ChainTier:
        """Make the chain of draft length `length` the one SGLang's code runs."""
        tier = self.tiers[length]
        self.speculative_num_steps = tier.steps
        self.speculative_num_draft_tokens = tier.steps + 1  # topk=1: steps + 1
        self._topk1_parents_prealloc, self._topk1_score_indices_prealloc = tier.parents, tier.score_indices
        self.draft_attn_backend = self.draft_runner.draft_attn_backend = tier.backend
        self.cuda_graph_runner = tier.graphs
        return tier

    def init_attention_backend(self):
        """Only the multi-step decode backend, per tier: the draft's prefill keeps the runner's
        own backend (no draft-extend backend replaces it, as EAGLE's would)."""
        for length, tier in self.tiers.items():
            self._use(length)
            tier.backend = DraftBackendFactory(self.draft_runner, self.topk, tier.steps).create_decode_backend()

    def _capture_cuda_graphs(self):
        """SGLang's draft-decode CUDA graph of the whole chain, per tier and captured batch size,
        exactly where the target's verify pass is graphed too; never a draft-extend graph."""
        if self.target_worker.model_runner.decode_cuda_graph_runner is None:
            return
        from sglang.srt.speculative.eagle_draft_cuda_graph_runner import EAGLEDraftCudaGraphRunner

        for length, tier in self.tiers.items():
            self._use(length)
            with sampled_proposals(self.samples):  # also captures the greedy variant an all-greedy batch replays
                tier.graphs = EAGLEDraftCudaGraphRunner(self, speculative_num_steps=tier.steps)
        logger.info("PARSE draft chains captured as CUDA graphs, draft lengths %s", sorted(self.tiers))

    def prefill(self, batch: ScheduleBatch, defer: bool) -> None:
        """The draft's forward over a prefill batch (the target's slots: un-shifted KV); with
        `defer`, none: each request's draft then misses its whole sequence, which the first round
        that drafts extends (`catch_up`), a request that never drafts never paying for it."""
        if defer:
            for req, length in zip(batch.reqs, batch.seq_lens_cpu.tolist()):
                state_of(req).draft_behind = length  # positions 0 .. P-1 (a later chunk's P covers the earlier)
            return
        self._extend(batch)
        for req in batch.reqs:
            state_of(req).draft_behind = 0  # a prefill (or a retracted request's re-prefill) covers every token

    def idle(self, reqs, tokens: Sequence[int]) -> None:
        """A round committed tokens[i] tokens of request i without the draft (an adaptive
        server's tier-0 or head round): they are counted as missing from the draft's KV, and the
        next round that drafts first extends the draft over what is missing (`catch_up`)."""
        for req, count in zip(reqs, tokens):
            state_of(req).draft_behind += count

    def draft(self, batch: ScheduleBatch, last_tokens: torch.Tensor, rows: torch.Tensor, length: int) -> Draft:
        """The round's `Draft` at draft length L = `length` > 0; rows: the batch's
        req_pool_indices. Its confidence is a view of the chain's buffer: read it before the
        next chain runs."""
        # a catch-up (over a deferred prefill, tier-0 or head rounds) is what switching to drafting costs,
        # not what a round of the tier does: priced in, one over a single 4-step tier-0 round made L = 8 at
        # batch 60 cost 5-6.5 s where it costs 3.4 s, and the real pair's server alternated with tier 0
        behind = self.catch_up(batch, rows)
        chain, proposals, graphed = self._run_chain(batch, last_tokens, length)
        bs, steps = last_tokens.shape[0], slice(1, 1 + length)
        confidence = self._confidence[:bs, :length]  # step i's logits give d_{i+1}
        proposals = proposals[:, steps] if proposals is not None else None
        return Draft(chain[:, steps], confidence, proposals, graphed, caught_up=behind)

    def draft_forward(self, forward_batch: ForwardBatch):
        """SGLang's chain (`EagleDraftWorker.draft_forward`, also what its graph runner
        captures), each step's top-1 probability written to the confidence buffer as the step's
        logits come out: column i for the step that drafts d_{i+1}, rows [:bs] of the (padded)
        batch. SGLang's topk=1 chain keeps no probability (its `topk_p` is 1)."""
        runner, steps = self.draft_runner, itertools.count()
        width = max(tier.steps for tier in self.tiers.values())  # L_max + 2 >= the chain's forwards
        buffer = self._kept_buffer("_confidence", forward_batch.batch_size, width)
        own = runner.__dict__.get("forward")  # an instance-level forward (a test's or a runtime's) to restore

        def forward(batch, *args, **kwargs):
            out = own(batch, *args, **kwargs) if own else type(runner).forward(runner, batch, *args, **kwargs)
            logits = out.logits_output.next_token_logits.float()  # [bs, V]
            # the top-1 probability as max - logsumexp: no [bs, V] softmax per step
            buffer[: logits.shape[0], next(steps)] = torch.exp(logits.amax(dim=-1) - torch.logsumexp(logits, dim=-1))
            return out

        runner.forward = forward
        try:
            return super().draft_forward(forward_batch)
        finally:
            if own is None:
                del runner.forward
            else:
                runner.forward = own

    def _kept_buffer(self, name: str, bs: int, width: int) -> torch.Tensor:
        """The float32 zeros buffer `name`, made once for the largest batch (a captured graph
        reads or writes it at its address)."""
        buffer = getattr(self, name)
        if buffer is None or buffer.shape[0] < bs:
            rows = max(bs, get_schedule().max_running_requests or bs)
            buffer = torch.zeros(rows, width, dtype=torch.float32, device=self.device)
            setattr(self, name, buffer)
        return buffer

    def catch_up(self, batch: ScheduleBatch, rows: torch.Tensor) -> int:
        """Draft extends over the committed tokens whose draft KV is missing: the last
        `draft_behind` (`req.parse`) before c_n, skipped by tier-0 rounds or a deferred prefill.
        Only a round that resumes drafting pays it, like a prefill: each extend has every request
        (its next piece of at most `piece` tokens, or its last token again: rewriting a token's
        draft KV over a context that has it is harmless), its tokens and lengths in one
        host-to-device copy. batch.seq_lens_cpu: the committed lengths P. Returns the tokens it
        extended the batch over (what pricing a probe's catch-up counts)."""
        behind = [state_of(req).draft_behind for req in batch.reqs]
        if not any(behind):
            return 0
        ends = batch.seq_lens_cpu.tolist()  # a host tensor
        starts = [end - max(b, 1) for end, b in zip(ends, behind)]
        chunk = get_schedule().chunked_prefill_size or 0
        # a catch-up over whole prompts is a prefill: bounded like SGLang's chunked prefill
        piece = max(chunk // len(ends), 16) if chunk > 0 else max(ends)
        while True:
            pieces = [(s, min(s + piece, e)) if s < e else (e - 1, e) for s, e in zip(starts, ends)]
            self._extend_pieces(batch, rows, pieces)
            starts = [s + piece for s in starts]
            if all(s >= e for s, e in zip(starts, ends)):
                break
        for req in batch.reqs:
            state_of(req).draft_behind = 0
        return sum(behind)

    def _extend_pieces(self, batch: ScheduleBatch, rows: torch.Tensor, pieces) -> None:
        """One draft extend: request i over positions [start_i, end_i) of `pieces`."""
        tokens, positions, owners = [], [], []
        for i, (req, (start, end)) in enumerate(zip(batch.reqs, pieces)):
            filled = req.origin_input_ids + req.output_ids  # P + 1 tokens, the last is c_n
            tokens += filled[start:end]
            positions += range(start, end)
            owners += [i] * (end - start)
        lens = [end - start for start, end in pieces]
        ends = [end for _, end in pieces]
        packed = torch.tensor(tokens + positions + owners + ends, dtype=torch.int64).to(self.device)
        n = len(tokens)
        tokens, positions, owners, seq_lens = packed[:n], packed[n : 2 * n], packed[2 * n : 3 * n], packed[3 * n :]
        extend = copy.copy(batch)
        extend.forward_mode = ForwardMode.EXTEND
        extend.input_ids = tokens
        extend.out_cache_loc = self.req_to_token_pool.req_to_token[rows[owners], positions].to(torch.int64)
        extend.seq_lens = seq_lens
        extend.seq_lens_cpu = torch.tensor(ends, dtype=batch.seq_lens_cpu.dtype)
        extend.seq_lens_sum = sum(ends)
        extend.orig_seq_lens = None if batch.orig_seq_lens is None else seq_lens.to(batch.orig_seq_lens.dtype)
        extend.prefix_lens = [start for start, _ in pieces]
        extend.extend_lens = lens
        extend.extend_num_tokens = n
        extend.extend_logprob_start_lens = list(lens)
        extend.return_logprob = False
        extend.spec_info = None
        self._extend(extend)

    def _extend(self, batch: ScheduleBatch) -> None:
        """The draft model's forward over an extend batch (its runner's own attention backend)."""
        forward_batch = ForwardBatch.init_new(
            batch, self.draft_runner, capture_hidden_mode=CaptureHiddenMode.NULL, return_hidden_states_before_norm=False
        )
        forward_batch.return_logprob = False
        self.draft_runner.forward(forward_batch)

    def _run_chain(self, batch: ScheduleBatch, last_tokens: torch.Tensor, length: int):
        """(draft_tokens [bs, L+2] c_n, d_1 .. d_{L+1} from each request's committed KV, proposals [bs, L+2, V] (q of each token, c_n's zero; None for an all-greedy
        batch), whether the chain ran as a graph replay), at draft length L = `length`.

        batch.seq_lens must be the committed lengths P; leaves batch.out_cache_loc and
        batch.spec_info set to the draft's (the worker overwrites both for the verify)."""
        self._use(length)
        bs = last_tokens.shape[0]
        draft_input = EagleDraftInput(
            topk_p=torch.ones(bs, 1, dtype=torch.float32, device=self.device),
            topk_index=last_tokens.view(bs, 1).to(torch.int64),
            draft_probs=None if batch.sampling_info.is_all_greedy or not self.samples else self._no_proposal_rows(bs),
            hidden_states=None,
            capture_hidden_mode=CaptureHiddenMode.NULL,
        )
        batch.forward_mode = ForwardMode.DECODE
        batch.spec_info = draft_input
        batch.input_ids = last_tokens
        with sampled_proposals(self.samples):
            forward_batch, use_graph, _ = prepare_for_draft(
                draft_input,
                self.req_to_token_pool,
                batch,
                self.cuda_graph_runner,
                self.draft_runner,
                self.topk,
                self.speculative_num_steps,
            )
            forward_batch.return_logprob = False
            if use_graph:
                _, _, draft_tokens, proposals = self.cuda_graph_runner.execute(forward_batch)
            else:
                self.draft_attn_backend.init_forward_metadata(forward_batch)
                forward_batch.mark_forward_metadata_ready()
                _, _, draft_tokens, proposals = self.draft_forward(forward_batch)
        return draft_tokens, proposals, bool(use_graph)

    def _no_proposal_rows(self, bs: int) -> torch.Tensor:
        """[bs, V] zeros: the chain's first token c_n was not drafted."""
        return self._kept_buffer("_no_proposal", bs, self.draft_runner.model_config.vocab_size)[:bs]
