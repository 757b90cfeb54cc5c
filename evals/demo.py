"""The demo workspace's eval datasets, made by Keel's own dataset services.

The ride-support bot gets a regression set in two versions, as a team would build one: first a golden
set the support leads wrote (uploaded as JSONL, each item tagged with its language and intent, so that
runs can report the worst group), then hard cases taken from its production trajectories (the
gateway's traffic), each keeping the trace id it came from. Idempotent: a workspace with datasets is
left alone.
"""

from __future__ import annotations

import json

from agent_registry import selectors as registry_selectors
from agent_registry.models import Role, Workspace
from evals import services
from evals.models import Dataset
from tracing.models import Trajectory, TrajectoryStatus

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
    """Seed the ride-support bot's regression dataset unless the workspace has datasets."""
    if Dataset.objects.filter(workspace=workspace).exists():
        return
    ride = registry_selectors.agent_get(workspace=workspace, slug="ride-support")
    owner = next(m.user for m in registry_selectors.workspace_member_list(workspace=workspace) if m.role == Role.OWNER)
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
