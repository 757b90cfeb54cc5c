"""Guardrails pages: an agent's policy (shown as it runs, refused whole when it drops a mandatory check), the
violations with their daily rates, the approval queue (one decision per request, with its audit trail) and
budgets. Who may open and post what is in test_access.py; here, what each page does."""

from __future__ import annotations

import json
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone
from django.utils.html import escape

from frontend.tests.conftest import db_state, page_urls
from guardrails import services
from guardrails.budgets import period_start
from guardrails.models import ApprovalEvent, ApprovalRequest, Budget, BudgetUsage, GuardrailPolicy
from guardrails.tests.factories import ApprovalRequestFactory, GuardrailViolationFactory

pytestmark = pytest.mark.django_db


def _document(tenant) -> dict[str, Any]:
    return services.guardrail_policy_get(agent=tenant.agent).document.model_dump(mode="json")


# --- An agent's policy ----------------------------------------------------------------------------------


def test_the_policy_page_shows_the_derived_default_with_its_mandatory_checks(tenant, member_client):
    effective = services.guardrail_policy_get(agent=tenant.agent)

    content = member_client.get(page_urls(tenant)["agent_guardrails"]).content.decode()

    assert 'data-policy-state="default"' in content
    assert effective.mandatory
    for item in effective.mandatory:
        assert f'data-mandatory="{item.check}:{item.layer.value}"' in content
        assert escape(item.why) in content
    for rule in effective.document.checks:
        assert f'data-rule="{rule.check}:{rule.layer.value}"' in content
    assert "<code>lookup_trip</code>" in content
    assert "Save policy" in content


def test_a_policy_that_drops_a_mandatory_check_is_shown_with_its_errors_and_nothing_is_saved(tenant, member_client):
    mandatory = services.guardrail_policy_get(agent=tenant.agent).mandatory[0]
    document = _document(tenant)
    document["checks"] = [
        rule
        for rule in document["checks"]
        if (rule["check"], rule["layer"]) != (mandatory.check, mandatory.layer.value)
    ]
    before = db_state()

    response = member_client.post(
        page_urls(tenant)["agent_guardrails"], {"document": json.dumps(document), "rotate_canary": "on"}
    )

    content = response.content.decode()
    assert response.status_code == 422
    assert 'id="policy-errors"' in content
    assert f"<code>checks.{mandatory.check}.{mandatory.layer.value}</code>" in content
    assert f"{mandatory.check} on {mandatory.layer.value} is mandatory" in content
    assert db_state() == before


def test_a_policy_that_is_not_json_or_breaks_the_schema_saves_nothing(tenant, member_client):
    url = page_urls(tenant)["agent_guardrails"]
    before = db_state()

    not_json = member_client.post(url, {"document": "{checks: ["})
    unknown_check = member_client.post(
        url, {"document": json.dumps({"checks": [{"check": "mind_reading", "layer": "input", "action": "block"}]})}
    )

    assert not_json.status_code == 422
    assert "Not JSON" in not_json.content.decode()
    assert unknown_check.status_code == 422
    assert "unknown check &#x27;mind_reading&#x27;" in unknown_check.content.decode()
    assert db_state() == before


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[" * 100_000, "Not JSON Keel can store: nested too deeply."),
        ('{"allowed_topics": ["rides\\u0000"]}', "it holds a NUL character"),
        ('{"allowed_topics": ["rides"], "pseudonymize": NaN}', "Not JSON Keel can store: it is not valid JSON"),
    ],
)
def test_a_policy_json_that_cannot_be_stored_is_refused_beside_the_field(tenant, member_client, text, message):
    # The first two were 500s (a RecursionError; PostgreSQL refusing the NUL mid-write); the API refuses all three.
    url = page_urls(tenant)["agent_guardrails"]
    before = db_state()

    response = member_client.post(url, {"document": text})

    assert response.status_code == 422
    assert message in " ".join(response.context["form"].errors["document"])
    assert db_state() == before


def test_a_saved_policy_is_shown_as_saved_and_rotating_changes_the_canary(tenant, member_client):
    url = page_urls(tenant)["agent_guardrails"]
    document = _document(tenant)
    document["approval_tools"] = ["lookup_trip"]

    first = member_client.post(url, {"document": json.dumps(document)})
    secret = GuardrailPolicy.objects.get(agent=tenant.agent).canary_secret_encrypted
    kept = member_client.post(url, {"document": json.dumps(document)})
    kept_secret = GuardrailPolicy.objects.get(agent=tenant.agent).canary_secret_encrypted
    rotated = member_client.post(url, {"document": json.dumps(document), "rotate_canary": "on"}, follow=True)

    assert (first.status_code, kept.status_code) == (302, 302)
    assert kept_secret == secret
    assert GuardrailPolicy.objects.get(agent=tenant.agent).canary_secret_encrypted != secret
    content = rotated.content.decode()
    assert f"Saved the guardrail policy of {tenant.agent.name} and rotated its canary." in content
    assert 'data-policy-state="saved"' in content
    assert GuardrailPolicy.objects.get(agent=tenant.agent).document["approval_tools"] == ["lookup_trip"]


# --- Violations -----------------------------------------------------------------------------------------


def test_violations_are_listed_with_their_trajectory_and_counted_per_day(tenant, other_tenant, member_client):
    GuardrailViolationFactory.create(agent=tenant.agent, layer="output", check_name="pii", action="redact")
    GuardrailViolationFactory.create(agent=other_tenant.agent, evidence="the other workspace's evidence")

    content = member_client.get(page_urls(tenant)["guardrail_violation_list"]).content.decode()

    assert content.count("data-violation=") == 2
    assert f'href="/w/{tenant.workspace.slug}/trajectories/{tenant.trajectory.trace_id}/"' in content
    assert "the other workspace&#x27;s evidence" not in content
    assert 'data-rate="prompt_injection"' in content
    assert 'data-rate="pii"' in content


def test_violations_are_filtered_by_layer_check_and_action(tenant, member_client):
    redacted = GuardrailViolationFactory.create(agent=tenant.agent, layer="output", check_name="pii", action="redact")
    url = page_urls(tenant)["guardrail_violation_list"]

    by_action = member_client.get(f"{url}?action=redact").content.decode()
    by_layer = member_client.get(f"{url}?layer=input").content.decode()
    by_check = member_client.get(f"{url}?check=secrets").content.decode()

    assert f'data-violation="{redacted.pk}"' in by_action
    assert by_action.count("data-violation=") == 1
    assert f'data-violation="{tenant.violation.pk}"' in by_layer
    assert by_layer.count("data-violation=") == 1
    assert "No violation matches these filters" in by_check


# --- Approvals ------------------------------------------------------------------------------------------


def test_the_queue_shows_pending_requests_first_and_decided_ones_after(tenant, member_client):
    decided = ApprovalRequestFactory.create(
        agent=tenant.agent,
        conversation_id="conv-2",
        status="rejected",
        decided_at=timezone.now(),
        decision_note="no",
    )

    content = member_client.get(page_urls(tenant)["guardrail_approval_list"]).content.decode()

    pending_table, decided_table = content.split('id="pending"')[1].split('id="decided"')
    assert f'data-approval="{tenant.approval.pk}" data-status="pending"' in pending_table
    assert f'data-approval="{decided.pk}"' in decided_table
    assert "issue_refund.amount &lt;= 20 does not hold" in pending_table


def test_the_detail_shows_the_call_beside_its_trajectory(tenant, member_client):
    content = member_client.get(page_urls(tenant)["guardrail_approval_detail"]).content.decode()

    assert 'id="trajectory-steps"' in content
    assert "data-step=" in content
    assert f'href="/w/{tenant.workspace.slug}/trajectories/{tenant.trajectory.trace_id}/"' in content
    assert "&quot;amount&quot;: 50" in content
    assert "Approve</button>" in content


def test_a_request_is_approved_once_and_a_second_decision_is_refused(tenant, member_client):
    url = f"{page_urls(tenant)['guardrail_approval_detail']}decide/"

    approved = member_client.post(url, {"decision": "approve", "note": "refund is fair"}, follow=True)
    again = member_client.post(url, {"decision": "reject", "note": "changed my mind"}, follow=True)

    approval = ApprovalRequest.objects.get(pk=tenant.approval.pk)
    assert approval.decided_by is not None
    assert (approval.status, approval.decided_by.username, approval.decision_note) == (
        "approved",
        "mia",
        "refund is fair",
    )
    assert list(ApprovalEvent.objects.filter(approval=approval).values_list("kind", "note")) == [
        ("approved", "refund is fair")
    ]
    assert "Approved the call of issue_refund." in approved.content.decode()
    assert 'data-event="approved"' in approved.content.decode()
    content = again.content.decode()
    assert f"Not decided: approval {approval.pk} is approved, not pending." in content
    assert "Approve</button>" not in content
    assert 'id="approval-status" data-status="approved"' in content


def test_a_request_is_rejected_with_a_note(tenant, member_client):
    response = member_client.post(
        f"{page_urls(tenant)['guardrail_approval_detail']}decide/", {"decision": "reject", "note": "too much"}
    )

    assert response.status_code == 302
    approval = ApprovalRequest.objects.get(pk=tenant.approval.pk)
    assert (approval.status, approval.decision_note) == ("rejected", "too much")


def test_an_expired_request_cannot_be_decided(tenant, member_client):
    ApprovalRequest.objects.filter(pk=tenant.approval.pk).update(expires_at=timezone.now() - timedelta(minutes=1))

    page = member_client.get(page_urls(tenant)["guardrail_approval_detail"]).content.decode()
    response = member_client.post(
        f"{page_urls(tenant)['guardrail_approval_detail']}decide/", {"decision": "approve"}, follow=True
    )

    assert "Approve</button>" not in page
    assert "Past its expiry" in page
    assert "is expired, not pending" in response.content.decode()
    assert ApprovalRequest.objects.get(pk=tenant.approval.pk).status == "expired"


def test_ids_of_another_workspace_are_not_found_under_ones_own(tenant, other_tenant, member_client):
    ws = tenant.workspace.slug
    before = db_state()

    detail = member_client.get(f"/w/{ws}/guardrails/approvals/{other_tenant.approval.pk}/")
    decide = member_client.post(
        f"/w/{ws}/guardrails/approvals/{other_tenant.approval.pk}/decide/", {"decision": "approve"}
    )
    delete = member_client.post(f"/w/{ws}/guardrails/budgets/{other_tenant.budget.pk}/delete/")
    agent_budget = member_client.post(
        f"/w/{ws}/guardrails/budgets/",
        {"scope": "agent", "period": "day", "agent": str(other_tenant.agent.pk), "limit_usd": "5"},
    )

    assert (detail.status_code, decide.status_code, delete.status_code) == (404, 404, 404)
    assert agent_budget.status_code == 422
    assert "Select a valid choice" in agent_budget.content.decode()
    assert db_state() == before


# --- Budgets --------------------------------------------------------------------------------------------


def test_budgets_show_what_they_spent_against_their_limit(tenant, member_client):
    budget = tenant.budget
    start = period_start("month")
    BudgetUsage.objects.create(budget=budget, period_start=start, spent_usd=Decimal("2.5"), reserved_usd=Decimal("1"))

    content = member_client.get(page_urls(tenant)["guardrail_budget_list"]).content.decode()

    row = content.split(f'data-budget="{budget.pk}"')[1].split("</tr>")[0]
    assert "The workspace" in row
    assert "$10" in row
    assert "$2.50" in row
    assert 'aria-valuenow="25"' in row
    assert '<span class="small" data-used>25%</span>' in row


def test_a_budget_is_created_refused_when_it_exists_and_deleted(tenant, member_client):
    url = page_urls(tenant)["guardrail_budget_list"]
    data = {"scope": "agent", "period": "day", "agent": str(tenant.agent.pk), "limit_tokens": "100000"}

    created = member_client.post(url, data, follow=True)
    budget = Budget.objects.get(workspace=tenant.workspace, scope="agent")
    before = db_state()
    duplicate = member_client.post(url, data)
    no_limit = member_client.post(url, {"scope": "workspace", "period": "day"})
    unchanged = db_state()
    deleted = member_client.post(f"/w/{tenant.workspace.slug}/guardrails/budgets/{budget.pk}/delete/")

    assert (budget.scope_value, budget.limit_tokens, budget.limit_usd) == (str(tenant.agent.pk), 100000, None)
    assert "Added the budget." in created.content.decode()
    assert tenant.agent.name in created.content.decode().split(f'data-budget="{budget.pk}"')[1].split("</tr>")[0]
    assert duplicate.status_code == 422
    assert "there is already a day budget for this agent" in duplicate.content.decode()
    assert no_limit.status_code == 422
    assert "a budget needs limit_usd, limit_tokens or both" in no_limit.content.decode()
    assert unchanged == before
    assert deleted.status_code == 302
    assert not Budget.objects.filter(pk=budget.pk).exists()


def test_a_token_limit_past_what_the_database_holds_is_refused_beside_the_field(tenant, member_client):
    url = page_urls(tenant)["guardrail_budget_list"]
    before = db_state()

    # The model's own check raised past the form: a 500.
    response = member_client.post(url, {"scope": "workspace", "period": "day", "limit_tokens": str(2**63)})

    assert response.status_code == 422
    assert response.context["form"].errors["limit_tokens"] == [
        "Ensure this value is less than or equal to 9223372036854775807."
    ]
    assert db_state() == before


def test_the_nav_counts_tool_calls_waiting_for_approval(tenant, member_client):
    waiting = member_client.get(page_urls(tenant)["guardrail_budget_list"]).content.decode()
    url = f"{page_urls(tenant)['guardrail_approval_detail']}decide/"
    member_client.post(url, {"decision": "approve", "note": "ok"})
    after = member_client.get(page_urls(tenant)["guardrail_budget_list"]).content.decode()

    assert '1<span class="visually-hidden"> waiting</span>' in waiting
    assert "waiting for approval" not in after
