"""`disengagement/left_after_error` and the session: a user who got an error and came back with the next
request of the same session did not leave, at ingest (in any order, in one batch or two) and on a recompute."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from django.db import connection, transaction

from agent_registry import services as registry_services
from agent_registry.tests.factories import WorkspaceFactory
from tracing import services, signals, trajectory_json
from tracing.models import Trajectory
from tracing.steps import trajectory_view_build

pytestmark = pytest.mark.django_db

START = 1795316000.0
CALL = {"id": "c1", "type": "function", "function": {"name": "issue_refund", "arguments": '{"ride_id": "R-1"}'}}


def failed_refund(*, session: str | None, started_at: float = START, ride: str = "R-1") -> dict[str, Any]:
    """A request that ends on the agent reporting a failed tool: `failure` and `left_after_error`."""
    return {
        "name": "refund",
        "session_id": session,
        "started_at": started_at,
        "messages": [
            {"role": "user", "content": f"Refund ride {ride}."},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "c1", "content": '{"status": "error", "message": "gateway down"}'},
            {"role": "assistant", "content": "I'm sorry, I was unable to issue the refund."},
        ],
    }


def next_request(*, session: str | None, started_at: float = START + 60) -> dict[str, Any]:
    """The user's next request, answered."""
    return {
        "name": "refund",
        "session_id": session,
        "started_at": started_at,
        "messages": [
            {"role": "user", "content": "Can you try the refund again?"},
            {"role": "assistant", "content": "Done: $5 is on its way back to your card."},
        ],
    }


def ingest(api_key: Any, *documents: dict[str, Any]) -> list[str]:
    """Ingest JSON trajectories as the API does (one batch, processed by the worker); their trace ids."""
    accepted, trace_ids = services.ingest_trajectories_accept(api_key=api_key, payload=list(documents))
    assert accepted.batch_id is not None
    services.span_batch_process(batch_id=accepted.batch_id)
    return trace_ids


def kinds(trajectory: Trajectory) -> list[tuple[str, str]]:
    trajectory.refresh_from_db()
    return sorted((instance["signal"], instance["kind"]) for instance in trajectory.signals)


def flagged(trace_id: str) -> list[tuple[str, str]]:
    return kinds(Trajectory.objects.get(trace_id=trace_id))


FLAGGED = [("disengagement", "left_after_error"), ("failure", "status_field")]
CAME_BACK = [("failure", "status_field")]


@pytest.fixture
def api_key(workspace):
    key, _ = registry_services.apikey_create(workspace=workspace, name="ingest", scopes=["ingest"])
    return key


# --- The pure module ------------------------------------------------------------------------------------


def test_a_session_that_goes_on_withdraws_left_after_error_and_only_it() -> None:
    document = trajectory_json.documents_parse(failed_refund(session="s-1"))[0]
    document.trace_id = trajectory_json.document_trace_id(document)
    view = trajectory_view_build(trajectory_json.document_spans(document))

    alone = signals.signals_compute(view)
    continued = signals.signals_compute(view, session_continues=True)

    assert sorted((i.signal, i.kind) for i in alone.instances) == FLAGGED
    assert [(i.signal, i.kind) for i in continued.instances] == CAME_BACK
    (failure,) = continued.instances
    assert continued.triage_score == round(signals.DEFAULT_WEIGHTS["failure"] * failure.severity, 6)


# --- Ingest -----------------------------------------------------------------------------------------------


def test_the_next_request_of_the_session_clears_the_stored_earlier_trajectory(api_key):
    (earlier,) = ingest(api_key, failed_refund(session="s-1"))
    stored = Trajectory.objects.get(trace_id=earlier)
    assert kinds(stored) == FLAGGED
    assert stored.signal_names == ["disengagement", "failure"]
    (failure,) = [instance for instance in stored.signals if instance["signal"] == "failure"]

    (later,) = ingest(api_key, next_request(session="s-1"))

    stored.refresh_from_db()
    assert stored.signals == [failure]
    assert stored.signal_names == ["failure"]
    assert stored.triage_score == pytest.approx(signals.DEFAULT_WEIGHTS["failure"] * failure["severity"])
    assert flagged(later) == []


def test_the_last_trajectory_of_a_session_keeps_the_flag(api_key):
    first, last = ingest(api_key, failed_refund(session="s-1"), failed_refund(session="s-1", started_at=START + 60))

    assert flagged(first) == CAME_BACK
    assert flagged(last) == FLAGGED


@pytest.mark.parametrize("earlier_first", [True, False])
def test_both_in_one_batch_in_either_order(api_key, earlier_first):
    documents = [failed_refund(session="s-1"), next_request(session="s-1")]
    trace_ids = ingest(api_key, *(documents if earlier_first else documents[::-1]))
    earlier = trace_ids[0] if earlier_first else trace_ids[1]

    assert flagged(earlier) == CAME_BACK


def test_an_earlier_trajectory_that_arrives_after_the_later_one_is_not_flagged(api_key):
    ingest(api_key, next_request(session="s-1"))

    (earlier,) = ingest(api_key, failed_refund(session="s-1"))

    assert flagged(earlier) == CAME_BACK


def test_late_spans_of_the_earlier_trajectory_do_not_bring_the_flag_back(workspace, api_key):
    document = trajectory_json.documents_parse(failed_refund(session="s-1"))[0]
    document.trace_id = trajectory_json.document_trace_id(document)
    spans = trajectory_json.document_spans(document)
    root = [span for span in spans if span.parent_span_id is None]
    children = [span for span in spans if span.parent_span_id is not None]
    with transaction.atomic():
        services.spans_write(workspace=workspace, api_key=api_key, spans=root)
    ingest(api_key, next_request(session="s-1"))

    with transaction.atomic():
        services.spans_write(workspace=workspace, api_key=api_key, spans=children)

    assert flagged(document.trace_id) == CAME_BACK


@pytest.mark.parametrize(
    "later", [{"session": "s-2"}, {"session": None}, {"session": "s-1", "started_at": START - 60}], ids=str
)
def test_no_later_trajectory_of_the_same_session_keeps_the_flag(api_key, later):
    (earlier,) = ingest(api_key, failed_refund(session="s-1"))

    ingest(api_key, next_request(**later))

    assert flagged(earlier) == FLAGGED


def test_trajectories_without_a_session_are_not_one_session(api_key):
    first, second = ingest(api_key, failed_refund(session=None), failed_refund(session=None, started_at=START + 60))

    assert (flagged(first), flagged(second)) == (FLAGGED, FLAGGED)


def test_a_later_trajectory_of_a_session_of_the_same_name_in_another_workspace_changes_nothing(api_key):
    (earlier,) = ingest(api_key, failed_refund(session="s-1"))
    elsewhere, _ = registry_services.apikey_create(
        workspace=WorkspaceFactory.create(slug="elsewhere"), name="ingest", scopes=["ingest"]
    )

    ingest(elsewhere, next_request(session="s-1"))

    assert flagged(earlier) == FLAGGED


# --- Recompute --------------------------------------------------------------------------------------------


def test_a_recompute_does_not_bring_the_flag_back(api_key):
    earlier, later = ingest(api_key, failed_refund(session="s-1"), failed_refund(session="s-1", started_at=START + 60))
    ids = list(Trajectory.objects.filter(trace_id__in=[earlier, later]).values_list("pk", flat=True))
    Trajectory.objects.filter(pk__in=ids).update(signals=[], signal_names=[], triage_score=0)

    assert services.trajectory_signals_recompute(trajectory_ids=ids) == 2

    assert (flagged(earlier), flagged(later)) == (CAME_BACK, FLAGGED)
    assert Trajectory.objects.get(trace_id=earlier).signal_names == ["failure"]


# --- Cost --------------------------------------------------------------------------------------------------


@pytest.fixture
def statements(monkeypatch) -> list[str]:
    """Every statement sent to PostgreSQL, through Django's cursors and ingest's own psycopg ones."""
    sent: list[str] = []
    execute = psycopg.Cursor.execute

    def counted(self: psycopg.Cursor[Any], query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(str(query))
        return execute(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", counted)
    return sent


def test_a_batch_with_sessions_costs_one_statement_more_whatever_its_size(api_key, statements):
    def cost(session: str | None, count: int, start: float) -> int:
        documents = [failed_refund(session=session, started_at=start, ride=f"R-{number}") for number in range(count)]
        for document in documents:  # nothing of the batch's sessions is flagged and followed
            document["messages"][-1]["content"] = "Refunded."
        statements.clear()
        ingest(api_key, *documents)
        # The ingest queue's backlog is read at most once a second (services._Backlog), so whether a batch
        # reads it depends on how long the batches before it took: those reads are left out of the count.
        return len([sql for sql in statements if 'FROM "tracing_ingestbatch"' not in sql])

    cost(None, 1, START)  # the first batch also creates what ingest keeps from then on
    without = cost(None, 1, START + 1)
    assert cost(None, 20, START + 2) == without
    assert cost("s-1", 1, START + 3) == without + 1
    assert cost("s-2", 20, START + 4) == without + 1


def _scans(plan: dict[str, Any]) -> list[tuple[str, str]]:
    """(alias, index name or node type) of each scan in an EXPLAIN (FORMAT JSON) plan."""
    found = [(plan["Alias"], plan.get("Index Name", plan["Node Type"]))] if "Alias" in plan else []
    for child in plan.get("Plans", ()):
        found += _scans(child)
    return found


def test_the_lookup_of_a_batchs_flagged_trajectories_can_use_their_partial_index(workspace, api_key):
    # A long session: every trajectory of it answered, one flagged and not followed.
    ingest(api_key, *(next_request(session="long", started_at=START + number) for number in range(30)))
    (flagged_id,) = ingest(api_key, failed_refund(session="long", started_at=START + 100))
    assert flagged(flagged_id) == FLAGGED

    with transaction.atomic(), psycopg.Cursor(connection.connection) as cursor:
        # Whether the planner prefers the partial index depends on the table's size and statistics (on a test's
        # few rows, reading the unique index in trace-id order saved it a sort). What is tested is that the
        # query can use it at all: that its condition implies the index's. So every other index of the table
        # goes, inside this transaction, and sequential scans are off: the partial index is the only way in.
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # no ALTER TABLE while deferred checks are pending
        cursor.execute(
            "SELECT i.indexrelid::regclass::text, c.conname FROM pg_index AS i "
            "LEFT JOIN pg_constraint AS c ON c.conindid = i.indexrelid AND c.conrelid = i.indrelid "
            "AND c.contype IN ('p', 'u') "
            "WHERE i.indrelid = 'tracing_trajectory'::regclass"
        )
        for index, constraint in cursor.fetchall():
            if constraint:
                cursor.execute(f"ALTER TABLE tracing_trajectory DROP CONSTRAINT {constraint} CASCADE")
            elif index != "trajectory_left_after_error":
                cursor.execute(f"DROP INDEX {index}")
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(
            "EXPLAIN (FORMAT JSON) " + services._LEFT_AFTER_ERROR_CONTINUED, [workspace.pk, ["long", "other"]]
        )
        ((plan,),) = cursor.fetchall()
        transaction.set_rollback(True)

    assert [index for alias, index in _scans(plan[0]["Plan"]) if alias == "t"] == ["trajectory_left_after_error"]
