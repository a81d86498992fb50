"""Draft-model attention backends for EAGLE / STANDALONE on `torch_native` (chain drafts).

What it changes: an AROUND hook on SGLang's
`sglang.srt.speculative.draft_utils.DraftBackendFactory._create_backend` adds a
"torch_native" entry to the backend map it is handed, so the factory builds
- the multi-step draft-decode backend: `TorchNativeMultiStepDraftBackend` (topk=1 only),
- the draft-extend backend: `TorchNativeSpecAttnBackend` (DRAFT_EXTEND_V2, see
  torch_native_verify.py),
instead of refusing with "EAGLE is not supported in (decode) attention backend torch_native".

Why: SGLang has no torch-native multi-step draft backend, so a CPU machine (where
torch_native is the only attention that runs) could not serve EAGLE or STANDALONE.
Only topk=1 is lifted: its draft is a chain, so draft step i of request b reads the
committed prefix plus the i+1 draft slots written so far. topk > 1 (tree drafts, whose
branches need their own KV rows) keeps a refusal with a clear message.
"""

from __future__ import annotations

import torch
from sglang.srt.plugins.hook_registry import HookType

from parse_sglang.scheduler_patches import register_hooks_once

from sglang_cpu.torch_native_verify import (
    BACKEND_NAME,
    PagedMetadata,
    TorchNativeSpecAttnBackend,
    window_kv,
)

TARGET = "sglang.srt.speculative.draft_utils.DraftBackendFactory._create_backend"

HOOKED_SIGNATURES = {
    TARGET: "(self, backend_name: str, backend_map: dict, error_template: str, stamps_children: bool = False)",
    "sglang.srt.speculative.draft_utils.DraftBackendFactory.__init__": (
        "(self, draft_model_runner, topk: int, speculative_num_steps: int, "
        "seed_dsa_topk_from_draft_extend: bool = False, "
        "qsa_profile: Optional[sglang.srt.layers.attention.qsa.config.QSAProfile] = None)"
    ),
}


class TorchNativeDraftStepBackend(TorchNativeSpecAttnBackend):
    """One draft-decode step; its rows attend through `step_metadata`, which the multi-step
    backend sets for every forward."""

    def __init__(self, model_runner):
        super().__init__(model_runner)
        self.step_metadata: PagedMetadata | None = None

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        if self.step_metadata is None:
            return super().forward_decode(q, k, v, layer, forward_batch, save_kv_cache)
        return self.run_paged(q, k, v, layer, forward_batch, save_kv_cache, self.step_metadata)


class TorchNativeMultiStepDraftBackend:
    """The per-step backends of a chain (topk=1) draft, in SGLang's multi-step backend shape."""

    def __init__(self, model_runner, topk: int, speculative_num_steps: int):
        if topk != 1:
            raise ValueError(
                f"speculative_eagle_topk: {topk}; the torch_native draft backend supports only 1 "
                "(chain drafts). Use --speculative-eagle-topk 1 on CPU."
            )
        self.topk = topk
        self.speculative_num_steps = speculative_num_steps
        self.req_to_token = model_runner.req_to_token_pool.req_to_token
        self.attn_backends = [TorchNativeDraftStepBackend(model_runner) for _ in range(speculative_num_steps - 1)]

    def init_forward_metadata(self, forward_batch):
        """Step i of request b reads its seq_lens[b] committed slots plus draft slots 0..i.

        forward_batch.out_cache_loc holds every step's write slot, [bs, num_steps] row-major.
        """
        prefix = forward_batch.seq_lens
        bs = prefix.numel()
        step_locs = forward_batch.out_cache_loc.reshape(bs, self.speculative_num_steps)
        single = torch.arange(bs + 1, dtype=torch.int32, device=prefix.device)
        for step, backend in enumerate(self.attn_backends):
            kv_indptr, kv_indices = window_kv(
                self.req_to_token,
                forward_batch.req_pool_indices,
                prefix,
                step_locs[:, : step + 1],
                torch.full_like(prefix, step + 1),
            )
            backend.spec_metadata = None
            backend.step_metadata = PagedMetadata(single, kv_indptr, kv_indices, None, causal=False)

    # SGLang's graph-runner API (EAGLEDraftCudaGraphRunner): the per-step plans are made out
    # of the graph, for the padded batch; nothing is preallocated or planned inside it.
    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
        """Nothing to preallocate: each plan builds its own index tensors."""

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False):
        self.init_forward_metadata(forward_batch)

    def init_forward_metadata_in_graph(self, forward_batch):
        """Planned out of the graph already."""


def _add_torch_native(original, factory, backend_name, backend_map, error_template, stamps_children=False):
    """AROUND hook: offer "torch_native" to SGLang's draft backend factory."""
    runner = factory.draft_model_runner

    def build():
        if backend_name == "decode_attention_backend" and stamps_children:
            return BACKEND_NAME, TorchNativeMultiStepDraftBackend(runner, factory.topk, factory.speculative_num_steps)
        return BACKEND_NAME, TorchNativeSpecAttnBackend(runner)

    backend_map = {**backend_map, BACKEND_NAME: build}
    return original(factory, backend_name, backend_map, error_template, stamps_children)


def install() -> str:
    """Register the AROUND hook with SGLang's HookRegistry (once; applied by the caller)."""
    register_hooks_once(__name__, (TARGET, _add_torch_native, HookType.AROUND))
    return f"{TARGET}: AROUND hook offering torch_native draft backends (topk=1)"
