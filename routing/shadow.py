"""Shadow runs and outcomes: how the router finds out whether its choices were right.

A sampled share of gateway requests (the agent's `shadow_rate`) is also run through another automated
tier by a worker, off the caller's path; its spans are a trajectory tagged `shadow`. When the agent has a
judge target, the judge scores the primary answer and the shadow's answer to the same request (0..1,
reasoning kept), and the primary decision takes the judge's score as its quality if it had none.

`routing_decision_outcomes_refresh` fills in the quality of decisions from what Keel learned about their
trajectories afterwards (scores, status, triage signals; `router.outcome_quality`), which is what the
learned router reads back for similar requests.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections import defaultdict
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from config.errors import KeelError
from routing import providers, router, tiers
from routing.models import ModelTarget, OutcomeStatus, RoutingDecision, ShadowRun, ShadowStatus
from routing.recording import TraceRecorder, trace_id_new
from tracing import services as tracing_services
from tracing.models import Score, Trajectory

logger = logging.getLogger("routing.shadow")

LEASE_SECONDS = 600
MAX_ATTEMPTS = 3
OUTCOME_DELAY_SECONDS = 60
OUTCOME_HORIZON_DAYS = 14
JUDGE_PROMPT = (
    "You grade an AI assistant's answer to a user's request. Judge whether it resolves the request "
    "correctly, completely and safely. Reply with JSON only: "
    '{"reasoning": "<one or two sentences>", "score": <integer 0-10>}.'
)


def _claim(shadow_run_id: int) -> ShadowRun | None:
    lease = timezone.now() - timedelta(seconds=LEASE_SECONDS)
    claimed = ShadowRun.objects.filter(
        Q(status=ShadowStatus.PENDING) | Q(status=ShadowStatus.RUNNING, claimed_at__lt=lease),
        pk=shadow_run_id,
        attempts__lt=MAX_ATTEMPTS,
    ).update(status=ShadowStatus.RUNNING, claimed_at=timezone.now(), attempts=F("attempts") + 1)
    if not claimed:
        return None
    return ShadowRun.objects.select_related("decision__agent__workspace").get(pk=shadow_run_id)


def _answer_text(message: Any) -> str:
    if isinstance(message, dict):
        content = message.get("content")
        calls = message.get("tool_calls")
        text = content if isinstance(content, str) else ""
        if calls:
            text += "\n[tool calls] " + json.dumps(calls, default=str)[:2000]
        return text
    return "" if message is None else str(message)


def judge_score(*, judge: ModelTarget, request_text: str, answer: Any) -> tuple[float, str]:
    """The judge's 0..1 score of one answer to the request, and its reasoning. Raises ProviderFailed,
    or ValueError when the judge's reply cannot be read."""
    completion = providers.completion(
        target=judge,
        messages=[
            {"role": "system", "content": JUDGE_PROMPT},
            {"role": "user", "content": f"Request:\n{request_text}\n\nAnswer:\n{_answer_text(answer)}"},
        ],
        parameters={"temperature": 0},
    )
    text = completion.text
    match = re.search(r"\{.*\}", text, re.DOTALL)
    if match is None:
        raise ValueError(f"the judge did not answer JSON: {text[:200]!r}")
    verdict = json.loads(match.group(0))
    score = float(verdict["score"])
    return max(0.0, min(1.0, score / 10)), str(verdict.get("reasoning", ""))[:2000]


def _judge_both(shadow: ShadowRun, result: tiers.TierResult) -> None:
    config = getattr(shadow.decision.agent, "router_config", None)
    judge = config.judge_target if config is not None else None
    if judge is None:
        shadow.judge_reason = "not scored: the agent's router has no judge target"
        return
    request_text = shadow.decision.request_text
    try:
        shadow.primary_quality, primary_reason = judge_score(
            judge=judge, request_text=request_text, answer=shadow.primary_answer
        )
        shadow.quality, shadow_reason = judge_score(judge=judge, request_text=request_text, answer=result.message)
    except (providers.ProviderFailed, ValueError, KeyError, TypeError) as error:
        shadow.judge_reason = f"the judge failed: {error}"[:2000]
        return
    shadow.judge_reason = f"{shadow.decision.tier}: {primary_reason}\n{shadow.tier}: {shadow_reason}"


def shadow_run_execute(*, shadow_run_id: int) -> ShadowRun | None:
    """Run one shadow request and score it; a finished or held run is skipped (redelivery is harmless)."""
    shadow = _claim(shadow_run_id)
    if shadow is None:
        return None
    decision = shadow.decision
    agent = decision.agent
    request = shadow.request or {}
    recorder = TraceRecorder(
        trace_id=trace_id_new(), agent_name=agent.slug, session_id=decision.conversation_id or None, user_id=None
    )
    context = tiers.TierContext(
        agent=agent,
        config=getattr(agent, "router_config", None),
        recorder=recorder,
        conversation_id="",
        end_user=None,
        variables=request.get("variables") or {},
        tools=request.get("tools") or [],
        parameters=request.get("parameters") or {},
        time_budget_ms=request.get("time_budget_ms"),
        max_steps=request.get("max_steps"),
        routing_reason=f"shadow of {decision.trace_id} ({decision.tier})",
    )
    messages = request.get("messages") or []
    started = time.perf_counter()
    result: tiers.TierResult | None = None
    error_text = ""
    try:
        result = tiers.TIERS[shadow.tier](context, messages)
    except KeelError as error:
        error_text = error.detail
    latency_ms = int((time.perf_counter() - started) * 1000)
    spans = recorder.finish(
        name=f"shadow agent/{agent.slug}",
        input_messages=messages,
        output=[result.message] if result else None,
        status="ok" if result is not None and result.status == "ok" else "error",
        error_type=None if result is not None else "provider_error",
        error_message=error_text or None,
        tags=("gateway", "shadow", f"tier:{shadow.tier}"),
        metadata={"shadow_of": decision.trace_id, "tier": shadow.tier},
    )
    if result is not None:
        _judge_both(shadow, result)
    with transaction.atomic():
        tracing_services.spans_write(workspace=agent.workspace, api_key=None, spans=spans)
        shadow.trace_id = recorder.trace_id
        shadow.latency_ms = latency_ms
        cost = result.cost_usd if result is not None else None
        shadow.cost_usd = None if cost is None else Decimal(str(cost))
        shadow.status = ShadowStatus.DONE if result is not None else ShadowStatus.FAILED
        shadow.error = error_text[:2000]
        shadow.finished_at = timezone.now()
        shadow.save()
        if shadow.primary_quality is not None and decision.quality is None:
            RoutingDecision.objects.filter(pk=decision.pk, quality__isnull=True).update(
                quality=shadow.primary_quality, quality_source="judge"
            )
    return shadow


def shadow_run_sweep() -> list[int]:
    """Ids of shadow runs to hand to a worker again (message lost, or worker gone past its lease)."""
    now = timezone.now()
    stale = now - timedelta(seconds=LEASE_SECONDS)
    ShadowRun.objects.filter(
        ~Q(status__in=[ShadowStatus.DONE, ShadowStatus.FAILED]), attempts__gte=MAX_ATTEMPTS, claimed_at__lt=stale
    ).update(status=ShadowStatus.FAILED, error="gave up after repeated attempts", finished_at=now)
    return list(
        ShadowRun.objects.filter(
            Q(status=ShadowStatus.PENDING, created_at__lt=now - timedelta(seconds=60))
            | Q(status=ShadowStatus.RUNNING, claimed_at__lt=stale),
            attempts__lt=MAX_ATTEMPTS,
        ).values_list("pk", flat=True)[:500]
    )


def routing_decision_outcomes_refresh(*, limit: int = 2000, delay_seconds: int = OUTCOME_DELAY_SECONDS) -> int:
    """Give decisions with no quality yet the one their trajectory now tells; returns how many changed.

    Waits `delay_seconds` after the request, so that the trajectory has been assembled and its
    triage signals computed; looks back OUTCOME_HORIZON_DAYS.
    """
    now = timezone.now()
    pending = list(
        RoutingDecision.objects.filter(
            quality__isnull=True,
            cache_hit=False,
            created_at__lt=now - timedelta(seconds=delay_seconds),
            created_at__gte=now - timedelta(days=OUTCOME_HORIZON_DAYS),
        )
        .exclude(status=OutcomeStatus.PENDING)
        .values_list("pk", "workspace_id", "trace_id", "status")[:limit]
    )
    if not pending:
        return 0
    by_workspace: dict[int, list[str]] = defaultdict(list)
    for _, workspace_id, trace_id, _ in pending:
        by_workspace[workspace_id].append(trace_id)
    trajectories: dict[tuple[int, str], tuple[int, list[str], float]] = {}
    for workspace_id, trace_ids in by_workspace.items():
        for pk, trace_id, names, score in Trajectory.objects.filter(
            workspace_id=workspace_id, trace_id__in=trace_ids
        ).values_list("pk", "trace_id", "signal_names", "triage_score"):
            trajectories[(workspace_id, trace_id)] = (pk, list(names or ()), float(score))
    scores: dict[int, list[tuple[str, Any]]] = defaultdict(list)
    for trajectory_id, data_type, value in Score.objects.filter(
        trajectory_id__in=[t[0] for t in trajectories.values()]
    ).values_list("trajectory_id", "data_type", "value"):
        scores[trajectory_id].append((data_type, value))
    changed = 0
    for pk, workspace_id, trace_id, status in pending:
        found = trajectories.get((workspace_id, trace_id))
        if found is None:
            continue  # not assembled yet
        trajectory_id, names, triage_score = found
        counts: dict[str, int] = defaultdict(int)
        for name in names:
            counts[name] += 1
        quality, source = router.outcome_quality(
            status=status, scores=scores.get(trajectory_id, []), signal_counts=counts, triage_score=triage_score
        )
        if quality is None:
            continue
        changed += RoutingDecision.objects.filter(pk=pk, quality__isnull=True).update(
            quality=quality, quality_source=source
        )
    return changed
