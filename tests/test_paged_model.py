"""Model tier: one masked verify forward through our paged attention == separate HF forwards.

The tiny model runs the SGLang way: a custom attention function (registered with
transformers' AttentionInterface) writes each layer's post-RoPE key/value into a paged KV
pool at the rows' slots and calls `paged_prefill_attention` with the layout's metadata.
Each request's context is prefilled causally into the pool first; then the whole verify
batch runs as ONE forward. Every chain row must give the logits of context + draft[:j],
every probe the logits of context + draft[:b_k] + suffix, as plain eager HF computes them.
"""

import random
from dataclasses import dataclass, replace

import pytest
import torch
from transformers import AttentionInterface, AutoModelForCausalLM

from parse_sglang.attention.layout import VerifyRequest, build_verify_layout, expand_qlen_only_mask, indptr_of
from sglang_cpu.paged import paged_prefill_attention
from support.tiny_models import build_model

ATTN_NAME = "parse_paged_test"
TOL = 1e-4


@dataclass
class PagedBatch:
    """What one forward's attention reads: the pool, where rows write, and the paged metadata."""

    k_pool: list  # per layer [num_slots, Hk, D]
    v_pool: list
    out_cache_loc: torch.Tensor
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    custom_mask: torch.Tensor | None = None
    causal: bool = False


def paged_attention_forward(
    module, query, key, value, attention_mask, scaling=None, dropout=0.0, paged_batch=None, **kwargs
):
    """query [1, Hq, R, D], key/value [1, Hk, R, D] (post-RoPE) -> ([1, R, Hq, D], None)."""
    layer = module.layer_idx
    paged_batch.k_pool[layer][paged_batch.out_cache_loc] = key[0].transpose(0, 1)
    paged_batch.v_pool[layer][paged_batch.out_cache_loc] = value[0].transpose(0, 1)
    out = paged_prefill_attention(
        query[0].transpose(0, 1),
        paged_batch.k_pool[layer],
        paged_batch.v_pool[layer],
        paged_batch.qo_indptr,
        paged_batch.kv_indptr,
        paged_batch.kv_indices,
        custom_mask=paged_batch.custom_mask,
        sm_scale=scaling,
        causal=paged_batch.causal,
    )
    return out.unsqueeze(0), None


AttentionInterface.register(ATTN_NAME, paged_attention_forward)


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def models(request, tmp_path_factory):
    torch.set_num_threads(2)
    path = build_model(tmp_path_factory.mktemp(request.param), arch=request.param, num_heads=4, num_kv_heads=2)
    eager = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    paged = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation=ATTN_NAME).eval()
    return eager, paged


def _random_round(seed, vocab):
    """Contexts c_1..c_n of different lengths with random drafts, boundaries and suffixes."""
    rng = random.Random(seed)
    contexts, reqs = [], []
    for index, prefix_len in enumerate([13, 0, 41, 6]):
        context = [rng.randrange(vocab) for _ in range(prefix_len + 1)]
        L = rng.randint(1, 64) if index != 2 else 64
        num_probes = 0 if index == 1 else rng.randint(1, min(L, 6))
        reqs.append(
            VerifyRequest(
                prefix_len=prefix_len,
                last_token=context[-1],
                draft_ids=[rng.randrange(vocab) for _ in range(L)],
                boundaries=sorted(rng.sample(range(1, L + 1), num_probes)),
                suffix_ids=[rng.randrange(vocab) for _ in range(rng.randint(1, 8))],
            )
        )
        contexts.append(context)
    return contexts, reqs


def _pool(model, num_slots):
    cfg = model.config
    shape = (num_slots, cfg.num_key_value_heads, cfg.head_dim)
    return [torch.zeros(shape) for _ in range(cfg.num_hidden_layers)], [
        torch.zeros(shape) for _ in range(cfg.num_hidden_layers)
    ]


@torch.no_grad()
def _verify_logits(paged, contexts, reqs, mask_form, seed):
    """Prefill every context causally into a paged pool, then run the verify batch in one forward."""
    seq_lens = [r.prefix_len + 1 + len(r.draft_ids) + len(r.boundaries) * len(r.suffix_ids) for r in reqs]
    num_slots = sum(seq_lens) + 50
    pool = torch.randperm(num_slots, generator=torch.Generator().manual_seed(seed))
    starts = indptr_of(torch.tensor(seq_lens)).tolist()
    kv_slots = [pool[s:e] for s, e in zip(starts, starts[1:])]
    k_pool, v_pool = _pool(paged, num_slots)

    # Prefill c_1..c_{n-1} of every request as one packed causal batch.
    prefix_lens = torch.tensor([r.prefix_len for r in reqs])
    prefill_slots = torch.cat([slots[: r.prefix_len] for slots, r in zip(kv_slots, reqs)])
    prefill_indptr = indptr_of(prefix_lens, torch.int32)
    paged(
        input_ids=torch.tensor([t for c, r in zip(contexts, reqs) for t in c[: r.prefix_len]])[None],
        position_ids=torch.cat([torch.arange(p) for p in prefix_lens.tolist()])[None],
        use_cache=False,
        paged_batch=PagedBatch(
            k_pool, v_pool, prefill_slots, prefill_indptr, prefill_indptr, prefill_slots.int(), causal=True
        ),
    )

    layout = build_verify_layout(reqs, kv_slots=kv_slots)
    if mask_form == "full":
        mask = layout.mask_full
    else:
        mask = expand_qlen_only_mask(layout.mask_qlen_only, layout.prefix_lens, layout.window_lens)
    batch = PagedBatch(
        k_pool, v_pool, layout.out_cache_loc, layout.qo_indptr, layout.kv_indptr, layout.kv_indices, custom_mask=mask
    )
    logits = paged(
        input_ids=layout.input_ids[None], position_ids=layout.positions[None], use_cache=False, paged_batch=batch
    ).logits[0]
    return layout, logits, batch


@torch.no_grad()
def _reference_logits(eager, contexts, reqs):
    """Chain: logits after context + draft[:j] (one causal pass); probes: logits after context + draft[:b_k] + suffix."""
    chain, probes = [], []
    for context, req in zip(contexts, reqs):
        full = torch.tensor(context + list(req.draft_ids))[None]
        chain.append(eager(input_ids=full).logits[0, req.prefix_len :])
        for b in req.boundaries:
            probe = torch.tensor(context + list(req.draft_ids[:b]) + list(req.suffix_ids))[None]
            probes.append(eager(input_ids=probe).logits[0, -1])
    return torch.cat(chain), torch.stack(probes)


@pytest.mark.parametrize("mask_form", ["full", "qlen_only"])
@pytest.mark.parametrize("seed", [0, 1])
def test_verify_forward_matches_separate_forwards(models, mask_form, seed):
    eager, paged = models
    contexts, reqs = _random_round(seed, eager.config.vocab_size)
    layout, logits, _ = _verify_logits(paged, contexts, reqs, mask_form, seed)
    chain_ref, probe_ref = _reference_logits(eager, contexts, reqs)
    assert layout.chain_rows.numel() == chain_ref.shape[0]
    assert layout.probe_rows.numel() == probe_ref.shape[0] > 0
    assert (logits[layout.chain_rows] - chain_ref).abs().max().item() <= TOL
    assert (logits[layout.probe_rows] - probe_ref).abs().max().item() <= TOL


@torch.no_grad()
def test_probe_rows_need_the_custom_mask(models):
    """Control: the same pool and rows under a plain causal mask give wrong probe logits."""
    eager, paged = models
    contexts, reqs = _random_round(0, eager.config.vocab_size)
    layout, _, batch = _verify_logits(paged, contexts, reqs, "full", 0)
    _, probe_ref = _reference_logits(eager, contexts, reqs)
    causal_batch = replace(batch, custom_mask=None, causal=True)
    wrong = paged(
        input_ids=layout.input_ids[None], position_ids=layout.positions[None], use_cache=False, paged_batch=causal_batch
    ).logits[0]
    assert (wrong[layout.probe_rows] - probe_ref).abs().max().item() > 100 * TOL
