"""The servers a benchmark runs against: its own embedded PostgreSQL, Keel's web and worker, Phoenix.

Benchmarks never touch the shared server in var/pg that tests and `make run` use: they start a second
embedded PostgreSQL in var/bench/pg (its own socket, in that directory), give each benchmark a
database of its own there, and stop that server when they are done.
Keel's processes are started as `make run` (config/run.py) starts them: gunicorn with
KEEL_WEB_WORKERS × KEEL_WEB_THREADS (2 × 4) and a prefork Celery worker with KEEL_WORKER_CONCURRENCY
(2) on the filesystem broker, here in a broker directory of the benchmark's own. Beat is not started:
its only ingest job, the sweeper, re-sends batches that waited more than a minute, which would add
duplicate (no-op) messages to a benchmark's backlog.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from bench.harness import BASE_DIR, VAR_DIR
from config.run import web_argv, worker_nice

warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR")

PGDATA = VAR_DIR / "pg"
LOG_DIR = VAR_DIR / "logs"
BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class Database:
    socket_dir: str
    port: int
    name: str

    def connect_kwargs(self) -> dict[str, object]:
        return {"host": self.socket_dir, "port": self.port, "user": "postgres", "dbname": self.name}

    def conninfo(self) -> str:
        return f"host={self.socket_dir} port={self.port} user=postgres dbname={self.name}"


def server_start() -> tuple[str, int]:
    """Start (or attach to) the benchmarks' own embedded PostgreSQL; returns its socket dir and port."""
    from config import embedded_postgres

    server = embedded_postgres.server_start(PGDATA)
    return server.socket_dir, server.port


def server_stop() -> None:
    from config import embedded_postgres

    with contextlib.suppress(Exception):
        embedded_postgres.server_stop(PGDATA)


def database_fresh(name: str) -> Database:
    """Drop and create `name` on the benchmarks' server."""
    import psycopg
    from psycopg import sql

    socket_dir, port = server_start()
    with psycopg.connect(host=socket_dir, port=port, user="postgres", dbname="postgres", autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return Database(socket_dir, port, name)


def database_existing(name: str) -> Database | None:
    import psycopg

    socket_dir, port = server_start()
    with psycopg.connect(host=socket_dir, port=port, user="postgres", dbname="postgres", autocommit=True) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
    return Database(socket_dir, port, name) if found else None


def keel_environment(database: Database, broker_dir: Path) -> dict[str, str]:
    """The environment of every Keel process of a benchmark: its database, its broker, no debug."""
    environment = {
        key: value
        for key, value in os.environ.items()
        if key not in ("DATABASE_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND")
    }
    environment.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings.local",
            "DJANGO_DEBUG": "false",
            "KEEL_PGDATA": str(PGDATA),
            "KEEL_DATABASE_NAME": database.name,
            "KEEL_BROKER_DIR": str(broker_dir),
            "KEEL_LOG_LEVEL": "WARNING",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
    )
    return environment


def django_setup(environment: Mapping[str, str]) -> None:
    """Configure Django in this process for the benchmark's database (once per process)."""
    os.environ.update(environment)
    import django

    django.setup()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def wait_for_http(port: int, path: str, timeout: float) -> bool:
    import http.client

    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        # A server that is up answers however busy the machine is: wait for the answer as long as the
        # deadline allows (a short timeout made a loaded machine send probe after probe, each one
        # giving up before its answer and adding to the load).
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=left)
        try:
            connection.request("GET", path)
            connection.getresponse().read()
            return True
        except OSError:
            time.sleep(0.3)
        finally:
            connection.close()
    return False


@dataclass
class Processes:
    """Child processes started in their own process groups, stopped (TERM, then KILL) in order."""

    children: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)

    def start(
        self, name: str, argv: list[str], environment: Mapping[str, str], log: Path, *, nice: int = 0
    ) -> subprocess.Popen[bytes]:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as output:
            process = subprocess.Popen(
                argv,
                cwd=BASE_DIR,
                env=dict(environment),
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=functools.partial(os.nice, nice) if nice else None,
            )
        self.children.append((name, process))
        return process

    def pid(self, name: str) -> int:
        for child_name, process in self.children:
            if child_name == name:
                return process.pid
        raise KeyError(name)

    def alive(self) -> list[str]:
        return [name for name, process in self.children if process.poll() is None]

    def stop(self, timeout: float = 30.0) -> None:
        # TERM to each group's leader only, which stops its own children (gunicorn its workers, Celery its
        # pool). TERM to the whole group also reached Celery's pool processes, and one killed while it
        # held the pool's queue lock left the worker's main process waiting on that lock until the KILL below.
        for _, process in self.children:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for _, process in self.children:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self.children.clear()


def keel_migrate(environment: Mapping[str, str]) -> None:
    subprocess.run(
        [sys.executable, str(BASE_DIR / "manage.py"), "migrate", "--no-input", "-v", "0"],
        cwd=BASE_DIR,
        env=dict(environment),
        check=True,
    )


@contextlib.contextmanager
def keel_running(environment: Mapping[str, str], port: int, tag: str) -> Iterator[Processes]:
    """Keel's web and worker, as `make run` starts them, for the time of the block."""
    broker_dir = Path(environment["KEEL_BROKER_DIR"])
    shutil.rmtree(broker_dir, ignore_errors=True)
    processes = Processes()
    workers = environment.get("KEEL_WEB_WORKERS", "2")
    threads = environment.get("KEEL_WEB_THREADS", "4")
    concurrency = environment.get("KEEL_WORKER_CONCURRENCY", "2")
    try:
        processes.start(
            "web",
            web_argv("127.0.0.1", port, workers=workers, threads=threads),
            environment,
            LOG_DIR / f"{tag}-web.log",
        )
        processes.start(
            "worker",
            [str(BIN / "celery"), "-A", "config", "worker", "-l", "warning", "-c", concurrency],
            environment,
            LOG_DIR / f"{tag}-worker.log",
            nice=worker_nice(environment),
        )
        if not wait_for_http(port, "/api/v1/openapi.json", timeout=60):
            raise RuntimeError(f"Keel's web server did not answer on port {port}; see {LOG_DIR}")
        yield processes
    finally:
        processes.stop()


def process_tree(pid: int) -> list[int]:
    """`pid` and all its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, queue = [], [pid]
    while queue:
        current = queue.pop()
        found.append(current)
        queue.extend(children.get(current, ()))
    return found


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of the live processes among `pids` (their exited children included)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # utime, stime, cutime, cstime are fields 14-17 of stat (11-14 after the name).
        total += sum(int(value) for value in fields[11:15]) / ticks
    return total


def postmaster_pid() -> int | None:
    try:
        return int((PGDATA / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
