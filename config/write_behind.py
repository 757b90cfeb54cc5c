"""Writes done after the answer has gone out: one thread per process runs them in the order they came.

The gateway records every request it serves: the routing decision, the request's spans, the cache entry
it may leave and the shadow run it may start. The caller needs none of that to read its answer, so the
gateway's HTTP view hands these writes to this thread and answers at once. Keel's own callers of the
gateway (eval runs, the demo) read what was written and still write before they go on.

Nothing is dropped:
- a full queue makes the caller run its writes itself, as if there were no thread (back-pressure);
- a step that fails because the database is unavailable is tried again, with growing pauses, until it
  succeeds; the writes behind it wait, so the order holds;
- at exit (gunicorn's graceful stop, SIGTERM) the queue is drained first, for at most
  `KEEL_WRITE_BEHIND_EXIT_SECONDS`. If writes are still waiting then (the database stayed down), their
  count is logged as an error.
A step that fails for any other reason is a bug: it is logged with its traceback and the next step runs.

A unit of work is a sequence of steps. Each step is retried on its own, so a step that succeeded is not
run again when a later one of the same unit fails.

The thread shares the process's interpreter lock with the requests. Its writes are mostly Python, so the
thread waits, before each unit, for a moment when a request of this process is waiting on something slow
(`waiting_on_io`: the gateway marks its model calls), and takes that time rather than a request's. It
waits at most `KEEL_WRITE_BEHIND_HOLD_MS`: with no such moment, the unit runs anyway. Only a unit with
none queued behind it waits; a backlog is written straight away.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence

from django.conf import settings
from django.db import close_old_connections, connection

from config.unavailable import DATABASE_UNAVAILABLE

logger = logging.getLogger("config.write_behind")

Step = Callable[[], object]
RETRY_PAUSES_SECONDS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0)  # then 5 s between tries, for as long as it takes


class WriteBehind:
    """The process's writer thread and its bounded queue. Started on first use in each process (a
    gunicorn worker forks after import; a thread does not survive the fork, so the pid is checked)."""

    def __init__(
        self,
        *,
        size: int,
        exit_seconds: float,
        hold_seconds: float = 0.0,
        pauses: Sequence[float] = RETRY_PAUSES_SECONDS,
    ) -> None:
        self.size = size
        self.exit_seconds = exit_seconds
        self.hold_seconds = hold_seconds
        self.pauses = tuple(pauses)
        self._lock = threading.Lock()
        self._io_waits = 0
        self._io_waiting = threading.Event()
        self._pid: int | None = None
        self._queue: queue.Queue[tuple[Step, ...]] = queue.Queue(maxsize=size)
        self.retries = 0  # database-unavailable failures retried, since the process started

    def submit(self, *steps: Step) -> bool:
        """Queue `steps` to run in order after the caller has gone on; returns False when the queue was full
        and the steps have run here instead (raising what they raise)."""
        writer_queue = self._started()
        try:
            writer_queue.put_nowait(steps)
        except queue.Full:
            logger.warning("config.write_behind_full", extra={"size": self.size})
            for step in steps:
                step()
            return False
        return True

    @contextlib.contextmanager
    def waiting_on_io(self) -> Iterator[None]:
        """Mark the calling thread as waiting on something slow (a model provider) for the block's length."""
        with self._lock:
            self._io_waits += 1
            self._io_waiting.set()
        try:
            yield
        finally:
            with self._lock:
                self._io_waits -= 1
                if not self._io_waits:
                    self._io_waiting.clear()

    def waiting(self) -> int:
        """Units queued or running."""
        return self._queue.unfinished_tasks

    def drain(self, timeout: float) -> int:
        """Wait up to `timeout` seconds for the queue to empty; returns the units still waiting."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.005)
        return self._queue.unfinished_tasks

    def _started(self) -> queue.Queue[tuple[Step, ...]]:
        pid = os.getpid()
        if self._pid != pid:
            with self._lock:
                if self._pid != pid:
                    if self._pid is not None:  # forked: the parent's thread and its queue are not ours
                        self._queue = queue.Queue(maxsize=self.size)
                    threading.Thread(target=self._run, name="keel-write-behind", daemon=True).start()
                    atexit.register(self._at_exit)
                    self._pid = pid
        return self._queue

    def _run(self) -> None:
        while True:
            steps = self._queue.get()
            if self.hold_seconds and self._queue.empty():
                # A unit alone waits for a good moment; a backlog is written at once (the hold would cap
                # the thread at one unit per hold when no request ever waits on a model).
                self._io_waiting.wait(self.hold_seconds)
            try:
                for step in steps:
                    self._step(step)
            finally:
                close_old_connections()  # as at the end of a request: CONN_MAX_AGE decides whether it stays
                self._queue.task_done()

    def _step(self, step: Step) -> None:
        tries = 0
        while True:
            close_old_connections()  # as Django does between requests: a broken connection is replaced
            try:
                step()
                return
            except DATABASE_UNAVAILABLE as error:
                pause = self.pauses[min(tries, len(self.pauses) - 1)]
                tries += 1
                self.retries += 1
                logger.warning(
                    "config.write_behind_retry", extra={"error": str(error)[:300], "tries": tries, "pause": pause}
                )
                connection.close()
                time.sleep(pause)
            except Exception:
                logger.exception("config.write_behind_failed")
                return

    def _at_exit(self) -> None:
        if self._pid != os.getpid():
            return
        left = self.drain(self.exit_seconds)
        if left:
            logger.error("config.write_behind_lost_at_exit", extra={"units": left})


writer = WriteBehind(
    size=settings.KEEL_WRITE_BEHIND_QUEUE_SIZE,
    exit_seconds=settings.KEEL_WRITE_BEHIND_EXIT_SECONDS,
    hold_seconds=settings.KEEL_WRITE_BEHIND_HOLD_MS / 1000,
)
