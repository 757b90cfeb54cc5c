"""The whole path on the CPU: an eval run's answers are curated into groups, exported as ART through the
API, a training job is made, the real GPU worker command (here on the CPU, with a tiny model this test
builds) claims it from a live Keel, trains, reports and uploads, and Keel registers the trained model as a
model target with an eval run against the incumbent. Also the worker side's refusals (409)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from django.test import Client

from agent_registry import services as registry_services
from evals.models import Run, RunStatus
from routing.models import ModelTarget
from trainer_bridge import jobs, services, worker
from trainer_bridge.models import Export, JobStatus, TrainingJob
from trainer_bridge.tests.test_exports import _curation
from trainer_bridge.tiny import tiny_model_dir, toy_corpus

pytestmark = pytest.mark.django_db(transaction=True)


def _client(workspace: Any, scopes: tuple[str, ...] = ("read", "write")) -> tuple[Client, str]:
    _, raw = registry_services.apikey_create(workspace=workspace, name="trainer", scopes=list(scopes))
    return Client(headers={"Authorization": f"Bearer {raw}"}), raw


def _post(client: Client, path: str, body: Any) -> Any:
    return client.post(path, data=json.dumps(body), content_type="application/json")


def test_from_curation_to_a_registered_model_target_through_the_worker(
    gateway: Any,
    run: Any,
    live_server: Any,
    tmp_path: Path,
) -> None:
    client, _ = _client(gateway.workspace)
    _, worker_key = _client(gateway.workspace, ("train",))
    curation = _curation(gateway, run)
    preview = client.get(f"/api/v1/curations/{curation.name}/preview").json()
    assert preview["groups"] == 2
    with mock.patch("trainer_bridge.tasks.export_execute.delay"):
        queued = _post(client, f"/api/v1/curations/{curation.name}/exports", {"format": "art"})
    assert queued.status_code == 202, queued.content
    services.export_execute(export_id=queued.json()["id"])
    export = client.get(f"/api/v1/exports/{queued.json()['id']}").json()
    assert export["status"] == "succeeded"

    base = tiny_model_dir(tmp_path / "base", vocab_corpus=toy_corpus())
    created = _post(
        client,
        "/api/v1/training-jobs",
        {
            "export": export["id"],
            "method": "grpo",
            "base_model": str(base),
            "config": {"steps": 3, "batch_size": 2, "validation_every": 2},
            "serve": {"model": "openai/ride-support-grpo", "api_base": "http://127.0.0.1:9/v1"},
            "compare_suite": run.suite.name,
        },
    )
    assert created.status_code == 201, created.content
    job_id = created.json()["id"]

    # The worker command, as a GPU machine runs it (the comparison run it leads to is queued, not executed).
    with mock.patch("evals.runs.run_dispatch"):
        code = worker.main(
            ["--api", live_server.url, "--key", worker_key, "--once", "--work-dir", str(tmp_path / "work")]
        )

    assert code == 0
    job = TrainingJob.objects.get(pk=job_id)
    assert job.status == JobStatus.SUCCEEDED, job.error
    assert job.steps_done == 3
    steps = {metric.step: metric.values for metric in job.metrics.all()}
    assert {1, 2, 3} <= set(steps)
    assert {"loss", "reward_mean", "reward_std", "advantage_mean", "kl", "policy_reward"} <= set(steps[1])
    assert Path(job.adapter_path).read_bytes()[:2] == b"\x1f\x8b"
    assert job.model_target_id is not None
    assert job.comparison_run_id is not None
    target = ModelTarget.objects.get(pk=job.model_target_id)
    assert (target.alias, target.model) == (f"trained-{job.pk}", "openai/ride-support-grpo")
    comparison = Run.objects.get(pk=job.comparison_run_id)
    assert comparison.model_target_id == target.pk
    assert comparison.baseline_id == run.pk
    assert comparison.status == RunStatus.QUEUED
    shown = client.get(f"/api/v1/training-jobs/{job_id}").json()
    assert shown["model_target"] == target.alias
    assert [point["step"] for point in shown["metrics"]] == sorted(steps)


def test_a_worker_that_does_not_hold_the_job_gets_409(gateway: Any, run: Any) -> None:
    client, _ = _client(gateway.workspace)
    gpu_1, _ = _client(gateway.workspace, ("train",))
    gpu_2, _ = _client(gateway.workspace, ("train",))
    curation = _curation(gateway, run)
    with mock.patch("trainer_bridge.tasks.export_execute.delay"):
        export_id = _post(client, f"/api/v1/curations/{curation.name}/exports", {"format": "art"}).json()["id"]
    services.export_execute(export_id=export_id)
    with mock.patch("trainer_bridge.tasks.export_execute.delay"):
        held_out = _post(client, f"/api/v1/curations/{curation.name}/exports", {"format": "art"}).json()["id"]
    services.export_execute(export_id=held_out)
    job_id = _post(
        client,
        "/api/v1/training-jobs",
        {"export": export_id, "method": "grpo", "base_model": "tiny", "config": {}, "validation_export": held_out},
    ).json()["id"]

    claimed = _post(gpu_1, "/api/v1/training-jobs/claim", {"worker": "gpu-1"})
    assert (claimed.status_code, claimed.json()["id"]) == (200, job_id)
    assert claimed.json()["validation_url"] == f"/api/v1/training-jobs/{job_id}/data/validation"
    assert _post(gpu_2, "/api/v1/training-jobs/claim", {"worker": "gpu-2"}).status_code == 204
    train_data = gpu_1.get(claimed.json()["export_url"])
    assert train_data.status_code == 200
    served = b"".join(train_data.streaming_content)  # type: ignore[attr-defined]
    assert served == Path(Export.objects.get(pk=export_id).path).read_bytes()

    for path, body in (
        (f"/api/v1/training-jobs/{job_id}/heartbeat", {}),
        (f"/api/v1/training-jobs/{job_id}/metrics", {"step": 1, "metrics": {"loss": 1.0}}),
        (f"/api/v1/training-jobs/{job_id}/finish", {"status": "failed", "error": "not mine"}),
    ):
        refused = _post(gpu_2, path, body)
        assert (refused.status_code, refused.json()["code"]) == (409, "training_job_not_held"), path
    not_held = gpu_2.get(f"/api/v1/training-jobs/{job_id}/data/train")
    assert (not_held.status_code, not_held.json()["code"]) == (409, "training_job_not_held")
    assert TrainingJob.objects.get(pk=job_id).status == JobStatus.RUNNING
    assert _post(gpu_1, f"/api/v1/training-jobs/{job_id}/heartbeat", {}).status_code == 204
    # Succeeding needs the adapter first.
    early = _post(gpu_1, f"/api/v1/training-jobs/{job_id}/finish", {"status": "succeeded"})
    assert (early.status_code, early.json()["errors"][0]["field"]) == (422, "status")


def test_a_worker_key_reaches_only_the_workers_calls(gateway: Any, run: Any) -> None:
    """A `train` key on a GPU machine claims jobs and reads their data; it cannot read or change anything else,
    and a `read`/`write` key cannot act as a worker."""
    client, _ = _client(gateway.workspace)
    gpu, _ = _client(gateway.workspace, ("train",))
    curation = _curation(gateway, run)
    export = services.export_create(curation=curation, format="art", dispatch=False)
    services.export_execute(export_id=export.pk)

    for path in ("/api/v1/curations", f"/api/v1/exports/{export.pk}/download", "/api/v1/training-jobs"):
        refused = gpu.get(path)
        assert (refused.status_code, refused.json()["code"]) == (403, "insufficient_scope"), path
    refused = _post(gpu, "/api/v1/training-jobs", {"export": export.pk, "method": "grpo", "base_model": "tiny"})
    assert refused.status_code == 403
    as_worker = _post(client, "/api/v1/training-jobs/claim", {"worker": "laptop"})
    assert (as_worker.status_code, as_worker.json()["code"]) == (403, "insufficient_scope")


def test_a_job_on_the_wrong_export_format_is_refused(gateway: Any, run: Any) -> None:
    curation = _curation(gateway, run)
    export = services.export_create(curation=curation, format="trl_sft", dispatch=False)
    services.export_execute(export_id=export.pk)
    export.refresh_from_db()
    with pytest.raises(jobs.JobInvalid) as refused:
        jobs.job_create(export=export, method="grpo", base_model="tiny")
    assert refused.value.extra["errors"][0]["field"] == "export"
    with pytest.raises(jobs.JobInvalid) as bad_config:
        jobs.job_create(export=export, method="sft", base_model="tiny", config={"steps": 0, "colour": "red"})
    assert bad_config.value.extra["errors"][0]["field"].startswith("config.")


@pytest.mark.parametrize(
    ("serve", "field"),
    [
        ({"model": ""}, "serve.model"),
        ({"model": "   "}, "serve.model"),
        ({"model": "hosted_vllm/" + "a" * 300}, "serve.model"),
        ({"model": "hosted_vllm/adapter", "api_base": "not a url"}, "serve.api_base"),
        ({"model": "hosted_vllm/adapter", "api_base": "ftp://models.example.com/v1"}, "serve.api_base"),
        ({"model": "hosted_vllm/adapter", "api_base": "http://vllm:99999/v1"}, "serve.api_base"),
    ],
)
def test_a_job_whose_model_target_could_not_be_registered_is_refused_when_made(
    gateway: Any, run: Any, serve: dict[str, Any], field: str
) -> None:
    # These were accepted, and the worker's `finish` was refused with 422 once it had trained: the job could
    # never succeed.
    curation = _curation(gateway, run)
    export = services.export_create(curation=curation, format="art", dispatch=False)
    services.export_execute(export_id=export.pk)
    export.refresh_from_db()

    with pytest.raises(jobs.JobInvalid) as refused:
        jobs.job_create(export=export, method="grpo", base_model="tiny", serve=serve)

    assert [error["field"] for error in refused.value.extra["errors"]] == [field]
    assert not TrainingJob.objects.exists()
    # A bare host name, as a Compose service's, is a valid API base.
    made = jobs.job_create(
        export=export,
        method="grpo",
        base_model="tiny",
        serve={"model": "hosted_vllm/a", "api_base": "http://vllm:8000/v1"},
    )
    assert made.config["serve"] == {"model": "hosted_vllm/a", "api_base": "http://vllm:8000/v1"}


def _held_job(gateway: Any, run: Any) -> tuple[TrainingJob, Any]:
    """A GRPO job on an ART export of the run, claimed by a worker's `train` key: (job, key)."""
    curation = _curation(gateway, run)
    export = services.export_create(curation=curation, format="art", dispatch=False)
    services.export_execute(export_id=export.pk)
    export.refresh_from_db()
    job = jobs.job_create(export=export, method="grpo", base_model="tiny")
    _, raw = _client(gateway.workspace, ("train",))
    key = registry_services.apikey_authenticate(raw_key=raw)
    assert key is not None
    assert jobs.job_claim(api_key=key, worker="gpu") is not None
    return job, key


def test_reward_rising_while_validation_falls_flags_the_job(gateway: Any, run: Any) -> None:
    job, key = _held_job(gateway, run)
    series = [
        (0, {"validation_score": 0.60}),
        (1, {"policy_reward": 0.40}),
        (2, {"policy_reward": 0.55, "validation_score": 0.62}),
        (3, {"policy_reward": 0.70}),
        (4, {"policy_reward": 0.85, "validation_score": 0.50}),
    ]
    for step, values in series[:3]:
        jobs.job_metrics_record(job=job, api_key=key, step=step, values=values)
    assert not TrainingJob.objects.get(pk=job.pk).flagged
    for step, values in series[3:]:
        jobs.job_metrics_record(job=job, api_key=key, step=step, values=values)
    flagged = TrainingJob.objects.get(pk=job.pk)
    assert flagged.flagged
    assert "0.620 to 0.500" in flagged.flag_reason


def test_a_slow_slide_from_the_best_validation_while_the_training_reward_climbs_flags_the_job(
    gateway: Any,
    run: Any,
) -> None:
    """No two validations in a row differ by the margin; the slide from the best one does."""
    job, key = _held_job(gateway, run)
    validations = [(0, 0.227, 0.30), (4, 0.212, 0.34), (8, 0.209, 0.36), (12, 0.197, 0.41)]
    for step, score, trained in validations[:3]:
        jobs.job_metrics_record(
            job=job, api_key=key, step=step, values={"validation_score": score, "train_policy_reward": trained}
        )
    assert not TrainingJob.objects.get(pk=job.pk).flagged  # 0.018 below the best: not yet past the margin
    step, score, trained = validations[3]
    jobs.job_metrics_record(
        job=job, api_key=key, step=step, values={"validation_score": score, "train_policy_reward": trained}
    )
    flagged = TrainingJob.objects.get(pk=job.pk)
    assert flagged.flagged
    assert "steps 0 and 12" in flagged.flag_reason
    assert "0.300 to 0.410" in flagged.flag_reason


def test_a_falling_validation_with_a_falling_training_reward_is_not_flagged(
    gateway: Any,
    run: Any,
) -> None:
    job, key = _held_job(gateway, run)
    for step, score, trained in [(0, 0.60, 0.50), (5, 0.50, 0.45), (10, 0.40, 0.40)]:
        jobs.job_metrics_record(
            job=job, api_key=key, step=step, values={"validation_score": score, "train_policy_reward": trained}
        )
    assert not TrainingJob.objects.get(pk=job.pk).flagged  # worse everywhere: a bad run, not reward hacking


def test_a_crashed_workers_job_is_reclaimed_after_its_lease(gateway: Any, run: Any) -> None:
    from datetime import timedelta

    from django.utils import timezone

    curation = _curation(gateway, run)
    export = services.export_create(curation=curation, format="art", dispatch=False)
    services.export_execute(export_id=export.pk)
    export.refresh_from_db()
    job = jobs.job_create(export=export, method="grpo", base_model="tiny", lease_seconds=60)
    first, second = (
        registry_services.apikey_authenticate(raw_key=_client(gateway.workspace, ("train",))[1]) for _ in range(2)
    )
    assert first is not None
    assert second is not None
    assert jobs.job_claim(api_key=first, worker="gpu-1") is not None
    assert jobs.job_claim(api_key=second, worker="gpu-2") is None  # held while its heartbeats come

    # gpu-1 dies: no heartbeat for longer than the lease.
    TrainingJob.objects.filter(pk=job.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=61))
    reclaimed = jobs.job_claim(api_key=second, worker="gpu-2")

    assert reclaimed is not None
    assert (reclaimed.pk, reclaimed.worker, reclaimed.attempts) == (job.pk, "gpu-2", 2)
    with pytest.raises(jobs.JobNotHeld):  # gpu-1 comes back: the job is no longer its own
        jobs.job_heartbeat(job=job, api_key=first)
    jobs.job_heartbeat(job=job, api_key=second)


def test_an_adapter_larger_than_the_request_body_limit_is_streamed_to_disk(
    gateway: Any,
    run: Any,
    settings: Any,
) -> None:
    import gzip
    import os

    client, _ = _client(gateway.workspace, ("read", "write", "train"))
    curation = _curation(gateway, run)
    export = services.export_create(curation=curation, format="art", dispatch=False)
    services.export_execute(export_id=export.pk)
    job_id = _post(
        client, "/api/v1/training-jobs", {"export": export.pk, "method": "grpo", "base_model": "tiny"}
    ).json()["id"]
    assert _post(client, "/api/v1/training-jobs/claim", {"worker": "gpu"}).status_code == 200
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024  # far below the adapter's size
    adapter = gzip.compress(os.urandom(64 * 1024))

    not_gzip = client.post(f"/api/v1/training-jobs/{job_id}/adapter", data=b"x" * 4096, content_type="application/gzip")
    assert (not_gzip.status_code, not_gzip.json()["errors"][0]["message"]) == (422, "not gzip")
    assert not TrainingJob.objects.get(pk=job_id).adapter_path
    stored = client.post(f"/api/v1/training-jobs/{job_id}/adapter", data=adapter, content_type="application/gzip")

    assert stored.status_code == 204, stored.content
    assert Path(TrainingJob.objects.get(pk=job_id).adapter_path).read_bytes() == adapter
    assert not list(jobs.adapter_dir().glob("*.partial"))


def test_a_finished_job_registers_under_a_free_name_when_a_person_took_its_own(
    gateway: Any, run: Any, monkeypatch: Any
) -> None:
    # The worker's `finish` was a 409 (alias taken) after training, and the comparison ran a person's suite.
    from evals.models import Suite
    from routing import services as routing_services

    monkeypatch.setattr("evals.runs.run_dispatch", lambda *args, **kwargs: None)
    curation = _curation(gateway, run)
    export = services.export_create(curation=curation, format="art", dispatch=False)
    services.export_execute(export_id=export.pk)
    export.refresh_from_db()
    job = jobs.job_create(
        export=export,
        method="grpo",
        base_model="tiny",
        serve={"model": "hosted_vllm/adapter", "api_base": "http://vllm:8000/v1"},
        compare_suite=run.suite.name,
    )
    theirs = routing_services.model_target_create(workspace=gateway.workspace, alias=f"trained-{job.pk}", model="x/y")
    their_suite = Suite.objects.create(workspace=gateway.workspace, name=f"{run.suite.name}-trained-{job.pk}")
    _, raw = _client(gateway.workspace, ("train",))
    key = registry_services.apikey_authenticate(raw_key=raw)
    assert key is not None
    assert jobs.job_claim(api_key=key, worker="gpu") is not None
    jobs.job_adapter_store(job=job, api_key=key, location="s3://adapters/job")

    finished = jobs.job_finish(job=job, api_key=key, status="succeeded")

    assert finished.status == JobStatus.SUCCEEDED
    target, comparison = finished.model_target, finished.comparison_run
    assert target is not None
    assert comparison is not None
    assert comparison.suite is not None
    assert (target.alias, target.model) == (f"trained-{job.pk}-2", "hosted_vllm/adapter")
    assert ModelTarget.objects.get(pk=theirs.pk).model == "x/y"
    assert comparison.suite.name == f"{run.suite.name}-trained-{job.pk}-2"
    assert comparison.suite_id != their_suite.pk


def test_a_job_whose_worker_died_on_every_attempt_fails_rather_than_running_for_ever(
    gateway: Any, run: Any, api_client_for: Any
) -> None:
    """Before, a job lost on its last attempt was never claimed again and said "running" with no error."""
    from datetime import timedelta

    from django.utils import timezone

    from trainer_bridge import tasks

    job, key = _held_job(gateway, run)
    for attempt in range(2, jobs.MAX_ATTEMPTS + 1):
        TrainingJob.objects.filter(pk=job.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=301))
        assert jobs.job_claim(api_key=key, worker=f"gpu-{attempt}") is not None
    job.refresh_from_db()
    assert (job.status, job.attempts) == ("running", jobs.MAX_ATTEMPTS)

    # A live last attempt is left alone.
    tasks.training_jobs_expire()
    job.refresh_from_db()
    assert job.status == "running"

    TrainingJob.objects.filter(pk=job.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=301))
    tasks.training_jobs_expire()

    job.refresh_from_db()
    assert job.status == "failed"
    assert job.finished_at is not None
    assert f"{jobs.MAX_ATTEMPTS} attempts" in job.error
    shown = api_client_for(gateway.workspace, scopes=("read",)).get(f"/api/v1/training-jobs/{job.pk}").json()
    assert (shown["status"], shown["error"]) == ("failed", job.error)


def test_a_claim_fails_the_workspaces_exhausted_jobs_and_takes_the_next(gateway: Any, run: Any) -> None:
    from datetime import timedelta

    from django.utils import timezone

    job, key = _held_job(gateway, run)
    TrainingJob.objects.filter(pk=job.pk).update(
        attempts=jobs.MAX_ATTEMPTS, heartbeat_at=timezone.now() - timedelta(seconds=301)
    )
    waiting = jobs.job_create(export=job.export, method="grpo", base_model="tiny")

    claimed = jobs.job_claim(api_key=key, worker="gpu")

    assert claimed is not None
    assert claimed.pk == waiting.pk
    job.refresh_from_db()
    assert job.status == "failed"
