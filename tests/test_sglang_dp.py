"""SGLang tier, data-parallel replicas: PARSE behind SGLang's own data-parallel controller.

`--dp-size 2` starts two replicas (a scheduler each, with its own target, draft, KV pool and
PARSE worker) behind one tokenizer; the controller hands each request to one replica (round
robin). Each replica is pinned to a core (`SGLANG_CPU_OMP_THREADS_BIND="0|1"`), as docs/serving.md
tells CPU users to.

- `Engine(dp_size=2)`: the lossless batch equals target-only SGLang's, and both replicas ran
  PARSE rounds.
- `launch_server --dp-size 2` with adaptive draft lengths and SGLang's strict memory checks: 40
  concurrent requests equal the target's greedy continuations; per-request settings (judge on
  with probe scores returned, judge off) are honoured on both replicas (each replica's totals
  grow); a bad request is refused alone; each replica runs on its own core; both replicas' KV
  pools balance; shutdown leaves no process.
"""

from __future__ import annotations

import os
import random
import re
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from conftest import PROMPTS, hf_greedy, sglang_engine, probe_config
from http_server import MEM_LINE, assert_shutdown_leaves_no_process, greedy, parse_server
from sglang_cpu import CPU_BIND_ENV
from parse_sglang.settings import parse_engine_kwargs

pytestmark = pytest.mark.sglang

REPLICAS = 2
TIMEOUT = 300  # seconds for one HTTP call: lenient, 2 cores serve both replicas
CONFIG = probe_config(draft_budget=4, probe_stride=2, threshold=0.3, adaptive=True)
WORDS = "the a model draft token answer step one two three add sum so then cat dog sun moon red".split()


@pytest.fixture(scope="module")
def pinned():
    """One core per replica (the scheduler processes inherit the environment)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CPU_BIND_ENV, os.environ.get(CPU_BIND_ENV, "0|1"))
        yield


def parse_states(info: dict) -> list[dict]:
    """Each replica's `get_server_info()["internal_states"][i]["parse"]`, by its `dp_rank` (the
    replicas answer in any order)."""
    states = sorted((state["parse"] for state in info["internal_states"]), key=lambda s: s["dp_rank"])
    assert [s["dp_rank"] for s in states] == list(range(REPLICAS)), states
    return states


def test_engine_replicas_equal_target_only(pinned, tiny_pair, target_only_outputs):
    lossless = {**target_only_outputs.sampling_params, "custom_params": {"parse": {"judge": False}}}
    with sglang_engine(tiny_pair[0], dp_size=REPLICAS, **parse_engine_kwargs(tiny_pair[1], CONFIG)) as engine:
        outs = engine.generate(target_only_outputs.prompts, lossless)
        states = parse_states(engine.get_server_info())
    assert [out["output_ids"] for out in outs] == target_only_outputs.output_ids
    assert all(out["meta_info"]["parse"]["rounds"] > 0 for out in outs)
    assert sum(state["requests"] for state in states) == len(PROMPTS)
    assert all(state["requests"] > 0 and state["rounds"] > 0 for state in states), states


@pytest.fixture(scope="module")
def server(pinned, tiny_pair, tmp_path_factory):
    with parse_server(tiny_pair, tmp_path_factory.mktemp("dp_server"), CONFIG, dp_size=REPLICAS) as srv:
        yield srv


def server_states(server) -> list[dict]:
    return parse_states(requests.get(server.url + "/get_server_info", timeout=TIMEOUT).json())


def test_concurrent_requests_across_replicas_equal_target_greedy(server, hf_target):
    """40 lossless requests at once, 4 to 12 new tokens: both replicas serve, each output is the
    target's own greedy continuation."""
    tokenizer, model = hf_target
    rng = random.Random(1)
    prompts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 16))) for _ in range(40)]
    max_new = [4 + i % 9 for i in range(40)]
    before = server_states(server)

    def send(i: int) -> dict:
        params = greedy(max_new[i], custom_params={"parse": {"judge": False}})
        return server.post("/generate", {"text": prompts[i], "sampling_params": params})

    with ThreadPoolExecutor(max_workers=40) as pool:
        outs = list(pool.map(send, range(40)))
    for prompt, n, out in zip(prompts, max_new, outs):
        assert out["output_ids"] == hf_greedy(model, tokenizer(prompt).input_ids, n, ignore_eos=True), prompt
        assert out["meta_info"]["parse"]["accepted_judged"] == 0
    after = server_states(server)
    served = [a["requests"] - b["requests"] for a, b in zip(after, before)]
    assert sum(served) == 40 and min(served) > 0, served
    assert all("cost_table" in state for state in after)  # adaptive on every replica


def test_per_request_settings_reach_every_replica(server):
    """On each replica (`routed_dp_rank`), 4 requests with the judge on and probe scores
    returned and 4 with the judge off, at once: every response carries what its request asked
    for, and each replica's totals count exactly its own requests' judge probes."""
    judged = greedy(16, custom_params={"parse": {"return_probe_scores": True}})
    lossless = greedy(16, custom_params={"parse": {"judge": False}})
    bodies = [
        {"text": f"{word} and the", "sampling_params": params, "routed_dp_rank": replica}
        for replica in range(REPLICAS)
        for word in WORDS[:4]
        for params in (judged, lossless)
    ]
    before = server_states(server)
    with ThreadPoolExecutor(max_workers=len(bodies)) as pool:
        outs = list(pool.map(lambda body: server.post("/generate", body), bodies))
    probes = [0] * REPLICAS
    for body, out in zip(bodies, outs):
        stats = out["meta_info"]["parse"]
        if body["sampling_params"] is judged:
            assert len(stats["probe_scores"]) == stats["rounds"] > 0, stats
        else:
            assert "probe_scores" not in stats and stats["judge_probes"] == stats["accepted_judged"] == 0, stats
        probes[body["routed_dp_rank"]] += stats["judge_probes"]
    after = server_states(server)
    assert [a["requests"] - b["requests"] for a, b in zip(after, before)] == [8] * REPLICAS
    assert [a["judge_probes"] - b["judge_probes"] for a, b in zip(after, before)] == probes


def test_a_bad_request_fails_alone(server, hf_target):
    """A bad `custom_params["parse"]`, and a `routed_dp_rank` naming no replica, are HTTP 400
    naming the field; the lossless requests beside them are served exactly, on both replicas."""
    tokenizer, model = hf_target
    bad = [
        (
            {"text": "one two", "sampling_params": greedy(8, custom_params={"parse": {"draft_budget": 0}})},
            "draft_budget=0",
        ),
        ({"text": "one two", "sampling_params": greedy(8), "routed_dp_rank": REPLICAS}, "routed_dp_rank"),
    ]
    lossless = greedy(8, custom_params={"parse": {"judge": False}})
    good = [
        {"text": f"{w} one two", "sampling_params": lossless, "routed_dp_rank": i % REPLICAS}
        for i, w in enumerate(WORDS[:6])
    ]
    before = server_states(server)
    with ThreadPoolExecutor(max_workers=8) as pool:
        refused = [pool.submit(requests.post, server.url + "/generate", json=body, timeout=TIMEOUT) for body, _ in bad]
        outs = list(pool.map(lambda body: server.post("/generate", body), good))
    for (body, named), reply in zip(bad, refused):
        assert reply.result().status_code == 400 and named in reply.result().text, reply.result().text
    for body, out in zip(good, outs):
        assert out["output_ids"] == hf_greedy(model, tokenizer(body["text"]).input_ids, 8, ignore_eos=True)
    after = server_states(server)
    assert [a["requests"] - b["requests"] for a, b in zip(after, before)] == [3] * REPLICAS


def test_each_replica_runs_on_its_own_core(server):
    """The CPU runtime pins each replica's scheduler to its SGLANG_CPU_OMP_THREADS_BIND entry
    (sglang_cpu/threads_binding.py); SGLang alone leaves every process on every core."""
    import psutil

    affinities = sorted(p.cpu_affinity() for p in psutil.Process(server.proc.pid).children(recursive=True))
    assert [0] in affinities and [1] in affinities, affinities


def test_every_replicas_kv_pool_balances(server):
    """SGLang's strict busy check logged each replica's pool balance (its log lines carry the
    replica's `DP<i>` prefix); after the last request every slot is free or held by the radix
    cache, and no replica found a leak. A replica logs the check of the iteration that frees a
    request's KV a moment after the response has gone out: this waits up to 10 s for that line."""
    deadline = time.monotonic() + 10.0
    for replica in range(REPLICAS):
        while True:
            assert server.proc.poll() is None
            log = server.log()
            assert "Traceback" not in log and "leak" not in log.lower()
            lines = [
                line for line in log.splitlines() if re.search(rf"\bDP{replica}\b", line) and MEM_LINE.search(line)
            ]
            assert len(lines) >= 5, f"replica {replica}: {len(lines)} memory checks"
            total, available, evictable, protected, session_held, uncached = map(
                int, MEM_LINE.search(lines[-1]).groups()
            )
            if (protected, session_held, uncached) == (0, 0, 0) and available + evictable == total:
                break
            assert time.monotonic() < deadline, f"replica {replica}: {lines[-1]}"
            time.sleep(0.5)


def test_shutdown_leaves_no_process(server):
    assert_shutdown_leaves_no_process(server, timeout=TIMEOUT)
