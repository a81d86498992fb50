"""Torch-native paged prefill attention with FlashInfer's semantics (page size 1, NHD).

SGLang's torch_native backend cannot run TARGET_VERIFY (it ignores the custom mask), so a
CPU PARSE needs an attention that reads exactly what FlashInfer's
`BatchPrefillWithPagedKVCacheWrapper` reads for the same plan/run arguments:

- request b's queries are q[qo_indptr[b]:qo_indptr[b+1]], its keys/values the cache slots
  kv_indices[kv_indptr[b]:kv_indptr[b+1]];
- custom_mask (FULL form): per request qo_len x kv_len booleans, row-major, concatenated;
- otherwise causal=True is FlashInfer's bottom-right-aligned causal mask (query i of
  qo_len sees keys j <= i + kv_len - qo_len), and neither means full attention;
- query head h reads KV head h // (Hq / Hk) (grouped-query attention);
- a row that sees nothing yields zeros;
- with return_lse, also the log-sum-exp of each row's scaled scores in base 2, as
  FlashInfer's kernels return it (`run(..., return_lse=True)`, `merge_state`): log2 of the
  sum of exp(scores), -inf for a row that sees nothing.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


LOG2_E = 1.0 / math.log(2.0)  # natural-log LSE -> FlashInfer's base-2 LSE


def paged_prefill_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    qo_indptr: Tensor,
    kv_indptr: Tensor,
    kv_indices: Tensor,
    custom_mask: Tensor | None = None,
    sm_scale: float | None = None,
    causal: bool = False,
    return_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Attention of q [R, Hq, D] over paged k/v caches [num_slots, Hk, D] -> [R, Hq, D] in q's dtype
    (and, with return_lse, the base-2 log-sum-exp [R, Hq] in fp32).

    Computed in fp32; one batched matmul over all rows and heads of a request, a loop over
    requests only.
    """
    num_rows, num_q_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    if num_q_heads % num_kv_heads != 0:
        raise ValueError(
            f"q heads: {num_q_heads} is not a multiple of the {num_kv_heads} KV heads (grouped-query attention)"
        )
    qo_indptr = qo_indptr.tolist()
    kv_indptr = kv_indptr.tolist()
    if len(qo_indptr) != len(kv_indptr):
        raise ValueError(
            f"qo_indptr/kv_indptr: lengths {len(qo_indptr)} and {len(kv_indptr)} differ; both must be batch + 1"
        )
    if qo_indptr[-1] != num_rows:
        raise ValueError(f"qo_indptr: ends at {qo_indptr[-1]}, but q has {num_rows} rows")
    qo_lens = [e - s for s, e in zip(qo_indptr, qo_indptr[1:])]
    kv_lens = [e - s for s, e in zip(kv_indptr, kv_indptr[1:])]
    mask_indptr = [0]
    for qo_len, kv_len in zip(qo_lens, kv_lens):
        mask_indptr.append(mask_indptr[-1] + qo_len * kv_len)
    if custom_mask is not None and custom_mask.numel() != mask_indptr[-1]:
        raise ValueError(
            f"custom_mask: has {custom_mask.numel()} elements; the FULL form needs "
            f"sum(qo_len * kv_len) = {mask_indptr[-1]}"
        )
    scale = head_dim**-0.5 if sm_scale is None else sm_scale
    group = num_q_heads // num_kv_heads
    v_dim = v_cache.shape[-1]
    out = torch.empty(num_rows, num_q_heads, v_dim, dtype=q.dtype, device=q.device)
    lse = torch.empty(num_rows, num_q_heads, dtype=torch.float32, device=q.device) if return_lse else None
    for b, (qo_len, kv_len) in enumerate(zip(qo_lens, kv_lens)):
        slots = kv_indices[kv_indptr[b] : kv_indptr[b + 1]].long()
        # [Hk, G, qo, D] x [Hk, kv, D] -> [Hk, G, qo, kv]
        q_b = q[qo_indptr[b] : qo_indptr[b + 1]].float().view(qo_len, num_kv_heads, group, head_dim)
        k_b = k_cache[slots].float().transpose(0, 1)
        v_b = v_cache[slots].float().transpose(0, 1)
        scores = torch.einsum("qhgd,hkd->hgqk", q_b, k_b) * scale
        if custom_mask is not None:
            mask = custom_mask[mask_indptr[b] : mask_indptr[b + 1]].view(qo_len, kv_len).to(torch.bool)
        elif causal:
            mask = torch.ones(qo_len, kv_len, dtype=torch.bool, device=q.device).tril(kv_len - qo_len)
        else:
            mask = None
        if mask is not None:
            # Softmax of an all-masked row is NaN; zeroing masked weights after it gives 0 output.
            scores = scores.masked_fill(~mask, float("-inf"))
            weights = torch.softmax(scores, dim=-1).masked_fill(~mask, 0.0)
        else:
            weights = torch.softmax(scores, dim=-1)
        o_b = torch.einsum("hgqk,hkd->qhgd", weights, v_b)
        out[qo_indptr[b] : qo_indptr[b + 1]] = o_b.reshape(qo_len, num_q_heads, v_dim).to(q.dtype)
        if lse is not None:
            # [Hk, G, qo] -> [qo, Hq]; logsumexp of a fully masked row is -inf
            lse_b = torch.logsumexp(scores, dim=-1).permute(2, 0, 1).reshape(qo_len, num_q_heads)
            lse[qo_indptr[b] : qo_indptr[b + 1]] = lse_b * LOG2_E
    return (out, lse) if return_lse else out
