"""Who sees what: members and viewers read every page of their workspace; nobody reads another
workspace's; viewers (and members, for keys and the Langfuse mirror) are refused every write, which
changes nothing."""

from __future__ import annotations

import pytest
from django.test import Client

from agent_registry.models import Role
from agent_registry.tests.factories import MembershipFactory, UserFactory
from frontend.tests.conftest import db_state, page_urls, post_cases

pytestmark = pytest.mark.django_db

PAGES = [
    "workspace_home",
    "agent_list",
    "agent_detail",
    "requirements_edit",
    "requirements_history",
    "requirements_diff",
    "configuration",
    "agent_prompt_list",
    "prompt_list",
    "prompt_detail",
    "prompt_diff",
    "prompt_render",
    "apikey_list",
    "trajectory_list",
    "trajectory_list_filtered",
    "agent_trajectory_list",
    "trajectory_detail",
    "session_list",
    "session_detail",
    "replay_detail",
    "review_list",
    "review_informativeness",
    "review_sample",
    "review_item",
    "alert_list",
    "alert_list_open",
    "agent_triage",
    "agent_signals",
    "agent_signals_daily",
    "agent_alert_rules",
    "agent_alert_rule_edit",
    "agent_settings",
    "integration_list",
    "integration_list_price",
    "model_target_list",
    "model_target_edit",
    "model_target_delete",
    "agent_router",
    "agent_tool_edit",
    "agent_router_report",
    "agent_router_report_30d",
    "routing_decision_list",
    "routing_decision_list_filtered",
    "routing_decision_detail",
    "handoff_list",
    "cache_review",
    "cache_review_agent",
    "agent_guardrails",
    "guardrail_violation_list",
    "guardrail_violation_list_filtered",
    "guardrail_approval_list",
    "guardrail_approval_detail",
    "guardrail_budget_list",
    "eval_overview",
    "eval_suite_create",
    "eval_suite_detail",
    "eval_suite_edit",
    "eval_run_list",
    "eval_run_detail",
    "eval_run_progress",
    "eval_run_compare",
    "eval_online_rule_list",
    "eval_online_rule_edit",
    "training_curation_list",
    "training_curation_create",
    "training_curation_detail",
    "training_curation_edit",
    "training_export_list",
    "training_export_detail",
    "training_export_progress",
    "training_export_download",
    "training_job_list",
    "training_job_create",
    "training_job_detail",
    "training_job_metrics",
    "training_job_adapter",
]
POSTS = [
    "agent_create",
    "requirements_save",
    "requirements_validate",
    "requirements_activate",
    "prompt_create",
    "prompt_version_create",
    "prompt_label_move",
    "prompt_label_delete",
    "prompt_update",
    "prompt_delete",
    "apikey_create",
    "apikey_revoke",
    "trajectory_score_create",
    "trajectory_replay_create",
    "review_sample_create",
    "review_item_decide",
    "alert_acknowledge",
    "agent_triage_save",
    "agent_alert_rule_create",
    "agent_alert_rule_edit",
    "agent_alert_rule_delete",
    "agent_settings_save",
    "agent_delete",
    "langfuse_mirror_configure",
    "langfuse_export_retry",
    "langfuse_mirror_delete",
    "model_price_set",
    "model_price_delete",
    "model_target_create",
    "model_target_edit",
    "model_target_delete",
    "agent_router_save",
    "agent_chain_save",
    "agent_tool_create",
    "agent_tool_edit",
    "agent_tool_delete",
    "handoff_claim",
    "handoff_resolve",
    "cache_hit_review",
    "agent_guardrails_save",
    "guardrail_approval_decide",
    "guardrail_budget_create",
    "guardrail_budget_delete",
    "eval_suites_propose",
    "eval_suite_save_new",
    "eval_suite_save",
    "eval_suite_run",
    "eval_run_cancel",
    "eval_run_resume",
    "eval_online_rule_create",
    "eval_online_rule_save",
    "eval_online_rule_backfill",
    "trajectory_dataset_add",
    "review_dataset_add",
    "training_curation_create",
    "training_curation_preview",
    "training_curation_save",
    "training_curation_export",
    "training_export_cancel",
    "training_job_create",
    "training_job_cancel",
]
# Pages that answer JSON for a page's script rather than HTML.
JSON_PAGES = {"eval_run_progress", "training_export_progress", "training_job_metrics"}
# Pages that stream a file.
FILE_PAGES = {"training_export_download", "training_job_adapter"}
# Writes a member may make that change nothing (they check or preview what a save would do).
READ_ONLY_POSTS = {"requirements_validate", "training_curation_preview"}
# Writes that only enqueue work once the transaction commits (test_evals_views.py checks what they queue).
ENQUEUE_POSTS = {"eval_online_rule_backfill"}
# The writes that need the owner role.
OWNER_POSTS = [
    "apikey_create",
    "apikey_revoke",
    "langfuse_mirror_configure",
    "langfuse_export_retry",
    "langfuse_mirror_delete",
]


# Pages only owners read (members and viewers get 403), by URL under the workspace.
OWNER_PAGES = {"audit_event_list": "audit-log/"}


# The route each case exercises, where its name is not the route's own.
ROUTE_OF = {
    "requirements_diff": "requirements_history",
    "prompt_diff": "prompt_detail",
    "agent_create": "agent_list",
    "requirements_save": "requirements_edit",
    "prompt_create": "agent_prompt_list",
    "apikey_create": "apikey_list",
    "trajectory_list_filtered": "trajectory_list",
    "alert_list_open": "alert_list",
    "agent_signals_daily": "agent_signals",
    "review_sample_create": "review_list",
    "review_item_decide": "review_item",
    "agent_triage_save": "agent_triage",
    "agent_alert_rule_create": "agent_alert_rules",
    "agent_settings_save": "agent_settings",
    "integration_list_price": "integration_list",
    "model_target_create": "model_target_list",
    "agent_router_save": "agent_router",
    "agent_router_report_30d": "agent_router_report",
    "routing_decision_list_filtered": "routing_decision_list",
    "cache_review_agent": "cache_review",
    "agent_guardrails_save": "agent_guardrails",
    "guardrail_violation_list_filtered": "guardrail_violation_list",
    "guardrail_budget_create": "guardrail_budget_list",
    "eval_suite_save_new": "eval_suite_create",
    "eval_suite_save": "eval_suite_edit",
    "eval_online_rule_create": "eval_online_rule_list",
    "eval_online_rule_save": "eval_online_rule_edit",
    "training_curation_save": "training_curation_edit",
}


def _route_names(patterns):
    for pattern in patterns:
        if hasattr(pattern, "url_patterns"):
            yield from _route_names(pattern.url_patterns)
        else:
            yield pattern.name


def test_the_cases_cover_every_route_of_the_dashboard(tenant):
    from frontend import urls

    exercised = {ROUTE_OF.get(case, case) for case in [*PAGES, *POSTS]}

    assert set(_route_names(urls.urlpatterns)) == exercised | set(OWNER_PAGES) | {"login", "logout", "home"}
    assert set(page_urls(tenant)) == set(PAGES)
    assert set(post_cases(tenant)) == set(POSTS)


@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders_for_a_member(tenant, member_client, page):
    response = member_client.get(page_urls(tenant)[page])

    assert response.status_code == 200
    if page in FILE_PAGES:
        assert b"".join(response.streaming_content)
    elif page not in JSON_PAGES:
        assert tenant.workspace.name.encode() in response.content


@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders_for_a_viewer(tenant, viewer_client, page):
    response = viewer_client.get(page_urls(tenant)[page])

    assert response.status_code == 200
    response.close()  # a streamed file closes with its response


@pytest.mark.parametrize("page", PAGES)
def test_a_visitor_is_sent_to_sign_in(tenant, page):
    url = page_urls(tenant)[page]

    response = Client().get(url)

    assert response.status_code == 302
    assert response["Location"].startswith("/login/?next=")


@pytest.mark.parametrize("page", PAGES)
def test_a_member_of_another_workspace_gets_404(tenant, other_tenant, member_client, page):
    response = member_client.get(page_urls(other_tenant)[page])

    assert response.status_code == 404
    assert b"Page not found" in response.content
    assert other_tenant.workspace.name.encode() not in response.content


@pytest.mark.parametrize("case", POSTS)
def test_a_member_of_another_workspace_cannot_write_there(tenant, other_tenant, member_client, case):
    url, data = post_cases(other_tenant)[case]
    before = db_state()

    response = member_client.post(url, data)

    assert response.status_code == 404
    assert db_state() == before


def test_ids_of_another_workspace_are_not_found_under_ones_own(tenant, other_tenant, owner_client):
    ws = tenant.workspace.slug
    before = db_state()

    assert owner_client.get(f"/w/{ws}/prompts/{other_tenant.prompt.pk}/").status_code == 404
    assert owner_client.get(f"/w/{ws}/prompts/{other_tenant.prompt.pk}/render/").status_code == 404
    assert owner_client.get(f"/w/{ws}/keys/{other_tenant.api_key.pk}/revoke/").status_code == 404
    assert owner_client.post(f"/w/{ws}/keys/{other_tenant.api_key.pk}/revoke/").status_code == 404
    assert (
        owner_client.post(
            f"/w/{ws}/prompts/{other_tenant.prompt.pk}/labels/", {"label": "production", "version": "2"}
        ).status_code
        == 404
    )
    assert db_state() == before


def test_the_same_agent_slug_in_two_workspaces_shows_ones_own(tenant, other_tenant, member_client):
    response = member_client.get(page_urls(tenant)["agent_prompt_list"])

    assert response.context["agent"] == tenant.agent
    assert list(response.context["prompts"]) == [tenant.prompt, tenant.draft_prompt]


def test_an_api_key_form_offers_only_the_workspaces_agents(tenant, other_tenant, owner_client):
    before = db_state()

    response = owner_client.post(
        f"/w/{tenant.workspace.slug}/keys/", {"name": "k", "scopes": ["ingest"], "agents": [other_tenant.agent.pk]}
    )

    assert response.status_code == 422
    assert "Select a valid choice" in response.content.decode()
    assert db_state() == before


@pytest.mark.parametrize("case", POSTS)
def test_a_viewer_is_refused_every_write_and_nothing_changes(tenant, viewer_client, case):
    url, data = post_cases(tenant)[case]
    before = db_state()

    response = viewer_client.post(url, data)

    assert response.status_code == 403
    assert b"You do not have permission" in response.content
    assert db_state() == before


@pytest.mark.parametrize("case", OWNER_POSTS)
def test_a_member_is_refused_what_only_owners_do_and_nothing_changes(tenant, member_client, case):
    url, data = post_cases(tenant)[case]
    before = db_state()

    response = member_client.post(url, data)

    assert response.status_code == 403
    assert db_state() == before


@pytest.mark.parametrize("case", [case for case in POSTS if case not in OWNER_POSTS])
def test_the_same_writes_succeed_for_a_member(tenant, member_client, case):
    url, data = post_cases(tenant)[case]
    before = db_state()

    response = member_client.post(url, data)

    assert response.status_code in (200, 302), response.content.decode()[:2000]
    if case not in READ_ONLY_POSTS and case not in ENQUEUE_POSTS:
        assert db_state() != before


@pytest.mark.parametrize("case", OWNER_POSTS)
def test_what_only_owners_do_succeeds_for_an_owner(tenant, owner_client, case):
    url, data = post_cases(tenant)[case]
    before = db_state()

    response = owner_client.post(url, data)

    assert response.status_code in (200, 302)
    assert db_state() != before


@pytest.mark.parametrize("case", ["apikey_revoke", "langfuse_mirror_delete"])
def test_only_owners_see_the_confirmation(tenant, member_client, owner_client, case):
    url, _ = post_cases(tenant)[case]

    assert member_client.get(url).status_code == 403
    assert owner_client.get(url).status_code == 200


@pytest.mark.parametrize("page", sorted(OWNER_PAGES))
def test_only_owners_read_the_owner_pages(tenant, member_client, viewer_client, owner_client, page):
    url = f"/w/{tenant.workspace.slug}/{OWNER_PAGES[page]}"

    assert viewer_client.get(url).status_code == 403
    assert member_client.get(url).status_code == 403
    assert owner_client.get(url).status_code == 200


def test_a_viewer_sees_no_write_controls(tenant, viewer_client):
    pages = page_urls(tenant)

    agents = viewer_client.get(pages["agent_list"]).content.decode()
    editor = viewer_client.get(pages["requirements_edit"]).content.decode()
    prompt = viewer_client.get(pages["prompt_detail"]).content.decode()
    keys = viewer_client.get(pages["apikey_list"]).content.decode()
    agent_settings = viewer_client.get(pages["agent_settings"]).content.decode()
    integrations = viewer_client.get(pages["integration_list"]).content.decode()

    assert "Create agent" not in agents
    assert "Save as new version" not in editor
    assert "hx-post" not in editor
    assert "Publish a new version" not in prompt
    assert "Move</button>" not in prompt
    assert "Create key" not in keys
    assert "Revoke" not in keys
    assert "Save settings" not in agent_settings
    assert '<fieldset class="stack" disabled>' in agent_settings
    assert "Save mirror settings" not in integrations
    assert "Retry failed deliveries" not in integrations
    assert "Stop mirroring" not in integrations
    assert "Save price" not in integrations
    assert "Change</a>" not in integrations


def test_root_redirects_to_the_first_workspace(tenant, member_client):
    response = member_client.get("/")

    assert response.status_code == 302
    assert response["Location"] == f"/w/{tenant.workspace.slug}/"


def test_root_without_a_workspace_says_so(db):
    client = Client()
    client.force_login(UserFactory.create(username="loner"))

    response = client.get("/")

    assert response.status_code == 200
    assert b"You are not in any workspace yet" in response.content


def test_sign_in_and_out(tenant):
    from agent_registry.tests.factories import PASSWORD

    user = UserFactory.create(username="signer")
    MembershipFactory.create(workspace=tenant.workspace, user=user, role=Role.VIEWER)
    client = Client()

    assert client.get("/login/").status_code == 200
    response = client.post("/login/", {"username": "signer", "password": PASSWORD})
    assert response.status_code == 302
    assert client.get(f"/w/{tenant.workspace.slug}/").status_code == 200
    assert client.get("/logout/").status_code == 405
    assert client.post("/logout/").status_code == 302
    assert client.get(f"/w/{tenant.workspace.slug}/").status_code == 302


def test_the_admin_link_is_for_staff_only(tenant, member_client):
    page = page_urls(tenant)["workspace_home"]
    staff = UserFactory.create(username="root", is_staff=True)
    MembershipFactory.create(workspace=tenant.workspace, user=staff, role=Role.VIEWER)
    staff_client = Client()
    staff_client.force_login(staff)

    assert b"Django admin" not in member_client.get(page).content
    assert b"Django admin" in staff_client.get(page).content


def test_the_workspace_switcher_lists_only_ones_workspaces(tenant, other_tenant, member_client):
    content = member_client.get(page_urls(tenant)["workspace_home"]).content.decode()

    assert tenant.workspace.name in content
    assert other_tenant.workspace.name not in content
