"""POST /api/v1/ingest/trajectories, the plain JSON trajectory format, with generated documents.

Valid documents round-trip: the answer is 202 with the spans the format promises, the worker stores the
batch (it never fails on what ingest accepted), and the stored trajectory reads back with the messages,
reward, tags and metadata that were sent. Mutated documents are either taken the same way or refused
with a 4xx and Keel's error body, leaving every table as it was. (tracing/tests/test_api_ingest.py has
the hand-written cases; this is the generated sweep.)
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.badinput.conftest import assert_refused, fuzz, json_paths, json_replace, rolled_back, row_counts
from tracing import selectors
from tracing import services as tracing_services
from tracing.models import IngestBatch

pytestmark = pytest.mark.django_db

PATH = "/api/v1/ingest/trajectories"

# Text as agents send it: any Unicode but NUL and lone surrogates (refused; see test_limits.py).
TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=40)
SHORT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=12)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.floats(allow_nan=False, allow_infinity=False) | TEXT,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(SHORT, children, max_size=3),
    max_leaves=8,
)
CONTENT = st.one_of(
    TEXT,
    st.none(),
    st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}), max_size=2),
)
TOKENS = st.one_of(st.none(), st.integers(0, 2**31 - 1))
USAGE = st.fixed_dictionaries({}, optional={"input_tokens": TOKENS, "output_tokens": TOKENS, "total_tokens": TOKENS})
DURATION = st.one_of(st.none(), st.floats(0, 7 * 24 * 3600 * 1000))
# Span times are nanoseconds since 1970 in a signed 64-bit column, which ends in April 2262; a trajectory
# starting by 2200 ends in time whatever its durations. The edges are in the mutations below.
STARTED = st.one_of(
    st.none(),
    st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)).map(
        lambda moment: moment.isoformat()
    ),
    st.floats(0, 7_258_118_400),
)


@st.composite
def conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A user turn, then assistant turns that may call tools, each call answered by a tool message."""
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(TEXT)})
    messages.append({"role": "user", "content": draw(CONTENT)})
    for turn in range(draw(st.integers(0, 3))):
        calls = [
            {
                "id": f"call-{turn}-{index}",
                "type": "function",
                "function": {"name": draw(SHORT), "arguments": json.dumps(draw(JSON))},
            }
            for index in range(draw(st.integers(0, 2)))
        ]
        assistant: dict[str, Any] = {"role": "assistant", "content": draw(CONTENT)}
        if calls:
            assistant["tool_calls"] = calls
        extras = draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "usage": USAGE,
                    "duration_ms": DURATION,
                    "model": SHORT,
                    "finish_reason": st.sampled_from(["stop", "length", "tool_calls"]),
                    "error": SHORT,
                },
            )
        )
        messages.append({**assistant, **{key: value for key, value in extras.items() if value is not None}})
        for call in calls:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": json.dumps(draw(JSON))})
        if draw(st.booleans()):
            messages.append({"role": "user", "content": draw(CONTENT)})
    return messages


TRAJECTORIES = st.fixed_dictionaries(
    {"messages": conversations()},
    optional={
        "name": SHORT,
        "agent": st.sampled_from(["support", "refunds"]),
        "session_id": SHORT,
        "user_id": SHORT,
        "started_at": STARTED,
        "model": SHORT,
        "tags": st.lists(SHORT, max_size=4),
        "metadata": st.dictionaries(SHORT, JSON, max_size=4),
        "task_id": SHORT,
        "reward": st.floats(allow_nan=False, allow_infinity=False),
        "tools": st.lists(
            st.fixed_dictionaries(
                {"type": st.just("function"), "function": st.fixed_dictionaries({"name": SHORT, "parameters": JSON})}
            ),
            max_size=2,
        ),
    },
)


def _stored_message(message: dict[str, Any]) -> dict[str, Any]:
    """A message as the format keeps it in the trajectory (tracing/trajectory_json.py: _message_dict)."""
    kept = {"role": message["role"], "content": message.get("content")}
    if message.get("tool_calls"):
        kept["tool_calls"] = message["tool_calls"]
    if message.get("tool_call_id"):
        kept["tool_call_id"] = message["tool_call_id"]
    return kept


def _post_and_store(client: Any, body: bytes) -> Any:
    """POST a body; when it is taken, run the worker on the batch and check the worker stored it."""
    before = row_counts()
    batches = set(IngestBatch.objects.values_list("pk", flat=True))
    response = client.post(PATH, body, content_type="application/json")
    if response.status_code != 202:
        assert_refused(response, 400, 413, 422)
        assert row_counts() == before
        return response
    (batch,) = IngestBatch.objects.exclude(pk__in=batches)
    tracing_services.span_batch_process(batch_id=batch.pk)
    batch.refresh_from_db()
    # What ingest acknowledged is stored: the worker never fails on it.
    assert (batch.status, batch.error) == ("done", "")
    return response


@fuzz(40)
@given(document=TRAJECTORIES)
def test_a_valid_trajectory_is_stored_and_reads_back_as_sent(client, workspace, document):
    with rolled_back():
        _assert_round_trip(client, workspace, document)


def _assert_round_trip(client: Any, workspace: Any, document: dict[str, Any]) -> None:
    response = _post_and_store(client, json.dumps(document).encode())

    assert response.status_code == 202, response.content[:500]
    messages = document["messages"]
    tool_results = sum(message["role"] == "tool" for message in messages)
    answers = sum(message["role"] == "assistant" for message in messages)
    assert response.json()["accepted_spans"] == 1 + answers + tool_results
    (trace_id,) = response.json()["trace_ids"]
    spans = selectors.trace_spans(workspace_id=workspace.pk, trace_ids=[trace_id])[trace_id]
    assert len(spans) == 1 + answers + tool_results
    (root,) = (span for span in spans if span.parent_span_id is None)
    assert root.input == [_stored_message(message) for message in messages]
    assert root.reward == document.get("reward")
    assert list(root.tags) == document.get("tags", [])
    assert root.metadata == document.get("metadata", {})
    assert root.session_id == document.get("session_id")
    detail = client.get(f"/api/v1/trajectories/{trace_id}")
    assert detail.status_code == 200, detail.content[:500]


ODD_VALUES = st.one_of(
    JSON,
    st.sampled_from(
        [
            "",
            -1,
            2**63,
            -(2**63) - 1,
            1e308,
            -1e308,
            "9999-12-31T23:59:59Z",
            "0001-01-01T00:00:00Z",
            "not a date",
            "0" * 32,
            "f" * 32,
            [],
            {},
            "x" * 10_000,
            {"role": "wizard"},
        ]
    ),
)


@fuzz(60)
@given(
    document=TRAJECTORIES,
    edits=st.lists(st.tuples(st.integers(0, 10**6), ODD_VALUES), min_size=1, max_size=3),
    wrap=st.sampled_from(["one", "list", "object"]),
)
def test_a_mutated_trajectory_is_stored_whole_or_refused_leaving_nothing(client, document, edits, wrap):
    for choice, value in edits:
        candidates = json_paths(document)
        document = json_replace(document, candidates[choice % len(candidates)], value)
    body = {"one": document, "list": [document, document], "object": {"trajectories": [document]}}[wrap]

    with rolled_back():
        _post_and_store(client, json.dumps(body).encode())


@fuzz(40)
@given(document=st.one_of(JSON, st.lists(JSON, max_size=3)))
def test_any_json_is_stored_whole_or_refused_leaving_nothing(client, document):
    with rolled_back():
        _post_and_store(client, json.dumps(document).encode())


@pytest.mark.parametrize(
    ("started_at", "status"),
    [
        ("0001-01-01T00:00:00Z", 422),
        ("1969-12-31T23:59:59Z", 422),
        ("1970-01-01T00:00:00Z", 202),
        ("2262-04-01T00:00:00Z", 202),
        # A week-long answer from the start of April 2262 ends after the last storable nanosecond.
        ("2262-04-10T00:00:00Z", 422),
        ("9999-12-31T23:59:59Z", 422),
        (-62_135_596_800, 422),
        (253_402_300_799, 422),
        (1e300, 422),
    ],
)
def test_the_edges_of_time_are_stored_or_refused_not_lost(client, started_at, status):
    """Span times are nanoseconds since 1970 in a signed bigint: from 1970 to 2262-04-11."""
    document = {
        "started_at": started_at,
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello", "duration_ms": 7 * 24 * 3600 * 1000},
        ],
    }

    assert _post_and_store(client, json.dumps(document).encode()).status_code == status


def test_a_token_count_no_model_could_report_is_422_and_nothing_is_stored(client):
    document = {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello", "usage": {"input_tokens": 2**31, "output_tokens": 1}},
        ]
    }

    response = _post_and_store(client, json.dumps(document).encode())

    assert response.status_code == 422
    assert response.json()["errors"][0]["field"] == "messages.1.usage.input_tokens"
