"""Arize Phoenix, the peer the ingest benchmark compares Keel with.

Phoenix lives in a virtualenv of its own, var/bench/phoenix-venv (never in Keel's .venv: its
dependencies would fight Keel's pins). The first run creates it with `pip install
arize-phoenix[pg]==PHOENIX_VERSION` (the `pg` extra brings asyncpg, Phoenix's PostgreSQL driver).

Phoenix runs against a database on the benchmarks' embedded PostgreSQL, which listens on a unix
socket only. Phoenix hands PHOENIX_SQL_DATABASE_URL to SQLAlchemy's asyncpg dialect, which passes a
`host` query parameter through to asyncpg, and asyncpg reads a host that starts with `/` as the
directory of the socket: `postgresql://postgres@/<db>?host=<socket dir>` (port 5432 names the socket
file `.s.PGSQL.5432` there). No telemetry: PHOENIX_TELEMETRY_ENABLED=false, and
PHOENIX_ALLOW_EXTERNAL_RESOURCES=false, which also keeps Phoenix from fetching anything on its own.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator

from bench import stack
from bench.harness import VAR_DIR

PHOENIX_VERSION = "20.26.1"
VENV = VAR_DIR / "phoenix-venv"
HOME = VAR_DIR / "phoenix-home"


def installed_version() -> str | None:
    python = VENV / "bin" / "python"
    if not python.exists():
        return None
    result = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('arize-phoenix'), m.version('asyncpg'))"],
        capture_output=True,
        text=True,
        check=False,
    )
    return result.stdout.strip() or None


def ensure_installed() -> None:
    found = installed_version()
    if found and found.split()[0] == PHOENIX_VERSION:
        return
    print(f"installing arize-phoenix {PHOENIX_VERSION} into {VENV} (PyPI)", flush=True)
    if not (VENV / "bin" / "python").exists():
        interpreter = shutil.which("python3.11") or sys.executable
        subprocess.run([interpreter, "-m", "venv", str(VENV)], check=True)
    subprocess.run(
        [str(VENV / "bin" / "python"), "-m", "pip", "install", "--quiet", f"arize-phoenix[pg]=={PHOENIX_VERSION}"],
        check=True,
    )


def environment(database: stack.Database, port: int) -> dict[str, str]:
    values = {
        key: value for key, value in os.environ.items() if not key.startswith(("PHOENIX_", "OTEL_", "DJANGO_", "KEEL_"))
    }
    values.update(
        {
            "PHOENIX_SQL_DATABASE_URL": f"postgresql://postgres@/{database.name}?host={database.socket_dir}",
            "PHOENIX_TELEMETRY_ENABLED": "false",
            "PHOENIX_ALLOW_EXTERNAL_RESOURCES": "false",
            "PHOENIX_WORKING_DIR": str(HOME),
            "PHOENIX_HOST": "127.0.0.1",
            "PHOENIX_PORT": str(port),
            "PHOENIX_GRPC_PORT": str(stack.free_port()),
        }
    )
    return values


@contextlib.contextmanager
def running(database: stack.Database, port: int) -> Iterator[stack.Processes]:
    ensure_installed()
    HOME.mkdir(parents=True, exist_ok=True)
    processes = stack.Processes()
    try:
        processes.start(
            "phoenix",
            [str(VENV / "bin" / "phoenix"), "serve"],
            environment(database, port),
            stack.LOG_DIR / "phoenix.log",
        )
        if not stack.wait_for_http(port, "/healthz", timeout=180):
            raise RuntimeError(f"Phoenix did not answer on port {port}; see {stack.LOG_DIR / 'phoenix.log'}")
        yield processes
    finally:
        processes.stop()


def describe() -> str:
    versions = installed_version() or "not installed"
    phoenix_version, _, asyncpg_version = versions.partition(" ")
    return (
        f"Phoenix: arize-phoenix {phoenix_version} (asyncpg {asyncpg_version}) in var/bench/phoenix-venv, "
        "`phoenix serve` with its defaults (one uvicorn process; it answers 503 while its span queue is over "
        "PHOENIX_MAX_SPANS_QUEUE_SIZE, 20,000, which it checks before adding a request's spans), "
        "PHOENIX_SQL_DATABASE_URL=postgresql://postgres@/phoenix_bench?host=<socket dir> on the same embedded "
        "PostgreSQL, telemetry and external resources off. Phoenix answers 503 without Retry-After; the "
        "generator then waits 1 s."
    )
