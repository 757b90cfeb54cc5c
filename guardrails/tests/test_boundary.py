"""The action boundary: allow-list, argument constraints, approvals (request, decide, use once, reject,
expire) and rate limits, as the gateway's hook sees them."""

from __future__ import annotations

import dataclasses
import signal
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.utils import timezone

from agent_registry.tests.factories import AgentFactory, UserFactory
from guardrails import boundary, policy, services
from guardrails.exceptions import ApprovalAlreadyDecided
from guardrails.models import ApprovalEvent, ApprovalRequest, GuardrailViolation, ToolCallCounter
from guardrails.tests.factories import ApprovalRequestFactory, guarded_agent
from routing import hooks
from routing.hooks import ToolCall, ToolCallVerdict

pytestmark = pytest.mark.django_db


def tool_call(agent, name="issue_refund", arguments=None, conversation_id="conv-1", trace_id="t" * 32):
    return ToolCall(
        agent_id=agent.pk,
        workspace_id=agent.workspace_id,
        name=name,
        arguments={"trip_id": "T1", "amount": 50} if arguments is None else arguments,
        conversation_id=conversation_id,
        trace_id=trace_id,
        runs_on="keel",
    )


def approval_of(verdict: ToolCallVerdict) -> ApprovalRequest:
    assert verdict.pending_approval_id is not None
    return ApprovalRequest.objects.get(pk=verdict.pending_approval_id)


def audit_state():
    return (
        list(ApprovalRequest.objects.values_list("pk", "status").order_by("pk")),
        ApprovalEvent.objects.count(),
        ToolCallCounter.objects.values_list("count", flat=True).first(),
    )


def save_policy(agent, **document):
    base = services.guardrail_policy_get(agent=agent).document.model_dump(mode="json")
    return services.guardrail_policy_update(agent=agent, document={**base, **document})


def test_the_app_installs_the_boundary_as_the_gateways_checker(workspace):
    agent = guarded_agent(workspace=workspace)

    verdict = hooks.tool_call_check(tool_call(agent, name="delete_account", arguments={}))

    assert verdict == ToolCallVerdict(allowed=False, reason="delete_account is not on this agent's tool allow-list")


def test_a_tool_off_the_allow_list_is_refused_and_recorded(workspace):
    agent = guarded_agent(workspace=workspace)

    verdict = boundary.tool_call_authorize(tool_call(agent, name="delete_account", arguments={"id": 1}))

    assert verdict.allowed is False
    assert verdict.pending_approval_id is None
    violation = GuardrailViolation.objects.get()
    assert (violation.layer, violation.check_name, violation.action, violation.trace_id) == (
        "tool",
        "action_boundary",
        "block",
        "t" * 32,
    )
    assert violation.evidence == "delete_account: delete_account is not on this agent's tool allow-list"
    assert ApprovalRequest.objects.count() == 0


def test_an_agent_without_requirements_may_call_no_tool(workspace):
    agent = AgentFactory.create(workspace=workspace)

    verdict = boundary.tool_call_authorize(tool_call(agent, name="lookup_trip", arguments={}))

    assert verdict.allowed is False


def test_a_call_claiming_another_workspace_is_refused(workspace, other_workspace):
    agent = guarded_agent(workspace=workspace)
    call = ToolCall(
        agent_id=agent.pk,
        workspace_id=other_workspace.pk,
        name="lookup_trip",
        arguments={},
        conversation_id="c",
        trace_id="t",
        runs_on="keel",
    )

    assert boundary.tool_call_authorize(call) == ToolCallVerdict(
        allowed=False, reason="unknown agent: no tool may be called"
    )


def test_a_refund_within_the_autonomy_limit_runs_without_approval(workspace):
    agent = guarded_agent(workspace=workspace)

    verdict = boundary.tool_call_authorize(tool_call(agent, arguments={"trip_id": "T1", "amount": 20}))

    assert verdict == ToolCallVerdict(allowed=True)
    assert ApprovalRequest.objects.count() == 0
    assert GuardrailViolation.objects.count() == 0


def test_a_refund_over_the_limit_waits_for_approval(workspace):
    agent = guarded_agent(workspace=workspace)

    verdict = boundary.tool_call_authorize(tool_call(agent))

    approval = ApprovalRequest.objects.get()
    assert verdict == ToolCallVerdict(
        allowed=False,
        reason=f"waiting for a person's approval (request {approval.pk}): issue_refund.amount <= 20 does not hold",
        pending_approval_id=approval.pk,
    )
    assert (approval.workspace_id, approval.agent_id, approval.conversation_id, approval.tool) == (
        workspace.pk,
        agent.pk,
        "conv-1",
        "issue_refund",
    )
    assert approval.arguments == {"trip_id": "T1", "amount": 50}
    assert approval.status == "pending"
    assert approval.trace_id == "t" * 32
    assert list(approval.events.values_list("kind", flat=True)) == ["requested"]
    assert GuardrailViolation.objects.get().action == "require_approval"


def test_an_eval_runs_refund_over_the_limit_is_held_without_asking_anyone(workspace):
    agent = guarded_agent(workspace=workspace)
    call = dataclasses.replace(tool_call(agent), rehearsal=True)

    verdict = boundary.tool_call_authorize(call)

    assert verdict.allowed is False
    assert verdict.pending_approval_id is None
    assert "an eval run asks no one" in verdict.reason
    assert not ApprovalRequest.objects.exists()


def test_a_missing_amount_cannot_be_checked_and_waits_for_approval(workspace):
    agent = guarded_agent(workspace=workspace)

    verdict = boundary.tool_call_authorize(tool_call(agent, arguments={"trip_id": "T1"}))

    assert verdict.allowed is False
    assert verdict.pending_approval_id == ApprovalRequest.objects.get().pk


def test_asking_again_before_a_decision_finds_the_same_request(workspace):
    agent = guarded_agent(workspace=workspace)
    first = boundary.tool_call_authorize(tool_call(agent))

    # Same arguments in another key order: the same call.
    again = boundary.tool_call_authorize(tool_call(agent, arguments={"amount": 50, "trip_id": "T1"}))

    assert again.pending_approval_id == first.pending_approval_id
    assert ApprovalRequest.objects.count() == 1
    assert GuardrailViolation.objects.count() == 1


def test_an_approved_call_runs_once_and_the_approval_is_used(workspace):
    agent = guarded_agent(workspace=workspace)
    person = UserFactory.create()
    pending = boundary.tool_call_authorize(tool_call(agent))
    approval = approval_of(pending)
    services.approval_decide(approval=approval, user=person, approved=True, note="customer was charged twice")

    resumed = boundary.tool_call_authorize(tool_call(agent, trace_id="r" * 32))
    once_more = boundary.tool_call_authorize(tool_call(agent, trace_id="s" * 32))

    assert resumed == ToolCallVerdict(allowed=True)
    approval.refresh_from_db()
    assert (approval.status, approval.decided_by, approval.decision_note, approval.used_trace_id) == (
        "used",
        person,
        "customer was charged twice",
        "r" * 32,
    )
    assert approval.used_at is not None
    assert list(approval.events.order_by("pk").values_list("kind", "actor_user")) == [
        ("requested", None),
        ("approved", person.pk),
        ("used", None),
    ]
    # The approval was for one run: a repeat needs a new one.
    assert once_more.allowed is False
    assert once_more.pending_approval_id != approval.pk
    assert approval_of(once_more).status == "pending"


def test_an_approval_does_not_open_other_arguments_or_conversations(workspace):
    agent = guarded_agent(workspace=workspace)
    pending = boundary.tool_call_authorize(tool_call(agent))
    services.approval_decide(
        approval=approval_of(pending),
        user=UserFactory.create(),
        approved=True,
        note="",
    )

    larger = boundary.tool_call_authorize(tool_call(agent, arguments={"trip_id": "T1", "amount": 500}))
    elsewhere = boundary.tool_call_authorize(tool_call(agent, conversation_id="conv-2"))

    assert larger.allowed is False
    assert elsewhere.allowed is False
    assert approval_of(pending).status == "approved"


def test_a_rejected_call_stays_refused_and_nothing_runs(workspace):
    agent = guarded_agent(workspace=workspace)
    pending = boundary.tool_call_authorize(tool_call(agent))
    approval = approval_of(pending)
    services.approval_decide(approval=approval, user=UserFactory.create(), approved=False, note="not our fault")

    retried = boundary.tool_call_authorize(tool_call(agent))

    assert retried == ToolCallVerdict(
        allowed=False, reason=f"a person rejected this call (request {approval.pk}): not our fault"
    )
    assert list(ApprovalRequest.objects.values_list("status", flat=True)) == ["rejected"]
    assert list(approval.events.order_by("pk").values_list("kind", flat=True)) == ["requested", "rejected", "refused"]


def test_a_decision_is_final(workspace):
    agent = guarded_agent(workspace=workspace)
    approval = ApprovalRequestFactory.create(agent=agent)
    person = UserFactory.create()
    services.approval_decide(approval=approval, user=person, approved=False, note="no")
    before = audit_state()

    with pytest.raises(ApprovalAlreadyDecided):
        services.approval_decide(
            approval=approval, user=UserFactory.create(username="other"), approved=True, note="yes"
        )

    assert audit_state() == before
    approval.refresh_from_db()
    assert (approval.status, approval.decided_by, approval.decision_note) == ("rejected", person, "no")


def test_an_expired_request_cannot_be_approved_and_a_new_attempt_opens_a_new_one(workspace):
    agent = guarded_agent(workspace=workspace)
    call = tool_call(agent)
    old = ApprovalRequestFactory.create(
        agent=agent,
        arguments=call.arguments,
        expires_at=timezone.now() - timedelta(minutes=1),
    )

    with pytest.raises(ApprovalAlreadyDecided, match=f"approval {old.pk} is expired, not pending"):
        services.approval_decide(approval=old, user=UserFactory.create(), approved=True, note="")
    old.refresh_from_db()
    assert (old.status, old.decided_by, old.decided_at) == ("expired", None, None)
    verdict = boundary.tool_call_authorize(call)

    assert verdict.pending_approval_id not in (None, old.pk)


def test_an_approved_but_expired_approval_runs_nothing(workspace):
    agent = guarded_agent(workspace=workspace)
    call = tool_call(agent)
    stale = ApprovalRequestFactory.create(
        agent=agent,
        arguments=call.arguments,
        status="approved",
        decided_at=timezone.now() - timedelta(days=2),
        expires_at=timezone.now() - timedelta(days=1),
    )

    verdict = boundary.tool_call_authorize(call)

    assert verdict.allowed is False
    stale.refresh_from_db()
    assert stale.status == "expired"


def test_the_sweep_expires_requests_past_their_time(workspace):
    agent = guarded_agent(workspace=workspace)
    due = ApprovalRequestFactory.create(agent=agent, expires_at=timezone.now() - timedelta(seconds=1))
    fresh = ApprovalRequestFactory.create(agent=agent, conversation_id="conv-2")

    assert services.approval_requests_expire() == 1

    assert ApprovalRequest.objects.get(pk=due.pk).status == "expired"
    assert ApprovalRequest.objects.get(pk=fresh.pk).status == "pending"


def test_a_tool_listed_for_approval_in_the_policy_always_waits(workspace):
    agent = guarded_agent(workspace=workspace)
    save_policy(agent, approval_tools=["lookup_trip"])

    verdict = boundary.tool_call_authorize(tool_call(agent, name="lookup_trip", arguments={"trip_id": "T1"}))

    assert verdict.allowed is False
    assert ApprovalRequest.objects.get().reason == "lookup_trip always needs a person's approval"


def test_a_custom_constraint_blocks_without_asking_anyone(workspace):
    agent = guarded_agent(workspace=workspace)
    save_policy(
        agent,
        tool_constraints=[{"tool": "lookup_trip", "argument": "trip_id", "op": "matches", "value": "T[0-9]+"}],
    )

    refused = boundary.tool_call_authorize(tool_call(agent, name="lookup_trip", arguments={"trip_id": "'; DROP"}))
    allowed = boundary.tool_call_authorize(tool_call(agent, name="lookup_trip", arguments={"trip_id": "T42"}))

    assert refused == ToolCallVerdict(
        allowed=False, reason='lookup_trip breaks the constraint lookup_trip.trip_id matches "T[0-9]+"'
    )
    assert allowed.allowed is True
    assert ApprovalRequest.objects.count() == 0


@contextmanager
def hang_fails(seconds: int = 20):
    """Turn a hang into a test failure: `re` checks for signals while it backtracks, so an alarm stops it."""

    def interrupt(signum, frame):
        raise AssertionError(f"still matching after {seconds} s: the pattern is not bounded")

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# Backtracks catastrophically on a long run of word characters that cannot end the match.
CATASTROPHIC = r"(\w+\s?)+"
LONG_ARGUMENT = "a" * 3000 + "!"


def test_a_catastrophic_pattern_fails_closed_and_is_recorded_instead_of_hanging(workspace):
    agent = guarded_agent(workspace=workspace)
    save_policy(
        agent, tool_constraints=[{"tool": "lookup_trip", "argument": "trip_id", "op": "matches", "value": CATASTROPHIC}]
    )

    with hang_fails():
        refused = boundary.tool_call_authorize(
            tool_call(agent, name="lookup_trip", arguments={"trip_id": LONG_ARGUMENT})
        )
    allowed = boundary.tool_call_authorize(tool_call(agent, name="lookup_trip", arguments={"trip_id": "T42"}))

    assert refused.allowed is False
    assert refused.reason.startswith("lookup_trip breaks the constraint lookup_trip.trip_id matches")
    assert "not checked: its pattern ran past 50 ms on this argument; counted as broken" in refused.reason
    assert allowed.allowed is True
    violation = GuardrailViolation.objects.get()
    assert (violation.action, violation.failure) == ("block", "failed_closed")


def test_a_catastrophic_pattern_that_gates_waits_for_a_person(workspace):
    agent = guarded_agent(workspace=workspace)
    save_policy(
        agent,
        tool_constraints=[
            {
                "tool": "lookup_trip",
                "argument": "trip_id",
                "op": "matches",
                "value": CATASTROPHIC,
                "on_violation": "require_approval",
            }
        ],
    )

    with hang_fails():
        verdict = boundary.tool_call_authorize(
            tool_call(agent, name="lookup_trip", arguments={"trip_id": LONG_ARGUMENT})
        )

    approval = approval_of(verdict)
    assert "counted as broken" in approval.reason
    violation = GuardrailViolation.objects.get()
    assert (violation.action, violation.failure) == ("require_approval", "failed_closed")


def test_a_custom_limit_on_the_amount_argument_is_read_from_the_policy(workspace):
    agent = guarded_agent(workspace=workspace)
    save_policy(agent, amount_arguments={"issue_refund": "refund.value"})

    within = boundary.tool_call_authorize(tool_call(agent, arguments={"refund": {"value": 5}}))
    over = boundary.tool_call_authorize(tool_call(agent, arguments={"refund": {"value": 25}}))

    assert within.allowed is True
    assert over.pending_approval_id is not None


def test_rate_limit_per_conversation(workspace):
    agent = guarded_agent(workspace=workspace)
    save_policy(agent, rate_limits=[{"tool": "lookup_trip", "per_conversation": 2}])
    lookup = {"name": "lookup_trip", "arguments": {"trip_id": "T1"}}

    verdicts = [boundary.tool_call_authorize(tool_call(agent, **lookup)) for _ in range(3)]
    other_conversation = boundary.tool_call_authorize(tool_call(agent, conversation_id="conv-2", **lookup))

    assert [verdict.allowed for verdict in verdicts] == [True, True, False]
    assert verdicts[2].reason == "rate limit reached: at most 2 lookup_trip calls per conversation"
    assert other_conversation.allowed is True


def test_rate_limit_per_day_counts_every_tool_with_a_star(workspace):
    agent = guarded_agent(workspace=workspace)
    save_policy(agent, rate_limits=[{"tool": "*", "per_day": 2}])

    verdicts = [
        boundary.tool_call_authorize(tool_call(agent, name="lookup_trip", arguments={}, conversation_id=str(n)))
        for n in range(2)
    ] + [boundary.tool_call_authorize(tool_call(agent, arguments={"amount": 1}, conversation_id="x"))]

    assert [verdict.allowed for verdict in verdicts] == [True, True, False]
    assert verdicts[2].reason == "rate limit reached: at most 2 tool calls per day"
    counter = ToolCallCounter.objects.get()
    assert (counter.tool, counter.window, counter.window_key, counter.count) == (
        "*",
        "day",
        timezone.now().date().isoformat(),
        2,
    )


def test_an_approved_call_over_its_rate_limit_keeps_its_approval(workspace):
    agent = guarded_agent(workspace=workspace)
    save_policy(agent, rate_limits=[{"tool": "issue_refund", "per_conversation": 0}])
    pending = boundary.tool_call_authorize(tool_call(agent))
    services.approval_decide(approval=approval_of(pending), user=UserFactory.create(), approved=True, note="")

    verdict = boundary.tool_call_authorize(tool_call(agent))

    assert verdict.reason == "rate limit reached: at most 0 issue_refund calls per conversation"
    assert ApprovalRequest.objects.get().status == "approved"


def test_a_call_outside_a_conversation_is_keyed_on_its_trace(workspace):
    agent = guarded_agent(workspace=workspace)

    verdict = boundary.tool_call_authorize(tool_call(agent, conversation_id="", trace_id="abc"))

    assert approval_of(verdict).conversation_id == "trace:abc"


def test_canonical_arguments_ignore_key_order():
    assert policy.arguments_hash({"a": 1, "b": [1, 2]}) == policy.arguments_hash({"b": [1, 2], "a": 1})
    assert policy.arguments_hash({"a": 1}) != policy.arguments_hash({"a": 2})


@pytest.mark.parametrize(
    ("op", "value", "actual", "holds"),
    [
        ("<=", 20, 20, True),
        ("<=", 20, 20.01, False),
        ("<", 20, 19, True),
        (">=", 1, 0, False),
        (">", 1, 2, True),
        ("<=", 20, "10", False),  # a number given as text is not trusted as a number
        ("<=", 20, True, False),
        ("==", "EUR", "EUR", True),
        ("!=", "EUR", "USD", True),
        ("in", ["a", "b"], "b", True),
        ("not_in", ["a", "b"], "b", False),
        ("matches", "[A-Z]{3}", "EUR", True),
        ("matches", "[A-Z]{3}", "EURO", False),
        ("matches", "[A-Z]{3}", 123, False),
    ],
)
def test_constraint_operators(op, value, actual, holds):
    constraint = policy.ArgumentConstraint(tool="t", argument="x", op=op, value=value)

    assert policy.constraint_holds(constraint, {"x": actual}) is holds
    assert policy.constraint_holds(constraint, {}) is False
