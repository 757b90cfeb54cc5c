"""The per-process config cache kept exact by LISTEN/NOTIFY (config/config_cache.py), on committed data:
the triggers notify only at commit, so these tests do not run in a rolled-back transaction."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from django.db import connection, transaction

from agent_registry import selectors as registry_selectors
from agent_registry import services as registry_services
from agent_registry.models import ApiKey, Workspace
from agent_registry.tests.factories import WorkspaceFactory
from config import config_cache

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def listener(settings) -> Iterator[config_cache.Listener]:
    settings.KEEL_CONFIG_CACHE = True
    assert config_cache.listener.wait_listening(10)
    yield config_cache.listener
    config_cache.listener.stop()  # its connection would keep the test database from being dropped


def _until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def _tables_since(listener: config_cache.Listener, since: int) -> list[str]:
    """The tables named by the notifications that arrived after the first `since`."""
    count = listener.notifications - since
    return list(listener.tables)[-count:] if count > 0 else []


def _notified_of(listener: config_cache.Listener, table: str, since: int) -> None:
    _until(lambda: table in _tables_since(listener, since))


def _quiet(listener: config_cache.Listener) -> None:
    """Wait until the notifications of what the test set up have arrived (none for 0.2 s)."""
    last, since = listener.notifications, time.monotonic()
    while time.monotonic() - since < 0.2:
        time.sleep(0.01)
        if listener.notifications != last:
            last, since = listener.notifications, time.monotonic()


@pytest.fixture
def key(listener) -> tuple[ApiKey, str]:
    api_key, raw_key = registry_services.apikey_create(
        workspace=WorkspaceFactory.create(), name="k", scopes=["gateway"]
    )
    _quiet(listener)
    return api_key, raw_key


def _live(prefix: str) -> ApiKey:
    found = registry_selectors.apikey_live_by_prefix(prefix=prefix)
    assert found is not None
    return found


def _queries(call: Callable[[], object]) -> int:
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        call()
    return len(captured.captured_queries)


def test_a_kept_key_is_read_without_a_query_until_it_is_revoked(listener, key):
    api_key, raw_key = key
    assert _queries(lambda: registry_services.apikey_authenticate(raw_key=raw_key)) >= 1
    assert _queries(lambda: registry_services.apikey_authenticate(raw_key=raw_key)) == 0  # kept

    since = listener.notifications
    registry_services.apikey_revoke(api_key=api_key)
    _notified_of(listener, "agent_registry_apikey", since)

    assert registry_services.apikey_authenticate(raw_key=raw_key) is None


def test_a_change_made_by_another_connection_empties_the_cache(listener, key):
    api_key, _ = key
    read = lambda: _live(api_key.prefix)  # noqa: E731
    assert read().workspace.name == api_key.workspace.name
    assert _queries(read) == 0

    since = listener.notifications
    with connection.cursor() as cursor:  # as another process would: plain SQL, committed
        cursor.execute("UPDATE agent_registry_workspace SET name = 'renamed' WHERE id = %s", [api_key.workspace_id])
    _notified_of(listener, "agent_registry_workspace", since)

    assert _queries(read) == 1
    assert read().workspace.name == "renamed"


def test_writing_a_keys_last_use_alone_notifies_no_one(listener, key):
    api_key, raw_key = key
    since = listener.notifications
    registry_services.apikey_authenticate(raw_key=raw_key)  # writes last_used_at
    assert ApiKey.objects.get(pk=api_key.pk).last_used_at is not None
    Workspace.objects.filter(pk=api_key.workspace_id).update(name="marker")  # a change that does notify
    _notified_of(listener, "agent_registry_workspace", since)

    assert "agent_registry_apikey" not in _tables_since(listener, since)
    # The kept row does not show that write; the process remembers it, so the next requests write nothing.
    registry_services.apikey_authenticate(raw_key=raw_key)
    assert _queries(lambda: registry_services.apikey_authenticate(raw_key=raw_key)) == 0


def test_reads_inside_a_transaction_go_to_the_database(listener, key):
    api_key, _ = key
    registry_selectors.apikey_live_by_prefix(prefix=api_key.prefix)
    with transaction.atomic():
        ApiKey.objects.filter(pk=api_key.pk).update(name="renamed in the transaction")
        assert _live(api_key.prefix).name == "renamed in the transaction"


def test_a_read_under_way_when_a_notification_arrives_is_not_kept(listener):
    cache: config_cache.NotifiedCache[str, int] = config_cache.NotifiedCache(size=10)
    reads: list[int] = []

    def read_while_something_changes() -> int:
        reads.append(1)
        listener._bump()  # what a notification arriving now does
        return len(reads)

    assert cache.get("k", read_while_something_changes) == 1
    assert cache.get("k", read_while_something_changes) == 2
    assert cache.get("k", lambda: 99) == 99  # kept: nothing changed during this read
    assert cache.get("k", lambda: 100) == 99


def test_nothing_is_kept_while_the_listener_is_lost_and_it_listens_again(listener, key):
    api_key, _ = key
    read = lambda: registry_selectors.apikey_live_by_prefix(prefix=api_key.prefix)  # noqa: E731
    read()
    assert _queries(read) == 0
    lost = listener.backend_pid
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [lost])
    _until(lambda: listener.backend_pid != lost)  # it noticed (the ping, or the notification wait failing)

    assert _queries(read) == 1  # what was kept before is gone

    _until(listener.listening)  # reconnected
    read()
    assert _queries(read) == 0


def test_off_by_setting_every_read_goes_to_the_database(listener, key, settings):
    api_key, _ = key
    settings.KEEL_CONFIG_CACHE = False
    read = lambda: registry_selectors.apikey_live_by_prefix(prefix=api_key.prefix)  # noqa: E731
    assert [_queries(read), _queries(read)] == [1, 1]
