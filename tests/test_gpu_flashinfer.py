"""GPU tier: FlashInfer's paged prefill with the verify mask == paged_prefill_attention.

Skipped without CUDA or without flashinfer. Same layout, same caches, same slots: the
kernel (SGLang's TARGET_VERIFY path) and the torch-native attention must agree within
half-precision tolerance, with the mask packed by FlashInfer or by our segment_packbits.
"""

import random

import pytest
import torch

from parse_sglang.attention.layout import VerifyRequest, build_verify_layout
from sglang_cpu.packbits import segment_packbits
from sglang_cpu.paged import paged_prefill_attention

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

HQ, HK, D = 8, 2, 128
TOLERANCE = {torch.float16: 4e-3, torch.bfloat16: 3e-2}


@pytest.fixture(scope="module")
def flashinfer():
    return pytest.importorskip("flashinfer")


@pytest.fixture(scope="module")
def runner(flashinfer):
    from support.flashinfer_verify import FlashInferPagedPrefill

    return FlashInferPagedPrefill("cuda")


def _batch(seed):
    """Three requests (prefix 0 / 37 / 300; the middle one without probes) on permuted slots, GQA caches."""
    rng = random.Random(seed)
    reqs = []
    for prefix_len, num_probes in [(0, 2), (37, 0), (300, 4)]:
        L = rng.randint(max(num_probes, 1), 40)
        reqs.append(
            VerifyRequest(
                prefix_len=prefix_len,
                last_token=1,
                draft_ids=[2] * L,
                boundaries=sorted(rng.sample(range(1, L + 1), num_probes)),
                suffix_ids=[3] * rng.randint(1, 12),
            )
        )
    seq_lens = [r.prefix_len + 1 + len(r.draft_ids) + len(r.boundaries) * len(r.suffix_ids) for r in reqs]
    num_slots = sum(seq_lens) + 64
    gen = torch.Generator().manual_seed(seed)
    pool = torch.randperm(num_slots, generator=gen)
    kv_slots, start = [], 0
    for n in seq_lens:
        kv_slots.append(pool[start : start + n])
        start += n
    layout = build_verify_layout(reqs, kv_slots=kv_slots, device="cuda")
    rows = int(layout.qo_indptr[-1])
    q = torch.randn(rows, HQ, D, generator=gen).cuda()
    k_cache = torch.randn(num_slots, HK, D, generator=gen).cuda()
    v_cache = torch.randn(num_slots, HK, D, generator=gen).cuda()
    return layout, q, k_cache, v_cache


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("prepack_mask", [False, True])
def test_verify_mask_matches_torch_native(runner, dtype, prepack_mask):
    layout, q, k_cache, v_cache = _batch(0)
    q, k_cache, v_cache = q.to(dtype), k_cache.to(dtype), v_cache.to(dtype)
    sm_scale = 0.07
    runner.plan_verify(
        layout, num_qo_heads=HQ, num_kv_heads=HK, head_dim=D, dtype=dtype, sm_scale=sm_scale, prepack_mask=prepack_mask
    )
    out = runner.run(q, k_cache, v_cache)
    ref = paged_prefill_attention(
        q,
        k_cache,
        v_cache,
        layout.qo_indptr,
        layout.kv_indptr,
        layout.kv_indices,
        custom_mask=layout.mask_full,
        sm_scale=sm_scale,
    )
    assert out.shape == ref.shape and out.dtype == dtype
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_causal_matches_torch_native(runner, dtype):
    """qo_len < kv_len: FlashInfer's causal mask is bottom-right aligned, as paged_prefill_attention assumes."""
    layout, q, k_cache, v_cache = _batch(1)
    q, k_cache, v_cache = q.to(dtype), k_cache.to(dtype), v_cache.to(dtype)
    runner.plan(
        layout.qo_indptr,
        layout.kv_indptr,
        layout.kv_indices,
        num_qo_heads=HQ,
        num_kv_heads=HK,
        head_dim=D,
        dtype=dtype,
        causal=True,
    )
    out = runner.run(q, k_cache, v_cache)
    ref = paged_prefill_attention(
        q, k_cache, v_cache, layout.qo_indptr, layout.kv_indptr, layout.kv_indices, causal=True
    )
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)


def test_segment_packbits_matches_flashinfer(flashinfer):
    layout, *_ = _batch(2)
    ours, ours_indptr = segment_packbits(layout.mask_full, layout.mask_full_indptr)
    theirs, theirs_indptr = flashinfer.quantization.segment_packbits(
        layout.mask_full, layout.mask_full_indptr.to(torch.int32), bitorder="little"
    )
    assert torch.equal(ours.cpu(), theirs.cpu())
    assert ours_indptr.tolist() == theirs_indptr.tolist()
