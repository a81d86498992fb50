"""SGLang tier, HTTP: `python -m sglang_cpu.launch_server` serving STANDALONE on CPU.

The server is started from a clean environment (no CPU runtime inherited from this test
process), so the launcher itself must enable it. SGLang's per-iteration memory check is
turned to verbose (`SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY=2`: log every iteration and
assert on a leak) on top of its strict idle check (default on: raises on a leak), so a leak
kills the server, and the logged pool balance can be read back.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from http_server import assert_memory_balanced, assert_shutdown_leaves_no_process, launched_server

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def server(tiny_pair, tmp_path_factory, target_only_outputs, standalone_settings):
    # target_only_outputs first: an in-process Engine's shutdown kills every child process
    # of this test process (SGLang's kill_process_tree), this server included.
    env = {"SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY": "2"}
    with launched_server(tiny_pair[0], tmp_path_factory.mktemp("server"), env=env, **standalone_settings) as srv:
        yield srv


def test_launcher_enabled_the_cpu_runtime_and_loaded_the_plugin(server):
    log = server.log()
    assert "sglang_cpu: enabled (no CUDA device): SGLANG_USE_CPU_ENGINE=1" in log
    # Two distributions, two entry points: the CPU runtime's patches, and the plug-in's.
    assert 'sglang_cpu plugin installed: attention backend "torch_native" -> TorchNativeSpecAttnBackend' in log
    assert "parse-sglang plugin installed: speculative algorithm PARSE" in log


def test_generate_matches_target_only(server, target_only_outputs):
    prompt, want = target_only_outputs.prompts[1], target_only_outputs.output_ids[1]
    out = server.post("/generate", {"text": prompt, "sampling_params": target_only_outputs.sampling_params})
    assert out["output_ids"] == want
    assert out["meta_info"]["spec_verify_ct"] > 0


def test_v1_completions_matches_generate(server, target_only_outputs):
    prompt, params = target_only_outputs.prompts[0], target_only_outputs.sampling_params
    generate = server.post("/generate", {"text": prompt, "sampling_params": params})
    completion = server.post(
        "/v1/completions",
        {"model": "default", "prompt": prompt, "max_tokens": params["max_new_tokens"], "temperature": 0.0},
    )
    assert completion["object"] == "text_completion"
    assert completion["choices"][0]["text"] == generate["text"]
    assert completion["usage"]["completion_tokens"] == len(generate["output_ids"])


def test_memory_check_clean_after_many_requests(server):
    prompts = [f"{w} then {w} then {i}" for i, w in enumerate(["red", "green", "water", "fire"] * 10)]
    params = {"max_new_tokens": 16, "temperature": 0}
    with ThreadPoolExecutor(max_workers=8) as pool:
        outs = list(pool.map(lambda p: server.post("/generate", {"text": p, "sampling_params": params}), prompts))
    assert all(len(o["output_ids"]) >= 1 for o in outs)
    time.sleep(2.0)  # idle: the strict idle self-check runs every scheduler loop
    assert server.proc.poll() is None
    assert requests.get(server.url + "/health", timeout=10).status_code == 200
    assert_memory_balanced(server.log(), min_checks=32)  # the busy check ran on every iteration


def test_shutdown_leaves_no_process(server):
    assert_shutdown_leaves_no_process(server, timeout=60)
