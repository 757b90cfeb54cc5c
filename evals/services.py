"""Writes of the evals: datasets and their versions.

Every change to a dataset's items creates the next version with the whole item list (see
evals/models.py); nothing updates or deletes a version's items. Items are validated whole before
anything is written, so bad input leaves the dataset as it was.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Max

from agent_registry.models import Agent, ApiKey, User, Workspace
from evals import dataset_items, exceptions, selectors
from evals.models import Dataset, DatasetItem, DatasetVersion
from tracing import selectors as tracing_selectors
from tracing.models import Trajectory

AgentIds = selectors.AgentIds
# An upload larger than this is refused before it is parsed.
MAX_UPLOAD_BYTES = 20 * 1024 * 1024
MAX_ITEMS = 50_000


def _items_invalid(error: dataset_items.ItemsInvalid) -> exceptions.DatasetItemsInvalid:
    return exceptions.DatasetItemsInvalid(
        f"invalid items: {error}", errors=[problem.as_dict() for problem in error.problems]
    )


@transaction.atomic
def dataset_create(
    *,
    workspace: Workspace,
    name: str,
    description: str = "",
    agent: Agent | None = None,
    created_by: User | None = None,
    created_via_key: ApiKey | None = None,
) -> Dataset:
    """A dataset without versions; its first items create version 1. The name is unique per workspace."""
    dataset = Dataset(
        workspace=workspace,
        agent=agent,
        name=name,
        description=description,
        created_by=created_by,
        created_via_key=created_via_key,
    )
    dataset.full_clean(validate_constraints=False)
    if Dataset.objects.filter(workspace=workspace, name=name).exists():
        raise exceptions.DatasetExists(f"a dataset named {name!r} exists")
    try:
        with transaction.atomic():
            dataset.save()
    except IntegrityError:  # a concurrent create with the same name won
        raise exceptions.DatasetExists(f"a dataset named {name!r} exists") from None
    return dataset


@transaction.atomic
def dataset_version_create_from_items(
    *,
    dataset: Dataset,
    items: Sequence[dataset_items.ItemData],
    message: str = "",
    created_by: User | None = None,
    created_via_key: ApiKey | None = None,
) -> DatasetVersion:
    """The dataset's next version, holding exactly `items` in order.

    The dataset row is locked so that two concurrent writes get consecutive numbers, not a conflict."""
    if len(items) > MAX_ITEMS:
        raise exceptions.DatasetInvalid(
            f"a version holds at most {MAX_ITEMS} items", errors=[{"field": "items", "message": "too many items"}]
        )
    Dataset.objects.select_for_update().filter(pk=dataset.pk).get()
    latest = DatasetVersion.objects.filter(dataset=dataset).aggregate(latest=Max("version"))["latest"] or 0
    version = DatasetVersion(
        dataset=dataset,
        version=latest + 1,
        message=message,
        item_count=len(items),
        created_by=created_by,
        created_via_key=created_via_key,
    )
    version.full_clean()
    version.save()
    DatasetItem.objects.bulk_create(
        [
            DatasetItem(
                version=version,
                position=position,
                task=item.task,
                input_messages=[dict(message) for message in item.input_messages],
                reference_output=item.reference_output or "",
                expected_tool_calls=(
                    None if item.expected_tool_calls is None else [dict(call) for call in item.expected_tool_calls]
                ),
                expected_state=None if item.expected_state is None else dict(item.expected_state),
                metadata=dict(item.metadata),
                source_trace_id=item.source_trace_id,
            )
            for position, item in enumerate(items)
        ]
    )
    return version


def dataset_items_parse(data: Sequence[Any]) -> list[dataset_items.ItemData]:
    """Items sent as JSON; raises `DatasetItemsInvalid` naming each item (counted from 1) and field."""
    try:
        return dataset_items.items_parse(data)
    except dataset_items.ItemsInvalid as error:
        raise _items_invalid(error) from None


def dataset_items_from_upload(*, content: bytes, file_format: str) -> list[dataset_items.ItemData]:
    """The items of a JSONL or CSV file; raises `DatasetItemsInvalid` naming each bad line and field."""
    if file_format not in selectors.FORMATS:
        raise exceptions.DatasetInvalid(
            "format must be jsonl or csv", errors=[{"field": "format", "message": "must be jsonl or csv"}]
        )
    if len(content) > MAX_UPLOAD_BYTES:
        raise exceptions.DatasetFileTooLarge(f"the file is over {MAX_UPLOAD_BYTES} bytes")
    try:
        return dataset_items.items_from_file(content, file_format=file_format)
    except dataset_items.ItemsInvalid as error:
        raise _items_invalid(error) from None


def _text_of(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        texts = [str(part["text"]) for part in content if isinstance(part, dict) and isinstance(part.get("text"), str)]
        return "".join(texts) if texts else None
    return None


def dataset_item_from_trajectory(*, trajectory: Trajectory) -> dataset_items.ItemData:
    """An item from a stored trajectory: the messages its first model call read, its final answer as the
    reference, its tool calls (in order) as the expected ones, linked by its trace id."""
    view = tracing_selectors.trajectory_view(trajectory=trajectory)
    llm_steps = [step for step in view.steps if step.input_messages is not None or step.output_message is not None]
    messages: list[dict[str, Any]] = []
    first_read = next((step.input_messages for step in llm_steps if step.input_messages), None)
    if first_read:
        messages = [dict(message) for message in first_read]
    task = "" if messages else trajectory.input_preview
    if not messages and not task.strip():
        raise exceptions.TrajectoryNotUsable(
            f"trajectory {trajectory.trace_id} recorded no input messages or input to make an item of",
            errors=[{"field": "trace_ids", "message": f"{trajectory.trace_id} has no input"}],
        )
    reference: str | None = None
    for step in reversed(llm_steps):
        if step.output_message is not None:
            reference = _text_of(step.output_message.get("content"))
            if reference:
                break
    if not reference:
        reference = trajectory.output_preview or None
    tool_calls = [
        {"name": call.name, "arguments": call.arguments if isinstance(call.arguments, dict) else {}}
        for call in view.tool_calls
    ]
    metadata: dict[str, Any] = {}
    if trajectory.agent_id is not None and trajectory.agent is not None:
        metadata["agent"] = trajectory.agent.slug
    if view.task_id:
        metadata["task_id"] = view.task_id
    return dataset_items.ItemData(
        task=task,
        input_messages=tuple(messages),
        reference_output=reference,
        expected_tool_calls=tuple(tool_calls),
        metadata=metadata,
        source_trace_id=trajectory.trace_id,
    )


@transaction.atomic
def dataset_add_trajectories(
    *,
    dataset: Dataset,
    trace_ids: Sequence[str],
    agent_ids: AgentIds = None,
    message: str = "",
    created_by: User | None = None,
    created_via_key: ApiKey | None = None,
) -> DatasetVersion:
    """The next version: the latest version's items plus one item per trajectory, in the order given.

    Trajectories are looked up in the dataset's workspace (and the caller's agents); one that is not
    found or not usable fails the whole call, and no version is created."""
    if not trace_ids:
        raise exceptions.DatasetInvalid(
            "name at least one trace id", errors=[{"field": "trace_ids", "message": "must not be empty"}]
        )
    new_items = [
        dataset_item_from_trajectory(
            trajectory=tracing_selectors.trajectory_get(
                workspace=dataset.workspace, trace_id=trace_id, agent_ids=agent_ids
            )
        )
        for trace_id in dict.fromkeys(trace_ids)  # a trace named twice is added once
    ]
    # Locked before the latest version is read, so a concurrent write cannot slip in between.
    Dataset.objects.select_for_update().filter(pk=dataset.pk).get()
    latest = selectors.dataset_version_latest(dataset=dataset)
    previous = [] if latest is None else selectors.dataset_version_items(version=latest)
    return dataset_version_create_from_items(
        dataset=dataset,
        items=[*previous, *new_items],
        message=message or f"added {len(new_items)} item(s) from trajectories",
        created_by=created_by,
        created_via_key=created_via_key,
    )
