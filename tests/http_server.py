"""A real SGLang HTTP server started as a subprocess by the HTTP-tier tests, and the
helpers around it (clean environment, port, health wait, process-tree cleanup, SGLang's
memory-check log line)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest
import requests
from conftest import engine_kwargs

# SGLang's strict memory checks: every busy iteration logs and asserts the KV pool balance (2),
# and the idle check raises on a leak (1), which kills the server.
STRICT_MEM_CHECKS = {
    "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY": "2",
    "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "1",
}

MEM_LINE = re.compile(
    r"\[Mem Check \(BUSY\)\] \[full\] total=(\d+), available=(\d+), evictable=(\d+), protected=(\d+), "
    r"session_held=(\d+), uncached=(\d+)"
)


class Server:
    def __init__(self, proc: subprocess.Popen, url: str, log_path):
        self.proc, self.url, self.log_path = proc, url, log_path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def post(self, path: str, payload: dict) -> dict:
        reply = requests.post(self.url + path, json=payload, timeout=120)
        assert reply.status_code == 200, reply.text[:2000]
        return reply.json()


def wait_healthy(server: Server, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            pytest.fail(f"server exited with {server.proc.returncode}:\n{server.log()[-4000:]}")
        try:
            if requests.get(server.url + "/health", timeout=2).status_code == 200:
                return
        except (requests.ConnectionError, requests.Timeout):
            pass  # not listening yet, or too busy starting up to answer
        time.sleep(1.0)
    pytest.fail(f"server not healthy after {timeout}s:\n{server.log()[-4000:]}")


def clean_env(**extra: str) -> dict:
    """This environment without the CPU runtime an in-process engine of this test session may
    have enabled (so the launcher must enable it itself), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in ("SGLANG_USE_CPU_ENGINE", "PYTHONPATH")}
    env.update(extra)
    return env


def cli_args(kwargs: dict) -> list[str]:
    """`sglang.Engine` keyword arguments as `launch_server` flags (True: a bare flag, a dict: JSON)."""
    args = []
    for key, value in kwargs.items():
        flag = "--" + key.replace("_", "-")
        args += [flag] if value is True else [flag, json.dumps(value) if isinstance(value, dict) else str(value)]
    return args


@contextlib.contextmanager
def launched_server(
    model_path, log_dir, env: dict, timeout: float = 180.0, python: str = sys.executable,
    module: str = "parse_sglang.launch_server", **overrides,
):  # fmt: skip
    """`python -m parse_sglang.launch_server` (or `module`, run by `python`) on 127.0.0.1 and a free
    port with the tiny-model CPU settings of `conftest.engine_kwargs(model_path, **overrides)` as
    flags (log level info: SGLang's memory-check lines are read back), from `clean_env(**env)`;
    yields the healthy `Server`, kills what is left of it on exit."""
    for _ in range(3):  # the free port may be taken before the server binds it (by another process, or
        # by one of SGLang's own random internal ports): start again on a fresh one
        port = free_port()
        args = cli_args(engine_kwargs(model_path, host="127.0.0.1", port=port, log_level="info", **overrides))
        log_path = log_dir / "server.log"
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                [python, "-m", module, *args],
                stdout=log, stderr=subprocess.STDOUT, env=clean_env(**env), start_new_session=True,
            )  # fmt: skip
        server = Server(proc, f"http://127.0.0.1:{port}", log_path)
        if wait_bound(server, port, timeout):
            break
        stop(proc)
    else:
        raise RuntimeError(f"the server found its port taken on 3 attempts: {log_path}")
    try:
        wait_healthy(server, timeout=timeout)
        yield server
    finally:
        if proc.poll() is None:
            stop(proc)


def wait_bound(server: Server, port: int, timeout: float) -> bool:
    """Whether launch_server bound its port: False once its log says the port was already in use
    (SGLang's scheduler then runs on without a server), True once uvicorn says it runs, or the
    server exits for another reason, or `timeout` passes (wait_healthy then reports)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = server.log_path.read_text(errors="replace")
        if "address already in use" in log:
            return False
        if f"Uvicorn running on http://127.0.0.1:{port}" in log or server.proc.poll() is not None:
            return True
        time.sleep(0.5)
    return True


@contextlib.contextmanager
def parse_server(tiny_pair, log_dir, config, **overrides):
    """`launched_server` serving the tiny pair with PARSE at `config` (a ParseConfig; judge off:
    greedy output == the target's), with STRICT_MEM_CHECKS."""
    from parse_sglang.demo import parse_engine_kwargs

    target, draft = tiny_pair
    parse = parse_engine_kwargs(draft, config)
    with launched_server(target, log_dir, env=STRICT_MEM_CHECKS, timeout=600.0, **parse, **overrides) as server:
        yield server


def greedy(max_new: int, **extra) -> dict:
    """Greedy sampling params with EOS ignored (compare with `hf_greedy(..., ignore_eos=True)`)."""
    return {"max_new_tokens": max_new, "temperature": 0.0, "ignore_eos": True, **extra}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def stop(proc: subprocess.Popen) -> None:
    """Kill what is left of the process tree (cleanup only)."""
    for p in [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def assert_memory_balanced(log: str, min_checks: int) -> None:
    """SGLang's busy memory check ran at least `min_checks` times, found no leak, and after the
    last request every KV slot is free or held by the radix cache."""
    assert "leak" not in log.lower()
    balances = [tuple(map(int, m)) for m in MEM_LINE.findall(log)]
    assert len(balances) >= min_checks
    total, available, evictable, protected, session_held, uncached = balances[-1]
    assert (protected, session_held, uncached) == (0, 0, 0)
    assert available + evictable == total


def assert_shutdown_leaves_no_process(server: Server, timeout: float) -> None:
    """SIGTERM to the launcher ends it and every process it started (scheduler, detokenizer)."""
    pids = [p.pid for p in psutil.Process(server.proc.pid).children(recursive=True)] + [server.proc.pid]
    assert len(pids) >= 3  # launcher, scheduler, detokenizer
    server.proc.send_signal(signal.SIGTERM)
    server.proc.wait(timeout=timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(map(alive, pids)):
        time.sleep(0.5)
    left = [p for p in pids if alive(p)]
    assert left == [], f"processes left after shutdown: {left}"
