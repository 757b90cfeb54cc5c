"""The diff between a trajectory and its replay: alignment, where they part, the fields that differ, totals."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from tracing import trajectory_json
from tracing.otlp import Span
from tracing.replay_diff import FieldChange, json_equal, json_parsed, replay_diff, replay_start_step
from tracing.steps import TrajectoryView, trajectory_view_build


def system(text: str) -> dict[str, Any]:
    return {"role": "system", "content": text}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def asks(call_id: str, name: str, arguments: dict[str, Any], tokens: int = 100) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
        ],
        "usage": {"input_tokens": tokens, "output_tokens": 10},
        "duration_ms": 500,
    }


def result(call_id: str, value: Any) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": json.dumps(value), "duration_ms": 20}


def answer(text: str, tokens: int = 200) -> dict[str, Any]:
    return {"role": "assistant", "content": text, "usage": {"input_tokens": tokens, "output_tokens": 20}}


def spans_of(messages: list[dict[str, Any]]) -> list[Span]:
    document = {"name": "refund request", "model": "m", "started_at": 1795316000.0, "messages": messages}
    return trajectory_json.document_spans(trajectory_json.documents_parse(document)[0])


def view_of(messages: list[dict[str, Any]]) -> TrajectoryView:
    return trajectory_view_build(spans_of(messages))


HISTORY = [system("You help riders."), user("I was charged twice for T1.")]
LOOKUP = [asks("c1", "lookup_trip", {"trip_id": "T1"}), result("c1", {"charges": [12.5, 12.5]})]
REFUND = [asks("c2", "refund", {"trip_id": "T1", "amount": 12.5}), result("c2", {"refunded": 12.5})]
# Steps: 0 agent, 1 system, 2 user, 3 LLM call, 4 lookup_trip, 5 LLM call, 6 refund, 7 LLM call.
ORIGINAL = [*HISTORY, *LOOKUP, *REFUND, answer("Refunded 12.50.")]


def statuses(diff) -> list[tuple[str, str, bool]]:
    return [(pair.status, pair.label, pair.replayed) for pair in diff.steps]


def test_a_replay_that_does_the_same_is_the_same_throughout():
    diff = replay_diff(view_of(ORIGINAL), view_of(ORIGINAL), from_step=3)

    assert (diff.original_start, diff.replay_start, diff.first_difference) == (3, 3, None)
    assert statuses(diff) == [
        ("same", "agent refund request", False),
        ("same", "system message", False),
        ("same", "user message", False),
        ("same", "assistant", True),
        ("same", "tool lookup_trip", True),
        ("same", "assistant", True),
        ("same", "tool refund", True),
        ("same", "assistant", True),
    ]
    assert all(pair.changes == () for pair in diff.steps)
    assert [(pair.original_index, pair.replay_index) for pair in diff.steps] == [(i, i) for i in range(8)]


def test_a_different_answer_is_where_they_part_with_both_texts():
    replayed = [*HISTORY, *LOOKUP, *REFUND, answer("Done: 12.50 is back on your card.")]

    diff = replay_diff(view_of(ORIGINAL), view_of(replayed), from_step=3)

    assert diff.first_difference == 7
    assert diff.steps[7].status == "changed"
    assert diff.steps[7].changes == (FieldChange("content", "Refunded 12.50.", "Done: 12.50 is back on your card."),)


def test_a_changed_system_prompt_shows_in_the_history_but_is_not_where_the_runs_part():
    replayed = [system("You are the refund desk."), *ORIGINAL[1:]]

    diff = replay_diff(view_of(ORIGINAL), view_of(replayed), from_step=3)

    assert diff.steps[1].status == "changed"
    assert diff.steps[1].changes == (FieldChange("content", "You help riders.", "You are the refund desk."),)
    assert diff.first_difference is None


def test_another_tool_is_a_changed_step_with_its_name_arguments_and_result():
    replayed = [
        *HISTORY,
        asks("c1", "cancel_trip", {"trip_id": "T1", "reason": "duplicate"}),
        result("c1", {"cancelled": True}),
        answer("Cancelled."),
    ]

    diff = replay_diff(view_of(ORIGINAL), view_of(replayed), from_step=3)

    assert statuses(diff)[3:] == [
        ("changed", "assistant", True),
        ("changed", "tool lookup_trip", True),
        ("changed", "assistant", True),
        ("only_in_original", "tool refund", True),
        ("only_in_original", "assistant", True),
    ]
    assert diff.first_difference == 3
    assert diff.steps[3].changes == (
        FieldChange(
            "tool_calls",
            [{"name": "lookup_trip", "arguments": {"trip_id": "T1"}}],
            [{"name": "cancel_trip", "arguments": {"trip_id": "T1", "reason": "duplicate"}}],
        ),
    )
    assert diff.steps[4].changes == (
        FieldChange("step", "tool lookup_trip", "tool cancel_trip"),
        FieldChange("arguments", {"trip_id": "T1"}, {"trip_id": "T1", "reason": "duplicate"}),
        FieldChange("result", {"charges": [12.5, 12.5]}, {"cancelled": True}),
    )
    assert diff.steps[6].changes == (
        FieldChange("arguments", {"trip_id": "T1", "amount": 12.5}, None),
        FieldChange("result", {"refunded": 12.5}, None),
        FieldChange("error", None, None),
    )


def test_a_step_of_another_kind_in_the_same_place_stands_alone_rather_than_being_a_changed_tool():
    original = view_of(ORIGINAL)
    replay = view_of(ORIGINAL)
    # Where the original called lookup_trip, the replay's run went through a guardrail instead.
    guard = dataclasses.replace(
        replay.steps[4], kind="guardrail", name="input guard", span_type="guardrail", tool_name=None
    )
    replay = dataclasses.replace(replay, steps=(*replay.steps[:4], guard, *replay.steps[5:]))

    diff = replay_diff(original, replay, from_step=3)

    assert statuses(diff)[3:] == [
        ("same", "assistant", True),
        ("only_in_original", "tool lookup_trip", True),
        ("only_in_replay", "guardrail input guard", True),
        ("same", "assistant", True),
        ("same", "tool refund", True),
        ("same", "assistant", True),
    ]
    assert diff.first_difference == 4


def test_an_extra_tool_call_stands_alone_and_what_follows_still_lines_up():
    check = [asks("c9", "check_card", {"card": "visa"}), result("c9", {"ok": True})]
    replayed = [*HISTORY, *check, *LOOKUP, *REFUND, answer("Refunded 12.50.")]

    diff = replay_diff(view_of(ORIGINAL), view_of(replayed), from_step=3)

    assert statuses(diff)[3:] == [
        ("only_in_replay", "assistant", True),
        ("only_in_replay", "tool check_card", True),
        ("same", "assistant", True),
        ("same", "tool lookup_trip", True),
        ("same", "assistant", True),
        ("same", "tool refund", True),
        ("same", "assistant", True),
    ]
    assert [(pair.original_index, pair.replay_index) for pair in diff.steps[3:]] == [
        (None, 3),
        (None, 4),
        (3, 5),
        (4, 6),
        (5, 7),
        (6, 8),
        (7, 9),
    ]
    assert diff.first_difference == 3


def test_arguments_compare_as_json_whatever_their_key_order_or_spacing():
    spaced = [
        *HISTORY,
        {
            **LOOKUP[0],
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "lookup_trip", "arguments": '{ "trip_id" :"T1" }'},
                }
            ],
        },
        LOOKUP[1],
        asks("c2", "refund", {"amount": 12.5, "trip_id": "T1"}),
        REFUND[1],
        answer("Refunded 12.50."),
    ]

    diff = replay_diff(view_of(ORIGINAL), view_of(spaced), from_step=3)

    assert diff.first_difference is None


def test_a_replay_from_a_later_step_lines_its_history_up_with_the_recorded_calls():
    # As a replay from step 5 stores it: its first model call carries the history, tool call and all.
    replay_spans = spans_of([*HISTORY, *LOOKUP, *REFUND, answer("Refunded.")])
    first_call, first_tool = replay_spans[0].span_id, replay_spans[1].span_id
    replay = trajectory_view_build([span for span in replay_spans if span.span_id not in (first_call, first_tool)])
    assert [step.kind for step in replay.steps[:6]] == [
        "agent",
        "message",
        "message",
        "message",
        "tool_call",
        "llm_call",
    ]

    diff = replay_diff(view_of(ORIGINAL), replay, from_step=5)

    assert (diff.original_start, diff.replay_start) == (5, 5)
    assert statuses(diff) == [
        ("same", "agent refund request", False),
        ("same", "system message", False),
        ("same", "user message", False),
        ("same", "assistant", False),  # an LLM call in the original, a history message in the replay
        ("same", "tool lookup_trip", False),
        ("same", "assistant", True),
        ("same", "tool refund", True),
        ("changed", "assistant", True),
    ]
    assert diff.first_difference == 7


def test_totals_side_by_side_for_the_whole_runs_and_the_replayed_part():
    replayed = [*HISTORY, *LOOKUP, answer("I cannot refund that.", tokens=300)]

    diff = replay_diff(view_of(ORIGINAL), view_of(replayed), from_step=3)

    whole, part = diff.totals, diff.replayed_totals
    assert (whole.original.steps, whole.replay.steps) == (8, 6)
    assert (whole.original.llm_calls, whole.replay.llm_calls) == (3, 2)
    assert (whole.original.tool_calls, whole.replay.tool_calls) == (2, 1)
    assert (whole.original.input_tokens, whole.replay.input_tokens) == (400, 400)
    assert (whole.original.output_tokens, whole.replay.output_tokens) == (40, 30)
    # 1 ms for each message without a duration, 500 per model call that asks for a tool, 20 per tool.
    assert (whole.original.latency_ms, whole.replay.latency_ms) == (1043.0, 523.0)
    assert (part.original.steps, part.replay.steps) == (5, 3)
    assert (part.original.total_tokens, part.replay.total_tokens) == (440, 430)
    assert (part.original.cost_usd, part.replay.cost_usd) == (None, None)


def test_the_replay_starts_at_the_first_model_call_at_or_after_the_step():
    view = view_of(ORIGINAL)

    assert [replay_start_step(view, step) for step in range(9)] == [3, 3, 3, 3, 5, 5, 7, 7, None]


@pytest.mark.parametrize(
    ("left", "right", "equal"),
    [
        ({"a": 1, "b": [1, 2]}, {"b": [1, 2], "a": 1.0}, True),
        ({"a": {"x": None}}, {"a": {"x": None}}, True),
        ([1, 2], [2, 1], False),
        ({"a": 1}, {"a": 1, "b": None}, False),
        (True, 1, False),
        (1, True, False),
        (False, False, True),
        ("1", 1, False),
        (None, "", False),
        ("text", "text", True),
    ],
)
def test_json_equal(left, right, equal):
    assert json_equal(left, right) is equal


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        ('{"a": 1}', {"a": 1}),
        (" [1, 2]", [1, 2]),
        ("{not json", "{not json"),
        ("plain text", "plain text"),
        ("12", "12"),
        (12, 12),
        (None, None),
    ],
)
def test_json_parsed(value, parsed):
    assert json_parsed(value) == parsed
