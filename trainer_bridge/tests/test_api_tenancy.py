"""The trainer bridge API and tenancy: another workspace's key, with every scope, gets 404 on every path
that names a row and changes nothing; a key limited to some agents is refused; every path is covered."""

from __future__ import annotations

import json
from typing import Any
from unittest import mock

import pytest
from django.test import Client

from agent_registry import services as registry_services
from agent_registry.tests.factories import AgentFactory
from trainer_bridge import jobs, services
from trainer_bridge.models import Curation, Export, TrainingJob
from trainer_bridge.tests.test_exports import _curation

pytestmark = pytest.mark.django_db

NAMED = [
    ("GET", "/api/v1/curations/{name}", None),
    ("PATCH", "/api/v1/curations/{name}", {"description": "mine now"}),
    ("GET", "/api/v1/curations/{name}/preview", None),
    ("POST", "/api/v1/curations/{name}/exports", {"format": "art"}),
    ("GET", "/api/v1/exports/{export_id}", None),
    ("POST", "/api/v1/exports/{export_id}/cancel", None),
    ("GET", "/api/v1/exports/{export_id}/download", None),
    ("GET", "/api/v1/exports/{export_id}/manifest", None),
    ("GET", "/api/v1/training-jobs/{job_id}", None),
    ("POST", "/api/v1/training-jobs/{job_id}/cancel", None),
    ("POST", "/api/v1/training-jobs/{job_id}/heartbeat", None),
    ("POST", "/api/v1/training-jobs/{job_id}/metrics", {"step": 1, "metrics": {"loss": 1.0}}),
    ("POST", "/api/v1/training-jobs/{job_id}/adapter", {"location": "/elsewhere"}),
    ("GET", "/api/v1/training-jobs/{job_id}/adapter", None),
    ("POST", "/api/v1/training-jobs/{job_id}/finish", {"status": "failed"}),
    ("GET", "/api/v1/training-jobs/{job_id}/data/{split}", None),
    ("POST", "/api/v1/training-jobs", {"export": "{export_id}", "method": "grpo", "base_model": "tiny"}),
]
WORKSPACE_WIDE = [
    ("GET", "/api/v1/curations"),
    ("POST", "/api/v1/curations"),
    ("POST", "/api/v1/curations/preview"),
    ("GET", "/api/v1/exports"),
    ("GET", "/api/v1/training-jobs"),
    ("POST", "/api/v1/training-jobs/claim"),
]


def state() -> tuple[object, ...]:
    return (
        list(Curation.objects.values_list("pk", "description").order_by("pk")),
        list(Export.objects.values_list("pk", "status").order_by("pk")),
        list(TrainingJob.objects.values_list("pk", "status", "adapter_location").order_by("pk")),
    )


@pytest.fixture
def ours(gateway: Any, run: Any) -> dict[str, Any]:
    curation = _curation(gateway, run)
    export = services.export_create(curation=curation, format="art", dispatch=False)
    services.export_execute(export_id=export.pk)
    export.refresh_from_db()
    job = jobs.job_create(export=export, method="grpo", base_model="tiny")
    return {"name": curation.name, "export_id": export.pk, "job_id": job.pk}


@pytest.mark.parametrize(("method", "path", "body"), NAMED)
def test_another_workspaces_rows_are_404_and_unchanged(
    ours: dict[str, Any], api_client_for: Any, other_workspace: Any, method: str, path: str, body: Any
) -> None:
    intruder = api_client_for(other_workspace, scopes=("read", "write", "train"))
    before = state()
    url = path.replace("{name}", ours["name"]).replace("{export_id}", str(ours["export_id"]))
    url = url.replace("{job_id}", str(ours["job_id"])).replace("{split}", "train")
    data = json.dumps(body).replace('"{export_id}"', str(ours["export_id"])) if body is not None else ""
    with mock.patch("trainer_bridge.tasks.export_execute.delay"):
        response = intruder.generic(method, url, data=data, content_type="application/json")
    assert response.status_code == 404, (url, response.content)
    assert state() == before


def test_another_workspace_lists_none_of_ours_and_claims_nothing(
    ours: dict[str, Any], api_client_for: Any, other_workspace: Any
) -> None:
    intruder = api_client_for(other_workspace, scopes=("read", "write", "train"))
    for path in ("/api/v1/curations", "/api/v1/exports", "/api/v1/training-jobs"):
        assert intruder.get(path).json() == [], path
    claim = intruder.post("/api/v1/training-jobs/claim", data="{}", content_type="application/json")
    assert claim.status_code == 204


def test_a_key_limited_to_an_agent_cannot_use_the_trainer_bridge(ours: dict[str, Any], gateway: Any) -> None:
    agent = AgentFactory.create(workspace=gateway.workspace, slug="other-agent")
    _, raw = registry_services.apikey_create(
        workspace=gateway.workspace, name="limited", scopes=["read", "write", "train"], agents=[agent]
    )
    limited = Client(headers={"Authorization": f"Bearer {raw}"})
    assert limited.get("/api/v1/curations").status_code == 403
    assert limited.get(f"/api/v1/exports/{ours['export_id']}/download").status_code == 403


def test_the_tenancy_cases_cover_every_training_path_and_method(db: Any) -> None:
    document = Client().get("/api/v1/openapi.json").json()
    served = {
        (method.upper(), path)
        for path, operations in document["paths"].items()
        for method, operation in operations.items()
        if "training" in operation.get("tags", [])
    }
    covered = {(method, path) for method, path, _ in NAMED} | set(WORKSPACE_WIDE)
    assert served == covered
