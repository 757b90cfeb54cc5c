"""Training jobs: made from an export, claimed by a GPU worker over HTTP (trainer_bridge/worker.py has the
protocol), reported on step by step, and, when they succeed, registered as a model target with an eval
run that compares it with the incumbent.

A job belongs to the worker that claimed it while its heartbeats keep coming; one whose heartbeats stop
for `lease_seconds` goes back to the queue and the next claim takes it (attempts count up). A worker is
known by the API key it calls with (give each worker its own key): any call about a job from a key that
does not hold it, or after the lease lapsed, is a 409, so a worker that lost its job stops.

The reward-hacking watch: a job is flagged when its latest validation score is more than `HACKING_MARGIN`
below the best one so far while the training reward is higher than it was at that best validation. The
training reward at a validation is the worker's `train_policy_reward` there (the policy-weighted reward on a
fixed sample of training groups), else that step's `policy_reward` (the recorded rewards weighted by how much
the policy now prefers each completion; the recorded rewards themselves cannot move), else `reward_mean`.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any, BinaryIO

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Greatest
from django.utils import timezone

from agent_registry import audit
from agent_registry.models import ApiKey, AuditAction, User
from config.errors import Conflict, NotFound, ValidationFailed
from trainer_bridge.models import Export, JobStatus, TrainingJob, TrainingMethod, TrainingMetric
from trainer_bridge.training_config import TrainingConfig, TrainingConfigError

logger = logging.getLogger("trainer_bridge.jobs")

HACKING_MARGIN = 0.02
# Keys of a job's stored config that are Keel's, not the trainer's.
KEEL_CONFIG_KEYS = ("serve", "compare_suite")
MAX_ATTEMPTS = 3
MAX_ADAPTER_BYTES = 2 * 1024**3
# Export formats each method trains on.
METHOD_FORMATS = {TrainingMethod.GRPO: ("art",), TrainingMethod.SFT: ("trl_sft",), TrainingMethod.DPO: ("trl_dpo",)}


class JobInvalid(ValidationFailed):
    code = "training_job_invalid"


class JobNotFound(NotFound):
    code = "training_job_not_found"


class JobNotHeld(Conflict):
    """The worker does not hold the job (never claimed it, or its lease lapsed and another did)."""

    code = "training_job_not_held"


def _config_problems(method: str, config: Mapping[str, Any]) -> list[dict[str, str]]:
    try:
        TrainingConfig.from_dict({**config, "method": method})
    except TrainingConfigError as error:
        return [{"field": f"config.{error.field}", "message": str(error).split(": ", 1)[-1]}]
    except (TypeError, ValueError) as error:
        return [{"field": "config", "message": str(error)}]
    return []


def _serve_problems(serve: Mapping[str, Any]) -> list[dict[str, str]]:
    """What would keep `_register` from making the model target once the job has trained: refused now, not
    after hours of training, when the worker's `finish` would get a 422 and the job could never succeed.
    The same rules as routing's model targets."""
    from routing import services as routing_services
    from routing.models import ModelTarget

    problems = []
    model = serve.get("model")
    longest = ModelTarget._meta.get_field("model").max_length or 0
    if not isinstance(model, str) or not model.strip() or len(model.strip()) > longest:
        problems.append({"field": "serve.model", "message": "the litellm model string that will serve the adapter"})
    api_base = serve.get("api_base") or ""
    problem = routing_services.api_base_error(api_base) if isinstance(api_base, str) else "must be a string"
    if problem:
        problems.append({"field": "serve.api_base", "message": problem})
    return problems


@transaction.atomic
def job_create(
    *,
    export: Export,
    method: str,
    base_model: str,
    config: Mapping[str, Any] | None = None,
    name: str = "",
    lease_seconds: int = 300,
    serve: Mapping[str, Any] | None = None,
    compare_suite: str = "",
    validation_export: Export | None = None,
    created_by: User | None = None,
    created_via_key: ApiKey | None = None,
) -> TrainingJob:
    """A queued job. `serve` says how the trained adapter will be served ({"model": litellm model string,
    "api_base"?}) so Keel can register it as a model target; `compare_suite` names the eval suite whose runs
    compare it with the incumbent."""
    config = dict(config or {})
    problems: list[dict[str, str]] = []
    if method not in TrainingMethod.values:
        problems.append({"field": "method", "message": f"must be one of {', '.join(TrainingMethod.values)}"})
    elif export.format not in METHOD_FORMATS[TrainingMethod(method)]:
        wanted = " or ".join(METHOD_FORMATS[TrainingMethod(method)])
        problems.append({"field": "export", "message": f"{method} trains on a {wanted} export, not {export.format}"})
    else:
        problems += _config_problems(method, config)
    if export.status != JobStatus.SUCCEEDED:
        problems.append({"field": "export", "message": f"the export is {export.status}, not finished"})
    if validation_export is not None and (
        validation_export.workspace_id != export.workspace_id
        or validation_export.format != export.format
        or validation_export.status != JobStatus.SUCCEEDED
    ):
        problems.append(
            {"field": "validation_export", "message": f"a finished {export.format} export of this workspace"}
        )
    if not base_model.strip():
        problems.append({"field": "base_model", "message": "name the base model (a path or hub id the GPU has)"})
    if not 30 <= lease_seconds <= 24 * 3600:
        problems.append({"field": "lease_seconds", "message": "30 seconds to a day"})
    if serve is not None:
        problems += _serve_problems(serve)
    if problems:
        raise JobInvalid(f"invalid training job: {problems[0]['field']}: {problems[0]['message']}", errors=problems)
    job = TrainingJob.objects.create(
        workspace_id=export.workspace_id,
        export=export,
        name=name,
        method=method,
        base_model=base_model.strip(),
        config={
            **config,
            **({"serve": dict(serve)} if serve else {}),
            **({"compare_suite": compare_suite} if compare_suite else {}),
        },
        lease_seconds=lease_seconds,
        validation_export=validation_export,
        created_by=created_by,
        created_via_key=created_via_key,
    )
    audit.record(
        workspace=job.workspace_id,
        action=AuditAction.TRAINING_JOB_CREATED,
        user=created_by,
        api_key=created_via_key,
        target=job,
        details={"export_id": export.pk, "method": method, "base_model": job.base_model},
    )
    return job


def job_claim(*, api_key: ApiKey, worker: str) -> TrainingJob | None:
    """The oldest job waiting in the workspace (or whose worker's heartbeats stopped), now this worker's."""
    jobs_expire(workspace_id=api_key.workspace_id)
    now = timezone.now()
    with transaction.atomic():
        candidates = (
            TrainingJob.objects.select_for_update(skip_locked=True)
            .filter(workspace_id=api_key.workspace_id, attempts__lt=MAX_ATTEMPTS)
            .filter(
                Q(status=JobStatus.QUEUED) | Q(status=JobStatus.RUNNING, heartbeat_at__lt=now - timedelta(seconds=30))
            )
            .order_by("created_at", "pk")
        )
        job = next(
            (
                candidate
                for candidate in candidates[:50]
                if candidate.status == JobStatus.QUEUED
                or candidate.heartbeat_at is None
                or candidate.heartbeat_at < now - timedelta(seconds=candidate.lease_seconds)
            ),
            None,
        )
        if job is None:
            return None
        job.status = JobStatus.RUNNING
        job.worker = worker[:200]
        job.claimed_via_key = api_key
        job.heartbeat_at = now
        job.attempts += 1
        job.started_at = job.started_at or now
        job.save(update_fields=["status", "worker", "claimed_via_key", "heartbeat_at", "attempts", "started_at"])
    return job


def jobs_expire(*, workspace_id: int | None = None) -> list[int]:
    """Fail the running jobs whose worker stopped sending heartbeats on their last attempt: no claim will take
    them again (MAX_ATTEMPTS), so without this they would say "running" for ever. Returns their ids."""
    now = timezone.now()
    running = TrainingJob.objects.filter(status=JobStatus.RUNNING, attempts__gte=MAX_ATTEMPTS)
    if workspace_id is not None:
        running = running.filter(workspace_id=workspace_id)
    lapsed = [
        job
        for job in running.only("pk", "heartbeat_at", "lease_seconds")
        if job.heartbeat_at is None or job.heartbeat_at < now - timedelta(seconds=job.lease_seconds)
    ]
    expired = []
    for job in lapsed:
        # Conditional: a heartbeat that came in since the read keeps the job running.
        failed = TrainingJob.objects.filter(pk=job.pk, status=JobStatus.RUNNING, heartbeat_at=job.heartbeat_at).update(
            status=JobStatus.FAILED,
            finished_at=now,
            error=f"the worker stopped sending heartbeats on each of {MAX_ATTEMPTS} attempts; the job is not "
            "handed out again",
        )
        if failed:
            expired.append(job.pk)
    return expired


def job_training_config(job: TrainingJob) -> dict[str, Any]:
    """What the worker trains with: the job's config without Keel's own keys (how to serve it, what to compare)."""
    return {key: value for key, value in job.config.items() if key not in KEEL_CONFIG_KEYS}


def job_held(*, job: TrainingJob, api_key: ApiKey) -> TrainingJob:
    """The job, fresh from the database, if this key's worker holds it (running, lease not lapsed); else 409."""
    job.refresh_from_db()
    lapsed = job.heartbeat_at is None or job.heartbeat_at < timezone.now() - timedelta(seconds=job.lease_seconds)
    if job.status != JobStatus.RUNNING or job.claimed_via_key_id != api_key.pk or lapsed:
        raise JobNotHeld(f"training job {job.pk} is not held by this key's worker ({job.status})")
    return job


def job_heartbeat(*, job: TrainingJob, api_key: ApiKey) -> TrainingJob:
    job = job_held(job=job, api_key=api_key)
    TrainingJob.objects.filter(pk=job.pk).update(heartbeat_at=timezone.now())
    return job


def _training_reward(values: Mapping[str, Any]) -> float | None:
    for name in ("train_policy_reward", "policy_reward", "reward_mean"):
        if values.get(name) is not None:
            return float(values[name])
    return None


def _flag_check(job: TrainingJob) -> None:
    """Flag the job when the validation score fell from its best while the training reward rose past its value
    at that best validation (or, where the worker reported none there, at the first step after it)."""
    metrics = [(metric.step, metric.values) for metric in TrainingMetric.objects.filter(job=job).order_by("step")]
    validations = [
        (step, values["validation_score"]) for step, values in metrics if values.get("validation_score") is not None
    ]
    if len(validations) < 2:
        return
    best_step, best_score = max(validations[:-1], key=lambda point: point[1])
    step, score = validations[-1]
    rewards = [(at, reward) for at, values in metrics if (reward := _training_reward(values)) is not None]
    reward_then = next((reward for at, reward in rewards if best_step <= at < step), None)
    reward_now = dict(rewards).get(step)
    if reward_then is None or reward_now is None:
        return
    if reward_now > reward_then and best_score - score > HACKING_MARGIN:
        reason = (
            f"between steps {best_step} and {step} the training reward rose from {reward_then:.3f} to "
            f"{reward_now:.3f} while the validation score fell from {best_score:.3f} to {score:.3f}: the policy "
            "may be exploiting the reward"
        )
        TrainingJob.objects.filter(pk=job.pk, flagged=False).update(flagged=True, flag_reason=reason)


def job_metrics_record(*, job: TrainingJob, api_key: ApiKey, step: int, values: Mapping[str, Any]) -> TrainingMetric:
    job = job_held(job=job, api_key=api_key)
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise JobInvalid("step must be a whole number, 0 or more", errors=[{"field": "step", "message": "not a step"}])
    clean = {
        str(key): value
        for key, value in values.items()
        if value is None or (isinstance(value, int | float) and not isinstance(value, bool))
    }
    metric, _ = TrainingMetric.objects.update_or_create(job=job, step=step, defaults={"values": clean})
    TrainingJob.objects.filter(pk=job.pk).update(heartbeat_at=timezone.now(), steps_done=Greatest("steps_done", step))
    _flag_check(job)
    return metric


def adapter_dir() -> Path:
    folder = Path(settings.MEDIA_ROOT) / "adapters"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _adapter_write(job: TrainingJob, stream: BinaryIO) -> Path:
    """Copy the uploaded tar.gz to the adapters folder in chunks (an adapter can be far larger than the
    request bodies Keel keeps in memory); a partial file never takes the adapter's name."""
    path = adapter_dir() / f"job-{job.pk}-adapter.tar.gz"
    partial = path.with_suffix(".partial")
    written = 0
    try:
        with partial.open("wb") as out:
            while chunk := stream.read(1024 * 1024):
                if written == 0 and chunk[:2] != b"\x1f\x8b":
                    raise JobInvalid("send the adapter as a tar.gz", errors=[{"field": "body", "message": "not gzip"}])
                written += len(chunk)
                if written > MAX_ADAPTER_BYTES:
                    raise JobInvalid("the adapter is too large", errors=[{"field": "body", "message": "over 2 GiB"}])
                out.write(chunk)
        if written == 0:
            raise JobInvalid("send the adapter or its location", errors=[{"field": "body", "message": "empty"}])
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    partial.replace(path)
    return path


def job_adapter_store(
    *, job: TrainingJob, api_key: ApiKey, content: bytes | BinaryIO | None = None, location: str = ""
) -> TrainingJob:
    """Keep the adapter (bytes or a readable stream of a tar.gz) or the location where the worker stored it."""
    job = job_held(job=job, api_key=api_key)
    if content is not None:
        stream = io.BytesIO(content) if isinstance(content, bytes) else content
        path = _adapter_write(job, stream)
        TrainingJob.objects.filter(pk=job.pk).update(adapter_path=str(path))
    elif location:
        TrainingJob.objects.filter(pk=job.pk).update(adapter_location=location[:1000])
    else:
        raise JobInvalid("send the adapter or its location", errors=[{"field": "body", "message": "empty"}])
    job.refresh_from_db()
    return job


def _free_name(base: str, taken: Callable[[str], bool], limit: int) -> str:
    """`base`, or `base-2`, `base-3`, ... (within `limit` characters): the first that `taken` says is free."""
    name, number = base[:limit], 1
    while taken(name):
        number += 1
        suffix = f"-{number}"
        name = base[: limit - len(suffix)] + suffix
    return name


def _register(job: TrainingJob) -> None:
    """The trained model as a model target (when the job says how it is served), and an eval run of the
    comparison suite on it with the suite's latest run as the incumbent baseline."""
    from evals import runs
    from evals.models import Run, RunStatus, Suite, SuiteTarget
    from routing import services as routing_services
    from routing.models import ModelTarget

    serve = job.config.get("serve")
    if not isinstance(serve, Mapping):
        return
    # A person may have taken the name already; the worker's report must not fail on that, nor reuse theirs.
    aliases = ModelTarget.objects.filter(workspace=job.workspace)
    target = routing_services.model_target_create(
        workspace=job.workspace,
        alias=_free_name(f"trained-{job.pk}", lambda name: aliases.filter(alias=name).exists(), 100),
        model=str(serve["model"]),
        api_base=str(serve.get("api_base") or ""),
        tier="single_call",
    )
    TrainingJob.objects.filter(pk=job.pk).update(model_target=target)
    suite_name = job.config.get("compare_suite")
    suite = Suite.objects.filter(workspace=job.workspace, name=suite_name).first() if suite_name else None
    if suite is None or suite.dataset is None:
        return
    incumbent = Run.objects.filter(suite=suite, status=RunStatus.COMPLETED).order_by("-finished_at").first()
    suites = Suite.objects.filter(workspace=job.workspace)
    candidate_suite = Suite.objects.create(
        workspace=job.workspace,
        name=_free_name(f"{suite.name}-trained-{job.pk}", lambda name: suites.filter(name=name).exists(), 200),
        agent=suite.agent,
        description=f"{suite.name} on the model trained by job {job.pk}",
        dataset=suite.dataset,
        dataset_version=suite.dataset_version,
        target=SuiteTarget.MODEL_TARGET,
        model_target=target,
        samples=suite.samples,
        concurrency=suite.concurrency,
        variables=suite.variables,
    )
    for link in suite.suite_evaluators.all():
        candidate_suite.suite_evaluators.create(evaluator=link.evaluator, position=link.position)
    run = runs.run_create(suite=candidate_suite, idempotency_key=f"training-job-{job.pk}")
    if incumbent is not None:
        Run.objects.filter(pk=run.pk).update(baseline=incumbent)
    TrainingJob.objects.filter(pk=job.pk).update(comparison_run=run)


@transaction.atomic
def job_finish(*, job: TrainingJob, api_key: ApiKey, status: str, error: str = "") -> TrainingJob:
    job = job_held(job=job, api_key=api_key)
    if status not in (JobStatus.SUCCEEDED, JobStatus.FAILED):
        raise JobInvalid("status is succeeded or failed", errors=[{"field": "status", "message": "unknown"}])
    if status == JobStatus.SUCCEEDED and not (job.adapter_path or job.adapter_location):
        raise JobInvalid(
            "a job succeeds with its adapter: upload it (or its location) first",
            errors=[{"field": "status", "message": "no adapter yet"}],
        )
    TrainingJob.objects.filter(pk=job.pk).update(status=status, error=error[:4000], finished_at=timezone.now())
    job.refresh_from_db()
    if status == JobStatus.SUCCEEDED:
        _register(job)
        job.refresh_from_db()
    return job


def job_cancel(*, job: TrainingJob) -> TrainingJob:
    TrainingJob.objects.filter(pk=job.pk, status__in=[JobStatus.QUEUED, JobStatus.RUNNING]).update(
        status=JobStatus.CANCELLED, finished_at=timezone.now()
    )
    job.refresh_from_db()
    return job
