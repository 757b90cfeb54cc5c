"""Tenancy through tracing's API: every path of tracing/api.py, triage_api.py, alerts_api.py and
langfuse_api.py, called with workspace B's key.

A path that names one of workspace A's objects (a trajectory, session, replay, review sample or item, alert
rule, alert, or agent) answers 404, the same as for a name that does not exist, and changes nothing in
either workspace. A path that names nothing answers for B alone: A's objects are absent from the answer and
A's rows are unchanged. The cases are pinned to the OpenAPI document, so a new endpoint needs a case here."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client

from agent_registry.models import Workspace
from agent_registry.tests.factories import AgentFactory
from tracing import langfuse_bridge, replay, services, triage
from tracing.models import (
    Alert,
    AlertRule,
    LangfuseExport,
    LangfuseMirror,
    ModelPriceOverride,
    Replay,
    ReviewItem,
    ReviewSample,
    Score,
    Span,
    Trajectory,
    TriageSettings,
)
from tracing.tests.factories import AlertFactory, AlertRuleFactory
from tracing.tests.replay_fakes import refund_document, refund_recorded

pytestmark = pytest.mark.django_db

# The routers under test, by their OpenAPI tags (routing's paths have their own tenancy tests).
TAGS = {"tracing", "triage", "alerts", "langfuse mirror"}


@dataclass(frozen=True)
class Objects:
    """Workspace A's objects, as the path placeholders of the cases name them."""

    trace_id: str
    session_id: str
    replay_id: int
    sample_id: int
    item_id: int
    rule_id: int
    alert_id: int
    slug: str
    model: str  # of a price of its own

    def fill(self, text: str) -> str:
        for name, value in vars(self).items():
            text = text.replace("{" + name + "}", str(value))
        return text


def _tenant(workspace: Workspace, prefix: str) -> Objects:
    recorded = refund_recorded(workspace, session_id=f"{prefix}-session")
    trajectory = recorded.trajectory
    services.score_create(trajectory=trajectory, name="resolved", data_type="numeric", value=1)
    pending = replay.replay_create(original=trajectory, from_step=3)
    sample = triage.review_sample_create(
        workspace=workspace,
        strategy="random",
        window_start=trajectory.started_at - timedelta(hours=1),
        window_end=trajectory.started_at + timedelta(hours=1),
        budget=5,
    )
    # An agent of this workspace's own, so that its slug names nothing in the other.
    agent = AgentFactory.create(workspace=workspace, slug=f"{prefix}-only", name=f"{prefix} only")
    rule = AlertRuleFactory.create(agent=agent, name=f"{prefix} loop rate")
    alert = AlertFactory.create(rule=rule)
    triage.triage_settings_update(agent=agent, language="en", review_budget_per_day=3, review_strategies=["random"])
    services.model_price_set(
        workspace=workspace,
        model=f"{prefix}-large",
        input_usd_per_million=Decimal("2.5"),
        output_usd_per_million=Decimal("10"),
    )
    return Objects(
        trace_id=trajectory.trace_id,
        session_id=f"{prefix}-session",
        replay_id=pending.pk,
        sample_id=sample.pk,
        item_id=ReviewItem.objects.filter(sample=sample).values_list("pk", flat=True).get(),
        rule_id=rule.pk,
        alert_id=alert.pk,
        slug=agent.slug,
        model=f"{prefix}-large",
    )


@pytest.fixture
def acme(workspace) -> Objects:
    objects = _tenant(workspace, "acme")
    # Only A mirrors to Langfuse.
    langfuse_bridge.langfuse_mirror_configure(
        workspace=workspace, host="https://langfuse.acme.example", public_key="pk-lf-acme", secret_key="sk-lf-acme"
    )
    return objects


@pytest.fixture
def globex(other_workspace) -> Objects:
    return _tenant(other_workspace, "globex")


@pytest.fixture
def globex_client(other_workspace, api_client_for) -> Client:
    client: Client = api_client_for(other_workspace, scopes=["read", "write", "ingest"])
    return client


def tracing_state(workspace: Workspace | None = None) -> dict[str, list[Any]]:
    """Every row these endpoints could change, of one workspace or of all."""

    def rows(model: Any, *fields: str, path: str = "workspace") -> list[Any]:
        found = model.objects.all() if workspace is None else model.objects.filter(**{path: workspace})
        return list(found.order_by("pk").values_list("pk", *fields))

    return {
        "trajectories": rows(Trajectory, "trace_id", "status", "agent_id", "signal_names"),
        "spans": rows(Span, "span_id"),
        "scores": rows(Score, "name", "value", "string_value", path="trajectory__workspace"),
        "replays": rows(Replay, "status", "prompt_version_id"),
        "review_samples": rows(ReviewSample, "strategy", "agent_id"),
        "review_items": rows(ReviewItem, "status", "informative", "failure_mode", "note", path="sample__workspace"),
        "alert_rules": rows(AlertRule, "name", "threshold", "enabled", "window_minutes"),
        "alerts": rows(Alert, "acknowledged_at"),
        "triage_settings": rows(
            TriageSettings, "language", "weights", "review_budget_per_day", path="agent__workspace"
        ),
        "langfuse_mirrors": rows(LangfuseMirror, "host", "public_key", "secret_key_encrypted", "enabled"),
        "langfuse_exports": rows(LangfuseExport, "status", "attempts"),
        "model_prices": rows(ModelPriceOverride, "model", "input_usd_per_million", "output_usd_per_million"),
    }


RULE = {
    "name": "Failure rate",
    "signal": "error_status",
    "threshold": 0.05,
    "window_minutes": 60,
    "min_trajectories": 10,
    "severity": "page",
    "cooldown_minutes": 30,
}

# (method, path, body, code): each names one of A's objects; B's key gets 404 with `code`.
NAMED = [
    ("GET", "/api/v1/trajectories?agent={slug}", None, "agent_not_found"),
    ("GET", "/api/v1/trajectories/{trace_id}", None, "trajectory_not_found"),
    ("GET", "/api/v1/trajectories/{trace_id}/scores", None, "trajectory_not_found"),
    ("POST", "/api/v1/trajectories/{trace_id}/scores", {"name": "planted", "value": 0}, "trajectory_not_found"),
    ("GET", "/api/v1/trajectories/{trace_id}/replays", None, "trajectory_not_found"),
    ("POST", "/api/v1/trajectories/{trace_id}/replays", {"from_step": 3}, "trajectory_not_found"),
    ("GET", "/api/v1/trajectories/{trace_id}/otlp", None, "trajectory_not_found"),
    ("GET", "/api/v1/sessions/{session_id}", None, "session_not_found"),
    ("GET", "/api/v1/replays/{replay_id}", None, "replay_not_found"),
    ("GET", "/api/v1/replays/{replay_id}/diff", None, "replay_not_found"),
    ("GET", "/api/v1/agents/{slug}/triage-settings", None, "agent_not_found"),
    ("PUT", "/api/v1/agents/{slug}/triage-settings", {"language": "de"}, "agent_not_found"),
    ("POST", "/api/v1/review/samples", {"strategy": "random", "agent": "{slug}"}, "agent_not_found"),
    ("GET", "/api/v1/review/samples/{sample_id}", None, "review_sample_not_found"),
    ("PUT", "/api/v1/review/items/{item_id}", {"status": "reviewed", "informative": True}, "review_item_not_found"),
    ("GET", "/api/v1/review/informativeness?agent={slug}", None, "agent_not_found"),
    ("GET", "/api/v1/alert-rules?agent={slug}", None, "agent_not_found"),
    ("POST", "/api/v1/alert-rules", {**RULE, "agent": "{slug}"}, "agent_not_found"),
    ("GET", "/api/v1/alert-rules/{rule_id}", None, "alert_rule_not_found"),
    ("PUT", "/api/v1/alert-rules/{rule_id}", RULE, "alert_rule_not_found"),
    ("DELETE", "/api/v1/alert-rules/{rule_id}", None, "alert_rule_not_found"),
    ("GET", "/api/v1/alerts?agent={slug}", None, "agent_not_found"),
    ("GET", "/api/v1/alerts/{alert_id}", None, "alert_not_found"),
    ("POST", "/api/v1/alerts/{alert_id}/acknowledge", None, "alert_not_found"),
    ("DELETE", "/api/v1/model-prices/{model}", None, "model_price_not_found"),
]

# (method, path, body, status): each names nothing; B's key answers for B alone.
WORKSPACE_WIDE = [
    ("POST", "/api/v1/ingest/trajectories", refund_document(session_id="globex-new"), 202),
    ("GET", "/api/v1/trajectories", None, 200),
    ("GET", "/api/v1/sessions", None, 200),
    ("GET", "/api/v1/model-prices", None, 200),
    (
        "PUT",
        "/api/v1/model-prices",
        {"model": "acme-large", "input_usd_per_million": "1", "output_usd_per_million": "1"},
        200,
    ),
    ("GET", "/api/v1/review/samples", None, 200),
    ("POST", "/api/v1/review/samples", {"strategy": "random", "hours": 2160}, 201),
    ("GET", "/api/v1/review/failure-modes", None, 200),
    ("GET", "/api/v1/review/informativeness", None, 200),
    ("GET", "/api/v1/alert-rules", None, 200),
    ("POST", "/api/v1/alert-rules", {**RULE, "agent": "globex-only"}, 201),
    ("GET", "/api/v1/alerts", None, 200),
    # B mirrors nowhere: it reads no mirror (not A's), and changes only its own.
    ("GET", "/api/v1/integrations/langfuse", None, 404),
    (
        "PUT",
        "/api/v1/integrations/langfuse",
        {"host": "https://langfuse.globex.example", "public_key": "pk-lf-globex", "secret_key": "sk-lf-globex"},
        200,
    ),
    ("POST", "/api/v1/integrations/langfuse/retry", None, 404),
    ("DELETE", "/api/v1/integrations/langfuse", None, 204),
]


def _ids(cases: list[tuple[str, str, Any, Any]]) -> list[str]:
    return [f"{method} {path}" for method, path, _, _ in cases]


def call(client: Client, method: str, path: str, body: Any, objects: Objects) -> Any:
    data = objects.fill(json.dumps(body)) if body is not None else ""
    return client.generic(method, objects.fill(path), data=data, content_type="application/json")


@pytest.mark.parametrize(("method", "path", "body", "code"), NAMED, ids=_ids(NAMED))
def test_another_workspaces_object_is_404_and_nothing_changes(acme, globex, globex_client, method, path, body, code):
    before = tracing_state()

    response = call(globex_client, method, path, body, acme)

    assert response.status_code == 404
    assert response.json()["code"] == code
    assert tracing_state() == before


@pytest.mark.parametrize(("method", "path", "body", "code"), NAMED, ids=_ids(NAMED))
def test_the_same_call_on_ones_own_object_is_not_404(globex, globex_client, method, path, body, code):
    """The other half of the test above: the 404 comes from the workspace, not from a malformed call. (A
    pending replay has no diff yet: 409.)"""
    response = call(globex_client, method, path, body, globex)

    assert response.status_code in (200, 201, 202, 204, 409), response.content[:500]


@pytest.mark.parametrize(("method", "path", "body", "status"), WORKSPACE_WIDE, ids=_ids(WORKSPACE_WIDE))
def test_a_workspace_wide_call_answers_for_ones_own_workspace_alone(
    workspace, acme, globex, globex_client, method, path, body, status
):
    before = tracing_state(workspace)

    response = call(globex_client, method, path, body, globex)

    assert response.status_code == status, response.content[:500]
    content = response.content.decode()
    for mark in (acme.trace_id, acme.session_id, acme.slug, "acme loop rate", "langfuse.acme.example"):
        assert mark not in content
    assert tracing_state(workspace) == before


def test_a_price_set_by_another_workspace_leaves_ones_own(workspace, acme, globex, globex_client):
    globex_client.put(
        "/api/v1/model-prices",
        {"model": "acme-large", "input_usd_per_million": "1", "output_usd_per_million": "1"},
        content_type="application/json",
    )

    prices = ModelPriceOverride.objects.filter(model="acme-large").order_by("workspace__slug")
    assert [(price.workspace.slug, price.input_usd_per_million) for price in prices] == [
        ("acme", Decimal("2.5")),
        ("globex", Decimal("1")),
    ]


def test_the_cases_cover_every_path_and_method_of_these_routers(db):
    document = Client().get("/api/v1/openapi.json").json()
    served = {
        (method.upper(), path)
        for path, operations in document["paths"].items()
        for method, operation in operations.items()
        if TAGS & set(operation.get("tags", []))
    }
    covered = {(method, path.split("?")[0]) for method, path, _, _ in [*NAMED, *WORKSPACE_WIDE]}

    assert served == covered
