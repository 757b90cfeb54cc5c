"""Routing pages: model targets (keys for owners only, never shown), an agent's router (configuration with
rules, chain, tools), its report, decisions, hand-offs and the cache review. Who may open and post what is
in test_access.py; here, what each page does."""

from __future__ import annotations

import json

import pytest

from agent_registry.models import Role
from agent_registry.tests.factories import AgentFactory, MembershipFactory, UserFactory
from config import crypto
from frontend.tests.conftest import TENANT_PROVIDER_KEY, db_state, page_urls, post_cases
from routing.models import (
    AgentTool,
    CacheHit,
    ChainStep,
    Handoff,
    HandoffStatus,
    ModelTarget,
    RouterConfig,
    TargetSource,
)
from routing.tests.factories import ModelTargetFactory

pytestmark = pytest.mark.django_db

TARGET_FIELDS = {
    "timeout_seconds": "30",
    "max_retries": "2",
    "failure_threshold": "3",
    "cooldown_seconds": "30",
    "enabled": "on",
}


# --- Model targets ----------------------------------------------------------------------------------


def test_the_targets_page_shows_health_and_never_the_key(tenant, member_client):
    ModelTarget.objects.filter(pk=tenant.target.pk).update(consecutive_failures=2, last_error="upstream 502")

    content = member_client.get(page_urls(tenant)["model_target_list"]).content.decode()

    assert 'data-target="fast"' in content
    assert 'data-health="failing"' in content
    assert "upstream 502" in content
    assert TENANT_PROVIDER_KEY not in content
    assert tenant.target.api_key_encrypted not in content


def test_an_owner_adds_a_target_with_a_key(tenant, owner_client):
    url = page_urls(tenant)["model_target_list"]

    response = owner_client.post(
        url,
        {"alias": "strong", "model": "openai/gpt-4o", "api_key": "sk-typed-once", "fallbacks": "fast", **TARGET_FIELDS},
    )

    assert response.status_code == 302
    target = ModelTarget.objects.get(workspace=tenant.workspace, alias="strong")
    assert crypto.decrypt(target.api_key_encrypted) == "sk-typed-once"
    assert target.fallbacks == ["fast"]
    assert "sk-typed-once" not in owner_client.get(url).content.decode()


def test_a_member_has_no_key_field_and_cannot_set_or_remove_a_key(tenant, member_client):
    edit = page_urls(tenant)["model_target_edit"]
    stored_key = tenant.target.api_key_encrypted

    page = member_client.get(edit).content.decode()
    response = member_client.post(
        edit, {"model": "openai/gpt-4o", "api_key": "sk-member", "remove_api_key": "on", **TARGET_FIELDS}
    )

    assert 'name="api_key"' not in page
    assert "Only owners set or change provider keys." in page
    assert response.status_code == 302
    target = ModelTarget.objects.get(pk=tenant.target.pk)
    assert (target.model, target.api_key_encrypted) == ("openai/gpt-4o", stored_key)


def test_an_owner_removes_a_key(tenant, owner_client):
    response = owner_client.post(
        page_urls(tenant)["model_target_edit"], {"model": "openai/gpt-4o-mini", "remove_api_key": "on", **TARGET_FIELDS}
    )

    assert response.status_code == 302
    assert ModelTarget.objects.get(pk=tenant.target.pk).api_key_encrypted == ""


def test_a_bad_target_is_shown_again_with_its_error_and_nothing_changes(tenant, member_client):
    before = db_state()

    taken = member_client.post(page_urls(tenant)["model_target_list"], {"alias": "fast", "model": "m", **TARGET_FIELDS})
    fallback = member_client.post(
        page_urls(tenant)["model_target_list"], {"alias": "x", "model": "m", "fallbacks": "nowhere", **TARGET_FIELDS}
    )

    assert taken.status_code == 422
    assert "already a model target" in taken.content.decode()
    assert fallback.status_code == 422
    assert "no model target named nowhere" in fallback.content.decode()
    assert db_state() == before


def test_a_target_on_a_bare_host_name_is_added_and_a_bad_api_base_is_refused(tenant, member_client):
    url = page_urls(tenant)["model_target_list"]
    fields = {"model": "openai/qwen", **TARGET_FIELDS}

    added = member_client.post(url, {"alias": "local", "api_base": "http://vllm:8000/v1", **fields})
    before = db_state()
    refused = member_client.post(url, {"alias": "other", "api_base": "ftp://vllm/v1", **fields})

    assert added.status_code == 302
    assert ModelTarget.objects.get(workspace=tenant.workspace, alias="local").api_base == "http://vllm:8000/v1"
    assert refused.status_code == 422
    assert "must be an http(s) URL with a host" in refused.content.decode()
    assert db_state() == before


def test_an_environment_target_is_read_only_in_the_dashboard(tenant, owner_client):
    env = ModelTargetFactory.create(workspace=tenant.workspace, alias="env-fast", source=TargetSource.ENVIRONMENT)
    edit = f"/w/{tenant.workspace.slug}/model-targets/{env.alias}/"
    before = db_state()

    listed = owner_client.get(page_urls(tenant)["model_target_list"]).content.decode()
    page = owner_client.get(edit).content.decode()
    posted = owner_client.post(edit, {"model": "stolen", **TARGET_FIELDS})
    deleted = owner_client.post(f"{edit}delete/", follow=True)

    assert "environment" in listed
    assert "comes from <code>KEEL_MODEL_TARGETS</code>" in page
    assert "Save target" not in page
    assert posted.status_code == 422
    assert "was not deleted" in deleted.content.decode()
    assert db_state() == before


def test_a_target_another_falls_back_to_is_not_deleted(tenant, member_client):
    ModelTargetFactory.create(workspace=tenant.workspace, alias="strong", fallbacks=["fast"])

    response = member_client.post(post_cases(tenant)["model_target_delete"][0], follow=True)

    assert "is a fallback of strong" in response.content.decode()
    assert ModelTarget.objects.filter(pk=tenant.target.pk).exists()


# --- The router page --------------------------------------------------------------------------------


def test_the_router_page_shows_the_configuration_chain_and_tools(tenant, viewer_client):
    content = viewer_client.get(page_urls(tenant)["agent_router"]).content.decode()

    assert '<option value="fast" selected>' in content
    assert 'value="draft"' in content
    assert 'data-tool="lookup_trip"' in content
    assert "Save router" not in content
    assert "+ Add rule" not in content
    assert "Add a tool" not in content


def test_saving_the_router_stores_rules_and_shares(tenant, member_client):
    url, data = post_cases(tenant)["agent_router_save"]

    response = member_client.post(url, data)

    assert response.status_code == 302
    config = RouterConfig.objects.get(agent=tenant.agent)
    assert config.rules == [
        {"name": "refunds", "kind": "keywords", "value": "refund", "to_tier": "agentic", "reason": "money"}
    ]
    assert (config.shadow_rate, config.cache_threshold, config.cache_ttl_seconds) == (0.25, 0.9, 86_400)
    assert config.speculative_single_call is True
    assert config.human_message == "A person will answer."
    page = member_client.get(url).content.decode()
    assert 'name="rule-0-value" value="refund"' in page


def test_a_bad_rule_is_shown_and_nothing_is_saved(tenant, member_client):
    url, data = post_cases(tenant)["agent_router_save"]
    before = db_state()

    response = member_client.post(url, {**data, "rule-0-kind": "pattern", "rule-0-value": "(unclosed"})

    assert response.status_code == 422
    content = response.content.decode()
    assert "invalid regular expression" in content
    assert 'value="(unclosed"' in content
    assert db_state() == before


def test_a_chain_with_a_broken_schema_keeps_the_old_chain(tenant, member_client):
    url, data = post_cases(tenant)["agent_chain_save"]
    before = db_state()

    response = member_client.post(url, {**data, "step-1-output_schema": "{not json"})

    assert response.status_code == 422
    assert "the output schema is not JSON" in response.content.decode()
    assert db_state() == before
    assert member_client.post(url, data).status_code == 302
    assert list(ChainStep.objects.filter(agent=tenant.agent).values_list("name", flat=True)) == ["extract", "answer"]


def test_an_owner_adds_a_tool_with_a_secret_never_shown(tenant, owner_client):
    url, data = post_cases(tenant)["agent_tool_create"]

    response = owner_client.post(
        url, {**data, "endpoint_url": "https://tools.example.com/refund", "endpoint_secret": "tool-secret"}
    )

    assert response.status_code == 302
    tool = AgentTool.objects.get(agent=tenant.agent, name="refund_ride")
    assert crypto.decrypt(tool.endpoint_secret_encrypted) == "tool-secret"
    for page in (
        page_urls(tenant)["agent_router"],
        f"/w/{tenant.workspace.slug}/agents/{tenant.agent.slug}/router/tools/refund_ride/",
    ):
        assert "tool-secret" not in owner_client.get(page).content.decode()


def test_a_tool_with_bad_parameters_is_refused(tenant, member_client):
    url, data = post_cases(tenant)["agent_tool_create"]
    before = db_state()

    response = member_client.post(url, {**data, "parameters": '{"type": "string"}'})

    assert response.status_code == 422
    assert "must describe an object" in response.content.decode()
    assert db_state() == before


# --- Report, decisions, hand-offs -------------------------------------------------------------------


def test_the_report_shows_tiers_best_tier_rate_and_the_daily_series(tenant, viewer_client):
    response = viewer_client.get(page_urls(tenant)["agent_router_report"])

    content = response.content.decode()
    assert 'data-tier="chain"' in content
    # The chain answer (0.7) lost to its agentic shadow (0.8).
    assert '<div class="stat-value" data-best-tier-rate>0%</div>' in content
    chart = response.context["chart_data"]
    assert [tier["label"] for tier in chart["tiers"]] == ["Single call", "Chain", "Human"]
    # Every day of the period is on the axis; only today had a finished decision.
    assert len(chart["x"]) == 8
    assert chart["totals"] == [0] * 7 + [1]


def test_the_report_counts_speculative_single_calls_only_when_there_were_some(tenant, viewer_client):
    url = page_urls(tenant)["agent_router_report"]
    before = viewer_client.get(url).content.decode()
    tenant.decision.features = {"speculative": False, "speculative_cost_usd": 0.0004}
    tenant.decision.save(update_fields=["features"])

    after = viewer_client.get(url).content.decode()

    assert "data-speculation" not in before
    assert "1 started before the router decided; 0 answered the request; 1 went unused" in after
    assert "costing $0.0004 in all" in after


def test_an_agent_without_traffic_is_told_how_to_get_some(tenant, viewer_client):
    agent = AgentFactory.create(workspace=tenant.workspace, slug="quiet", name="Quiet")

    content = viewer_client.get(f"/w/{tenant.workspace.slug}/agents/{agent.slug}/router/report/").content.decode()

    assert "No routed requests in this period" in content
    assert '"model": "agent/quiet"' in content


def test_decisions_are_filtered_and_link_to_their_detail(tenant, member_client):
    listed = member_client.get(page_urls(tenant)["routing_decision_list_filtered"]).content.decode()
    none = member_client.get(f"/w/{tenant.workspace.slug}/routing-decisions/?tier=agentic").content.decode()
    detail = member_client.get(page_urls(tenant)["routing_decision_detail"]).content.decode()

    assert f'data-decision="{tenant.decision.pk}"' in listed
    assert "No decision matches these filters" in none
    assert f"/w/{tenant.workspace.slug}/trajectories/{tenant.decision.trace_id}/" in detail
    assert 'data-shadow="agentic"' in detail
    assert 'id="estimates"' in detail
    assert "Money" in detail


def test_a_handoff_is_taken_then_resolved(tenant, member_client):
    claim_url, _ = post_cases(tenant)["handoff_claim"]
    resolve_url, data = post_cases(tenant)["handoff_resolve"]

    member_client.post(claim_url)
    member_client.post(resolve_url, data)
    again = member_client.post(resolve_url, {"resolution": "Again."}, follow=True)

    handoff = Handoff.objects.get(pk=tenant.handoff.pk)
    assert (handoff.status, handoff.resolution) == (HandoffStatus.RESOLVED, "Refunded the ride.")
    assert handoff.assigned_to is not None
    assert handoff.assigned_to.username == "mia"
    assert "already resolved" in again.content.decode()


def test_someone_elses_claim_is_not_taken_over(tenant, member_client):
    other = UserFactory.create(username="olaf")
    MembershipFactory.create(workspace=tenant.workspace, user=other, role=Role.MEMBER)
    Handoff.objects.filter(pk=tenant.handoff.pk).update(status=HandoffStatus.CLAIMED, assigned_to=other)

    response = member_client.post(post_cases(tenant)["handoff_claim"][0], follow=True)

    assert "already claimed by olaf" in response.content.decode()
    assert Handoff.objects.get(pk=tenant.handoff.pk).assigned_to == other


# --- Cache review -----------------------------------------------------------------------------------


def test_a_hit_is_flagged_in_place_with_htmx(tenant, member_client):
    url, data = post_cases(tenant)["cache_hit_review"]

    response = member_client.post(url, data, headers={"HX-Request": "true"})

    content = response.content.decode()
    assert response.status_code == 200
    assert content.startswith('<article class="card review-card" id="hit-')
    assert 'data-verdict="false_hit"' in content
    hit = CacheHit.objects.get(pk=tenant.hit.pk)
    assert hit.false_hit is True
    assert hit.reviewed_by is not None
    assert hit.reviewed_by.username == "mia"
    member_client.post(url, {"verdict": "correct"})
    assert CacheHit.objects.get(pk=tenant.hit.pk).false_hit is False
    assert member_client.post(url, {"verdict": "maybe"}).status_code == 400


def test_the_review_shows_each_hit_beside_its_entry_and_the_threshold_table(tenant, viewer_client):
    content = viewer_client.get(page_urls(tenant)["cache_review_agent"]).content.decode()

    assert "How do I reset my password?" in content
    assert tenant.hit.entry.request_text in content
    assert 'id="threshold-table"' in content
    assert "False hit</button>" not in content


def test_empty_routing_pages_say_what_to_do(workspace):
    from django.test import Client

    user = UserFactory.create(username="newcomer")
    MembershipFactory.create(workspace=workspace, user=user, role=Role.MEMBER)
    client = Client()
    client.force_login(user)
    ws = workspace.slug

    assert "No model targets yet" in client.get(f"/w/{ws}/model-targets/").content.decode()
    assert "No routing decisions yet" in client.get(f"/w/{ws}/routing-decisions/").content.decode()
    assert "No hand-offs yet" in client.get(f"/w/{ws}/handoffs/").content.decode()
    assert "No cache hits" in client.get(f"/w/{ws}/cache-review/").content.decode()


def test_the_nav_counts_open_handoffs(tenant, viewer_client):
    content = viewer_client.get(page_urls(tenant)["handoff_list"]).content.decode()

    assert '1<span class="visually-hidden"> open</span>' in content
    assert json.dumps(tenant.handoff.reason)[1:-1] in content
