"""SGLang tier, HTTP, PARSE: what a user of `--speculative-algorithm PARSE` does to a server.

One real server (`python -m sglang_cpu.launch_server`, 127.0.0.1) serves the tiny fp32
pair with PARSE, judge off, L = 4: the lossless mode, so every greedy output must equal the
target's own greedy continuation (computed here with transformers, one prompt at a time).
SGLang's memory checks are strict: every busy iteration logs and asserts the KV pool balance
(`SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY=2`), and the idle check raises on a leak
(`..._DURING_IDLE=1`), which kills the server. The tests share the server and its radix
cache and run in file order; the last two read the pool balance after everything before
them, then shut the server down.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from conftest import hf_greedy, probe_config
from http_server import (
    MEM_LINE,
    Server,
    assert_memory_balanced,
    assert_shutdown_leaves_no_process,
    greedy,
    parse_server,
)

pytestmark = pytest.mark.sglang

DRAFT_STEPS = 4  # L; a round emits at most L + 1 tokens
TIMEOUT = 300  # seconds for one HTTP call: lenient, other test runs share these 2 cores
MAX_RUNNING = 32  # of the 64 concurrent requests, half wait and join the running batch later
LONG_RUN = 1000  # max_new_tokens of a request that is aborted long before it could finish


def target_greedy(hf_target, prompt_ids: list[int], max_new: int) -> list[int]:
    """The target's greedy continuation with EOS ignored (the requests here set `ignore_eos`)."""
    return hf_greedy(hf_target[1], prompt_ids, max_new, ignore_eos=True)


@pytest.fixture(scope="module")
def server(tiny_pair, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("parse_server")
    with parse_server(
        tiny_pair, log_dir, probe_config(draft_budget=DRAFT_STEPS, judge=False), max_running_requests=MAX_RUNNING
    ) as srv:
        yield srv


class Stream:
    """A streaming /generate request read on its own thread; `chunks` holds its decoded events."""

    def __init__(self, server: Server, payload: dict):
        self.chunks: list[dict] = []
        self.started = threading.Event()  # set at the first chunk: the request is running
        body = {**payload, "stream": True}
        self.response = requests.post(server.url + "/generate", json=body, stream=True, timeout=TIMEOUT)
        assert self.response.status_code == 200, self.response.text[:2000]
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        try:
            for line in self.response.iter_lines():
                if line.startswith(b"data: ") and line != b"data: [DONE]":
                    self.chunks.append(json.loads(line[len(b"data: ") :]))
                    self.started.set()
        finally:
            self.started.set()

    def wait_running(self):
        assert self.started.wait(TIMEOUT) and self.chunks, "no chunk arrived"

    def final(self) -> dict:
        self.thread.join(TIMEOUT)
        assert not self.thread.is_alive(), "stream did not end"
        return self.chunks[-1]


def test_radix_cache_holds_parse_committed_tokens(server, hf_target):
    """B = A's prompt + A's output + more: the radix tree must hold A's prompt and every
    output token of A that has KV (all but the last), committed there by PARSE rounds; the
    cached target KV must be right (B equals the target's greedy) and so must the cached
    draft KV (B's rounds after a cache flush, computed without the cache, are the same)."""
    tokenizer, _ = hf_target
    prompt = tokenizer("First the river and the moon, then the city light. " * 8).input_ids
    assert len(prompt) >= 64
    a = server.post("/generate", {"input_ids": prompt, "sampling_params": greedy(48)})
    a_out = a["output_ids"]
    assert len(a_out) == 48
    rounds = a["meta_info"]["parse"]["rounds"]
    assert 0 < rounds < 47 and a["meta_info"]["parse"]["accepted_exact"] > 0  # multi-token rounds

    b_input = prompt + a_out + tokenizer(" So the total value is").input_ids
    b = server.post("/generate", {"input_ids": b_input, "sampling_params": greedy(16)})
    assert b["meta_info"]["cached_tokens"] == len(prompt) + len(a_out) - 1
    assert b["output_ids"] == target_greedy(hf_target, b_input, 16)

    assert requests.post(server.url + "/flush_cache", timeout=TIMEOUT).status_code == 200
    fresh = server.post("/generate", {"input_ids": b_input, "sampling_params": greedy(16)})
    assert fresh["meta_info"]["cached_tokens"] == 0
    assert fresh["output_ids"] == b["output_ids"]
    assert fresh["meta_info"]["parse"] == b["meta_info"]["parse"]


def test_abort_request_stops_only_that_request(server, hf_target):
    """/abort_request on a running request while three others run: it ends with an abort
    finish reason (its tokens so far still the target's), the others finish exactly."""
    tokenizer, _ = hf_target
    rid = f"parse-abort-{uuid.uuid4().hex}"
    long_prompt = "The sun and the moon and the"
    aborted = Stream(server, {"text": long_prompt, "rid": rid, "sampling_params": greedy(LONG_RUN)})
    aborted.wait_running()
    others = {p: Stream(server, {"text": p, "sampling_params": greedy(24)}) for p in ("one two", "def f(x):", "Yes no")}
    for stream in others.values():
        stream.wait_running()
    reply = requests.post(server.url + "/abort_request", json={"rid": rid}, timeout=TIMEOUT)
    assert reply.status_code == 200, reply.text

    last = aborted.final()
    assert last["meta_info"]["finish_reason"]["type"] == "abort"
    out = last["output_ids"]
    assert 0 < len(out) < LONG_RUN
    assert out == target_greedy(hf_target, tokenizer(long_prompt).input_ids, len(out))
    for prompt, stream in others.items():
        final = stream.final()
        assert final["meta_info"]["finish_reason"]["type"] == "length", prompt
        assert final["output_ids"] == target_greedy(hf_target, tokenizer(prompt).input_ids, 24), prompt
    assert requests.get(server.url + "/health", timeout=TIMEOUT).status_code == 200


def test_closing_a_stream_aborts_its_request(server):
    """A client that drops its streaming connection: SGLang aborts the request. Proof by
    count: the server is idle again after fewer scheduler iterations than the request
    needed to finish (each logs one memory-check line; a round emits at most L + 1 tokens)."""
    log_offset = len(server.log())
    stream = requests.post(
        server.url + "/generate",
        json={"text": "The cat and the dog", "stream": True, "sampling_params": greedy(LONG_RUN)},
        stream=True,
        timeout=TIMEOUT,
    )
    data_lines = (line for line in stream.iter_lines() if line.startswith(b"data: "))
    for _ in range(3):
        next(data_lines)
    stream.close()

    deadline = time.monotonic() + TIMEOUT
    while requests.post(server.url + "/flush_cache", timeout=TIMEOUT).status_code != 200:  # 400 while running
        assert time.monotonic() < deadline, "the request still runs after its client left"
        time.sleep(0.5)
    iterations = len(MEM_LINE.findall(server.log()[log_offset:]))
    assert 0 < iterations < LONG_RUN / (DRAFT_STEPS + 1)
    assert requests.get(server.url + "/health", timeout=TIMEOUT).status_code == 200


def test_64_concurrent_requests_equal_target_greedy(server, hf_target):
    """64 requests at once (32 run, the rest queue and join mid-flight; some share
    prefixes; 4 to 12 new tokens, so they finish at different rounds)."""
    tokenizer, _ = hf_target
    rng = random.Random(0)
    words = "the a model draft token answer step one two three add sum so then cat dog sun moon red".split()
    shared = "Step one: add the numbers. "
    prompts = [
        (shared if i % 4 == 0 else "") + " ".join(rng.choice(words) for _ in range(rng.randint(2, 20)))
        for i in range(64)
    ]
    max_new = [4 + i % 9 for i in range(64)]

    def send(i: int) -> dict:
        return server.post("/generate", {"text": prompts[i], "sampling_params": greedy(max_new[i])})

    with ThreadPoolExecutor(max_workers=64) as pool:
        outs = list(pool.map(send, range(64)))
    tokens = rounds = 0
    for prompt, n, out in zip(prompts, max_new, outs):
        meta, stats = out["meta_info"], out["meta_info"]["parse"]
        assert out["output_ids"] == target_greedy(hf_target, tokenizer(prompt).input_ids, n), prompt
        assert meta["completion_tokens"] == n and meta["finish_reason"]["type"] == "length"
        assert 0 < stats["rounds"] == meta["spec_verify_ct"]
        assert stats["accepted_judged"] == 0
        tokens, rounds = tokens + n - 1, rounds + stats["rounds"]  # the first token is the prefill's
    assert tokens / rounds > 1.2  # drafts were accepted: more than one token per round


def test_malformed_custom_params_fail_only_that_request(server, hf_target):
    """A bad `custom_params["parse"]` is HTTP 400 naming the setting; a good request sent
    alongside it is served exactly."""
    tokenizer, _ = hf_target
    bad = [({"threshold": 2}, "threshold=2 is invalid"), ({"nope": 1}, "['nope']"), ("x", "='x' is not valid JSON")]

    def send(custom) -> requests.Response:
        params = greedy(24, custom_params={"parse": custom}) if custom is not None else greedy(24)
        body = {"text": "one two", "sampling_params": params}
        return requests.post(server.url + "/generate", json=body, timeout=TIMEOUT)

    with ThreadPoolExecutor(max_workers=4) as pool:
        good = pool.submit(send, None)
        replies = list(pool.map(send, [custom for custom, _ in bad]))
        good = good.result()
    for (custom, named), reply in zip(bad, replies):
        assert reply.status_code == 400, (custom, reply.text)
        message = reply.json()["error"]["message"]
        assert 'custom_params["parse"]' in message and named in message, message
    assert good.status_code == 200, good.text
    assert good.json()["output_ids"] == target_greedy(hf_target, tokenizer("one two").input_ids, 24)


def test_v1_completions_with_parse(server, hf_target):
    """OpenAI /v1/completions: same text as /generate (whose ids are the target's greedy),
    with or without a per-request L; a bad per-request setting is a 400 there too."""
    tokenizer, _ = hf_target
    prompt = "Finally, the result value equals"
    generated = server.post("/generate", {"text": prompt, "sampling_params": greedy(12)})
    assert generated["output_ids"] == target_greedy(hf_target, tokenizer(prompt).input_ids, 12)

    def complete(**extra) -> requests.Response:
        body = {"model": "default", "prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True, **extra}
        return requests.post(server.url + "/v1/completions", json=body, timeout=TIMEOUT)

    for extra in ({}, {"custom_params": {"parse": {"draft_budget": 2}}}):
        reply = complete(**extra)
        assert reply.status_code == 200, reply.text
        completion = reply.json()
        assert completion["object"] == "text_completion"
        assert completion["choices"][0]["text"] == generated["text"], extra
        assert completion["choices"][0]["finish_reason"] == "length"
        assert completion["usage"]["completion_tokens"] == 12
    reply = complete(custom_params={"parse": {"threshold": 2}})
    assert reply.status_code == 400 and "threshold=2 is invalid" in reply.json()["message"], reply.text


def test_memory_check_clean_after_everything(server):
    time.sleep(2.0)  # idle: the strict idle check runs every idle scheduler loop
    assert server.proc.poll() is None, server.log()[-4000:]
    assert requests.get(server.url + "/health", timeout=TIMEOUT).status_code == 200
    log = server.log()
    assert "Traceback" not in log
    assert_memory_balanced(log, min_checks=50)  # the busy check ran on each of the tests' ~100 iterations


def test_shutdown_leaves_no_process(server):
    assert_shutdown_leaves_no_process(server, timeout=TIMEOUT)
