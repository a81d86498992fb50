"""A real SGLang HTTP server started as a subprocess by the HTTP-tier tests, and the
helpers around it (port, health wait, process-tree cleanup, SGLang's memory-check log line)."""

from __future__ import annotations

import re
import socket
import subprocess
import time

import psutil
import pytest
import requests

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
        except requests.ConnectionError:
            pass
        time.sleep(1.0)
    pytest.fail(f"server not healthy after {timeout}s:\n{server.log()[-4000:]}")


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
