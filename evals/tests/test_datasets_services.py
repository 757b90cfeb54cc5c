"""Dataset services: numbered immutable versions, uploads that name the bad line and field and import
nothing, JSONL and CSV round trips, and items made from stored trajectories."""

from __future__ import annotations

import json

import pytest

from evals import dataset_items, exceptions, selectors, services
from evals.dataset_items import ItemData
from evals.models import Dataset, DatasetItem, DatasetVersion
from tracing.exceptions import TrajectoryNotFound

pytestmark = pytest.mark.django_db

ITEMS = [
    ItemData(
        input_messages=({"role": "system", "content": "Be brief."}, {"role": "user", "content": "Refund T-1, ñ ☃"}),
        reference_output="Refunded.",
        expected_tool_calls=({"name": "refund", "arguments": {"trip_id": "T-1", "amount": 12.5}},),
        expected_state={"refunds": ["T-1"]},
        metadata={"tags": {"language": "es", "tier": "gold"}, "note": 'quotes " and, commas\nnewline'},
    ),
    ItemData(task="What is 2 + 2?", reference_output="4", metadata={"tags": {"language": "en"}}),
    ItemData(task="Say hi", source_trace_id="5b8efff798038103d269b633813fc60c"),
]


@pytest.fixture
def dataset(workspace):
    return services.dataset_create(workspace=workspace, name="refunds", description="refund questions")


def state() -> dict[str, object]:
    return {
        "datasets": list(Dataset.objects.values_list("pk", "name").order_by("pk")),
        "versions": list(DatasetVersion.objects.values_list("pk", "version", "item_count").order_by("pk")),
        "items": DatasetItem.objects.count(),
    }


def test_versions_are_numbered_from_one_and_each_keeps_its_own_items(dataset):
    first = services.dataset_version_create_from_items(dataset=dataset, items=ITEMS[:1], message="one")
    second = services.dataset_version_create_from_items(dataset=dataset, items=ITEMS, message="all")

    assert (first.version, first.item_count) == (1, 1)
    assert (second.version, second.item_count) == (2, 3)
    # Stored as given, each with its key (none given: its input's hash).
    assert selectors.dataset_version_items(version=first) == dataset_items.items_keyed(ITEMS[:1])
    assert selectors.dataset_version_items(version=second) == dataset_items.items_keyed(ITEMS)
    assert [version.version for version in selectors.dataset_version_list(dataset=dataset)] == [2, 1]


def test_a_dataset_name_is_unique_per_workspace_only(workspace, other_workspace, dataset):
    before = state()

    with pytest.raises(exceptions.DatasetExists):
        services.dataset_create(workspace=workspace, name="refunds")
    assert state() == before

    services.dataset_create(workspace=other_workspace, name="refunds")
    assert Dataset.objects.filter(name="refunds").count() == 2


def test_another_workspaces_dataset_is_not_found(other_workspace, dataset):
    with pytest.raises(exceptions.DatasetNotFound):
        selectors.dataset_get(workspace=other_workspace, name="refunds")


@pytest.mark.parametrize("file_format", ["jsonl", "csv"])
def test_a_download_uploads_back_to_the_same_items(dataset, file_format):
    version = services.dataset_version_create_from_items(dataset=dataset, items=ITEMS)

    text = selectors.dataset_version_export(version=version, file_format=file_format)
    parsed = services.dataset_items_from_upload(content=text.encode(), file_format=file_format)

    # The file carries each item's key, so the items uploaded back are the same items.
    assert parsed == dataset_items.items_keyed(ITEMS)


def test_csv_holds_structured_fields_as_json_cells(dataset):
    version = services.dataset_version_create_from_items(dataset=dataset, items=ITEMS[1:2])

    text = selectors.dataset_version_export(version=version, file_format="csv")

    assert text.splitlines() == [
        ",".join(dataset_items.FIELDS),
        dataset_items.input_key("What is 2 + 2?", ()) + ',What is 2 + 2?,,4,,,"{""tags"": {""language"": ""en""}}",',
    ]


@pytest.mark.parametrize(
    ("file_format", "content", "line", "field"),
    [
        ("jsonl", b'{"task": "ok"}\n{"task": "also ok", "reference_output": 4}\n', 2, "reference_output"),
        ("jsonl", b'{"task": "ok"}\n\n{"task": \n', 3, "item"),
        ("jsonl", b'{"task": "ok", "expected_tool_calls": [{"arguments": {}}]}\n', 1, "expected_tool_calls[0].name"),
        ("jsonl", b'{"input_messages": [{"role": "robot", "content": "x"}]}\n', 1, "input_messages[0].role"),
        ("jsonl", b'{"task": "ok", "colour": "red"}\n', 1, "colour"),
        ("jsonl", b'{"reference_output": "no input"}\n', 1, "input_messages"),
        ("csv", b"task,metadata\nfine,\nbroken,{not json\n", 3, "metadata"),
        ("csv", b'task,metadata\nfine,"{""tags"": [1]}"\n', 2, "metadata.tags"),
        ("csv", b"task,answer\nfine,4\n", 1, "answer"),
        ("csv", b"task\n\xff\xfe\n", 2, "file"),
    ],
)
def test_a_malformed_upload_names_the_line_and_field_and_imports_nothing(dataset, file_format, content, line, field):
    services.dataset_version_create_from_items(dataset=dataset, items=ITEMS)
    before = state()

    with pytest.raises(exceptions.DatasetItemsInvalid) as raised:
        services.dataset_items_from_upload(content=content, file_format=file_format)

    assert raised.value.extra["errors"][0]["line"] == line
    assert raised.value.extra["errors"][0]["field"] == field
    assert state() == before


def test_an_upload_reports_every_bad_line(dataset):
    content = b'{"task": 1}\n{"task": "fine"}\n{"task": "x", "metadata": []}\n'

    with pytest.raises(exceptions.DatasetItemsInvalid) as raised:
        services.dataset_items_from_upload(content=content, file_format="jsonl")

    assert raised.value.extra["errors"] == [
        {"line": 1, "field": "task", "message": "must be text"},
        {"line": 1, "field": "input_messages", "message": "an item needs input messages or a task"},
        {"line": 3, "field": "metadata", "message": "must be an object"},
    ]


def test_an_item_from_a_trajectory_keeps_its_trace_id(workspace, record_trajectory):
    trace_id = record_trajectory(workspace)
    from tracing.selectors import trajectory_get

    item = services.dataset_item_from_trajectory(trajectory=trajectory_get(workspace=workspace, trace_id=trace_id))

    assert item.source_trace_id == trace_id
    assert [message["role"] for message in item.input_messages] == ["user"]
    assert json.dumps(item.input_messages[0]).count("I was charged twice for a cancelled ride") == 1
    assert item.reference_output == "I have refunded the duplicate charge."
    assert item.expected_tool_calls == ({"name": "lookup_trip", "arguments": {"trip_id": "T-1"}},)


def test_adding_trajectories_makes_a_new_version_on_top_of_the_latest(workspace, dataset, record_trajectory):
    first = services.dataset_version_create_from_items(dataset=dataset, items=ITEMS[:2])
    trace_id = record_trajectory(workspace)

    version = services.dataset_add_trajectories(dataset=dataset, trace_ids=[trace_id, trace_id])

    items = selectors.dataset_version_items(version=version)
    assert (version.version, version.item_count) == (2, 3)
    assert items[:2] == dataset_items.items_keyed(ITEMS[:2])
    assert items[2].source_trace_id == trace_id
    assert selectors.dataset_version_items(version=first) == dataset_items.items_keyed(ITEMS[:2])


def test_another_workspaces_trajectory_is_not_added(workspace, other_workspace, dataset, record_trajectory):
    trace_id = record_trajectory(other_workspace)
    mine = record_trajectory(workspace, question="Where is my driver?")
    before = state()

    with pytest.raises(TrajectoryNotFound):
        services.dataset_add_trajectories(dataset=dataset, trace_ids=[mine, trace_id])

    assert state() == before
