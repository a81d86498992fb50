"""Units of the torch_native speculative backend: the paged metadata it derives from SGLang's
forward-batch fields (verify windows, both custom-mask forms, draft extend, draft steps).

The batches are plain namespaces with exactly the fields the backend reads; the real
SGLang batches run through the same code in test_sglang_spec_cpu.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytestmark = pytest.mark.sglang

REQ_TO_TOKEN = torch.arange(2 * 12, dtype=torch.int32).view(2, 12) + 100  # pool row r, column j -> 100 + 12r + j


@pytest.fixture(scope="module")
def verify(cpu_runtime):
    from sglang_cpu import torch_native_verify

    return torch_native_verify


def _verify_batch(custom_mask, rows=3):
    spec = SimpleNamespace(num_tokens_per_req=rows, draft_token_num=rows, custom_mask=custom_mask)
    return SimpleNamespace(
        spec_info=spec,
        seq_lens=torch.tensor([2, 4]),
        req_pool_indices=torch.tensor([1, 0]),
        out_cache_loc=torch.arange(50, 50 + 2 * rows),
    )


def test_window_kv_reads_prefix_then_written_window(verify):
    kv_indptr, kv_indices = verify.window_kv(
        REQ_TO_TOKEN, torch.tensor([1, 0]), torch.tensor([2, 4]), torch.arange(50, 56), torch.tensor([3, 3])
    )
    assert kv_indptr.tolist() == [0, 5, 12]
    assert kv_indices.tolist() == [112, 113, 50, 51, 52, 100, 101, 102, 103, 53, 54, 55]


def test_verify_metadata_accepts_qlen_only_and_full_masks(verify):
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)  # node 2's parent is node 0
    qlen_only = torch.cat([tree.flatten(), torch.ones(3, 3, dtype=torch.bool).tril().flatten()])
    meta_q = verify.verify_metadata(_verify_batch(qlen_only), REQ_TO_TOKEN)
    full = torch.cat(
        [
            torch.cat([torch.ones(3, 2, dtype=torch.bool), tree], 1).flatten(),
            torch.cat([torch.ones(3, 4, dtype=torch.bool), torch.ones(3, 3, dtype=torch.bool).tril()], 1).flatten(),
        ]
    )
    meta_f = verify.verify_metadata(_verify_batch(full), REQ_TO_TOKEN)
    assert torch.equal(meta_q.custom_mask, full) and torch.equal(meta_f.custom_mask, full)
    assert meta_q.qo_indptr.tolist() == [0, 3, 6] and not meta_q.causal
    assert meta_q.kv_indices.tolist() == [112, 113, 50, 51, 52, 100, 101, 102, 103, 53, 54, 55]


def test_verify_metadata_without_mask_is_causal(verify):
    meta = verify.verify_metadata(_verify_batch(None), REQ_TO_TOKEN)
    assert meta.custom_mask is None and meta.causal


def test_verify_metadata_rejects_mask_of_wrong_size(verify):
    expected = r"spec_info.custom_mask: has 5 elements.*QLEN_ONLY form has 18 and the FULL form 36"
    with pytest.raises(ValueError, match=expected):
        verify.verify_metadata(_verify_batch(torch.ones(5, dtype=torch.bool)), REQ_TO_TOKEN)


def test_draft_extend_metadata_is_causal_after_prefix(verify):
    batch = SimpleNamespace(
        extend_seq_lens=torch.tensor([2, 3]),
        seq_lens=torch.tensor([5, 4]),  # counts the extend rows
        req_pool_indices=torch.tensor([0, 1]),
        out_cache_loc=torch.tensor([7, 8, 9, 10, 11]),
    )
    meta = verify.extend_metadata(batch, REQ_TO_TOKEN)
    assert meta.causal and meta.custom_mask is None
    assert meta.qo_indptr.tolist() == [0, 2, 5] and meta.kv_indptr.tolist() == [0, 5, 9]
    assert meta.kv_indices.tolist() == [100, 101, 102, 7, 8, 112, 9, 10, 11]


class _Pool:
    """A K/V pool of fp32 slots [slots, heads, dim] (what the backend reads and writes of SGLang's)."""

    def __init__(self, slots, heads, dim):
        self.k, self.v = torch.randn(slots, heads, dim), torch.randn(slots, heads, dim)

    def set_kv_buffer(self, layer, loc, k, v):
        self.k[loc.loc], self.v[loc.loc] = k.view(-1, *self.k.shape[1:]), v.view(-1, *self.v.shape[1:])

    def get_key_buffer(self, layer_id):
        return self.k

    def get_value_buffer(self, layer_id):
        return self.v


def test_extend_over_a_cached_prefix_runs_paged_and_equals_sglangs_own(verify):
    """A plain EXTEND with a prefix (PARSE's draft catch-up, a radix hit) is planned as a causal
    paged extend, and attends as SGLang's stock torch_native extend does; without a prefix,
    SGLang's code runs (no plan)."""
    from sglang.srt.layers.radix_attention import AttentionType
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    torch.manual_seed(0)
    heads, kv_heads, dim = 4, 2, 8
    pool = _Pool(160, kv_heads, dim)
    req_to_token = torch.arange(2 * 40, dtype=torch.int64).view(2, 40) + 3  # pool row r, column j -> 3 + 40r + j
    prefix, new = [5, 9], [2, 1]
    batch = SimpleNamespace(
        forward_mode=ForwardMode.EXTEND,
        extend_prefix_lens_cpu=prefix,
        extend_prefix_lens=torch.tensor(prefix),
        extend_seq_lens=torch.tensor(new),
        seq_lens=torch.tensor([p + n for p, n in zip(prefix, new)]),
        req_pool_indices=torch.tensor([1, 0]),
        out_cache_loc=torch.tensor([3 + 40 + 5, 3 + 40 + 6, 3 + 9]),
        encoder_lens=None,
        out_cache_loc_swa=None,
    )
    backend = verify.TorchNativeSpecAttnBackend.__new__(verify.TorchNativeSpecAttnBackend)
    backend.req_to_token_pool, backend.token_to_kv_pool = SimpleNamespace(req_to_token=req_to_token), pool
    backend.use_sliding_window_kv_pool, backend.swa_out_cache_loc = False, None
    backend.init_forward_metadata(batch)
    assert backend.spec_metadata.causal and backend.spec_metadata.kv_indptr.tolist() == [0, 7, 17]
    layer = SimpleNamespace(
        layer_id=0,
        tp_q_head_num=heads,
        tp_k_head_num=kv_heads,
        qk_head_dim=dim,
        v_head_dim=dim,
        scaling=dim**-0.5,
        is_cross_attention=False,
        attn_type=AttentionType.DECODER,
        sliding_window_size=None,
    )
    q, k, v = torch.randn(3, heads * dim), torch.randn(3, kv_heads * dim), torch.randn(3, kv_heads * dim)
    paged = backend.forward_extend(q, k, v, layer, batch)
    backend.spec_metadata = None  # SGLang's own extend
    stock = backend.forward_extend(q, k, v, layer, batch)
    torch.testing.assert_close(paged, stock)
    backend.init_forward_metadata(SimpleNamespace(**{**vars(batch), "extend_prefix_lens_cpu": [0, 0]}))
    assert backend.spec_metadata is None


def _stub_runner():
    pool = SimpleNamespace(req_to_token=REQ_TO_TOKEN)
    return SimpleNamespace(device="cpu", req_to_token_pool=pool, token_to_kv_pool=None)


def test_multi_step_draft_backend_reads_prefix_plus_steps_so_far(cpu_runtime):
    from sglang_cpu.torch_native_draft import TorchNativeMultiStepDraftBackend

    backend = TorchNativeMultiStepDraftBackend(_stub_runner(), topk=1, speculative_num_steps=3)
    assert len(backend.attn_backends) == 2
    batch = SimpleNamespace(
        seq_lens=torch.tensor([2, 1]),
        req_pool_indices=torch.tensor([1, 0]),
        out_cache_loc=torch.tensor([40, 41, 42, 60, 61, 62]),
    )
    backend.init_forward_metadata(batch)
    step0, step1 = (b.step_metadata for b in backend.attn_backends)
    assert step0.kv_indices.tolist() == [112, 113, 40, 100, 60]
    assert step1.kv_indices.tolist() == [112, 113, 40, 41, 100, 60, 61]
    assert step1.qo_indptr.tolist() == [0, 1, 2] and not step1.causal and step1.custom_mask is None


def test_multi_step_draft_backend_refuses_tree_drafts(cpu_runtime):
    from sglang_cpu.torch_native_draft import TorchNativeMultiStepDraftBackend

    with pytest.raises(ValueError, match="speculative_eagle_topk: 4"):
        TorchNativeMultiStepDraftBackend(_stub_runner(), topk=4, speculative_num_steps=3)
