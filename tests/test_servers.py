"""support.servers: a SIGTERM to a process that launched servers stops them (`sigterm_exits`).

Real processes: a parent that `launch`es a stand-in server (a Python process that prints
uvicorn's line and sleeps, in a session of its own as every launched server is) and stops it in a
`finally`, as `benchmarks/adaptive.py`'s `served` does; the test sends the parent SIGTERM."""

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]

PARENT = textwrap.dedent(
    """
    import contextlib, sys, time
    from pathlib import Path
    from support.servers import launch, sigterm_exits, stop

    server = [sys.executable, "-c",
              "import sys, time; print('Uvicorn running on http://127.0.0.1:' + sys.argv[-1], flush=True); time.sleep(600)"]
    guard = sigterm_exits() if sys.argv[2] == "guarded" else contextlib.nullcontext()
    with guard:
        proc, url = launch(server, {}, Path(sys.argv[1]), timeout=60)
        try:
            print(proc.pid, flush=True)
            time.sleep(600)
        finally:
            stop(proc)
    """
)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _terminate_parent(tmp_path, mode: str) -> tuple[int, int]:
    """(the parent's exit code after SIGTERM, its server's pid)."""
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path / "server.log"), mode], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        server = int(parent.stdout.readline())
        assert _alive(server)
        parent.send_signal(signal.SIGTERM)
        code = parent.wait(timeout=30)
    finally:
        parent.kill()
    return code, server


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("mode", ["guarded", "bare"])
def test_sigterm_and_the_launched_server(tmp_path, mode):
    """Guarded: the parent exits 143 (128 + SIGTERM) through its `finally`, and its server is
    gone. Bare (the control, Python's default SIGTERM): the parent dies at once and the server,
    in its own session, runs on; that is what the guard is for."""
    code, server = _terminate_parent(tmp_path, mode)
    try:
        if mode == "guarded":
            assert code == 128 + signal.SIGTERM
            assert _gone_within(server, 10)
        else:
            assert code == -signal.SIGTERM
            assert not _gone_within(server, 2)
    finally:
        if _alive(server):
            psutil.Process(server).kill()
