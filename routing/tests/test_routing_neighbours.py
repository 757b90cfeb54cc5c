"""selectors.routing_neighbours: the agent's past requests nearest to a new one, with known outcomes, read
by a statement prepared once per database session (one round trip per search), with pgvector's iterative
scan on in every session."""

from __future__ import annotations

import weakref
from decimal import Decimal

import psycopg
import pytest
from django.db import DataError, OperationalError, connection, transaction
from django.test.utils import CaptureQueriesContext

from agent_registry.tests.factories import AgentFactory
from routing import embedding, selectors
from routing.tests.factories import RoutingDecisionFactory


def _decision(agent, text: str, **fields):
    return RoutingDecisionFactory.create(
        agent=agent,
        workspace=agent.workspace,
        request_text=text,
        embedding=embedding.embed_offline(text),
        **{"quality": 0.9, "cost_usd": Decimal("0.002"), "latency_ms": 1200, **fields},
    )


def _iterative_scan() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('hnsw.iterative_scan', true)")
        row = cursor.fetchone()
    return str(row[0]) if row else ""


@pytest.mark.django_db
def test_the_nearest_decisions_with_known_outcomes_of_this_agent_only(workspace, other_workspace):
    agent = AgentFactory.create(workspace=workspace)
    theirs = AgentFactory.create(workspace=other_workspace, slug=agent.slug)
    _decision(agent, "I was charged twice for my trip", tier="chain", quality=0.8, cost_usd=Decimal("0.01"))
    _decision(agent, "How do I change my email address?")
    _decision(agent, "I was charged twice for my ride", quality=None)  # outcome unknown
    _decision(agent, "I was charged twice for my journey", cache_hit=True)  # answered by the cache
    _decision(theirs, "I was charged twice for my trip")  # another workspace's agent

    vector = embedding.embed_offline("I was charged twice for my trip")
    selectors.routing_neighbours(agent=agent, embedding=vector, limit=5)  # prepares the statement, if need be
    with CaptureQueriesContext(connection) as queries:
        neighbours = selectors.routing_neighbours(agent=agent, embedding=vector, limit=5)

    (search,) = (query["sql"] for query in queries.captured_queries)
    assert search == f"EXECUTE keel_routing_neighbours_5 (<vector(256)>, {agent.pk})"
    assert [(n.tier, n.quality, n.cost_usd, n.latency_ms) for n in neighbours] == [
        ("chain", 0.8, 0.01, 1200.0),
        ("single_call", 0.9, 0.002, 1200.0),
    ]
    assert neighbours[0].similarity == pytest.approx(1.0)
    assert neighbours[0].similarity > neighbours[1].similarity


@pytest.mark.django_db
def test_execute_wrappers_see_the_search_with_its_parameters(workspace):
    agent = AgentFactory.create(workspace=workspace)
    _decision(agent, "Where is my receipt?")
    vector = embedding.embed_offline("Where is my receipt?")
    seen = []

    def wrapper(execute, sql, params, many, context):
        seen.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        neighbours = selectors.routing_neighbours(agent=agent, embedding=vector, limit=3)

    assert len(neighbours) == 1
    sql, params = seen[-1]
    assert sql == "EXECUTE keel_routing_neighbours_3 (%s::vector, %s)"
    assert params == [tuple(vector), agent.pk]
    with connection.cursor() as cursor:  # what the wrapper saw runs as it is (the benchmark EXPLAINs it)
        cursor.execute(sql, ["[" + ",".join(map(str, params[0])) + "]", params[1]])
        assert len(cursor.fetchall()) == 1


@pytest.mark.django_db
def test_at_most_limit_neighbours(workspace):
    agent = AgentFactory.create(workspace=workspace)
    for number in range(4):
        _decision(agent, f"Where is my receipt for trip T{number}?")

    neighbours = selectors.routing_neighbours(
        agent=agent, embedding=embedding.embed_offline("Where is my receipt?"), limit=3
    )

    assert len(neighbours) == 3


@pytest.mark.django_db(transaction=True)
def test_every_session_scans_iteratively_and_prepares_the_search_once(workspace):
    agent = AgentFactory.create(workspace=workspace)
    _decision(agent, "Where is my receipt?")
    vector = embedding.embed_offline("Where is my receipt?")
    connection.close()  # a new session

    assert _iterative_scan() == "relaxed_order"  # from the session's start (routing/apps.py)
    with CaptureQueriesContext(connection) as first:
        selectors.routing_neighbours(agent=agent, embedding=vector, limit=4)
    with CaptureQueriesContext(connection) as second:
        assert len(selectors.routing_neighbours(agent=agent, embedding=vector, limit=4)) == 1

    assert [query["sql"].split(" ")[0] for query in first.captured_queries] == ["SELECT", "PREPARE", "EXECUTE"]
    assert [query["sql"].split(" ")[0] for query in second.captured_queries] == ["EXECUTE"]


@pytest.mark.django_db
def test_a_session_that_has_the_search_already_is_not_asked_to_prepare_it_again(workspace, monkeypatch):
    agent = AgentFactory.create(workspace=workspace)
    _decision(agent, "Where is my receipt?")
    vector = embedding.embed_offline("Where is my receipt?")
    selectors.routing_neighbours(agent=agent, embedding=vector, limit=6)
    monkeypatch.setattr(selectors, "_prepared_sessions", weakref.WeakKeyDictionary())  # the process forgot

    with CaptureQueriesContext(connection) as queries:
        assert len(selectors.routing_neighbours(agent=agent, embedding=vector, limit=6)) == 1

    assert [query["sql"].split(" ")[0] for query in queries.captured_queries] == ["SELECT", "EXECUTE"]


@pytest.mark.django_db(transaction=True)
def test_a_session_that_lost_the_statement_prepares_it_again(workspace):
    agent = AgentFactory.create(workspace=workspace)
    _decision(agent, "Where is my receipt?")
    vector = embedding.embed_offline("Where is my receipt?")
    selectors.routing_neighbours(agent=agent, embedding=vector, limit=7)
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE keel_routing_neighbours_7")

    with CaptureQueriesContext(connection) as queries:
        assert len(selectors.routing_neighbours(agent=agent, embedding=vector, limit=7)) == 1

    assert [query["sql"].split(" ")[0] for query in queries.captured_queries] == ["SELECT", "PREPARE", "EXECUTE"]


@pytest.mark.django_db
def test_an_error_in_the_search_is_djangos(workspace):
    agent = AgentFactory.create(workspace=workspace)
    _decision(agent, "Where is my receipt?")

    with pytest.raises(DataError, match="different vector dimensions"):
        selectors.routing_neighbours(agent=agent, embedding=[0.6, 0.8], limit=5)


def _backend_killed() -> int:
    """Terminate the server process of Django's connection, as a restart of the server would; its pid."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    with psycopg.connect(**connection.get_connection_params()) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])
    return int(pid)


@pytest.mark.django_db(transaction=True)
def test_a_connection_that_broke_since_its_last_use_is_replaced_and_the_search_runs_again(workspace):
    agent = AgentFactory.create(workspace=workspace)
    _decision(agent, "Where is my receipt?")
    lost = _backend_killed()

    neighbours = selectors.routing_neighbours(
        agent=agent, embedding=embedding.embed_offline("Where is my receipt?"), limit=5
    )

    assert len(neighbours) == 1
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        assert cursor.fetchone() != (lost,)


@pytest.mark.django_db(transaction=True)
def test_inside_a_transaction_a_broken_connection_is_the_callers_error(workspace):
    agent = AgentFactory.create(workspace=workspace)
    _decision(agent, "Where is my receipt?")
    vector = embedding.embed_offline("Where is my receipt?")

    def search_in_a_transaction() -> None:
        with transaction.atomic():
            _backend_killed()
            selectors.routing_neighbours(agent=agent, embedding=vector, limit=5)

    with pytest.raises(OperationalError):
        search_in_a_transaction()
    connection.close()  # for the test's teardown
