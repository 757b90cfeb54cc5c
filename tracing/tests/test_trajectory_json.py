"""The JSON trajectory format as spans and as a trajectory: usage, finish reasons, the user's last word."""

from __future__ import annotations

from typing import Any

import orjson

from tracing import otlp, trajectory_json
from tracing.records import span_record
from tracing.signals import signals_compute
from tracing.steps import trajectory_view_build

SYSTEM = {"role": "system", "content": "You help riders."}
QUESTION = {"role": "user", "content": "Refund ride R-1."}
OFFER = {"role": "assistant", "content": "I can offer a $5 voucher instead."}


def spans_of(messages: list[dict[str, Any]]) -> list[otlp.Span]:
    document = {"name": "refund request", "model": "m", "started_at": 1795316000.0, "messages": messages}
    return trajectory_json.document_spans(trajectory_json.documents_parse(document)[0])


def generations(spans: list[otlp.Span]) -> list[otlp.Span]:
    return [span for span in spans if span.span_type == "generation"]


def test_a_total_left_out_is_the_sum_of_input_and_output_tokens() -> None:
    answers: list[dict[str, Any]] = [
        {"role": "assistant", "content": "a", "usage": {"input_tokens": 50, "output_tokens": 10}},
        {"role": "assistant", "content": "b", "usage": {"prompt_tokens": 70, "completion_tokens": 5}},
        {"role": "assistant", "content": "c", "usage": {"input_tokens": 80, "output_tokens": 9, "total_tokens": 100}},
        {"role": "assistant", "content": "d", "usage": {"input_tokens": 90}},
        {"role": "assistant", "content": "e"},
    ]

    spans = spans_of([QUESTION, *answers])

    assert [span.usage for span in generations(spans)] == [
        otlp.Usage(input_tokens=50, output_tokens=10, total_tokens=60),
        otlp.Usage(input_tokens=70, output_tokens=5, total_tokens=75),
        otlp.Usage(input_tokens=80, output_tokens=9, total_tokens=100),
        otlp.Usage(input_tokens=90),
        otlp.Usage(),
    ]


def test_a_finish_reason_on_an_assistant_message_is_kept() -> None:
    cut = {"role": "assistant", "content": "Your rides are", "finish_reason": "length"}

    spans = spans_of([QUESTION, cut, {"role": "user", "content": "Go on."}, OFFER])
    view = trajectory_view_build(spans)

    assert [span.finish_reasons for span in generations(spans)] == [("length",), ()]
    assert [step.output_message for step in view.steps if step.kind == "llm_call"] == [
        {"role": "assistant", "content": "Your rides are", "finish_reason": "length"},
        OFFER,
    ]


def test_the_root_span_holds_every_message() -> None:
    messages = [SYSTEM, QUESTION, OFFER]

    (root,) = [span for span in spans_of(messages) if span.parent_span_id is None]

    assert (root.span_type, root.input, root.output) == ("agent", messages, OFFER["content"])


def test_a_last_user_message_after_the_last_answer_reaches_the_trajectory() -> None:
    leaving = {"role": "user", "content": "Forget it."}

    view = trajectory_view_build(spans_of([SYSTEM, QUESTION, OFFER, leaving]))

    assert [(step.kind, step.role) for step in view.steps] == [
        ("agent", None),
        ("message", "system"),
        ("message", "user"),
        ("llm_call", None),
        ("message", "user"),
    ]
    assert (view.steps[-1].content, view.steps[-1].span_id) == ("Forget it.", view.root_span_id)
    assert view.conversation == (SYSTEM, QUESTION, OFFER, leaving)
    quits = [instance for instance in signals_compute(view).instances if instance.signal == "disengagement"]
    assert [(instance.kind, instance.step_indices) for instance in quits] == [("quit", (4,))]


def test_a_trajectory_that_ends_on_an_answer_adds_no_message_at_the_end() -> None:
    lookup: dict[str, Any] = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_ride", "arguments": "{}"}}],
    }
    result = {"role": "tool", "tool_call_id": "c1", "content": "pending"}
    messages = [SYSTEM, QUESTION, lookup, result, OFFER]

    view = trajectory_view_build(spans_of(messages))

    assert [step.kind for step in view.steps] == ["agent", "message", "message", "llm_call", "tool_call", "llm_call"]
    assert view.conversation == tuple(messages)


def test_a_tool_calls_arguments_and_result_are_stored_once() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "ride_lookup", "arguments": '{"ride_id": "R-1"}'}}
    spans = spans_of(
        [
            QUESTION,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": '{"fare": 12.5, "status": "completed"}'},
            OFFER,
        ]
    )
    (tool,) = [span for span in spans if span.span_type == "tool"]
    stored = orjson.loads(span_record(tool).data)

    assert (tool.tool_arguments, tool.tool_result) == ({"ride_id": "R-1"}, {"fare": 12.5, "status": "completed"})
    assert "tool_arguments" not in stored
    assert "tool_result" not in stored
    assert (stored["input"], stored["output"]) == (tool.tool_arguments, tool.tool_result)
