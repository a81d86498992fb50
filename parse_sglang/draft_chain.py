"""Step 1 of a PARSE round, the draft's L+1 greedy decode steps, run by SGLang's own EAGLE
multi-step draft machinery, so that on a GPU the whole loop is ONE CUDA-graph replay.

PARSE's greedy draft is EAGLE's topk=1 chain with `num_steps = L + 2`: the chain starts at
c_n (the round's input token, at position P = the committed length), step i writes the
draft's KV of its input at `req_to_token[P + i]` and attends to `[0, P + i]`, and
`draft_tokens` = [c_n, d_1 .. d_{L+1}] (the last step's output d_{L+1} is unused: that
step runs only to write d_L's draft KV, so every slot that can become committed has it).
`DraftChain` is an `EagleDraftWorker` configured for that chain, like SGLang's
`StandaloneDraftWorker` (its own draft model, no shared embeddings), and runs
- `prepare_for_draft` (per-step write slots, positions, the draft ForwardBatch),
- on a GPU with graphs, `EAGLEDraftCudaGraphRunner` replaying `draft_forward` for the
  batch's padded size, with the multi-step attention metadata planned out of the graph
  (`FlashInferMultiStepDraftBackend` / Triton, built by SGLang's `DraftBackendFactory`);
- otherwise the same `draft_forward` eagerly (on CPU: the torch-native multi-step draft
  backend of scheduler_patches/torch_native_draft.py), which is what CI executes.
The draft never runs draft-extend: its KV pool is un-shifted over the target's slots (slot
p holds the draft's KV of token p), and the prompt is prefilled by the worker.
"""

from __future__ import annotations

import logging

import torch
from sglang.srt.configs.draft_parallel import DraftParallelSpec, DraftTPExecution
from sglang.srt.layers.moe.utils import draft_model_build_scope
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.managers.tp_worker import TpModelWorker
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode
from sglang.srt.runtime_context import get_device
from sglang.srt.server_args import ServerArgs
from sglang.srt.speculative.base_spec_worker import EagleDraftWorkerBase
from sglang.srt.speculative.draft_parallel import resolve_draft_parallel_layout
from sglang.srt.speculative.draft_utils import DraftBackendFactory
from sglang.srt.speculative.eagle_info import EagleDraftInput
from sglang.srt.speculative.eagle_utils import default_tree_mask_mode
from sglang.srt.speculative.eagle_worker_common import prepare_for_draft
from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker
from sglang.srt.speculative.spec_utils import draft_pp_context, draft_tp_context

logger = logging.getLogger(__name__)


class DraftChain(EagleDraftWorker):
    """The draft model and its multi-step decode (see the module docstring)."""

    def __init__(
        self,
        server_args: ServerArgs,
        gpu_id: int,
        nccl_port: int,
        target_worker: TpModelWorker,
        draft_budget: int,
    ):
        EagleDraftWorkerBase.__init__(self)
        self.server_args = server_args
        self.gpu_id = gpu_id
        self.nccl_port = nccl_port
        self.target_worker = target_worker
        self.device = get_device().device
        self.topk = 1
        self.speculative_num_steps = draft_budget + 2
        self.speculative_num_draft_tokens = draft_budget + 3  # topk=1: steps + 1
        self.speculative_algorithm = target_worker.model_runner.spec_algorithm
        self._rebuild_topk1_chain_buffers()
        # The draft shares the target's tensor-parallel group, as STANDALONE's does.
        self.parallel_layout = resolve_draft_parallel_layout(
            DraftParallelSpec(tp_execution=DraftTPExecution.TARGET_LAYOUT)
        )
        with draft_tp_context(self.parallel_layout), draft_pp_context(), draft_model_build_scope():
            self.draft_worker = TpModelWorker(
                server_args=server_args,
                gpu_id=gpu_id,
                nccl_port=nccl_port,
                is_draft_worker=True,
                context_length=target_worker.model_runner.model_config.context_len,
            )
        self.draft_runner = self.draft_worker.model_runner
        self.hot_token_id = None
        # draft_forward reads these (EagleDraftWorker.__init__ sets them; a plain LM has none).
        self.index_share_for_mtp_iteration = False
        self.dsa_index_topk = None
        self.dsa_seed_topk_width = None
        self.seed_dsa_topk_from_draft_extend = False
        self.dsa_extend_topk_buf = None
        self.tree_mask_mode = default_tree_mask_mode()
        self.draft_attn_backend = None
        self.cuda_graph_runner = None

    def alloc_memory_pool(self, memory_pool_config=None, req_to_token_pool=None, token_to_kv_pool_allocator=None):
        """The draft's own KV pool over the target's request slots and allocator."""
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.draft_worker.alloc_memory_pool(
            memory_pool_config=memory_pool_config,
            req_to_token_pool=req_to_token_pool,
            token_to_kv_pool_allocator=token_to_kv_pool_allocator,
        )

    def init_attention_backend(self):
        """Only the multi-step decode backend: the draft's prefill keeps the runner's own
        backend (no draft-extend backend replaces it, as EAGLE's would)."""
        factory = DraftBackendFactory(self.draft_runner, self.topk, self.speculative_num_steps)
        self.draft_attn_backend = factory.create_decode_backend()
        self.draft_runner.draft_attn_backend = self.draft_attn_backend

    def _capture_cuda_graphs(self):
        """SGLang's draft-decode CUDA graph of the whole chain, one per captured batch size,
        exactly where the target's verify pass is graphed too; never a draft-extend graph."""
        self.cuda_graph_runner = None
        if self.target_worker.model_runner.decode_cuda_graph_runner is None:
            return
        from sglang.srt.speculative.eagle_draft_cuda_graph_runner import EAGLEDraftCudaGraphRunner

        self.cuda_graph_runner = EAGLEDraftCudaGraphRunner(self, speculative_num_steps=self.speculative_num_steps)
        logger.info("PARSE draft chain of %d steps captured as CUDA graphs", self.speculative_num_steps - 1)

    def draft(self, batch: ScheduleBatch, last_tokens: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """([bs, L+2] c_n, d_1 .. d_{L+1} greedy from each request's committed KV, whether the
        chain ran as a graph replay).

        batch.seq_lens must be the committed lengths P; leaves batch.out_cache_loc and
        batch.spec_info set to the draft's (the worker overwrites both for the verify)."""
        bs = last_tokens.shape[0]
        draft_input = EagleDraftInput(
            topk_p=torch.ones(bs, 1, dtype=torch.float32, device=self.device),
            topk_index=last_tokens.view(bs, 1).to(torch.int64),
            hidden_states=None,
            capture_hidden_mode=CaptureHiddenMode.NULL,
        )
        batch.forward_mode = ForwardMode.DECODE
        batch.spec_info = draft_input
        batch.input_ids = last_tokens
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
            _, _, draft_tokens, _ = self.cuda_graph_runner.execute(forward_batch)
        else:
            self.draft_attn_backend.init_forward_metadata(forward_batch)
            forward_batch.mark_forward_metadata_ready()
            _, _, draft_tokens, _ = self.draft_forward(forward_batch)
        return draft_tokens, bool(use_graph)
