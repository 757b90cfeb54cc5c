"""The audit log: every administrative action writes exactly one event, with the actor that did it (a person
in the dashboard, a key through the API, Keel itself), the target and the client's address; an action that
fails writes none; a workspace reads only its own log, and only its owners (or a workspace-wide key with
the `write` scope) read it.

The dashboard side goes through every POST of the dashboard (frontend/tests/conftest.py's `post_cases`),
so a new dashboard action that should be audited and is not shows up here."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.test import Client
from django.utils import timezone

from agent_registry import audit, selectors
from agent_registry import services as registry_services
from agent_registry.middleware import client_ip
from agent_registry.models import ApiKey, AuditActorKind, AuditEvent, User
from agent_registry.tests.factories import MembershipFactory, UserFactory
from frontend.tests.conftest import Tenant, media, post_cases, tenant  # noqa: F401 - fixtures
from guardrails import budgets
from guardrails import services as guardrail_services
from guardrails.models import ApprovalStatus
from routing import services as routing_services
from routing.models import ModelTarget

pytestmark = pytest.mark.django_db

# Each dashboard POST that is an administrative action, and the event it writes.
AUDITED_POSTS = {
    "agent_create": "agent.created",
    "agent_settings_save": "agent.changed",
    "agent_delete": "agent.deleted",
    "prompt_label_move": "prompt.label_moved",
    "prompt_label_delete": "prompt.label_deleted",
    "prompt_delete": "prompt.deleted",
    "apikey_create": "apikey.created",
    "apikey_revoke": "apikey.revoked",
    "agent_alert_rule_create": "alert_rule.created",
    "agent_alert_rule_edit": "alert_rule.changed",
    "agent_alert_rule_delete": "alert_rule.deleted",
    "langfuse_mirror_configure": "langfuse_mirror.changed",
    "langfuse_mirror_delete": "langfuse_mirror.deleted",
    "model_price_set": "model_price.changed",
    "model_price_delete": "model_price.deleted",
    "model_target_create": "model_target.created",
    "model_target_edit": "model_target.changed",
    "model_target_delete": "model_target.deleted",
    "agent_router_save": "router.changed",
    "agent_chain_save": "router.changed",
    "agent_tool_create": "tool.created",
    "agent_tool_edit": "tool.changed",
    "agent_tool_delete": "tool.deleted",
    "agent_guardrails_save": "policy.created",
    "guardrail_approval_decide": "approval.decided",
    "guardrail_budget_create": "budget.created",
    "guardrail_budget_delete": "budget.deleted",
    "training_curation_export": "export.created",
    "training_job_create": "training_job.created",
    # Making an earlier requirements version current moves a pointer the rest of Keel reads from.
    "requirements_activate": "requirements.activated",
    # Publishing with a label moves the label: that move is the audited part.
    "prompt_create": "prompt.label_moved",
    "prompt_version_create": "prompt.label_moved",
}


def _drain(response: Any) -> bytes:
    """Read a streamed file and close it (not the response: closing that ends the test's database connection)."""
    content = b"".join(response.streaming_content)
    for close in response._resource_closers:
        close()
    return content


def _events(since_id: int) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(pk__gt=since_id).order_by("pk"))


def _last_id() -> int:
    last = AuditEvent.objects.order_by("-pk").first()
    return last.pk if last is not None else 0


def _owner(tenant: Tenant) -> tuple[Client, User]:  # noqa: F811
    user = UserFactory.create(username="olga")
    MembershipFactory.create(workspace=tenant.workspace, user=user, role="owner")
    client = Client()
    client.force_login(user)
    return client, user


def _posted_alone(client: Client, url: str, data: dict[str, Any]) -> tuple[int, list[AuditEvent]]:
    """Post, read the events it wrote, and roll the post back: each case starts from the same tenant."""
    with transaction.atomic():
        before = _last_id()
        status = client.post(url, data).status_code
        events = _events(before)
        transaction.set_rollback(True)
    return status, events


def test_each_dashboard_action_writes_one_event_by_the_person(tenant: Tenant) -> None:  # noqa: F811
    client, olga = _owner(tenant)
    cases = post_cases(tenant)
    written = {}
    for case in sorted(AUDITED_POSTS):
        status, events = _posted_alone(client, *cases[case])
        written[case] = (
            status in (200, 302),
            [
                (event.action, event.actor_kind, event.actor_user_id, event.actor_label, event.ip_address)
                for event in events
            ],
            all(
                event.target_type and event.target_id and event.workspace_id == tenant.workspace.pk for event in events
            ),
        )

    assert written == {
        case: (True, [(action, "user", olga.pk, "olga", "127.0.0.1")], True) for case, action in AUDITED_POSTS.items()
    }


def test_the_dashboard_posts_that_are_not_administrative_write_no_event(tenant: Tenant) -> None:  # noqa: F811
    client, _ = _owner(tenant)
    written = {
        case: [event.action for event in _posted_alone(client, url, data)[1]]
        for case, (url, data) in post_cases(tenant).items()
        if case not in AUDITED_POSTS
    }

    assert {case: actions for case, actions in written.items() if actions} == {}
    assert len(written) > 20


def test_downloading_an_export_in_the_dashboard_is_recorded(tenant: Tenant) -> None:  # noqa: F811
    client, olga = _owner(tenant)
    before = _last_id()

    response = client.get(f"/w/{tenant.workspace.slug}/training/exports/{tenant.export.pk}/download/")

    assert response.status_code == 200
    _drain(response)
    (event,) = _events(before)
    assert (event.action, event.actor_user_id, event.target_id) == ("export.downloaded", olga.pk, str(tenant.export.pk))


# --- Through the API ---------------------------------------------------------------------------------------


def _key_client(tenant: Tenant, scopes: tuple[str, ...] = ("read", "write")) -> tuple[Client, ApiKey]:  # noqa: F811
    key, raw = registry_services.apikey_create(workspace=tenant.workspace, name="admin", scopes=list(scopes))
    return Client(headers={"Authorization": f"Bearer {raw}"}), key


def _send(client: Client, method: str, path: str, body: Any = None) -> Any:
    if body is None:
        response = getattr(client, method)(path)
    else:
        response = getattr(client, method)(path, data=json.dumps(body), content_type="application/json")
    if response.streaming:
        _drain(response)
    return response


def _read_key(tenant: Tenant) -> ApiKey:  # noqa: F811
    """A key the `read, write` clients of these tests may revoke (one with no scope they lack)."""
    key, _ = registry_services.apikey_create(workspace=tenant.workspace, name="old ci", scopes=["read"])
    return key


def _api_cases(tenant: Tenant) -> dict[str, tuple[str, str, Any, str]]:  # noqa: F811
    """name: (method, path, body, the action it writes), each on the tenant's own rows."""
    agent, prompt = tenant.agent.slug, tenant.prompt.name
    policy = guardrail_services.guardrail_policy_get(agent=tenant.agent).document.model_dump(mode="json")
    rule = {"name": "Loops", "signal": "loop", "threshold": 0.2, "agent": agent}
    return {
        "key_create": ("post", "/api/v1/keys", {"name": "ci", "scopes": ["read"]}, "apikey.created"),
        "key_revoke": ("delete", f"/api/v1/keys/{_read_key(tenant).pk}", None, "apikey.revoked"),
        "agent_create": ("post", "/api/v1/agents", {"slug": "new-agent", "name": "New"}, "agent.created"),
        "agent_update": ("patch", f"/api/v1/agents/{agent}", {"status": "paused"}, "agent.changed"),
        "agent_delete": ("delete", f"/api/v1/agents/{agent}", None, "agent.deleted"),
        "label_move": ("put", f"/api/v1/prompts/{prompt}/labels/staging", {"version": 1}, "prompt.label_moved"),
        "label_delete": ("delete", f"/api/v1/prompts/{prompt}/labels/production", None, "prompt.label_deleted"),
        "prompt_delete": ("delete", f"/api/v1/prompts/{tenant.draft_prompt.name}", None, "prompt.deleted"),
        "policy_save": ("put", f"/api/v1/agents/{agent}/guardrail-policy", policy, "policy.created"),
        "approval_decide": (
            "post",
            f"/api/v1/approvals/{tenant.approval.pk}/decide",
            {"approved": True},
            "approval.decided",
        ),
        "budget_create": (
            "post",
            "/api/v1/budgets",
            {"scope": "workspace", "period": "day", "limit_tokens": 1000},
            "budget.created",
        ),
        "budget_delete": ("delete", f"/api/v1/budgets/{tenant.budget.pk}", None, "budget.deleted"),
        "target_create": (
            "post",
            "/api/v1/model-targets",
            {"alias": "big", "model": "openai/gpt-4o", "api_key": "sk-x"},
            "model_target.created",
        ),
        "target_update": (
            "patch",
            f"/api/v1/model-targets/{tenant.target.alias}",
            {"timeout_seconds": 12},
            "model_target.changed",
        ),
        "router_update": ("put", f"/api/v1/agents/{agent}/router", {"cache_enabled": True}, "router.changed"),
        "chain_set": (
            "put",
            f"/api/v1/agents/{agent}/chain",
            {"steps": [{"name": "one", "instructions": "Go."}]},
            "router.changed",
        ),
        "tool_create": ("post", f"/api/v1/agents/{agent}/tools", {"name": "refund"}, "tool.created"),
        "tool_update": (
            "patch",
            f"/api/v1/agents/{agent}/tools/{tenant.tool.name}",
            {"description": "x"},
            "tool.changed",
        ),
        "tool_delete": ("delete", f"/api/v1/agents/{agent}/tools/{tenant.tool.name}", None, "tool.deleted"),
        "alert_rule_create": ("post", "/api/v1/alert-rules", rule, "alert_rule.created"),
        "mirror_configure": (
            "put",
            "/api/v1/integrations/langfuse",
            {"host": "https://lf.example.com", "public_key": "pk", "secret_key": "sk"},
            "langfuse_mirror.changed",
        ),
        "mirror_delete": ("delete", "/api/v1/integrations/langfuse", None, "langfuse_mirror.deleted"),
        "price_set": (
            "put",
            "/api/v1/model-prices",
            {"model": "m", "input_usd_per_million": 1, "output_usd_per_million": 2},
            "model_price.changed",
        ),
        "price_delete": ("delete", "/api/v1/model-prices/acme-large", None, "model_price.deleted"),
        "export_create": (
            "post",
            f"/api/v1/curations/{tenant.curation.name}/exports",
            {"format": "art"},
            "export.created",
        ),
        "export_download": ("get", f"/api/v1/exports/{tenant.export.pk}/download", None, "export.downloaded"),
        "job_create": (
            "post",
            "/api/v1/training-jobs",
            {"export": tenant.export.pk, "method": "grpo", "base_model": "tiny"},
            "training_job.created",
        ),
    }


# In this order: deleting the agent (last) takes its prompts, tools and rules with it.
API_CASES = [
    "key_create", "key_revoke", "agent_create", "agent_update", "label_move", "label_delete",
    "prompt_delete", "policy_save", "approval_decide", "budget_create", "budget_delete", "target_create",
    "target_update", "router_update", "chain_set", "tool_create", "tool_update", "tool_delete",
    "alert_rule_create", "mirror_configure", "mirror_delete", "price_set", "price_delete", "export_create",
    "export_download", "job_create", "agent_delete",
]  # fmt: skip


def test_each_api_action_writes_one_event_by_the_key(tenant: Tenant) -> None:  # noqa: F811
    client, key = _key_client(tenant)
    cases = _api_cases(tenant)
    assert sorted(cases) == sorted(API_CASES)
    written = {}
    for name in API_CASES:
        method, path, body, _ = cases[name]
        before = _last_id()
        response = _send(client, method, path, body)
        assert response.status_code < 300, (name, response.content[:500])
        written[name] = [
            (event.action, event.actor_kind, event.actor_key_id, event.workspace_id, event.ip_address)
            for event in _events(before)
        ]

    expected = {name: [(cases[name][3], "api_key", key.pk, tenant.workspace.pk, "127.0.0.1")] for name in API_CASES}
    assert written == expected


def test_the_model_target_deleted_through_the_api_is_recorded(tenant: Tenant) -> None:  # noqa: F811
    client, key = _key_client(tenant)
    target = routing_services.model_target_create(workspace=tenant.workspace, alias="spare", model="openai/x")
    before = _last_id()

    response = client.delete("/api/v1/model-targets/spare")

    assert response.status_code == 204
    (event,) = _events(before)
    assert (event.action, event.actor_key_id, event.target_id, event.target_name) == (
        "model_target.deleted",
        key.pk,
        str(target.pk),
        "spare",
    )


# --- Failed actions ----------------------------------------------------------------------------------------


def test_an_action_that_fails_writes_no_event(tenant: Tenant) -> None:  # noqa: F811
    client, _ = _key_client(tenant)
    routing_services.model_target_create(
        workspace=tenant.workspace, alias="backup", model="openai/x", fallbacks=[tenant.target.alias]
    )
    revoked = registry_services.apikey_revoke(api_key=_read_key(tenant))
    budgets.budget_create(workspace=tenant.workspace, scope="end_user", end_user="u1", period="day", limit_tokens=5)
    tenant.approval.status = ApprovalStatus.REJECTED
    tenant.approval.decided_at = timezone.now()
    tenant.approval.save()
    failing = [
        ("post", "/api/v1/keys", {"name": "x", "scopes": ["root"]}, 422),
        ("delete", f"/api/v1/keys/{revoked.pk}", None, 200),  # already revoked: nothing happens
        ("post", "/api/v1/agents", {"slug": tenant.agent.slug, "name": "Taken"}, 409),
        ("post", "/api/v1/model-targets", {"alias": "bad", "model": "openai/x", "timeout_seconds": -1}, 422),
        ("delete", f"/api/v1/model-targets/{tenant.target.alias}", None, 409),  # a fallback of "backup"
        ("post", "/api/v1/budgets", {"scope": "end_user", "end_user": "u1", "period": "day", "limit_tokens": 9}, 409),
        ("post", f"/api/v1/approvals/{tenant.approval.pk}/decide", {"approved": True}, 409),
        ("put", f"/api/v1/prompts/{tenant.prompt.name}/labels/latest", {"version": 1}, 422),
        ("put", f"/api/v1/agents/{tenant.agent.slug}/guardrail-policy", {"checks": "all"}, 422),
    ]
    before = _last_id()

    statuses = [_send(client, method, path, body).status_code for method, path, body, _ in failing]

    assert statuses == [status for *_, status in failing]
    assert _events(before) == []


def test_an_event_written_before_the_action_fails_rolls_back_with_it(tenant: Tenant) -> None:  # noqa: F811
    # A target a chain step calls: the delete records its event, then the database refuses the delete.
    client, _ = _key_client(tenant)
    routing_services.model_target_create(workspace=tenant.workspace, alias="steps", model="openai/x")
    routing_services.chain_steps_set(
        agent=tenant.agent, steps=[{"name": "one", "instructions": "Go.", "model_target": "steps"}]
    )
    before = _last_id()

    response = client.delete("/api/v1/model-targets/steps")

    assert (response.status_code, response.json()["code"]) == (409, "model_target_in_use")
    assert ModelTarget.objects.filter(workspace=tenant.workspace, alias="steps").exists()
    assert _events(before) == []


# --- Reading the log ---------------------------------------------------------------------------------------


def test_keel_itself_is_the_actor_of_work_nobody_asked_for(tenant: Tenant) -> None:  # noqa: F811
    spec = json.dumps([{"alias": "env-fast", "model": "openai/gpt-4o-mini", "api_key": "sk-env"}])
    before = _last_id()

    routing_services.model_targets_sync_from_env(workspace=tenant.workspace, spec=spec)

    (event,) = _events(before)
    assert (event.action, event.actor_kind, event.actor_label, event.ip_address) == (
        "model_target.created",
        AuditActorKind.KEEL,
        "Keel",
        None,
    )
    assert "sk-env" not in json.dumps(event.details)


def test_an_owner_reads_the_log_and_another_workspace_sees_none_of_it(
    tenant: Tenant,  # noqa: F811
    other_workspace: Any,
) -> None:
    client, _ = _key_client(tenant)
    client.post("/api/v1/keys", data=json.dumps({"name": "ci", "scopes": ["read"]}), content_type="application/json")
    outsider_key, outsider_raw = registry_services.apikey_create(
        workspace=other_workspace, name="outsider", scopes=["read", "write"]
    )
    outsider = Client(headers={"Authorization": f"Bearer {outsider_raw}"})
    stranger = UserFactory.create(username="stranger")
    MembershipFactory.create(workspace=other_workspace, user=stranger, role="owner")
    stranger_client = Client()
    stranger_client.force_login(stranger)
    olga_client, _ = _owner(tenant)

    own = client.get("/api/v1/audit-events").json()
    theirs = outsider.get("/api/v1/audit-events").json()
    page = olga_client.get(f"/w/{tenant.workspace.slug}/audit-log/")
    foreign_page = stranger_client.get(f"/w/{tenant.workspace.slug}/audit-log/")
    own_page_of_stranger = stranger_client.get(f"/w/{other_workspace.slug}/audit-log/")

    ours = AuditEvent.objects.filter(workspace=tenant.workspace).count()
    assert ours > 1
    assert len(own["items"]) == min(ours, 50)
    assert own["items"][0]["action"] == "apikey.created"
    assert own["items"][0]["actor"]["key_prefix"] is not None
    # The outsider's own key creation is the one event of its workspace.
    assert [item["action"] for item in theirs["items"]] == ["apikey.created"]
    assert theirs["items"][0]["target"]["name"].startswith("outsider")
    assert outsider_key.pk == int(theirs["items"][0]["target"]["id"])
    assert page.status_code == 200
    assert b"apikey.created" in page.content
    assert foreign_page.status_code == 404
    assert own_page_of_stranger.status_code == 200
    assert tenant.workspace.name.encode() not in own_page_of_stranger.content.split(b"<main")[1]


def test_only_a_workspace_wide_write_key_reads_the_log_through_the_api(tenant: Tenant) -> None:  # noqa: F811
    reader, _ = _key_client(tenant, ("read",))
    _, limited_raw = registry_services.apikey_create(
        workspace=tenant.workspace, name="limited", scopes=["read", "write"], agents=[tenant.agent]
    )
    limited = Client(headers={"Authorization": f"Bearer {limited_raw}"})

    assert reader.get("/api/v1/audit-events").status_code == 403
    assert limited.get("/api/v1/audit-events").status_code == 403
    assert Client().get("/api/v1/audit-events").status_code == 401


def test_the_log_filters_by_action_actor_and_time_and_pages_with_a_cursor(tenant: Tenant) -> None:  # noqa: F811
    client, key = _key_client(tenant)
    for name in ("one", "two", "three"):
        client.post(
            "/api/v1/keys", data=json.dumps({"name": name, "scopes": ["read"]}), content_type="application/json"
        )
    client.put(
        f"/api/v1/prompts/{tenant.prompt.name}/labels/staging",
        data=json.dumps({"version": 1}),
        content_type="application/json",
    )

    first = client.get(f"/api/v1/audit-events?action=apikey.created&actor={key.prefix}&limit=2").json()
    second = client.get(
        f"/api/v1/audit-events?action=apikey.created&actor={key.prefix}&limit=2&cursor={first['next_cursor']}"
    ).json()
    by_prefix = client.get(f"/api/v1/audit-events?action=prompt.&actor={key.prefix}").json()
    future = client.get("/api/v1/audit-events", {"since": (timezone.now() + timedelta(hours=1)).isoformat()}).json()
    by_keel = client.get("/api/v1/audit-events?actor=keel").json()
    unknown = client.get("/api/v1/audit-events?action=apikey.exploded")
    bad_cursor = client.get("/api/v1/audit-events?cursor=nope")

    names = [item["target"]["name"].split(" (")[0] for item in first["items"] + second["items"]]
    assert names == ["three", "two", "one"]
    assert second["next_cursor"] is None
    assert [(item["action"], item["details"]["label"]) for item in by_prefix["items"]] == [
        ("prompt.label_moved", "staging")
    ]
    assert future["items"] == []
    assert {item["actor"]["kind"] for item in by_keel["items"]} == {"keel"}
    assert (unknown.status_code, unknown.json()["code"]) == (422, "audit_event_list_invalid")
    assert (bad_cursor.status_code, bad_cursor.json()["code"]) == (422, "audit_event_list_invalid")


def test_the_dashboard_page_filters_by_action_and_actor(tenant: Tenant) -> None:  # noqa: F811
    client, olga = _owner(tenant)
    registry_services.apikey_create(workspace=tenant.workspace, name="by-olga", scopes=["read"], created_by=olga)
    routing_services.model_target_create(workspace=tenant.workspace, alias="by-olga", model="m", created_by=olga)

    keys_only = client.get(f"/w/{tenant.workspace.slug}/audit-log/?action=apikey.&actor=olga").content.decode()
    targets_only = client.get(f"/w/{tenant.workspace.slug}/audit-log/?action=model_target.created&actor=olga")

    assert keys_only.count("data-audit-event=") == 1
    assert "by-olga" in keys_only
    assert targets_only.content.decode().count("data-audit-event=") == 1


# --- Pieces ------------------------------------------------------------------------------------------------


def test_details_never_keep_a_value_under_a_secret_name(workspace: Any) -> None:
    event = audit.record(
        workspace=workspace,
        action="model_target.changed",  # type: ignore[arg-type]
        details={"api_key": "sk-live", "nested": {"webhook_secret": "shh"}, "has_api_key": True, "fields": ["api_key"]},
    )

    assert event.details == {
        "api_key": "[redacted]",
        "nested": {"webhook_secret": "[redacted]"},
        "has_api_key": True,
        "fields": ["api_key"],
    }


def test_an_event_cannot_be_edited_but_its_actor_can_be_deleted(workspace: Any) -> None:
    from django.db import IntegrityError

    key, _ = registry_services.apikey_create(workspace=workspace, name="gone", scopes=["read"])
    event = AuditEvent.objects.get(workspace=workspace)
    event_of_key = audit.record(workspace=workspace, action="apikey.revoked", api_key=key)  # type: ignore[arg-type]

    with pytest.raises(IntegrityError), transaction.atomic():
        AuditEvent.objects.filter(pk=event.pk).update(action="apikey.revoked")
    key.delete()

    event_of_key.refresh_from_db()
    assert (event_of_key.actor_key_id, event_of_key.actor_label) == (None, f"API key gone ({key.prefix}…)")


@pytest.mark.parametrize(
    ("hops", "forwarded", "expected"),
    [
        (0, "203.0.113.9", "127.0.0.1"),  # no proxy: the header is the client's own word
        (1, "203.0.113.9", "203.0.113.9"),
        (1, "198.51.100.1, 203.0.113.9", "203.0.113.9"),  # the client wrote the first entry itself
        (2, "198.51.100.1, 203.0.113.9", "198.51.100.1"),
        (1, "not-an-address", None),
    ],
)
def test_the_client_address_behind_trusted_proxies(
    settings: Any, rf: Any, hops: int, forwarded: str, expected: Any
) -> None:
    settings.KEEL_TRUSTED_PROXY_HOPS = hops

    assert client_ip(rf.get("/", HTTP_X_FORWARDED_FOR=forwarded)) == expected


def test_the_actor_list_holds_the_people_and_keys_of_this_workspace_only(tenant: Tenant, other_workspace: Any) -> None:  # noqa: F811
    _, olga = _owner(tenant)
    registry_services.apikey_create(workspace=tenant.workspace, name="k", scopes=["read"], created_by=olga)
    outsider = UserFactory.create(username="outsider")
    registry_services.apikey_create(workspace=other_workspace, name="k", scopes=["read"], created_by=outsider)

    actors = selectors.audit_actor_list(workspace=tenant.workspace)

    assert "olga" in actors
    assert "outsider" not in actors
