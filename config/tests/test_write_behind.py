"""The write-behind thread by itself: order, retries while the database is away, back-pressure, exit."""

from __future__ import annotations

import functools
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from django.db import OperationalError

from config.write_behind import WriteBehind

ROOT = Path(__file__).resolve().parents[2]


def _python(script: str) -> subprocess.CompletedProcess[str]:
    """`script` in a Python process of its own, with Keel's settings importable."""
    return subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings.test"},
        capture_output=True,
        text=True,
        timeout=60,
    )


def _writer(size: int = 10) -> WriteBehind:
    return WriteBehind(size=size, exit_seconds=5, pauses=(0.001,))


def test_steps_run_in_the_order_they_came_after_submit_returns():
    writer = _writer()
    gate = threading.Event()
    done: list[str] = []

    assert writer.submit(gate.wait, lambda: done.append("a1"), lambda: done.append("a2")) is True
    assert writer.submit(lambda: done.append("b")) is True
    assert done == []  # the caller went on; the thread waits at the gate
    assert writer.waiting() == 2

    gate.set()
    assert writer.drain(5) == 0
    assert done == ["a1", "a2", "b"]


def test_a_step_the_database_refuses_is_tried_again_alone_and_the_next_units_wait():
    writer = _writer()
    done: list[str] = []
    failures = iter([OperationalError("server closed the connection"), OperationalError("starting up"), None])

    def flaky() -> None:
        error = next(failures)
        if error is not None:
            raise error
        done.append("flaky")

    writer.submit(lambda: done.append("before"), flaky, lambda: done.append("after"))
    writer.submit(lambda: done.append("next unit"))

    assert writer.drain(5) == 0
    assert done == ["before", "flaky", "after", "next unit"]  # `before` ran once
    assert writer.retries == 2


def test_a_full_queue_makes_the_caller_run_its_steps_itself():
    writer = _writer(size=1)
    gate = threading.Event()
    ran_in: list[str] = []
    taken = threading.Event()
    writer.submit(taken.set, gate.wait)
    assert taken.wait(5)  # the thread holds this unit and waits at the gate
    writer.submit(lambda: ran_in.append("queued"))  # fills the queue

    assert writer.submit(lambda: ran_in.append(threading.current_thread().name)) is False
    assert ran_in == [threading.current_thread().name]

    gate.set()
    assert writer.drain(5) == 0
    assert ran_in[-1] == "queued"


def test_a_step_that_fails_otherwise_is_logged_and_the_rest_go_on(caplog):
    writer = _writer()
    done: list[str] = []

    def broken() -> None:
        raise ValueError("a bug")

    with caplog.at_level(logging.ERROR, logger="config.write_behind"):
        writer.submit(broken, lambda: done.append("after"))
        assert writer.drain(5) == 0

    assert done == ["after"]
    assert [record.message for record in caplog.records] == ["config.write_behind_failed"]
    assert caplog.records[0].exc_info is not None
    assert writer.retries == 0


def test_a_unit_waits_for_a_request_to_be_waiting_on_io_but_no_longer_than_the_hold():
    writer = WriteBehind(size=10, exit_seconds=5, hold_seconds=60)
    done = threading.Event()
    writer.submit(done.set)
    assert not done.wait(0.2)  # no request is waiting on a provider: the unit holds back

    with writer.waiting_on_io():
        assert done.wait(5)

    short = WriteBehind(size=10, exit_seconds=5, hold_seconds=0.05)
    done_anyway = threading.Event()
    short.submit(done_anyway.set)
    assert done_anyway.wait(5)  # with no such moment it runs once the hold is over


def test_a_backlog_is_written_without_waiting_for_such_moments():
    writer = WriteBehind(size=100, exit_seconds=5, hold_seconds=60)
    taken, gate = threading.Event(), threading.Event()
    with writer.waiting_on_io():
        writer.submit(taken.set, gate.wait)
        assert taken.wait(5)
    done: list[int] = []
    for number in range(20):
        writer.submit(functools.partial(done.append, number))
    gate.set()

    # Nobody waits on a provider now; only the last unit, alone in the queue, holds back.
    for _ in range(100):
        if len(done) >= 19:
            break
        time.sleep(0.05)
    assert done == list(range(19))
    with writer.waiting_on_io():
        assert writer.drain(5) == 0
    assert done == list(range(20))


def test_a_forked_process_starts_its_own_thread_and_queue():
    writer = _writer()
    writer.submit(lambda: None)
    assert writer.drain(5) == 0
    parent_queue = writer._queue
    writer._pid = -1  # what a child sees after fork: the pid it started under is not its own

    done: list[str] = []
    writer.submit(lambda: done.append("child"))

    assert writer.drain(5) == 0
    assert done == ["child"]
    assert writer._queue is not parent_queue


def test_at_exit_the_process_waits_for_its_waiting_writes(tmp_path):
    """What a gunicorn worker does on SIGTERM: its last answers' records are written before it ends."""
    out = tmp_path / "written.txt"
    script = f"""
import time
from config.write_behind import WriteBehind

writer = WriteBehind(size=100, exit_seconds=10, pauses=(0.01,))

def write(number):
    time.sleep(0.05)
    with open({str(out)!r}, "a") as file:
        file.write(f"{{number}}\\n")

for number in range(20):
    writer.submit(lambda number=number: write(number))
print("submitted", writer.waiting())
"""
    result = _python(script)

    assert result.returncode == 0, result.stderr
    assert int(result.stdout.split()[1]) > 0  # the process ended with writes still waiting...
    assert out.read_text().split() == [str(number) for number in range(20)]  # ...and they were all written


def test_writes_still_waiting_when_the_exit_time_runs_out_are_logged_as_lost(tmp_path):
    script = """
import logging, threading
from config.write_behind import WriteBehind

logging.basicConfig(level=logging.ERROR, format="%(message)s %(units)s")
writer = WriteBehind(size=10, exit_seconds=0.2)
writer.submit(threading.Event().wait)
writer.submit(lambda: None)
"""
    result = _python(script)

    assert result.returncode == 0, result.stderr
    assert "config.write_behind_lost_at_exit 2" in result.stderr
