"""The demo workspace's trainer bridge, made by Keel's own services and trained by its own trainer.

A team that wants to fine-tune the ride-support bot on what it has seen:
- It curates groups from the ride suite's eval runs (k = 4 per item). The demo model answers a request the
  same way every time, so the suite's two runs give every sample of an item the same score and a group
  relative update would learn nothing; as a team would, it first collects contrasting rollouts: the same
  regression set on the single-call tier with the live prompt, answered by the tier's fast model and, for a
  second run, by the strong one (a suite of its own, so the nightly suite's history is unchanged).
  The groups are the dataset items, rewarded by `reference_similarity`. ART and NeMo Gym groups hold one prompt's
  rollouts (`groups.separate_prompts`): the nightly runs (prompt v1 and v2, on the chain tier) are prompts of
  their own whose rewards do not vary, and go; what trains is the two models' answers to the live prompt.
- It curates the triaged production trajectories of the ride-support bot (triage signals of a struggling
  conversation), grouped by first request and ranked within each group by the RULER-style judge.
- A support lead corrects, in each eval group, the live prompt's worst answer with the question's reference
  answer (a `correction` score, as a reviewer records one): DPO's preference pairs. The nightly runs' v1 and
  v2 answers differ in reward but answered different system prompts, so they are never paired; the preview
  and the DPO export's manifest count them as left unpaired.
- It exports the eval groups in every format they can be represented in, and trains a LoRA adapter on the
  ART export with GRPO, as the GPU worker would (claim, metrics step by step, adapter, finish) but in this
  process, on the CPU, for a few steps, on a tiny model built here from the export's own text.
- Keel then registers the trained model as a model target with an eval run of the ride suite against the
  incumbent, which runs here too. The trained model is served by the demo provider
  (`keel-demo/ride-support-grpo`, routing/demo_provider.py), a FAKE that answers from templates: the adapter
  is stored but nothing serves it. Point the target at a server with the adapter loaded to see it answer.
- A second job (SFT, on a real base model) waits for a GPU worker, so the jobs page shows both states.

Everything runs inline: the seed is one transaction the Celery workers could not see. Idempotent: a workspace
with curations is left alone.
"""

from __future__ import annotations

import io
import json
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

from django.conf import settings

from agent_registry import selectors as registry_selectors
from agent_registry import services as registry_services
from agent_registry.models import PromptVersion, User, Workspace
from evals import runs
from evals import services as evals_services
from evals.models import Run, RunSample, Suite
from routing import services as routing_services
from tracing import services as tracing_services
from tracing.models import BatchStatus, IngestBatch, ScoreDataType, ScoreSource, Trajectory
from trainer_bridge import groups, jobs, services
from trainer_bridge.models import Curation, Export, ExportFormat, JobStatus, TrainingJob
from trainer_bridge.training_config import TrainingConfig

SUITE = "ride-support-output-quality"
ROLLOUT_SUITE = "ride-support-single-call-rollouts"
EVAL_CURATION = "ride-support-eval-groups"
PRODUCTION_CURATION = "ride-support-struggling-production"
REWARD_EVALUATOR = "reference_similarity"
JUDGE_EVALUATOR = "group_rank"
WORKER_KEY_NAME = "Demo GPU worker (CPU)"
# Few, small steps: the whole trainer demo stays a few seconds of the seed on a laptop's CPU.
TRAINING_STEPS = 8
TRAINING_CONFIG = {
    "steps": TRAINING_STEPS,
    "batch_size": 2,
    "learning_rate": 5e-4,
    "validation_every": 4,
    "max_length": 512,
}
STRONG_TARGET = "demo-strong"  # routing/demo.py's strong model, whose answers differ from the fast one's
SERVE = {"model": "keel-demo/ride-support-grpo"}  # the FAKE demo provider, not the adapter (see above)
# Holds 2 of the regression set's 8 questions out for validation (a quarter, as asked), both with answers whose
# rewards differ within the job's max_length, so the job has a validation score (seed 2's pair has not). Groups
# are keyed by dataset, version and position, so the split is the same in every database the demo is seeded into.
SPLIT_SEED = 3
LIVE_PROMPT = "ride-support/system@2"  # as the curation's rollouts name the prompt version they ran under


def demo_trainer_seed(workspace: Workspace) -> None:
    """Seed the curations, their exports and the training jobs, once.

    Precondition: the evals demo ran (the ride suite, its two completed runs, the `group_rank` judge)."""
    if Curation.objects.filter(workspace=workspace).exists():
        return
    owner = registry_selectors.workspace_owner(workspace=workspace)
    assert owner is not None  # agent_registry.demo makes the workspace with its owner
    suite = Suite.objects.get(workspace=workspace, name=SUITE)
    _settle(workspace)  # the eval runs' spans are still in their ingest batches
    rollouts = _rollouts_runs(suite, owner)
    eval_runs = [*Run.objects.filter(suite=suite).order_by("pk").values_list("pk", flat=True), *rollouts]
    query, reward = {"runs": eval_runs}, {"source": "run_score", "evaluator": REWARD_EVALUATOR}
    eval_groups = services.curation_create(
        workspace=workspace,
        name=EVAL_CURATION,
        description="The regression set's k = 4 answers from the nightly suite's runs (prompt v1 and v2) and "
        "from the single-call tier, grouped by question and rewarded by similarity to the support leads' "
        "reference answer: GRPO material. A support lead corrected the live prompt's worst answer to each "
        "question that it missed: DPO pairs each correction with the answer it replaced, never answers of "
        "different prompts.",
        query=query,
        grouping="dataset_item",
        reward=reward,
        filters={"validation_share": 0.25, "seed": SPLIT_SEED},
        created_by=owner,
    )
    _corrections(eval_groups, owner)
    services.curation_create(
        workspace=workspace,
        name=PRODUCTION_CURATION,
        description="Production conversations triage flagged (the rider disengaged, the bot drifted, misread "
        "the request, failed or ran out of budget), grouped by the rider's first request and ranked within "
        "each group by the RULER-style judge.",
        query={
            "agents": ["ride-support"],
            "signals": ["disengagement", "goal_drift", "misalignment", "failure", "exhaustion"],
            "exclude_tags": ["eval"],
        },
        grouping="first_request",
        reward={"source": "group_judge", "evaluator": JUDGE_EVALUATOR},
        created_by=owner,
    )
    exports = {export.format: export for export in _exports(eval_groups, owner)}
    _trained_job(workspace, exports[ExportFormat.ART], owner)
    if ExportFormat.TRL_SFT in exports:
        jobs.job_create(
            export=exports[ExportFormat.TRL_SFT],
            method="sft",
            base_model="Qwen/Qwen2.5-0.5B-Instruct",
            name="ride-support SFT on Qwen2.5-0.5B (waits for a GPU worker)",
            config={"steps": 200, "batch_size": 8, "learning_rate": 2e-5},
            compare_suite=SUITE,
            created_by=owner,
        )


def _settle(workspace: Workspace) -> None:
    """What the worker does next with the gateway's traces: store them as trajectories."""
    for batch_id in IngestBatch.objects.filter(workspace=workspace, status=BatchStatus.PENDING).values_list(
        "pk", flat=True
    ):
        tracing_services.span_batch_process(batch_id=batch_id)


def _rollouts_runs(suite: Suite, owner: User) -> list[int]:
    """The regression set answered on the single-call tier with the live prompt (v2), k = 4, scored by the
    nightly suite's evaluators: once by the tier's model and once by the strong model (the tier pointed at it
    for that run, then back), so that each question has answers to one prompt whose rewards differ."""
    rollouts = evals_services.suite_create(
        workspace=suite.workspace,
        name=ROLLOUT_SUITE,
        agent=suite.agent,
        evaluators_used=[link.evaluator for link in suite.suite_evaluators.order_by("position")],
        description="The regression set on the single-call tier: contrasting rollouts for the trainer's groups.",
        dataset=suite.dataset,
        samples=suite.samples,
        tier="single_call",
        variables=suite.variables,
        created_by=owner,
    )
    live = PromptVersion.objects.get(prompt__workspace=suite.workspace, prompt__name="ride-support/system", version=2)
    assert suite.agent is not None

    def answered() -> int:
        run = runs.run_create(suite=rollouts, prompt_version=live, created_by=owner, dispatch=False)
        runs.run_execute(run_id=run.pk, inline=True)
        _settle(suite.workspace)
        return run.pk

    tier_model = routing_services.router_config_get_or_create(agent=suite.agent).single_call_target
    made = [answered()]
    routing_services.router_config_update(agent=suite.agent, single_call_target=STRONG_TARGET, updated_by=owner)
    made.append(answered())
    routing_services.router_config_update(agent=suite.agent, single_call_target=tier_model, updated_by=owner)
    return made


def _corrections(curation: Curation, owner: User) -> None:
    """The support lead's corrections: in each of the curation's groups, the live prompt's worst-rewarded answer
    corrected with the question's reference answer, unless it is that answer already."""
    answers: dict[str, str] = {}
    for group in services.selected_groups(curation.workspace, services.curation_snapshot(curation)):
        live = [
            rollout
            for rollout in group.rollouts
            if LIVE_PROMPT in rollout.metadata.get("prompt_versions", ()) and rollout.reward is not None
        ]
        if live:
            worst = min(live, key=lambda rollout: rollout.reward or 0.0)
            answers[worst.trace_id] = groups.final_answer(worst.messages)
    worst_ids = list(answers)
    references = dict(
        RunSample.objects.filter(item__run__workspace=curation.workspace, trace_id__in=worst_ids).values_list(
            "trace_id", "item__dataset_item__reference_output"
        )
    )
    for trajectory in Trajectory.objects.filter(workspace=curation.workspace, trace_id__in=worst_ids).order_by("pk"):
        reference = references.get(trajectory.trace_id)
        if reference and reference.strip() != answers[trajectory.trace_id].strip():
            tracing_services.score_create(
                trajectory=trajectory,
                name="corrected_output",
                data_type=ScoreDataType.CORRECTION,
                string_value=reference,
                source=ScoreSource.HUMAN,
                created_by=owner,
                comment="The answer the support leads wrote for this question.",
            )


def _exports(curation: Curation, owner: User) -> Iterator[Export]:
    """The curation in each format; one that cannot represent its groups is refused before any file is
    written, and left out. OpenAI's training and validation sets are separate files: one export per split."""
    for format in ExportFormat.values:
        splits = ("train", "validation") if format == ExportFormat.OPENAI else (services.EXPORT_SPLIT_ALL,)
        for split in splits:
            try:
                export = services.export_create(
                    curation=curation, format=format, split=split, created_by=owner, dispatch=False
                )
            except services.ExportRefused:
                continue
            done = services.export_execute(export_id=export.pk)
            if done is not None and done.status == JobStatus.SUCCEEDED:
                yield done


def _vocabulary(export: Export) -> list[str]:
    """The export's conversations as text, for the tiny model's tokenizer."""
    texts = []
    for line in Path(export.path).read_text(encoding="utf-8").splitlines():
        for trajectory in json.loads(line).get("trajectories") or ():
            texts.append(json.dumps(trajectory.get("messages_and_choices"), ensure_ascii=False))
    return texts


def _trained_job(workspace: Workspace, export: Export, owner: User) -> TrainingJob:
    """A GRPO job on the ART export, run through the worker's side of the protocol in this process."""
    from trainer_bridge import tiny, training  # torch: loaded only when the demo trains

    base = tiny.tiny_model_dir(
        Path(settings.MEDIA_ROOT) / "demo-base-model", vocab_corpus=[*_vocabulary(export), *tiny.toy_corpus()]
    )
    job = jobs.job_create(
        export=export,
        method="grpo",
        base_model=str(base),
        name="ride-support GRPO on the eval groups (demo, CPU)",
        config=TRAINING_CONFIG,
        serve=SERVE,
        compare_suite=SUITE,
        created_by=owner,
    )
    key, _ = registry_services.apikey_create(
        workspace=workspace, name=WORKER_KEY_NAME, scopes=["train"], created_by=owner
    )
    claimed = jobs.job_claim(api_key=key, worker="demo-cpu-worker")
    if claimed is None or claimed.pk != job.pk:
        raise RuntimeError(f"the demo worker could not claim training job {job.pk}")
    jobs.job_heartbeat(job=claimed, api_key=key)

    def on_metrics(metrics: dict[str, float]) -> None:
        step = int(metrics.pop("step"))
        jobs.job_metrics_record(job=claimed, api_key=key, step=step, values=metrics)

    config = TrainingConfig.from_dict({**TRAINING_CONFIG, "method": "grpo"})
    with tempfile.TemporaryDirectory(prefix=f"keel-demo-job-{job.pk}-") as work:
        result = training.train(
            config,
            base_model_dir=base,
            export_path=export.path,
            output_dir=Path(work) / "adapter",
            on_metrics=on_metrics,
        )
        if result.adapter_dir is None:
            raise RuntimeError(f"training job {job.pk} stopped before saving its adapter")
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w:gz") as tar:
            for path in sorted(result.adapter_dir.iterdir()):
                tar.add(path, arcname=path.name)
    jobs.job_adapter_store(job=claimed, api_key=key, content=archive.getvalue())
    finished = jobs.job_finish(job=claimed, api_key=key, status="succeeded")
    if finished.comparison_run_id is not None:
        runs.run_execute(run_id=finished.comparison_run_id, inline=True)
        _settle(workspace)
    return finished
