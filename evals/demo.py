"""The demo workspace's evals, made by Keel's own services and run by its own runner.

The ride-support bot gets a regression set in two versions, as a team would build one: first a golden
set the support leads wrote (uploaded as JSONL, each item tagged with its language and intent, so that
runs can report the worst group), then hard cases taken from its production trajectories (the
gateway's traffic), each keeping the trace id it came from.

Then the suites and online rules Keel proposes from each agent's evaluation commitment, as a team would
take them: the ride-support bot's nightly suite gets two more evaluators (similarity to the reference and a
RULER-style group judge) and k = 4, and runs on demand on both prompt versions (v1 as the baseline of
v2, so the comparison and the regression check have something to show); its trajectory audit rule
scores the day's production trajectories. The shopping assistant's proposal waits for a dataset. The
judges run on the demo model (routing/demo_provider.py), a fake that scores by coverage of the task.
Idempotent: a workspace with datasets, or with suites, is left alone.
"""

from __future__ import annotations

import json
from datetime import timedelta

from django.utils import timezone

from agent_registry import selectors as registry_selectors
from agent_registry.models import PromptVersion, User, Workspace
from evals import online, regressions, runs, services
from evals.models import Dataset, OnlineEvaluation, OnlineRule, RunTrigger, Suite
from tracing import services as tracing_services
from tracing.models import ScoreDataType, ScoreSource, Trajectory, TrajectoryStatus

DATASET = "ride-support-regressions"
PRODUCTION_CASES = 6


def _golden(task: str, reference: str, language: str, intent: str, **expected: object) -> dict[str, object]:
    return {
        "input_messages": [{"role": "user", "content": task}],
        "reference_output": reference,
        "metadata": {"tags": {"language": language, "intent": intent}},
        **expected,
    }


GOLDEN = (
    _golden(
        "Where can I download the receipt for my trip yesterday?",
        "Open the trip in Activity and choose Receipt; it can be downloaded as a PDF.",
        "en",
        "receipts",
    ),
    _golden(
        "¿Dónde descargo el recibo de mi viaje de ayer?",
        "Abre el viaje en Actividad y elige Recibo; se descarga en PDF.",
        "es",
        "receipts",
    ),
    _golden(
        "I was charged twice for trip T4417, please refund the duplicate",
        "Refund the duplicate charge on T4417 once the payments log confirms it.",
        "en",
        "refunds",
        expected_tool_calls=[
            {"name": "lookup_trip", "arguments": {"trip_id": "T4417"}},
            {"name": "issue_refund", "arguments": {"trip_id": "T4417"}},
        ],
    ),
    _golden(
        "Me cobraron dos veces el viaje T2210, devuélvanme el duplicado",
        "Reembolsar el cobro duplicado de T2210 tras confirmarlo en el registro de pagos.",
        "es",
        "refunds",
        expected_tool_calls=[{"name": "issue_refund", "arguments": {"trip_id": "T2210"}}],
    ),
    _golden(
        "How do I change the payment card on my account?",
        "Go to Wallet, add the new card and make it the default.",
        "en",
        "account",
    ),
    _golden(
        "Comment changer la carte de paiement de mon compte ?",
        "Dans Portefeuille, ajoutez la nouvelle carte et définissez-la par défaut.",
        "fr",
        "account",
    ),
    _golden(
        "The driver was unsafe and drove through red lights",
        "Hand the conversation to the safety team and tell the rider a person will call.",
        "en",
        "safety",
    ),
    _golden(
        "What does the airport surcharge cover?",
        "The airport's pick-up fee, which the airport charges per trip.",
        "en",
        "fares",
    ),
)


def demo_evals_seed(workspace: Workspace) -> None:
    """Seed the ride-support bot's regression dataset, then the proposed suites, their runs and the online
    rule's scores; each part only once."""
    owner = registry_selectors.workspace_owner(workspace=workspace)
    assert owner is not None  # agent_registry.demo makes the workspace with its owner
    if not Dataset.objects.filter(workspace=workspace).exists():
        _dataset_seed(workspace, owner)
    if not Suite.objects.filter(workspace=workspace).exists():
        _suites_seed(workspace, owner)


def _dataset_seed(workspace: Workspace, owner: User) -> None:
    ride = registry_selectors.agent_get(workspace=workspace, slug="ride-support")
    dataset = services.dataset_create(
        workspace=workspace,
        name=DATASET,
        agent=ride,
        description="Questions the ride-support bot must keep answering well, in every language it serves.",
        created_by=owner,
    )
    upload = "\n".join(json.dumps(item, ensure_ascii=False) for item in GOLDEN).encode()
    services.dataset_version_create_from_items(
        dataset=dataset,
        items=services.dataset_items_from_upload(content=upload, file_format="jsonl"),
        message="golden set written by the support leads",
        created_by=owner,
    )
    production = list(
        Trajectory.objects.filter(
            workspace=workspace, agent=ride, status=TrajectoryStatus.OK, tags__contains=["gateway"]
        )
        .exclude(tags__contains=["shadow"])
        .order_by("started_at", "pk")
        .values_list("trace_id", flat=True)[:PRODUCTION_CASES]
    )
    if production:
        services.dataset_add_trajectories(
            dataset=dataset, trace_ids=production, message="hard cases from production", created_by=owner
        )


def _suites_seed(workspace: Workspace, owner: User) -> None:
    ride = registry_selectors.agent_get(workspace=workspace, slug="ride-support")
    shopping = registry_selectors.agent_get(workspace=workspace, slug="shopping-assistant")
    services.suites_propose(agent=shopping, created_by=owner)  # no dataset yet: proposed, not scheduled
    proposal = services.suites_propose(agent=ride, created_by=owner)
    suite = proposal.suites[0]
    judge = services.judge_alias(ride)
    similarity = services.evaluator_create(
        workspace=workspace,
        agent=ride,
        name="reference_similarity",
        config={"type": "embedding_similarity", "threshold": 0.5},
        description="Meaning close to the support leads' reference answer.",
        created_by=owner,
    )
    ranking = services.evaluator_create(
        workspace=workspace,
        agent=ride,
        name="group_rank",
        config={"type": "group_judge", **({"model": judge} if judge else {})},
        description="RULER-style: the k answers to an item ranked against each other by one judge call.",
        created_by=owner,
    )
    proposed = [link.evaluator for link in suite.suite_evaluators.order_by("position")]
    services.suite_update(
        suite=suite,
        samples=4,
        variables={"company": "Acme Rides"},
        evaluators_used=[*proposed, similarity, ranking],
    )

    prompt = ride.prompts.get(name="ride-support/system")
    first, second = PromptVersion.objects.filter(prompt=prompt, version__in=[1, 2]).order_by("version")
    baseline = runs.run_create(
        suite=suite, trigger=RunTrigger.MANUAL, prompt_version=first, created_by=owner, dispatch=False
    )
    runs.run_execute(run_id=baseline.pk, inline=True)
    candidate = runs.run_create(
        suite=suite, trigger=RunTrigger.MANUAL, prompt_version=second, created_by=owner, dispatch=False
    )
    type(candidate).objects.filter(pk=candidate.pk).update(baseline=baseline)
    runs.run_execute(run_id=candidate.pk, inline=True)
    regressions.run_completed(run_id=candidate.pk)

    for rule in proposal.rules:
        online.rule_backfill(rule=rule, start=timezone.now() - timedelta(days=2), end=timezone.now())
        _reviews_seed(rule, owner)


# Of the trajectories the audit rule scored, how many a support lead also rated by hand.
REVIEWED = 10


def _reviews_seed(rule: OnlineRule, owner: User) -> None:
    """A support lead rates some of the judged trajectories by hand, as calibration needs: mostly as the
    judge did, but not always (every fourth rating disagrees)."""
    judged = "action_appropriateness"
    evaluations = OnlineEvaluation.objects.filter(rule=rule).order_by("trajectory_ended_at", "pk")[:REVIEWED]
    for index, evaluation in enumerate(evaluations):
        verdict = next((r for r in evaluation.results if r["evaluator"] == judged and r["score"] is not None), None)
        if verdict is None:
            continue
        agrees = index % 4 != 3
        passed = verdict["score"] >= 0.5
        tracing_services.score_create(
            trajectory=Trajectory.objects.get(workspace_id=rule.workspace_id, trace_id=evaluation.trace_id),
            name=judged,
            data_type=ScoreDataType.NUMERIC,
            value=1.0 if passed == agrees else 0.0,
            comment="support lead's rating",
            source=ScoreSource.HUMAN,
            created_by=owner,
        )
