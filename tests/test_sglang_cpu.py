"""SGLang tier, target only: stock SGLang 0.5.23 serving on CPU through the CPU runtime, and
the plugin that SGLang loads through its entry point."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest
import torch

pytestmark = pytest.mark.sglang


def test_target_only_engine_matches_transformers_greedy(tiny_pair, target_only_outputs):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_pair[0])
    model = AutoModelForCausalLM.from_pretrained(tiny_pair[0], dtype=torch.float32).eval()
    max_new = target_only_outputs.sampling_params["max_new_tokens"]
    for prompt, sglang_ids in zip(target_only_outputs.prompts, target_only_outputs.output_ids):
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=max_new, do_sample=False)
        assert sglang_ids == out[0, ids.shape[1] :].tolist(), prompt
    assert len(target_only_outputs.prompts) >= 3
    assert sum(map(len, target_only_outputs.output_ids)) > 2 * max_new  # real continuations, not instant EOS


def test_plugin_entry_points_are_registered():
    """The plug-in and the CPU runtime are two distributions, each with its entry point."""
    values = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    assert values["parse"] == "parse_sglang.plugin:register"
    assert values["sglang_cpu"] == "sglang_cpu.plugin:register"


def test_register_installs_once_and_reports(cpu_runtime):
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
    from sglang.srt.speculative.draft_utils import DraftBackendFactory

    from parse_sglang.plugin import register
    from sglang_cpu.plugin import register as register_cpu
    from sglang_cpu.torch_native_verify import create_torch_native_spec_backend

    first = register()
    assert register() is first
    assert not any("TorchNative" in line for line in first)  # the plug-in installs no CPU patch
    cpu_lines = register_cpu()
    assert register_cpu() is cpu_lines
    assert any("TorchNativeSpecAttnBackend" in line for line in cpu_lines)
    assert any("DraftBackendFactory._create_backend" in line for line in cpu_lines)
    assert ATTENTION_BACKENDS["torch_native"] is create_torch_native_spec_backend
    # HookRegistry wraps the method exactly once (AROUND hook around the original).
    wrapped = DraftBackendFactory._create_backend
    assert not hasattr(wrapped.__wrapped__, "__wrapped__")
    assert wrapped.__wrapped__.__qualname__ == "DraftBackendFactory._create_backend"


def test_signature_mismatch_names_function_expected_and_found(cpu_runtime):
    from parse_sglang.plugin import SGLangSignatureMismatch, check_signatures

    target = "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend.forward_extend"
    with pytest.raises(SGLangSignatureMismatch) as err:
        check_signatures({target: "(self, q, k, v)"})
    message = str(err.value)
    assert target in message
    assert "expected signature (self, q, k, v)" in message
    found = "(self, q, k, v, layer: 'RadixAttention', forward_batch: 'ForwardBatch', save_kv_cache=True)"
    assert f"found {found}" in message
