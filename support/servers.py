"""Starting `launch_server` as a subprocess, for the HTTP-tier tests (`tests/http_server.py`)
and the benchmarks that serve over HTTP (`benchmarks/adaptive.py`, `benchmarks/compare.py`):
settings as flags, a free port (taken again if the server finds it in use), cleanup of the whole
process tree, and the served engine's calls (`ServedEngine`)."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil


def cli_args(kwargs: dict) -> list[str]:
    """`sglang.Engine` keyword arguments as `launch_server` flags (True: a bare flag, a dict: JSON)."""
    args = []
    for key, value in kwargs.items():
        flag = "--" + key.replace("_", "-")
        args += [flag] if value is True else [flag, json.dumps(value) if isinstance(value, dict) else str(value)]
    return args


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc: subprocess.Popen) -> None:
    """Kill what is left of the process tree (cleanup only)."""
    try:
        procs = [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


@contextlib.contextmanager
def sigterm_exits():
    """Inside, SIGTERM (`timeout`, `kill`) raises SystemExit, so the `finally` that stops the
    servers runs (main thread only). The servers run in sessions of their own (`launch`), which a
    signal to this process's group does not reach, and Python's default SIGTERM exits without
    unwinding: `timeout 2400 python benchmarks/adaptive.py` killed, or a `kill` of it, had left
    its two real-pair servers running, ~15 GB between them (`free`), on a 23 GB machine."""

    def exit_(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, exit_)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def wait_bound(proc: subprocess.Popen, log_path: Path, port: int, timeout: float) -> bool:
    """Whether launch_server bound its port: False once its log says the port was already in use
    (SGLang's scheduler then runs on without a server), True once uvicorn (or sglang-router) says
    it runs, or the server exits for another reason, or `timeout` passes (a health wait then
    reports)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = Path(log_path).read_text(errors="replace")
        if "address already in use" in log:
            return False
        bound = (
            f"Uvicorn running on http://127.0.0.1:{port}",
            f"Starting router on 127.0.0.1:{port}",
        )  # SGLang's, sglang-router's
        if any(line in log for line in bound) or proc.poll() is not None:
            return True
        time.sleep(0.5)
    return True


def launch(
    command: list[str], flags: dict, log_path: Path, env: dict | None = None, timeout: float = 180.0, cwd=None
) -> tuple[subprocess.Popen, str]:
    """`command` (e.g. [python, "-m", "sglang_cpu.launch_server"]) with `flags` (`cli_args`) on
    127.0.0.1 and a free port, output to `log_path`: (the process, its URL) once it bound the
    port; started again on a fresh port if the port was taken before the server bound it (by
    another process, or by one of SGLang's own random internal ports), 3 attempts."""
    for _ in range(3):
        port = free_port()
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                [*command, *cli_args({**flags, "host": "127.0.0.1", "port": port})],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
                start_new_session=True,
            )
        if wait_bound(proc, log_path, port, timeout):
            return proc, f"http://127.0.0.1:{port}"
        stop(proc)
    raise RuntimeError(f"the server found its port taken on 3 attempts: {log_path}")


def wait_healthy(
    proc: subprocess.Popen, url: str, log_path: Path, timeout: float = 180.0, path: str = "/health"
) -> None:
    """Until `url` + `path` answers 200 (sglang-router: "/readiness", which waits for healthy
    workers; its /health answers before it has any); RuntimeError (with the log's tail) if the
    server exits or `timeout` passes first."""
    import requests

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"server exited with {proc.returncode}:\n{Path(log_path).read_text(errors='replace')[-4000:]}"
            )
        try:
            if requests.get(url + path, timeout=2).status_code == 200:
                return
        except (requests.ConnectionError, requests.Timeout):
            pass  # not listening yet, or too busy starting up to answer
        time.sleep(1.0)
    raise RuntimeError(f"server not healthy after {timeout}s:\n{Path(log_path).read_text(errors='replace')[-4000:]}")


class ServedEngine:
    """A launched server's HTTP API as the two `sglang.Engine` calls the benchmarks make:
    `generate` (one /generate request; an HTTP error raises) and `get_server_info`."""

    def __init__(self, url: str):
        self.url = url

    def generate(self, input_ids, sampling_params):
        import requests

        reply = requests.post(
            self.url + "/generate", json={"input_ids": input_ids, "sampling_params": sampling_params}, timeout=3600
        )
        reply.raise_for_status()
        return reply.json()

    def get_server_info(self) -> dict:
        import requests

        return requests.get(self.url + "/server_info", timeout=60).json()
