"""A Celery task keeps its database connection the way a web request does (config/celery.py).

The worker's Django fix-up is installed here as `celery worker` installs it, and a task's prerun and
postrun signals are sent as the worker sends them around a task it executes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import signals
from celery.fixups.django import DjangoFixup
from django.db import connection

from agent_registry.tasks import worker_heartbeat_record
from config.celery import app

# close_old_connections would end a test's wrapping transaction; these tests commit.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def worker_fixup() -> Iterator[object]:
    fixup = DjangoFixup(app).worker_fixup.install()
    yield fixup
    signals.task_prerun.disconnect(fixup.on_task_prerun)
    signals.task_postrun.disconnect(fixup.on_task_postrun)
    signals.worker_process_init.disconnect(fixup.on_worker_process_init)
    signals.beat_embedded_init.disconnect(fixup.close_database)


def _connected(monkeypatch: pytest.MonkeyPatch, max_age: int) -> Any:
    connection.close()
    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", max_age)
    connection.ensure_connection()
    return connection.connection


def _task_run() -> int:
    """Run a task's body between the worker's signals; returns the PostgreSQL backend that served it."""
    task = worker_heartbeat_record
    signals.task_prerun.send(sender=task, task_id="t-1", task=task, args=(), kwargs={})
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (backend,) = cursor.fetchone()
    signals.task_postrun.send(sender=task, task_id="t-1", task=task, args=(), kwargs={}, retval=None, state="SUCCESS")
    assert isinstance(backend, int)
    return backend


def test_tasks_share_one_postgresql_session_while_conn_max_age_allows(worker_fixup, monkeypatch):
    opened = _connected(monkeypatch, 60)

    backends = {_task_run() for _ in range(3)}

    assert len(backends) == 1
    assert connection.connection is opened


def test_with_conn_max_age_zero_each_task_closes_its_connection(worker_fixup, monkeypatch):
    _connected(monkeypatch, 0)

    first = _task_run()
    assert connection.connection is None
    second = _task_run()

    assert first != second


def test_a_task_after_a_broken_connection_gets_a_new_one(worker_fixup, monkeypatch):
    opened = _connected(monkeypatch, 60)
    opened.close()  # the server went away under it
    connection.errors_occurred = True

    _task_run()

    assert connection.connection is not opened
    assert connection.is_usable()
