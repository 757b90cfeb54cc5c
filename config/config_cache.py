"""What the gateway reads on every request and span ingest for every batch, and people change rarely (API
keys, agents and their production prompt versions, guardrail policies, budgets, model targets and prices,
triage settings, Langfuse mirrors), kept in each process and kept exact by PostgreSQL's LISTEN/NOTIFY.

A trigger on each table these reads depend on (`keel_config_changed`, in the migrations of the apps that
own the tables) sends a notification on the `keel_config` channel when a row changes; PostgreSQL delivers
it when the change commits. Each process that caches runs one listener thread, on a database connection
of its own, and every notification empties all of the process's caches at once: config changes are rare,
and one rule for all of them leaves nothing to get wrong.

Reads go to the database, as if there were no cache:
- until the listener is listening, and from any error of its connection until it listens again (it
  reconnects, with growing pauses). Anything cached before is dropped then: notifications may have been missed;
- inside a transaction (`atomic`): the transaction may have changed what it reads, and no other process
  can see that yet, nor can the cache. Except in a transaction opened with `config_free_transaction()`,
  which says it writes none of what is kept, for the caches that may serve such reads
  (`NotifiedCache(in_transactions=True)`);
- with `KEEL_CONFIG_CACHE` off (the tests turn it off, except those of the cache itself, which commit).

A read that was under way when a notification arrived is not kept: it may have seen the row before the
change. A change is therefore seen by every process once its notification has arrived. The listener
also checks its connection every `LISTENER_PING_SECONDS`, so a connection that died silently stops the
caching within that time.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterator
from typing import Final, Generic, TypeVar

import psycopg
from django.conf import settings
from django.db import connections, transaction

from config.process_cache import TtlCache

logger = logging.getLogger("config.config_cache")

CHANNEL: Final = "keel_config"
LISTENER_PING_SECONDS: Final = 5.0
WAIT_SECONDS: Final = 0.5  # how long the thread waits for a notification before it checks whether to stop
RECONNECT_PAUSES_SECONDS: Final = (0.1, 0.5, 1.0, 2.0, 5.0)

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

# The trigger function the apps' migrations attach to their tables. Its arguments name columns whose change
# alone is not a change of config (an API key's `last_used_at`).
TRIGGER_FUNCTION_SQL: Final = f"""
CREATE OR REPLACE FUNCTION keel_config_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND TG_NARGS > 0
       AND (to_jsonb(OLD) - TG_ARGV::text[]) = (to_jsonb(NEW) - TG_ARGV::text[]) THEN
        RETURN NULL;
    END IF;
    PERFORM pg_notify('{CHANNEL}', TG_TABLE_NAME);
    RETURN NULL;
END
$$;
"""
TRIGGER_FUNCTION_DROP_SQL: Final = "DROP FUNCTION IF EXISTS keel_config_changed();"


def trigger_sql(table: str, *, ignored_columns: tuple[str, ...] = ()) -> str:
    """The statements that make changes to `table` notify the caches (for a migration's RunSQL)."""
    arguments = ", ".join(f"'{column}'" for column in ignored_columns)
    return (
        f'CREATE TRIGGER keel_config_changed AFTER INSERT OR UPDATE OR DELETE ON "{table}" '
        f"FOR EACH ROW EXECUTE FUNCTION keel_config_changed({arguments}); "
        f'CREATE TRIGGER keel_config_truncated AFTER TRUNCATE ON "{table}" '
        "FOR EACH STATEMENT EXECUTE FUNCTION keel_config_changed();"
    )


def trigger_drop_sql(table: str) -> str:
    return (
        f'DROP TRIGGER IF EXISTS keel_config_changed ON "{table}"; '
        f'DROP TRIGGER IF EXISTS keel_config_truncated ON "{table}";'
    )


class Listener:
    """The process's listener thread. `generation` grows with every notification and every (re)connection;
    what was read under an older generation is stale. Started on first use in each process (a gunicorn
    worker forks after import, and a thread does not survive the fork, so the pid is checked)."""

    def __init__(self, *, database: str = "default") -> None:
        self.database = database
        self.generation = 0
        self.notifications = 0  # received since the process started
        self.tables: deque[str] = deque(maxlen=100)  # the tables named by the last notifications
        self.backend_pid: int | None = None  # the listener's PostgreSQL backend, while it listens
        self._listening = threading.Event()
        self._stopping = threading.Event()
        self._lock = threading.RLock()
        self._pid: int | None = None
        self._thread: threading.Thread | None = None

    def listening(self) -> bool:
        """True while the cache may be used (the thread is started here if it is not running)."""
        if self._pid != os.getpid():
            self._start()
            return False
        return self._listening.is_set()

    def wait_listening(self, timeout: float) -> bool:
        self.listening()
        return self._listening.wait(timeout)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and close its connection (a test database cannot be dropped while it is open)."""
        with self._lock:
            stopping, thread = self._stopping, self._thread
            stopping.set()
            self._pid, self._thread = None, None
            self._forget()
        if thread is not None and thread.ident is not None:
            thread.join(timeout)

    def _start(self) -> None:
        with self._lock:
            pid = os.getpid()
            if self._pid == pid:
                return
            # Each thread has a stop event of its own: one being stopped cannot be revived by the next.
            self._stopping = threading.Event()
            self._forget()
            self._thread = threading.Thread(
                target=self._run, args=(self._stopping,), name="keel-config-listener", daemon=True
            )
            self._pid = pid
            self._thread.start()

    def _forget(self) -> None:
        with self._lock:
            self._listening.clear()
            self.backend_pid = None
            self._bump()

    def _bump(self) -> None:
        with self._lock:
            self.generation += 1

    def _connect(self) -> psycopg.Connection[object]:
        parameters = connections[self.database].get_connection_params()
        parameters.pop("cursor_factory", None)
        parameters.pop("context", None)
        return psycopg.connect(**parameters, autocommit=True)

    def _run(self, stopping: threading.Event) -> None:
        failures = 0
        while not stopping.is_set():
            try:
                with self._connect() as connection:
                    connection.execute(f"LISTEN {CHANNEL}")
                    with self._lock:
                        if stopping.is_set():
                            return
                        self._forget()  # anything cached before may have missed a change
                        self.backend_pid = connection.info.backend_pid
                        self._listening.set()
                    failures = 0
                    self._listen(connection, stopping)
            except Exception as error:  # noqa: BLE001 - whatever stops the listening stops the caching too
                with self._lock:
                    if not stopping.is_set():
                        self._forget()
                pause = RECONNECT_PAUSES_SECONDS[min(failures, len(RECONNECT_PAUSES_SECONDS) - 1)]
                failures += 1
                logger.warning("config.config_cache_listener_lost", extra={"error": str(error)[:300], "pause": pause})
                stopping.wait(pause)

    def _listen(self, connection: psycopg.Connection[object], stopping: threading.Event) -> None:
        pinged = time.monotonic()
        while not stopping.is_set():
            for notification in connection.notifies(timeout=WAIT_SECONDS, stop_after=1):
                self._bump()
                self.tables.append(notification.payload)
                self.notifications += 1
            if time.monotonic() - pinged >= LISTENER_PING_SECONDS:
                connection.execute("SELECT 1")  # a connection that died silently raises here
                pinged = time.monotonic()


listener = Listener()


class _ConfigFree(threading.local):
    depth = 0  # how many config_free_transaction() blocks the thread is in, outermost transactions only


_config_free = _ConfigFree()


@contextlib.contextmanager
def config_free_transaction(using: str = "default") -> Iterator[None]:
    """`transaction.atomic()` for work that writes none of what the caches keep (span ingest: spans,
    trajectories, routing decisions), so that caches made with `in_transactions=True` serve its reads.
    Opened inside another transaction, it is an ordinary savepoint and those reads go to the database:
    the outer transaction may have written what they read. A draft agent that ingest creates for a
    trace is the exception: the ingest keeps track of it itself, and a cache entry read after it is
    never wrong (if the transaction rolls back, no trace refers to that agent)."""
    outermost = not connections[using].in_atomic_block
    with transaction.atomic(using=using):
        if not outermost:
            yield
            return
        _config_free.depth += 1
        try:
            yield
        finally:
            _config_free.depth -= 1


class NotifiedCache(Generic[K, V]):
    """At most `size` values, each valid for the generation of the listener it was read under; the least
    recently used goes first when full (config/process_cache.py keeps them). Safe to share between a
    process's threads. Values are shared by every caller: keep only what callers read and never change (or
    copy it on the way out).

    `in_transactions`: kept values serve reads inside a `config_free_transaction()` too (span ingest reads
    prices, prompts, agents and triage settings in the transaction that stores the spans)."""

    def __init__(self, *, size: int, source: Listener | None = None, in_transactions: bool = False) -> None:
        self.source = source or listener
        self.in_transactions = in_transactions
        self._entries: TtlCache[K, tuple[int, V]] = TtlCache(seconds=math.inf, size=size)

    def get(self, key: K, read: Callable[[], V]) -> V:
        """The value for `key`: kept, or `read()` now (and kept, when nothing changed while reading)."""
        if not settings.KEEL_CONFIG_CACHE:
            return read()
        if connections[self.source.database].in_atomic_block and not (self.in_transactions and _config_free.depth):
            return read()
        if not self.source.listening():
            return read()
        generation = self.source.generation
        found = self._entries.get(key)
        if found is not None and found[0] == generation:
            return found[1]
        value = read()
        # Kept under the generation it was read in: a notification (or a lost listener) since has moved the
        # generation on, and the entry is never returned.
        self._entries.put(key, (generation, value))
        return value
