"""A real SGLang HTTP server started as a subprocess by the HTTP-tier tests (`support.servers`),
and the helpers around it (clean environment, health wait, SGLang's memory-check log line)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest
import requests
from conftest import engine_kwargs
from support.servers import launch, stop, wait_healthy as healthy

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
    try:
        healthy(server.proc, server.url, server.log_path, timeout)
    except RuntimeError as err:
        pytest.fail(str(err))


def clean_env(**extra: str) -> dict:
    """This environment without the CPU runtime an in-process engine of this test session may
    have enabled (so the launcher must enable it itself), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in ("SGLANG_USE_CPU_ENGINE", "PYTHONPATH")}
    env.update(extra)
    return env


@contextlib.contextmanager
def launched_server(
    model_path,
    log_dir,
    env: dict,
    timeout: float = 180.0,
    python: str = sys.executable,
    module: str = "sglang_cpu.launch_server",
    **overrides,
):
    """`python -m sglang_cpu.launch_server` (or `module`, run by `python`) on 127.0.0.1 and a free
    port with the tiny-model CPU settings of `conftest.engine_kwargs(model_path, **overrides)` as
    flags (log level info: SGLang's memory-check lines are read back), from `clean_env(**env)`;
    yields the healthy `Server`, kills what is left of it on exit."""
    log_path = log_dir / "server.log"
    proc, url = launch(
        [python, "-m", module],
        engine_kwargs(model_path, log_level="info", **overrides),
        log_path,
        env=clean_env(**env),
        timeout=timeout,
    )
    server = Server(proc, url, log_path)
    try:
        wait_healthy(server, timeout=timeout)
        yield server
    finally:
        if proc.poll() is None:
            stop(proc)


@contextlib.contextmanager
def launched_router(arguments: list[str], flags: dict, log_dir):
    """`python -m sglang_router.launch_router` with `arguments` and `flags` on 127.0.0.1 and a free
    port; yields its URL once its /readiness answers (its workers are healthy), stops it on exit."""
    log = log_dir / "router.log"
    proc, url = launch([sys.executable, "-m", "sglang_router.launch_router", *arguments], flags, log, timeout=120.0)
    try:
        healthy(proc, url, log, timeout=120.0, path="/readiness")
        yield url
    finally:
        stop(proc)


@contextlib.contextmanager
def parse_server(tiny_pair, log_dir, config, **overrides):
    """`launched_server` serving the tiny pair with PARSE at `config` (a ParseConfig; judge off:
    greedy output == the target's), with STRICT_MEM_CHECKS."""
    from parse_sglang.settings import parse_engine_kwargs

    target, draft = tiny_pair
    parse = parse_engine_kwargs(draft, config)
    with launched_server(target, log_dir, env=STRICT_MEM_CHECKS, timeout=600.0, **parse, **overrides) as server:
        yield server


def greedy(max_new: int, **extra) -> dict:
    """Greedy sampling params with EOS ignored (compare with `hf_greedy(..., ignore_eos=True)`)."""
    return {"max_new_tokens": max_new, "temperature": 0.0, "ignore_eos": True, **extra}


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


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
