"""The demo's trainer bridge: curations of the seeded eval runs and production trajectories, exports in every
format the groups fit, a GRPO job trained on the CPU through the worker's side of the protocol, its model
target and comparison run; and a job still waiting for a GPU. Seeded once however often `demo_seed` runs."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from agent_registry import demo as registry_demo
from agent_registry.models import ApiKey, Workspace
from evals.models import Run, RunStatus, Suite
from routing.models import ModelTarget
from trainer_bridge import demo, services
from trainer_bridge.models import Curation, Export, ExportFormat, JobStatus, TrainingJob, TrainingMetric

pytestmark = pytest.mark.django_db


def _preview(workspace: Workspace, name: str) -> dict[str, Any]:
    curation = Curation.objects.get(workspace=workspace, name=name)
    return services.curation_preview(workspace=workspace, snapshot=services.curation_snapshot(curation)).as_dict()


def test_the_eval_curation_has_groups_with_contrasting_rewards(demo_workspace: Workspace) -> None:
    eval_groups = _preview(demo_workspace, demo.EVAL_CURATION)
    production = _preview(demo_workspace, demo.PRODUCTION_CURATION)

    assert eval_groups["groups"] >= 4
    assert eval_groups["pairable_groups"] > 0  # which ones: test_the_dpo_export_pairs_corrections_...
    assert eval_groups["rewards"]["min"] < eval_groups["rewards"]["max"]
    # Keyed by dataset, version and position: the same split in every database (demo.SPLIT_SEED).
    assert eval_groups["splits"] == {"train": 6, "validation": 2}
    assert production["groups"] >= 2
    curation = Curation.objects.get(workspace=demo_workspace, name=demo.EVAL_CURATION)
    nightly = Suite.objects.get(workspace=demo_workspace, name=demo.SUITE)
    # The nightly suite's two runs and the single-call tier's rollouts; the nightly suite has no new run.
    assert Run.objects.filter(suite=nightly).count() == 2
    assert set(curation.query["runs"]) == set(
        Run.objects.filter(suite__name__in=[demo.SUITE, demo.ROLLOUT_SUITE]).values_list("pk", flat=True)
    )


def test_every_format_the_groups_fit_is_exported_with_its_checksum(demo_workspace: Workspace) -> None:
    exports = Export.objects.filter(workspace=demo_workspace).order_by("pk")

    # OpenAI's training and validation sets are separate files: one export per split of the held-out curation.
    assert sorted((export.format, export.curation_snapshot["split"]) for export in exports) == sorted(
        [(format, "all") for format in ExportFormat.values if format != ExportFormat.OPENAI]
        + [(ExportFormat.OPENAI, "train"), (ExportFormat.OPENAI, "validation")]
    )
    for export in exports:
        assert export.status == JobStatus.SUCCEEDED, (export.format, export.error)
        content = Path(export.path).read_bytes()
        assert content
        assert hashlib.sha256(content).hexdigest() == export.sha256 == export.manifest["sha256"]
        assert export.manifest["curation"]["name"] == demo.EVAL_CURATION


def test_the_dpo_export_pairs_corrections_and_never_answers_of_different_prompts(demo_workspace: Workspace) -> None:
    """Before, each group's best and worst answers were paired: prompt v1's JSON classification against prompt v2's
    answer, under v1's system prompt. The support lead's corrections are the pairs now."""
    eval_groups = _preview(demo_workspace, demo.EVAL_CURATION)
    export = Export.objects.get(workspace=demo_workspace, format=ExportFormat.TRL_DPO)
    rows = [json.loads(line) for line in Path(export.path).read_bytes().splitlines()]

    # The live prompt's answer to some questions is the reference answer already: nothing to correct there.
    assert 0 < eval_groups["corrections"] == eval_groups["pairable_groups"] < eval_groups["groups"]
    assert eval_groups["unpaired_by_prompt"] > 0
    assert len(rows) == eval_groups["corrections"]
    for row in rows:
        system = row["prompt"][0]
        assert system["role"] == "system"
        assert not system["content"].startswith("Classify")  # v1's
    assert export.manifest["counts"]["unpaired_by_prompt"] == eval_groups["unpaired_by_prompt"]
    assert "left unpaired" in export.manifest["notes"][0]


def test_the_grpo_job_trained_and_its_model_is_compared_with_the_incumbent(demo_workspace: Workspace) -> None:
    trained = TrainingJob.objects.get(workspace=demo_workspace, status=JobStatus.SUCCEEDED)

    assert (trained.method, trained.export.format) == ("grpo", ExportFormat.ART)
    assert trained.steps_done == demo.TRAINING_STEPS
    steps = {metric.step: metric.values for metric in TrainingMetric.objects.filter(job=trained)}
    assert set(steps) == set(range(demo.TRAINING_STEPS + 1))
    assert "validation_score" in steps[0]
    assert {"loss", "reward_mean", "policy_reward", "kl"} <= set(steps[1])
    assert Path(trained.adapter_path).read_bytes()[:2] == b"\x1f\x8b"
    assert trained.claimed_via_key is not None
    assert trained.claimed_via_key.name == demo.WORKER_KEY_NAME
    target = trained.model_target
    assert target is not None
    assert (target.alias, target.model) == (f"trained-{trained.pk}", demo.SERVE["model"])
    comparison = trained.comparison_run
    assert comparison is not None
    assert comparison.status == RunStatus.COMPLETED
    assert comparison.model_target_id == target.pk
    assert comparison.items_errored == 0
    incumbent = Run.objects.filter(suite__name=demo.SUITE).order_by("-pk").first()
    assert incumbent is not None
    assert comparison.baseline_id == incumbent.pk
    # And one waits for a GPU worker.
    waiting = TrainingJob.objects.get(workspace=demo_workspace, status=JobStatus.QUEUED)
    assert (waiting.method, waiting.export.format, waiting.attempts) == ("sft", ExportFormat.TRL_SFT, 0)


def test_seeding_again_adds_nothing(demo_workspace: Workspace) -> None:
    def counts() -> tuple[int, ...]:
        return (
            Curation.objects.count(),
            Export.objects.count(),
            TrainingJob.objects.count(),
            TrainingMetric.objects.count(),
            ModelTarget.objects.count(),
            Run.objects.count(),
            ApiKey.objects.count(),
        )

    before = counts()

    registry_demo.demo_seed()

    assert counts() == before
    assert before[:3] == (2, len(ExportFormat.values) + 1, 2)  # OpenAI: a file per split


def test_the_art_export_trains_on_answers_to_one_prompt_per_group(demo_workspace: Workspace) -> None:
    """Before, each question's ART group mixed prompt v1's and v2's nightly answers and the single-call tier's:
    the only reward contrast in a group was between prompts. Now each group is one prompt's answers."""
    export = Export.objects.get(workspace=demo_workspace, format=ExportFormat.ART)
    written = [json.loads(line) for line in Path(export.path).read_bytes().splitlines()]

    assert written
    for line in written:
        prompts = set()
        for trajectory in line["trajectories"]:
            messages = trajectory["messages_and_choices"]
            start = next(i for i, message in enumerate(messages) if message["role"] == "assistant")
            prompts.add((json.dumps(messages[:start]), trajectory["metadata"]["prompt_versions"]))
        assert len(prompts) == 1
        assert len({trajectory["reward"] for trajectory in line["trajectories"]}) > 1
    assert export.curation_snapshot["preview"]["tasks_separated_by_prompt"] == len(written)
    assert export.manifest["counts"]["tasks_separated_by_prompt"] == len(written)
