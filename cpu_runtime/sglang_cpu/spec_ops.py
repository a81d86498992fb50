"""Torch versions of the `sgl_kernel` CPU ops on SGLang's speculative-decoding commit path.

Semantics are those of the Triton kernels with the same names in
`sglang/kernels/ops/speculative/eagle.py` and `.../multi_layer_eagle.py`, which SGLang
0.5.23 replaces by these ops when `SGLANG_USE_CPU_ENGINE=1`. All work in place.
"""

from __future__ import annotations

from typing import Optional

import torch

from parse_sglang.attention.layout import ragged_index


def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor,
    out_cache_loc: torch.Tensor,
    accept_out_cache_loc: torch.Tensor,
) -> None:
    """Compact: the k-th non-negative entry of accept_index (flat order) selects out_cache_loc into slot k."""
    flat = accept_index.reshape(-1).to(torch.int64)
    kept = flat[flat >= 0]
    accept_out_cache_loc[: kept.numel()] = out_cache_loc[kept].to(accept_out_cache_loc.dtype)


def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor,
    accept_lens: torch.Tensor,
    bonus_tokens: torch.Tensor,
    accept_stride: int,
) -> None:
    """bonus_tokens[i] = the last accepted token of request i (accept_lens counts the bonus)."""
    rows = torch.arange(accept_lens.numel(), device=accept_lens.device)
    idx = rows * accept_stride + accept_lens.to(torch.int64) - 1
    bonus_tokens[: rows.numel()] = accept_tokens.reshape(-1)[idx].to(bonus_tokens.dtype)


def rotate_input_ids_cpu(
    input_ids: torch.Tensor,
    extend_start_loc: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    topk_index: torch.Tensor,
    select_index: Optional[torch.Tensor] = None,
) -> None:
    """Shift each request's extend segment left by one and write its new token last.

    The new token goes to select_index[i] when given, else to the segment's last slot;
    empty segments are left alone.
    """
    starts = extend_start_loc.to(torch.int64)
    lens = extend_seq_lens.to(torch.int64)
    req, within = ragged_index((lens - 1).clamp(min=0))
    dst = starts[req] + within
    input_ids[dst] = input_ids[dst + 1]  # advanced indexing: the right side is a copy
    nonempty = lens > 0
    last = select_index.to(torch.int64) if select_index is not None else starts + lens - 1
    input_ids[last[nonempty]] = topk_index.reshape(-1)[nonempty].to(input_ids.dtype)
