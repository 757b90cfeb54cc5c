"""The evals REST API: datasets, their versions and their items, uploads, items from trajectories and downloads.

Reads need `read`, writes `write`. A key limited to some agents sees and changes only those agents'
datasets, and cannot create a workspace-wide one (a dataset without an agent).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from django.http import HttpRequest, HttpResponse
from ninja import Field, Query, Router, Schema, Status

from agent_registry import selectors as registry_selectors
from agent_registry.auth import key_auth, request_agent_ids, request_api_key, request_workspace
from agent_registry.models import Scope
from agent_registry.schemas import error_responses
from config.errors import PermissionDenied
from evals import selectors, services
from evals.models import DATASET_NAME_PATTERN, Dataset, DatasetVersion

router = Router(tags=["evals"])

READ = key_auth(Scope.READ)
WRITE = key_auth(Scope.WRITE)
ERRORS = error_responses(409)
_MEDIA_TYPES = {"jsonl": "application/x-ndjson", "csv": "text/csv"}


class DatasetIn(Schema):
    name: str = Field(min_length=1, max_length=200, pattern=DATASET_NAME_PATTERN)
    description: str = ""
    agent: str | None = None


class DatasetOut(Schema):
    name: str
    description: str
    agent: str | None
    created_at: datetime
    latest_version: int | None
    item_count: int


class DatasetVersionOut(Schema):
    version: int
    message: str
    item_count: int
    created_at: datetime


class DatasetVersionIn(Schema):
    message: str = ""
    # Validated item by item by the service, so that errors name the item and field as uploads do.
    items: list[Any]


class FromTrajectoriesIn(Schema):
    trace_ids: list[str] = Field(min_length=1, max_length=1000)
    message: str = ""


class DatasetItemOut(Schema):
    key: str
    position: int
    task: str
    input_messages: list[Any]
    reference_output: str = Field(description="blank when the item has no reference")
    expected_tool_calls: list[Any] | None
    expected_state: Any
    metadata: dict[str, Any] = Field(description="as stored; subgroup tags under metadata.tags")
    source_trace_id: str = Field(description="the trajectory the item came from; blank when uploaded")


class DatasetItemPageOut(Schema):
    items: list[DatasetItemOut]
    next_cursor: str | None


class DatasetItemsQuery(Schema):
    limit: int = Field(50, ge=1, le=500)
    cursor: str | None = None


class FormatQuery(Schema):
    format: Literal["jsonl", "csv"] = "jsonl"


class UploadQuery(FormatQuery):
    message: str = ""


def _dataset(request: HttpRequest, name: str) -> Dataset:
    return selectors.dataset_get(workspace=request_workspace(request), name=name, agent_ids=request_agent_ids(request))


def _dataset_out(dataset: Dataset) -> dict[str, Any]:
    latest = selectors.dataset_version_latest(dataset=dataset)
    return {
        "name": dataset.name,
        "description": dataset.description,
        "agent": dataset.agent.slug if dataset.agent is not None else None,
        "created_at": dataset.created_at,
        "latest_version": latest.version if latest is not None else None,
        "item_count": latest.item_count if latest is not None else 0,
    }


def _version_out(version: DatasetVersion) -> dict[str, Any]:
    return {
        "version": version.version,
        "message": version.message,
        "item_count": version.item_count,
        "created_at": version.created_at,
    }


@router.get("/datasets", auth=READ, response={200: list[DatasetOut], **ERRORS})
def dataset_list_api(request: HttpRequest) -> Any:
    datasets = selectors.dataset_list(workspace=request_workspace(request), agent_ids=request_agent_ids(request))
    return [_dataset_out(dataset) for dataset in datasets]


@router.post("/datasets", auth=WRITE, response={201: DatasetOut, **ERRORS})
def dataset_create_api(request: HttpRequest, payload: DatasetIn) -> Any:
    workspace = request_workspace(request)
    agent_ids = request_agent_ids(request)
    if payload.agent is None and agent_ids is not None:
        raise PermissionDenied("a key limited to some agents cannot create a workspace-wide dataset; name an agent")
    agent = (
        registry_selectors.agent_get(workspace=workspace, slug=payload.agent, agent_ids=agent_ids)
        if payload.agent is not None
        else None
    )
    dataset = services.dataset_create(
        workspace=workspace,
        name=payload.name,
        description=payload.description,
        agent=agent,
        created_via_key=request_api_key(request),
    )
    return Status(201, _dataset_out(dataset))


@router.get("/datasets/{name}", auth=READ, response={200: DatasetOut, **ERRORS})
def dataset_get_api(request: HttpRequest, name: str) -> Any:
    return _dataset_out(_dataset(request, name))


@router.get("/datasets/{name}/versions", auth=READ, response={200: list[DatasetVersionOut], **ERRORS})
def dataset_version_list_api(request: HttpRequest, name: str) -> Any:
    return [_version_out(version) for version in selectors.dataset_version_list(dataset=_dataset(request, name))]


@router.post("/datasets/{name}/versions", auth=WRITE, response={201: DatasetVersionOut, **ERRORS})
def dataset_version_create_api(request: HttpRequest, name: str, payload: DatasetVersionIn) -> Any:
    """A new version holding exactly these items. Errors name the item (counted from 1) as `line`."""
    dataset = _dataset(request, name)
    items = services.dataset_items_parse(payload.items)
    version = services.dataset_version_create_from_items(
        dataset=dataset, items=items, message=payload.message, created_via_key=request_api_key(request)
    )
    return Status(201, _version_out(version))


@router.post(
    "/datasets/{name}/upload",
    auth=WRITE,
    response={201: DatasetVersionOut, **ERRORS},
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {media: {"schema": {"type": "string"}} for media in _MEDIA_TYPES.values()},
        }
    },
)
def dataset_upload_api(request: HttpRequest, name: str, query: Query[UploadQuery]) -> Any:
    """A new version holding the file's items (the body is the file). A malformed file is 422 with
    `errors: [{"line", "field", "message"}]`, and nothing is imported."""
    dataset = _dataset(request, name)
    items = services.dataset_items_from_upload(content=request.body, file_format=query.format)
    version = services.dataset_version_create_from_items(
        dataset=dataset,
        items=items,
        message=query.message or f"uploaded {query.format}",
        created_via_key=request_api_key(request),
    )
    return Status(201, _version_out(version))


@router.post("/datasets/{name}/from-trajectories", auth=WRITE, response={201: DatasetVersionOut, **ERRORS})
def dataset_add_trajectories_api(request: HttpRequest, name: str, payload: FromTrajectoriesIn) -> Any:
    """A new version: the latest items plus one per trajectory, each keeping its trace id."""
    version = services.dataset_add_trajectories(
        dataset=_dataset(request, name),
        trace_ids=payload.trace_ids,
        agent_ids=request_agent_ids(request),
        message=payload.message,
        created_via_key=request_api_key(request),
    )
    return Status(201, _version_out(version))


@router.get(
    "/datasets/{name}/versions/{int:version}/download",
    auth=READ,
    response={200: None, **ERRORS},
    openapi_extra={
        "responses": {
            200: {
                "description": "The version's items",
                "content": {media: {"schema": {"type": "string"}} for media in _MEDIA_TYPES.values()},
            }
        }
    },
)
def dataset_version_download_api(request: HttpRequest, name: str, version: int, query: Query[FormatQuery]) -> Any:
    dataset = _dataset(request, name)
    found = selectors.dataset_version_get(dataset=dataset, version=version)
    text = selectors.dataset_version_export(version=found, file_format=query.format)
    response = HttpResponse(text, content_type=f"{_MEDIA_TYPES[query.format]}; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{dataset.name}-v{found.version}.{query.format}"'
    return response


@router.get("/datasets/{name}/versions/{int:version}/items", auth=READ, response={200: DatasetItemPageOut, **ERRORS})
def dataset_version_items_api(
    request: HttpRequest, response: HttpResponse, name: str, version: int, query: Query[DatasetItemsQuery]
) -> Any:
    """A page of the version's items in their order, as stored. `next_cursor` (also in the `X-Next-Cursor`
    header and a `Link` header, rel="next") continues it; it is null on the last page."""
    found = selectors.dataset_version_get(dataset=_dataset(request, name), version=version)
    page = selectors.dataset_item_page(version=found, limit=query.limit, cursor=query.cursor)
    if page.next_cursor:
        following = request.GET.copy()
        following["cursor"] = page.next_cursor
        response["X-Next-Cursor"] = page.next_cursor
        response["Link"] = f'<{request.path}?{following.urlencode()}>; rel="next"'
    return {
        "items": [
            {
                "key": item.key,
                "position": item.position,
                "task": item.task,
                "input_messages": item.input_messages,
                "reference_output": item.reference_output,
                "expected_tool_calls": item.expected_tool_calls,
                "expected_state": item.expected_state,
                "metadata": item.metadata,
                "source_trace_id": item.source_trace_id,
            }
            for item in page.items
        ],
        "next_cursor": page.next_cursor,
    }
