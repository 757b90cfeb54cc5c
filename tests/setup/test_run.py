"""`make run`'s supervisor (config/run.py) as a person uses it: it prepares the database, starts web,
worker and beat, prints the URL, serves pages, and stops everything on Ctrl-C (SIGINT)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tracing import compiled

BASE_DIR = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _read_until(process: subprocess.Popen[str], needle: str, timeout: float) -> list[str]:
    assert process.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            if process.poll() is not None:
                break
            continue
        lines.append(line.rstrip())
        if needle in line:
            return lines
    raise AssertionError(f"{needle!r} never appeared; the supervisor printed:\n" + "\n".join(lines[-40:]))


def _command(pid: str) -> str:
    """web, worker or beat: what a child of `make run` is, from its command line."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return "web" if any(b"gunicorn" in part for part in argv) else argv[argv.index(b"config") + 1].decode()


def _niceness(pid: str) -> int:
    # /proc/<pid>/stat: the command is in parentheses; niceness is the 19th field.
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[16])


def test_make_run_serves_keel_and_ctrl_c_stops_every_process(tmp_path):
    port = _free_port()
    env = {
        **os.environ,
        # A broker of its own: the tests' processes send their tasks to the default one (var/broker), and a
        # worker of this run that took one was stopped mid-task by the Ctrl-C (a traceback, once in CI).
        "KEEL_BROKER_DIR": str(tmp_path / "broker"),
        "KEEL_WEB_WORKERS": "1",
        "KEEL_WEB_THREADS": "2",
        "KEEL_WORKER_CONCURRENCY": "1",
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)  # `make run` runs the local settings, not the test ones
    process = subprocess.Popen(
        [sys.executable, "-m", "config.run", "--no-seed", "--port", str(port)],
        cwd=BASE_DIR,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        printed = _read_until(process, "Keel is running at", timeout=300)
        assert any(f"http://127.0.0.1:{port}/" in line for line in printed)
        assert any(f"keel | ingest pipeline: {compiled.describe()}" in line for line in printed)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/login/", timeout=30) as response:
            assert response.status == 200
            assert b"Keel" in response.read()
        children = subprocess.run(["pgrep", "-P", str(process.pid)], capture_output=True, text=True).stdout.split()
        assert len(children) == 3  # web, the Celery worker, beat
        # The worker runs KEEL_WORKER_NICE (10) nicer than the rest, so the web answers first.
        niceness = {_command(pid): _niceness(pid) for pid in children}
        assert niceness["worker"] == niceness["web"] + 10 == niceness["beat"] + 10

        process.send_signal(signal.SIGINT)
        rest = _read_until(process, "stopped", timeout=60)
        assert process.wait(timeout=30) == 0
        for pid in children:  # each child is gone, not orphaned
            assert subprocess.run(["kill", "-0", pid], capture_output=True).returncode != 0
        assert not any("Traceback" in line for line in printed + rest)
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", port)) != 0  # nothing listens any more
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        assert process.stdout is not None
        process.stdout.close()
