"""Random trajectories, built field by field or as conversations, never make the detectors fail."""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracing.otlp import SpanStatus, Usage
from tracing.signals import ENGLISH_PHRASES, SIGNAL_CATEGORIES, SignalConfig, Thresholds, signals_compute
from tracing.steps import Step, StepKind, ToolCall, Totals, TrajectoryView
from tracing.tests.test_signals import LOOKUP, Run

WORDS = st.sampled_from(
    [
        "no i meant",
        "thanks",
        "error",
        "Traceback (most recent call last)",
        "rate limit",
        "429",
        "TMP-12345",
        "talk to a human",
        "forget it",
        "?",
        "!!",
        "max_steps",
        "context length exceeded",
        "ride",
        "refund",
        "",
        "é",
        "\x00",
    ]
)
TEXT = st.one_of(st.text(max_size=40), st.lists(WORDS, max_size=6).map(" ".join))
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63),
    st.floats(allow_nan=True, allow_infinity=True),
    TEXT,
)
KEYS = st.one_of(
    st.sampled_from(["status", "ok", "error", "errors", "status_code", "exit_code", "content", "text", "type"]), TEXT
)
VALUES: st.SearchStrategy[Any] = st.recursive(
    SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(KEYS, children, max_size=4), st.tuples(children)
    ),
    max_leaves=12,
)
ROLES = st.one_of(st.sampled_from(["user", "assistant", "system", "tool", "narrator"]), st.none())
STATUS: st.SearchStrategy[SpanStatus] = st.sampled_from(["ok", "error", "unset"])
KINDS: st.SearchStrategy[StepKind] = st.sampled_from(
    ["message", "tool_call", "llm_call", "retrieval", "guardrail", "agent", "event", "span"]
)
OPTIONAL_INT = st.one_of(st.none(), st.integers(min_value=-5, max_value=10**9))
USAGE = st.one_of(st.none(), st.builds(Usage, OPTIONAL_INT, OPTIONAL_INT, OPTIONAL_INT, OPTIONAL_INT, OPTIONAL_INT))
OUTPUT_MESSAGE = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {"role": ROLES, "content": VALUES},
        optional={"tool_calls": VALUES, "finish_reason": VALUES},
    ),
    st.fixed_dictionaries(
        {
            "role": st.just("assistant"),
            "content": st.none(),
            "tool_calls": st.lists(
                st.fixed_dictionaries(
                    {
                        "id": st.one_of(st.none(), TEXT),
                        "function": st.fixed_dictionaries(
                            {"name": st.sampled_from(["get_ride", "unknown", ""]), "arguments": VALUES}
                        ),
                    }
                ),
                max_size=3,
            ),
        }
    ),
)


@st.composite
def steps(draw: st.DrawFn, index: int) -> Step:
    return Step(
        index=index,
        span_id=f"{index:016x}",
        parent_span_id=None,
        depth=draw(st.integers(0, 3)),
        kind=draw(KINDS),
        name=draw(TEXT),
        span_type=draw(st.sampled_from(["generation", "tool", "agent", "other"])),
        start_time_ns=index,
        end_time_ns=index + 1,
        duration_ns=1,
        status=draw(STATUS),
        error=draw(st.one_of(st.none(), TEXT)),
        usage=draw(USAGE),
        role=draw(ROLES),
        content=draw(VALUES),
        output_message=draw(OUTPUT_MESSAGE),
        tool_name=draw(st.one_of(st.none(), TEXT)),
        tool_arguments=draw(VALUES),
        tool_result=draw(VALUES),
        input=draw(VALUES),
        output=draw(VALUES),
    )


@st.composite
def views(draw: st.DrawFn) -> TrajectoryView:
    count = draw(st.integers(0, 14))
    built = tuple(draw(steps(index)) for index in range(count))
    calls = tuple(
        ToolCall(
            name=draw(st.sampled_from(["get_ride", "issue_refund", "transfer_to_human", "x", ""])),
            call_id=draw(st.one_of(st.none(), TEXT)),
            arguments=draw(VALUES),
            result=draw(VALUES),
            error=draw(st.one_of(st.none(), TEXT)),
            status=draw(STATUS),
            span_id="0",
            step_index=draw(st.integers(-2, count + 2)),
            source=draw(st.sampled_from(["span", "messages"])),
        )
        for _ in range(draw(st.integers(0, 8)))
    )
    return TrajectoryView(
        trace_id="0" * 32,
        status=draw(st.sampled_from(["ok", "error", "running"])),
        root_span_id=None,
        root_span_name=None,
        start_time_ns=0,
        end_time_ns=count,
        steps=built,
        conversation=tuple(draw(st.lists(st.dictionaries(KEYS, VALUES, max_size=3), max_size=4))),
        tool_calls=calls,
        totals=Totals(
            input_tokens=draw(st.integers(0, 10**7)),
            output_tokens=0,
            total_tokens=draw(st.integers(0, 10**7)),
            cache_read_tokens=0,
            reasoning_tokens=0,
            cost_usd=None,
            duration_ns=draw(st.integers(0, 10**13)),
            span_count=count,
            step_count=count,
            llm_call_count=0,
            tool_call_count=len(calls),
            error_count=0,
        ),
        session_id=None,
        user_id=None,
        agent_name=None,
        tags=(),
        prompt_versions=(),
        tool_definitions=tuple(draw(st.lists(st.one_of(st.just(LOOKUP), st.dictionaries(KEYS, VALUES)), max_size=3))),
        task_id=None,
        reward=None,
    )


ODD_PHRASES = dataclasses.replace(
    ENGLISH_PHRASES, correction=("", "!!!", "no", "x" * 300), gratitude=(), stopwords=frozenset()
)
CONFIGS = st.builds(
    SignalConfig,
    phrases=st.sampled_from([{"en": ENGLISH_PHRASES}, {"en": ODD_PHRASES}, {}]),
    known_tools=st.dictionaries(TEXT, st.one_of(st.none(), st.dictionaries(KEYS, VALUES, max_size=3)), max_size=3),
    tool_result_shapes=st.dictionaries(
        st.sampled_from(["get_ride", "issue_refund"]),
        st.lists(st.dictionaries(TEXT, st.sampled_from(["string", "number", "object"]), max_size=3), max_size=3),
        max_size=2,
    ),
    max_steps=st.one_of(st.none(), st.integers(0, 5)),
    context_window_tokens=st.one_of(st.none(), st.integers(0, 1000)),
    max_output_tokens=st.one_of(st.none(), st.integers(0, 1000)),
    token_budget=st.one_of(st.none(), st.integers(0, 1000)),
    time_budget_seconds=st.one_of(st.none(), st.floats(0, 10)),
    weights=st.dictionaries(st.sampled_from(list(SIGNAL_CATEGORIES)), st.floats(allow_nan=True), max_size=4),
    thresholds=st.builds(Thresholds, max_text_chars=st.integers(0, 50), snippet_chars=st.integers(1, 20)),
)


def check(report: Any) -> None:
    assert report.detector_errors == ()
    assert 0.0 <= report.triage_score <= 1.0
    for instance in report.instances:
        assert instance.signal in SIGNAL_CATEGORIES
        assert 0.0 <= instance.severity <= 1.0


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(views(), st.one_of(st.none(), CONFIGS))
def test_random_views_never_break_a_detector(view: TrajectoryView, config: SignalConfig | None) -> None:
    check(signals_compute(view, config))


EVENTS = st.lists(
    st.one_of(
        st.tuples(st.just("user"), st.one_of(TEXT, VALUES)),
        st.tuples(st.just("say"), TEXT),
        st.tuples(st.just("call"), st.tuples(st.sampled_from(["get_ride", "issue_refund", "nope"]), VALUES, VALUES)),
        st.tuples(st.just("error"), TEXT),
    ),
    max_size=12,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(EVENTS)
def test_random_conversations_through_ingest_never_break_a_detector(events: list[tuple[str, Any]]) -> None:
    run = Run()
    for action, value in events:
        if action == "user":
            run.user(value)
        elif action == "say":
            run.say(value)
        elif action == "call":
            name, arguments, result = value
            run.call(name, arguments, result)
        else:
            run.llm_error(value or "error")
    check(run.report())
