"""`make run`: prepare the database and start web, Celery worker and beat; Ctrl-C stops them all.

    python -m config.run [--host 127.0.0.1] [--port 8000] [--no-seed]

Steps: start (or attach to) the embedded PostgreSQL unless DATABASE_URL is set, migrate, collect
static files, seed the demo workspace, then supervise three processes. Each child runs in its own
process group so that Ctrl-C reaches only this supervisor, which stops the web server first (no new
work), then beat, then the worker (a warm shutdown finishes the task in hand), then the embedded
database. If any child exits on its own, everything stops and the exit code says so.
"""

from __future__ import annotations

import argparse
import functools
import http.client
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

BASE_DIR = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
WEB_START_TIMEOUT = 180.0  # seconds for the web server's first answer


@dataclass
class Child:
    name: str
    argv: list[str]
    nice: int = 0  # added to the process's niceness: lower priority for the CPU
    process: subprocess.Popen[bytes] | None = field(default=None)


def worker_nice(environment: Mapping[str, str]) -> int:
    """How much nicer than the web server the worker runs (KEEL_WORKER_NICE)."""
    return int(environment.get("KEEL_WORKER_NICE", "10"))


def _niced(increment: int) -> Callable[[], object] | None:
    """What a child runs before its program: `os.nice(increment)`, or nothing for 0."""
    return functools.partial(os.nice, increment) if increment else None


def _say(message: str) -> None:
    print(f"keel | {message}", flush=True)


def _manage(*args: str) -> None:
    subprocess.run([sys.executable, str(BASE_DIR / "manage.py"), *args], check=True, cwd=BASE_DIR)


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def _serving(host: str, port: int, web: Child, stopping: Callable[[], bool], timeout: float) -> bool:
    """Whether the web server answers a page (the login page) within `timeout` seconds. Gunicorn listens
    before its worker has loaded Keel, and on a busy machine that load takes seconds: a URL printed when
    the port opens would hang in the first browser that follows it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not stopping():
        assert web.process is not None
        if web.process.poll() is not None:
            return False
        page = http.client.HTTPConnection(host, port, timeout=max(1.0, deadline - time.monotonic()))
        try:
            page.request("GET", "/login/")
            page.getresponse().read()
            return True  # any answer: the server is up
        except (OSError, http.client.HTTPException):  # not listening yet, or no answer in time
            time.sleep(0.2)
        finally:
            page.close()
    return False


def web_argv(host: str, port: int, *, workers: str, threads: str) -> list[str]:
    """Gunicorn as `make run` starts it (the benchmarks start it so too), with Keel's hooks (config/gunicorn.py)."""
    return [
        str(BIN / "gunicorn"),
        "config.wsgi:application",
        "--config",
        "python:config.gunicorn",
        "--bind",
        f"{host}:{port}",
        "--workers",
        workers,
        "--threads",
        threads,
        "--access-logfile",
        "-",
        "--graceful-timeout",
        "10",
    ]


def _children(host: str, port: int) -> list[Child]:
    workers = os.environ.get("KEEL_WEB_WORKERS", "2")
    threads = os.environ.get("KEEL_WEB_THREADS", "4")
    concurrency = os.environ.get("KEEL_WORKER_CONCURRENCY", "2")
    return [
        Child("web", web_argv(host, port, workers=workers, threads=threads)),
        # The worker yields the CPU to the web process: on one machine, a caller waiting for an answer comes
        # before a backlog of spans (bench/RESULTS.md, bench_gateway; ingest answers 429 when the backlog
        # outgrows what the worker stores).
        Child(
            "worker",
            [str(BIN / "celery"), "-A", "config", "worker", "-l", "info", "-c", concurrency],
            nice=worker_nice(os.environ),
        ),
        Child("beat", [str(BIN / "celery"), "-A", "config", "beat", "-l", "info"]),
    ]


def _stop(children: list[Child], timeout: float = 20.0) -> None:
    for child in children:
        if child.process is not None and child.process.poll() is None:
            _say(f"stopping {child.name}")
            child.process.send_signal(signal.SIGTERM)
            try:
                child.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _say(f"{child.name} did not stop in {timeout:.0f} s; killing it")
                child.process.kill()
                child.process.wait()


def _embedded_database_stop(children: list[Child]) -> None:
    """Stop the embedded PostgreSQL, unless Keel processes this run did not start (a test run, a
    shell) still use it: the server is shared by every Keel process on the machine."""
    from django.conf import settings

    from config import embedded_postgres

    if not settings.DATABASE_EMBEDDED:
        return
    ours = {os.getpid(), *(child.process.pid for child in children if child.process is not None)}
    others = embedded_postgres.attached_processes(settings.EMBEDDED_DATA_DIR, ignore=ours)
    if others:
        _say(f"left the embedded PostgreSQL running: {len(others)} other Keel process(es) use it")
    elif embedded_postgres.server_stop(settings.EMBEDDED_DATA_DIR):
        _say("stopped the embedded PostgreSQL")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default=os.environ.get("KEEL_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("KEEL_PORT", "8000")))
    parser.add_argument("--no-seed", action="store_true", help="do not create the demo workspace")
    options = parser.parse_args(argv)

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
    os.environ.setdefault("KEEL_PUBLIC_URL", f"http://{options.host}:{options.port}")
    # `make run` serves Keel as people use it: Keel's own error pages, no per-query debug bookkeeping.
    os.environ.setdefault("DJANGO_DEBUG", "false")
    import django

    django.setup()
    from django.conf import settings

    if not _port_free(options.host, options.port):
        _say(f"port {options.port} on {options.host} is taken; stop what runs there or pass --port / KEEL_PORT")
        return 2

    started = time.monotonic()
    _say(
        "database: "
        + (
            "embedded PostgreSQL in " + str(settings.EMBEDDED_DATA_DIR)
            if settings.DATABASE_EMBEDDED
            else "DATABASE_URL"
        )
    )
    from tracing import compiled

    _say(f"ingest pipeline: {compiled.describe()}")
    _manage("migrate", "--no-input", "-v", "0")
    _manage("collectstatic", "--no-input", "-v", "0")
    if not options.no_seed:
        _manage("seed_demo")
    if settings.KEEL_MODEL_TARGETS:
        _manage("modeltargets_sync")  # the operator's model targets, in every workspace
    _say(f"prepared in {time.monotonic() - started:.1f} s")

    children = _children(options.host, options.port)
    stopping = False

    def request_stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)

    exit_code = 0
    try:
        for child in children:
            child.process = subprocess.Popen(
                child.argv, cwd=BASE_DIR, start_new_session=True, preexec_fn=_niced(child.nice)
            )
        url = f"http://{options.host}:{options.port}/"
        if _serving(options.host, options.port, children[0], lambda: stopping, timeout=WEB_START_TIMEOUT):
            from agent_registry import demo

            _say("")
            _say(f"Keel is running at {url}")
            if not options.no_seed:
                _say(f"log in as {demo.DEMO_USERNAME} / {demo.DEMO_PASSWORD}")
            _say(f"API docs at {url}api/v1/docs · admin at {url}admin/ · Ctrl-C stops everything")
            _say("")
        elif not stopping:
            _say(f"the web server did not answer {url}login/ in {WEB_START_TIMEOUT:.0f} s")
        while not stopping:
            for child in children:
                assert child.process is not None
                code = child.process.poll()
                if code is not None:
                    _say(f"{child.name} exited with code {code}; stopping the others")
                    exit_code = code or 1
                    stopping = True
                    break
            time.sleep(0.3)
    finally:
        web, worker, beat = children
        _stop([web, beat, worker])  # no new requests, no new schedules, then finish the task in hand
        _embedded_database_stop(children)
    _say("stopped")
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
