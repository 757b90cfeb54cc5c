"""The datasets API: create, list, versions, uploads, items from trajectories, downloads; scopes, bad
input that changes nothing, and two workspaces on every endpoint."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agent_registry.tests.factories import AgentFactory
from evals import services
from evals.dataset_items import ItemData
from evals.models import Dataset, DatasetItem, DatasetVersion

pytestmark = pytest.mark.django_db

ITEM = {"task": "What is 2 + 2?", "reference_output": "4", "metadata": {"tags": {"language": "en"}}}


def post(client, path: str, body: Any) -> Any:
    return client.post(path, data=json.dumps(body), content_type="application/json")


def state() -> dict[str, object]:
    return {
        "datasets": list(Dataset.objects.values_list("pk", "name").order_by("pk")),
        "versions": list(DatasetVersion.objects.values_list("pk", "version", "item_count").order_by("pk")),
        "items": DatasetItem.objects.count(),
    }


@pytest.fixture
def client(api_client_for, workspace):
    return api_client_for(workspace, scopes=("read", "write"))


@pytest.fixture
def dataset(workspace):
    dataset = services.dataset_create(workspace=workspace, name="refunds")
    services.dataset_version_create_from_items(dataset=dataset, items=[ItemData(task="hello")], message="first")
    return dataset


@pytest.fixture
def intruder(api_client_for, other_workspace):
    """A key of another workspace with every scope, whose own dataset has another name."""
    services.dataset_create(workspace=other_workspace, name="theirs")
    return api_client_for(other_workspace, scopes=("read", "write"))


def test_create_list_and_get(client):
    created = post(client, "/api/v1/datasets", {"name": "refunds", "description": "refund questions"})

    assert created.status_code == 201
    assert created.json() | {"created_at": None} == {
        "name": "refunds",
        "description": "refund questions",
        "agent": None,
        "created_at": None,
        "latest_version": None,
        "item_count": 0,
    }
    assert [item["name"] for item in client.get("/api/v1/datasets").json()] == ["refunds"]
    assert client.get("/api/v1/datasets/refunds").json()["name"] == "refunds"


def test_a_duplicate_or_badly_named_dataset_is_refused_and_nothing_changes(client, dataset):
    before = state()

    duplicate = post(client, "/api/v1/datasets", {"name": "refunds"})
    bad_name = post(client, "/api/v1/datasets", {"name": "has spaces/slash"})

    assert (duplicate.status_code, duplicate.json()["code"]) == (409, "dataset_exists")
    assert (bad_name.status_code, bad_name.json()["code"]) == (422, "validation_error")
    assert state() == before


def test_posting_items_creates_the_next_version(client, dataset):
    response = post(client, "/api/v1/datasets/refunds/versions", {"message": "two", "items": [ITEM, ITEM]})

    assert response.status_code == 201
    assert response.json() | {"created_at": None} == {
        "version": 2,
        "message": "two",
        "item_count": 2,
        "created_at": None,
    }
    versions = client.get("/api/v1/datasets/refunds/versions").json()
    assert [(item["version"], item["item_count"]) for item in versions] == [(2, 2), (1, 1)]
    assert client.get("/api/v1/datasets/refunds").json()["latest_version"] == 2


def test_bad_items_name_the_item_and_field_and_create_no_version(client, dataset):
    before = state()

    response = post(client, "/api/v1/datasets/refunds/versions", {"items": [ITEM, {"task": "x", "metadata": 3}]})

    assert response.status_code == 422
    body = response.json()
    assert body["code"] == "dataset_items_invalid"
    assert body["errors"] == [{"line": 2, "field": "metadata", "message": "must be an object"}]
    assert state() == before


@pytest.mark.parametrize("file_format", ["jsonl", "csv"])
def test_upload_then_download_round_trips(client, dataset, file_format):
    uploaded = post(client, "/api/v1/datasets/refunds/versions", {"items": [ITEM, {"task": 'Say, "hi"\n'}]})
    assert uploaded.status_code == 201
    exported = client.get(f"/api/v1/datasets/refunds/versions/2/download?format={file_format}")
    assert exported.status_code == 200
    assert exported["Content-Disposition"] == f'attachment; filename="refunds-v2.{file_format}"'

    again = client.post(
        f"/api/v1/datasets/refunds/upload?format={file_format}&message=again",
        data=exported.content,
        content_type="text/plain",
    )

    assert again.status_code == 201
    assert (again.json()["version"], again.json()["message"], again.json()["item_count"]) == (3, "again", 2)
    assert client.get(f"/api/v1/datasets/refunds/versions/3/download?format={file_format}").content == exported.content


def test_a_malformed_upload_is_422_naming_line_and_field_and_imports_nothing(client, dataset):
    before = state()

    response = client.post(
        "/api/v1/datasets/refunds/upload?format=jsonl",
        data=b'{"task": "ok"}\n{"task": "ok", "expected_tool_calls": "lookup"}\n',
        content_type="application/x-ndjson",
    )

    assert response.status_code == 422
    assert response.json()["errors"] == [
        {"line": 2, "field": "expected_tool_calls", "message": "must be a list of {name, arguments}"}
    ]
    assert set(response.json()) == {"detail", "code", "errors"}
    assert state() == before


def test_an_unknown_format_is_refused(client, dataset):
    response = client.post("/api/v1/datasets/refunds/upload?format=xlsx", data=b"x", content_type="text/plain")

    assert response.status_code == 422
    assert response.json()["code"] == "validation_error"


def test_from_trajectories_keeps_the_trace_id(client, workspace, dataset, record_trajectory):
    trace_id = record_trajectory(workspace)

    response = post(client, "/api/v1/datasets/refunds/from-trajectories", {"trace_ids": [trace_id]})

    assert response.status_code == 201
    assert (response.json()["version"], response.json()["item_count"]) == (2, 2)
    lines = client.get("/api/v1/datasets/refunds/versions/2/download").content.decode().splitlines()
    assert json.loads(lines[1])["source_trace_id"] == trace_id


def test_a_trajectory_added_again_is_not_a_second_item(client, workspace, dataset, record_trajectory):
    first, second = record_trajectory(workspace), record_trajectory(workspace)
    path = "/api/v1/datasets/refunds/from-trajectories"
    assert post(client, path, {"trace_ids": [first]}).status_code == 201
    before = state()

    again = post(client, path, {"trace_ids": [first]})
    assert (again.status_code, again.json()["code"]) == (409, "dataset_trajectories_present")
    assert state() == before

    both = post(client, path, {"trace_ids": [first, second]})

    assert (both.status_code, both.json()["version"], both.json()["item_count"]) == (201, 3, 3)
    lines = client.get("/api/v1/datasets/refunds/versions/3/download").content.decode().splitlines()
    assert [json.loads(line).get("source_trace_id") for line in lines][1:] == [first, second]


def test_a_read_key_cannot_write(api_client_for, workspace, dataset):
    reader = api_client_for(workspace, scopes=("read",))
    before = state()

    response = post(reader, "/api/v1/datasets/refunds/versions", {"items": [ITEM]})

    assert response.status_code == 403
    assert state() == before


def test_a_key_limited_to_an_agent_sees_only_that_agents_datasets(api_client_for, workspace, dataset):
    agent = AgentFactory.create(workspace=workspace, slug="ride-support")
    limited = api_client_for(workspace, scopes=("read", "write"), agents=[agent])
    before = state()

    workspace_wide = post(limited, "/api/v1/datasets", {"name": "wide"})
    assert workspace_wide.status_code == 403
    assert state() == before
    assert limited.get("/api/v1/datasets/refunds").status_code == 404

    created = post(limited, "/api/v1/datasets", {"name": "ride", "agent": "ride-support"})
    assert (created.status_code, created.json()["agent"]) == (201, "ride-support")
    assert [item["name"] for item in limited.get("/api/v1/datasets").json()] == ["ride"]


# --- Tenancy: another workspace's key, with every scope, on every endpoint -----------------------------

NAMED = [
    ("GET", "/api/v1/datasets/{name}", None),
    ("GET", "/api/v1/datasets/{name}/versions", None),
    ("POST", "/api/v1/datasets/{name}/versions", {"items": [ITEM]}),
    ("POST", "/api/v1/datasets/{name}/upload?format=jsonl", b'{"task": "mine now"}\n'),
    ("POST", "/api/v1/datasets/{name}/from-trajectories", {"trace_ids": ["5b8efff798038103d269b633813fc60c"]}),
    ("GET", "/api/v1/datasets/{name}/versions/{version}/download", None),
    ("GET", "/api/v1/datasets/{name}/versions/{version}/items", None),
]
WORKSPACE_WIDE = [
    ("GET", "/api/v1/datasets"),  # test_another_workspace_lists_only_its_own_datasets
    ("POST", "/api/v1/datasets"),  # test_another_workspace_creates_its_own_dataset_of_the_same_name
]


@pytest.mark.parametrize(("method", "path", "body"), NAMED)
def test_another_workspaces_dataset_is_404_and_unchanged(dataset, intruder, method, path, body):
    before = state()
    url = path.replace("{name}", "refunds").replace("{version}", "1")

    if method == "GET":
        response = intruder.get(url)
    elif isinstance(body, bytes):
        response = intruder.post(url, data=body, content_type="application/x-ndjson")
    else:
        response = post(intruder, url, body)

    assert response.status_code == 404
    assert response.json()["code"] == "dataset_not_found"
    assert state() == before


def test_another_workspace_lists_only_its_own_datasets(dataset, intruder):
    assert [item["name"] for item in intruder.get("/api/v1/datasets").json()] == ["theirs"]


def test_another_workspace_creates_its_own_dataset_of_the_same_name(dataset, intruder, workspace):
    response = post(intruder, "/api/v1/datasets", {"name": "refunds"})

    assert response.status_code == 201
    assert Dataset.objects.get(workspace=workspace, name="refunds").pk == dataset.pk
    assert Dataset.objects.filter(name="refunds").count() == 2


def test_a_trajectory_of_another_workspace_cannot_be_added(client, dataset, other_workspace, record_trajectory):
    trace_id = record_trajectory(other_workspace)
    before = state()

    response = post(client, "/api/v1/datasets/refunds/from-trajectories", {"trace_ids": [trace_id]})

    assert response.status_code == 404
    assert state() == before


def test_the_tenancy_cases_cover_every_evals_path_and_method(db):
    from django.test import Client

    document = Client().get("/api/v1/openapi.json").json()
    served = {
        (method.upper(), path)
        for path, operations in document["paths"].items()
        for method, operation in operations.items()
        if "evals" in operation.get("tags", [])
    }
    covered = {(method, path.split("?")[0]) for method, path, _ in NAMED} | set(WORKSPACE_WIDE)

    assert served == covered
