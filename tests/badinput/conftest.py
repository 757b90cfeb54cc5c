"""Fixtures for the bad-input tests: a key with every scope and a client that sends it, a snapshot of every
table's row count (a refusal must leave it unchanged), the shape of Keel's error body, and hypothesis
settings that CI keeps small and KEEL_FUZZ_EXAMPLES raises for a longer hunt."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.apps import apps
from django.db import connection, transaction
from django.test import Client
from hypothesis import HealthCheck, settings

from agent_registry import services as registry_services
from agent_registry.models import Agent, Scope, Workspace
from agent_registry.tests.factories import AgentFactory

# The gateway's fixtures: an agent wired to a fake litellm provider (no network).
from routing.tests.conftest import fake, gateway  # noqa: F401
from tracing import services as tracing_services

_FUZZ_EXAMPLES = int(os.environ.get("KEEL_FUZZ_EXAMPLES", "0"))


def fuzz(ci_examples: int) -> Any:
    """Hypothesis settings: `ci_examples` examples in CI, KEEL_FUZZ_EXAMPLES when it is set."""
    return settings(
        max_examples=_FUZZ_EXAMPLES or ci_examples,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def json_paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into a JSON value (keys and list indexes), the value itself first: where a mutation can go."""
    found = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            found.extend(json_paths(value, (*prefix, key)))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found.extend(json_paths(value, (*prefix, index)))
    return found


def json_replace(node: Any, path: tuple[Any, ...], value: Any) -> Any:
    """A copy of the JSON value with what is at `path` replaced by `value`."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(node, dict):
        return {key: json_replace(item, rest, value) if key == head else item for key, item in node.items()}
    return [json_replace(item, rest, value) if index == head else item for index, item in enumerate(node)]


def row_counts() -> dict[str, int]:
    """Every table's row count, in one query."""
    tables = sorted(
        {model._meta.db_table for model in apps.get_models() if model._meta.managed and not model._meta.proxy}
    )
    quote = connection.ops.quote_name
    selects = ", ".join(f"(SELECT count(*) FROM {quote(table)})" for table in tables)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {selects}")
        row = cursor.fetchone()
    assert row is not None
    return dict(zip(tables, row, strict=True))


def assert_refused(response: Any, *statuses: int) -> dict[str, Any]:
    """A 4xx (one of `statuses` when given) with Keel's error body; returns the body."""
    assert 400 <= response.status_code < 500, (response.status_code, response.content[:500])
    if statuses:
        assert response.status_code in statuses, (response.status_code, response.content[:500])
    body: dict[str, Any] = response.json()
    assert isinstance(body.get("detail"), str), body
    assert body["detail"]
    assert isinstance(body.get("code"), str), body
    assert body["code"]
    return body


@contextmanager
def rolled_back() -> Iterator[None]:
    """One hypothesis example in a savepoint that is undone after it: spans are append-only and keyed on
    their ids, so an example must not read back what an earlier one stored under the same ids."""
    with transaction.atomic():
        yield
        transaction.set_rollback(True)


def all_scopes() -> list[str]:
    return [scope.value for scope in Scope]


@pytest.fixture
def raw_key(workspace: Workspace) -> str:
    _, raw = registry_services.apikey_create(workspace=workspace, name="every scope", scopes=all_scopes())
    return raw


@pytest.fixture
def client(raw_key: str) -> Client:
    return Client(headers={"Authorization": f"Bearer {raw_key}"})


@pytest.fixture
def agent(workspace: Workspace) -> Agent:
    return AgentFactory.create(workspace=workspace, slug="support", name="Support")


@pytest.fixture
def counts() -> Callable[[], dict[str, int]]:
    return row_counts


@pytest.fixture(autouse=True)
def fresh_backlog() -> Any:
    # The ingest backlog is read at most once a second per process; a test must not see another's.
    tracing_services.backlog.reset()
    yield
    tracing_services.backlog.reset()
