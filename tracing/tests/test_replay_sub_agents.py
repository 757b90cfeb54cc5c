"""Counterfactual replay from a step inside a sub-agent: the agent above it is resumed with the new answer."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import transaction
from django.test import Client

from agent_registry import services as registry_services
from agent_registry.models import Role, Workspace
from agent_registry.tests.factories import AgentFactory, MembershipFactory, UserFactory
from routing.tests.factories import ModelTargetFactory
from tracing import otlp, replay, selectors, services
from tracing.models import Trajectory
from tracing.replay_diff import FieldChange
from tracing.tests.replay_fakes import (
    ANSWER,
    FAKE_PROVIDER,
    LOOKUP_RESULT,
    RECORDED_MODEL,
    REFUND_RESULT,
    TOOLS,
    call,
    say,
)

pytestmark = pytest.mark.django_db

TRACE_ID = "5b8efff798038103d269b633813fc60c"
POLICY_MODEL = f"{FAKE_PROVIDER}/policy-v1"
SYSTEM = {"role": "system", "content": "You help riders of Acme."}
USER = {"role": "user", "content": "I was charged twice for trip T1. Can I get my money back?"}
QUESTION = "Trip T1 was charged twice (12.50 USD each). Is the duplicate refundable?"
POLICY = {"section": "4.2 Duplicate charges", "text": "A duplicate charge is refunded in full."}
VERDICT = "Eligible: the duplicate charge of 12.50 USD is refunded in full."
NEW_VERDICT = "Not eligible before the charge settles: ask the rider to wait 48 hours."
SUB_SYSTEM = {"role": "system", "content": "You check refund eligibility against Acme's policy."}
ASK_POLICY = {
    "type": "function",
    "function": {
        "name": "ask_policy",
        "description": "Ask the policy checker.",
        "parameters": {"type": "object", "properties": {"question": {"type": "string"}}},
    },
}

SEARCH_POLICY = {
    "type": "function",
    "function": {
        "name": "search_policy",
        "description": "Search the refund policy.",
        "parameters": {"type": "object", "properties": {"topic": {"type": "string"}}},
    },
}
# What each agent offers its model: the parent its tools and the one that asks the sub-agent, the sub-agent its own.
PARENT_TOOLS = (*TOOLS, ASK_POLICY)
SUB_AGENT_TOOLS = (SEARCH_POLICY,)


def _assistant_call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
        ],
    }


def _tool_message(call_id: str, result: Any) -> dict[str, Any]:
    return {
        "role": "tool",
        "tool_call_id": call_id,
        "content": result if isinstance(result, str) else json.dumps(result),
    }


class _Recorder:
    """Spans of one recorded trace, one after another on a clock."""

    def __init__(self) -> None:
        self.spans: list[otlp.Span] = []
        self.clock = 1_795_316_000_000_000_000

    def span(self, span_id: str, parent: str | None, span_type: str, name: str, **fields: Any) -> otlp.Span:
        self.clock += 1_000_000
        span = otlp.span_build(
            trace_id=TRACE_ID,
            span_id=span_id,
            parent_span_id=parent,
            name=name,
            span_type=span_type,
            start_time_ns=self.clock,
            end_time_ns=self.clock + 500_000,
            scope_name="keel.tests",
            **fields,
        )
        self.spans.append(span)
        return span

    def chat(
        self,
        span_id: str,
        parent: str,
        model: str,
        sent: list[dict[str, Any]],
        said: dict[str, Any],
        tools: tuple[dict[str, Any], ...] = PARENT_TOOLS,
    ) -> None:
        self.span(
            span_id,
            parent,
            "generation",
            f"chat {model}",
            request_model=model,
            input=list(sent),
            output=[said],
            tool_definitions=tools,
        )

    def tool(self, span_id: str, parent: str, call_id: str, name: str, arguments: Any, result: Any) -> None:
        self.span(
            span_id,
            parent,
            "tool",
            f"execute_tool {name}",
            tool_name=name,
            tool_call_id=call_id,
            tool_arguments=arguments,
            tool_result=result,
        )


def _delegation_recorded(workspace: Workspace, *, hand_back: str = "tool") -> Trajectory:
    """A refund where the agent asks a policy sub-agent first. Its steps, once stored:
    0 agent, 1 system, 2 user, 3 LLM call → 4 lookup_trip, 5 LLM call → 6 ask_policy (hand_back "tool": the
    sub-agent runs inside that tool call) → 7 sub-agent, 8 its system, 9 its user, 10 LLM call → 11 search_policy,
    12 LLM call (the verdict); then the parent: 13 LLM call → 14 refund, 15 LLM call (the answer).

    hand_back "json": the same, with the verdict inside the tool's JSON result; "message": the sub-agent runs
    beside the parent's calls and its verdict comes back as a user message quoting it; "none": the parent never
    sees the verdict. Without a tool span around the sub-agent, its steps come one earlier (6 to 11)."""
    AgentFactory.create(workspace=workspace, slug="ride-support", name="Ride support")
    recorder = _Recorder()
    recorder.span("a000000000000001", None, "agent", "invoke_agent ride-support", agent_name="ride-support")
    root = "a000000000000001"
    history = [SYSTEM, USER]
    lookup = _assistant_call("c1", "lookup_trip", {"trip_id": "T1"})
    recorder.chat("b000000000000001", root, RECORDED_MODEL, history, lookup)
    recorder.tool("c000000000000001", root, "c1", "lookup_trip", {"trip_id": "T1"}, LOOKUP_RESULT)
    history += [lookup, _tool_message("c1", LOOKUP_RESULT)]
    ask = _assistant_call("c2", "ask_policy", {"question": QUESTION})
    recorder.chat("b000000000000002", root, RECORDED_MODEL, history, ask)
    if hand_back in ("tool", "json"):
        result = VERDICT if hand_back == "tool" else {"verdict": VERDICT, "checked_by": "policy-checker"}
        recorder.tool("c000000000000002", root, "c2", "ask_policy", {"question": QUESTION}, result)
        sub_parent = "c000000000000002"
    else:
        sub_parent = root
    recorder.span("a000000000000002", sub_parent, "agent", "invoke_agent policy-checker", agent_name="policy-checker")
    sub = "a000000000000002"
    sub_history = [SUB_SYSTEM, {"role": "user", "content": QUESTION}]
    search = _assistant_call("s1", "search_policy", {"topic": "duplicate charge"})
    recorder.chat("b000000000000003", sub, POLICY_MODEL, sub_history, search, SUB_AGENT_TOOLS)
    recorder.tool("c000000000000003", sub, "s1", "search_policy", {"topic": "duplicate charge"}, POLICY)
    sub_history += [search, _tool_message("s1", POLICY)]
    recorder.chat(
        "b000000000000004", sub, POLICY_MODEL, sub_history, {"role": "assistant", "content": VERDICT}, SUB_AGENT_TOOLS
    )
    if hand_back in ("tool", "json"):
        history += [ask, _tool_message("c2", result)]
    elif hand_back == "message":
        history += [ask, _tool_message("c2", "asked"), {"role": "user", "content": f"policy-checker says: {VERDICT}"}]
    else:
        history += [ask, _tool_message("c2", "asked")]
    refund = _assistant_call("c3", "refund", {"trip_id": "T1", "amount": 12.5})
    recorder.chat("b000000000000005", root, RECORDED_MODEL, history, refund)
    recorder.tool("c000000000000004", root, "c3", "refund", {"trip_id": "T1", "amount": 12.5}, REFUND_RESULT)
    history += [refund, _tool_message("c3", REFUND_RESULT)]
    recorder.chat("b000000000000006", root, RECORDED_MODEL, history, {"role": "assistant", "content": ANSWER})
    with transaction.atomic():
        services.spans_write(workspace=workspace, api_key=None, spans=recorder.spans)
    return Trajectory.objects.get(workspace=workspace, trace_id=TRACE_ID)


def _parent_history(carried: dict[str, Any] | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the parent sends at its first call after the sub-agent, with `carried` for the sub-agent's result, as
    the provider receives it (an empty content left out)."""
    messages = [
        SYSTEM,
        USER,
        _assistant_call("c1", "lookup_trip", {"trip_id": "T1"}),
        _tool_message("c1", LOOKUP_RESULT),
        _assistant_call("c2", "ask_policy", {"question": QUESTION}),
        *([carried] if isinstance(carried, dict) else carried),
    ]
    return [{key: value for key, value in message.items() if value is not None} for message in messages]


def _sources(trajectory: Trajectory) -> list[tuple[str, str | None]]:
    spans = sorted(selectors.trajectory_spans(trajectory=trajectory), key=lambda span: span.start_time_ns)
    return [(span.tool_name or "", span.attributes.get(replay.SOURCE_ATTRIBUTE)) for span in spans if span.tool_name]


def test_a_replay_inside_a_sub_agent_resumes_the_parent_with_the_new_answer(workspace, fake_llm):
    original = _delegation_recorded(workspace)
    view = selectors.trajectory_view(trajectory=original)
    assert (view.steps[7].kind, view.steps[10].kind, view.steps[13].kind) == ("agent", "llm_call", "llm_call")
    fake_llm.script = [
        call("search_policy", {"topic": "duplicate charge"}, call_id="p1"),
        say(NEW_VERDICT),
        call("refund", {"amount": 12.5, "trip_id": "T1"}, call_id="p2"),
        say("I refunded 12.50 USD, though the policy checker asked to wait."),
    ]
    created = replay.replay_create(original=original, from_step=10, model=f"{FAKE_PROVIDER}/policy-v2")

    finished = replay.replay_execute(replay_id=created.pk)

    assert finished is not None
    assert (finished.status, finished.steps_done, finished.steps_planned, finished.error) == ("done", 4, 4, "")
    sub_first, sub_last, parent_first, parent_last = fake_llm.requests
    assert [request.model for request in fake_llm.requests] == ["policy-v2", "policy-v2", "support-v1", "support-v1"]
    assert sub_first.messages == [SUB_SYSTEM, {"role": "user", "content": QUESTION}]
    assert sub_last.messages[-1] == {"role": "tool", "tool_call_id": "p1", "content": json.dumps(POLICY)}
    # The parent's recorded conversation, with the sub-agent's new answer where its recorded one was.
    assert parent_first.messages == _parent_history(_tool_message("c2", NEW_VERDICT))
    assert parent_last.messages[-1] == {"role": "tool", "tool_call_id": "p2", "content": json.dumps(REFUND_RESULT)}
    new = finished.replay_trajectory
    assert new is not None
    assert _sources(new) == [("search_policy", "recording"), ("refund", "recording")]
    assert new.output_preview == "I refunded 12.50 USD, though the policy checker asked to wait."
    assert (new.llm_call_count, new.agent_id) == (4, original.agent_id)

    replayed = selectors.trajectory_view(trajectory=new)
    assert [(step.depth, step.kind, step.name) for step in replayed.steps if step.kind != "message"] == [
        (0, "agent", "invoke_agent ride-support"),
        (1, "agent", "invoke_agent policy-checker"),
        (2, "llm_call", "chat fake-replay/policy-v2"),
        (2, "tool_call", "execute_tool search_policy"),
        (2, "llm_call", "chat fake-replay/policy-v2"),
        # The parent's resumed call shows its history: the tool results it read, as messages.
        (1, "tool_call", "chat fake-replay/support-v1"),
        (1, "tool_call", "chat fake-replay/support-v1"),
        (1, "llm_call", "chat fake-replay/support-v1"),
        (1, "tool_call", "execute_tool refund"),
        (1, "llm_call", "chat fake-replay/support-v1"),
    ]

    diff = selectors.replay_diff_get(replay=finished)
    assert [(pair.replayed, pair.status, pair.label) for pair in diff.steps] == [
        (False, "same", "agent invoke_agent ride-support"),
        # The history the resumed parent sent again lines up with the original's.
        (False, "same", "system message"),
        (False, "same", "user message"),
        (False, "same", "assistant"),
        (False, "same", "tool lookup_trip"),
        (False, "same", "assistant"),
        (False, "only_in_original", "tool ask_policy"),
        (False, "same", "agent invoke_agent policy-checker"),
        (False, "same", "system message"),
        (False, "same", "user message"),
        (True, "same", "assistant"),
        (True, "same", "tool search_policy"),
        (True, "changed", "assistant"),  # the sub-agent's verdict
        (True, "only_in_replay", "tool ask_policy"),  # the new verdict, as the parent received it
        (True, "same", "assistant"),
        (True, "same", "tool refund"),
        (True, "changed", "assistant"),  # the parent's final answer
    ]
    assert diff.first_difference == 12
    assert diff.steps[13].changes[1] == FieldChange("result", None, NEW_VERDICT)
    final = diff.steps[-1]
    assert (final.original_index, final.replay_index) == (15, 15)
    assert [(change.field, change.original, change.replay) for change in final.changes] == [
        ("content", ANSWER, "I refunded 12.50 USD, though the policy checker asked to wait.")
    ]
    assert (diff.replayed_totals.original.llm_calls, diff.replayed_totals.replay.llm_calls) == (4, 4)


def _tool_names(tools: list[dict[str, Any]] | None) -> list[str]:
    return [tool["function"]["name"] for tool in tools or ()]


def test_the_sub_agent_is_offered_its_own_tools_and_the_resumed_parent_its_own(workspace, fake_llm):
    original = _delegation_recorded(workspace)
    fake_llm.script = [
        call("search_policy", {"topic": "duplicate charge"}),
        say(NEW_VERDICT),
        say("Please wait 48 hours for the charge to settle."),
    ]

    finished = replay.replay_execute(replay_id=replay.replay_create(original=original, from_step=10).pk)

    assert finished is not None
    assert (finished.status, finished.error) == ("done", "")
    # Offered the parent's tools, the sub-agent could refund, or hand the question to itself again.
    assert [_tool_names(request.tools) for request in fake_llm.requests] == [
        ["search_policy"],
        ["search_policy"],
        ["lookup_trip", "refund", "ask_policy"],
    ]


def test_the_resumed_parents_recorded_model_is_served_by_the_workspaces_target_of_that_name(workspace, fake_llm):
    """A recorded model name that is the alias of a model target (a gateway target named "gpt-4o", say) is
    called through that target, for the parent resumed after the sub-agent as for the agent replayed."""
    original = _delegation_recorded(workspace)
    ModelTargetFactory.create(
        workspace=workspace, alias=RECORDED_MODEL, model=f"{FAKE_PROVIDER}/gateway-v1", api_base="http://gw:4000/v1"
    )
    fake_llm.script = [call("search_policy", {"topic": "duplicate charge"}), say(NEW_VERDICT), say("Please wait.")]

    finished = replay.replay_execute(replay_id=replay.replay_create(original=original, from_step=10).pk)

    assert finished is not None
    assert (finished.status, finished.error) == ("done", "")
    assert [request.model for request in fake_llm.requests] == ["policy-v1", "policy-v1", "gateway-v1"]
    assert fake_llm.servers == [(None, None), (None, None), ("http://gw:4000/v1", None)]


def test_a_hand_back_message_carries_the_new_answer_to_the_parent(workspace, fake_llm):
    original = _delegation_recorded(workspace, hand_back="message")
    assert original.agent is not None
    strict = registry_services.prompt_create(
        agent=original.agent, name="policy-checker/system", type="text", template="Refund nothing unsettled."
    )
    fake_llm.script = [
        call("search_policy", {"topic": "duplicate charge"}),
        say(NEW_VERDICT),
        say("Please wait 48 hours for the charge to settle."),
    ]

    finished = replay.replay_execute(
        replay_id=replay.replay_create(original=original, from_step=9, prompt_version=strict).pk
    )

    assert finished is not None
    assert (finished.status, finished.steps_done, finished.error) == ("done", 3, "")
    # The prompt version is the sub-agent's; the parent goes on with its own recorded system prompt.
    assert fake_llm.requests[0].messages[0] == {"role": "system", "content": "Refund nothing unsettled."}
    assert fake_llm.requests[2].model == "support-v1"
    assert fake_llm.requests[2].messages == _parent_history(
        [_tool_message("c2", "asked"), {"role": "user", "content": f"policy-checker says: {NEW_VERDICT}"}]
    )
    assert finished.replay_trajectory is not None
    assert finished.replay_trajectory.output_preview == "Please wait 48 hours for the charge to settle."
    generations = sorted(
        (span for span in selectors.trajectory_spans(trajectory=finished.replay_trajectory) if span.request_model),
        key=lambda span: span.start_time_ns,
    )
    assert [span.prompt_name for span in generations] == ["policy-checker/system", "policy-checker/system", None]


def test_an_answer_inside_a_json_tool_result_is_replaced_there(workspace, fake_llm):
    original = _delegation_recorded(workspace, hand_back="json")
    fake_llm.script = [call("search_policy", {"topic": "duplicate charge"}), say(NEW_VERDICT), say("Please wait.")]

    finished = replay.replay_execute(replay_id=replay.replay_create(original=original, from_step=10).pk)

    assert finished is not None
    assert (finished.status, finished.error) == ("done", "")
    carried = fake_llm.requests[2].messages[-1]
    assert (carried["role"], carried["tool_call_id"]) == ("tool", "c2")
    assert json.loads(carried["content"]) == {"verdict": NEW_VERDICT, "checked_by": "policy-checker"}


def test_a_parent_that_never_saw_the_answer_is_not_resumed_and_the_replay_says_why(workspace, fake_llm):
    original = _delegation_recorded(workspace, hand_back="none")
    fake_llm.script = [call("search_policy", {"topic": "duplicate charge"}), say(NEW_VERDICT)]

    finished = replay.replay_execute(replay_id=replay.replay_create(original=original, from_step=9).pk)

    assert finished is not None
    note = (
        "the parent agent was not resumed: sub-agent policy-checker's answer is not in the parent's next "
        "model call (step 13)"
    )
    assert (finished.status, finished.steps_done, finished.error) == ("done", 2, note)
    assert len(fake_llm.requests) == 2
    new = finished.replay_trajectory
    assert new is not None
    assert new.output_preview == NEW_VERDICT
    (root,) = [span for span in selectors.trajectory_spans(trajectory=new) if span.parent_span_id is None]
    assert root.attributes[replay.NOTE_ATTRIBUTE] == note


def test_a_sub_agent_that_runs_out_of_steps_leaves_the_parent_with_a_note(workspace, fake_llm):
    original = _delegation_recorded(workspace)
    fake_llm.script = [call("search_policy", {"topic": "duplicate charge"})]

    finished = replay.replay_execute(replay_id=replay.replay_create(original=original, from_step=10, max_steps=1).pk)

    assert finished is not None
    assert (finished.status, finished.steps_done) == ("done", 1)
    assert finished.error == (
        "the parent agent was not resumed: the replay reached max_steps (1) before sub-agent policy-checker answered"
    )


def test_max_steps_counts_the_parents_model_calls_too(workspace, fake_llm):
    original = _delegation_recorded(workspace)
    fake_llm.script = [
        call("search_policy", {"topic": "duplicate charge"}),
        say(NEW_VERDICT),
        call("refund", {"trip_id": "T1", "amount": 12.5}),
    ]

    finished = replay.replay_execute(replay_id=replay.replay_create(original=original, from_step=10, max_steps=3).pk)

    assert finished is not None
    assert (finished.status, finished.steps_done, finished.error) == ("done", 3, "")
    assert [request.model for request in fake_llm.requests] == ["policy-v1", "policy-v1", "support-v1"]


def test_a_divergent_call_of_the_resumed_parent_stops_the_replay_there(workspace, fake_llm):
    original = _delegation_recorded(workspace)
    fake_llm.script = [
        call("search_policy", {"topic": "duplicate charge"}),
        say(NEW_VERDICT),
        call("refund", {"trip_id": "T1", "amount": 6.25}),
    ]

    finished = replay.replay_execute(replay_id=replay.replay_create(original=original, from_step=10).pk)

    assert finished is not None
    assert (finished.status, finished.divergence_tool_name, finished.divergence_arguments) == (
        "stopped_divergence",
        "refund",
        {"trip_id": "T1", "amount": 6.25},
    )
    assert finished.replay_trajectory is not None
    replayed = selectors.trajectory_view(trajectory=finished.replay_trajectory)
    assert finished.divergence_step is not None
    stopped_at = replayed.steps[finished.divergence_step]
    assert (stopped_at.kind, stopped_at.model, stopped_at.depth) == ("llm_call", "support-v1", 1)


def test_a_divergence_inside_the_sub_agent_does_not_resume_the_parent(workspace, fake_llm):
    original = _delegation_recorded(workspace)
    fake_llm.script = [call("search_policy", {"topic": "refunds"})]

    finished = replay.replay_execute(replay_id=replay.replay_create(original=original, from_step=10).pk)

    assert finished is not None
    assert (finished.status, finished.error, len(fake_llm.requests)) == ("stopped_divergence", "", 1)


def _member_client(workspace: Workspace) -> Client:
    membership = MembershipFactory.create(workspace=workspace, user=UserFactory.create(), role=Role.MEMBER)
    client = Client()
    client.force_login(membership.user)
    return client


def test_the_replay_pages_show_the_sub_agent_under_the_root_and_the_parents_new_answer(workspace, fake_llm):
    client = _member_client(workspace)
    original = _delegation_recorded(workspace)
    fake_llm.script = [
        call("search_policy", {"topic": "duplicate charge"}),
        say(NEW_VERDICT),
        call("refund", {"trip_id": "T1", "amount": 12.5}),
        say("Refunded, against the checker's advice."),
    ]
    finished = replay.replay_execute(replay_id=replay.replay_create(original=original, from_step=10).pk)
    assert finished is not None
    assert finished.replay_trajectory is not None

    page = client.get(f"/w/{workspace.slug}/replays/{finished.pk}/")
    steps = client.get(f"/w/{workspace.slug}/trajectories/{finished.replay_trajectory.trace_id}/")

    assert (page.status_code, steps.status_code) == (200, 200)
    assert [(row.pair.status, row.pair.label) for row in page.context["replayed"]][-1] == ("changed", "assistant")
    assert "Refunded, against the checker&#x27;s advice." in page.content.decode()
    rendered = steps.content.decode()
    assert 'data-step="1" data-depth="1"' in rendered  # the sub-agent's span, under the root
    assert 'data-step="4" data-depth="2"' in rendered  # its model call, under it
    assert 'data-step="15" data-depth="1"' in rendered  # the parent's final answer, under the root again


def test_the_replay_page_says_why_the_parent_was_not_resumed(workspace, fake_llm):
    client = _member_client(workspace)
    original = _delegation_recorded(workspace, hand_back="none")
    fake_llm.script = [call("search_policy", {"topic": "duplicate charge"}), say(NEW_VERDICT)]
    finished = replay.replay_execute(replay_id=replay.replay_create(original=original, from_step=9).pk)
    assert finished is not None

    page = client.get(f"/w/{workspace.slug}/replays/{finished.pk}/")

    assert page.status_code == 200
    content = page.content.decode()
    assert "<strong>Note</strong> the parent agent was not resumed: sub-agent policy-checker&#x27;s answer" in content
    assert "<strong>Error</strong>" not in content  # the replay finished: the note is not an error
