"""PARSE as an SGLang speculative worker (`--speculative-algorithm PARSE`).

`ParseWorker._round` is one PARSE round (DESIGN.md §1) for a whole decode batch: the
draft writes d_1..d_L, boundaries are placed, ONE target TARGET_VERIFY forward reads the
chain rows and every probe, the longest acceptable prefix plus a bonus token is kept.
The rest of the class is SGLang bookkeeping around it.

Conventions this worker keeps with SGLang's scheduler (sync V2 schema, no overlap):
- `batch.seq_lens[i]` = P = committed tokens with KV; `req.output_ids[-1]` = c_n, the
  next input. The verify window occupies req_to_token[P : P + N] (SGLang over-allocates
  2 * N_max slots per decode round), chain rows first, so the KV of the accepted prefix
  c_n, d_1..d_a is already in place and SGLang's `kv_committed_len += a + 1` commits it.
- The draft has its own KV pool over the same slots, un-shifted: slot p holds the draft's
  KV of token p. It runs L+1 plain DECODE steps per round (inputs c_n, d_1..d_L), so its
  KV exists for every slot that can become committed and no draft re-extend is needed.
- Output: `next_token_ids` is [bs * (L+1)], request i's emitted tokens d_1..d_a, t_a at
  i*(L+1) .. i*(L+1)+a; `accept_lens` = a + 1 (bonus included).
- The exact part of acceptance is SGLang's own chain verification (`eagle_sample` on the
  chain rows: penalties, logit bias, grammar mask, sampling); the judge can only extend it.
- Sampled requests (temperature > 0) on CPU: SGLang's chain verification is greedy on CPU
  whatever the temperature (`eagle_utils._verify_uses_greedy`), which would turn them into
  greedy requests. They are served target-only instead: no draft token is acceptable, and
  the round's one token is sampled from chain row 0 with the request's sampling settings.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

import torch
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.layers.logprob_processor import compute_spec_logprobs
from sglang.srt.layers.moe.utils import draft_model_build_scope
from sglang.srt.layers.sampler import top_k_top_p_min_p_sampling_from_probs_torch
from sglang.srt.managers.schedule_batch import FINISH_ABORT, ScheduleBatch
from sglang.srt.managers.tp_worker import TpModelWorker
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
from sglang.srt.runtime_context import get_device, get_model, get_serving, get_spec
from sglang.srt.server_args import ServerArgs
from sglang.srt.speculative.base_spec_worker import BaseSpecWorker
from sglang.srt.speculative.eagle_utils import default_tree_mask_mode, eagle_sample
from sglang.srt.speculative.spec_utils import GrammarTree, build_grammar_vocab_mask
from sglang.srt.utils import is_cpu

from parse_sglang.acceptance import accept_lengths, pad_ragged
from parse_sglang.attention.layout import VerifyRequest, build_verify_layout
from parse_sglang.boundaries import delimiter_ends, draft_boundaries
from parse_sglang.config import ParseConfig
from parse_sglang.counters import ServerTotals, record_round
from parse_sglang.judge import judge_scores
from parse_sglang.settings import (
    RETURN_PROBE_SCORES,
    judge_probe_for,
    request_outputs,
    request_parse_config,
    server_parse_config,
    target_tokenizer,
    verify_window_max,
)
from parse_sglang.verify_input import ChainView, ParseVerifyInput

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Committed:
    """Where a decode batch stands before the round (the worker overwrites the batch's copies)."""

    seq_lens: torch.Tensor  # [bs] P
    seq_lens_cpu: torch.Tensor
    rows: torch.Tensor  # [bs] req_pool_indices
    last_tokens: torch.Tensor  # [bs] c_n

    @classmethod
    def of(cls, batch: ScheduleBatch, device) -> "Committed":
        last = torch.tensor([req.output_ids[-1] for req in batch.reqs], dtype=torch.int64)
        seq_lens_cpu = batch.seq_lens_cpu if batch.seq_lens_cpu is not None else batch.seq_lens.cpu()
        return cls(batch.seq_lens, seq_lens_cpu, batch.req_pool_indices, last.to(device))


@dataclass(frozen=True)
class Window:
    """The verify window of a round and what acceptance needs to read it."""

    verify_input: ParseVerifyInput
    chain_tokens: torch.Tensor  # [bs, L+1] c_n, d_1..d_L
    draft_lens: torch.Tensor  # [bs] draft tokens that may be accepted (budget, stop token)
    boundaries: torch.Tensor  # [bs, K] real probe boundaries b_k, padded with 0
    probe_slots: torch.Tensor  # [bs, K] index of each real probe among the request's window probes
    judged: torch.Tensor  # [bs] bool: the judge may extend this request's acceptance
    sampled: torch.Tensor  # [bs] bool: sampled on CPU, served target-only (module docstring)
    thresholds: torch.Tensor  # [bs] τ
    num_probes: int  # K_b: probes per request in the window (real + padding)
    configs: list  # [bs] ParseConfig

    @property
    def width(self) -> int:
        return self.chain_tokens.shape[1]


@dataclass(frozen=True)
class Accepted:
    predict: torch.Tensor  # [bs * (L+1)] int32, emitted token at each chain node
    accept_index: torch.Tensor  # [bs, L+1] int32, flat chain rows of the emitted run, -1 padded
    accept_lens: torch.Tensor  # [bs] int32, a + 1
    exact: torch.Tensor  # [bs] draft tokens accepted by exact match
    judged: torch.Tensor  # [bs] draft tokens accepted only because the judge said yes
    scores: Optional[torch.Tensor]  # [bs, K] judge score of each real probe (None: no probes)


class ParseWorker(BaseSpecWorker):
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
        self.tokenizer = target_tokenizer(tokenizer_path, trust)
        self.probe = judge_probe_for(tokenizer_path, self.config.judge_question, trust) if self.config.judge else None
        self.window_max = verify_window_max(self.config, len(self.probe.suffix_ids) if self.probe else 0)
        reserved = spec.max_speculative_num_draft_tokens
        if reserved is not None and reserved < self.window_max:
            raise ValueError(
                f"max_speculative_num_draft_tokens={reserved} is below PARSE's "
                f"verify window {self.window_max}; the KV over-allocation would not hold a round"
            )
        if target_worker.model_runner.is_hybrid_swa:
            raise ValueError("PARSE does not support hybrid sliding-window targets: allowed are full-attention models")
        self.full_mask = default_tree_mask_mode().name == "FULL_MASK"
        with draft_model_build_scope():
            self._draft_worker = TpModelWorker(
                server_args=server_args,
                gpu_id=gpu_id,
                nccl_port=nccl_port,
                is_draft_worker=True,
                context_length=target_worker.model_runner.model_config.context_len,
            )
        self._draft_worker.draft_runner = self._draft_worker.model_runner  # read by SGLang's metrics reporter
        self.totals = ServerTotals()  # get_server_info()'s "parse" entry
        logger.info(
            "PARSE worker: L=%d, probe_stride=%d, judge=%s, threshold=%.3f, probe suffix m=%d, N_max=%d",
            self.config.draft_budget,
            self.config.probe_stride,
            self.config.judge,
            self.config.threshold,
            len(self.probe.suffix_ids) if self.probe else 0,
            self.window_max,
        )

    # ----- one PARSE round --------------------------------------------------------------

    def _round(self, batch: ScheduleBatch) -> GenerationBatchResult:
        """One PARSE round for every request of a decode batch (DESIGN.md §1, steps 1-9)."""
        committed = Committed.of(batch, self.device)
        configs = [self._request_config(req) for req in batch.reqs]
        budgets = [_draft_budget(req, cfg) for req, cfg in zip(batch.reqs, configs)]
        drafts = self._draft(batch, committed, max(budgets))  # 1. d_1..d_L
        window = self._plan_window(batch, committed, drafts, configs, budgets)  # 2.-5. boundaries, probes, mask
        chain_logits, probe_logits, can_run_graph = self._verify(batch, committed, window)  # 6. ONE forward
        accepted = self._accept(batch, window, chain_logits, probe_logits)  # 7.-8. read, accept
        self._record_stats(batch.reqs, window, accepted)
        self._update_target_phases(batch.reqs, window, accepted)
        return self._result(batch, committed, window, accepted, chain_logits, can_run_graph)  # 9. SGLang commits

    def _draft(self, batch: ScheduleBatch, committed: Committed, steps: int) -> torch.Tensor:
        """[bs, L] greedy draft from c_n: steps+1 DECODE steps (the last only writes d_steps'
        draft KV), padded to the server's L so that every round has L+1 chain rows."""
        req_to_token = self.req_to_token_pool.req_to_token
        batch.forward_mode = ForwardMode.DECODE
        batch.spec_info = None
        tokens, drafted = committed.last_tokens, []
        for step in range(steps + 1):
            self._set_lengths(batch, committed, extra=step + 1)
            batch.input_ids = tokens
            batch.out_cache_loc = req_to_token[committed.rows, committed.seq_lens + step].to(torch.int64)
            logits = self._forward_draft(batch).next_token_logits
            tokens = torch.argmax(logits, dim=-1).to(torch.int64)
            drafted.append(tokens)
        drafts = torch.stack(drafted[:steps], dim=1)
        return torch.nn.functional.pad(drafts, (0, self.config.draft_budget - steps))

    def _plan_window(self, batch, committed: Committed, drafts: torch.Tensor, configs, budgets) -> Window:
        """Boundaries per request, then one window of N = 1 + L + K_b*m rows for all of them.

        Requests whose judge is off, and requests with fewer boundaries than K_b, get extra
        probes at unused draft positions (SGLang needs one N per batch); their scores are
        never read.
        """
        length = drafts.shape[1]
        drafts_host = drafts.cpu()  # one device-to-host copy per round
        draft_rows = drafts_host.tolist()
        sampled = [_sampled_on_cpu(req) for req in batch.reqs]
        judged = [
            self.probe is not None and cfg.judge and req.grammar is None and _target_phase(req) is None
            and not cpu_sampled
            for req, cfg, cpu_sampled in zip(batch.reqs, configs, sampled)
        ]
        draft_lens = [
            0 if cpu_sampled else _cut_at_stop(req, row[:n])
            for req, row, n, cpu_sampled in zip(batch.reqs, drafts_host, budgets, sampled)
        ]
        bounds = [
            draft_boundaries(self.tokenizer, row[:n], cfg.probe_stride, cfg.delimiters) if judge else []
            for row, n, cfg, judge in zip(draft_rows, draft_lens, configs, judged)
        ]
        num_probes = max(map(len, bounds))
        window_bounds = [_with_padding_probes(b, num_probes, length) for b in bounds]
        suffix = self.probe.suffix_ids if self.probe else ()
        prefixes, last_tokens = committed.seq_lens_cpu.tolist(), committed.last_tokens.tolist()
        layout = build_verify_layout(
            [
                VerifyRequest(p, c, row, wb, suffix)
                for p, c, row, wb in zip(prefixes, last_tokens, draft_rows, window_bounds)
            ]
        )
        probe_slots = [[wb.index(b) for b in real] for real, wb in zip(bounds, window_bounds)]
        window_len = int(layout.window_lens[0])
        if window_len > self.window_max:
            raise RuntimeError(f"PARSE verify window {window_len} exceeds the reserved {self.window_max} rows")
        return Window(
            verify_input=ParseVerifyInput(layout, self.full_mask, self.device),
            chain_tokens=torch.cat([committed.last_tokens[:, None], drafts], dim=1),
            draft_lens=torch.tensor(draft_lens, device=self.device),
            boundaries=pad_ragged(bounds, 0, torch.int64).to(self.device),
            probe_slots=pad_ragged(probe_slots, 0, torch.int64).to(self.device),
            judged=torch.tensor(judged, device=self.device),
            sampled=torch.tensor(sampled, device=self.device),
            thresholds=torch.tensor([cfg.threshold for cfg in configs], device=self.device),
            num_probes=num_probes,
            configs=configs,
        )

    def _verify(self, batch: ScheduleBatch, committed: Committed, window: Window):
        """The round's one target forward: TARGET_VERIFY over every request's window."""
        verify_input = window.verify_input
        rows = verify_input.draft_token_num
        self._set_lengths(batch, committed, extra=0)
        batch.forward_mode = ForwardMode.TARGET_VERIFY
        batch.spec_info = verify_input
        batch.input_ids = verify_input.input_ids
        slots = committed.seq_lens[:, None] + torch.arange(rows, device=self.device)
        req_to_token = self.req_to_token_pool.req_to_token
        batch.out_cache_loc = req_to_token[committed.rows[:, None], slots].reshape(-1).to(torch.int64)
        out = self.target_worker.forward_batch_generation(batch, is_verify=True)
        logits = out.logits_output.next_token_logits
        chain_rows = window.chain_tokens.numel()
        return logits[:chain_rows], logits[chain_rows:], out.can_run_cuda_graph

    def _accept(self, batch: ScheduleBatch, window: Window, chain_logits, probe_logits) -> Accepted:
        """a = min(max(a_exact, a_judge), acceptable length); emitted: d_1..d_a, then t_a."""
        bs, width = window.chain_tokens.shape
        chain = ChainView.of(window.chain_tokens)
        grammar_mask = None
        if batch.has_grammar:
            grammar_mask = build_grammar_vocab_mask(
                reqs=batch.reqs,
                tree=GrammarTree.from_linear_chain(window.chain_tokens),
                sampling_info=batch.sampling_info,
                device=self.device,
                barrier=None,
            )
        # SGLang's own chain verification; applies penalties / bias / grammar to chain_logits in place.
        predict, exact_lens, _ = eagle_sample(
            chain,
            batch,
            LogitsProcessorOutput(next_token_logits=chain_logits),
            grammar_mask,
            watermark_state=self.target_worker.model_runner.watermark_state,
        )
        exact = exact_lens.to(torch.int64) - 1
        drafts = window.chain_tokens[:, 1:]
        scores = None
        if window.num_probes:
            scores = judge_scores(probe_logits, self.probe).view(bs, window.num_probes).gather(1, window.probe_slots)
            # accept_lengths' exact part is switched off (draft_lens 0): eagle_sample gave it.
            judge_len = accept_lengths(
                draft=drafts,
                draft_lens=torch.zeros_like(window.draft_lens),
                target_next=window.chain_tokens,
                boundaries=window.boundaries,
                scores=scores,
                threshold=window.thresholds,
                judge=window.judged,
            ).accepted
        else:
            judge_len = torch.zeros_like(exact)
        limit = torch.minimum(window.draft_lens, self._target_phase_limits(batch.reqs, window, exact, predict))
        accepted = torch.minimum(torch.maximum(exact, judge_len), limit)
        steps = torch.arange(width, device=self.device)
        exact_bonus = predict.view(bs, width).gather(1, accepted[:, None]).squeeze(1).to(torch.int64)
        # The bonus is SGLang's unless the judge took the request past its exact match, or
        # the request is sampled on CPU: then it is drawn from chain row a here.
        own_bonus = (accepted > exact) | window.sampled
        bonus = exact_bonus
        if bool(own_bonus.any()):
            sampled_bonus = self._bonus_tokens(batch, chain_logits.view(bs, width, -1), accepted)
            bonus = torch.where(own_bonus, sampled_bonus, exact_bonus)
        emitted = torch.cat([drafts, torch.zeros_like(drafts[:, :1])], dim=1)
        emitted.scatter_(1, accepted[:, None], bonus[:, None])
        flat_rows = torch.arange(bs, device=self.device)[:, None] * width + steps
        accept_index = torch.where(steps <= accepted[:, None], flat_rows, -1)
        exact_kept = torch.minimum(exact, accepted)
        return Accepted(
            predict=emitted.reshape(-1).to(torch.int32),
            accept_index=accept_index.to(torch.int32),
            accept_lens=(accepted + 1).to(torch.int32),
            exact=exact_kept,
            judged=accepted - exact_kept,
            scores=scores,
        )

    # ----- SGLang bookkeeping around the round ------------------------------------------

    def forward_batch_generation(
        self, batch: ScheduleBatch, on_publish=None, pp_proxy_tensors=None
    ) -> GenerationBatchResult:
        if batch.forward_mode.is_extend():
            return self._prefill(batch)
        return self._round(batch)

    def _prefill(self, batch: ScheduleBatch) -> GenerationBatchResult:
        """Target prefill (samples the first token), then the draft over the same slots."""
        result = self.target_worker.forward_batch_generation(batch)
        self._forward_draft(batch)
        result.new_seq_lens = batch.seq_lens
        result.next_draft_input = None
        return result

    def _forward_draft(self, batch: ScheduleBatch) -> LogitsProcessorOutput:
        forward_batch = ForwardBatch.init_new(
            batch, self.draft_runner, capture_hidden_mode=CaptureHiddenMode.NULL, return_hidden_states_before_norm=False
        )
        forward_batch.return_logprob = False
        return self.draft_runner.forward(forward_batch).logits_output

    @staticmethod
    def _set_lengths(batch: ScheduleBatch, committed: Committed, extra: int) -> None:
        batch.seq_lens = committed.seq_lens + extra
        batch.seq_lens_cpu = committed.seq_lens_cpu + extra
        batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())

    def _request_config(self, req) -> ParseConfig:
        """The request's ParseConfig (and `req.parse_outputs`, its output options), resolved
        once; a bad one (SamplingParams.verify already refuses those in the main process)
        aborts the request and serves it losslessly."""
        config = getattr(req, "parse_config", None)
        if config is None:
            custom = req.sampling_params.custom_params
            try:
                config = request_parse_config(custom, self.config)
                req.parse_outputs = request_outputs(custom)
            except ValueError as err:
                req.to_finish = FINISH_ABORT(str(err), 400, "BadRequestError")
                config = ParseConfig.from_dict({"judge": False}, base=self.config)
                req.parse_outputs = frozenset()
            req.parse_config = config
        return config

    def _target_phase_limits(self, reqs, window: Window, exact: torch.Tensor, predict: torch.Tensor) -> torch.Tensor:
        """[bs] most draft tokens each request may accept this round: L, except during a
        target phase (after_rejection="target_to_delimiter"), where the run of target
        tokens d_1..d_exact, t_exact is cut right after the segment end (or the
        probe_stride-th token) that ends the phase, as the reference's target decode stops."""
        width = window.width
        limits = torch.full_like(exact, width - 1)
        phases = [(i, _target_phase(req)) for i, req in enumerate(reqs) if _target_phase(req) is not None]
        if not phases:
            return limits
        exact_host, predict_host = exact.tolist(), predict.view(len(reqs), width).tolist()
        drafts = window.chain_tokens[:, 1:].tolist()
        for i, done in phases:
            run = drafts[i][: exact_host[i]] + [predict_host[i][exact_host[i]]]
            stop = target_phase_stop(self.tokenizer, done, run, window.configs[i])
            if stop is not None:
                limits[i] = stop - 1
        return limits

    def _update_target_phases(self, reqs, window: Window, accepted: Accepted) -> None:
        """Enter a target phase after a judged rejection; leave it where its run was cut."""
        emitted = accepted.predict.view(len(reqs), window.width).tolist()
        for i, (req, config) in enumerate(zip(reqs, window.configs)):
            if config.after_rejection != "target_to_delimiter":
                continue
            a = int(accepted.exact[i] + accepted.judged[i])
            done = _target_phase(req)
            if done is not None:
                run = emitted[i][: a + 1]
                stop = target_phase_stop(self.tokenizer, done, run, config)
                req.parse_target_phase = None if stop is not None else done + run
            elif bool(window.judged[i]) and a < int(window.draft_lens[i]):
                req.parse_target_phase = []

    def _bonus_tokens(self, batch: ScheduleBatch, chain_logits: torch.Tensor, accepted: torch.Tensor) -> torch.Tensor:
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

    def _record_stats(self, reqs, window: Window, accepted: Accepted) -> None:
        """Per-request counters (meta_info["parse"]) and the server's totals (get_server_info,
        /metrics): parse_sglang/counters.py. Judge probes: the real ones (boundary > 0)."""
        draft_lens, exact, judged = window.draft_lens.tolist(), accepted.exact.tolist(), accepted.judged.tolist()
        real_probes = window.boundaries > 0
        probe_counts = real_probes.sum(dim=1).tolist()
        scores = accepted.scores[real_probes].tolist() if accepted.scores is not None else []
        new_requests = 0
        for i, req in enumerate(reqs):
            probes = _probe_round(window, accepted, i) if RETURN_PROBE_SCORES in req.parse_outputs else None
            new_requests += record_round(req, draft_lens[i], exact[i], judged[i], probe_counts[i], probes)
        self.totals.add_pass(new_requests, len(reqs), sum(draft_lens), sum(exact), sum(judged), scores)

    def _result(self, batch, committed: Committed, window: Window, accepted: Accepted, chain_logits, can_run_graph):
        chain_output = LogitsProcessorOutput(next_token_logits=chain_logits)
        if batch.return_logprob:
            compute_spec_logprobs(batch, chain_output, accepted.predict, accept_index=accepted.accept_index)
        next_token_ids = accepted.predict[accepted.accept_index.reshape(-1).long()]
        return GenerationBatchResult(
            logits_output=chain_output,
            next_token_ids=next_token_ids,
            accept_lens=accepted.accept_lens,
            new_seq_lens=committed.seq_lens + accepted.accept_lens,
            next_draft_input=None,
            speculative_num_draft_tokens=window.width,
            can_run_cuda_graph=can_run_graph,
        )

    @property
    def draft_runner(self):
        return self._draft_worker.model_runner

    @property
    def model_runner(self):
        return self.target_worker.model_runner

    def alloc_memory_pool(self, memory_pool_config=None, req_to_token_pool=None, token_to_kv_pool_allocator=None):
        if getattr(req_to_token_pool, "mamba_pool", None) is not None:
            raise ValueError(
                "PARSE does not support hybrid (mamba/linear-attention) targets: allowed are full-attention models"
            )
        super().alloc_memory_pool(memory_pool_config, req_to_token_pool, token_to_kv_pool_allocator)

    def init_cuda_graphs(self):
        # Never decode graphs on the draft runner: they would capture TARGET_VERIFY.
        self._draft_worker.init_cuda_graphs(capture_decode_cuda_graph=False)

    def _draft_model_runners(self):
        return (self.draft_runner,)

    def weight_update_runners(self):
        return [("draft", self.draft_runner)]

    @property
    def spec_v2_attn_backends(self) -> tuple:
        return (self.target_worker.model_runner.attn_backend, self.draft_runner.attn_backend)


def _draft_budget(req, config: ParseConfig) -> int:
    """Draft tokens worth writing for a request: its L, capped by the output it has left
    (one token of which is the round's bonus), as the reference drafts."""
    max_new = req.sampling_params.max_new_tokens
    if max_new is None:
        return config.draft_budget
    return min(config.draft_budget, max(max_new - len(req.output_ids) - 1, 1))


def _sampled_on_cpu(req) -> bool:
    """A temperature > 0 request where SGLang's chain verification is greedy (CPU); SGLang
    marks greedy requests with top_k 1."""
    return is_cpu() and req.sampling_params.top_k != 1


def _cut_at_stop(req, draft: torch.Tensor) -> int:
    """Length of `draft` up to and including its first stop token (the acceptable length)."""
    if req.sampling_params.ignore_eos:
        return len(draft)
    stops = set(req.sampling_params.stop_token_ids or ()) | set(req.eos_token_ids or ())
    if req.tokenizer is not None and req.tokenizer.eos_token_id is not None:
        stops.add(req.tokenizer.eos_token_id)
    hits = torch.isin(draft, torch.tensor(sorted(stops), dtype=draft.dtype))
    return int(hits.to(torch.int8).argmax()) + 1 if bool(hits.any()) else len(draft)


def _target_phase(req) -> Optional[list]:
    """Tokens a request has emitted in its current target phase; None outside one."""
    return getattr(req, "parse_target_phase", None)


def target_phase_stop(tokenizer, done: list, run: list, config: ParseConfig) -> Optional[int]:
    """How many tokens of `run` a target phase keeps before it ends (None: it goes on).

    The phase, after `done` tokens, ends after the first token that completes a segment
    (`delimiter_ends` of the phase's text so far) or that is its probe_stride-th token.
    """
    texts = tokenizer.batch_decode([[tok] for tok in done + run])
    for count in range(len(done) + 1, len(done) + len(run) + 1):
        if count >= config.probe_stride or count in delimiter_ends(texts[:count], config.delimiters):
            return count - len(done)
    return None


def _probe_round(window: Window, accepted: Accepted, i: int) -> dict:
    """Request i's `probe_scores` entry of this round: the draft it verified, how much of it
    was accepted, and [boundary, score] of each real probe."""
    bounds = window.boundaries[i].tolist()
    scores = accepted.scores[i].tolist() if accepted.scores is not None else []
    return {
        "draft": window.chain_tokens[i, 1 : 1 + int(window.draft_lens[i])].tolist(),
        "accepted": int(accepted.exact[i] + accepted.judged[i]),
        "probes": [[b, score] for b, score in zip(bounds, scores) if b > 0],
    }


def _with_padding_probes(bounds: list[int], count: int, length: int) -> list[int]:
    """`bounds` plus the smallest unused draft positions, sorted, `count` in all (≤ length)."""
    taken = set(bounds)
    extra = [b for b in range(1, length + 1) if b not in taken][: count - len(bounds)]
    return sorted(bounds + extra)
