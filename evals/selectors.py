"""Reads of the evals, each scoped to a workspace (and, for keys limited to some agents, to those
agents' datasets): datasets, their versions and items, and a version written out as JSONL or CSV."""

from __future__ import annotations

from collections.abc import Collection

from django.db.models import QuerySet

from agent_registry.models import Workspace
from evals import dataset_items, exceptions
from evals.models import Dataset, DatasetItem, DatasetVersion

AgentIds = Collection[int] | None
FORMATS = ("jsonl", "csv")


def dataset_list(*, workspace: Workspace, agent_ids: AgentIds = None) -> QuerySet[Dataset]:
    datasets = Dataset.objects.filter(workspace=workspace).select_related("agent")
    if agent_ids is not None:
        # A key limited to some agents sees their datasets only, not the workspace-wide ones.
        datasets = datasets.filter(agent_id__in=agent_ids)
    return datasets.order_by("name")


def dataset_get(*, workspace: Workspace, name: str, agent_ids: AgentIds = None) -> Dataset:
    dataset = dataset_list(workspace=workspace, agent_ids=agent_ids).filter(name=name).first()
    if dataset is None:
        raise exceptions.DatasetNotFound(f"no dataset named {name!r}")
    return dataset


def dataset_version_list(*, dataset: Dataset) -> QuerySet[DatasetVersion]:
    return dataset.versions.order_by("-version")


def dataset_version_latest(*, dataset: Dataset) -> DatasetVersion | None:
    return dataset.versions.order_by("-version").first()


def dataset_version_get(*, dataset: Dataset, version: int) -> DatasetVersion:
    found = dataset.versions.filter(version=version).first()
    if found is None:
        raise exceptions.DatasetVersionNotFound(f"dataset {dataset.name!r} has no version {version}")
    return found


def dataset_item_list(*, version: DatasetVersion) -> QuerySet[DatasetItem]:
    return version.items.order_by("position")


def dataset_item_data(item: DatasetItem) -> dataset_items.ItemData:
    return dataset_items.ItemData(
        task=item.task,
        input_messages=tuple(item.input_messages or ()),
        reference_output=item.reference_output or None,
        expected_tool_calls=None if item.expected_tool_calls is None else tuple(item.expected_tool_calls),
        expected_state=item.expected_state,
        metadata=item.metadata or {},
        source_trace_id=item.source_trace_id,
    )


def dataset_version_items(*, version: DatasetVersion) -> list[dataset_items.ItemData]:
    return [dataset_item_data(item) for item in dataset_item_list(version=version)]


def dataset_version_export(*, version: DatasetVersion, file_format: str) -> str:
    """The version's items as a JSONL or CSV file, in the shape an upload accepts."""
    items = dataset_version_items(version=version)
    if file_format == "jsonl":
        return dataset_items.items_to_jsonl(items)
    if file_format == "csv":
        return dataset_items.items_to_csv(items)
    raise exceptions.DatasetInvalid(
        f"format must be one of {', '.join(FORMATS)}", errors=[{"field": "format", "message": "must be jsonl or csv"}]
    )
