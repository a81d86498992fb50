"""Torch versions of the in-tree SGLang Triton kernels that its FlashInfer backend launches.

Triton cannot launch on a CPU, so a CPU run of `flashinfer_backend.py` needs these (bound by
`sglang_cpu.flashinfer_on_cpu`, only when the FlashInfer stand-in is on):

- `create_flashinfer_kv_indices_triton` (sglang.kernels.ops.attention.kv_indices): each
  request's KV slots as one CSR stream, launched through `KVIndexTranslator.pack_read_stream`
  by the prefill / decode index updaters and by verify inputs' `generate_attn_arg_prefill`;
- `generate_draft_decode_kv_indices` (sglang.kernels.ops.speculative.cache_locs): the
  per-step KV indices and indptrs of `FlashInferMultiStepDraftBackend`;
- `merge_state_triton` (sglang.kernels.ops.attention.merge_state): the fallback of
  `_safe_merge_state` for many heads.

Each reproduces its kernel's arguments and stores, launch grid included
(`kernel[grid](...)`); features a CPU pool never produces raise NotImplementedError.
"""

from __future__ import annotations

import functools
from typing import Callable, Optional

import torch
from torch import Tensor

from parse_sglang.attention.layout import ragged_index
from sglang_cpu.flashinfer_ops import trace


class GridKernel:
    """A torch function launched like a Triton kernel: `kernel[grid](*args, **kwargs)`."""

    def __init__(self, fn: Callable):
        self.fn = fn
        functools.update_wrapper(self, fn)

    def __getitem__(self, grid) -> Callable:
        grid = tuple(grid) if isinstance(grid, (tuple, list)) else (grid,)
        return functools.partial(self.fn, grid)


def _rows_of(table: Tensor, row_stride: int) -> Tensor:
    if table.dim() != 2 or table.stride(0) != row_stride:
        raise NotImplementedError(
            f"a KV table of shape {tuple(table.shape)} read with row stride {row_stride} (a strided view)"
        )
    return table


def _create_flashinfer_kv_indices(
    grid,
    req_to_token: Tensor,
    req_pool_indices: Tensor,
    page_kernel_lens: Tensor,
    kv_indptr: Tensor,
    kv_start_idx: Optional[Tensor],
    kv_indices: Tensor,
    req_to_token_stride: int,
    ENTRY_PAGE_SIZE: int = 1,
    TOKEN_BLOCK_PARALLEL: bool = False,
    token_mapping: Optional[Tensor] = None,
) -> None:
    """Program b: kv_indices[kv_indptr[b] + j] = table[req_pool_indices[b], kv_start_idx[b] + j]
    for j < page_kernel_lens[b] (token ids rebuilt from page entries when ENTRY_PAGE_SIZE > 1,
    then remapped through token_mapping, keeping -1)."""
    trace("create_flashinfer_kv_indices")
    bs = grid[0]
    table = _rows_of(req_to_token, req_to_token_stride)
    lens = page_kernel_lens[:bs].to(torch.int64)
    b, j = ragged_index(lens)
    start = kv_start_idx[:bs].to(torch.int64)[b] if kv_start_idx is not None else 0
    pos = start + j
    rows = req_pool_indices[:bs].to(torch.int64)[b]
    if ENTRY_PAGE_SIZE == 1:
        data = table[rows, pos].to(torch.int64)
    else:
        data = table[rows, pos // ENTRY_PAGE_SIZE].to(torch.int64) * ENTRY_PAGE_SIZE + pos % ENTRY_PAGE_SIZE
    if token_mapping is not None:
        data = torch.where(data >= 0, token_mapping[data.clamp(min=0)].to(torch.int64), -1)
    kv_indices[kv_indptr[:bs].to(torch.int64)[b] + j] = data.to(kv_indices.dtype)


create_flashinfer_kv_indices_triton = GridKernel(_create_flashinfer_kv_indices)


def _generate_draft_decode_kv_indices(
    grid,
    req_pool_indices: Tensor,
    req_to_token: Tensor,
    paged_kernel_lens: Tensor,
    kv_indices: Tensor,
    kv_indptr: Tensor,
    positions: Tensor,
    row_stride: int,
    kv_indices_stride: int,
    kv_indptr_stride: int,
    bs_upper: int,
    iter_upper: int,
    num_tokens_upper: int,
    page_size: int,
    window_size: int = 0,
    sink_size: int = 0,
    NUM_STEPS: int = 0,
    ENTRY_PAGE_SIZE: int = 1,
    v2p: Optional[Tensor] = None,
    TRANSLATE: bool = False,
) -> None:
    """Grid (steps x token blocks, num_seqs, topk). For draft step s (it = s + 1 tokens drafted),
    sequence b and branch t, row s of kv_indices gets, at
    cum_len(b) * topk + b * it * topk + t * (len_b + it): the committed slots
    req_to_token[row_b, :len_b] (the sink and recent window when window_size > 0), then the
    branch's it draft slots req_to_token[row_b, len_b + t * num_steps : ... + it]; and
    kv_indptr[s, z] = sum(positions[:z]) + z * it for z = b * topk + t > 0 (z = 0 writes the
    batch total, z = num_seqs * topk). kv_indptr[s, 0] is left as it is (0)."""
    trace("generate_draft_decode_kv_indices")
    if TRANSLATE or v2p is not None or ENTRY_PAGE_SIZE != 1:
        raise NotImplementedError("translated (unified-pool) draft KV reads: TRANSLATE / ENTRY_PAGE_SIZE > 1")
    programs, num_seqs, topk = grid
    if page_size != 1 and topk != 1:
        raise NotImplementedError(f"page_size={page_size} with topk={topk} (paged tree drafts)")
    num_steps = programs if NUM_STEPS == 0 else NUM_STEPS
    table = _rows_of(req_to_token, row_stride)
    flat_indices = kv_indices.view(-1)
    flat_indptr = kv_indptr.view(-1)
    seq_lens = paged_kernel_lens[:num_seqs].to(torch.int64).tolist()
    rows = req_pool_indices[:num_seqs].to(torch.int64).tolist()
    cap = window_size + sink_size
    lens_w = [min(n, cap) if window_size > 0 else n for n in seq_lens]
    pos = positions[: num_seqs * topk].to(torch.int64)
    if window_size > 0:
        pos = pos.clamp(max=cap)
    for step in range(num_steps):
        it = step + 1
        base = step * kv_indices_stride
        for b, (seq_len, seq_len_w, row) in enumerate(zip(seq_lens, lens_w, rows)):
            s_eff = min(sink_size, seq_len) if window_size > 0 else 0
            recent_start = seq_len - (seq_len_w - s_eff) if window_size > 0 else 0
            offsets = torch.arange(seq_len_w)
            src = torch.where(offsets < s_eff, offsets, recent_start + offsets - s_eff)
            committed = table[row, src]
            for t in range(topk):
                start = base + sum(lens_w[:b]) * topk + b * it * topk + t * (seq_len_w + it)
                flat_indices[start : start + seq_len_w] = committed.to(flat_indices.dtype)
                first = seq_len + t * num_steps
                draft = table[row, first : first + it]
                flat_indices[start + seq_len_w : start + seq_len_w + it] = draft.to(flat_indices.dtype)
                z = b * topk + t or num_seqs * topk
                flat_indptr[step * kv_indptr_stride + z] = int(pos[:z].sum()) + z * it


generate_draft_decode_kv_indices = GridKernel(_generate_draft_decode_kv_indices)


def merge_state_triton(
    prefix_output: Tensor,
    prefix_lse: Tensor,
    suffix_output: Tensor,
    suffix_lse: Tensor,
    output: Optional[Tensor] = None,
    output_lse: Optional[Tensor] = None,
) -> tuple[Tensor, Optional[Tensor]]:
    """SGLang's Triton merge of two attention states, as its kernel computes it: +inf LSEs
    count as -inf, and the LSEs are taken as natural-log (exp / log), unlike FlashInfer's
    base-2 `merge_state`."""
    trace("merge_state_triton")
    if output is None:
        output = torch.empty_like(prefix_output)
    if output_lse is None:
        output_lse = torch.empty_like(prefix_lse)
    p_lse = prefix_lse.float().masked_fill(prefix_lse == float("inf"), float("-inf"))
    s_lse = suffix_lse.float().masked_fill(suffix_lse == float("inf"), float("-inf"))
    max_lse = torch.maximum(p_lse, s_lse)
    p_w, s_w = torch.exp(p_lse - max_lse), torch.exp(s_lse - max_lse)
    out_se = p_w + s_w
    output_lse.copy_(torch.log(out_se) + max_lse)
    merged = prefix_output.float() * (p_w / out_se)[..., None] + suffix_output.float() * (s_w / out_se)[..., None]
    output.copy_(merged)
    return output, output_lse
