"""Item keys: an item's identity across dataset versions. Given in the item, or its input's hash;
written in downloads so that a downloaded, edited and uploaded file keeps its items' identities."""

from __future__ import annotations

import json
from typing import Any

import pytest

from evals import dataset_items, services
from evals.dataset_items import ItemData
from evals.models import DatasetItem, DatasetVersion

pytestmark = pytest.mark.django_db


def post(client: Any, path: str, body: Any) -> Any:
    return client.post(path, data=json.dumps(body), content_type="application/json")


@pytest.fixture
def client(api_client_for: Any, workspace: Any) -> Any:
    return api_client_for(workspace, scopes=("read", "write"))


@pytest.fixture
def dataset(workspace: Any) -> Any:
    return services.dataset_create(workspace=workspace, name="keys")


def test_an_item_without_a_key_gets_its_inputs_hash_and_keeps_it_in_the_next_version(dataset: Any) -> None:
    first = services.dataset_version_create_from_items(
        dataset=dataset, items=[ItemData(task="a", reference_output="1"), ItemData(task="b")]
    )
    second = services.dataset_version_create_from_items(
        dataset=dataset, items=[ItemData(task="c"), ItemData(task="b"), ItemData(task="a", reference_output="2")]
    )

    keys_1 = dict(DatasetItem.objects.filter(version=first).values_list("task", "key"))
    keys_2 = dict(DatasetItem.objects.filter(version=second).values_list("task", "key"))
    assert keys_1["a"] == keys_2["a"] == dataset_items.input_key("a", ())
    assert keys_1["b"] == keys_2["b"]
    assert len({keys_2["a"], keys_2["b"], keys_2["c"]}) == 3


def test_the_same_input_twice_is_two_items_with_two_keys(dataset: Any) -> None:
    version = services.dataset_version_create_from_items(
        dataset=dataset, items=[ItemData(task="same"), ItemData(task="same", metadata={"tags": {"g": "x"}})]
    )

    base = dataset_items.input_key("same", ())
    assert list(DatasetItem.objects.filter(version=version).order_by("position").values_list("key", flat=True)) == [
        base,
        f"{base}#2",
    ]


def test_a_given_key_is_kept_and_downloaded_so_a_round_trip_keeps_it(client: Any, dataset: Any) -> None:
    created = post(
        client,
        "/api/v1/datasets/keys/versions",
        {"items": [{"key": "q-17", "task": "Where is my receipt?"}, {"key": 18, "task": "Refund me"}]},
    )
    assert created.status_code == 201, created.content

    for file_format in ("jsonl", "csv"):
        body = client.get(f"/api/v1/datasets/keys/versions/1/download?format={file_format}").content
        items = dataset_items.items_from_file(body, file_format=file_format)
        assert [item.key for item in items] == ["q-17", "18"]


@pytest.mark.parametrize(
    ("file_format", "content", "line"),
    [
        ("jsonl", b'{"key": "a", "task": "x"}\n{"key": "b", "task": "y"}\n{"key": "a", "task": "z"}\n', 3),
        ("csv", b"key,task\r\na,x\r\nb,y\r\na,z\r\n", 4),
    ],
)
def test_a_key_given_twice_is_422_naming_the_line_and_imports_nothing(
    client: Any, dataset: Any, file_format: str, content: bytes, line: int
) -> None:
    response = client.post(
        f"/api/v1/datasets/keys/upload?format={file_format}", data=content, content_type="application/octet-stream"
    )

    assert response.status_code == 422
    assert response.json()["code"] == "dataset_items_invalid"
    problem = {"line": line, "field": "key", "message": f"repeats the key of line {line - 2}"}
    assert response.json()["errors"] == [problem]
    assert not DatasetVersion.objects.filter(dataset=dataset).exists()


@pytest.mark.parametrize("key", ["   ", "k" * 201, True, ["a"]])
def test_a_bad_key_is_422_naming_the_item(client: Any, dataset: Any, key: object) -> None:
    response = post(client, "/api/v1/datasets/keys/versions", {"items": [{"key": key, "task": "x"}]})

    assert response.status_code == 422
    assert [(error["line"], error["field"]) for error in response.json()["errors"]] == [(1, "key")]
    assert not DatasetVersion.objects.filter(dataset=dataset).exists()


def test_items_from_trajectories_keep_the_earlier_items_keys(
    client: Any, workspace: Any, dataset: Any, record_trajectory: Any
) -> None:
    assert post(client, "/api/v1/datasets/keys/versions", {"items": [{"key": "kept", "task": "x"}]}).status_code == 201
    trace_id = record_trajectory(workspace)

    added = post(client, "/api/v1/datasets/keys/from-trajectories", {"trace_ids": [trace_id]})

    assert added.status_code == 201, added.content
    version = DatasetVersion.objects.get(dataset=dataset, version=2)
    keys = list(version.items.order_by("position").values_list("key", "source_trace_id"))
    assert keys[0] == ("kept", "")
    assert keys[1][1] == trace_id
    assert keys[1][0].startswith("input:")
