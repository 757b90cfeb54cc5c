"""The training pages: the curation builder and its live preview, saving and editing a curation (errors beside
the fields, nothing saved), one-click exports and their refusals, an export's progress, cancel, manifest and
download, and training jobs: the form, the page's metric charts and polling, the reward-hacking flag, the
adapter, the model target and the comparison run. Built through trainer_bridge's services on an eval run
whose k answers per item form groups (trainer_bridge/tests/conftest.py)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from agent_registry import services as registry_services
from agent_registry.models import ApiKey, Role, Workspace
from agent_registry.tests.factories import MembershipFactory, UserFactory
from evals.models import Run
from routing.models import ModelTarget
from trainer_bridge import jobs, services
from trainer_bridge.curation import QUERY_KEYS
from trainer_bridge.models import Curation, Export, JobStatus, TrainingJob, TrainingMetric
from trainer_bridge.tests import conftest as training_fixtures
from trainer_bridge.tests.test_exports import _curation, _ingest, _receipt, _receipts

fake = training_fixtures.fake
gateway = training_fixtures.gateway
media = training_fixtures.media
run = training_fixtures.run

pytestmark = pytest.mark.django_db

# The builder's form for test_exports' curation: the run's answers, grouped by item, rewarded by says_ok.
BUILDER = {
    "grouping": "dataset_item",
    "reward_source": "run_score",
    "reward_name": "says_ok",
    "min_group_size": "2",
    "drop_unrewarded": "on",
    "drop_equal_rewards": "on",
    "dedupe": "on",
    "dedupe_threshold": "0.9",
    "validation_share": "0",
}


def _client(workspace: Workspace, role: Role = Role.MEMBER, username: str = "mia") -> Client:
    user = UserFactory.create(username=username)
    MembershipFactory.create(workspace=workspace, user=user, role=role)
    client = Client()
    client.force_login(user)
    return client


def _state() -> dict[str, list[Any]]:
    return {
        "curations": list(Curation.objects.order_by("pk").values_list("pk", "name", "query", "reward", "filters")),
        "exports": list(Export.objects.order_by("pk").values_list("pk", "status")),
        "jobs": list(TrainingJob.objects.order_by("pk").values_list("pk", "status")),
    }


def _finished(curation: Curation, format: str = "art") -> Export:
    export = services.export_create(curation=curation, format=format, dispatch=False)
    done = services.export_execute(export_id=export.pk)
    assert done is not None
    assert done.status == JobStatus.SUCCEEDED, done.error
    return done


def _worker_key(workspace: Workspace) -> ApiKey:
    key, _ = registry_services.apikey_create(workspace=workspace, name="gpu", scopes=["train"])
    return key


# --- The builder ---------------------------------------------------------------------------------------


def test_the_builder_previews_the_form_without_saving(gateway: Any, run: Run) -> None:
    client = _client(gateway.workspace)
    ws = gateway.workspace.slug

    response = client.post(f"/w/{ws}/training/curations/preview/", {**BUILDER, "runs": [str(run.pk)]})

    assert response.status_code == 200
    preview = response.context["preview"]
    assert (preview["trajectories"], preview["groups"], preview["rollouts"]) == (16, 2, 4)
    assert (preview["rewards"]["min"], preview["rewards"]["max"]) == (0.0, 1.0)
    assert [(bar.label, bar.count) for bar in response.context["size_bars"]] == [("2", 2)]
    content = response.content.decode()
    assert '<div class="stat-value" data-preview-groups>2</div>' in content
    assert '<div class="stat-value" data-preview-rollouts>4</div>' in content
    assert not Curation.objects.exists()
    # Without dedupe the identical answers stay: the preview follows the form.
    again = client.post(f"/w/{ws}/training/curations/preview/", {**BUILDER, "runs": [str(run.pk)], "dedupe": ""})
    assert again.context["preview"]["rollouts"] == 8


def test_the_preview_names_what_is_wrong(gateway: Any, run: Run) -> None:
    client = _client(gateway.workspace)

    response = client.post(
        f"/w/{gateway.workspace.slug}/training/curations/preview/",
        {**BUILDER, "reward_source": "score", "reward_name": "", "advanced_query": '{"colour": "red"}'},
    )

    assert response.status_code == 200
    assert "preview" not in response.context
    problems = response.context["problems"]
    assert any(problem.startswith("query.colour: unknown") for problem in problems)
    assert "reward.name: name the score" in problems
    assert "No preview: fix these first." in response.content.decode()


def test_saving_the_builder_makes_the_curation(gateway: Any, run: Run) -> None:
    client = _client(gateway.workspace)
    ws = gateway.workspace.slug

    response = client.post(
        f"/w/{ws}/training/curations/new/",
        {**BUILDER, "name": "from-run", "runs": [str(run.pk)], "tags": "refund, urgent", "status": "ok"},
    )

    assert response.status_code == 302
    assert response["Location"] == f"/w/{ws}/training/curations/from-run/"
    curation = Curation.objects.get(workspace=gateway.workspace)
    assert curation.query == {"runs": [run.pk], "tags": ["refund", "urgent"], "status": "ok"}
    assert curation.grouping == "dataset_item"
    assert curation.reward == {"source": "run_score", "evaluator": "says_ok"}
    assert curation.filters == {
        "min_group_size": 2,
        "drop_unrewarded": True,
        "drop_equal_rewards": True,
        "dedupe": True,
        "dedupe_threshold": 0.9,
        "balance": False,
        "validation_share": 0.0,
    }


def test_a_bad_curation_is_refused_beside_its_fields_and_nothing_is_saved(gateway: Any, run: Run) -> None:
    client = _client(gateway.workspace)
    url = f"/w/{gateway.workspace.slug}/training/curations/new/"

    response = client.post(
        url,
        {
            **BUILDER,
            "name": "bad",
            "reward_source": "mix",
            "reward_parts": '[{"source": "score", "name": "helpful", "weight": -1}]',
            "advanced_query": '{"colour": "red"}',
            "max_group_size": "1",
        },
    )

    assert response.status_code == 422
    errors = response.context["form"].errors
    assert errors["advanced_query"] == ["query.colour: unknown; use " + ", ".join(QUERY_KEYS)]
    assert errors["reward_parts"] == ["reward.parts[0].weight: a positive number"]
    assert not Curation.objects.exists()
    assert "Nothing was saved: fix what is marked below." in response.content.decode()
    # The filters are checked once the query and reward pass: their error is beside the field.
    response = client.post(url, {**BUILDER, "name": "bad", "max_group_size": "1"})
    assert response.context["form"].errors["max_group_size"] == [
        "filters.max_group_size: must be at least min_group_size (2)"
    ]
    # Not JSON, and a name taken, beside their fields.
    _curation(gateway, run)
    response = client.post(url, {**BUILDER, "name": "from-run", "advanced_query": "{bad"})
    assert response.context["form"].errors["advanced_query"][0].startswith("not JSON")
    response = client.post(url, {**BUILDER, "name": "from-run"})
    assert response.context["form"].errors["name"] == ["a curation named 'from-run' exists; choose another name."]
    assert Curation.objects.count() == 1


def test_editing_a_curation_keeps_what_its_exports_said(gateway: Any, run: Run) -> None:
    curation = _curation(gateway, run)
    export = _finished(curation)
    client = _client(gateway.workspace)
    url = f"/w/{gateway.workspace.slug}/training/curations/{curation.name}/edit/"

    form = client.get(url).context["form"]
    assert form.initial["runs"] == [str(run.pk)]
    assert form.initial["reward_name"] == "says_ok"
    response = client.post(url, {**BUILDER, "runs": [str(run.pk)], "dedupe": "", "description": "no dedupe"})

    assert response.status_code == 302
    curation.refresh_from_db()
    assert curation.filters["dedupe"] is False
    assert curation.description == "no dedupe"
    export.refresh_from_db()
    assert export.curation_snapshot["filters"] == {}
    refused = client.post(url, {**BUILDER, "reward_source": "score", "reward_name": ""})
    assert refused.status_code == 422
    assert refused.context["form"].errors["reward_name"] == ["reward.name: name the score"]
    curation.refresh_from_db()
    assert curation.reward == {"source": "run_score", "evaluator": "says_ok"}


# --- A curation's page and its exports -----------------------------------------------------------------


def test_the_curation_page_shows_its_settings_export_buttons_and_preview(gateway: Any, run: Run) -> None:
    curation = _curation(gateway, run)
    client = _client(gateway.workspace)
    url = f"/w/{gateway.workspace.slug}/training/curations/{curation.name}/"

    page = client.get(url).content.decode()
    partial = client.get(url + "?partial=preview", headers={"HX-Request": "true"})

    assert "<code data-grouping>dataset_item</code>" in page
    assert "Export as ART trajectory groups</button>" in page
    assert "Export as TRL DPO</button>" in page
    assert f'hx-get="{url}?partial=preview"' in page
    assert partial.context["preview"]["groups"] == 2
    assert '<div class="stat-value" data-preview-groups>2</div>' in partial.content.decode()


def test_one_click_exports_the_curation(gateway: Any, run: Run, django_capture_on_commit_callbacks: Any) -> None:
    curation = _curation(gateway, run)
    client = _client(gateway.workspace)
    ws = gateway.workspace.slug

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = client.post(f"/w/{ws}/training/curations/{curation.name}/export/", {"format": "art"})

    export = Export.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/w/{ws}/training/exports/{export.pk}/"
    assert (export.format, export.status, export.groups_total) == ("art", JobStatus.QUEUED, 2)
    assert len(callbacks) == 1  # the task that writes the file
    page = client.get(response["Location"]).content.decode()
    assert "Exporting from-run as ART trajectory groups: 2 groups." in page


def test_a_refused_export_says_why_and_writes_nothing(gateway: Any, run: Run) -> None:
    everything_equal = services.curation_create(
        workspace=gateway.workspace,
        name="all-equal",
        query={"runs": [run.pk]},
        grouping="dataset_item",
        reward={"source": "trajectory"},
        filters={"drop_unrewarded": False, "drop_equal_rewards": False},
    )
    client = _client(gateway.workspace)
    ws = gateway.workspace.slug

    response = client.post(f"/w/{ws}/training/curations/all-equal/export/", {"format": "trl_dpo"}, follow=True)

    assert response.redirect_chain == [(f"/w/{ws}/training/curations/{everything_equal.name}/", 302)]
    shown = [str(message) for message in response.context["messages"]]
    assert len(shown) == 1
    assert shown[0].startswith("Not exported as TRL DPO: ")
    assert not Export.objects.exists()


def test_an_export_page_follows_the_export_to_its_file(gateway: Any, run: Run) -> None:
    curation = _curation(gateway, run)
    export = services.export_create(curation=curation, format="art", dispatch=False)
    client = _client(gateway.workspace)
    url = f"/w/{gateway.workspace.slug}/training/exports/{export.pk}/"

    queued = client.get(url).content.decode()
    progress = client.get(url + "progress/").json()
    not_ready = client.get(url + "download/")

    assert f'data-progress-url="{url}progress/"' in queued
    assert "data-download" not in queued
    assert progress == {
        "status": "queued",
        "status_label": "Queued",
        "groups_done": 0,
        "groups_total": 2,
        "percent": 0.0,
        "polling": True,
        "bytes": 0,
        "error": "",
    }
    assert not_ready.status_code == 404

    done = services.export_execute(export_id=export.pk)
    assert done is not None

    progress = client.get(url + "progress/").json()
    assert (progress["status"], progress["groups_done"], progress["percent"], progress["polling"]) == (
        "succeeded",
        2,
        100.0,
        False,
    )
    page = client.get(url)
    content = page.content.decode()
    assert "data-progress-url" not in content
    assert f'href="{url}download/" data-download' in content
    assert f"<code data-manifest-sha256>{done.sha256}</code>" in content
    assert f"<dd data-manifest-version>{done.manifest['keel_version']}</dd>" in content
    assert "<dd data-manifest-groups>2</dd>" in content
    download = client.get(url + "download/")
    assert download.status_code == 200
    assert download["ETag"] == f'"{done.sha256}"'
    assert download.getvalue() == Path(done.path).read_bytes()


def test_the_preview_and_the_manifest_say_what_was_left_unpaired_for_a_prompt_mismatch(workspace: Workspace) -> None:
    _ingest(
        workspace,
        _receipt("You read receipts.", "Twelve euros.", 1.0),
        _receipt("You read receipts.", "No idea at all.", 0.0),
        _receipt("You read receipts. Answer in French.", "Je ne sais pas.", 0.0),
    )
    curation = _receipts(workspace)
    client = _client(workspace)
    url = f"/w/{workspace.slug}/training/curations/{curation.name}/"

    partial = client.get(url + "?partial=preview", headers={"HX-Request": "true"}).content.decode()
    export = _finished(curation, "trl_dpo")
    page = client.get(f"/w/{workspace.slug}/training/exports/{export.pk}/").content.decode()

    assert "<span data-preview-unpaired>1 rollouts unpaired: every rollout rewarded differently ran under another " in (
        partial
    )
    assert "<li data-manifest-note>1 rewarded rollouts were left unpaired: in their group, every rollout" in page
    # The same group, under two system prompts, is two groups to ART and NeMo Gym.
    assert "<span data-preview-mixed>1 group mixes prompts: ART and NeMo Gym exports make each prompt" in partial


def test_cancelling_an_export(gateway: Any, run: Run) -> None:
    export = services.export_create(curation=_curation(gateway, run), format="art", dispatch=False)
    client = _client(gateway.workspace)
    url = f"/w/{gateway.workspace.slug}/training/exports/{export.pk}/"
    assert "Cancel export</button>" in client.get(url).content.decode()

    response = client.post(url + "cancel/", follow=True)

    export.refresh_from_db()
    assert export.status == JobStatus.CANCELLED
    assert [str(m) for m in response.context["messages"]] == [
        f"Cancelled export #{export.pk}; its partial file is discarded."
    ]
    assert "Cancel export</button>" not in response.content.decode()
    again = client.post(url + "cancel/", follow=True)
    assert [str(m) for m in again.context["messages"]] == [f"Export #{export.pk} is cancelled: nothing to cancel."]


def test_the_exports_list_shows_each_export(gateway: Any, run: Run) -> None:
    curation = _curation(gateway, run)
    done = _finished(curation)
    queued = services.export_create(curation=curation, format="trl_sft", dispatch=False)
    client = _client(gateway.workspace)

    response = client.get(f"/w/{gateway.workspace.slug}/training/exports/")

    assert response.context["exports"] == [queued, done]
    content = response.content.decode()
    assert f'<tr data-export="{done.pk}">' in content
    assert 'data-status-badge="succeeded">Succeeded</span>' in content
    assert 'data-status-badge="queued">Queued</span>' in content
    listed = client.get(f"/w/{gateway.workspace.slug}/training/curations/").content.decode()
    assert f"#{queued.pk} TRL SFT</a>" in listed
    assert f'<a href="/w/{gateway.workspace.slug}/training/curations/" aria-current="page">' in listed


# --- Training jobs -------------------------------------------------------------------------------------


def test_a_job_is_queued_from_the_form(gateway: Any, run: Run) -> None:
    export = _finished(_curation(gateway, run))
    client = _client(gateway.workspace)
    ws = gateway.workspace.slug

    form = client.get(f"/w/{ws}/training/jobs/new/?export={export.pk}").context["form"]
    response = client.post(
        f"/w/{ws}/training/jobs/new/",
        {
            "name": "first try",
            "export": str(export.pk),
            "method": "grpo",
            "base_model": "Qwen/Qwen2.5-0.5B-Instruct",
            "steps": "20",
            "learning_rate": "0.0001",
            "lora_r": "16",
            "config": '{"kl_coef": 0.04}',
            "serve_model": "hosted_vllm/ride-support-grpo",
            "serve_api_base": "http://gpu.internal:8000/v1",
            "compare_suite": "answers",
        },
    )

    assert form.initial["export"] == str(export.pk)
    job = TrainingJob.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/w/{ws}/training/jobs/{job.pk}/"
    assert (job.name, job.method, job.base_model, job.status) == (
        "first try",
        "grpo",
        "Qwen/Qwen2.5-0.5B-Instruct",
        "queued",
    )
    assert job.config == {
        "steps": 20,
        "learning_rate": 0.0001,
        "lora_r": 16,
        "kl_coef": 0.04,
        "serve": {"model": "hosted_vllm/ride-support-grpo", "api_base": "http://gpu.internal:8000/v1"},
        "compare_suite": "answers",
    }


def test_a_bad_job_is_refused_beside_its_fields_and_nothing_is_made(gateway: Any, run: Run) -> None:
    export = _finished(_curation(gateway, run))
    client = _client(gateway.workspace)
    url = f"/w/{gateway.workspace.slug}/training/jobs/new/"
    fields = {"export": str(export.pk), "base_model": "tiny", "steps": "5", "learning_rate": "0.001", "lora_r": "8"}

    wrong_format = client.post(url, {**fields, "method": "sft"})
    unknown_setting = client.post(url, {**fields, "method": "grpo", "config": '{"colour": 1}'})
    not_json = client.post(url, {**fields, "method": "grpo", "config": "[1"})

    assert wrong_format.status_code == 422
    assert wrong_format.context["form"].errors["export"] == ["export: sft trains on a trl_sft export, not art"]
    assert unknown_setting.context["form"].errors["config"][0].startswith("config")
    assert not_json.context["form"].errors["config"][0].startswith("not JSON")
    assert "No job was made: fix what is marked below." in wrong_format.content.decode()
    assert not TrainingJob.objects.exists()


def test_a_job_served_from_an_api_base_that_is_not_http_is_refused_beside_that_field(gateway: Any, run: Run) -> None:
    # Django's URLField takes ftp://; the model target it would become refuses it, at the worker's finish.
    export = _finished(_curation(gateway, run))
    client = _client(gateway.workspace)
    fields = {"export": str(export.pk), "base_model": "tiny", "steps": "5", "learning_rate": "0.001", "lora_r": "8"}

    response = client.post(
        f"/w/{gateway.workspace.slug}/training/jobs/new/",
        {**fields, "method": "grpo", "serve_model": "hosted_vllm/a", "serve_api_base": "ftp://models.example.com/v1"},
    )

    assert response.status_code == 422
    assert "an http(s) URL with a host" in response.context["form"].errors["serve_api_base"][0]
    assert not TrainingJob.objects.exists()


def _job_with_a_history(gateway: Any, run: Run) -> TrainingJob:
    """A GRPO job a worker trained: reward up while the validation score fell (flagged), its adapter, and on
    success the model target with a comparison run against the suite's incumbent (`run`)."""
    export = _finished(_curation(gateway, run))
    job = jobs.job_create(
        export=export,
        method="grpo",
        base_model="tiny",
        config={"steps": 4},
        serve={"model": "hosted_vllm/trained"},
        compare_suite="answers",  # the suite of `run`
    )
    key = _worker_key(gateway.workspace)
    assert jobs.job_claim(api_key=key, worker="gpu-1") is not None
    for step, values in [
        (0, {"validation_score": 0.60}),
        (1, {"loss": 0.9, "reward_mean": 0.4, "policy_reward": 0.40, "kl": 0.0}),
        (2, {"loss": 0.7, "reward_mean": 0.4, "policy_reward": 0.55, "kl": 0.01, "validation_score": 0.62}),
        (3, {"loss": 0.5, "reward_mean": 0.4, "policy_reward": 0.70, "kl": 0.02}),
        (4, {"loss": 0.4, "reward_mean": 0.4, "policy_reward": 0.85, "kl": 0.03, "validation_score": 0.50}),
    ]:
        jobs.job_metrics_record(job=job, api_key=key, step=step, values=values)
    jobs.job_adapter_store(job=job, api_key=key, content=gzip.compress(b"lora weights"))
    jobs.job_finish(job=job, api_key=key, status=JobStatus.SUCCEEDED)
    job.refresh_from_db()
    assert job.flagged
    return job


def test_a_jobs_page_shows_its_charts_flag_adapter_model_target_and_comparison(gateway: Any, run: Run) -> None:
    job = _job_with_a_history(gateway, run)
    client = _client(gateway.workspace)
    ws = gateway.workspace.slug
    url = f"/w/{ws}/training/jobs/{job.pk}/"

    response = client.get(url)

    content = response.content.decode()
    assert '<div class="alert alert-error training-flag" role="alert" id="reward-hacking">' in content
    assert "rose from 0.550 to 0.850 while the validation score fell from 0.620 to 0.500" in content
    chart_data = json.loads(
        content.split('<script id="training-chart-data" type="application/json">')[1].split("</script>")[0]
    )
    assert chart_data["steps"] == [0, 1, 2, 3, 4]
    assert chart_data["series"]["validation_score"] == [0.6, None, 0.62, None, 0.5]
    assert chart_data["series"]["policy_reward"] == [None, 0.4, 0.55, 0.7, 0.85]
    assert [chart["keys"] for chart in chart_data["charts"]] == [
        ["loss"],
        ["reward_mean", "policy_reward", "train_policy_reward"],
        ["validation_score"],
        ["kl"],
    ]
    assert "data-metrics-url" not in content  # finished: nothing to poll
    assert f'href="/w/{ws}/training/jobs/{job.pk}/adapter/" download' in content
    assert job.model_target_id is not None
    assert job.comparison_run_id is not None
    target = ModelTarget.objects.get(pk=job.model_target_id)
    assert f'<a href="/w/{ws}/model-targets/{target.alias}/">{target.alias}</a>' in content
    comparison = Run.objects.get(pk=job.comparison_run_id)
    assert comparison.baseline_id == run.pk
    assert f'<a href="/w/{ws}/evals/runs/{comparison.pk}/">Run #{comparison.pk}</a>' in content
    assert f'href="/w/{ws}/evals/compare/?a={run.pk}&amp;b={comparison.pk}" data-compare' in content
    adapter = client.get(url + "adapter/")
    assert gzip.decompress(adapter.getvalue()) == b"lora weights"


def test_a_running_jobs_page_polls_its_metrics(gateway: Any, run: Run) -> None:
    export = _finished(_curation(gateway, run))
    job = jobs.job_create(export=export, method="grpo", base_model="tiny", config={"steps": 10})
    key = _worker_key(gateway.workspace)
    assert jobs.job_claim(api_key=key, worker="gpu-1") is not None
    jobs.job_metrics_record(job=job, api_key=key, step=1, values={"loss": 0.9})
    client = _client(gateway.workspace)
    url = f"/w/{gateway.workspace.slug}/training/jobs/{job.pk}/"

    content = client.get(url).content.decode()
    state = client.get(url + "metrics/").json()

    assert f'data-metrics-url="{url}metrics/"' in content
    assert 'id="reward-hacking" hidden>' in content
    assert "Step 1 of 10 on gpu-1" in content
    assert state == {
        "status": "running",
        "status_label": "Running",
        "steps_done": 1,
        "steps": 10,
        "flagged": False,
        "flag_reason": "",
        "polling": True,
        "metrics": {"steps": [1], "series": {"loss": [0.9]}},
    }
    # A step more and a flag appear in the next poll.
    TrainingMetric.objects.create(job=job, step=2, values={"loss": 0.8})
    TrainingJob.objects.filter(pk=job.pk).update(flagged=True, flag_reason="the reward rose")
    state = client.get(url + "metrics/").json()
    assert state["metrics"]["series"] == {"loss": [0.9, 0.8]}
    assert (state["flagged"], state["flag_reason"]) == (True, "the reward rose")


def test_cancelling_a_job(gateway: Any, run: Run) -> None:
    job = jobs.job_create(export=_finished(_curation(gateway, run)), method="grpo", base_model="tiny")
    client = _client(gateway.workspace)
    url = f"/w/{gateway.workspace.slug}/training/jobs/{job.pk}/"

    response = client.post(url + "cancel/", follow=True)

    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED
    assert [str(m) for m in response.context["messages"]] == [
        f"Cancelled training job #{job.pk}; its worker stops at its next call."
    ]
    listed = client.get(f"/w/{gateway.workspace.slug}/training/jobs/")
    assert listed.context["jobs"] == [job]


# --- Who may do what -----------------------------------------------------------------------------------


def test_a_viewer_reads_but_cannot_build_export_cancel_or_train(gateway: Any, run: Run) -> None:
    curation = _curation(gateway, run)
    done = _finished(curation)
    queued = services.export_create(curation=curation, format="trl_sft", dispatch=False)
    job = jobs.job_create(export=done, method="grpo", base_model="tiny")
    viewer = _client(gateway.workspace, Role.VIEWER, "vic")
    ws = gateway.workspace.slug
    before = _state()

    detail = viewer.get(f"/w/{ws}/training/curations/{curation.name}/").content.decode()
    refused = [
        viewer.post(f"/w/{ws}/training/curations/new/", {**BUILDER, "name": "mine"}),
        viewer.post(f"/w/{ws}/training/curations/preview/", BUILDER),
        viewer.post(f"/w/{ws}/training/curations/{curation.name}/edit/", {**BUILDER, "description": "x"}),
        viewer.post(f"/w/{ws}/training/curations/{curation.name}/export/", {"format": "art"}),
        viewer.post(f"/w/{ws}/training/exports/{queued.pk}/cancel/"),
        viewer.post(
            f"/w/{ws}/training/jobs/new/",
            {
                "export": str(done.pk),
                "method": "grpo",
                "base_model": "tiny",
                "steps": "1",
                "learning_rate": "1",
                "lora_r": "8",
            },
        ),
        viewer.post(f"/w/{ws}/training/jobs/{job.pk}/cancel/"),
    ]

    assert [response.status_code for response in refused] == [403] * 7
    assert _state() == before
    assert "Export as" not in detail
    assert "Exporting needs the member role." in detail
    assert "Cancel export" not in viewer.get(f"/w/{ws}/training/exports/{queued.pk}/").content.decode()
    assert "Cancel job" not in viewer.get(f"/w/{ws}/training/jobs/{job.pk}/").content.decode()
    builder = viewer.get(f"/w/{ws}/training/curations/new/").content.decode()
    assert "Save curation" not in builder
    assert "hx-post" not in builder


def test_another_workspaces_rows_are_not_found(gateway: Any, run: Run, other_workspace: Workspace) -> None:
    curation = _curation(gateway, run)
    done = _finished(curation)
    queued = services.export_create(curation=curation, format="trl_sft", dispatch=False)
    job = jobs.job_create(export=done, method="grpo", base_model="tiny")
    stranger = _client(other_workspace, Role.OWNER, "stranger")
    theirs = other_workspace.slug
    before = _state()

    reads = [
        f"/w/{theirs}/training/curations/{curation.name}/",
        f"/w/{theirs}/training/curations/{curation.name}/edit/",
        f"/w/{theirs}/training/exports/{done.pk}/",
        f"/w/{theirs}/training/exports/{done.pk}/progress/",
        f"/w/{theirs}/training/exports/{done.pk}/download/",
        f"/w/{theirs}/training/jobs/{job.pk}/",
        f"/w/{theirs}/training/jobs/{job.pk}/metrics/",
        f"/w/{theirs}/training/jobs/{job.pk}/adapter/",
        f"/w/{gateway.workspace.slug}/training/curations/",
    ]
    writes = [
        (f"/w/{theirs}/training/curations/{curation.name}/export/", {"format": "art"}),
        (f"/w/{theirs}/training/exports/{queued.pk}/cancel/", {}),
        (f"/w/{theirs}/training/jobs/{job.pk}/cancel/", {}),
        (
            f"/w/{theirs}/training/jobs/new/",
            {
                "export": str(done.pk),
                "method": "grpo",
                "base_model": "t",
                "steps": "1",
                "learning_rate": "1",
                "lora_r": "8",
            },
        ),
    ]

    assert [stranger.get(url).status_code for url in reads] == [404] * len(reads)
    assert [stranger.post(url, data).status_code for url, data in writes] == [404, 404, 404, 422]
    assert _state() == before
    # Their own lists do not show this workspace's rows.
    assert stranger.get(f"/w/{theirs}/training/exports/").context["exports"] == []
    assert stranger.get(f"/w/{theirs}/training/jobs/").context["jobs"] == []
