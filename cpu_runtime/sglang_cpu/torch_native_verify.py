"""Speculative forward modes for SGLang's `torch_native` attention backend.

What it changes: the factory registered under "torch_native" in SGLang's attention
registry (`sglang.srt.layers.attention.attention_registry.ATTENTION_BACKENDS`, through its
own `register_attention_backend`) now builds `TorchNativeSpecAttnBackend`, a subclass of
SGLang's `TorchNativeAttnBackend`. Decode and prefill without a cached prefix still run SGLang's code.

Why: stock `TorchNativeAttnBackend.forward_extend` reads `extend_prefix_lens` /
`extend_seq_lens`, which a TARGET_VERIFY batch does not carry, and never looks at
`spec_info.custom_mask`, so NGRAM / EAGLE / STANDALONE and PARSE verification crash
on CPU. The subclass runs
- TARGET_VERIFY: each request's `num_tokens_per_req` window rows over its committed KV plus
  the window, with the verify input's custom mask (SGLang's CPU QLEN_ONLY form, expanded,
  or the FULL form) or, without a mask, bottom-right causal;
- DRAFT_EXTEND_V2 (the draft re-reading the verify window): causal over prefix + window;
- EXTEND over a cached prefix (a radix hit, a later prefill chunk, PARSE's draft catching up
  over c_n each round): the same; stock `forward_extend` makes every context token a query
  (an SDPA of P x P per request and layer), which made PARSE's draft extend of 1-2 rows cost
  41-67 ms of attention a round against 14.5 ms for STANDALONE's 9-row DRAFT_EXTEND_V2 (real
  pair, ~400-token contexts): a cost of the stand-in, not of an extend on a GPU;
through the project's shared torch paged attention (`sglang_cpu.paged`). A verify
of one row per request (an adaptive PARSE round at tier 0: c_n alone) is a decode step's
attention and runs SGLang's own decode path (`DecodeShapedVerify`): the verify forward of a
tier-0 round took 2.5 ms instead of 3.0 at batch 1, and 5.4 ms instead of 7.4 at batch 8 (tiny
synthetic target, 2-core CPU).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS, register_attention_backend
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang.srt.layers.radix_attention import AttentionType
from sglang.srt.mem_cache.memory_pool import KVWriteLoc
from sglang.srt.model_executor.forward_batch_info import ForwardMode

from parse_sglang.attention.layout import indptr_of, ragged_index
from sglang_cpu.paged import paged_prefill_attention
from parse_sglang.attention.window import full_mask
from parse_sglang.verify_input import ParseVerifyInput

BACKEND_NAME = "torch_native"

# SGLang callables this module relies on, with the signature it was written against.
HOOKED_SIGNATURES = {
    "sglang.srt.layers.attention.attention_registry.register_attention_backend": "(name)",
    "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend.__init__": (
        "(self, model_runner: 'ModelRunner')"
    ),
    "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend.init_forward_metadata": (
        "(self, forward_batch: 'ForwardBatch')"
    ),
    "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend.forward_extend": (
        "(self, q, k, v, layer: 'RadixAttention', forward_batch: 'ForwardBatch', save_kv_cache=True)"
    ),
    "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend.forward_decode": (
        "(self, q, k, v, layer: 'RadixAttention', forward_batch: 'ForwardBatch', save_kv_cache=True)"
    ),
}


@dataclasses.dataclass(frozen=True)
class PagedMetadata:
    """Arguments of `paged_prefill_attention` for one forward (all layers share them)."""

    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    custom_mask: Optional[torch.Tensor]  # FULL form, or None
    causal: bool


@dataclasses.dataclass(frozen=True)
class DecodeShapedVerify:
    """TARGET_VERIFY of one row per request that sees all its committed tokens and itself: a
    decode step's attention over req_to_token[:, :P + 1] (the row's slot is req_to_token[P],
    where SGLang allocates a verify window). Holds the forward-batch fields SGLang's
    `forward_decode` reads, its lengths counting the row (a decode batch's convention)."""

    out_cache_loc: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor  # P + 1
    encoder_lens: None = None
    encoder_out_cache_loc: None = None


def window_kv(req_to_token, req_pool_indices, prefix_lens, window_locs, window_lens):
    """(kv_indptr, kv_indices): request b reads its first prefix_lens[b] pool slots, then
    its window_lens[b] slots from window_locs (the slots this forward writes, concatenated)."""
    prefix_lens = prefix_lens.to(torch.int64)
    window_lens = window_lens.to(torch.int64)
    kv_lens = prefix_lens + window_lens
    req, j = ragged_index(kv_lens)
    in_prefix = j < prefix_lens[req]
    kv_indices = torch.empty_like(j)
    pool_rows = req_pool_indices.to(torch.int64)[req[in_prefix]]
    kv_indices[in_prefix] = req_to_token[pool_rows, j[in_prefix]].to(torch.int64)
    window_pos = (indptr_of(window_lens)[:-1] - prefix_lens)[req] + j
    kv_indices[~in_prefix] = window_locs.reshape(-1).to(torch.int64)[window_pos[~in_prefix]]
    return indptr_of(kv_lens, torch.int32), kv_indices


def verify_metadata(forward_batch, req_to_token) -> PagedMetadata:
    """TARGET_VERIFY: n rows per request after its seq_lens committed tokens, masked by the verify input.

    Also plans a CUDA-graph replay's padded batch (SGLang's runner pads seq_lens and
    req_pool_indices to the captured size but hands the batch's own out_cache_loc and spec
    input): the padded requests' window rows write slot 0, as the runner's static buffer
    holds, and see everything, as SGLang pads EAGLE's mask. A capture-time mask is the
    runner's all-True buffer, longer than any batch needs: its first FULL-form elements."""
    spec = forward_batch.spec_info
    if spec is None:
        raise ValueError("forward_batch.spec_info: None in TARGET_VERIFY; a verify input is required")
    rows = spec.num_tokens_per_req if getattr(spec, "num_tokens_per_req", -1) > 0 else spec.draft_token_num
    prefix = forward_batch.seq_lens.to(torch.int64)
    bs = prefix.numel()
    window = torch.full_like(prefix, rows)
    locs = forward_batch.out_cache_loc.reshape(-1)
    if locs.numel() < bs * rows:
        locs = torch.cat([locs, torch.zeros(bs * rows - locs.numel(), dtype=locs.dtype, device=locs.device)])
    kv_indptr, kv_indices = window_kv(req_to_token, forward_batch.req_pool_indices, prefix, locs, window)
    qo_indptr = indptr_of(window, torch.int32)
    mask = spec.custom_mask
    if mask is None or mask.numel() == 0:
        return PagedMetadata(qo_indptr, kv_indptr, kv_indices, None, causal=True)
    mask = mask.reshape(-1).to(torch.bool)
    qlen_only = bs * rows * rows
    prefix_sum = int(prefix.sum())
    full = rows * prefix_sum + qlen_only
    if mask.numel() < qlen_only and mask.numel() % (rows * rows) == 0:
        mask = torch.cat([mask, torch.ones(qlen_only - mask.numel(), dtype=torch.bool, device=mask.device)])
    if mask.numel() == qlen_only:
        mask = full_mask(mask, rows, prefix, prefix_sum)
    elif mask.numel() > full:
        mask = mask[:full]
    elif mask.numel() != full:
        raise ValueError(
            f"spec_info.custom_mask: has {mask.numel()} elements; with {bs} requests of "
            f"{rows} verify rows the QLEN_ONLY form has {qlen_only} and the FULL form {full}"
        )
    return PagedMetadata(qo_indptr, kv_indptr, kv_indices, mask, causal=False)


def extend_metadata(forward_batch, req_to_token) -> PagedMetadata:
    """DRAFT_EXTEND_V2, or EXTEND over a cached prefix: extend_seq_lens new rows per request,
    seq_lens counting them; causal."""
    window = forward_batch.extend_seq_lens.to(torch.int64)
    prefix = forward_batch.seq_lens.to(torch.int64) - window
    kv_indptr, kv_indices = window_kv(
        req_to_token, forward_batch.req_pool_indices, prefix, forward_batch.out_cache_loc, window
    )
    return PagedMetadata(indptr_of(window, torch.int32), kv_indptr, kv_indices, None, causal=True)


def pageable(layer) -> bool:
    """Whether the shared paged attention runs `layer`: causal self-attention over the whole context."""
    return not (
        layer.is_cross_attention
        or layer.attn_type == AttentionType.ENCODER_ONLY
        or (layer.sliding_window_size is not None and layer.sliding_window_size > -1)
    )


class TorchNativeSpecAttnBackend(TorchNativeAttnBackend):
    """SGLang's torch_native backend plus TARGET_VERIFY and DRAFT_EXTEND_V2 (see module doc)."""

    def __init__(self, model_runner):
        super().__init__(model_runner)
        self.spec_metadata: Optional[PagedMetadata] = None

    def init_forward_metadata(self, forward_batch):
        super().init_forward_metadata(forward_batch)
        mode = forward_batch.forward_mode
        req_to_token = self.req_to_token_pool.req_to_token
        if mode.is_target_verify():
            spec = forward_batch.spec_info
            if isinstance(spec, ParseVerifyInput) and spec.shape.rows == 1:
                # a PARSE window of one row (c_n alone) sees every committed token and itself,
                # whatever its mask's form: no mask to read (eager only: a graph replay keeps the paged plan)
                self.spec_metadata = DecodeShapedVerify(
                    forward_batch.out_cache_loc, forward_batch.req_pool_indices, forward_batch.seq_lens + 1
                )
            else:
                self.spec_metadata = verify_metadata(forward_batch, req_to_token)
        elif mode.is_draft_extend_v2() or (
            mode == ForwardMode.EXTEND and any(forward_batch.extend_prefix_lens_cpu or ())
        ):
            self.spec_metadata = extend_metadata(forward_batch, req_to_token)
        else:
            self.spec_metadata = None

    # SGLang's graph-runner API (CUDA graphs on a GPU; sglang_cpu.graph_replay on CPU):
    # the metadata is planned on the host, out of the graph, for the padded batch.
    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int, kv_indices_buf=None):
        """Nothing to preallocate: each plan builds its own index tensors."""

    def get_cuda_graph_seq_len_fill_value(self):
        return 1

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False):
        if forward_batch.forward_mode.is_target_verify():
            self.spec_metadata = verify_metadata(forward_batch, self.req_to_token_pool.req_to_token)
        else:
            raise NotImplementedError(
                f"forward_mode={forward_batch.forward_mode}: the torch_native backend plans graph "
                "replays of TARGET_VERIFY only"
            )

    def run_paged(self, q, k, v, layer, forward_batch, save_kv_cache, metadata: PagedMetadata):
        """Write this forward's K/V, then attend with `metadata` through the shared paged attention."""
        if not pageable(layer):
            raise NotImplementedError(
                f"layer {layer.layer_id}: cross-attention / encoder-only / sliding-window layers are not "
                "supported by the torch_native speculative modes"
            )
        if save_kv_cache and k is not None and v is not None:
            self.token_to_kv_pool.set_kv_buffer(
                layer, KVWriteLoc(forward_batch.out_cache_loc, self.swa_out_cache_loc), k, v
            )
        out = paged_prefill_attention(
            q.reshape(-1, layer.tp_q_head_num, layer.qk_head_dim),
            self.token_to_kv_pool.get_key_buffer(layer.layer_id),
            self.token_to_kv_pool.get_value_buffer(layer.layer_id),
            metadata.qo_indptr,
            metadata.kv_indptr,
            metadata.kv_indices,
            custom_mask=metadata.custom_mask,
            sm_scale=layer.scaling,
            causal=metadata.causal,
        )
        return out.reshape(-1, layer.tp_q_head_num * layer.v_head_dim)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        plain = forward_batch.forward_mode == ForwardMode.EXTEND
        if self.spec_metadata is None or (plain and not pageable(layer)):
            return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache)
        if isinstance(self.spec_metadata, DecodeShapedVerify):
            return self.forward_decode(q, k, v, layer, self.spec_metadata, save_kv_cache)
        return self.run_paged(q, k, v, layer, forward_batch, save_kv_cache, self.spec_metadata)


def create_torch_native_spec_backend(runner):
    """Attention-registry factory for "torch_native"."""
    return TorchNativeSpecAttnBackend(runner)


def install() -> str:
    """Register the speculative-capable backend as SGLang's "torch_native"; returns what was done."""
    if ATTENTION_BACKENDS.get(BACKEND_NAME) is not create_torch_native_spec_backend:
        register_attention_backend(BACKEND_NAME)(create_torch_native_spec_backend)
    return f'attention backend "{BACKEND_NAME}" -> TorchNativeSpecAttnBackend (TARGET_VERIFY, DRAFT_EXTEND_V2)'
