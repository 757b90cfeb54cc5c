"""The trainer bridge's REST API: curations and their previews, exports (202, then a file with a manifest),
training jobs, and the GPU worker's side of a job (claim, heartbeat, metrics, adapter, finish; the protocol
is in trainer_bridge/worker.py).

Reads need `read`, writes `write`. The GPU worker's calls need `train` and nothing else: a `train` key claims a
job, reads that job's export and no other data, and reports on the job it holds (a job is held by the key that
claimed it). A key limited to some agents cannot use the trainer bridge: curations span agents.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

import orjson
from django.http import FileResponse, HttpRequest
from ninja import Field, Router, Schema, Status

from agent_registry import audit
from agent_registry.auth import key_auth, request_agent_ids, request_api_key, request_workspace
from agent_registry.models import AuditAction, Scope
from agent_registry.schemas import error_responses
from config.errors import PermissionDenied
from config.schemas import PatchSchema
from trainer_bridge import jobs, services
from trainer_bridge.models import NAME_PATTERN, Curation, Export, TrainingJob

router = Router(tags=["training"])

READ = key_auth(Scope.READ)
WRITE = key_auth(Scope.WRITE)
TRAIN = key_auth(Scope.TRAIN)
ERRORS = error_responses(409)
FORMATS = Literal["art", "trl_sft", "trl_dpo", "trl_kto", "openai", "nemo_gym"]


class CurationIn(Schema):
    name: str = Field(pattern=NAME_PATTERN, max_length=200)
    description: str = ""
    query: dict[str, Any] = Field(default_factory=dict)
    grouping: str = "auto"
    reward: dict[str, Any]
    filters: dict[str, Any] = Field(default_factory=dict)


class CurationPatch(PatchSchema):
    description: str | None = None
    query: dict[str, Any] | None = None
    grouping: str | None = None
    reward: dict[str, Any] | None = None
    filters: dict[str, Any] | None = None


class CurationOut(Schema):
    name: str
    description: str
    query: dict[str, Any]
    grouping: str
    reward: dict[str, Any]
    filters: dict[str, Any]
    created_at: datetime


class PreviewIn(Schema):
    query: dict[str, Any] = Field(default_factory=dict)
    grouping: str = "auto"
    reward: dict[str, Any]
    filters: dict[str, Any] = Field(default_factory=dict)


class ExportIn(Schema):
    format: FORMATS
    threshold: float = Field(default=1.0, ge=0, le=1)
    # Both splits of the curation (each row says which it is in), or one: OpenAI's training and validation
    # files are separate uploads.
    split: Literal["all", "train", "validation"] = "all"


class ExportOut(Schema):
    id: int
    curation: str | None
    format: str
    status: str
    groups_total: int
    groups_done: int
    bytes: int
    sha256: str
    manifest: dict[str, Any]
    error: str
    download_url: str | None
    created_at: datetime
    finished_at: datetime | None


class JobIn(Schema):
    export: int
    method: Literal["grpo", "sft", "dpo"]
    base_model: str = Field(min_length=1, max_length=500)
    config: dict[str, Any] = Field(default_factory=dict)
    name: str = Field(default="", max_length=200)
    lease_seconds: int = 300
    serve: dict[str, Any] | None = None
    compare_suite: str = ""
    validation_export: int | None = None


class JobOut(Schema):
    id: int
    name: str
    export: int
    method: str
    base_model: str
    config: dict[str, Any]
    status: str
    worker: str
    attempts: int
    steps_done: int
    flagged: bool
    flag_reason: str
    adapter: str | None
    model_target: str | None
    comparison_run: int | None
    error: str
    metrics: list[dict[str, Any]]
    created_at: datetime
    finished_at: datetime | None


class ClaimIn(Schema):
    worker: str = Field(default="worker", max_length=200)


class MetricsIn(Schema):
    step: int = Field(ge=0)
    metrics: dict[str, float | None]


class FinishIn(Schema):
    status: Literal["succeeded", "failed"]
    error: str = ""


def _workspace_wide(request: HttpRequest) -> None:
    if request_agent_ids(request) is not None:
        raise PermissionDenied("a key limited to some agents cannot use the trainer bridge; curations span agents")


def _curation(request: HttpRequest, name: str) -> Curation:
    _workspace_wide(request)
    found = Curation.objects.filter(workspace=request_workspace(request), name=name).first()
    if found is None:
        raise services.CurationNotFound(f"no curation named {name!r}")
    return found


def _export(request: HttpRequest, export_id: int) -> Export:
    _workspace_wide(request)
    found = Export.objects.select_related("curation").filter(workspace=request_workspace(request), pk=export_id).first()
    if found is None:
        raise services.ExportNotFound(f"no export {export_id}")
    return found


def _job(request: HttpRequest, job_id: int) -> TrainingJob:
    _workspace_wide(request)
    found = (
        TrainingJob.objects.select_related("model_target")
        .filter(workspace=request_workspace(request), pk=job_id)
        .first()
    )
    if found is None:
        raise jobs.JobNotFound(f"no training job {job_id}")
    return found


def _curation_out(found: Curation) -> dict[str, Any]:
    return {
        "name": found.name,
        "description": found.description,
        "query": found.query,
        "grouping": found.grouping,
        "reward": found.reward,
        "filters": found.filters,
        "created_at": found.created_at,
    }


def _export_out(found: Export) -> dict[str, Any]:
    return {
        "id": found.pk,
        "curation": found.curation.name if found.curation else None,
        "format": found.format,
        "status": found.status,
        "groups_total": found.groups_total,
        "groups_done": found.groups_done,
        "bytes": found.bytes,
        "sha256": found.sha256,
        "manifest": found.manifest,
        "error": found.error,
        "download_url": f"/api/v1/exports/{found.pk}/download" if found.status == "succeeded" else None,
        "created_at": found.created_at,
        "finished_at": found.finished_at,
    }


def _job_out(found: TrainingJob) -> dict[str, Any]:
    return {
        "id": found.pk,
        "name": found.name,
        "export": found.export_id,
        "method": found.method,
        "base_model": found.base_model,
        "config": found.config,
        "status": found.status,
        "worker": found.worker,
        "attempts": found.attempts,
        "steps_done": found.steps_done,
        "flagged": found.flagged,
        "flag_reason": found.flag_reason,
        "adapter": found.adapter_location
        or (found.adapter_path and f"/api/v1/training-jobs/{found.pk}/adapter")
        or None,
        "model_target": found.model_target.alias if found.model_target else None,
        "comparison_run": found.comparison_run_id,
        "error": found.error,
        "metrics": [{"step": metric.step, **metric.values} for metric in found.metrics.all()],  # by step
        "created_at": found.created_at,
        "finished_at": found.finished_at,
    }


# --- Curations ------------------------------------------------------------------------------------------


@router.get("/curations", auth=READ, response={200: list[CurationOut], **ERRORS})
def curation_list_api(request: HttpRequest) -> Any:
    _workspace_wide(request)
    return [_curation_out(c) for c in Curation.objects.filter(workspace=request_workspace(request)).order_by("name")]


@router.post("/curations", auth=WRITE, response={201: CurationOut, **ERRORS})
def curation_create_api(request: HttpRequest, payload: CurationIn) -> Any:
    _workspace_wide(request)
    found = services.curation_create(workspace=request_workspace(request), **payload.model_dump())
    return Status(201, _curation_out(found))


@router.post("/curations/preview", auth=READ, response={200: dict[str, Any], **ERRORS})
def curation_preview_unsaved_api(request: HttpRequest, payload: PreviewIn) -> Any:
    """What a curation not yet saved would select: groups, sizes, rewards, signals, tokens."""
    _workspace_wide(request)
    data = payload.model_dump()
    services.curation_validate(**data)
    return services.curation_preview(workspace=request_workspace(request), snapshot=data).as_dict()


@router.get("/curations/{name}", auth=READ, response={200: CurationOut, **ERRORS})
def curation_get_api(request: HttpRequest, name: str) -> Any:
    return _curation_out(_curation(request, name))


@router.patch("/curations/{name}", auth=WRITE, response={200: CurationOut, **ERRORS})
def curation_update_api(request: HttpRequest, name: str, payload: CurationPatch) -> Any:
    found = _curation(request, name)
    fields = {key: value for key, value in payload.model_dump(exclude_unset=True).items() if value is not None}
    return _curation_out(services.curation_update(curation=found, **fields))


@router.get("/curations/{name}/preview", auth=READ, response={200: dict[str, Any], **ERRORS})
def curation_preview_api(request: HttpRequest, name: str) -> Any:
    found = _curation(request, name)
    return services.curation_preview(workspace=found.workspace, snapshot=services.curation_snapshot(found)).as_dict()


@router.post("/curations/{name}/exports", auth=WRITE, response={202: ExportOut, **ERRORS})
def export_create_api(request: HttpRequest, name: str, payload: ExportIn) -> Any:
    """Export the curation (202; a worker writes the file). Refused with 422 `export_refused`, and nothing
    written, when it selects no groups or the format cannot represent them."""
    export = services.export_create(
        curation=_curation(request, name),
        format=payload.format,
        threshold=payload.threshold,
        split=payload.split,
        created_via_key=request_api_key(request),
    )
    return Status(202, _export_out(export))


# --- Exports --------------------------------------------------------------------------------------------


@router.get("/exports", auth=READ, response={200: list[ExportOut], **ERRORS})
def export_list_api(request: HttpRequest) -> Any:
    _workspace_wide(request)
    found = Export.objects.filter(workspace=request_workspace(request)).select_related("curation")
    return [_export_out(e) for e in found.order_by("-created_at", "-pk")[:100]]


@router.get("/exports/{int:export_id}", auth=READ, response={200: ExportOut, **ERRORS})
def export_get_api(request: HttpRequest, export_id: int) -> Any:
    return _export_out(_export(request, export_id))


@router.post("/exports/{int:export_id}/cancel", auth=WRITE, response={200: ExportOut, **ERRORS})
def export_cancel_api(request: HttpRequest, export_id: int) -> Any:
    return _export_out(services.export_cancel(export=_export(request, export_id)))


@router.get(
    "/exports/{int:export_id}/download",
    auth=READ,
    response={200: None, **ERRORS},
    openapi_extra={
        "responses": {
            200: {"description": "The export", "content": {"application/x-ndjson": {"schema": {"type": "string"}}}}
        }
    },
)
def export_download_api(request: HttpRequest, export_id: int) -> Any:
    """The export's file (409 until it has succeeded); its sha256 is in the manifest and the ETag."""
    export = _export(request, export_id)
    path = services.export_file(export=export)
    audit.record(
        workspace=export.workspace_id,
        action=AuditAction.EXPORT_DOWNLOADED,
        api_key=request_api_key(request),
        target=export,
    )
    response = FileResponse(
        path.open("rb"), content_type="application/x-ndjson", as_attachment=True, filename=path.name
    )
    response["ETag"] = f'"{export.sha256}"'
    return response


@router.get("/exports/{int:export_id}/manifest", auth=READ, response={200: dict[str, Any], **ERRORS})
def export_manifest_api(request: HttpRequest, export_id: int) -> Any:
    export = _export(request, export_id)
    services.export_file(export=export)
    return export.manifest


# --- Training jobs --------------------------------------------------------------------------------------


@router.get("/training-jobs", auth=READ, response={200: list[JobOut], **ERRORS})
def job_list_api(request: HttpRequest) -> Any:
    _workspace_wide(request)
    found = (
        TrainingJob.objects.filter(workspace=request_workspace(request))
        .select_related("model_target")
        .prefetch_related("metrics")
    )
    return [_job_out(job) for job in found.order_by("-created_at", "-pk")[:100]]


@router.post("/training-jobs", auth=WRITE, response={201: JobOut, **ERRORS})
def job_create_api(request: HttpRequest, payload: JobIn) -> Any:
    data = payload.model_dump()
    export = _export(request, data.pop("export"))
    validation = data.pop("validation_export")
    job = jobs.job_create(
        export=export,
        validation_export=_export(request, validation) if validation is not None else None,
        created_via_key=request_api_key(request),
        **data,
    )
    return Status(201, _job_out(job))


@router.post("/training-jobs/claim", auth=TRAIN, response={200: dict[str, Any], 204: None, **ERRORS})
def job_claim_api(request: HttpRequest, payload: ClaimIn) -> Any:
    """A GPU worker takes the oldest waiting job (or one whose worker stopped sending heartbeats)."""
    _workspace_wide(request)
    job = jobs.job_claim(api_key=request_api_key(request), worker=payload.worker)
    if job is None:
        return Status(204, None)
    return {
        "id": job.pk,
        "method": job.method,
        "base_model": job.base_model,
        "config": jobs.job_training_config(job),
        "export_url": f"/api/v1/training-jobs/{job.pk}/data/train",
        "lease_seconds": job.lease_seconds,
        **({"validation_url": f"/api/v1/training-jobs/{job.pk}/data/validation"} if job.validation_export_id else {}),
    }


@router.get(
    "/training-jobs/{int:job_id}/data/{split}",
    auth=TRAIN,
    response={200: None, **ERRORS},
    openapi_extra={
        "responses": {
            200: {"description": "The export", "content": {"application/x-ndjson": {"schema": {"type": "string"}}}}
        }
    },
)
def job_data_api(request: HttpRequest, job_id: int, split: Literal["train", "validation"]) -> Any:
    """The export a held job trains on (`train`) or validates on (`validation`); 409 if the key does not hold
    the job."""
    job = jobs.job_held(job=_job(request, job_id), api_key=request_api_key(request))
    export = job.export if split == "train" else job.validation_export
    if export is None:
        raise jobs.JobNotFound(f"training job {job_id} has no validation export")
    path = services.export_file(export=export)
    audit.record(
        workspace=export.workspace_id,
        action=AuditAction.EXPORT_DOWNLOADED,
        api_key=request_api_key(request),
        target=export,
        details={"training_job_id": job_id, "split": split},
    )
    response = FileResponse(
        path.open("rb"), content_type="application/x-ndjson", as_attachment=True, filename=path.name
    )
    response["ETag"] = f'"{export.sha256}"'
    return response


@router.get("/training-jobs/{int:job_id}", auth=READ, response={200: JobOut, **ERRORS})
def job_get_api(request: HttpRequest, job_id: int) -> Any:
    return _job_out(_job(request, job_id))


@router.post("/training-jobs/{int:job_id}/cancel", auth=WRITE, response={200: JobOut, **ERRORS})
def job_cancel_api(request: HttpRequest, job_id: int) -> Any:
    return _job_out(jobs.job_cancel(job=_job(request, job_id)))


@router.post("/training-jobs/{int:job_id}/heartbeat", auth=TRAIN, response={204: None, **ERRORS})
def job_heartbeat_api(request: HttpRequest, job_id: int) -> Any:
    jobs.job_heartbeat(job=_job(request, job_id), api_key=request_api_key(request))
    return Status(204, None)


@router.post("/training-jobs/{int:job_id}/metrics", auth=TRAIN, response={204: None, **ERRORS})
def job_metrics_api(request: HttpRequest, job_id: int, payload: MetricsIn) -> Any:
    jobs.job_metrics_record(
        job=_job(request, job_id), api_key=request_api_key(request), step=payload.step, values=payload.metrics
    )
    return Status(204, None)


@router.post(
    "/training-jobs/{int:job_id}/adapter",
    auth=TRAIN,
    response={204: None, **ERRORS},
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/gzip": {"schema": {"type": "string", "format": "binary"}},
                "application/json": {"schema": {"type": "object", "properties": {"location": {"type": "string"}}}},
            },
        }
    },
)
def job_adapter_api(request: HttpRequest, job_id: int) -> Any:
    """The trained adapter as a tar.gz body, or `{"location": ...}` where the worker stored it."""
    job = _job(request, job_id)
    api_key = request_api_key(request)
    if request.content_type == "application/json":
        try:
            location = orjson.loads(request.body).get("location", "")
        except (orjson.JSONDecodeError, AttributeError):
            location = ""
        jobs.job_adapter_store(job=job, api_key=api_key, location=str(location or ""))
    else:
        # Streamed, not request.body: an adapter is larger than the bodies Keel reads into memory.
        jobs.job_adapter_store(job=job, api_key=api_key, content=request)  # type: ignore[arg-type]
    return Status(204, None)


@router.get(
    "/training-jobs/{int:job_id}/adapter",
    auth=READ,
    response={200: None, **ERRORS},
    openapi_extra={
        "responses": {
            200: {"description": "The adapter", "content": {"application/gzip": {"schema": {"type": "string"}}}}
        }
    },
)
def job_adapter_download_api(request: HttpRequest, job_id: int) -> Any:
    job = _job(request, job_id)
    if not job.adapter_path:
        raise jobs.JobNotFound(f"training job {job_id} has no uploaded adapter")
    return FileResponse(open(job.adapter_path, "rb"), content_type="application/gzip", as_attachment=True)


@router.post("/training-jobs/{int:job_id}/finish", auth=TRAIN, response={200: JobOut, **ERRORS})
def job_finish_api(request: HttpRequest, job_id: int, payload: FinishIn) -> Any:
    job = jobs.job_finish(
        job=_job(request, job_id), api_key=request_api_key(request), status=payload.status, error=payload.error
    )
    return _job_out(job)
