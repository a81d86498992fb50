"""SGLang tier, prefill/decode disaggregation: PARSE on both servers of a PD pair.

A PARSE prefill server (core 0) and a PARSE decode server (core 1) of the tiny pair, the KV moved
by mooncake's transfer engine over TCP (`mooncake-transfer-engine-non-cuda`, `MC_FORCE_TCP=1`),
sglang-router in PD mode in front, SGLang's strict idle memory check on both (a leak kills the
server; the disaggregated event loops run no busy check), a fixed draft length so that every round
drafts, the judge off:
- greedy requests through the router equal the target's greedy continuations, and keep as many
  drafts per round as a PARSE server without PD on the same prompts (within 5%): the draft's
  prompt KV crossed with the target's;
- a decode server with SGLang's `fake` transfer backend (no prefill server, no real KV: a
  synthetic first token) runs PARSE rounds, as SGLang's synthetic decode benchmarks run it;
- a target-only prefill server is refused by the PARSE decode server (`scheduler_patches.pd_peer`):
  the request gets an error naming both drafts, the prefill side's request ends by SGLang's
  bootstrap timeout, and the decode server goes on serving;
- the prefill server killed mid-load: every request ends, answered exactly or with an error; the
  decode server stays up, serves, and its memory check stays clean.
The mooncake tests are skipped where mooncake's engine cannot load (scripts/setup.sh installs it and
libibverbs); the fake-backend test needs neither.
"""

from __future__ import annotations

import contextlib
import random
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest
import requests
from conftest import hf_greedy, probe_config
from http_server import STRICT_MEM_CHECKS, greedy, launched_router, launched_server
from sglang_cpu import CPU_BIND_ENV
from parse_sglang.settings import parse_engine_kwargs
from support.servers import free_port

pytestmark = pytest.mark.sglang

TIMEOUT = 300  # seconds for one HTTP call: lenient, 2 cores serve both servers
CONFIG = probe_config(draft_budget=4, judge=False)  # a fixed L: every round drafts
FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # sglang.srt.disaggregation.utils: SGLang's synthetic transfer
MOONCAKE = {"disaggregation_transfer_backend": "mooncake"}
# SGLang's default decode retraction backup ("host_pool") pins host memory with CUDA.
DECODE = {"disaggregation_mode": "decode", "disaggregation_decode_retraction_backup": "cpu_tensor"}
ENV = {**STRICT_MEM_CHECKS, "MC_FORCE_TCP": "1", "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "20"}
PROMPTS = [f"{a} {b} and the" for a in "one two three cat dog sun".split() for b in "red moon add sum".split()]


@contextlib.contextmanager
def server(tiny_pair, log_dir, core: int, parse: bool = True, **flags):
    """A tiny-pair server on `core` (PARSE at CONFIG, or the target alone)."""
    target, draft = tiny_pair
    spec = parse_engine_kwargs(draft, CONFIG) if parse else {}
    env = {**ENV, CPU_BIND_ENV: str(core)}
    with launched_server(target, log_dir, env=env, timeout=600.0, **spec, **flags) as started:
        yield started


@contextlib.contextmanager
def together(*managers):
    """Enter the context managers side by side (servers starting at once, one per core)."""
    with contextlib.ExitStack() as stack, ThreadPoolExecutor(len(managers)) as pool:
        futures = [pool.submit(m.__enter__) for m in managers]
        results, errors = [], []
        for manager, future in zip(managers, futures):
            try:
                results.append(future.result())
                stack.push(manager.__exit__)
            except Exception as err:  # the others are still cleaned up
                errors.append(err)
        if errors:
            raise errors[0]
        yield results


@pytest.fixture(scope="module")
def pd_pair(tiny_pair, tmp_path_factory):
    """(prefill server, its bootstrap port, decode server): PARSE on both, mooncake over TCP."""
    pytest.importorskip(
        "mooncake.engine", reason="mooncake-transfer-engine-non-cuda and libibverbs1 (scripts/setup.sh)"
    )
    pytest.importorskip("sglang_router")
    port = free_port()
    prefill = server(
        tiny_pair,
        tmp_path_factory.mktemp("prefill"),
        0,
        disaggregation_mode="prefill",
        disaggregation_bootstrap_port=port,
        **MOONCAKE,
    )
    decode = server(tiny_pair, tmp_path_factory.mktemp("decode"), 1, **DECODE, **MOONCAKE)
    with together(prefill, decode) as (p, d):
        yield p, port, d


@pytest.fixture(scope="module")
def router(pd_pair, tmp_path_factory):
    """sglang-router in PD mode in front of the pair."""
    prefill, port, decode = pd_pair
    arguments = ["--pd-disaggregation", "--prefill", prefill.url, str(port), "--decode", decode.url]
    with launched_router(arguments, {"health_check_interval_secs": 1}, tmp_path_factory.mktemp("router")) as url:
        yield url


def generate(url: str, body: dict) -> requests.Response:
    return requests.post(url + "/generate", json=body, timeout=TIMEOUT)


def served(url: str, prompts: list[str], max_new: int = 30) -> list[dict]:
    """The prompts sent at once; each reply's JSON (asserted 200)."""
    with ThreadPoolExecutor(len(prompts)) as pool:
        replies = list(pool.map(lambda p: generate(url, {"text": p, "sampling_params": greedy(max_new)}), prompts))
    for reply in replies:
        assert reply.status_code == 200, reply.text
    return [reply.json() for reply in replies]


def kept_per_round(outs: list[dict]) -> float:
    stats = [out["meta_info"]["parse"] for out in outs]
    return sum(s["accepted_exact"] for s in stats) / sum(s["rounds"] for s in stats)


def assert_clean(started) -> None:
    """Up, and no leak reported (the strict idle check would have killed it)."""
    log = started.log()
    assert started.proc.poll() is None and "leak" not in log.lower() and "Traceback" not in log


def test_pd_greedy_equals_target_greedy_at_the_acceptance_of_one_server(router, tiny_pair, hf_target, tmp_path_factory):
    tokenizer, model = hf_target
    outs = served(router, PROMPTS)
    for prompt, out in zip(PROMPTS, outs):
        assert out["output_ids"] == hf_greedy(model, tokenizer(prompt).input_ids, 30, ignore_eos=True), prompt
        assert out["meta_info"]["parse"]["draft_tokens"] > 0
    with server(tiny_pair, tmp_path_factory.mktemp("alone"), 0) as alone:  # the same pair without PD
        alone_outs = served(alone.url, PROMPTS)
    assert [o["output_ids"] for o in alone_outs] == [o["output_ids"] for o in outs]
    pd, one = kept_per_round(outs), kept_per_round(alone_outs)
    assert abs(pd - one) <= 0.05 * one, (pd, one)


def test_a_fake_transfer_decode_server_runs_parse_rounds(tiny_pair, tmp_path_factory):
    flags = {**DECODE, "disaggregation_transfer_backend": "fake"}
    with server(tiny_pair, tmp_path_factory.mktemp("fake"), 1, **flags) as decode:
        bodies = [
            {"text": p, "sampling_params": greedy(24), "bootstrap_host": FAKE_BOOTSTRAP_HOST} for p in PROMPTS[:8]
        ]
        with ThreadPoolExecutor(len(bodies)) as pool:
            replies = list(pool.map(lambda body: generate(decode.url, body), bodies))
        for reply in replies:
            assert reply.status_code == 200, reply.text
            stats = reply.json()["meta_info"]["parse"]
            assert len(reply.json()["output_ids"]) == 24 and stats["rounds"] > 0 and stats["draft_tokens"] > 0
        time.sleep(2.0)  # idle: SGLang's strict memory check runs
        assert_clean(decode)


def test_a_prefill_server_without_parse_is_refused(pd_pair, router, tiny_pair, hf_target, tmp_path_factory):
    """The request is sent by hand to both servers, as the router would (one bootstrap room)."""
    _, _, decode = pd_pair
    port = free_port()
    plain = server(
        tiny_pair,
        tmp_path_factory.mktemp("plain"),
        0,
        parse=False,
        disaggregation_mode="prefill",
        disaggregation_bootstrap_port=port,
        **MOONCAKE,
    )
    with plain as prefill:
        body = {
            "text": "one two three",
            "sampling_params": greedy(8),
            "bootstrap_host": "127.0.0.1",
            "bootstrap_port": port,
            "bootstrap_room": random.getrandbits(62),
        }
        prefill_reply = {}
        sender = threading.Thread(target=lambda: prefill_reply.update(reply=generate(prefill.url, body)))
        sender.start()
        reply = generate(decode.url, body)
        sender.join(timeout=120)  # SGLang's bootstrap timeout (20 s here) ends it
        assert not sender.is_alive() and prefill_reply["reply"].status_code != 200
    assert reply.status_code == 500
    message = reply.json()["message"]
    assert "same draft" in message and "--speculative-algorithm None" in message, message
    tokenizer, model = hf_target
    out = served(router, ["the moon after the refusal"], max_new=12)[0]
    assert out["output_ids"] == hf_greedy(model, tokenizer("the moon after the refusal").input_ids, 12, ignore_eos=True)
    assert_clean(decode)


def test_the_prefill_server_killed_mid_load(pd_pair, router, hf_target):
    """Runs last: it kills the module's prefill server."""
    tokenizer, model = hf_target
    prefill, _, decode = pd_pair

    def send(prompt: str):
        try:
            return prompt, generate(router, {"text": prompt, "sampling_params": greedy(96)})
        except requests.RequestException as err:
            return prompt, err

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        futures = [pool.submit(send, p) for p in PROMPTS]
        time.sleep(0.3)  # requests in prefill, in transfer and decoding
        for proc in [*psutil.Process(prefill.proc.pid).children(recursive=True), psutil.Process(prefill.proc.pid)]:
            proc.send_signal(signal.SIGKILL)
        results = [f.result(timeout=TIMEOUT + 30) for f in futures]
    answered = [(prompt, reply) for prompt, reply in results if isinstance(reply, requests.Response) and reply.ok]
    for prompt, reply in answered:
        assert reply.json()["output_ids"] == hf_greedy(model, tokenizer(prompt).input_ids, 96, ignore_eos=True)
    print(f"prefill killed: {len(answered)} of {len(results)} requests answered")
    body = {
        "text": "still serving",
        "sampling_params": greedy(8),
        "bootstrap_host": FAKE_BOOTSTRAP_HOST,
        "bootstrap_room": random.getrandbits(62),
    }
    after = generate(decode.url, body)  # SGLang's synthetic transfer: no prefill server needed
    assert after.status_code == 200 and after.json()["meta_info"]["parse"]["rounds"] > 0, after.text
    time.sleep(2.0)
    assert_clean(decode)
