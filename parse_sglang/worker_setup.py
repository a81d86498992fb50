"""SGLang's start-up and introspection hooks of the PARSE worker (`ParseWorker` inherits them):
its memory pools (and the FULL-mask buffer the GPU verify backends read), attention backends,
CUDA graphs (the draft chain's, an EAGLE-3 head's, one verify graph per window shape), and the
`get_server_info()` entry. Kept apart from worker.py, whose subject is the round."""

from __future__ import annotations

import logging

from sglang.srt.runtime_context import get_parallel, get_schedule
from sglang.srt.speculative.eagle_utils import default_tree_mask_mode

from parse_sglang.attention.window import FullMaskBuffer
from parse_sglang.scheduler_patches.draft_kv_budget import kv_bytes_per_token
from parse_sglang.scheduler_patches.pd_peer import draft_identity

logger = logging.getLogger(__name__)


class WorkerSetup:
    """The hooks; the attributes they read are `ParseWorker.__init__`'s."""

    @property
    def draft_runner(self):
        return self._draft_worker.draft_runner

    @property
    def model_runner(self):
        return self.target_worker.model_runner

    def alloc_memory_pool(self, memory_pool_config=None, req_to_token_pool=None, token_to_kv_pool_allocator=None):
        if getattr(req_to_token_pool, "mamba_pool", None) is not None:
            raise ValueError(
                "PARSE does not support hybrid (mamba/linear-attention) targets: allowed are full-attention models"
            )
        super().alloc_memory_pool(memory_pool_config, req_to_token_pool, token_to_kv_pool_allocator)
        if self.head:
            self.head.alloc_memory_pool(memory_pool_config, req_to_token_pool, token_to_kv_pool_allocator)
        if default_tree_mask_mode().name == "FULL_MASK":  # the GPU backends read the FULL form
            self.mask_buffer = FullMaskBuffer.for_pools(
                self.window_max,
                get_schedule().max_running_requests,
                token_to_kv_pool_allocator.size,
                self.model_runner.model_config.context_len,
                self.device,
            )
            logger.info("PARSE FULL-mask buffer: %.1f MiB", self.mask_buffer.buffer.numel() / 2**20)

    def init_attention_backends(self):
        super().init_attention_backends()
        if self.head:
            self.head.init_attention_backends()

    def init_cuda_graphs(self):
        """The draft chain's graphs; then, where the target's verify graph is captured, one per
        other window shape a round can have (`WindowGeometry.shapes`: per draft length, the
        chain alone and with K_max probes)."""
        super().init_cuda_graphs()
        if self.head:
            self.head.init_cuda_graphs(self.model_runner.decode_cuda_graph_runner is not None)
        self.verify_graphs.capture(self.geometry.shapes())

    def server_state(self) -> dict:
        """get_server_info()'s "parse" entry: the totals, the replica they are of (`--dp-size`), the
        draft's identity (`draft`: what a PD pair checks), and an adaptive server's cost table."""
        state = self.totals.summary()
        state["dp_rank"] = get_parallel().dp_rank or 0
        head = self.head.worker.draft_runner if self.head else None
        state["kv_bytes_per_token"] = kv_bytes_per_token(self.model_runner, self.draft_runner, head)
        state["draft"] = self.draft_identity()
        state.update(self.draft_length.server_state())
        return state

    def draft_identity(self) -> dict:
        """What a PD pair's two servers must share (`scheduler_patches.pd_peer`)."""
        return draft_identity(self.draft_runner)

    @property
    def spec_v2_attn_backends(self) -> tuple:
        return (self.target_worker.model_runner.attn_backend, self.draft_runner.attn_backend)
