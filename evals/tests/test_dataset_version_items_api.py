"""GET /datasets/{name}/versions/{version}/items: a version's items as JSON, a page at a time (a cursor, and a
Link header as the other lists give), each as stored; an unknown version is 404, bad page parameters 422."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from agent_registry.models import Workspace
from evals import services
from evals.dataset_items import ItemData, input_key
from evals.models import Dataset

pytestmark = pytest.mark.django_db

URL = "/api/v1/datasets/faq/versions/{version}/items"


@pytest.fixture
def dataset(workspace: Workspace) -> Dataset:
    """v1: five items; v2: one."""
    dataset = services.dataset_create(workspace=workspace, name="faq")
    services.dataset_version_create_from_items(
        dataset=dataset,
        items=[
            ItemData(
                key="receipt",
                input_messages=({"role": "user", "content": "Where is my receipt?"},),
                reference_output="In your inbox.",
                expected_tool_calls=({"name": "find_receipt", "arguments": {"trip": "T-1"}},),
                metadata={"tags": {"language": "en"}, "variables": {"company": "Acme"}},
            ),
            *[ItemData(task=f"task {n}") for n in range(1, 5)],
        ],
    )
    services.dataset_version_create_from_items(dataset=dataset, items=[ItemData(task="only in v2")])
    return dataset


@pytest.fixture
def client(api_client_for: Any, workspace: Workspace) -> Client:
    client: Client = api_client_for(workspace, scopes=("read",))
    return client


def test_a_version_is_read_a_page_at_a_time_to_its_end(client: Client, dataset: Dataset) -> None:
    pages, url = [], URL.format(version=1) + "?limit=2"
    while True:
        response = client.get(url)
        assert response.status_code == 200, response.content
        body = response.json()
        pages.append([item["position"] for item in body["items"]])
        if body["next_cursor"] is None:
            assert "Link" not in response.headers
            break
        assert response.headers["X-Next-Cursor"] == body["next_cursor"]
        link = response.headers["Link"]
        assert link == f'<{URL.format(version=1)}?limit=2&cursor={body["next_cursor"]}>; rel="next"'
        url = link[1 : link.index(">")]

    assert pages == [[0, 1], [2, 3], [4]]


def test_each_item_is_returned_as_the_version_holds_it(client: Client, dataset: Dataset) -> None:
    body = client.get(URL.format(version=1) + "?limit=2").json()

    assert body["items"] == [
        {
            "key": "receipt",
            "position": 0,
            "task": "",
            "input_messages": [{"role": "user", "content": "Where is my receipt?"}],
            "reference_output": "In your inbox.",
            "expected_tool_calls": [{"name": "find_receipt", "arguments": {"trip": "T-1"}}],
            "expected_state": None,
            "metadata": {"tags": {"language": "en"}, "variables": {"company": "Acme"}},
            "source_trace_id": "",
        },
        {
            "key": input_key("task 1", ()),
            "position": 1,
            "task": "task 1",
            "input_messages": [],
            "reference_output": "",
            "expected_tool_calls": None,
            "expected_state": None,
            "metadata": {},
            "source_trace_id": "",
        },
    ]


def test_the_version_asked_for_is_read_not_the_latest(client: Client, dataset: Dataset) -> None:
    body = client.get(URL.format(version=2)).json()

    assert [(item["position"], item["task"]) for item in body["items"]] == [(0, "only in v2")]
    assert body["next_cursor"] is None
    assert len(client.get(URL.format(version=1)).json()["items"]) == 5  # 50 by default


@pytest.mark.parametrize(
    ("path", "code"),
    [
        ("/api/v1/datasets/faq/versions/3/items", "dataset_version_not_found"),
        ("/api/v1/datasets/faq/versions/0/items", "dataset_version_not_found"),
        ("/api/v1/datasets/nope/versions/1/items", "dataset_not_found"),
    ],
)
def test_a_version_that_does_not_exist_is_404(client: Client, dataset: Dataset, path: str, code: str) -> None:
    response = client.get(path)

    assert response.status_code == 404
    assert response.json()["code"] == code
    assert response.json()["detail"]


NOT_OURS = base64.urlsafe_b64encode(b"before:3").decode().rstrip("=")
TOO_FAR = base64.urlsafe_b64encode(b"after:99999999999").decode().rstrip("=")


@pytest.mark.parametrize(
    ("query", "code"),
    [
        ("limit=0", "validation_error"),
        ("limit=501", "validation_error"),
        ("limit=ten", "validation_error"),
        ("cursor=not-a-cursor", "invalid_query"),
        (f"cursor={NOT_OURS}", "invalid_query"),
        (f"cursor={TOO_FAR}", "invalid_query"),
    ],
)
def test_bad_page_parameters_are_422(client: Client, dataset: Dataset, query: str, code: str) -> None:
    response = client.get(URL.format(version=1) + "?" + query)

    assert response.status_code == 422
    assert response.json()["code"] == code
    assert response.json()["detail"]


def test_a_page_costs_the_same_queries_whatever_its_size(client: Client, dataset: Dataset) -> None:
    client.get(URL.format(version=1))  # the key's first use records it (a write the requests after it skip)
    with CaptureQueriesContext(connection) as small:
        client.get(URL.format(version=1) + "?limit=1")
    with CaptureQueriesContext(connection) as large:
        client.get(URL.format(version=1) + "?limit=500")

    assert len(small.captured_queries) == len(large.captured_queries)
