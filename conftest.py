"""Fixtures shared by every test package."""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from pytest_django import DjangoDbBlocker

if TYPE_CHECKING:
    from agent_registry.models import Workspace
    from tests.demo_snapshot import DemoSnapshot

# Playwright's sync API runs an event loop in the test thread; Django's ORM must still be callable.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM_PATH = os.environ.get("KEEL_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--disable-quic",
]


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    """Debian's Chromium; Playwright cannot download its own browser here."""
    return {**browser_type_launch_args, "executable_path": CHROMIUM_PATH, "args": CHROMIUM_ARGS}


@pytest.fixture
def config_listener(settings):
    """The process's config cache switched on for one test (config/config_cache.py; off in tests)."""
    from config import config_cache

    settings.KEEL_CONFIG_CACHE = True
    assert config_cache.listener.wait_listening(10)
    yield config_cache.listener
    config_cache.listener.stop()  # its connection would keep the test database from being dropped


@pytest.fixture(scope="session")
def demo_snapshot(
    django_db_setup: None, django_db_blocker: DjangoDbBlocker, tmp_path_factory: pytest.TempPathFactory
) -> DemoSnapshot:
    """The demo as `make run` seeds it, seeded once per pytest worker and kept (tests/demo_snapshot.py)."""
    from tests.demo_snapshot import DemoSnapshot

    with django_db_blocker.unblock():
        return DemoSnapshot.take(tmp_path_factory.mktemp("demo-snapshot-media"))


@pytest.fixture(scope="module")
def demo_workspace(demo_snapshot: DemoSnapshot, django_db_blocker: DjangoDbBlocker) -> Iterator[Workspace]:
    """The demo workspace as `make run` seeds it (this worker's seed, written back: tests/demo_snapshot.py),
    in a transaction that is rolled back when the module's last test ends. Each test of the module runs in a
    savepoint of it (pytest-django's `django_db`), as Django's TestCase runs after setUpTestData, so what
    one test changes the next does not see."""
    from django.db import transaction
    from django.test import override_settings

    with django_db_blocker.unblock(), override_settings(MEDIA_ROOT=demo_snapshot.media), transaction.atomic():
        yield demo_snapshot.restore()
        transaction.set_rollback(True)


@pytest.fixture
def workspace(db):
    from agent_registry.tests.factories import WorkspaceFactory

    return WorkspaceFactory(slug="acme", name="Acme")


@pytest.fixture
def other_workspace(db):
    from agent_registry.tests.factories import WorkspaceFactory

    return WorkspaceFactory(slug="globex", name="Globex")


@pytest.fixture
def api_client_for():
    """A Django test client that sends `Authorization: Bearer <key>` for a new key of the workspace."""
    from django.test import Client

    from agent_registry import services

    def make(workspace, scopes=("read", "write"), agents=()):
        _, raw_key = services.apikey_create(workspace=workspace, name="test key", scopes=list(scopes), agents=agents)
        return Client(headers={"Authorization": f"Bearer {raw_key}"})

    return make


@pytest.fixture(autouse=True)
def _one_process_test_at_a_time(request: pytest.FixtureRequest, testrun_uid: str) -> Iterator[None]:
    """`make test` runs two pytest workers. Tests marked `processes` start Celery workers on the shared Redis
    database and RabbitMQ vhost, or put Keel under load: two at once would consume each other's messages or
    starve each other's timing, so each holds a lock, shared by the run's workers, while it runs. (pytest-xdist's
    `--dist loadgroup` would send them to one worker, but it renames tests in a way pytest 9 ignores.)"""
    if request.node.get_closest_marker("processes") is None:
        yield
        return
    with (Path(tempfile.gettempdir()) / f"keel-process-tests-{testrun_uid}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    """Tests that commit (transactional ones, and everything on `live_server`: browser tests, the
    examples, real Celery workers) truncate every table when they end, migration data included. Run
    them after the tests that roll back, so that those still see what migrations wrote (beat schedules).
    pytest-django orders by the django_db marker only and misses `live_server`."""

    def commits(item):
        marker = item.get_closest_marker("django_db")
        transactional = bool(marker and (marker.kwargs.get("transaction") or (marker.args and marker.args[0])))
        return (
            transactional
            or "live_server" in getattr(item, "fixturenames", ())
            or "transactional_db" in getattr(item, "fixturenames", ())
        )

    items[:] = sorted(items, key=commits)  # stable: each group keeps its order
