"""Concurrent attempts at the action boundary, on a transactional database with real threads: one approval
runs one call, and a rate limit lets through exactly its number, however the attempts interleave."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection

from agent_registry.tests.factories import UserFactory
from guardrails import boundary, services
from guardrails.exceptions import ApprovalAlreadyDecided
from guardrails.models import ApprovalEvent, ApprovalRequest, ToolCallCounter
from guardrails.tests.factories import guarded_agent
from guardrails.tests.test_boundary import approval_of, save_policy, tool_call
from routing.hooks import ToolCallVerdict

pytestmark = pytest.mark.django_db(transaction=True)
THREADS = 8


def attempt_together(call, count=THREADS) -> list[ToolCallVerdict]:
    start = threading.Barrier(count)

    def attempt(_: int) -> ToolCallVerdict:
        try:
            start.wait(timeout=10)
            return boundary.tool_call_authorize(call)
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=count) as pool:
        return [future.result() for future in [pool.submit(attempt, n) for n in range(count)]]


def test_concurrent_attempts_use_one_approval_once(workspace):
    agent = guarded_agent(workspace=workspace)
    call = tool_call(agent)
    pending = boundary.tool_call_authorize(call)
    approval = approval_of(pending)
    services.approval_decide(approval=approval, user=UserFactory.create(), approved=True, note="ok")

    verdicts = attempt_together(call)

    assert sum(verdict.allowed for verdict in verdicts) == 1
    approval.refresh_from_db()
    assert approval.status == "used"
    assert ApprovalEvent.objects.filter(approval=approval, kind="used").count() == 1
    # The others wait on one new request for a second run; none runs without an approval.
    refused = [verdict for verdict in verdicts if not verdict.allowed]
    assert {verdict.pending_approval_id for verdict in refused} == {ApprovalRequest.objects.get(status="pending").pk}


def test_concurrent_first_attempts_open_one_request(workspace):
    agent = guarded_agent(workspace=workspace)

    verdicts = attempt_together(tool_call(agent))

    assert not any(verdict.allowed for verdict in verdicts)
    approval = ApprovalRequest.objects.get()
    assert {verdict.pending_approval_id for verdict in verdicts} == {approval.pk}


def test_a_rejected_call_attempted_concurrently_never_runs(workspace):
    agent = guarded_agent(workspace=workspace)
    call = tool_call(agent)
    pending = boundary.tool_call_authorize(call)
    services.approval_decide(
        approval=approval_of(pending),
        user=UserFactory.create(),
        approved=False,
        note="no",
    )

    verdicts = attempt_together(call)

    assert not any(verdict.allowed for verdict in verdicts)
    assert list(ApprovalRequest.objects.values_list("status", flat=True)) == ["rejected"]


def test_a_rate_limit_holds_under_concurrent_calls(workspace):
    agent = guarded_agent(workspace=workspace)
    save_policy(agent, rate_limits=[{"tool": "lookup_trip", "per_conversation": 3, "per_day": 5}])

    verdicts = attempt_together(tool_call(agent, name="lookup_trip", arguments={"trip_id": "T1"}))

    assert sum(verdict.allowed for verdict in verdicts) == 3
    counts = dict(ToolCallCounter.objects.values_list("window", "count"))
    # Only the calls let through are counted, in each window.
    assert counts == {"conversation": 3, "day": 3}


def test_concurrent_decisions_leave_one_decision(workspace):
    agent = guarded_agent(workspace=workspace)
    approval = approval_of(boundary.tool_call_authorize(tool_call(agent)))
    people = [UserFactory.create(username=f"reviewer{n}") for n in range(THREADS)]
    start = threading.Barrier(THREADS)

    def decide(n: int) -> bool:
        try:
            start.wait(timeout=10)
            services.approval_decide(approval=approval, user=people[n], approved=n % 2 == 0, note=f"reviewer {n}")
            return True
        except ApprovalAlreadyDecided:
            return False
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        outcomes = [future.result() for future in [pool.submit(decide, n) for n in range(THREADS)]]

    assert outcomes.count(True) == 1
    approval.refresh_from_db()
    assert approval.decided_by is not None
    winner = people.index(approval.decided_by)
    assert (approval.status, approval.decision_note) == (
        "approved" if winner % 2 == 0 else "rejected",
        f"reviewer {winner}",
    )
    assert ApprovalEvent.objects.filter(approval=approval, kind__in=["approved", "rejected"]).count() == 1
