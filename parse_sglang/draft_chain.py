"""Step 1 of a PARSE round, the draft's steps, run by SGLang's own EAGLE multi-step draft
machinery, so that on a GPU the whole loop is ONE CUDA-graph replay.

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

Where the chain runs eagerly (no graphs: on CPU, where a forward costs about its weights
whatever its rows), a round runs L forwards, as SGLang's STANDALONE does, not L + 1
(`extends_first`): its first step is a draft extend over c_n and whatever the draft missed
before it (the catch-up below, and `draft_tail`: the last round's d_L, when it was kept), whose
last row's logits give d_1; then a chain of L steps from d_1 at P + 1 (L - 1 forwards), which
never writes d_L's draft KV: where d_L is kept, the next round's first step writes it.

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
from sglang.srt.speculative.spec_utils import sample_draft_proposal
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

    steps: int  # L + 2 (one graph replay from c_n); eager: L from d_1 (at L = 1 none runs)
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
        KV pool over the target's slots), set to PARSE's chain for each draft length L in
        `lengths` (built once the target's graphs are known: `_capture_cuda_graphs`); `samples`:
        sampled requests draft by sampling (module docstring)."""
        super().__init__(server_args, gpu_id, nccl_port, target_worker)
        self.samples = samples
        self.lengths = tuple(lengths)
        self.extends_first = True  # eager chains (no graphs); settled by `_capture_cuda_graphs`
        self.tiers: dict[int, ChainTier] = {}
        self._no_proposal = None  # [max_bs, V] zeros: the q of c_n, which no one drafted
        self._confidence = None  # [max_bs, L_max + 2] each chain step's top-1 probability (kept: graphs write it)

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
        """Nothing yet: a chain's steps depend on whether the target captured its graphs, which
        SGLang does after every attention backend exists (`_capture_cuda_graphs` builds them).
        The draft's prefill keeps the runner's own backend (no draft-extend backend replaces it,
        as EAGLE's would)."""

    def _capture_cuda_graphs(self):
        """Each tier's chain (`ChainTier`: SGLang's topk=1 chain buffers and multi-step decode
        backend) and, exactly where the target's verify pass is graphed too, SGLang's draft-decode
        CUDA graph of the whole chain per captured batch size; never a draft-extend graph."""
        self.extends_first = self.target_worker.model_runner.decode_cuda_graph_runner is None
        for L in self.lengths:
            self.tiers[L] = tier = ChainTier(steps=max(L, 2) if self.extends_first else L + 2)
            self._use(L)
            self._rebuild_topk1_chain_buffers()
            tier.parents, tier.score_indices = self._topk1_parents_prealloc, self._topk1_score_indices_prealloc
            tier.backend = DraftBackendFactory(self.draft_runner, self.topk, tier.steps).create_decode_backend()
        if self.extends_first:
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
        for req in batch.reqs:
            state_of(req).draft_tail = False
        if defer:
            for req, length in zip(batch.reqs, batch.seq_lens_cpu.tolist()):
                state = state_of(req)  # positions 0 .. P-1 (a later chunk's P covers the earlier)
                state.draft_behind = length
            return
        self._extend(batch)
        for req in batch.reqs:  # a prefill (or a retracted request's re-prefill) covers every token
            state_of(req).draft_behind = 0

    def idle(self, reqs, tokens: Sequence[int]) -> None:
        """A round committed tokens[i] tokens of request i without the draft (an adaptive
        server's tier-0 or head round): they are counted as missing from the draft's KV, and the
        next round that drafts first extends the draft over what is missing (`catch_up`)."""
        for req, count in zip(reqs, tokens):
            state = state_of(req)
            state.draft_behind += count + state.draft_tail  # a kept d_L not yet written is missing too
            state.draft_tail = False

    def after_round(self, reqs, length: int, kept: Sequence[int], copied: Sequence[bool]) -> None:
        """A window round at draft length `length` committed kept[i] + 1 tokens of request i. Where
        it drafted them (length > 0, no copy) the draft's KV holds them, but for a kept d_L of an
        eager chain (`draft_tail`: the next round's first step writes it); else the draft missed them."""
        for req, a, copy_ in zip(reqs, kept, copied):
            if length == 0 or copy_:
                self.idle([req], [a + 1])
            elif self.extends_first and a == length:
                state_of(req).draft_tail = True

    def draft(self, batch: ScheduleBatch, last_tokens: torch.Tensor, rows: torch.Tensor, length: int) -> Draft:
        """The round's `Draft` at draft length L = `length` > 0; rows: the batch's
        req_pool_indices. Its confidence is a view of the chain's buffer: read it before the
        next chain runs."""
        # a catch-up (over a deferred prefill, tier-0 or head rounds) is what switching to drafting costs,
        # not what a round of the tier does: priced in, one over a single 4-step tier-0 round made L = 8 at
        # batch 60 cost 5-6.5 s where it costs 3.4 s, and the real pair's server alternated with tier 0
        bs = last_tokens.shape[0]
        if not self.extends_first:  # one replay: c_n, d_1 .. d_{L+1}
            behind, _ = self.catch_up(batch, rows)
            chain, proposals, graphed = self._run_chain(batch, last_tokens, length)
            steps = slice(1, 1 + length)
            proposals = proposals[:, steps] if proposals is not None else None
            return Draft(chain[:, steps], self._confidence[:bs, :length], proposals, graphed, caught_up=behind)
        behind, logits = self.catch_up(batch, rows, through_input=True)  # [bs, V]: c_n's logits
        first, first_q = self._first_draft(batch, logits)  # [bs, 1] d_1, [bs, V] its q (None: argmax)
        chain, proposals, graphed = first, None if first_q is None else first_q[:, None], False
        if length > 1:  # d_1 .. d_L from d_1 at P + 1 (the verify sets the committed lengths again)
            batch.seq_lens, batch.seq_lens_cpu = batch.seq_lens + 1, batch.seq_lens_cpu + 1
            batch.seq_lens_sum += bs
            chain, proposals, graphed = self._run_chain(batch, first, length, first_q)
        return Draft(chain, self._confidence[:bs, :length], proposals, graphed, caught_up=behind)

    def _first_draft(self, batch: ScheduleBatch, logits: torch.Tensor):
        """d_1 [bs, 1] from c_n's draft logits [bs, V], drawn as a chain step draws (its confidence
        in column 0), and its q [bs, V] where the chain samples (None: the argmax)."""
        logits = logits.float()
        bs = logits.shape[0]
        buffer = self._kept_buffer("_confidence", bs, self._confidence_width())
        buffer[:bs, 0] = torch.exp(logits.amax(dim=-1) - torch.logsumexp(logits, dim=-1))
        info = batch.sampling_info
        if self.samples and not info.is_all_greedy:  # the chain's own rule (`sampled_proposals`)
            q, _, token = sample_draft_proposal(
                logits, info.temperatures, info.top_ks, sampling_seed=info.sampling_seed, positions=batch.seq_lens + 1
            )
            return token.view(bs, 1).to(torch.int64), q
        return logits.argmax(dim=-1, keepdim=True), None

    def _confidence_width(self) -> int:
        """Columns of the confidence buffer: at least the longest chain's steps."""
        return max(tier.steps for tier in self.tiers.values())

    def draft_forward(self, forward_batch: ForwardBatch):
        """SGLang's chain (`EagleDraftWorker.draft_forward`, also what its graph runner
        captures), each step's top-1 probability written to the confidence buffer as the step's
        logits come out: column j for the step that drafts d_{j+1}, rows [:bs] of the (padded)
        batch. SGLang's topk=1 chain keeps no probability (its `topk_p` is 1)."""
        runner, steps = self.draft_runner, itertools.count(int(self.extends_first))  # eager: d_1 is column 0's
        buffer = self._kept_buffer("_confidence", forward_batch.batch_size, self._confidence_width())
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

    def catch_up(self, batch: ScheduleBatch, rows: torch.Tensor, through_input: bool = False):
        """Draft extends over the committed tokens whose draft KV is missing: the last
        `draft_behind` (`req.parse`) before c_n, skipped by tier-0 rounds or a deferred prefill,
        and a kept d_L an eager chain left (`draft_tail`); `through_input`: and c_n itself (an
        eager chain's first step, every round). Otherwise only a round that resumes drafting pays
        it, like a prefill: each extend has every request (its next piece of at most `piece`
        tokens, or its last token again: rewriting a token's draft KV over a context that has it
        is harmless), its tokens and lengths in one host-to-device copy. batch.seq_lens_cpu: the
        committed lengths P. Returns the `draft_behind` tokens it extended the batch over (what
        pricing a probe's catch-up counts) and the last extend's logits [bs, V] (None: no extend)."""
        states = [state_of(req) for req in batch.reqs]
        behind = [s.draft_behind for s in states]
        if not through_input and not any(behind):
            return 0, None
        ends = [P + through_input for P in batch.seq_lens_cpu.tolist()]  # a host tensor
        need = [b + s.draft_tail + 1 if through_input else max(b, 1) for b, s in zip(behind, states)]
        starts = [end - n for end, n in zip(ends, need)]
        chunk = get_schedule().chunked_prefill_size or 0
        # a catch-up over whole prompts is a prefill: bounded like SGLang's chunked prefill
        piece = max(chunk // len(ends), 16) if chunk > 0 else max(ends)
        while True:  # the last extend ends every request at its end
            pieces = [(s, min(s + piece, e)) if s < e else (e - 1, e) for s, e in zip(starts, ends)]
            logits = self._extend_pieces(batch, rows, pieces)
            starts = [s + piece for s in starts]
            if all(s >= e for s, e in zip(starts, ends)):
                break
        for state in states:
            state.draft_behind, state.draft_tail = 0, False
        return sum(behind), logits

    def _extend_pieces(self, batch: ScheduleBatch, rows: torch.Tensor, pieces) -> torch.Tensor:
        """One draft extend: request i over positions [start_i, end_i) of `pieces`; each one's
        last row's logits [bs, V]."""
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
        return self._extend(extend)

    def _extend(self, batch: ScheduleBatch) -> torch.Tensor:
        """The draft model's forward over an extend batch (its runner's own attention backend):
        each request's last row's logits [bs, V]."""
        forward_batch = ForwardBatch.init_new(
            batch, self.draft_runner, capture_hidden_mode=CaptureHiddenMode.NULL, return_hidden_states_before_norm=False
        )
        forward_batch.return_logprob = False
        return self.draft_runner.forward(forward_batch).logits_output.next_token_logits

    def _run_chain(self, batch: ScheduleBatch, inputs: torch.Tensor, length: int, first_q=None):
        """At draft length L = `length`, from each request's `inputs` token at batch.seq_lens (c_n
        at P; eager: d_1 at P + 1, its q `first_q`): (draft_tokens [bs, steps] c_n, d_1 .. d_{L+1};
        eager: d_1 .. d_L), proposals [bs, steps, V] (q of each token, c_n's zero; None for an
        all-greedy batch), whether the chain ran as a graph replay.

        Leaves batch.out_cache_loc and batch.spec_info set to the draft's (the worker overwrites
        both for the verify)."""
        self._use(length)
        bs = inputs.shape[0]
        sampled = self.samples and not batch.sampling_info.is_all_greedy
        draft_input = EagleDraftInput(
            topk_p=torch.ones(bs, 1, dtype=torch.float32, device=self.device),
            topk_index=inputs.view(bs, 1).to(torch.int64),
            draft_probs=(first_q if first_q is not None else self._no_proposal_rows(bs)) if sampled else None,
            hidden_states=None,
            capture_hidden_mode=CaptureHiddenMode.NULL,
        )
        batch.forward_mode = ForwardMode.DECODE
        batch.spec_info = draft_input
        batch.input_ids = inputs
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
