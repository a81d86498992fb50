"""SGLang's FlashInfer attention backend executed on CPU: SGLang's real backend Python, our torch kernels.

`sglang_cpu.enable_flashinfer_standin()` (opt-in) puts a torch stand-in of `flashinfer`
on the import path, and the plugin then installs sglang_cpu/flashinfer_on_cpu.py in
the processes that see it. Here:
- units, no engine: the stand-in's wrappers against `paged_prefill_attention` and a float64
  softmax reference (custom mask, causal, decode, ragged + merge_state == one attention over
  the concatenated KV), its bit packing, the torch versions of SGLang's Triton kernels, and
  SGLang's own `FlashInferMultiStepDraftBackend` built in this process (its per-step KV
  indices are the topk=1 chain, its step attention the reference's);
- engines (`attention_backend="flashinfer"`, one per configuration, each started and shut
  down inside its fixture with the stand-in on only meanwhile): target-only and PARSE lossless
  == transformers greedy, judged PARSE == the torch_native backend's (tokens, judge scores
  within 1e-3), STANDALONE (SGLang's EAGLE draft machinery) == transformers greedy; each
  engine's processes report which stand-in paths ran (`flashinfer_ops.trace`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import parse_sglang
import sglang_cpu
from conftest import BATCH_PROMPTS, sglang_engine, standalone_kwargs, target_continuations, probe_config
from parse_sglang.attention.layout import indptr_of
from sglang_cpu.packbits import segment_packbits as ours_segment_packbits
from sglang_cpu.paged import paged_prefill_attention
from sglang_cpu import flashinfer_ops as fi
from sglang_cpu import triton_ops
from parse_sglang.settings import parse_engine_kwargs
from test_paged_attention import HK, HQ, D, _full_masks, _random_batch, dense_reference

pytestmark = pytest.mark.sglang

WORKSPACE = torch.empty(16, dtype=torch.uint8)
POOL_SLOTS = 512  # > the 5 x 64 request-to-token table of the multi-step test
LN2 = float(np.log(2.0))


def _plan_verify(wrapper, layout, **masks):
    ones = torch.ones(layout.num_requests, dtype=torch.int32)
    wrapper.plan(layout.qo_indptr, layout.kv_indptr, layout.kv_indices, ones, HQ, HK, D, 1, **masks)


def _dense_lse(q, k_cache, qo_indptr, kv_indptr, kv_indices, masks, scale):
    """Natural-log log-sum-exp of each row's masked scaled scores, float64 [rows, HQ]."""
    out = torch.full(q.shape[:2], float("-inf"), dtype=torch.float64)
    for b, mask in enumerate(masks):
        rows = slice(int(qo_indptr[b]), int(qo_indptr[b + 1]))
        slots = kv_indices[int(kv_indptr[b]) : int(kv_indptr[b + 1])].long()
        for h in range(HQ):
            scores = q[rows, h].double() @ k_cache[slots, h // (HQ // HK)].double().T * scale
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            out[rows, h] = torch.logsumexp(scores, dim=-1)
    return out


# ----- the stand-in's wrappers ------------------------------------------------------------


@pytest.mark.parametrize("prepack", [False, True])
def test_paged_plan_with_custom_mask_equals_paged_attention(prepack):
    """plan(custom_mask=FULL) / plan(packed_custom_mask=segment_packbits(FULL, "little")), then
    run: SGLang's TARGET_VERIFY call; base-2 LSE as FlashInfer returns it."""
    layout, q, k_cache, v_cache = _random_batch(0)
    wrapper = fi.BatchPrefillWithPagedKVCacheWrapper(WORKSPACE, "NHD", backend="fa2")
    if prepack:
        packed, _ = ours_segment_packbits(layout.mask_full, layout.mask_full_indptr, "little")
        _plan_verify(wrapper, layout, packed_custom_mask=packed, causal=True)  # a custom mask wins over causal
    else:
        _plan_verify(wrapper, layout, custom_mask=layout.mask_full)
    out, lse = wrapper.run(q, (k_cache, v_cache), return_lse=True)
    args = (layout.qo_indptr, layout.kv_indptr, layout.kv_indices)
    expected = paged_prefill_attention(q, k_cache, v_cache, *args, custom_mask=layout.mask_full)
    assert torch.equal(out, expected)
    ref = dense_reference(q, k_cache, v_cache, *args, _full_masks(layout), D**-0.5)
    assert (out.double() - ref).abs().max() <= 1e-5
    ref_lse = _dense_lse(q, k_cache, *args, _full_masks(layout), D**-0.5) / LN2
    assert lse.dtype == torch.float32 and (lse.double() - ref_lse).abs().max() <= 1e-4


def test_paged_forward_sets_causal_scale_and_scales():
    """SGLang's extend calls the deprecated forward(causal=..., sm_scale=..., k_scale, v_scale)."""
    layout, q, k_cache, v_cache = _random_batch(3)
    wrapper = fi.BatchPrefillWithPagedKVCacheWrapper(WORKSPACE, "NHD")
    _plan_verify(wrapper, layout)
    args = (layout.qo_indptr, layout.kv_indptr, layout.kv_indices)
    out = wrapper.forward(q, (k_cache[:, None], v_cache[:, None]), causal=True, sm_scale=0.2, k_scale=1.5, v_scale=2.0)
    expected = paged_prefill_attention(q, k_cache, v_cache, *args, sm_scale=0.3, causal=True) * 2.0
    assert torch.allclose(out, expected, atol=1e-6)
    full = wrapper.forward(q, torch.stack([k_cache, v_cache], 1), causal=False)  # one [slots, 2, Hk, D] tensor
    assert torch.equal(full, paged_prefill_attention(q, k_cache, v_cache, *args))


def test_decode_wrapper_and_fast_decode_plan():
    """One query row per request over its planned slots; fast_decode_plan (SGLang's
    graph-time begin_forward, with a host indptr) plans the same."""
    gen = torch.Generator().manual_seed(1)
    k_cache, v_cache = torch.randn(40, HK, D, generator=gen), torch.randn(40, HK, D, generator=gen)
    indptr = torch.tensor([0, 5, 6, 13], dtype=torch.int32)
    indices = torch.randperm(40, generator=gen)[:13].to(torch.int32)
    q = torch.randn(3, HQ, D, generator=gen)
    last = torch.ones(3, dtype=torch.int32)
    wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(WORKSPACE, "NHD", use_tensor_cores=False)
    wrapper.begin_forward(indptr, indices, last, HQ, HK, D, 1, data_type=torch.float32, q_data_type=torch.float32)
    out = wrapper.forward(q, (k_cache, v_cache), sm_scale=0.25)
    ref = dense_reference(q, k_cache, v_cache, torch.arange(4), indptr, indices, [None] * 3, 0.25)
    assert (out.double() - ref).abs().max() <= 1e-5
    fast = fi.BatchDecodeWithPagedKVCacheWrapper(WORKSPACE, "NHD")
    fast.begin_forward = functools.partial(fi.fast_decode_plan, fast)
    fast.begin_forward(indptr, indices, last, HQ, HK, D, 1, data_type=torch.float32, global_override_indptr_cpu=indptr)
    assert torch.equal(fast.forward(q, (k_cache, v_cache), sm_scale=0.25), out)


def test_ragged_plus_paged_merged_equals_one_attention_over_both():
    """SGLang's extend with a cached prefix: ragged (new tokens, causal) and paged (prefix,
    no mask) with LSEs, merged by merge_state == one causal attention over prefix + new."""
    gen = torch.Generator().manual_seed(2)
    prefix_lens, new_lens = [4, 0, 9], [3, 5, 1]
    slots = torch.randperm(60, generator=gen)
    k_cache, v_cache = torch.randn(60, HK, D, generator=gen), torch.randn(60, HK, D, generator=gen)
    prefix_slots, new_slots, whole_slots, start = [], [], [], 0
    for p, n in zip(prefix_lens, new_lens):
        prefix_slots.append(slots[start : start + p])
        new_slots.append(slots[start + p : start + p + n])
        whole_slots.append(slots[start : start + p + n])
        start += p + n
    qo_indptr = indptr_of(torch.tensor(new_lens), torch.int32)
    q = torch.randn(sum(new_lens), HQ, D, generator=gen)
    new = torch.cat(new_slots).long()

    ragged = fi.BatchPrefillWithRaggedKVCacheWrapper(WORKSPACE, "NHD", backend="auto")
    ragged.begin_forward(qo_indptr, qo_indptr, HQ, HK, D, q_data_type=torch.float32)
    o1, s1 = ragged.forward_return_lse(q, k_cache[new], v_cache[new], causal=True, sm_scale=0.3)
    paged = fi.BatchPrefillWithPagedKVCacheWrapper(WORKSPACE, "NHD")
    paged.begin_forward(
        qo_indptr,
        indptr_of(torch.tensor(prefix_lens), torch.int32),
        torch.cat(prefix_slots),
        torch.ones(3, dtype=torch.int32),
        HQ,
        HK,
        D,
        1,
    )
    o2, s2 = paged.forward_return_lse(q, (k_cache, v_cache), causal=False, sm_scale=0.3)
    assert torch.isinf(s2[qo_indptr[1] : qo_indptr[2]]).all()  # the request without a prefix: empty state
    merged, s = fi.merge_state(o1, s1, o2, s2)

    whole_indptr = indptr_of(torch.tensor(prefix_lens) + torch.tensor(new_lens))
    expected, lse = paged_prefill_attention(
        q, k_cache, v_cache, qo_indptr, whole_indptr, torch.cat(whole_slots), sm_scale=0.3, causal=True, return_lse=True
    )
    assert (merged - expected).abs().max() <= 1e-5 and (s - lse).abs().max() <= 1e-4


def test_merge_state_of_two_empty_states_is_zero():
    v = torch.randn(2, HQ, D)
    empty = torch.full((2, HQ), float("-inf"))
    merged, s = fi.merge_state(v, empty, v, empty)
    assert torch.equal(merged, torch.zeros_like(v)) and torch.isneginf(s).all()


def test_merge_state_triton_standin_is_natural_log_like_its_kernel():
    """SGLang's Triton fallback of _safe_merge_state takes natural-log LSEs (exp/log), while
    FlashInfer's LSEs, and merge_state, are base 2: fed FlashInfer's LSEs it weighs the two
    parts wrongly. The stand-in reproduces the kernel, mismatch included."""
    gen = torch.Generator().manual_seed(3)
    v_a, v_b = torch.randn(5, HQ, D, generator=gen), torch.randn(5, HQ, D, generator=gen)
    s_a, s_b = torch.randn(5, HQ, generator=gen), torch.randn(5, HQ, generator=gen)
    base2, base2_lse = fi.merge_state(v_a, s_a / LN2, v_b, s_b / LN2)  # the same states, base-2 LSEs
    natural, natural_lse = triton_ops.merge_state_triton(v_a, s_a, v_b, s_b)
    assert torch.allclose(natural, base2, atol=1e-5) and torch.allclose(natural_lse / LN2, base2_lse, atol=1e-5)
    wrong, _ = triton_ops.merge_state_triton(v_a, s_a / LN2, v_b, s_b / LN2)
    assert not torch.allclose(wrong, base2, atol=1e-3)
    plus_inf, _ = triton_ops.merge_state_triton(v_a, torch.full_like(s_a, float("inf")), v_b, s_b)
    assert torch.allclose(plus_inf, v_b)  # +inf counts as an empty state


def test_packbits_have_flashinfer_defaults():
    bits = torch.from_numpy(np.random.default_rng(0).random(21) < 0.5)
    assert fi.packbits(bits).tolist() == np.packbits(bits.numpy(), bitorder="big").tolist()
    indptr = torch.tensor([0, 9, 9, 21])
    packed, packed_indptr = fi.segment_packbits(bits, indptr, bitorder="little")
    assert torch.equal(packed, ours_segment_packbits(bits, indptr, "little")[0]) and packed_indptr.tolist() == [
        0,
        2,
        2,
        4,
    ]


@pytest.mark.parametrize(
    "make, feature",
    [
        (lambda: fi.BatchDecodeWithPagedKVCacheWrapper(WORKSPACE, "NHD", use_cuda_graph=True), "use_cuda_graph"),
        (lambda: fi.BatchPrefillWithPagedKVCacheWrapper(WORKSPACE, "HND"), "kv_layout='HND'"),
        (lambda: _planned_paged(page_size=16), "page size > 1"),
        (lambda: _planned_paged(window_left=128), "sliding-window"),
        (lambda: _planned_paged(logits_soft_cap=30.0), "soft-capped"),
        (lambda: _planned_paged(pos_encoding_mode="ROPE_LLAMA"), "RoPE"),
    ],
)
def test_unsupported_features_are_named(make, feature):
    with pytest.raises(NotImplementedError, match=f"{feature}.*CPU stand-in of FlashInfer"):
        make()


def _planned_paged(page_size=1, **options):
    wrapper = fi.BatchPrefillWithPagedKVCacheWrapper(WORKSPACE, "NHD")
    indptr = torch.tensor([0, 1], dtype=torch.int32)
    wrapper.plan(indptr, indptr, torch.zeros(1, dtype=torch.int32), indptr[1:], HQ, HK, D, page_size, **options)


# ----- torch versions of SGLang's Triton kernels ----------------------------------------


def test_create_flashinfer_kv_indices_gathers_rows():
    table = torch.arange(3 * 10, dtype=torch.int32).view(3, 10) + 100
    out = torch.full((9,), -7, dtype=torch.int32)
    triton_ops.create_flashinfer_kv_indices_triton[(2,)](
        table, torch.tensor([2, 0]), torch.tensor([4, 5]), torch.tensor([0, 4, 9]), torch.tensor([1, 0]), out, 10
    )
    assert out.tolist() == [121, 122, 123, 124, 100, 101, 102, 103, 104]
    mapping = torch.arange(200) * 2
    triton_ops.create_flashinfer_kv_indices_triton[(1, 4)](
        table,
        torch.tensor([1]),
        torch.tensor([3]),
        torch.tensor([0, 3]),
        None,
        out,
        10,
        TOKEN_BLOCK_PARALLEL=True,
        token_mapping=mapping,
    )
    assert out[:3].tolist() == [220, 222, 224]


# ----- SGLang's FlashInferMultiStepDraftBackend, built in this process -------------------


@contextlib.contextmanager
def flashinfer_standin():
    """The stand-in on the import path (and its patch undone, the path restored) for the block."""
    if not sglang_cpu.enable_flashinfer_standin().active:
        pytest.skip("CUDA is available: the real FlashInfer runs there (tests/test_gpu_flashinfer.py)")
    try:
        yield
    finally:
        sglang_cpu.disable_flashinfer_standin()


@pytest.fixture
def multistep(tiny_pair, cpu_runtime):
    """(backend, pool, req_to_token) with SGLang's multi-step draft backend (topk 1, 4 steps) over
    real CPU pools, its runner a namespace with what the backend reads, in a private runtime context."""
    with flashinfer_standin():
        from sglang_cpu import flashinfer_on_cpu

        flashinfer_on_cpu.install()
        from sglang.srt.layers.attention.flashinfer_backend import FlashInferMultiStepDraftBackend
        from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
        from sglang.srt.runtime_context import create_context, use_context
        from sglang.srt.server_args import ServerArgs

        args = ServerArgs(model_path=str(tiny_pair[1]), device="cpu", attention_backend="flashinfer", dtype="float32")
        with use_context(create_context(args, role="test")):
            req_to_token_pool = ReqToTokenPool(size=4, max_context_len=64, device="cpu", enable_memory_saver=False)
            pool = MHATokenToKVPool(
                size=POOL_SLOTS,
                page_size=1,
                dtype=torch.float32,
                head_num=HK,
                head_dim=D,
                layer_num=1,
                device="cpu",
                enable_memory_saver=False,
            )
            allocator = SimpleNamespace(get_kvcache=lambda: pool)
            model_config = SimpleNamespace(
                num_attention_heads=HQ,
                context_len=64,
                head_dim=D,
                is_multimodal=False,
                is_encoder_decoder=False,
                hf_config=SimpleNamespace(architectures=["LlamaForCausalLM"]),
                get_num_kv_heads=lambda tp, dcp=1: HK,
                get_max_num_attention_heads=lambda: HQ,
            )
            runner = SimpleNamespace(
                req_to_token_pool=req_to_token_pool,
                token_to_kv_pool=pool,
                token_to_kv_pool_allocator=allocator,
                kv_index_translator=KVIndexTranslator(
                    req_to_token=req_to_token_pool.req_to_token,
                    token_to_kv_pool_allocator=allocator,
                    token_to_kv_pool=pool,
                    page_size=1,
                    device="cpu",
                    is_draft_worker=True,
                ),
                server_args=args,
                model_config=model_config,
                prefill_attention_backend_str="flashinfer",
                decode_attention_backend_str="flashinfer",
                sliding_window_size=None,
                page_size=1,
                device="cpu",
                dtype=torch.float32,
                kv_cache_dtype=torch.float32,
                is_draft_worker=True,
                spec_algorithm=SimpleNamespace(is_frozen_kv_mtp=lambda: False),
            )
            yield FlashInferMultiStepDraftBackend(runner, topk=1, speculative_num_steps=4), pool, req_to_token_pool


def _draft_batch(backend, rows, seq_lens):
    from sglang.srt.mem_cache.kv_loc_plan import KVLocPlan
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    translator = backend.kv_index_translator
    plan = KVLocPlan(
        source=translator, req_pool_indices=rows, seq_lens=seq_lens, seq_lens_cpu=seq_lens, write_virtual=None
    )
    return SimpleNamespace(
        batch_size=len(rows),
        seq_lens_sum=int(seq_lens.sum()),
        kv_loc_plan=plan,
        req_pool_indices=rows,
        seq_lens=seq_lens,
        seq_lens_cpu=seq_lens,
        positions=seq_lens.clone(),
        forward_mode=ForwardMode.DECODE,
        spec_info=SimpleNamespace(is_draft_input=lambda: True, kv_indptr=None, kv_indices=None),
        encoder_lens=None,
        out_cache_loc=None,
    )


@pytest.mark.parametrize("fast_plan", [False, True])
def test_multistep_draft_backend_reads_the_chain(multistep, fast_plan):
    """Draft step i of a topk=1 chain reads the request's committed slots req_to_token[row, :P]
    and its draft slots req_to_token[row, P : P + i + 1]; its decode attention over them is the
    reference's. fast_plan: the wrappers' begin_forward is SGLang's graph-time
    partial(fast_decode_plan, wrapper), fed SGLang's host indptr."""
    backend, pool, req_to_token_pool = multistep
    from sglang.srt.layers.attention.flashinfer_backend import fast_decode_plan

    gen = torch.Generator().manual_seed(4)
    table = req_to_token_pool.req_to_token
    table.copy_(torch.randperm(POOL_SLOTS, generator=gen)[: table.numel()].view(table.shape).to(table.dtype))
    pool.k_buffer[0].copy_(torch.randn(pool.k_buffer[0].shape, generator=gen))
    pool.v_buffer[0].copy_(torch.randn(pool.v_buffer[0].shape, generator=gen))
    if fast_plan:
        for step in backend.attn_backends:
            wrapper = step.decode_wrappers[0]
            wrapper.begin_forward = functools.partial(fast_decode_plan, wrapper)
    rows, seq_lens = torch.tensor([2, 0, 3]), torch.tensor([5, 3, 9])
    backend.init_forward_metadata(_draft_batch(backend, rows, seq_lens))
    layer = SimpleNamespace(
        layer_id=0, tp_q_head_num=HQ, head_dim=D, scaling=0.25, logit_cap=0.0, k_scale_float=None, v_scale_float=None
    )
    assert len(backend.attn_backends) == 3
    for step, step_backend in enumerate(backend.attn_backends):
        wrapper = step_backend.forward_metadata.decode_wrappers[0]
        expected = [table[r, : p + step + 1].tolist() for r, p in zip(rows.tolist(), seq_lens.tolist())]
        indptr = [0] + np.cumsum([len(e) for e in expected]).tolist()
        assert wrapper._kv_indptr_buf.tolist() == indptr
        assert wrapper._paged_kv_indices_buf[: indptr[-1]].tolist() == sum(expected, [])
        q = torch.randn(3, HQ * D, generator=gen)
        out = step_backend.forward_decode(q, None, None, layer, None, save_kv_cache=False)
        ref = dense_reference(
            q.view(3, HQ, D),
            pool.k_buffer[0],
            pool.v_buffer[0],
            torch.arange(4),
            torch.tensor(indptr),
            torch.tensor(sum(expected, [])),
            [None] * 3,
            0.25,
        )
        assert (out.view(3, HQ, D).double() - ref).abs().max() <= 1e-5


def test_standin_is_opt_in_and_reaches_children(tmp_path):
    """Fresh interpreters: enable() alone leaves flashinfer absent and the plugin without the
    patch; enable_flashinfer_standin() makes it importable here and in child processes and
    the plugin install flashinfer_on_cpu; disable_flashinfer_standin() undoes both."""
    code = textwrap.dedent(
        """
        import importlib, json, os, subprocess, sys
        import sglang_cpu as cpu
        def child():
            probe = "import importlib.util as u; s = u.find_spec('flashinfer'); print(s.origin if s else None)"
            return subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip()
        cpu.enable()
        before = {"active": cpu.flashinfer_standin_active(), "child": child()}
        cpu.enable_flashinfer_standin()
        import flashinfer
        from sglang_cpu import plugin
        lines = plugin.register()
        from sglang.srt.layers.attention import flashinfer_backend as fb
        on = {"active": cpu.flashinfer_standin_active(), "child": child(), "standin": flashinfer.PARSE_STANDIN,
              "patched": any("FlashInfer names bound" in line for line in lines),
              "wrapper": fb.BatchPrefillWithPagedKVCacheWrapper.__module__,
              "skip_check": os.environ.get("SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK")}
        cpu.disable_flashinfer_standin()
        after = {"active": cpu.flashinfer_standin_active(), "child": child(),
                 "bound": hasattr(fb, "BatchPrefillWithPagedKVCacheWrapper"),
                 "skip_check": os.environ.get("SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK")}
        print(json.dumps({"before": before, "on": on, "after": after}))
        """
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SGLANG_USE_CPU_ENGINE")}
    env["PYTHONPATH"] = str(Path(parse_sglang.__file__).resolve().parents[1])  # this checkout
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    standin_dir = sglang_cpu.FLASHINFER_STANDIN_DIR
    assert out["before"] == {"active": False, "child": "None"}
    assert out["on"]["active"] and out["on"]["child"].startswith(standin_dir) and out["on"]["standin"]
    assert out["on"]["patched"] and out["on"]["wrapper"] == "sglang_cpu.flashinfer_ops"
    assert out["on"]["skip_check"] == "1"
    assert out["after"] == {"active": False, "child": "None", "bound": False, "skip_check": None}


# ----- real engines ------------------------------------------------------------------------

MAX_NEW = 32
GREEDY = {"max_new_tokens": MAX_NEW, "temperature": 0.0}
LOSSLESS = probe_config(draft_budget=4, judge=False)
JUDGED = probe_config(draft_budget=6, probe_stride=2, threshold=0.3)


def run_engine(model_path, requests, *, flashinfer: bool, trace_dir=None, **overrides):
    """Start an engine (attention_backend "flashinfer" with the stand-in on, else torch_native),
    run `requests(engine)`, shut it down; returns (its result, the trace events of its processes)."""
    trace = None if trace_dir is None else trace_dir / "trace.txt"
    if trace is not None:
        os.environ[fi.TRACE_ENV] = str(trace)
    standin = flashinfer_standin() if flashinfer else contextlib.nullcontext()
    backend = {"attention_backend": "flashinfer"} if flashinfer else {}
    try:
        with standin, sglang_engine(model_path, **backend, **{"chunked_prefill_size": 64, **overrides}) as engine:
            result = requests(engine)
    finally:
        os.environ.pop(fi.TRACE_ENV, None)
    events = set(trace.read_text().split()) if trace is not None and trace.exists() else set()
    return result, events


@pytest.fixture(scope="module")
def target_greedy(hf_target):
    """prompt -> the target's greedy continuation (MAX_NEW tokens), from transformers."""
    return target_continuations(hf_target, BATCH_PROMPTS, MAX_NEW)


@pytest.fixture(scope="module")
def target_only(tiny_pair, cpu_runtime, tmp_path_factory):
    return run_engine(
        tiny_pair[0],
        lambda e: e.generate(BATCH_PROMPTS, GREEDY),
        flashinfer=True,
        trace_dir=tmp_path_factory.mktemp("fi_target_only"),
    )


@pytest.fixture(scope="module")
def lossless(tiny_pair, cpu_runtime, tmp_path_factory):
    return run_engine(
        tiny_pair[0],
        lambda e: e.generate(BATCH_PROMPTS, GREEDY),
        flashinfer=True,
        trace_dir=tmp_path_factory.mktemp("fi_lossless"),
        **parse_engine_kwargs(tiny_pair[1], LOSSLESS),
    )


def _judged_requests(engine):
    params = {**GREEDY, "custom_params": {"parse": {"return_probe_scores": True}}}
    return engine.generate(BATCH_PROMPTS[:6], params)


@pytest.fixture(scope="module")
def judged(tiny_pair, cpu_runtime, tmp_path_factory):
    """{"flashinfer": outputs, "torch_native": outputs} of judged PARSE (τ = 0.3) and the flashinfer trace."""
    settings = parse_engine_kwargs(tiny_pair[1], JUDGED)
    fi_outs, events = run_engine(
        tiny_pair[0], _judged_requests, flashinfer=True, trace_dir=tmp_path_factory.mktemp("fi_judged"), **settings
    )
    tn_outs, _ = run_engine(tiny_pair[0], _judged_requests, flashinfer=False, **settings)
    return {"flashinfer": fi_outs, "torch_native": tn_outs}, events


@pytest.fixture(scope="module")
def standalone(tiny_pair, cpu_runtime, tmp_path_factory):
    def requests(engine):
        outs = engine.generate(BATCH_PROMPTS, GREEDY)
        return outs, engine.get_server_info()["internal_states"][0]

    return run_engine(
        tiny_pair[0],
        requests,
        flashinfer=True,
        trace_dir=tmp_path_factory.mktemp("fi_standalone"),
        decode_log_interval=1,
        **standalone_kwargs(tiny_pair[1]),
    )


def test_target_only_equals_transformers_greedy(target_only, target_greedy):
    outs, events = target_only
    assert [o["output_ids"] for o in outs] == [target_greedy[p] for p in BATCH_PROMPTS]
    # prefill without and with a cached prefix (the long prompt's second chunk), decode
    assert {"ragged:causal", "ragged:causal+lse", "paged:full+lse", "merge_state", "decode:full"} <= events
    assert "create_flashinfer_kv_indices" in events


def test_parse_lossless_concurrent_equals_transformers_greedy(lossless, target_greedy):
    outs, events = lossless
    assert len(BATCH_PROMPTS) >= 10 and len({len(p) for p in BATCH_PROMPTS}) == len(BATCH_PROMPTS)
    for prompt, out in zip(BATCH_PROMPTS, outs):
        assert out["output_ids"] == target_greedy[prompt], prompt
        assert out["meta_info"]["parse"]["accepted_judged"] == 0
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    assert tokens / sum(o["meta_info"]["spec_verify_ct"] for o in outs) > 1.2
    # TARGET_VERIFY through the paged prefill wrapper with PARSE's FULL mask, draft decode steps
    assert {"paged:custom_mask", "decode:full", "merge_state"} <= events


def test_parse_judged_flashinfer_equals_torch_native(judged):
    """Same tokens, same rounds, the same judge scores within 1e-3."""
    runs, events = judged
    assert "paged:custom_mask" in events
    compared = judged_tokens = 0
    for fi_out, tn_out in zip(runs["flashinfer"], runs["torch_native"]):
        assert fi_out["output_ids"] == tn_out["output_ids"]
        fi_stats, tn_stats = fi_out["meta_info"]["parse"], tn_out["meta_info"]["parse"]
        assert len(fi_stats["probe_scores"]) == len(tn_stats["probe_scores"]) == fi_stats["rounds"]
        for fi_round, tn_round in zip(fi_stats["probe_scores"], tn_stats["probe_scores"]):
            assert (fi_round["draft"], fi_round["accepted"]) == (tn_round["draft"], tn_round["accepted"])
            assert [b for b, _ in fi_round["probes"]] == [b for b, _ in tn_round["probes"]]
            got = torch.tensor([s for _, s in fi_round["probes"]], dtype=torch.float64)
            want = torch.tensor([s for _, s in tn_round["probes"]], dtype=torch.float64)
            assert torch.allclose(got, want, rtol=0, atol=1e-3), (got, want)
            compared += len(got)
        judged_tokens += fi_stats["accepted_judged"]
    assert compared >= 10 and judged_tokens > 0


def test_standalone_draft_machinery_equals_transformers_greedy(standalone, target_greedy):
    """SGLang's STANDALONE (topk 1, 3 steps): FlashInferMultiStepDraftBackend with the torch
    draft KV-index kernel, EAGLE verify through the paged prefill wrapper's custom mask."""
    (outs, state), events = standalone
    assert [o["output_ids"] for o in outs] == [target_greedy[p] for p in BATCH_PROMPTS]
    assert 1.3 < state["avg_spec_accept_length"] <= 4.0  # a wrong draft KV layout would accept ~nothing
    assert {"generate_draft_decode_kv_indices", "paged:custom_mask", "decode:full"} <= events


def test_seeded_sampled_requests_are_reproducible(tiny_pair, cpu_runtime):
    """With deterministic inference (which needs a deterministic attention backend: FlashInfer's,
    its stand-in here; and SGLang's chunked prefill aligned to its 4096-token tile), a sampled
    request with a sampling_seed gives the same output every time it is sent, in another batch
    too, judged PARSE included (seeded draft proposals, verify coins and bonus tokens), and two
    seeds give two outputs."""
    prompt = BATCH_PROMPTS[1]

    def seeded(seed: int) -> dict:
        return {"temperature": 1.0, "max_new_tokens": 16, "ignore_eos": True, "sampling_seed": seed}

    def requests(engine):
        first = engine.generate([prompt, prompt], [seeded(11), seeded(12)])
        again = engine.generate([prompt, "the cat", prompt], [seeded(11), seeded(5), seeded(12)])
        return first, again

    (first, again), _ = run_engine(
        tiny_pair[0],
        requests,
        flashinfer=True,
        enable_deterministic_inference=True,
        chunked_prefill_size=4096,
        **parse_engine_kwargs(tiny_pair[1], JUDGED),
    )
    assert first[0]["output_ids"] == again[0]["output_ids"] and first[1]["output_ids"] == again[2]["output_ids"]
    assert first[0]["output_ids"] != first[1]["output_ids"]
    assert (
        sum(out["meta_info"]["parse"]["accepted_exact"] + out["meta_info"]["parse"]["accepted_judged"] for out in first)
        > 0
    )
