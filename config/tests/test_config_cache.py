"""The per-process config cache kept exact by LISTEN/NOTIFY (config/config_cache.py), on committed data:
the triggers notify only at commit, so these tests do not run in a rolled-back transaction."""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest
from django.db import connection, transaction

from agent_registry import selectors as registry_selectors
from agent_registry import services as registry_services
from agent_registry.models import ApiKey, Workspace
from agent_registry.tests.factories import WorkspaceFactory
from config import config_cache
from config.tests.listening import settled, until

pytestmark = pytest.mark.django_db(transaction=True)


def _tables_since(config_listener: config_cache.Listener, since: int) -> list[str]:
    """The tables named by the notifications that arrived after the first `since`."""
    count = config_listener.notifications - since
    return list(config_listener.tables)[-count:] if count > 0 else []


def _notified_of(config_listener: config_cache.Listener, table: str, since: int) -> None:
    until(lambda: table in _tables_since(config_listener, since))


@pytest.fixture
def key(config_listener) -> tuple[ApiKey, str]:
    api_key, raw_key = registry_services.apikey_create(
        workspace=WorkspaceFactory.create(), name="k", scopes=["gateway"]
    )
    settled(config_listener)
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


def test_a_kept_key_is_read_without_a_query_until_it_is_revoked(config_listener, key):
    api_key, raw_key = key
    assert _queries(lambda: registry_services.apikey_authenticate(raw_key=raw_key)) >= 1
    assert _queries(lambda: registry_services.apikey_authenticate(raw_key=raw_key)) == 0  # kept

    since = config_listener.notifications
    registry_services.apikey_revoke(api_key=api_key)
    _notified_of(config_listener, "agent_registry_apikey", since)

    assert registry_services.apikey_authenticate(raw_key=raw_key) is None


def test_a_change_made_by_another_connection_empties_the_cache(config_listener, key):
    api_key, _ = key
    read = functools.partial(_live, api_key.prefix)
    assert read().workspace.name == api_key.workspace.name
    assert _queries(read) == 0

    since = config_listener.notifications
    with connection.cursor() as cursor:  # as another process would: plain SQL, committed
        cursor.execute("UPDATE agent_registry_workspace SET name = 'renamed' WHERE id = %s", [api_key.workspace_id])
    _notified_of(config_listener, "agent_registry_workspace", since)

    assert _queries(read) == 1
    assert read().workspace.name == "renamed"


def test_writing_a_keys_last_use_alone_notifies_no_one(config_listener, key):
    api_key, raw_key = key
    since = config_listener.notifications
    registry_services.apikey_authenticate(raw_key=raw_key)  # writes last_used_at
    assert ApiKey.objects.get(pk=api_key.pk).last_used_at is not None
    Workspace.objects.filter(pk=api_key.workspace_id).update(name="marker")  # a change that does notify
    _notified_of(config_listener, "agent_registry_workspace", since)

    assert "agent_registry_apikey" not in _tables_since(config_listener, since)
    # The kept row does not show that write; the process remembers it, so the next requests write nothing.
    registry_services.apikey_authenticate(raw_key=raw_key)
    assert _queries(lambda: registry_services.apikey_authenticate(raw_key=raw_key)) == 0


def test_reads_inside_a_transaction_go_to_the_database(config_listener, key):
    api_key, _ = key
    registry_selectors.apikey_live_by_prefix(prefix=api_key.prefix)
    with transaction.atomic():
        ApiKey.objects.filter(pk=api_key.pk).update(name="renamed in the transaction")
        assert _live(api_key.prefix).name == "renamed in the transaction"


def test_a_config_free_transaction_is_served_by_the_caches_that_allow_it_and_only_when_outermost(config_listener):
    allowing: config_cache.NotifiedCache[str, str] = config_cache.NotifiedCache(size=10, in_transactions=True)
    ordinary: config_cache.NotifiedCache[str, str] = config_cache.NotifiedCache(size=10)
    allowing.get("k", lambda: "kept")
    ordinary.get("k", lambda: "kept")

    with config_cache.config_free_transaction():
        assert allowing.get("k", lambda: "read") == "kept"
        assert ordinary.get("k", lambda: "read") == "read"
        with transaction.atomic():  # a savepoint of the same config-free transaction
            assert allowing.get("k", lambda: "read") == "kept"
    with transaction.atomic():
        assert allowing.get("k", lambda: "read") == "read"
        with config_cache.config_free_transaction():  # the outer transaction may have written config
            assert allowing.get("k", lambda: "read") == "read"
    assert allowing.get("k", lambda: "read") == "kept"


def test_a_read_under_way_when_a_notification_arrives_is_not_kept(config_listener):
    cache: config_cache.NotifiedCache[str, int] = config_cache.NotifiedCache(size=10)
    reads: list[int] = []

    def read_while_something_changes() -> int:
        reads.append(1)
        config_listener._bump()  # what a notification arriving now does
        return len(reads)

    assert cache.get("k", read_while_something_changes) == 1
    assert cache.get("k", read_while_something_changes) == 2
    assert cache.get("k", lambda: 99) == 99  # kept: nothing changed during this read
    assert cache.get("k", lambda: 100) == 99


def test_nothing_is_kept_while_the_listener_is_lost_and_it_listens_again(config_listener, key):
    api_key, _ = key
    read = functools.partial(registry_selectors.apikey_live_by_prefix, prefix=api_key.prefix)
    read()
    assert _queries(read) == 0
    lost = config_listener.backend_pid
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [lost])
    until(lambda: config_listener.backend_pid != lost)  # it noticed (the ping, or the notification wait failing)

    assert _queries(read) == 1  # what was kept before is gone

    until(config_listener.listening)  # reconnected
    read()
    assert _queries(read) == 0


def test_off_by_setting_every_read_goes_to_the_database(config_listener, key, settings):
    api_key, _ = key
    settings.KEEL_CONFIG_CACHE = False
    read = functools.partial(registry_selectors.apikey_live_by_prefix, prefix=api_key.prefix)
    assert [_queries(read), _queries(read)] == [1, 1]
