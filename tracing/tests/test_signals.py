"""Triage signals: each detector on trajectories that show it and on ones that must not, plus the score."""

from __future__ import annotations

import dataclasses
import json
import re
import signal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracing import otlp, signals
from tracing.signals import (
    DEFAULT_WEIGHTS,
    ENGLISH_PHRASES,
    DetectorError,
    SignalCategory,
    SignalConfig,
    SignalInstance,
    SignalReport,
    cascade_markers,
    schema_violations,
    signals_compute,
    tool_result_shape,
    triage_score,
)
from tracing.steps import TrajectoryView, trajectory_view_build

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
ROOT_ID = "00f067aa0ba902b7"

LOOKUP: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_ride",
        "parameters": {
            "type": "object",
            "properties": {"ride_id": {"type": "string"}, "verbose": {"type": "boolean"}},
            "required": ["ride_id"],
            "additionalProperties": False,
        },
    },
}
REFUND = {
    "type": "function",
    "function": {
        "name": "issue_refund",
        "parameters": {
            "type": "object",
            "properties": {"ride_id": {"type": "string"}, "amount": {"type": "number"}},
            "required": ["ride_id", "amount"],
        },
    },
}
HANDOFF = {
    "type": "function",
    "function": {"name": "transfer_to_human", "parameters": {"type": "object", "properties": {"reason": {}}}},
}


class Run:
    """One agent run written as GenAI spans: an `invoke_agent` root, `chat` spans, `execute_tool` spans.

    Step indices follow: 0 is the root; a user turn becomes a message step just before the chat that
    first shows it; each chat is one llm_call step; each tool call adds its tool_call step after it.
    """

    def __init__(self, tools: tuple[dict[str, Any], ...] = (LOOKUP, REFUND, HANDOFF)) -> None:
        self.tools = tools
        self.history: list[dict[str, Any]] = []
        self.spans: list[otlp.Span] = []
        self.clock = 1_000
        self.calls = 0

    def _span(self, name: str, attributes: dict[str, Any], *, status_code: int = 0, message: str = "") -> None:
        self.clock += 10
        span_id = f"{len(self.spans) + 1:016x}"
        raw = otlp.RawSpan(
            trace_id=TRACE_ID,
            span_id=span_id,
            parent_span_id=ROOT_ID,
            name=name,
            kind=1,
            start_time_ns=self.clock,
            end_time_ns=self.clock + 5,
            status_code=status_code,
            status_message=message,
            attributes=attributes,
            events=(),
            resource_attributes={"service.name": "ride-support"},
            scope_name="tests",
            scope_version="1",
            truncated_attributes={},
        )
        self.spans.append(otlp.map_span(raw))

    def _chat(
        self, output: dict[str, Any] | None, *, error: str | None = None, usage: dict[str, int] | None = None
    ) -> None:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": "gpt-4o",
            "gen_ai.input.messages": json.dumps(self.history),
        }
        if output is not None:
            attributes["gen_ai.output.messages"] = json.dumps([output])
        attributes.update({f"gen_ai.usage.{key}": value for key, value in (usage or {}).items()})
        self._span("chat gpt-4o", attributes, status_code=2 if error else 0, message=error or "")
        if output is not None:
            self.history.append(output)

    def user(self, content: Any) -> Run:
        if isinstance(content, str):
            self.history.append({"role": "user", "parts": [{"type": "text", "content": content}]})
        else:
            self.history.append({"role": "user", "content": content})
        return self

    def say(self, text: str, *, finish_reason: str | None = None, **usage: int) -> Run:
        message: dict[str, Any] = {"role": "assistant", "parts": [{"type": "text", "content": text}]}
        if finish_reason is not None:
            message["finish_reason"] = finish_reason
        self._chat(message, usage=usage)
        return self

    def llm_error(self, message: str) -> Run:
        self._chat(None, error=message)
        return self

    def unrecorded(self) -> Run:
        """An LLM call whose output the instrumentation did not record."""
        self._chat(None)
        return self

    def call(self, name: str, arguments: Any, result: Any, *, error: str | None = None) -> Run:
        self.calls += 1
        call_id = f"call_{self.calls}"
        self._chat(
            {"role": "assistant", "parts": [{"type": "tool_call", "id": call_id, "name": name, "arguments": arguments}]}
        )
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": name,
            "gen_ai.tool.call.id": call_id,
            "gen_ai.tool.call.arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
        }
        if result is not None:
            attributes["gen_ai.tool.call.result"] = result if isinstance(result, str) else json.dumps(result)
        self._span(f"execute_tool {name}", attributes, status_code=2 if error else 0, message=error or "")
        self.history.append(
            {"role": "tool", "parts": [{"type": "tool_call_response", "id": call_id, "response": result}]}
        )
        return self

    def view(self, *, root_output: Any = None, root_error: str | None = None, root_input: Any = None) -> TrajectoryView:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": "ride-support",
            "keel.tool.definitions": json.dumps(list(self.tools)),
        }
        if root_input is not None:
            attributes["gen_ai.input.messages"] = json.dumps(root_input)
        if root_output is not None:
            attributes["keel.output"] = json.dumps(root_output)
        root = otlp.map_span(
            otlp.RawSpan(
                trace_id=TRACE_ID,
                span_id=ROOT_ID,
                parent_span_id=None,
                name="invoke_agent ride-support",
                kind=2,
                start_time_ns=1_000,
                end_time_ns=self.clock + 100,
                status_code=2 if root_error else 0,
                status_message=root_error or "",
                attributes=attributes,
                events=(),
                resource_attributes={"service.name": "ride-support"},
                scope_name="tests",
                scope_version="1",
                truncated_attributes={},
            )
        )
        return trajectory_view_build([root, *self.spans])

    def report(self, config: SignalConfig | None = None, **view: Any) -> SignalReport:
        return signals_compute(self.view(**view), config)


def tool_steps(view: TrajectoryView) -> tuple[int, ...]:
    return tuple(step.index for step in view.steps if step.kind == "tool_call")


def only(report: SignalReport, signal: str) -> list[SignalInstance]:
    return [instance for instance in report.instances if instance.signal == signal]


def kinds(report: SignalReport) -> set[tuple[str, str]]:
    return {(instance.signal, instance.kind) for instance in report.instances}


# --- Misalignment ------------------------------------------------------------------------------------------


def test_a_last_user_message_that_only_the_agent_span_holds_is_a_turn() -> None:
    run = Run().user("Refund my ride.").say("I can offer a $5 voucher.").user("Forget it.")
    # Where no span holds it, nothing can see it.
    assert [step.kind for step in run.view().steps] == ["agent", "message", "llm_call"]

    view = run.view(root_input=run.history)

    assert [(step.kind, step.role) for step in view.steps] == [
        ("agent", None),
        ("message", "user"),
        ("llm_call", None),
        ("message", "user"),
    ]
    (instance,) = only(signals_compute(view), "disengagement")
    assert (instance.kind, instance.step_indices, instance.snippets) == ("quit", (3,), ("Forget it.",))


def test_a_correction_is_misalignment_with_the_users_words_as_evidence() -> None:
    report = (
        Run()
        .user("Refund my ride to the airport yesterday.")
        .say("I refunded your ride to Oak Street.")
        .user("No, I meant the ride to the airport, not Oak Street.")
        .say("Sorry about that, the airport ride is refunded now.")
        .report()
    )
    assert only(report, "misalignment") == [
        SignalInstance(
            signal="misalignment",
            kind="correction",
            category="interaction",
            severity=0.7,
            level="warning",
            step_indices=(3,),
            snippets=("No, I meant the ride to the airport, not Oak Street.",),
            why='The user corrects the agent ("no i meant").',
        )
    ]


def test_asking_the_same_thing_again_in_other_words_is_a_rephrase_of_both_turns() -> None:
    report = (
        Run()
        .user("What were total sales by region for 2023?")
        .say("Here is the customer count per country.")
        .user("I want the total sales for each region in 2023.")
        .say("North $1M, South $2M.")
        .report()
    )
    (instance,) = only(report, "misalignment")
    assert (instance.kind, instance.step_indices, instance.severity) == ("rephrase", (1, 3), 0.6)
    assert instance.snippets == (
        "What were total sales by region for 2023?",
        "I want the total sales for each region in 2023.",
    )


@pytest.mark.parametrize(
    "follow_up",
    [
        "Now show me sales by region for 2024.",
        "What about sales by region for 2022?",
        "Yes, sales by region for 2023 please.",
        "No thanks, that's all.",
    ],
)
def test_a_new_related_request_or_an_answer_is_not_misalignment(follow_up: str) -> None:
    report = (
        Run()
        .user("Show me sales by region for 2023.")
        .say("North $1M, South $2M, East $3M, West $4M.")
        .user(follow_up)
        .say("Done.")
        .report()
    )
    assert only(report, "misalignment") == []


def _system(run: Run, text: str) -> Run:
    """Start a new model call's context, as a chain step or a sub-agent does: its own system prompt."""
    run.history = [{"role": "system", "parts": [{"type": "text", "content": text}]}]
    return run


def test_a_request_handed_to_a_later_chain_step_is_not_the_user_asking_again() -> None:
    """Keel's gateway chain tier (and any pipeline of model calls) gives each step the user's request
    and the previous step's output as "user" messages: the user spoke once."""
    question = "Do I get my money back if the driver cancels my ride?"
    run = _system(Run(), "Classify the rider's request.").user(question)
    run.say(f'{{"intent": "refund", "summary": "{question}"}}')
    _system(run, "Answer the rider using the classification.").user(question)
    run.user(f'Output of step classify: {{"summary": "{question}"}} Now do step answer.')
    run.say("Yes: when the driver cancels, the fare is refunded in full to your card within 3 days.")
    report = run.report()
    assert report.instances == ()
    assert report.triage_score == 0.0


def test_a_system_prompt_before_the_dialogue_leaves_the_users_turns_read() -> None:
    run = _system(Run(), "You are the ride support bot.").user("What were total sales by region for 2023?")
    run.say("Here is the customer count per country.").user("I want the total sales for each region in 2023.")
    (instance,) = only(run.say("North $1M, South $2M.").report(), "misalignment")
    assert (instance.kind, instance.step_indices) == ("rephrase", (2, 4))


def test_a_user_who_does_not_follow_is_misalignment_of_kind_clarification() -> None:
    report = (
        Run()
        .user("Refund my ride.")
        .say("Your fare class was recomputed.")
        .user("What do you mean?")
        .say("Sorry.")
        .report()
    )
    assert [(i.kind, i.step_indices) for i in only(report, "misalignment")] == [("clarification", (3,))]


# --- Stagnation -------------------------------------------------------------------------------------------

STALL = "I'm still looking into this for you and will update you as soon as I have more information."


def test_the_same_answer_again_without_new_work_is_repetition() -> None:
    report = (
        Run()
        .user("Where is my refund?")
        .say(STALL)
        .user("Any update?")
        .say(STALL.replace("I'm", "I am"))
        .user("Hello?")
        .say(STALL + " Thanks for waiting.")
        .report()
    )
    instances = only(report, "stagnation")
    assert [(i.kind, i.step_indices, i.severity) for i in instances] == [
        ("repetition", (2, 4), 0.55),
        ("repetition", (2, 6), 0.55),
    ]
    assert [instance.why for instance in instances] == [
        "The assistant repeats an earlier answer (94% alike) without new work in between.",
        "The assistant repeats an earlier answer (87% alike) without new work in between.",
    ]


def test_similar_answers_after_new_tool_work_are_not_stagnation() -> None:
    run = Run().user("Check rides R-1 and R-2.")
    run.call("get_ride", {"ride_id": "R-1"}, {"status": "completed"}).say("Ride R-1 to the airport was completed.")
    run.call("get_ride", {"ride_id": "R-2"}, {"status": "completed"}).say("Ride R-2 to the airport was completed.")
    assert only(run.report(), "stagnation") == []


def test_answers_that_add_nothing_new_three_times_in_a_row_are_no_progress() -> None:
    run = Run().user("Fix my billing problem.")
    run.say("Your billing problem is under review by the billing system right now.")
    for nudge, answer in (
        ("ok?", "The billing system review of your problem is still running right now."),
        ("and?", "Right now the billing problem review is running in the system."),
        ("so?", "The review of the billing problem is running in the billing system."),
    ):
        run.user(nudge).say(answer)
    instances = [i for i in only(run.report(), "stagnation") if i.kind == "no_progress"]
    assert [(i.step_indices, i.severity) for i in instances] == [((4, 6, 8), 0.6)]


# --- Disengagement ----------------------------------------------------------------------------------------


def test_giving_up_is_disengagement_of_kind_quit() -> None:
    report = (
        Run().user("Refund my ride.").say("Which ride?").user("Forget it, I'll do it myself.").say("Sorry.").report()
    )
    assert [(i.kind, i.step_indices, i.level) for i in only(report, "disengagement")] == [("quit", (3,), "error")]


def test_asking_for_a_person_is_disengagement_but_the_handoff_is_not_a_failure() -> None:
    run = Run().user("I was in an accident during my ride. I want to talk to a real person.")
    run.call("transfer_to_human", {"reason": "safety incident"}, {"status": "queued"})
    run.say("I'm transferring you to our safety team; a human agent will join shortly.")
    report = run.report()
    assert [(i.kind, i.step_indices) for i in only(report, "disengagement")] == [("human_request", (1,))]
    assert only(report, "failure") == []
    assert report.signals == {"disengagement"}


def test_an_escalation_the_user_did_not_ask_for_raises_no_signal() -> None:
    run = Run().user("My ride was $300 because of a detour. Please refund all of it.")
    run.call("get_ride", {"ride_id": "R-9"}, {"ride_id": "R-9", "fare": 300})
    run.call("transfer_to_human", {"reason": "refund above $100"}, {"status": "queued", "error": None})
    run.say("Refunds over $100 need a person, so I've escalated your refund; a colleague will email you today.")
    report = run.report()
    assert report.instances == ()
    assert report.triage_score == 0.0


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("THIS IS NOT WHAT I PAID FOR", "The user writes in capitals."),
        ("Why is it charging me twice??", "The user's punctuation shows frustration."),
        ("This is ridiculous.", 'The user is unhappy ("ridiculous").'),
    ],
)
def test_negative_stance(text: str, why: str) -> None:
    report = Run().user("Refund my ride.").say("Done, $5 refunded.").user(text).say("Let me look again.").report()
    assert [(i.kind, i.step_indices, i.why) for i in only(report, "disengagement")] == [("negative_stance", (3,), why)]


@pytest.mark.parametrize(
    "opening",
    [
        "Please cancel my account, I'm moving abroad.",
        "The app doesn't work when I log in, can you help?",
        "My card was charged twice, this is frustrating.",
        "WHY WAS I CHARGED TWICE FOR ONE RIDE",
    ],
)
def test_an_opening_request_that_names_a_problem_is_not_disengagement(opening: str) -> None:
    """The user has not met the agent yet: the words name the task or the problem, not giving up on it."""
    solved = Run().user(opening).say("Done: I have sorted that out for you.").user("Perfect, thank you.").report()
    assert only(solved, "disengagement") == []
    # The same words once the agent has answered are disengagement, on that turn.
    later = Run().user("Hello.").say("Hi! How can I help?").user(opening).say("Let me look into it.").report()
    assert [i.step_indices for i in only(later, "disengagement")] == [(3,)]


def test_thanks_with_exclamation_marks_is_not_negative() -> None:
    report = Run().user("Refund my ride.").say("Done, $5 refunded.").user("Thank you!!").say("Welcome.").report()
    assert only(report, "disengagement") == []


def test_a_trajectory_ending_on_the_agents_clarifying_question_is_not_disengagement() -> None:
    """One trace per request: the agent asks, and the user's answer opens the session's next trajectory."""
    question = "I see two bookings, Paris on May 3 and Rome on May 9. Which booking do you mean?"
    first = Run().user("Cancel my booking.").say(question)
    assert only(first.report(), "disengagement") == []
    # The next request of the session: its LLM call reads the history, the user's answer and replies.
    second = Run()
    second.history = [*first.history]
    second.user("The Paris one.").say("Done: your Paris booking on May 3 is cancelled.")
    assert only(second.report(), "disengagement") == []


ASKED = "Where is the refund for ride R-1?"


@pytest.mark.parametrize(
    ("run", "only_the_agent_span_holds_it", "step", "question"),
    [
        # The agent looked the ride up and stopped without a word.
        (
            Run().user(ASKED).call("get_ride", {"ride_id": "R-1"}, {"ride_id": "R-1", "state": "refunded"}),
            False,
            1,
            ASKED,
        ),
        # The model call that should have answered failed.
        (Run().user(ASKED).llm_error("upstream connect error"), False, 1, ASKED),
        # A question after the agent's answer that no model call read.
        (
            Run().user("Refund ride R-1.").say("Refunded $5.").user("When is it on my card?"),
            True,
            3,
            "When is it on my card?",
        ),
    ],
)
def test_a_users_question_the_agent_never_answers_is_unanswered_question(
    run: Run, only_the_agent_span_holds_it: bool, step: int, question: str
) -> None:
    report = run.report(root_input=run.history) if only_the_agent_span_holds_it else run.report()
    (instance,) = only(report, "disengagement")
    assert (instance.kind, instance.step_indices, instance.severity) == ("unanswered_question", (step,), 0.6)
    assert instance.snippets == (question,)


def test_a_users_question_that_was_answered_handed_off_or_unrecorded_is_not_unanswered() -> None:
    answered = Run().user(ASKED).say("It reached your card on Monday.")
    handed_off = Run().user(ASKED).call("transfer_to_human", {"reason": "refund"}, None)
    # The instrumentation did not record the output: the agent may well have answered.
    unrecorded = Run().user(ASKED).unrecorded()
    not_a_question = Run().user("Refund ride R-1.").call("get_ride", {"ride_id": "R-1"}, {"state": "completed"})
    for run in (answered, handed_off, unrecorded, not_a_question):
        assert only(run.report(), "disengagement") == []
    # Stopped by its step limit before it could answer: exhaustion says so, not disengagement.
    stopped = (
        Run().user(ASKED).call("get_ride", {"ride_id": "R-1"}, {"state": "refunded"}).report(SignalConfig(max_steps=1))
    )
    assert (only(stopped, "disengagement"), [i.kind for i in only(stopped, "exhaustion")]) == ([], ["max_steps"])


def test_ending_on_a_closing_question_is_not_disengagement() -> None:
    report = Run().user("Refund my ride.").say("Refunded $5. Is there anything else I can help you with?").report()
    assert only(report, "disengagement") == []


def test_a_conversation_ending_on_a_reported_failure_is_disengagement() -> None:
    run = Run().user("Refund ride R-1.")
    run.call("issue_refund", {"ride_id": "R-1", "amount": 5}, {"status": "error", "message": "gateway down"})
    run.say("I'm sorry, I was unable to issue the refund.")
    report = run.report()
    assert [(i.kind, i.step_indices) for i in only(report, "disengagement")] == [("left_after_error", (4,))]


# --- Satisfaction -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kind", "severity"),
    [
        ("It worked, thanks!", "success", 0.7),
        ("That works for me.", "confirmation", 0.6),
        ("Thanks!", "gratitude", 0.5),
    ],
)
def test_satisfaction(text: str, kind: str, severity: float) -> None:
    report = Run().user("Refund my ride.").say("Refunded $5.").user(text).say("Glad to help.").report()
    assert [(i.kind, i.severity, i.level, i.category) for i in only(report, "satisfaction")] == [
        (kind, severity, "info", "interaction")
    ]


def test_sarcastic_thanks_is_not_satisfaction() -> None:
    report = Run().user("Refund my ride.").say("I can't.").user("Thanks for nothing.").say("Sorry.").report()
    assert only(report, "satisfaction") == []
    assert [i.kind for i in only(report, "disengagement")] == ["negative_stance"]


def test_thanks_before_the_agent_spoke_is_not_satisfaction() -> None:
    report = Run().user("Thanks in advance: refund my ride.").say("Refunded.").report()
    assert only(report, "satisfaction") == []


# --- Failure ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("result", "kind", "snippet"),
    [
        ({"status": "error", "message": "locked"}, "status_field", "status=error"),
        ({"ok": False, "error": {"code": "E1"}}, "status_field", "ok=false"),
        ({"success": False, "reason": "nope"}, "status_field", "success=false"),
        ({"isError": True, "content": []}, "status_field", "isError=true"),
        ({"error": {"message": "bad ride id"}}, "error_key", "error"),
        ({"errors": [{"message": "bad"}]}, "error_key", "errors"),
        ({"exception": "KeyError('x')"}, "error_key", "exception"),
        ({"status_code": 503, "body": "unavailable"}, "http_status", "status_code=503"),
        ({"code": 404, "message": "ride not found"}, "http_status", "code=404"),
        ({"response": {"status": 500}}, "http_status", "status=500"),
        ({"exit_code": 2, "stdout": "", "stderr": "usage"}, "exit_code", "exit_code=2"),
        ("Traceback (most recent call last):\n  File 'x.py'\nKeyError: 'ride'", "exception_text", "Traceback"),
        ("Error: ride R-1 is locked", "exception_text", "Error: ride R-1 is locked"),
        ("loading rides\n" + "ok\n" * 500 + "psycopg.OperationalError: connection lost", "exception_text", "loading"),
        ("HTTP/1.1 404 Not Found", "exception_text", "HTTP/1.1 404"),
        ("HTTP Error 502: Bad Gateway", "exception_text", "HTTP Error 502"),
        ("503 Server Error: Service Unavailable for url: https://rides/R-1", "exception_text", "503 Server"),
        ("Request failed with status code 500", "exception_text", "Request failed"),
        ("Failed to connect to rides-db:5432", "exception_text", "Failed to"),
        ("bash: rides: command not found", "exception_text", "bash: rides"),
        ("Unknown tool: drop_table", "exception_text", "Unknown tool"),
    ],
)
def test_tool_errors_in_any_shape_are_failures(result: Any, kind: str, snippet: str) -> None:
    run = Run().user("Check ride R-1.").call("get_ride", {"ride_id": "R-1"}, result).say("Ride R-1 is fine.")
    (instance,) = only(run.report(), "failure")
    assert (instance.kind, instance.step_indices, instance.category) == (kind, (3,), "execution")
    assert instance.snippets[0].startswith(snippet)
    assert instance.why.startswith("The call to get_ride failed")


def test_a_tool_span_in_error_is_a_failure() -> None:
    run = Run().user("Check ride R-1.").call("get_ride", {"ride_id": "R-1"}, None, error="connection reset by peer")
    (instance,) = only(run.say("Sorry.").report(), "failure")
    assert (instance.kind, instance.step_indices, instance.snippets) == (
        "span_error",
        (3,),
        ("connection reset by peer",),
    )


def test_an_llm_call_in_error_is_a_failure_of_that_step() -> None:
    report = Run().user("Hi").llm_error("Internal server error from the provider").report()
    assert [(i.kind, i.step_indices, i.severity) for i in only(report, "failure")] == [("span_error", (2,), 0.8)]


@pytest.mark.parametrize(
    "result",
    [
        {"status": "ok", "error": None, "errors": [], "error_rate": 0.01, "error_count": 0},
        {"errors": 3, "warnings": 1},
        {"ok": True, "status_code": 200},
        {"exit_code": 0, "stdout": "lint: no errors found\n0 errors, 2 warnings"},
        "2026-01-03 INFO build finished, no errors found\nerror_rate: 0.01\n0 errors",
        "def load(x):\n    try:\n        return parse(x)\n    except ValueError:\n        return None\n",
        {"rides": [{"ride_id": "R-1", "error_margin": 0.2, "status": "completed"}] * 200},
        # A documentation search: prose about HTTP statuses and errors, not a failed call.
        "HTTP 404 means the resource was not found.",
        "Status codes\n\nA lookup of a ride that does not exist returns HTTP 404. While the service restarts,\n"
        "expect status 503 and retry. Permission denied errors mean the key lacks the rides:read scope.",
        "A ride that changed since it was read returns status code 409; read it again.",
        "Error handling: wrap calls in try/except and log the HTTP 500 response body.",
    ],
)
def test_benign_error_words_and_successful_results_are_not_failures(result: Any) -> None:
    run = Run().user("Check ride R-1.").call("get_ride", {"ride_id": "R-1"}, result).say("All good.")
    assert only(run.report(), "failure") == []


# --- Loop -------------------------------------------------------------------------------------------------


def test_the_same_call_with_the_same_result_three_times_is_a_retry_loop() -> None:
    run = Run().user("Where is ride R-1?")
    for _ in range(3):
        run.call("get_ride", {"ride_id": "R-1"}, {"status": "pending"})
    view = run.say("It is pending.").view()
    (instance,) = only(signals_compute(view), "loop")
    assert (instance.kind, instance.step_indices, instance.severity, instance.category) == (
        "retry",
        tool_steps(view),
        0.6,
        "execution",
    )
    assert instance.step_indices == (3, 5, 7)
    assert instance.why == "get_ride was called 3 times in a row with the same arguments and result."


def test_cycling_between_two_argument_sets_is_a_loop() -> None:
    run = Run().user("Find my ride.")
    for _ in range(2):
        run.call("get_ride", {"ride_id": "R-1"}, {"found": False})
        run.call("get_ride", {"ride_id": "R-2"}, {"found": False})
    view = run.view()
    (instance,) = only(signals_compute(view), "loop")
    assert (instance.kind, instance.step_indices) == ("cycling_arguments", tool_steps(view))
    assert len(instance.step_indices) == 4


def test_a_repeated_pattern_of_calls_is_a_loop() -> None:
    run = Run().user("Refund ride R-1.")
    for _ in range(3):
        run.call("get_ride", {"ride_id": "R-1"}, {"fare": 10})
        run.call("issue_refund", {"ride_id": "R-1", "amount": 10}, {"status": "pending"})
    view = run.view()
    (instance,) = only(signals_compute(view), "loop")
    assert (instance.kind, instance.why) == ("repeated_pattern", "The calls get_ride → issue_refund repeat 3 times.")
    assert instance.step_indices == tool_steps(view)
    assert len(instance.step_indices) == 6


def test_polling_with_progress_and_searching_with_new_arguments_are_not_loops() -> None:
    run = Run().user("Wait for my refund, then find ride R-4.")
    for state, progress in (("queued", 0), ("running", 40), ("running", 80), ("done", 100)):
        run.call("get_ride", {"ride_id": "R-1"}, {"state": state, "progress": progress})
    for ride in ("R-2", "R-3", "R-4", "R-5"):
        run.call("get_ride", {"ride_id": ride}, {"found": ride == "R-4"})
    report = run.say("Refund done; ride R-4 found.").report()
    assert only(report, "loop") == []
    assert only(report, "infinite_loop") == []


# --- Exhaustion and context exhaustion --------------------------------------------------------------------


def test_a_rate_limit_is_exhaustion_not_failure() -> None:
    run = Run().user("Check ride R-1.")
    run.call("get_ride", {"ride_id": "R-1"}, {"status_code": 429, "error": "Too Many Requests"})
    run.call("get_ride", {"ride_id": "R-1"}, {"status": "completed"})
    report = run.say("Ride R-1 is completed.").report()
    assert kinds(report) == {("exhaustion", "rate_limit")}
    (instance,) = report.instances
    assert (instance.step_indices, instance.category, instance.level) == ((3,), "environment", "warning")


def test_context_overflow_is_exhaustion_and_context_exhaustion() -> None:
    report = (
        Run()
        .user("Summarise all my rides.")
        .llm_error("This model's maximum context length is 128000 tokens, your messages resulted in 131072.")
        .report()
    )
    assert kinds(report) == {("exhaustion", "context_overflow"), ("context_exhaustion", "context_overflow")}
    assert {i.step_indices for i in report.instances} == {(2,)}
    assert only(report, "context_exhaustion")[0].level == "error"


def test_input_tokens_near_the_configured_window_are_context_exhaustion() -> None:
    run = Run().user("Summarise.").say("Here is the summary.", input_tokens=126_000, output_tokens=50)
    report = run.report(SignalConfig(context_window_tokens=128_000))
    assert [i.snippets for i in only(report, "context_exhaustion")] == [("126000 input tokens of a 128000 window",)]


@pytest.mark.parametrize(
    ("view", "config", "kind"),
    [
        ({"root_output": {"termination_reason": "max_iterations"}}, None, "max_steps"),
        ({"root_output": {"stop_reason": "Agent stopped due to iteration limit or time limit."}}, None, "max_steps"),
        ({"root_error": "token budget exhausted after 200000 tokens"}, None, "token_budget"),
        ({}, SignalConfig(max_steps=1), "max_steps"),
        ({}, SignalConfig(max_output_tokens=400), "truncated_output"),
        ({}, SignalConfig(token_budget=500), "token_budget"),
        ({}, SignalConfig(time_budget_seconds=1e-9), "timeout"),
    ],
)
def test_limits_reached_are_exhaustion(view: dict[str, Any], config: SignalConfig | None, kind: str) -> None:
    run = Run().user("Plan my week of rides.").say("Monday: airport at 8:00, then", input_tokens=100, output_tokens=400)
    report = run.report(config, **view)
    assert [i.kind for i in only(report, "exhaustion")] == [kind]
    assert only(report, "failure") == []


def test_an_answer_cut_at_the_output_limit_is_truncated_output() -> None:
    run = Run().user("List my rides this week.").say("Monday: airport at 8:00, then", finish_reason="length")
    report = run.report()
    assert kinds(report) == {("exhaustion", "truncated_output")}
    (instance,) = report.instances
    assert (instance.step_indices, instance.snippets) == ((2,), ("length",))
    assert only(Run().user("List my rides.").say("None.", finish_reason="stop").report(), "exhaustion") == []


def test_a_timeout_is_exhaustion() -> None:
    run = Run().user("Check ride R-1.").call("get_ride", {"ride_id": "R-1"}, None, error="deadline exceeded after 30s")
    report = run.say("Ride R-1 is completed.").report()
    assert kinds(report) == {("exhaustion", "timeout")}


# --- Hallucinated tool calls ------------------------------------------------------------------------------


def test_a_call_to_a_tool_that_is_not_defined_is_hallucinated() -> None:
    run = Run().user("Refund ride R-1.").call("refund_instantly", {"ride_id": "R-1"}, {"status": "done"})
    (instance,) = only(run.say("Refunded.").report(), "hallucinated_tool_call")
    assert (instance.kind, instance.step_indices, instance.category, instance.level) == (
        "unknown_tool",
        (2,),
        "failure_mode",
        "error",
    )
    assert instance.why == "The agent called 'refund_instantly', which is not among its 2 defined tools."


@pytest.mark.parametrize(
    ("arguments", "violation"),
    [
        ({}, "$: missing required property 'ride_id'"),
        ({"ride_id": 7}, "$.ride_id: expected string, got number"),
        ({"ride_id": "R-1", "include_archived": True}, "$: unknown property 'include_archived'"),
        ({"ride_id": "R-1", "verbose": "yes"}, "$.verbose: expected boolean, got string"),
    ],
)
def test_arguments_that_break_the_schema_are_hallucinated(arguments: dict[str, Any], violation: str) -> None:
    run = Run().user("Check ride R-1.").call("get_ride", arguments, {"status": "completed"})
    (instance,) = only(run.say("Done.").report(), "hallucinated_tool_call")
    assert (instance.kind, instance.step_indices, instance.snippets) == ("schema_violation", (2,), (violation,))


def test_arguments_that_are_not_json_are_hallucinated() -> None:
    run = Run().user("Check ride R-1.").call("get_ride", "{ride_id: R-1", {"status": "completed"})
    assert [i.kind for i in only(run.say("Done.").report(), "hallucinated_tool_call")] == ["invalid_arguments"]


def test_valid_calls_and_agents_without_definitions_raise_nothing() -> None:
    valid = Run().user("Check ride R-1.").call("get_ride", {"ride_id": "R-1", "verbose": True}, {"status": "ok"})
    assert only(valid.say("Done.").report(), "hallucinated_tool_call") == []
    undefined = Run(tools=()).user("Check ride R-1.").call("anything", {"x": 1}, {"status": "ok"})
    assert only(undefined.say("Done.").report(), "hallucinated_tool_call") == []


def test_tools_known_from_the_config_count_as_defined() -> None:
    run = Run(tools=()).user("Check ride R-1.").call("get_ride", {"ride": "R-1"}, {"status": "ok"})
    config = SignalConfig(known_tools={"get_ride": LOOKUP["function"]["parameters"], "issue_refund": None})
    (instance,) = only(run.say("Done.").report(config), "hallucinated_tool_call")
    assert instance.snippets == ("$: missing required property 'ride_id'", "$: unknown property 'ride'")


def test_schema_violations_cover_the_subset_tools_use() -> None:
    schema = {
        "type": "object",
        "properties": {
            "cabin": {"type": "string", "enum": ["economy", "business"]},
            "seats": {"type": "integer", "minimum": 1, "maximum": 9},
            "names": {"type": "array", "items": {"type": "string", "minLength": 2}},
            "when": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "extra": {"type": "object", "additionalProperties": {"type": "number"}},
        },
    }
    value = {"cabin": "first", "seats": 12, "names": ["Al", "B"], "when": 5, "extra": {"a": 1, "b": "x"}}
    assert schema_violations(value, schema) == [
        "$.cabin: 'first' is not one of ['economy', 'business']",
        "$.seats: 12 is above the maximum 9",
        "$.names[1]: shorter than 2 characters",
        "$.when: matches none of the allowed schemas",
        "$.extra.b: expected number, got string",
    ]
    assert schema_violations(True, {"type": "integer"}) == ["$: expected integer, got boolean"]
    assert schema_violations(3.0, {"type": "integer"}) == []
    assert schema_violations({"a": 1}, {"unsupported": "keyword"}) == []


# --- Cascading errors -------------------------------------------------------------------------------------


def test_an_id_from_a_failed_call_used_by_a_later_call_is_a_cascading_error() -> None:
    run = Run().user("Refund my last ride.")
    run.call("get_ride", {"ride_id": "last"}, {"status": "error", "message": "degraded", "fallback_id": "TMP-40213"})
    run.call("issue_refund", {"ride_id": "TMP-40213", "amount": 12}, {"status": "processed"})
    report = run.say("Your last ride is refunded.").report()
    (instance,) = only(report, "cascading_error")
    assert (instance.kind, instance.step_indices, instance.level) == ("error_consumed", (3, 5), "error")
    assert instance.snippets == ("status=error", "issue_refund uses 'TMP-40213' from the failed get_ride output")


def test_an_answer_that_relays_a_failed_calls_placeholder_is_a_cascading_error() -> None:
    run = Run().user("Book my ride.")
    run.call("issue_refund", {"ride_id": "R-1", "amount": 3}, {"success": False, "reference": "TMP-55120"})
    report = run.say("All set, your reference is TMP-55120.").report()
    assert [i.step_indices for i in only(report, "cascading_error")] == [(3, 4)]


def test_reporting_a_failure_or_reusing_ids_the_user_gave_is_not_cascading() -> None:
    run = Run().user("Refund ride R-77123.")
    run.call("issue_refund", {"ride_id": "R-77123", "amount": 3}, {"status": "error", "ride": "R-77123"})
    run.call("issue_refund", {"ride_id": "R-77123", "amount": 3}, {"status": "processed"})
    run.say("Refunded ride R-77123.")
    failed = Run().user("Refund my ride.")
    failed.call("issue_refund", {"ride_id": "R-1", "amount": 3}, {"error": "declined", "reference": "ERR-90211"})
    failed.say("Sorry, the refund failed with error ERR-90211.")
    assert only(run.report(), "cascading_error") == []
    assert only(failed.report(), "cascading_error") == []


OLD_MARKER = re.compile(r"\b(?=[\w-]*\d)(?=[\w-]*[A-Za-z])[A-Za-z0-9][\w-]{3,}\b|\b\d{5,}\b")


@settings(max_examples=3000, deadline=None)
@given(st.text(alphabet="a1Z9_-. é١x", max_size=24))
def test_cascade_markers_are_what_the_documented_pattern_finds(text: str) -> None:
    assert cascade_markers(text) == OLD_MARKER.findall(text)


@given(st.text(alphabet=st.characters(max_codepoint=127), max_size=40) | st.text(max_size=12))
def test_normalized_text_has_the_words_the_documented_pattern_finds(text: str) -> None:
    # ASCII text is split by str.translate; other text by the pattern, after its quotes are made plain.
    lowered = text.lower()
    if not lowered.isascii():
        lowered = lowered.translate(signals._QUOTES)
    words = signals._WORD.findall(lowered)
    assert signals._normalize(text) == (" " + " ".join(words) + " " if words else " ")


def test_a_long_run_of_words_and_hyphens_does_not_hang_the_marker_scan() -> None:
    """`1-1-1-...` took the old pattern the square of its length (about 4 minutes for 100,000
    characters); the guard only catches a hang, it is 100 times what the scan needs."""

    def hung(*_: object) -> None:
        raise TimeoutError("the marker scan hangs")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(30)
    try:
        assert cascade_markers("1-" * 50_000) == []
        assert cascade_markers("a-" * 50_000 + "7") == ["a-" * 50_000 + "7"]
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# --- Goal drift -------------------------------------------------------------------------------------------


def test_a_final_answer_about_something_else_is_goal_drift() -> None:
    report = (
        Run()
        .user("I was charged twice for my airport ride yesterday, please refund the duplicate charge.")
        .say("Members save 15% on every trip and get free cancellations from the account menu.")
        .report()
    )
    (instance,) = only(report, "goal_drift")
    assert (instance.kind, instance.step_indices, instance.why) == (
        "off_request",
        (1, 2),
        "The final answer shares 0% of its content words with the user's request.",
    )


def test_answers_on_topic_short_or_handed_off_are_not_goal_drift() -> None:
    on_topic = (
        Run()
        .user("I was charged twice for my airport ride yesterday, please refund the duplicate charge.")
        .say("I refunded the duplicate charge for your airport ride yesterday; it reaches your card in 3 days.")
    )
    short = Run().user("Please refund the duplicate charge for my airport ride.").say("Done!")
    handed_off = (
        Run()
        .user("Please refund the duplicate charge for my airport ride.")
        .say("I'm transferring you to a billing specialist who can approve larger refunds for accounts like yours.")
    )
    for run in (on_topic, short, handed_off):
        assert only(run.report(), "goal_drift") == []


# --- Silent tool API change -------------------------------------------------------------------------------

HISTORY = {"get_ride": [{"ride_id": "string", "fare": "number", "status": "string"}] * 2}


@pytest.mark.parametrize(
    ("result", "detail"),
    [
        ({"ride_id": "R-1", "fare_cents": 1200, "status": "completed"}, "missing fare; new fare_cents"),
        ({"ride_id": "R-1", "fare": "12.00", "status": "completed"}, "type changed for fare"),
    ],
)
def test_a_result_shape_unlike_its_history_is_a_silent_api_change(result: dict[str, Any], detail: str) -> None:
    run = Run().user("Fare of R-1?").call("get_ride", {"ride_id": "R-1"}, result).say("It was $12.")
    (instance,) = only(run.report(SignalConfig(tool_result_shapes=HISTORY)), "silent_tool_api_change")
    assert (instance.kind, instance.step_indices, instance.snippets) == ("result_shape_changed", (3,), (detail,))


def test_added_fields_errors_and_tools_without_history_are_not_api_changes() -> None:
    run = Run().user("Fare of R-1?")
    run.call("get_ride", {"ride_id": "R-1"}, {"ride_id": "R-1", "fare": 12, "status": "ok", "request_id": "q1"})
    run.call("get_ride", {"ride_id": "R-2"}, {"error": "not found"})
    run.call("issue_refund", {"ride_id": "R-1", "amount": 1}, {"anything": True})
    assert only(run.say("It was $12.").report(SignalConfig(tool_result_shapes=HISTORY)), "silent_tool_api_change") == []


def test_tool_result_shape_reads_one_level_of_nesting() -> None:
    assert tool_result_shape('{"a": 1, "b": {"c": "x", "d": [1]}, "e": null}') == {
        "a": "number",
        "b": "object",
        "b.c": "string",
        "b.d": "array",
        "e": "null",
    }
    assert tool_result_shape("plain text") == {"": "string"}


# --- Infinite loop ----------------------------------------------------------------------------------------


def test_a_loop_past_the_hard_threshold_is_an_infinite_loop() -> None:
    run = Run().user("Where is ride R-1?")
    for _ in range(6):
        run.call("get_ride", {"ride_id": "R-1"}, {"status": "pending"})
    view = run.view()
    report = signals_compute(view)
    (instance,) = only(report, "infinite_loop")
    assert (instance.kind, instance.step_indices, instance.severity) == ("hard_threshold", tool_steps(view), 0.9)
    assert only(report, "loop")[0].severity == 0.75


def test_a_loop_at_the_step_limit_is_an_infinite_loop_and_a_short_one_is_not() -> None:
    run = Run().user("Where is ride R-1?")
    for _ in range(3):
        run.call("get_ride", {"ride_id": "R-1"}, {"status": "pending"})
    limited = run.report(root_output={"termination_reason": "max_steps"})
    assert [i.kind for i in only(limited, "infinite_loop")] == ["loop_at_step_limit"]
    assert only(run.report(), "infinite_loop") == []


# --- Configuration ----------------------------------------------------------------------------------------


def test_phrase_lists_are_per_language_and_replaceable() -> None:
    french = dataclasses.replace(ENGLISH_PHRASES, correction=("non je voulais dire",), gratitude=("merci",))
    config = SignalConfig(language="fr", phrases={"en": ENGLISH_PHRASES, "fr": french})
    run = (
        Run()
        .user("Remboursez ma course.")
        .say("Voici vos courses.")
        .user("Non, je voulais dire l'aéroport.")
        .say("D'accord.")
    )
    assert kinds(run.report(config)) >= {("misalignment", "correction")}
    assert ("misalignment", "correction") not in kinds(run.report())
    assert SignalConfig(language="de").phrase_lists is ENGLISH_PHRASES


# --- Triage score -----------------------------------------------------------------------------------------


def instance(signal: str, severity: float = 0.7) -> SignalInstance:
    category: SignalCategory = "interaction" if signal == "satisfaction" else "execution"
    return SignalInstance(signal, "kind", category, severity, "warning", (), (), "")


def test_the_triage_score_is_a_noisy_or_of_weighted_signal_strengths() -> None:
    assert triage_score([]) == 0.0
    assert triage_score([instance("failure", 0.7)]) == pytest.approx(0.6 * 0.7)
    two_failures = triage_score([instance("failure", 0.7), instance("failure", 0.7)])
    assert two_failures == pytest.approx(0.6 * (1 - 0.3 * 0.3))
    assert triage_score([instance("failure")] * 50) <= DEFAULT_WEIGHTS["failure"]
    both = triage_score([instance("failure", 0.7), instance("loop", 0.6)])
    assert both == pytest.approx(1 - (1 - 0.42) * (1 - 0.36))


def test_satisfaction_lowers_the_score_and_weights_are_configurable() -> None:
    failure = [instance("failure", 0.7)]
    assert triage_score([*failure, instance("satisfaction", 0.5)]) == pytest.approx(0.42 * (1 - 0.3 * 0.5))
    assert triage_score([instance("satisfaction", 0.5)]) == 0.0
    assert triage_score(failure, {"failure": 0.0}) == 0.0
    assert triage_score(failure, {"failure": 1.0}) == pytest.approx(0.7)
    assert triage_score(failure, {"failure": 5.0}) == pytest.approx(0.7)
    assert triage_score([instance("unknown_signal")]) == 0.0


def test_length_alone_does_not_raise_the_score() -> None:
    short = Run().user("Check ride R-1.").call("get_ride", {"ride_id": "R-1"}, {"status": "error"}).say("Ride R-1?")
    long = Run()
    for number in range(25):
        long.user(f"Check ride R-{number}.").call("get_ride", {"ride_id": f"R-{number}"}, {"status": "completed"})
        long.say(f"Ride R-{number} was completed on day {number} of the month.")
    assert long.report().triage_score == 0.0
    assert short.report().triage_score > 0.4


def test_the_config_weights_drive_the_reports_score() -> None:
    run = Run().user("Check ride R-1.").call("get_ride", {"ride_id": "R-1"}, {"status": "error"}).say("Sorry.")
    default = run.report()
    muted = run.report(SignalConfig(weights={"failure": 0.0, "disengagement": 0.0}))
    assert default.triage_score > 0.0
    assert muted.triage_score == 0.0
    assert muted.counts == default.counts


# --- Isolation and robustness -----------------------------------------------------------------------------


def test_a_detector_that_raises_is_recorded_and_the_others_still_run() -> None:
    def broken(analysis: Any) -> list[SignalInstance]:
        raise KeyError("missing field")

    def also_broken(analysis: Any) -> list[SignalInstance]:
        raise ZeroDivisionError("division by zero")

    from tracing.signals import DETECTORS

    run = Run().user("Check ride R-1.").call("get_ride", {"ride_id": "R-1"}, {"status": "error"})
    report = signals_compute(
        run.say("Done.").view(), detectors=(("broken", broken), *DETECTORS, ("also_broken", also_broken))
    )
    assert report.detector_errors == (
        DetectorError(detector="broken", message="KeyError: 'missing field'"),
        DetectorError(detector="also_broken", message="ZeroDivisionError: division by zero"),
    )
    assert report.counts == {"failure": 1}
    assert report.triage_score > 0


def test_an_empty_trajectory_has_no_signals() -> None:
    report = signals_compute(trajectory_view_build([]))
    assert (report.instances, report.detector_errors, dict(report.counts), report.triage_score) == ((), (), {}, 0.0)


def test_non_text_content_unknown_roles_and_missing_fields_do_not_break_detectors() -> None:
    run = Run().user([{"type": "image_url", "image_url": {"url": "data:..."}}, {"type": "text", "text": "Thanks"}])
    run.history.append({"role": "narrator", "content": "The user waits."})
    run.history.append({"role": "user", "content": {"unexpected": ["shape"]}})
    run.history.append({"role": "user", "content": None})
    run.history.append({"role": "assistant", "tool_calls": [{"function": None}, "junk", {"function": {"name": 3}}]})
    run.call("get_ride", None, None)
    run.call("get_ride", ["not", "an", "object"], 12.5)
    run.call("", {"ride_id": "R-1"}, {"nested": {"deeper": {"deepest": [1, {"x": None}]}}})
    run.say("")
    report = run.report()
    assert report.detector_errors == ()
    assert 0.0 <= report.triage_score <= 1.0


def test_a_one_megabyte_tool_result_is_cheap_and_still_read() -> None:
    huge_text = "x" * 1_000_000 + "\nRuntimeError: ran out of patience"
    huge_json = {"rows": [{"id": n, "note": "fine " * 20} for n in range(8000)], "status": "error"}
    run = Run().user("Export every ride.")
    run.call("get_ride", {"ride_id": "all"}, huge_text).call("get_ride", {"ride_id": "all", "verbose": True}, huge_json)
    run.say("Exported.").user("And the log?").llm_error("provider failure: " + "y" * 1_000_000)
    view = run.view()
    report = signals_compute(view)  # how fast: bench/bench_triage.py measures it, not this test
    assert [(i.kind, i.step_indices) for i in only(report, "failure")] == [
        ("exception_text", (3,)),
        ("status_field", (5,)),
        ("span_error", (8,)),
    ]
    assert all(len(snippet) <= 160 for i in report.instances for snippet in i.snippets)


def test_a_dialogue_known_only_from_the_agent_span_is_still_read() -> None:
    messages = [
        {"role": "user", "content": "Refund my ride to the airport."},
        {"role": "assistant", "content": "I refunded your ride to Oak Street."},
        {"role": "user", "content": "No, I meant the airport ride."},
    ]
    root = otlp.map_span(
        otlp.RawSpan(
            trace_id=TRACE_ID,
            span_id=ROOT_ID,
            parent_span_id=None,
            name="invoke_agent ride-support",
            kind=2,
            start_time_ns=1,
            end_time_ns=2,
            status_code=0,
            status_message="",
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.input.messages": json.dumps(messages),
                "gen_ai.output.messages": json.dumps(
                    [{"role": "assistant", "content": "The airport ride is refunded."}]
                ),
            },
            events=(),
            resource_attributes={},
            scope_name="tests",
            scope_version="1",
            truncated_attributes={},
        )
    )
    report = signals_compute(trajectory_view_build([root]))
    assert [(i.signal, i.kind, i.step_indices) for i in report.instances] == [("misalignment", "correction", (0,))]
