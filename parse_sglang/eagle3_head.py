"""An EAGLE-3 head on the target (`eagle3_head`, `eagle3_steps` = k): head rounds are a tier of an
adaptive server's controller (`draft_length.HEAD`), run where they beat the target alone and PARSE's
drafting: the head drafts k tokens, PARSE's chain-only window verifies them with SGLang's exact
rules, and the head's KV is extended after EVERY round over what it emitted (docs/eagle3.md).

`HeadChain` is SGLang's `EagleDraftWorker` for the head (its own model, its KV pool over the
target's slot table, its draft chain and extends), built while the draft path and step counts
name the head (a scoped override of SGLang's speculative config, restored after). Its KV is
un-shifted in slot and shifted in content: slot p holds (the target's aux hidden states at p,
token p + 1), which is why every target forward of a head server captures the aux states (the
prefill's every row, the verify's every row) and why the head's prefill is never deferred (its
inputs exist only during that forward). The next round's head input (the head's top-1 after the
last emitted token, and its hidden state there) travels on the `EagleDraftInput` SGLang carries
per request.

Under graphs (`init_cuda_graphs`) the head's chain replays SGLang's EAGLE draft graph and the
target's verify graphs capture the aux states. Not yet (refused by name): tensor parallelism,
PD disaggregation, rejection sampling, a head with a reduced vocabulary.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
from pathlib import Path

import torch
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode
from sglang.srt.runtime_context import get_context, get_spec
from sglang.srt.speculative.eagle_draft_cuda_graph_runner import EAGLEDraftCudaGraphRunner
from sglang.srt.speculative.eagle_info import EagleDraftInput
from sglang.srt.speculative.eagle_worker_common import prepare_for_draft
from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

from parse_sglang.verify_pass import set_lengths, window_slots

logger = logging.getLogger(__name__)


def head_aux_layers(path: str, target_config, target_model, server_args, rejection_sampling: bool) -> list[int]:
    """The head checkpoint's aux layer ids, after checking it fits the target and this server;
    errors name `eagle3_head` and what is allowed."""
    where = f"eagle3_head={path!r}"
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError) as err:
        raise ValueError(
            f"{where} is invalid ({type(err).__name__}): allowed is an EAGLE-3 checkpoint folder"
        ) from None
    arch = (config.get("architectures") or [""])[0]
    if not arch.endswith("Eagle3"):
        raise ValueError(f"{where} is invalid: its architecture {arch!r} is not an EAGLE-3 head (*Eagle3)")
    vocab, hidden = target_config.vocab_size, target_config.hidden_size
    if config.get("vocab_size") != vocab or config.get("draft_vocab_size", vocab) != vocab:
        raise ValueError(
            f"{where} is invalid: its vocabulary ({config.get('vocab_size')}, draft "
            f"{config.get('draft_vocab_size')}) is not the target's {vocab}: allowed is a head over the target's vocabulary"
        )
    if config.get("target_hidden_size", config.get("hidden_size")) != hidden:
        raise ValueError(f"{where} is invalid: its target_hidden_size is not the target's hidden size {hidden}")
    layers = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    count = target_config.num_hidden_layers
    if (
        not layers
        or not all(isinstance(i, int) and -1 <= i <= count - 2 for i in layers)
        or len(set(layers)) != len(layers)
    ):
        raise ValueError(
            f"{where} is invalid: eagle_config.eagle_aux_hidden_state_layer_ids={layers!r}: allowed are distinct "
            f"layer ids in [-1, {count - 2}] of the {count}-layer target"
        )
    if not hasattr(target_model, "set_eagle3_layers_to_capture"):
        raise ValueError(f"{where}: the target {type(target_model).__name__} cannot capture EAGLE-3 hidden states")
    refusals = {
        "tensor parallelism": (server_args.tp_size or 1) > 1,
        "PD disaggregation": server_args.disaggregation_mode not in (None, "null"),
        "--speculative-use-rejection-sampling": rejection_sampling,
    }
    refused = [name for name, on in refusals.items() if on]
    if refused:
        raise ValueError(f"{where} is not supported with {', '.join(refused)} yet (docs/eagle3.md)")
    return list(layers)


class HeadChain:
    """The head and what a round asks of it (module docstring)."""

    def __init__(self, server_args, gpu_id: int, nccl_port: int, target_worker, path: str, steps: int):
        runner = target_worker.model_runner
        spec = get_spec()
        layers = head_aux_layers(
            path,
            runner.model_config.hf_config,
            runner.model,
            server_args,
            bool(spec.speculative_use_rejection_sampling),
        )
        # the target captures the head's aux states from its attention backends on (configured after this)
        runner.spec_aux_config.eagle_use_aux_hidden_state = True
        runner.spec_aux_config.eagle_aux_hidden_state_layer_ids = layers
        # SGLang's draft worker reads the draft path and step counts from the speculative config
        self._names = dict(
            speculative_draft_model_path=path, speculative_num_steps=steps, speculative_num_draft_tokens=steps + 1
        )
        with self._as_the_draft():
            self.worker = EagleDraftWorker(server_args, gpu_id, nccl_port, target_worker)
        self.worker.speculative_algorithm = SpeculativeAlgorithm.EAGLE3  # its lm_head and token map branches
        self.steps = steps
        logger.info("PARSE EAGLE-3 head %s: %d steps, target aux layers %s", path, steps, layers)

    @contextlib.contextmanager
    def _as_the_draft(self):
        """SGLang's speculative config naming the head (its path, k and k + 1), restored after."""
        spec = get_spec()
        restore = {name: getattr(spec, name) for name in self._names}
        get_context().override("parse.eagle3_head", **self._names)
        try:
            yield
        finally:
            get_context().override("parse.eagle3_head", **restore)

    def alloc_memory_pool(self, memory_pool_config, req_to_token_pool, token_to_kv_pool_allocator) -> None:
        self.worker.alloc_memory_pool(memory_pool_config, req_to_token_pool, token_to_kv_pool_allocator)

    def init_attention_backends(self) -> None:
        self.worker.init_attention_backends()

    def init_cuda_graphs(self, target_graphed: bool) -> None:
        """SGLang's EAGLE draft graphs for the head where the target's verify is graphed: its
        k-step chain, and on a GPU its extend at k + 1 rows (a head round's: the extend runner
        replays only batches of its captured width, other rounds' extends run eagerly), captured
        while the speculative config names the head's step counts. SGLang's worker skips both
        on a CPU device; there (the CPU graph stand-in, which replays draft chains but no draft
        extend) the chain's runner is built here as SGLang builds it on a GPU."""
        with self._as_the_draft():
            self.worker.init_cuda_graphs()
            if target_graphed and self.worker.cuda_graph_runner is None:
                self.worker.cuda_graph_runner = EAGLEDraftCudaGraphRunner(self.worker)

    def prefill(self, batch, aux: torch.Tensor, next_token_ids: torch.Tensor) -> EagleDraftInput:
        """The head over a prefill batch (`aux` [tokens, K*H] every prompt row's): the request's
        carried input, its first token as `bonus_tokens`."""
        carried = self.worker._draft_extend_for_prefill(copy.copy(batch), aux, next_token_ids)
        carried.bonus_tokens = next_token_ids.to(torch.int64)
        return carried

    def draft(self, batch, committed, req_to_token_pool) -> tuple[torch.Tensor, bool]:
        """([bs, k] the head's chain from each request's carried input (batch.spec_info), whether
        it replayed the chain's graph); batch.seq_lens must be the committed lengths."""
        carried = batch.spec_info
        draft_input = EagleDraftInput(
            topk_p=carried.topk_p,
            topk_index=carried.topk_index,
            hidden_states=carried.hidden_states,
            capture_hidden_mode=CaptureHiddenMode.LAST,
        )
        batch.forward_mode = ForwardMode.DECODE
        batch.spec_info = draft_input
        batch.input_ids = committed.last_tokens
        graph = self.worker.cuda_graph_runner  # SGLang's k-step chain graph (None: eager)
        forward_batch, runs, _ = prepare_for_draft(
            draft_input, req_to_token_pool, batch, graph, self.worker.draft_runner, 1, self.steps
        )
        graphed = bool(runs)
        forward_batch.return_logprob = False
        if graphed:
            _, _, tokens, _ = graph.execute(forward_batch)
        else:
            self.worker.draft_attn_backend.init_forward_metadata(forward_batch)
            forward_batch.mark_forward_metadata_ready()
            _, _, tokens, _ = self.worker.draft_forward(forward_batch)
        return tokens.reshape(len(batch.reqs), -1)[:, : self.steps].to(torch.int64), graphed  # [bs, k]

    def extend(self, batch, committed, req_to_token, aux: torch.Tensor, accepted, carried) -> None:
        """The head over a round's chain rows (row j: the target's aux states there and the token
        the round emitted after it; rows past the kept ones write KV the next round overwrites),
        then `carried` (the round's next_draft_input) gets the head's input at the last emitted
        token. aux: [bs, width, K*H], the verify's chain rows (a tier-0 round's: its decode steps')."""
        bs, width = aux.shape[0], aux.shape[1]
        chain_aux = aux.reshape(bs * width, -1)  # [bs * width, K*H]
        self.worker.speculative_num_draft_tokens = width
        set_lengths(batch, committed)
        batch.out_cache_loc = window_slots(req_to_token, committed, width)  # the chain rows' slots
        round_ = GenerationBatchResult(
            logits_output=LogitsProcessorOutput(next_token_logits=None, hidden_states=chain_aux),
            next_token_ids=accepted.emitted[:, :width].reshape(-1),  # [bs * (L+1)] the token after each row
            accept_lens=accepted.accept_lens,
            new_seq_lens=committed.seq_lens + accepted.accept_lens,
            next_draft_input=carried,
        )
        self.worker._draft_extend_for_decode(batch, round_)
