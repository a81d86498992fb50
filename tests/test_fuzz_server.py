"""SGLang tier, HTTP, fuzzing: no request can kill a PARSE server or change another's output.

Two real PARSE servers in turn (`http_server.parse_server`, 127.0.0.1; tiny fp32 pair, L = 4)
with SGLang's strict memory checks, as in test_sglang_parse_server.py: one with the judge off
(lossless), one with the probe judge on (probe rows in its verify window), whose valid requests
also turn the judge off, or switch it to the likelihood judge, and change τ, λ, Δ and L per
request (`judged` cases: served in full, counters present; outputs not compared).

`test_fuzz` sends FUZZ_REQUESTS requests built from a fixed seed, from a pool of THREADS
threads, under a deadline: malformed JSON bodies, wrong types and out-of-range values in the
sampling params and in `custom_params["parse"]`, prompt token ids outside the vocabulary,
empty and over-long prompts, huge max_new_tokens, streams closed after a few events, mixed
with valid greedy requests. Every invalid request must be refused with a 4xx (a stream, whose
200 header SGLang sends before it validates, with an error event whose code is 400), every
valid one must equal the target's greedy continuation (transformers), and afterwards the server
must answer /health and a last request exactly, with SGLang's memory balance clean. It prints
a summary per kind of request.

The focused tests then check the refusals name the field, the value and the allowed range
(out-of-vocabulary prompt ids, stop_token_ids, logit_bias keys; /generate, the OpenAI endpoints
and streams) while good requests run alongside and finish exactly.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import random
import time
from concurrent.futures import ThreadPoolExecutor, wait

import pytest
import requests
from conftest import hf_greedy, probe_config
from http_server import MEM_LINE, assert_memory_balanced, greedy, parse_server


pytestmark = pytest.mark.sglang

SEED = 20260509
FUZZ_REQUESTS = 200  # all kinds together
THREADS = 6
DEADLINE = 240.0  # seconds for the whole fuzz run; the test fails (and stops sending) past it
TIMEOUT = 120  # seconds for one HTTP call
VOCAB = 400  # the tiny models' vocabulary
CONTEXT = 2048  # their max_position_embeddings: SGLang's context length
JSON_HEADERS = {"content-type": "application/json"}
WORDS = "the a model draft token answer step one two three add sum so then cat dog sun moon red".split()
IN_VOCAB = f"allowed is [0, {VOCAB}) (the model's vocabulary)"


SERVERS = {
    "lossless": probe_config(draft_budget=4, judge=False),
    "judged": probe_config(draft_budget=4, probe_stride=2, threshold=0.3),
}


@pytest.fixture(scope="module", params=list(SERVERS))
def server(request, tiny_pair, tmp_path_factory):
    config = SERVERS[request.param]
    with parse_server(tiny_pair, tmp_path_factory.mktemp("fuzz_server"), config, max_running_requests=16) as srv:
        srv.judged = config.judge
        yield srv


@dataclasses.dataclass
class Case:
    kind: str
    path: str
    body: object  # a JSON value, or a str sent as the raw body
    expected: list | None = None  # valid: the output ids (a list of them for a batch)
    close_after: int = 0  # > 0: a valid stream, closed by us after this many events
    judged: int = 0  # > 0: a valid judged request: served with this many tokens (outputs not compared)

    @property
    def valid(self) -> bool:
        return self.expected is not None or self.close_after > 0 or self.judged > 0


@dataclasses.dataclass
class Outcome:
    status: object  # HTTP status, or "dropped" (the connection failed)
    body: object  # the parsed JSON reply, a stream's events, or the text
    seconds: float


def error_message(body) -> str:
    """The message of a refusal: {"error": {"message"}} (/generate), {"message"} (OpenAI), or
    a stream's error event; "" when there is none."""
    if isinstance(body, list):  # stream events
        body = body[0] if body else {}
    if not isinstance(body, dict):
        return str(body)
    error = body.get("error", body)
    return str(error.get("message", error)) if isinstance(error, dict) else str(error)


def stream_error_code(events: list) -> int | None:
    first = events[0] if events else None
    if isinstance(first, dict) and isinstance(first.get("error"), dict):
        return first["error"].get("code")
    return None


def send(server, case: Case) -> Outcome:
    """One request; a stream is read event by event (and closed early where the case says so)."""
    raw = isinstance(case.body, str)
    kwargs = dict(data=case.body, headers=JSON_HEADERS) if raw else dict(json=case.body)
    streaming = not raw and isinstance(case.body, dict) and case.body.get("stream") is True
    start = time.monotonic()
    try:
        with requests.post(server.url + case.path, stream=streaming, timeout=TIMEOUT, **kwargs) as reply:
            if not streaming or reply.status_code != 200:
                try:
                    body = reply.json()
                except ValueError:
                    body = reply.text
                return Outcome(reply.status_code, body, time.monotonic() - start)
            events = []
            for line in reply.iter_lines():
                if line.startswith(b"data: ") and line != b"data: [DONE]":
                    events.append(json.loads(line[len(b"data: ") :]))
                    if case.close_after and len(events) >= case.close_after:
                        break  # leaving the `with` closes the connection mid-stream
            return Outcome(200, events, time.monotonic() - start)
    except requests.RequestException as err:
        return Outcome("dropped", repr(err), time.monotonic() - start)


VERDICTS = ("served", "judged", "closed", "refused", "refused in stream")


def verdict(case: Case, outcome: Outcome) -> str:
    """One of VERDICTS, or what went wrong."""
    status, body = outcome.status, outcome.body
    if case.close_after:
        ok = status == 200 and body and stream_error_code(body) is None
        return "closed" if ok else f"stream to close got {status}: {str(body)[:300]}"
    if case.judged:
        ok = status == 200 and len(body["output_ids"]) == case.judged and body["meta_info"]["parse"]["rounds"] > 0
        return "judged" if ok else f"judged request got {status}: {str(body)[:300]}"
    if case.expected is not None:
        if status != 200:
            return f"valid request got {status}: {str(body)[:300]}"
        outputs = [out["output_ids"] for out in body] if isinstance(body, list) else body["output_ids"]
        return "served" if outputs == case.expected else f"output changed: {outputs} != {case.expected}"
    if status == 200 and isinstance(body, list) and stream_error_code(body) == 400:
        return "refused in stream"
    if isinstance(status, int) and 400 <= status < 500:
        return "refused"
    return f"invalid request got {status}: {str(body)[:300]}"


def exact(max_new: int, judged_server: bool) -> dict:
    """Greedy params whose output must be the target's: on a judged server, with the judge off."""
    return greedy(max_new, custom_params={"parse": {"judge": False}}) if judged_server else greedy(max_new)


class FuzzCases:
    """The fuzz requests, every choice drawn from one seeded Random."""

    def __init__(self, rng: random.Random, hf_target, judged_server: bool):
        self.rng, (self.tokenizer, self.model) = rng, hf_target
        self.judged_server = judged_server

    def prompt(self) -> str:
        shared = "Step one: add the numbers. " if self.rng.random() < 0.3 else ""
        return shared + " ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(1, 16)))

    def ids(self) -> list[int]:
        return self.tokenizer(self.prompt()).input_ids

    def target(self, ids: list[int], max_new: int) -> list[int]:
        return hf_greedy(self.model, ids, max_new, ignore_eos=True)

    def valid(self) -> Case:
        max_new = self.rng.randint(1, 8)
        sampling = exact(max_new, self.judged_server)
        if self.rng.random() < 0.2:  # a batch of prompt ids
            batch = [self.ids() for _ in range(self.rng.randint(2, 3))]
            expected = [self.target(ids, max_new) for ids in batch]
            return Case("valid greedy", "/generate", {"input_ids": batch, "sampling_params": sampling}, expected)
        text = self.prompt()
        ids = self.tokenizer(text).input_ids
        prompt = {"text": text} if self.rng.random() < 0.5 else {"input_ids": ids}
        return Case("valid greedy", "/generate", {**prompt, "sampling_params": sampling}, self.target(ids, max_new))

    def judged(self) -> Case:
        """A valid request with its own judge settings (a judged server's)."""
        parse = self.rng.choice(
            [
                {},
                {"threshold": self.rng.random()},
                {"judge_mode": "likelihood", "likelihood_threshold": self.rng.random()},
                {"judge_mode": "both", "threshold": 0.2},
                {"draft_budget": self.rng.randint(1, 4), "probe_stride": 3},
                {"return_probe_scores": True, "after_rejection": "target_to_delimiter"},
            ]
        )
        max_new = self.rng.randint(2, 12)  # the first token is the prefill's: at least one round
        body = {"text": self.prompt(), "sampling_params": greedy(max_new, custom_params={"parse": parse})}
        return Case("valid judged", "/generate", body, judged=max_new)

    def closed_stream(self) -> Case:
        body = {"text": self.prompt(), "stream": True, "sampling_params": greedy(300)}
        return Case("stream closed mid-way", "/generate", body, close_after=self.rng.randint(1, 3))

    def generate(self, kind: str, sampling: dict | None = None, **top) -> Case:
        body = {"text": self.prompt(), "sampling_params": {**greedy(4), **(sampling or {})}, **top}
        if self.rng.random() < 0.25:
            body["stream"] = True  # refused in the stream
        return Case(kind, "/generate", body)

    def malformed_json(self) -> Case:
        good = json.dumps({"text": self.prompt(), "sampling_params": greedy(4)})
        body = self.rng.choice(
            [
                good[: self.rng.randint(1, len(good) - 1)],
                "{not json",
                "",
                "null",
                "[]",
                '"text"',
                "{'text': 'a'}",
                good.replace(":", "=", 1),
                good + "}",
                "\x00\xff garbage",
            ]
        )
        return Case("malformed JSON", self.rng.choice(["/generate", "/v1/completions"]), body)

    def wrong_type(self) -> Case:
        field, value = self.rng.choice(
            [
                ("max_new_tokens", "8"),
                ("temperature", "hot"),
                ("top_p", [0.5]),
                ("top_k", 2.5),
                ("n", "2"),
                ("stop_token_ids", "5"),
                ("stop_token_ids", ["a"]),
                ("logit_bias", [1]),
                ("ignore_eos", "yes"),
                ("stop", 5),
                ("min_new_tokens", 1.5),
                ("regex", 7),
                ("custom_params", 5),
                ("custom_params", "x"),
                ("custom_params", [1]),
            ]
        )
        if self.rng.random() < 0.2:  # the request itself
            body = self.rng.choice(
                [
                    {"text": 5},
                    {"input_ids": "abc"},
                    {"input_ids": [1.5, 2]},
                    {"text": "a", "sampling_params": 5},
                    {"text": "a", "rid": 5},
                    {"text": "a", "return_logprob": "yes"},
                ]
            )
            return Case("wrong type", "/generate", body)
        return self.generate("wrong type", {field: value})

    def out_of_range(self) -> Case:
        sampling, top = self.rng.choice(
            [
                ({"temperature": -1.0}, {}),
                ({"top_p": 0.0}, {}),
                ({"top_p": 1.5}, {}),
                ({"top_k": 0, "temperature": 1.0}, {}),
                ({"top_k": 2**40, "temperature": 1.0}, {}),
                ({"min_p": 2.0}, {}),
                ({"frequency_penalty": 5.0}, {}),
                ({"presence_penalty": -3.0}, {}),
                ({"repetition_penalty": 0.0}, {}),
                ({"max_new_tokens": -1}, {}),
                ({"min_new_tokens": -1}, {}),
                ({"min_new_tokens": 50}, {}),
                ({"n": 0}, {}),
                ({"n": -3}, {}),
                ({"n": 10**6}, {}),
                ({"sampling_seed": -(2**63) - 1}, {}),
                ({"stop_regex": "(unclosed"}, {}),
                ({}, {"return_logprob": True, "logprob_start_len": -5}),
                ({}, {"return_logprob": True, "top_logprobs_num": 10**6}),
                ({}, {"return_logprob": True, "top_logprobs_num": VOCAB + 1}),
                ({}, {"return_logprob": True, "token_ids_logprob": [VOCAB]}),
            ]
        )
        return self.generate("out-of-range value", sampling, **top)

    def bad_parse_settings(self) -> Case:
        parse = self.rng.choice(
            [
                {"threshold": "x"},
                {"threshold": 2},
                {"threshold": None},
                {"draft_budget": 0},
                {"draft_budget": 2.5},
                {"draft_budget": "2"},
                {"draft_budget": 99},
                {"draft_budget": [1]},
                {"judge": "yes"},
                {"probe_stride": None},
                {"probe_stride": -1},
                {"after_rejection": 5},
                {"return_probe_scores": 1},
                {"delimiters": ["\n"]},
                {"nope": 1},
                "not json",
                "[1, 2]",
                5,
                [1],
                True,
                # beyond what the server reserved: denser probes than its own, or a judge it turned off
                {"probe_stride": 1} if self.judged_server else {"judge": True},
            ]
        )
        return self.generate('bad custom_params["parse"]', {"custom_params": {"parse": parse}})

    def oov_ids(self) -> Case:
        bad = self.rng.choice([VOCAB, VOCAB + 1, 50_000, 2**40, -1, -VOCAB])
        ids = self.ids()
        ids.insert(self.rng.randrange(len(ids) + 1), bad)
        choice = self.rng.randrange(7)
        if choice == 0:
            body = {"input_ids": [self.ids(), ids], "sampling_params": greedy(4)}
            return Case("out-of-vocabulary id", "/generate", body)
        if choice == 1:
            body = {"model": "default", "prompt": ids, "max_tokens": 4, "temperature": 0}
            return Case("out-of-vocabulary id", "/v1/completions", body)
        if choice == 2:
            return self.generate("out-of-vocabulary id", {"stop_token_ids": [3, bad]})
        if choice == 3:
            return self.generate("out-of-vocabulary id", {"logit_bias": {str(bad): 1.0}})
        if choice == 4:
            body = {
                "model": "default",
                "messages": [{"role": "user", "content": self.prompt()}],
                "max_tokens": 4,
                "logit_bias": {str(bad): 1.0},
            }
            return Case("out-of-vocabulary id", "/v1/chat/completions", body)
        body = {"input_ids": ids, "sampling_params": greedy(4), **({"stream": True} if choice == 5 else {})}
        return Case("out-of-vocabulary id", "/generate", body)

    def empty_prompt(self) -> Case:
        body = self.rng.choice(
            [
                {"text": "", "sampling_params": greedy(4)},
                {"input_ids": [], "sampling_params": greedy(4)},
                {"input_ids": [self.ids(), []], "sampling_params": greedy(4)},
                {"text": "", "stream": True},
            ]
        )
        return Case("empty prompt", "/generate", body)

    def over_long_prompt(self) -> Case:
        if self.rng.random() < 0.5:
            body = {"text": "one two " * (CONTEXT // 2 + self.rng.randint(10, 200)), "sampling_params": greedy(4)}
        else:
            body = {"input_ids": [self.rng.randrange(VOCAB) for _ in range(CONTEXT + self.rng.randint(0, 50))]}
        return Case("over-long prompt", "/generate", body)

    def huge_max_new_tokens(self) -> Case:
        return self.generate("huge max_new_tokens", {"max_new_tokens": self.rng.choice([CONTEXT, 10**9, 2**63 - 1])})

    def build(self, count: int) -> list[Case]:
        makers = [
            (self.valid, 0.30),
            (self.closed_stream, 0.06),
            (self.malformed_json, 0.08),
            (self.wrong_type, 0.12),
            (self.out_of_range, 0.14),
            (self.bad_parse_settings, 0.10),
            (self.oov_ids, 0.12),
            (self.empty_prompt, 0.03),
            (self.over_long_prompt, 0.03),
            (self.huge_max_new_tokens, 0.02),
        ]
        if self.judged_server:
            makers.append((self.judged, 0.15))
        makers_only, weights = zip(*makers)
        return [self.rng.choices(makers_only, weights)[0]() for _ in range(count)]


def print_summary(rows: dict, seconds: float, alive: str) -> None:
    kinds = sorted(rows, key=lambda k: -sum(rows[k].values()))
    columns = VERDICTS
    lines = [
        f"fuzz: {sum(sum(r.values()) for r in rows.values())} requests, seed {SEED}, {THREADS} threads, "
        f"{seconds:.1f} s",
        f"{'kind':28s} {'sent':>4s} " + " ".join(f"{c:>17s}" for c in columns) + "  failed",
    ]
    for kind in kinds:
        row = rows[kind]
        failed = sum(n for verdict_, n in row.items() if verdict_ not in columns)
        lines.append(f"{kind:28s} {sum(row.values()):4d} " + " ".join(f"{row[c]:17d}" for c in columns) + f"  {failed}")
    lines.append(alive)
    print("\n" + "\n".join(lines))


def test_fuzz(server, hf_target, capsys):
    cases = FuzzCases(random.Random(SEED), hf_target, server.judged).build(FUZZ_REQUESTS)
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        futures = {pool.submit(send, server, case): case for case in cases}
        done, pending = wait(futures, timeout=DEADLINE)
        for future in pending:
            future.cancel()
    seconds = time.monotonic() - start
    assert not pending, f"{len(pending)} requests still unanswered after the {DEADLINE:.0f} s deadline"

    rows: dict = collections.defaultdict(collections.Counter)
    failures = []
    for future, case in futures.items():
        result = verdict(case, future.result())
        rows[case.kind][result if result in VERDICTS else "failed"] += 1
        if result not in VERDICTS:
            failures.append(f"{case.kind}: {str(case.body)[:300]} -> {result}")

    # Afterwards: alive, a last valid request exact, the memory balance clean once idle.
    tokenizer, model = hf_target
    health = requests.get(server.url + "/health", timeout=TIMEOUT).status_code
    last = server.post("/generate", {"text": "The last request", "sampling_params": exact(16, server.judged)})
    last_ok = last["output_ids"] == hf_greedy(model, tokenizer("The last request").input_ids, 16, ignore_eos=True)
    deadline = time.monotonic() + TIMEOUT
    while requests.post(server.url + "/flush_cache", timeout=TIMEOUT).status_code != 200:  # 400 while busy
        assert time.monotonic() < deadline, "requests still run: a closed stream was not aborted"
        time.sleep(0.5)
    time.sleep(2.0)  # idle: the strict idle check runs on each idle scheduler loop
    log = server.log()
    alive = (
        f"after: server process alive {server.proc.poll() is None}, /health {health}, last request exact {last_ok}, "
        f"{len(MEM_LINE.findall(log))} busy memory checks logged"
    )
    with capsys.disabled():
        print_summary(rows, seconds, alive)
    assert failures == [], "\n".join(failures)
    assert server.proc.poll() is None and health == 200 and last_ok
    assert "Traceback" not in log  # no 5xx and no scheduler error behind a refusal
    assert_memory_balanced(log, min_checks=10)
    kinds = {case.kind for case in cases}
    assert len(kinds) == 10 + server.judged, kinds  # every kind was drawn at least once


def test_out_of_vocabulary_ids_refused_by_name_while_good_requests_finish(server, hf_target):
    """Each refusal is a 400 naming the field, the value and the allowed range; three greedy
    requests sent at the same time finish exactly."""
    tokenizer, model = hf_target
    chat = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    bad = [
        (
            "/generate",
            {"input_ids": [5, 6, VOCAB], "sampling_params": greedy(4)},
            f"input_ids[2]={VOCAB} is out of range: {IN_VOCAB}",
        ),
        ("/generate", {"input_ids": [[5, 6], [7, -1, 8]]}, f"input_ids[1]=-1 is out of range: {IN_VOCAB}"),
        ("/generate", {"input_ids": [9, 50_000], "stream": True}, f"input_ids[1]=50000 is out of range: {IN_VOCAB}"),
        (
            "/generate",
            {"text": "one", "sampling_params": greedy(4, stop_token_ids=[3, 999])},
            f"stop_token_ids: 999 is out of range: allowed are token ids in [0, {VOCAB})",
        ),
        (
            "/generate",
            {"text": "one", "sampling_params": greedy(4, logit_bias={str(VOCAB): 2.0})},
            f"logit_bias key '{VOCAB}' is out of range: allowed are token ids in [0, {VOCAB})",
        ),
        (
            "/generate",
            {"text": "one", "sampling_params": greedy(4, logit_bias={"abc": 2.0})},
            f"logit_bias key 'abc' is not a token id: allowed are token ids in [0, {VOCAB})",
        ),
        (
            "/v1/completions",
            {"model": "default", "prompt": [5, 6, 1000], "max_tokens": 4},
            f"input_ids[2]=1000 is out of range: {IN_VOCAB}",
        ),
        (
            "/v1/completions",
            {"model": "default", "prompt": "one", "max_tokens": 4, "stop_token_ids": [VOCAB + 5]},
            f"stop_token_ids: {VOCAB + 5} is out of range",
        ),
        ("/v1/chat/completions", {**chat, "logit_bias": {"-3": 1.0}}, "logit_bias key '-3' is out of range"),
        (
            "/v1/chat/completions",
            {**chat, "logprobs": True, "top_logprobs": 10**6},
            f"top_logprobs_num=1000000 is out of range: allowed is an integer in [0, {VOCAB}]",
        ),
    ]
    good = ["one two", "def f(x):", "Yes no"]
    with ThreadPoolExecutor(max_workers=len(bad) + len(good)) as pool:
        good_cases = [Case("good", "/generate", {"text": p, "sampling_params": exact(24, server.judged)}) for p in good]
        good_replies = [pool.submit(send, server, case) for case in good_cases]
        replies = list(pool.map(lambda b: send(server, Case("bad", b[0], b[1])), bad))
    for (path, body, named), outcome in zip(bad, replies):
        if body.get("stream"):
            assert outcome.status == 200 and stream_error_code(outcome.body) == 400, (path, body, outcome)
        else:
            assert outcome.status == 400, (path, body, outcome)
        assert named in error_message(outcome.body), (named, outcome.body)
    for prompt, future in zip(good, good_replies):
        outcome = future.result()
        assert outcome.status == 200, outcome
        assert outcome.body["output_ids"] == hf_greedy(model, tokenizer(prompt).input_ids, 24, ignore_eos=True), prompt
    assert requests.get(server.url + "/health", timeout=TIMEOUT).status_code == 200
