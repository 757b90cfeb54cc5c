"""Assembling trajectories: step order, tree shape, conversation, tool calls, totals, broken parent links."""

from __future__ import annotations

import dataclasses
import json
import random
from typing import Any

from tracing import otlp
from tracing.steps import PromptUse, Step, ToolCall, Totals, TrajectoryView, trajectory_view_build

TRACE_ID = "5b8efff798038103d269b633813fc60c"
ROOT, CHAT_1, TOOL_1, CHAT_2 = "a000000000000001", "a000000000000002", "a000000000000003", "a000000000000004"


def span(
    span_id: str,
    parent: str | None,
    start: int,
    end: int,
    attributes: dict[str, Any] | None = None,
    *,
    name: str = "step",
    status_code: int = 0,
    status_message: str = "",
    events: tuple[otlp.SpanEvent, ...] = (),
) -> otlp.Span:
    return otlp.map_span(
        otlp.RawSpan(
            trace_id=TRACE_ID,
            span_id=span_id,
            parent_span_id=parent,
            name=name,
            kind=1,
            start_time_ns=start,
            end_time_ns=end,
            status_code=status_code,
            status_message=status_message,
            attributes=attributes or {},
            events=events,
            resource_attributes={"service.name": "support-agent"},
            scope_name="tests",
            scope_version="1",
            truncated_attributes={},
        )
    )


def text(role: str, content: str) -> dict[str, Any]:
    return {"role": role, "parts": [{"type": "text", "content": content}]}


def tool_request(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "parts": [{"type": "tool_call", "id": call_id, "name": name, "arguments": arguments}]}


def tool_response(call_id: str, response: Any) -> dict[str, Any]:
    return {"role": "tool", "parts": [{"type": "tool_call_response", "id": call_id, "response": response}]}


def chat(
    span_id: str,
    parent: str | None,
    start: int,
    end: int,
    inputs: list[dict[str, Any]],
    outputs: list[dict[str, Any]],
    **extra: Any,
) -> otlp.Span:
    attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "gpt-4o",
        "gen_ai.system_instructions": "You are a support agent.",
        "gen_ai.input.messages": json.dumps(inputs),
        "gen_ai.output.messages": json.dumps(outputs),
    }
    attributes.update(extra)
    return span(span_id, parent, start, end, attributes, name="chat gpt-4o")


def execute_tool(
    span_id: str,
    parent: str | None,
    start: int,
    end: int,
    call_id: str,
    name: str,
    arguments: Any,
    result: Any,
    **fields: Any,
) -> otlp.Span:
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": name,
        "gen_ai.tool.call.id": call_id,
        "gen_ai.tool.call.arguments": json.dumps(arguments),
        "gen_ai.tool.call.result": json.dumps(result),
    }
    return span(span_id, parent, start, end, attributes, name=f"execute_tool {name}", **fields)


SYSTEM = {"role": "system", "content": "You are a support agent."}
USER = {"role": "user", "content": "Refund order A-1"}
ASSISTANT_CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "lookup_order", "arguments": '{"order":"A-1"}'}}
    ],
}
TOOL_RESULT = {"role": "tool", "content": '{"status":"delivered"}', "tool_call_id": "call_1"}
ANSWER = {"role": "assistant", "content": "Refunded."}


def refund_trajectory() -> list[otlp.Span]:
    first_input = [text("user", "Refund order A-1")]
    first_output = [tool_request("call_1", "lookup_order", {"order": "A-1"})]
    return [
        span(
            ROOT,
            None,
            0,
            100,
            {
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": "support",
                "gen_ai.conversation.id": "conv-1",
                "keel.user.id": "user-1",
                "keel.tags": ["refund"],
                "keel.task.id": "task-9",
                "keel.reward": 1.0,
            },
            name="invoke_agent support",
        ),
        chat(
            CHAT_1,
            ROOT,
            10,
            20,
            first_input,
            first_output,
            **{"gen_ai.usage.input_tokens": 100, "gen_ai.usage.output_tokens": 20, "llm.cost.total": 0.01},
        ),
        execute_tool(TOOL_1, ROOT, 21, 30, "call_1", "lookup_order", {"order": "A-1"}, {"status": "delivered"}),
        chat(
            CHAT_2,
            ROOT,
            31,
            40,
            [*first_input, *first_output, tool_response("call_1", {"status": "delivered"})],
            [text("assistant", "Refunded.")],
            **{
                "gen_ai.usage.input_tokens": 150,
                "gen_ai.usage.output_tokens": 10,
                "llm.cost.total": 0.015,
                "keel.prompt.name": "refund",
                "keel.prompt.version": 3,
                "keel.tags": ["refund", "vip"],
                "gen_ai.tool.definitions": json.dumps([{"type": "function", "name": "lookup_order"}]),
            },
        ),
    ]


def outline(view: TrajectoryView) -> list[tuple[Any, ...]]:
    return [
        (step.index, step.kind, step.span_id, step.depth, step.role or step.tool_name or step.name)
        for step in view.steps
    ]


# --- A whole trajectory ---------------------------------------------------------------------------------


def test_a_trajectory_reads_as_messages_llm_calls_and_tool_calls_in_order() -> None:
    view = trajectory_view_build(refund_trajectory())

    assert outline(view) == [
        (0, "agent", ROOT, 0, "invoke_agent support"),
        (1, "message", CHAT_1, 1, "system"),
        (2, "message", CHAT_1, 1, "user"),
        (3, "llm_call", CHAT_1, 1, "chat gpt-4o"),
        (4, "tool_call", TOOL_1, 1, "lookup_order"),
        (5, "llm_call", CHAT_2, 1, "chat gpt-4o"),
    ]
    assert view.steps[2] == Step(
        index=2,
        span_id=CHAT_1,
        parent_span_id=ROOT,
        depth=1,
        kind="message",
        name="chat gpt-4o",
        span_type="generation",
        start_time_ns=10,
        end_time_ns=10,
        duration_ns=0,
        status="unset",
        error=None,
        role="user",
        content="Refund order A-1",
    )
    assert view.steps[3] == Step(
        index=3,
        span_id=CHAT_1,
        parent_span_id=ROOT,
        depth=1,
        kind="llm_call",
        name="chat gpt-4o",
        span_type="generation",
        start_time_ns=10,
        end_time_ns=20,
        duration_ns=10,
        status="unset",
        error=None,
        usage=otlp.Usage(input_tokens=100, output_tokens=20, total_tokens=120),
        cost_usd=0.01,
        model="gpt-4o",
        input_messages=(SYSTEM, USER),
        output_message=ASSISTANT_CALL,
    )
    assert view.steps[4] == Step(
        index=4,
        span_id=TOOL_1,
        parent_span_id=ROOT,
        depth=1,
        kind="tool_call",
        name="execute_tool lookup_order",
        span_type="tool",
        start_time_ns=21,
        end_time_ns=30,
        duration_ns=9,
        status="unset",
        error=None,
        tool_name="lookup_order",
        tool_call_id="call_1",
        tool_arguments={"order": "A-1"},
        tool_result={"status": "delivered"},
        input={"order": "A-1"},
        output={"status": "delivered"},
    )
    assert view.conversation == (SYSTEM, USER, ASSISTANT_CALL, TOOL_RESULT, ANSWER)
    assert view.tool_calls == (
        ToolCall(
            name="lookup_order",
            call_id="call_1",
            arguments={"order": "A-1"},
            result={"status": "delivered"},
            error=None,
            status="unset",
            span_id=TOOL_1,
            step_index=4,
            source="span",
        ),
    )
    assert view.totals == Totals(
        input_tokens=250,
        output_tokens=30,
        total_tokens=280,
        cache_read_tokens=0,
        reasoning_tokens=0,
        cost_usd=0.025,
        duration_ns=100,
        span_count=4,
        step_count=6,
        llm_call_count=2,
        tool_call_count=1,
        error_count=0,
    )
    assert (view.trace_id, view.status, view.root_span_id, view.root_span_name) == (
        TRACE_ID,
        "ok",
        ROOT,
        "invoke_agent support",
    )
    assert (view.start_time_ns, view.end_time_ns) == (0, 100)
    assert (view.session_id, view.user_id, view.agent_name) == ("conv-1", "user-1", "support")
    assert (view.task_id, view.reward) == ("task-9", 1.0)
    assert view.tags == ("refund", "vip")
    assert view.prompt_versions == (PromptUse(name="refund", version="3"),)
    assert view.tool_definitions == ({"type": "function", "function": {"name": "lookup_order", "parameters": None}},)


def test_arrival_order_does_not_change_the_trajectory() -> None:
    spans = refund_trajectory()
    expected = trajectory_view_build(spans)

    for seed in range(5):
        shuffled = spans[:]
        random.Random(seed).shuffle(shuffled)
        assert trajectory_view_build(shuffled) == expected


def test_the_trajectory_is_named_after_the_trace_when_a_span_names_it() -> None:
    # Langfuse's SDK sets the trace's name (propagate_attributes(trace_name=...)) on the spans below the root.
    spans = refund_trajectory()
    assert trajectory_view_build(spans).name == spans[0].name
    named = [spans[0], span("c1", ROOT, 1, 2, {"langfuse.trace.name": "refund request"}), *spans[1:]]

    view = trajectory_view_build(named)

    assert (view.name, view.root_span_name) == ("refund request", spans[0].name)


def test_a_span_sent_twice_is_read_once() -> None:
    spans = refund_trajectory()

    view = trajectory_view_build([*spans, spans[2]])

    assert view == trajectory_view_build(spans)


def test_an_empty_trace_is_running_with_no_steps() -> None:
    view = trajectory_view_build([], trace_id=TRACE_ID)

    assert (view.trace_id, view.status, view.steps, view.conversation, view.root_span_name) == (
        TRACE_ID,
        "running",
        (),
        (),
        None,
    )
    assert view.totals.span_count == 0


# --- Tree shape and broken links ----------------------------------------------------------------------------


def test_spans_whose_parent_is_missing_hang_under_the_root() -> None:
    orphan = span("b000000000000001", "ffffffffffffffff", 50, 60, name="late child")
    grandchild = span("b000000000000002", "b000000000000001", 55, 58, name="grandchild")

    view = trajectory_view_build([span(ROOT, None, 0, 100, name="root"), orphan, grandchild])

    assert [(step.name, step.depth, step.parent_span_id) for step in view.steps] == [
        ("root", 0, None),
        ("late child", 1, ROOT),
        ("grandchild", 2, "b000000000000001"),
    ]
    assert view.status == "ok"


def test_without_a_root_span_the_trajectory_is_running_and_orphans_are_the_top_level() -> None:
    first = span("b000000000000001", "ffffffffffffffff", 10, 20, name="first")
    second = span("b000000000000002", "eeeeeeeeeeeeeeee", 5, 8, name="second")
    child = span("b000000000000003", "b000000000000001", 12, 15, name="child")

    view = trajectory_view_build([first, second, child])

    assert [(step.name, step.depth) for step in view.steps] == [("second", 0), ("first", 0), ("child", 1)]
    assert (view.status, view.root_span_id, view.root_span_name) == ("running", None, None)


def test_a_cycle_in_parent_ids_is_cut_at_its_earliest_span() -> None:
    first = span("c000000000000001", "c000000000000002", 10, 20, name="first")
    second = span("c000000000000002", "c000000000000001", 12, 18, name="second")
    itself = span("c000000000000003", "c000000000000003", 30, 40, name="itself")

    view = trajectory_view_build([second, itself, span(ROOT, None, 0, 100, name="root"), first])

    assert [(step.name, step.depth, step.parent_span_id) for step in view.steps] == [
        ("root", 0, None),
        ("first", 1, ROOT),
        ("second", 2, "c000000000000001"),
        ("itself", 1, ROOT),
    ]


def test_a_cycle_without_a_root_becomes_a_top_level_tree() -> None:
    first = span("c000000000000001", "c000000000000002", 10, 20, name="first")
    second = span("c000000000000002", "c000000000000001", 12, 18, name="second")

    view = trajectory_view_build([second, first])

    assert [(step.name, step.depth) for step in view.steps] == [("first", 0), ("second", 1)]
    assert view.status == "running"


def test_several_parentless_spans_sit_side_by_side_and_the_earliest_is_the_root() -> None:
    view = trajectory_view_build(
        [span("d000000000000002", None, 5, 9, name="b"), span("d000000000000001", None, 1, 3, name="a")]
    )

    assert [(step.name, step.depth) for step in view.steps] == [("a", 0), ("b", 0)]
    assert view.root_span_name == "a"


def test_span_kinds_become_step_kinds() -> None:
    children = [
        span("e000000000000001", ROOT, 1, 2, {"openinference.span.kind": "RETRIEVER", "input.value": "q"}, name="r"),
        span(
            "e000000000000002", ROOT, 3, 4, {"openinference.span.kind": "GUARDRAIL", "output.value": "pass"}, name="g"
        ),
        span("e000000000000003", ROOT, 5, 5, {"langfuse.observation.type": "event"}, name="e"),
        span("e000000000000004", ROOT, 6, 7, {"openinference.span.kind": "CHAIN"}, name="c"),
        span("e000000000000005", ROOT, 8, 9, {"gen_ai.operation.name": "embeddings"}, name="m"),
        span("e000000000000006", ROOT, 10, 11, {"openinference.span.kind": "AGENT"}, name="a"),
    ]

    view = trajectory_view_build([span(ROOT, None, 0, 20, name="root"), *children])

    assert [(step.name, step.kind, step.input, step.output) for step in view.steps] == [
        ("root", "span", None, None),
        ("r", "retrieval", "q", None),
        ("g", "guardrail", None, "pass"),
        ("e", "event", None, None),
        ("c", "span", None, None),
        ("m", "span", None, None),
        ("a", "agent", None, None),
    ]


def test_sub_agents_nest_as_a_tree_and_their_dialogue_joins_the_conversation() -> None:
    sub_agent = "f000000000000001"
    spans = [
        span(
            ROOT,
            None,
            0,
            100,
            {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "planner"},
            name="planner",
        ),
        span(
            sub_agent,
            ROOT,
            10,
            50,
            {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "researcher"},
            name="researcher",
        ),
        chat("f000000000000002", sub_agent, 20, 30, [text("user", "Find flights")], [text("assistant", "Found 3.")]),
        chat(CHAT_2, ROOT, 60, 70, [text("user", "Plan a trip")], [text("assistant", "Booked.")]),
    ]

    view = trajectory_view_build(spans)

    assert [(step.kind, step.depth, step.role or step.name, step.agent_name) for step in view.steps] == [
        ("agent", 0, "planner", "planner"),
        ("agent", 1, "researcher", "researcher"),
        ("message", 2, "system", None),
        ("message", 2, "user", None),
        ("llm_call", 2, "chat gpt-4o", None),
        ("message", 1, "user", None),
        ("llm_call", 1, "chat gpt-4o", None),
    ]
    assert [message["content"] for message in view.conversation] == [
        "You are a support agent.",
        "Find flights",
        "Found 3.",
        "Plan a trip",
        "Booked.",
    ]


# --- Conversation and tool calls ---------------------------------------------------------------------------


def test_a_message_said_again_later_is_kept_twice() -> None:
    turn_1 = [text("user", "Cancel my order")]
    reply_1 = [text("assistant", "Are you sure?")]
    turn_2 = [*turn_1, *reply_1, text("user", "yes")]
    reply_2 = [text("assistant", "Also refund it?")]
    turn_3 = [*turn_2, *reply_2, text("user", "yes")]
    spans = [
        chat("a000000000000011", None, 0, 10, turn_1, reply_1),
        chat("a000000000000012", None, 20, 30, turn_2, reply_2),
        chat("a000000000000013", None, 40, 50, turn_3, [text("assistant", "Done.")]),
    ]

    view = trajectory_view_build(spans)

    assert [(message["role"], message["content"]) for message in view.conversation] == [
        ("system", "You are a support agent."),
        ("user", "Cancel my order"),
        ("assistant", "Are you sure?"),
        ("user", "yes"),
        ("assistant", "Also refund it?"),
        ("user", "yes"),
        ("assistant", "Done."),
    ]
    assert [(step.kind, step.content) for step in view.steps if step.kind == "message"] == [
        ("message", "You are a support agent."),
        ("message", "Cancel my order"),
        ("message", "yes"),
        ("message", "yes"),
    ]


def test_a_history_cut_short_by_the_agent_still_matches_what_was_said() -> None:
    long = [text("user", "a"), text("assistant", "b"), text("user", "c")]
    spans = [
        chat("a000000000000011", None, 0, 10, long, [text("assistant", "d")]),
        # The agent drops the oldest turns from its context window.
        chat(
            "a000000000000012",
            None,
            20,
            30,
            [text("user", "c"), text("assistant", "d"), text("user", "e")],
            [text("assistant", "f")],
        ),
    ]

    view = trajectory_view_build(spans)

    assert [message["content"] for message in view.conversation] == [
        "You are a support agent.",
        "a",
        "b",
        "c",
        "d",
        "e",
        "f",
    ]


def identical_calls(count: int) -> list[otlp.Span]:
    """An agent asking `count` times for the same ride, each call answered by its tool span."""
    history = [text("user", "Where is ride R-1?")]
    spans = [span(ROOT, None, 0, 1_000, {"gen_ai.operation.name": "invoke_agent"}, name="root")]
    for turn in range(count):
        call_id = f"call_{turn}"
        request = tool_request(call_id, "get_ride", {"ride_id": "R-1"})
        spans.append(chat(f"{2 * turn + 1:016x}", ROOT, 100 * turn + 10, 100 * turn + 20, history, [request]))
        spans.append(
            execute_tool(
                f"{2 * turn + 2:016x}",
                ROOT,
                100 * turn + 30,
                100 * turn + 40,
                call_id,
                "get_ride",
                {"ride_id": "R-1"},
                "pending",
            )
        )
        history = [*history, request, tool_response(call_id, "pending")]
    return spans


def test_the_same_tool_call_made_again_is_a_new_answer_not_a_message() -> None:
    view = trajectory_view_build(identical_calls(3))

    assert [(step.kind, step.role or step.tool_name or step.name) for step in view.steps] == [
        ("agent", "root"),
        ("message", "system"),
        ("message", "user"),
        ("llm_call", "chat gpt-4o"),
        ("tool_call", "get_ride"),
        ("llm_call", "chat gpt-4o"),
        ("tool_call", "get_ride"),
        ("llm_call", "chat gpt-4o"),
        ("tool_call", "get_ride"),
    ]
    assert [
        (message["role"], message.get("tool_call_id") or [call["id"] for call in message.get("tool_calls", [])])
        for message in view.conversation[2:]
    ] == [
        ("assistant", ["call_0"]),
        ("tool", "call_0"),
        ("assistant", ["call_1"]),
        ("tool", "call_1"),
        ("assistant", ["call_2"]),
    ]


def test_a_history_cut_short_lines_up_with_the_latest_of_identical_turns() -> None:
    first, second = (
        tool_request("call_1", "get_ride", {"ride_id": "R-1"}),
        tool_request("c", "get_ride", {"ride_id": "R-1"}),
    )
    # Results without call ids, as some conventions send them: the two exchanges look the same.
    result = {"role": "tool", "content": "pending"}
    spans = [
        chat(CHAT_1, None, 0, 10, [text("user", "Where is ride R-1?")], [first]),
        chat(CHAT_2, None, 20, 30, [text("user", "Where is ride R-1?"), first, result], [second]),
        # The agent keeps only the last exchange in its context window; the model asks a third time.
        chat("a000000000000013", None, 40, 50, [second, result], [tool_request("d", "get_ride", {"ride_id": "R-1"})]),
    ]

    view = trajectory_view_build(spans)

    assert [message["role"] for message in view.conversation] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    assert [step.kind for step in view.steps] == [
        "message",
        "message",
        "llm_call",
        "message",
        "llm_call",
        "message",
        "llm_call",
    ]
    assert [step.role for step in view.steps if step.kind == "message"] == ["system", "user", "tool", "tool"]


def test_the_same_call_recorded_twice_answers_once() -> None:
    question = [text("user", "Where is ride R-1?")]
    answer = [text("assistant", "On its way.")]
    # A framework's span around the client library's span of the same request.
    spans = [
        chat(CHAT_1, None, 0, 50, question, answer),
        chat(CHAT_2, CHAT_1, 10, 40, question, answer),
        chat(
            "a000000000000013", None, 60, 70, [*question, *answer, text("user", "Thanks")], [text("assistant", "Bye")]
        ),
    ]

    view = trajectory_view_build(spans)

    assert [message["content"] for message in view.conversation] == [
        "You are a support agent.",
        "Where is ride R-1?",
        "On its way.",
        "Thanks",
        "Bye",
    ]
    assert [step.role for step in view.steps if step.kind == "message"] == ["system", "user", "user"]


def test_the_finish_reason_of_an_answer_is_on_its_llm_call() -> None:
    cut = {
        "role": "assistant",
        "parts": [{"type": "text", "content": "Your rides this week are"}],
        "finish_reason": "length",
    }
    from_messages = chat(CHAT_1, None, 0, 10, [text("user", "List my rides")], [cut])
    from_attribute = chat(
        CHAT_2,
        None,
        20,
        30,
        [text("user", "List my rides")],
        [text("assistant", "Monday, Tuesday")],
        **{"gen_ai.response.finish_reasons": ["stop"]},
    )

    view = trajectory_view_build([from_messages, from_attribute])

    llm_calls = [step for step in view.steps if step.kind == "llm_call"]
    assert [step.output_message for step in llm_calls] == [
        {"role": "assistant", "content": "Your rides this week are", "finish_reason": "length"},
        {"role": "assistant", "content": "Monday, Tuesday", "finish_reason": "stop"},
    ]
    # The conversation holds what was said, not why the model stopped.
    assert "finish_reason" not in view.conversation[2]


def agent_span(messages: list[dict[str, Any]], *, key: str = "gen_ai.input.messages") -> otlp.Span:
    return span(ROOT, None, 0, 100, {"gen_ai.operation.name": "invoke_agent", key: json.dumps(messages)}, name="agent")


def test_a_last_user_message_no_llm_call_read_is_a_message_step_at_the_end() -> None:
    question = [text("user", "Refund ride R-1")]
    answer = [text("assistant", "I can offer a voucher instead.")]
    dialogue = [{"role": "system", "content": "You are a support agent."}, *question, *answer]
    llm = chat(CHAT_1, ROOT, 10, 20, question, answer)

    for key in ("gen_ai.input.messages", "gen_ai.output.messages"):
        view = trajectory_view_build([agent_span([*dialogue, text("user", "Forget it.")], key=key), llm])

        assert [(step.kind, step.role or step.name) for step in view.steps] == [
            ("agent", "agent"),
            ("message", "system"),
            ("message", "user"),
            ("llm_call", "chat gpt-4o"),
            ("message", "user"),
        ]
        last = view.steps[-1]
        assert (last.content, last.span_id, last.depth, last.start_time_ns, last.end_time_ns) == (
            "Forget it.",
            ROOT,
            0,
            100,
            100,
        )
        assert [message["content"] for message in view.conversation] == [
            "You are a support agent.",
            "Refund ride R-1",
            "I can offer a voucher instead.",
            "Forget it.",
        ]


def test_agent_messages_that_do_not_reach_the_end_of_the_dialogue_add_nothing() -> None:
    question = [text("user", "Refund ride R-1")]
    llm = chat(CHAT_1, ROOT, 10, 20, question, [text("assistant", "Done.")])
    expected = trajectory_view_build([span(ROOT, None, 0, 100, {"gen_ai.operation.name": "invoke_agent"}), llm])

    # The user's words before the agent rewrote them into its prompt; the agent's task as it was given.
    for messages in ([text("user", "refund R-1 pls")], [*question, text("user", "Also check R-2")]):
        view = trajectory_view_build([agent_span(messages), llm])

        assert [step.kind for step in view.steps] == [step.kind for step in expected.steps]
        assert view.conversation == expected.conversation


def test_tool_results_seen_only_in_messages_become_tool_call_steps() -> None:
    first_input = [text("user", "Search for shoes")]
    first_output = [tool_request("call_5", "search", {"q": "shoes"})]
    spans = [
        chat(CHAT_1, None, 0, 10, first_input, first_output),
        chat(
            CHAT_2,
            None,
            20,
            30,
            [
                *first_input,
                *first_output,
                tool_response("call_5", "3 results"),
                tool_response("call_6", "orphan result"),
            ],
            [text("assistant", "Found 3.")],
        ),
    ]

    view = trajectory_view_build(spans)

    assert outline(view) == [
        (0, "message", CHAT_1, 0, "system"),
        (1, "message", CHAT_1, 0, "user"),
        (2, "llm_call", CHAT_1, 0, "chat gpt-4o"),
        (3, "tool_call", CHAT_2, 0, "search"),
        (4, "message", CHAT_2, 0, "tool"),
        (5, "llm_call", CHAT_2, 0, "chat gpt-4o"),
    ]
    assert view.tool_calls == (
        ToolCall(
            name="search",
            call_id="call_5",
            arguments={"q": "shoes"},
            result="3 results",
            error=None,
            status="unset",
            span_id=CHAT_2,
            step_index=3,
            source="messages",
        ),
    )
    assert (view.steps[4].content, view.steps[4].tool_call_id) == ("orphan result", "call_6")


def test_a_tool_span_without_a_call_id_still_matches_its_message_by_name_and_arguments() -> None:
    first_input = [text("user", "Search for shoes")]
    first_output = [tool_request("call_5", "search", {"q": "shoes"})]
    tool = span(
        TOOL_1,
        None,
        12,
        18,
        {"gen_ai.tool.name": "search", "gen_ai.tool.call.arguments": '{"q":"shoes"}', "gen_ai.tool.call.result": "3"},
    )
    spans = [
        chat(CHAT_1, None, 0, 10, first_input, first_output),
        tool,
        chat(
            CHAT_2, None, 20, 30, [*first_input, *first_output, tool_response("call_5", "3")], [text("assistant", "ok")]
        ),
    ]

    view = trajectory_view_build(spans)

    assert [step.kind for step in view.steps] == ["message", "message", "llm_call", "tool_call", "llm_call"]
    assert [call.source for call in view.tool_calls] == ["span"]


def test_errors_mark_the_step_and_the_trajectory() -> None:
    failing = execute_tool(
        TOOL_1,
        ROOT,
        21,
        30,
        "call_1",
        "refund",
        {"order": "A-1"},
        None,
        status_code=2,
        status_message="PaymentError: gateway down",
        events=(
            otlp.SpanEvent("exception", 29, {"exception.type": "PaymentError", "exception.message": "gateway down"}),
        ),
    )
    plain_error = span("a000000000000009", ROOT, 40, 41, status_code=2, name="cleanup")

    view = trajectory_view_build([span(ROOT, None, 0, 100, name="root"), failing, plain_error])

    assert [(step.name, step.status, step.error) for step in view.steps] == [
        ("root", "unset", None),
        ("execute_tool refund", "error", "gateway down"),
        ("cleanup", "error", "error"),
    ]
    assert view.tool_calls[0].error == "gateway down"
    assert (view.status, view.totals.error_count) == ("error", 2)


def test_spans_without_content_still_make_steps() -> None:
    bare_llm = span(CHAT_1, None, 0, 5, {"gen_ai.operation.name": "chat"}, name="chat")
    bare_tool = span(TOOL_1, None, 6, 9, {"gen_ai.operation.name": "execute_tool"}, name="execute_tool")

    view = trajectory_view_build([bare_llm, bare_tool])

    assert [(step.kind, step.input_messages, step.output_message, step.tool_name) for step in view.steps] == [
        ("llm_call", None, None, None),
        ("tool_call", None, None, "execute_tool"),
    ]
    assert view.conversation == ()
    assert view.totals.input_tokens == 0
    assert view.totals.cost_usd is None


def test_content_that_does_not_serialize_as_json_is_still_assembled() -> None:
    deep: Any = "leaf"
    for _ in range(5000):
        deep = [deep]
    mixed_keys = {1: "one", "two": 2}
    base = chat(CHAT_1, None, 0, 10, [text("user", "hi")], [text("assistant", "hello")])
    odd = dataclasses.replace(base, input=[{"role": "user", "content": deep}, {"role": "user", "content": mixed_keys}])

    view = trajectory_view_build([odd])

    assert [(step.kind, step.role) for step in view.steps] == [
        ("message", "user"),
        ("message", "user"),
        ("llm_call", None),
    ]
    assert len(view.conversation) == 3


def test_an_agent_span_that_sums_its_llm_calls_is_not_counted_twice() -> None:
    usage = {"gen_ai.usage.input_tokens": 100, "gen_ai.usage.output_tokens": 10, "llm.cost.total": 0.5}
    agent_totals = {"gen_ai.usage.input_tokens": 200, "gen_ai.usage.output_tokens": 20, "llm.cost.total": 1.0}
    embedding = {"gen_ai.operation.name": "embeddings", "gen_ai.usage.input_tokens": 7}
    spans = [
        span(ROOT, None, 0, 100, {"gen_ai.operation.name": "invoke_agent", **agent_totals}),
        span("a000000000000005", ROOT, 1, 50, {"gen_ai.operation.name": "invoke_agent"}),
        span(CHAT_1, "a000000000000005", 2, 10, {"gen_ai.operation.name": "chat", **usage}),
        span(CHAT_2, ROOT, 60, 70, {"gen_ai.operation.name": "chat", **usage}),
        span("a000000000000006", None, 200, 210, embedding),
    ]

    totals = trajectory_view_build(spans).totals

    assert (totals.input_tokens, totals.output_tokens, totals.total_tokens, totals.cost_usd) == (207, 20, 227, 1.0)


def test_a_long_trajectory_builds_quickly() -> None:
    spans = [span(ROOT, None, 0, 10_000_000, {"gen_ai.operation.name": "invoke_agent"}, name="root")]
    history: list[dict[str, Any]] = [text("user", "Start the long task")]
    for turn in range(250):
        call_id = f"call_{turn}"
        request = tool_request(call_id, "step", {"n": turn})
        spans.append(chat(f"{2 * turn + 1:016x}", ROOT, 10 * turn + 1, 10 * turn + 5, history, [request]))
        spans.append(
            execute_tool(f"{2 * turn + 2:016x}", ROOT, 10 * turn + 6, 10 * turn + 9, call_id, "step", {"n": turn}, "ok")
        )
        history = [*history, request, tool_response(call_id, "ok")]
    # And a deep chain, which a recursive walk would not survive.
    parent = ROOT
    for depth in range(1, 600):
        span_id = f"{0xD000000000000000 + depth:016x}"
        spans.append(span(span_id, parent, 5_000_000 + depth, 6_000_000, name="nested"))
        parent = span_id
    random.Random(7).shuffle(spans)

    view = trajectory_view_build(spans)  # how fast: bench/bench_otlp_parse.py measures it

    assert view.totals.span_count == 1100
    assert view.totals.llm_call_count == 250
    assert view.totals.tool_call_count == 250
    # The system prompt, the user's message, 250 calls and the 249 results the model saw afterwards.
    assert len(view.conversation) == 2 + 250 + 249
    assert max(step.depth for step in view.steps) == 599
