"""The load tests' Keel: gunicorn and a Celery worker started as `make run` starts them (bench/stack.py),
on the tests' database, once for the package; each test builds its own workspace in it.

CI runs the short variant; `KEEL_LOAD_FULL=1` runs the full one (two minutes of ingest at twice capacity,
a minute of gateway load), which `make bench` also runs (bench/bench_load.py) and reports."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from pytest_django import DjangoDbBlocker

from bench import load, stack

FULL = os.environ.get("KEEL_LOAD_FULL") == "1"
# Generous: each of Keel's processes peaks at about 330 MiB under these loads; a leak would cross this soon.
RSS_LIMIT_BYTES = 1536 * 2**20


@pytest.fixture(scope="package")
def keel(
    django_db_setup: None, django_db_blocker: DjangoDbBlocker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[load.Keel]:
    with django_db_blocker.unblock():
        environment = load.keel_environment_for_current_database(tmp_path_factory.mktemp("load") / "broker")
    port = stack.free_port()
    with stack.keel_running(environment, port, tag="load-test") as processes:
        running = load.Keel(port, processes, environment)
        yield running
        running.stop()
