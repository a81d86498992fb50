"""SGLang tier, sglang-router: two PARSE servers behind `python -m sglang_router.launch_router`.

Two real PARSE servers (`sglang_cpu.launch_server`, the tiny pair, adaptive draft lengths, the
judge off server-wide, SGLang's strict memory checks), each pinned to its own core, and the router
in front of them with its cache-aware policy, all on 127.0.0.1:
- greedy requests through the router equal the target's own greedy continuations, and carry
  PARSE's counters; both workers serve;
- sglang-router 0.3.2 drops `sampling_params.custom_params` (its request types do not have the
  field): per-request PARSE settings do not reach a worker through it, and a bad one is not
  refused. The test pins that down, so that a router that passes them through shows up here;
- one worker killed mid-load: every request sent before the kill ends, answered exactly or with
  an error, none hangs; the router then serves every request from the other worker, exactly.
The router is an optional dependency (`pip install parse-sglang[router]`; `scripts/setup.sh`
installs it): without it the module is skipped.
"""

from __future__ import annotations

import contextlib
import random
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest
import requests
from conftest import hf_greedy, probe_config
from http_server import STRICT_MEM_CHECKS, assert_memory_balanced, greedy, launched_router, launched_server
from sglang_cpu import CPU_BIND_ENV
from parse_sglang.settings import parse_engine_kwargs

pytest.importorskip("sglang_router")
pytestmark = pytest.mark.sglang

TIMEOUT = 300  # seconds for one HTTP call: lenient, 2 cores serve both workers
CONFIG = probe_config(draft_budget=4, judge=False, adaptive=True)  # lossless: per-request settings cannot pass
WORDS = "the a model draft token answer step one two three add sum so then cat dog sun moon red".split()


@pytest.fixture(scope="module")
def workers(tiny_pair, tmp_path_factory):
    """Two PARSE servers, one on core 0 and one on core 1."""
    target, draft = tiny_pair
    with contextlib.ExitStack() as stack:
        yield [
            stack.enter_context(
                launched_server(
                    target,
                    tmp_path_factory.mktemp(f"worker{core}"),
                    timeout=600.0,
                    env={**STRICT_MEM_CHECKS, CPU_BIND_ENV: str(core)},
                    **parse_engine_kwargs(draft, CONFIG),
                )
            )
            for core in (0, 1)
        ]


@pytest.fixture(scope="module")
def router(workers, tmp_path_factory):
    """The router's URL, in front of both workers (cache-aware policy, health checks every second)."""
    flags = {"policy": "cache_aware", "health_check_interval_secs": 1, "health_failure_threshold": 1}
    with launched_router(["--worker-urls", *(w.url for w in workers)], flags, tmp_path_factory.mktemp("router")) as url:
        yield url


def generate(url: str, body: dict) -> requests.Response:
    return requests.post(url + "/generate", json=body, timeout=TIMEOUT)


def served(workers) -> list[int]:
    """Requests each worker has run PARSE rounds for."""
    return [
        requests.get(w.url + "/get_server_info", timeout=TIMEOUT).json()["internal_states"][0]["parse"]["requests"]
        for w in workers
    ]


def test_greedy_through_the_router_equals_target_greedy(router, workers, hf_target):
    tokenizer, model = hf_target
    rng = random.Random(2)
    prompts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 16))) for _ in range(24)]
    before = served(workers)

    def send(prompt: str) -> requests.Response:
        return generate(router, {"text": prompt, "sampling_params": greedy(10)})

    with ThreadPoolExecutor(max_workers=24) as pool:
        replies = list(pool.map(send, prompts))
    for prompt, reply in zip(prompts, replies):
        assert reply.status_code == 200, reply.text
        out = reply.json()
        assert out["output_ids"] == hf_greedy(model, tokenizer(prompt).input_ids, 10, ignore_eos=True), (prompt, out)
        assert out["meta_info"]["parse"]["rounds"] > 0
    after = served(workers)
    assert sum(after) - sum(before) == len(prompts) and all(a > b for a, b in zip(after, before)), (before, after)


def test_the_router_drops_per_request_settings(router, workers):
    """Probe scores asked for come back from a worker, not through the router; a bad setting is
    the worker's HTTP 400, and the router's 200 (it never reaches the worker)."""
    asked = {"text": "one two", "sampling_params": greedy(8, custom_params={"parse": {"return_probe_scores": True}})}
    direct = generate(workers[0].url, asked)
    assert direct.status_code == 200 and "probe_scores" in direct.json()["meta_info"]["parse"], direct.text
    routed = generate(router, asked)
    assert routed.status_code == 200 and "probe_scores" not in routed.json()["meta_info"]["parse"], routed.text
    bad = {"text": "one two", "sampling_params": greedy(8, custom_params={"parse": {"threshold": 2}})}
    assert generate(workers[0].url, bad).status_code == 400
    assert generate(router, bad).status_code == 200


def test_memory_balanced_on_both_workers(workers):
    """Each worker's last busy memory check balances. A worker logs the check of the iteration
    that frees a request's KV a moment after the response has gone out, so this waits up to 10 s
    for that line."""
    for worker in workers:
        deadline = time.monotonic() + 10.0
        while True:
            assert worker.proc.poll() is None and "Traceback" not in worker.log()
            try:
                assert_memory_balanced(worker.log(), min_checks=5)
                break
            except AssertionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)


def test_a_worker_killed_mid_load_leaves_the_router_serving(router, workers, hf_target):
    """24 requests in flight, then worker 1's process tree is killed: every request ends within
    the timeout (exact, or an error status), and the router then serves 8 more requests, all
    exactly, from worker 0."""
    tokenizer, model = hf_target
    prompts = [f"{a} {b} and the" for a in WORDS[:6] for b in WORDS[6:10]]

    def send(prompt: str):
        try:
            return prompt, generate(router, {"text": prompt, "sampling_params": greedy(40)})
        except requests.RequestException as err:
            return prompt, err

    victim = workers[1]
    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        futures = [pool.submit(send, p) for p in prompts]
        time.sleep(1.0)  # the requests are spread over both workers and running
        for proc in [*psutil.Process(victim.proc.pid).children(recursive=True), psutil.Process(victim.proc.pid)]:
            proc.send_signal(signal.SIGKILL)
        results = [f.result(timeout=TIMEOUT + 30) for f in futures]
    answered = 0
    for prompt, reply in results:
        if isinstance(reply, requests.Response) and reply.status_code == 200:
            answered += 1
            assert reply.json()["output_ids"] == hf_greedy(model, tokenizer(prompt).input_ids, 40, ignore_eos=True)
    assert answered >= 1  # the surviving worker's share at least

    time.sleep(3.0)  # the router's health check marks the dead worker
    before = served(workers[:1])[0]
    after_prompts = [f"{w} after the fault" for w in WORDS[:8]]
    with ThreadPoolExecutor(max_workers=8) as pool:
        replies = list(pool.map(lambda p: generate(router, {"text": p, "sampling_params": greedy(8)}), after_prompts))
    for prompt, reply in zip(after_prompts, replies):
        assert reply.status_code == 200, reply.text
        assert reply.json()["output_ids"] == hf_greedy(model, tokenizer(prompt).input_ids, 8, ignore_eos=True)
    assert served(workers[:1])[0] - before == len(after_prompts)
