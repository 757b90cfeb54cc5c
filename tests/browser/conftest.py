"""Fixtures of the browser tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
from django.db import connection
from pytest_django import DjangoDbBlocker
from pytest_django.live_server_helper import LiveServer

if TYPE_CHECKING:
    from tests.demo_snapshot import DemoSnapshot


@pytest.fixture(scope="session", autouse=True)
def _test_database_released(django_db_setup: None, django_db_blocker: DjangoDbBlocker) -> Iterator[None]:
    """End the sessions that the browser tests leave on the test database, so that it can be dropped.

    Two kinds outlive the tests. The live server answers Chromium's keep-alive connections in threads
    that keep their database session (CONN_MAX_AGE) until the socket closes, a moment after the page
    does. And once Playwright's event loop runs in the test thread, Django's connections (kept per
    context, not only per thread) are other objects than those of the tests that ran before it, so
    the earlier session is never closed. Depending on `django_db_setup` makes this run before the
    test database is dropped.
    """
    yield
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


@pytest.fixture
def seeded(live_server: LiveServer, demo_snapshot: DemoSnapshot, settings: Any) -> dict[str, Any]:
    """The demo workspace as `make run` seeds it (this worker's seed, written back: tests/demo_snapshot.py),
    and the live server's URL."""
    settings.MEDIA_ROOT = demo_snapshot.media
    return {"workspace": demo_snapshot.restore(), "url": live_server.url}
