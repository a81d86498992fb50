"""paged_prefill_attention vs a dense float64 reference, over verify layouts with permuted slots."""

import random

import pytest
import torch

from parse_sglang.attention.layout import VerifyRequest, build_verify_layout, expand_qlen_only_mask
from sglang_cpu.paged import paged_prefill_attention

HQ, HK, D = 4, 2, 16


def dense_reference(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, masks, scale):
    """Per request and per query head: softmax(q k^T * scale, masked) v over the gathered slots, in float64."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    for b, mask in enumerate(masks):
        rows = slice(int(qo_indptr[b]), int(qo_indptr[b + 1]))
        slots = kv_indices[int(kv_indptr[b]) : int(kv_indptr[b + 1])].long()
        for h in range(HQ):
            kv_head = h // (HQ // HK)
            k = k_cache[slots, kv_head].double()
            v = v_cache[slots, kv_head].double()
            scores = q[rows, h].double() @ k.T * scale
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            out[rows, h] = torch.softmax(scores, dim=-1) @ v
    return out


def _random_batch(seed):
    rng = random.Random(seed)
    reqs = []
    for prefix_len in (0, 7, 23, 4):
        L = rng.randint(1, 12)
        bounds = sorted(rng.sample(range(1, L + 1), rng.randint(0, min(L, 4))))
        reqs.append(
            VerifyRequest(
                prefix_len=prefix_len,
                last_token=1,
                draft_ids=[2] * L,
                boundaries=bounds,
                suffix_ids=[3] * rng.randint(1, 4),
            )
        )
    total = sum(r.prefix_len + 1 + len(r.draft_ids) + len(r.boundaries) * len(r.suffix_ids) for r in reqs)
    gen = torch.Generator().manual_seed(seed)
    pool = torch.randperm(total + 37, generator=gen)  # a larger pool, slots in random order
    slots, start = [], 0
    for r in reqs:
        n = r.prefix_len + 1 + len(r.draft_ids) + len(r.boundaries) * len(r.suffix_ids)
        slots.append(pool[start : start + n])
        start += n
    layout = build_verify_layout(reqs, kv_slots=slots)
    rows = int(layout.qo_indptr[-1])
    q = torch.randn(rows, HQ, D, generator=gen)
    k_cache = torch.randn(total + 37, HK, D, generator=gen)
    v_cache = torch.randn(total + 37, HK, D, generator=gen)
    return layout, q, k_cache, v_cache


def _full_masks(layout):
    masks = []
    for b in range(layout.num_requests):
        n, s = int(layout.window_lens[b]), int(layout.seq_lens[b])
        masks.append(layout.mask_full[layout.mask_full_indptr[b] : layout.mask_full_indptr[b + 1]].view(n, s))
    return masks


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("form", ["full", "qlen_only"])
def test_custom_mask_matches_dense(seed, form):
    layout, q, k_cache, v_cache = _random_batch(seed)
    if form == "full":
        mask = layout.mask_full
    else:
        mask = expand_qlen_only_mask(layout.mask_qlen_only, layout.prefix_lens, layout.window_lens)
    scale = 0.3
    out = paged_prefill_attention(
        q, k_cache, v_cache, layout.qo_indptr, layout.kv_indptr, layout.kv_indices, custom_mask=mask, sm_scale=scale
    )
    ref = dense_reference(
        q, k_cache, v_cache, layout.qo_indptr, layout.kv_indptr, layout.kv_indices, _full_masks(layout), scale
    )
    assert out.dtype == torch.float32 and out.shape == q.shape
    assert (out.double() - ref).abs().max().item() <= 1e-5


def test_causal_is_bottom_right_aligned_and_default_scale():
    layout, q, k_cache, v_cache = _random_batch(3)
    out = paged_prefill_attention(
        q, k_cache, v_cache, layout.qo_indptr, layout.kv_indptr, layout.kv_indices, causal=True
    )
    masks = []
    for qo_len, kv_len in zip(layout.window_lens.tolist(), layout.seq_lens.tolist()):
        masks.append(torch.tensor([[j <= i + kv_len - qo_len for j in range(kv_len)] for i in range(qo_len)]))
    ref = dense_reference(q, k_cache, v_cache, layout.qo_indptr, layout.kv_indptr, layout.kv_indices, masks, D**-0.5)
    assert (out.double() - ref).abs().max().item() <= 1e-5


def test_no_mask_is_full_attention():
    layout, q, k_cache, v_cache = _random_batch(4)
    out = paged_prefill_attention(q, k_cache, v_cache, layout.qo_indptr, layout.kv_indptr, layout.kv_indices)
    ref = dense_reference(
        q,
        k_cache,
        v_cache,
        layout.qo_indptr,
        layout.kv_indptr,
        layout.kv_indices,
        [None] * layout.num_requests,
        D**-0.5,
    )
    assert (out.double() - ref).abs().max().item() <= 1e-5


def test_half_precision_input_keeps_dtype():
    layout, q, k_cache, v_cache = _random_batch(5)
    args = (layout.qo_indptr, layout.kv_indptr, layout.kv_indices)
    out = paged_prefill_attention(
        q.bfloat16(), k_cache.bfloat16(), v_cache.bfloat16(), *args, custom_mask=layout.mask_full
    )
    ref = paged_prefill_attention(
        q.bfloat16().float(),
        k_cache.bfloat16().float(),
        v_cache.bfloat16().float(),
        *args,
        custom_mask=layout.mask_full,
    )
    assert out.dtype == torch.bfloat16
    assert (out.float() - ref).abs().max().item() <= 2e-2


def test_fully_masked_row_is_zero():
    q = torch.randn(2, HQ, D)
    cache = torch.randn(3, HK, D)
    indptr_q, indptr_kv = torch.tensor([0, 2]), torch.tensor([0, 3])
    mask = torch.tensor([[True, False, True], [False, False, False]]).flatten()
    out = paged_prefill_attention(q, cache, cache, indptr_q, indptr_kv, torch.arange(3), custom_mask=mask)
    assert torch.equal(out[1], torch.zeros(HQ, D))
    assert out[0].abs().sum() > 0


def test_request_without_rows():
    """A request with no query rows (an empty prefill) contributes nothing and breaks nothing."""
    q = torch.randn(3, HQ, D)
    cache = torch.randn(6, HK, D)
    qo_indptr, kv_indptr = torch.tensor([0, 0, 3]), torch.tensor([0, 0, 3])
    out = paged_prefill_attention(q, cache, cache, qo_indptr, kv_indptr, torch.tensor([4, 1, 5]), causal=True)
    mask = torch.ones(3, 3, dtype=torch.bool).tril()
    ref = dense_reference(q, cache, cache, qo_indptr, kv_indptr, torch.tensor([4, 1, 5]), [None, mask], D**-0.5)
    assert (out.double() - ref).abs().max().item() <= 1e-5


def test_bad_arguments():
    q = torch.randn(4, 3, D)
    cache = torch.randn(5, 2, D)
    args = (torch.tensor([0, 4]), torch.tensor([0, 5]), torch.arange(5))
    with pytest.raises(ValueError, match="q heads: 3 is not a multiple of the 2 KV heads"):
        paged_prefill_attention(q, cache, cache, *args)
    q = torch.randn(4, HQ, D)
    with pytest.raises(ValueError, match=r"custom_mask: has 19 elements.*= 20"):
        paged_prefill_attention(q, cache, cache, *args, custom_mask=torch.ones(19, dtype=torch.bool))
    with pytest.raises(ValueError, match="qo_indptr: ends at 3, but q has 4 rows"):
        paged_prefill_attention(q, cache, cache, torch.tensor([0, 3]), *args[1:])
