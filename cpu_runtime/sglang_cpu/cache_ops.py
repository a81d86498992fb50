"""Torch versions of the `sgl_kernel` CPU ops that move KV-slot indices and KV rows.

SGLang 0.5.23 calls these from its CPU branches (`SGLANG_USE_CPU_ENGINE=1`) where the
GPU build launches the Triton kernel of the same name; the semantics below are those
Triton kernels' (read in `sglang/srt/mem_cache/allocation.py`,
`sglang/kernels/ops/speculative/cache_locs.py`, `sglang/kernels/ops/kvcache/cache_move.py`).
All work in place on their output argument, as the compiled ops do.
"""

from __future__ import annotations

import ctypes

import torch

from parse_sglang.attention.layout import ragged_index


def _ragged_spans(req_pool_indices, start_offset, end_offset):
    """(pool rows, pool columns) of request i's span [start_i, end_i), requests concatenated."""
    starts = start_offset.to(torch.int64)
    req, within = ragged_index(end_offset.to(torch.int64) - starts)
    return req_pool_indices.to(torch.int64)[req], starts[req] + within


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """req_to_token[pool_i, start_i:end_i] = the next (end_i - start_i) entries of out_cache_loc."""
    rows, cols = _ragged_spans(req_pool_indices, start_offset, end_offset)
    req_to_token.view(-1, pool_len)[rows, cols] = out_cache_loc[: rows.numel()].to(req_to_token.dtype)


def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """out_cache_loc = concat over i of req_to_token[pool_i, start_i:end_i] (the gather twin of the above)."""
    rows, cols = _ragged_spans(req_pool_indices, start_offset, end_offset)
    out_cache_loc[: rows.numel()] = req_to_token.view(-1, pool_len)[rows, cols].to(out_cache_loc.dtype)


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
    topk: int,
    speculative_num_steps: int,
) -> None:
    """Row i of out_cache_loc.view(bs, topk*steps) = req_to_token[pool_i, seq_i : seq_i + topk*steps]."""
    width = topk * speculative_num_steps
    cols = seq_lens.to(torch.int64)[:, None] + torch.arange(width, device=seq_lens.device)
    rows = req_pool_indices.to(torch.int64)[:, None]
    out = req_to_token.view(-1, pool_len)[rows, cols]
    out_cache_loc[: out.numel()] = out.reshape(-1).to(out_cache_loc.dtype)


def _byte_rows(data_ptr: int, row_bytes: int, num_rows: int) -> torch.Tensor:
    """A [num_rows, row_bytes] uint8 view of the memory at data_ptr (no copy)."""
    raw = (ctypes.c_uint8 * (row_bytes * num_rows)).from_address(data_ptr)
    return torch.frombuffer(raw, dtype=torch.uint8).view(num_rows, row_bytes)


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor,
    strides: torch.Tensor,
    tgt_loc: torch.Tensor,
    src_loc: torch.Tensor,
) -> None:
    """For every KV buffer b (raw address data_ptrs[b], strides[b] bytes per slot): slot tgt[j] = slot src[j].

    All sources are read before any target is written, so overlapping moves are safe,
    as in the tiled Triton kernel.
    """
    if tgt_loc.numel() == 0:
        return
    tgt = tgt_loc.to(torch.int64)
    src = src_loc.to(torch.int64)
    num_rows = int(torch.maximum(tgt.max(), src.max())) + 1
    for ptr, stride in zip(data_ptrs.tolist(), strides.tolist()):
        rows = _byte_rows(ptr, stride, num_rows)
        rows[tgt] = rows[src]
