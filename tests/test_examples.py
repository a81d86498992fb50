"""The examples/ programs, run as a user runs them, on the tiny fp32 pair on CPU.

- launch_server.md's CPU command, as `python -m sglang_cpu.launch_server` on 127.0.0.1
  (started from a clean environment: the launcher must enable the CPU runtime itself);
  the curl requests of launch_server.md are sent to it as written (but for the host, the
  port and fewer new tokens);
- frontend_program.py against that server;
- offline_batch.py (its own in-process `sglang.Engine`).

Each example runs in its own process group, so "nothing left behind" is checked on the
whole group after it ends.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import requests
from conftest import parse_server_flags
from http_server import Server, clean_env, wait_healthy
from support.servers import launch

pytestmark = pytest.mark.sglang

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
NUM_STEPS = 8  # L of the example server
OFFLINE_PROMPTS = ["What is 12 times 7?", "Name a planet.", "Count to five."]
OFFLINE_NEW_TOKENS = 12
# Generous: other jobs may share this machine's two cores.
SERVER_START_TIMEOUT = 300
OFFLINE_TIMEOUT = 400
# A printed answer's PARSE counters: `... completion_tokens=N parse={json}`.
STATS_LINE = re.compile(r"completion_tokens=(\d+) parse=(.*)$", re.M)
STATS_KEYS = {"rounds", "draft_tokens", "accepted_exact", "accepted_judged"}


def group_members(pgid: int) -> list[psutil.Process]:
    """Live (non-zombie) processes of process group pgid."""
    members = []
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(proc)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
    return members


def assert_group_gone(pgid: int, timeout: float = 30.0) -> None:
    """Fail if group pgid still has live processes after timeout (killing them first)."""
    deadline = time.monotonic() + timeout
    while (left := group_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.5)
    names = []
    for proc in left:
        try:
            names.append(proc.cmdline())
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    assert not names, f"left behind: {names}"


@dataclasses.dataclass
class Example:
    """An example (or the server) running as a user runs it, in its own process group."""

    proc: subprocess.Popen
    log_path: Path

    @classmethod
    def start(cls, args: list[str], log_path: Path) -> "Example":
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                [sys.executable, *args],
                cwd=REPO,
                env=clean_env(PYTHONUNBUFFERED="1"),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return cls(proc, log_path)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def finish(self, timeout: float) -> str:
        """Its output, once it exits with 0 and leaves no process of its group behind."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop(grace=0)
            pytest.fail(f"{self.proc.args[1]} ran past {timeout}s:\n{self.output()[-6000:]}")
        name, rc = self.proc.args[1], self.proc.returncode
        assert rc == 0, f"{name} exited with {rc}:\n{self.output()[-6000:]}"
        assert_group_gone(self.proc.pid)
        return self.output()

    def stop(self, grace: float) -> None:
        """SIGTERM the group (SGLang's processes take their children down), SIGKILL after grace."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        assert_group_gone(self.proc.pid)


def printed_stats(out: str) -> list[tuple[int, dict]]:
    return [(int(tokens), json.loads(stats)) for tokens, stats in STATS_LINE.findall(out)]


def assert_parse_stats(stats, completion_tokens: int) -> None:
    """Counters of one finished PARSE request: present, and consistent with its length."""
    assert isinstance(stats, dict) and STATS_KEYS <= set(stats), stats
    assert stats["rounds"] > 0
    assert stats["draft_tokens"] >= stats["accepted_exact"] + stats["accepted_judged"]
    # Each round emits its accepted drafts plus one bonus token; the first token comes from prefill.
    assert completion_tokens <= 1 + stats["rounds"] + stats["accepted_exact"] + stats["accepted_judged"]


@pytest.fixture(scope="module")
def offline_example(tiny_pair, tmp_path_factory):
    """offline_batch.py, started before the server and left running while it starts: both
    spend most of their time importing SGLang, so together they finish sooner."""
    target, draft = tiny_pair
    args = [
        str(EXAMPLES / "offline_batch.py"),
        "--target",
        str(target),
        "--draft",
        str(draft),
        "--num-steps",
        "4",
        "--probe-stride",
        "2",
        "--threshold",
        "0",
        "--max-new-tokens",
        str(OFFLINE_NEW_TOKENS),
        "--chat",
        "--prompts",
        *OFFLINE_PROMPTS,
    ]
    example = Example.start(args, tmp_path_factory.mktemp("offline_example") / "out.log")
    yield example
    example.stop(grace=30)


@pytest.fixture(scope="module")
def server_url(tiny_pair, tmp_path_factory, offline_example):
    """launch_server.md's CPU command on the tiny pair, at 127.0.0.1 and a free port: no CPU flags,
    the launcher adds them."""
    target, draft = tiny_pair
    command = [
        sys.executable,
        "-m",
        "sglang_cpu.launch_server",
        *parse_server_flags(target, draft),
        "--speculative-num-steps",
        str(NUM_STEPS),
        "--max-total-tokens",
        "8192",
    ]
    log_path = tmp_path_factory.mktemp("example_server") / "server.log"
    # on a free port, started again if the port is taken first (the example starts beside it)
    proc, url = launch(
        command, {}, log_path, env=clean_env(PYTHONUNBUFFERED="1"), timeout=SERVER_START_TIMEOUT, cwd=REPO
    )
    server = Example(proc, log_path)
    try:
        wait_healthy(Server(server.proc, url, server.log_path), timeout=SERVER_START_TIMEOUT)
        # the launcher set what the CPU needs (the command names none of it)
        added = re.search(r"sglang_cpu.launch_server adds the CPU's settings: (.*)", log_path.read_text())
        assert added and added.group(1).split()[:5] == [
            "--device",
            "cpu",
            "--attention-backend",
            "torch_native",
            "--disable-cuda-graph",
        ], added
        yield url
    finally:
        server.stop(grace=60)


def documented_requests() -> list[tuple[str, dict]]:
    """(path, JSON body) of each curl in launch_server.md."""
    text = (EXAMPLES / "launch_server.md").read_text()
    found = re.findall(r"curl -s http://127\.0\.0\.1:30000(/\S+) .*?-d '(.*?)'", text, re.S)
    return [(path, json.loads(body)) for path, body in found]


def test_documented_curl_requests(server_url):
    """launch_server.md's requests, as written but for fewer new tokens (CI time)."""
    replies = {}
    for path, body in documented_requests():
        if path == "/generate":
            body["sampling_params"]["max_new_tokens"] = 24
        else:
            body["max_tokens"] = 24
        reply = requests.post(server_url + path, json=body, timeout=300)
        assert reply.status_code == 200, (path, reply.text[:2000])
        replies[path] = reply.json()
    assert set(replies) == {"/generate", "/v1/completions"}
    generated = replies["/generate"]
    assert generated["text"] and generated["meta_info"]["completion_tokens"] == 24
    assert_parse_stats(generated["meta_info"]["parse"], 24)
    completion = replies["/v1/completions"]
    assert completion["choices"][0]["text"] and completion["usage"]["completion_tokens"] == 24


def test_frontend_program(server_url, tmp_path):
    args = [str(EXAMPLES / "frontend_program.py"), "--url", server_url, "--max-tokens", "16"]
    out = Example.start(args, tmp_path / "out.log").finish(timeout=300)
    assert re.findall(r"^\[(answer|follow_up_answer)\] '", out, re.M) == ["answer", "follow_up_answer"], out
    stats = printed_stats(out)
    assert [tokens for tokens, _ in stats] == [16, 16], out  # the tiny model has no reason to stop early
    for tokens, parse in stats:
        assert_parse_stats(parse, tokens)


def test_offline_batch(offline_example):
    out = offline_example.finish(timeout=OFFLINE_TIMEOUT)
    assert re.findall(r"^Q: (.*)$", out, re.M) == OFFLINE_PROMPTS, out
    assert len(re.findall(r"^A: '", out, re.M)) == len(OFFLINE_PROMPTS), out
    stats = printed_stats(out)
    assert [tokens for tokens, _ in stats] == [OFFLINE_NEW_TOKENS] * len(OFFLINE_PROMPTS), out
    for tokens, parse in stats:
        assert_parse_stats(parse, tokens)
        # --threshold 0: the judge accepts every draft in full (where exact match has not already).
        assert parse["accepted_exact"] + parse["accepted_judged"] == parse["draft_tokens"], parse
    assert sum(parse["accepted_judged"] for _, parse in stats) > 0
    server = json.loads(re.search(r"^server: (.*)$", out, re.M).group(1))
    assert server["speculative_algorithm"] == "PARSE" and server["speculative_num_steps"] == 4
    assert server["avg_spec_accept_length"] > 1.0
    totals = server["parse"]  # the engine's totals are the requests' counters summed
    assert totals["requests"] == len(OFFLINE_PROMPTS)
    for key in ("rounds", "draft_tokens", "accepted_exact", "accepted_judged"):
        assert totals[key] == sum(parse[key] for _, parse in stats), key
