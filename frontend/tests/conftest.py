"""Two workspaces, each with an agent that has requirements, a prompt with two versions, a key, a recorded
trajectory with a pending replay, a paused Langfuse mirror with a failed delivery, a model price, a model
target with a key, a router configuration with a chain step and a tool, a routing decision with a shadow
run, an open hand-off and a cache hit, a guardrail violation, a pending approval request and a budget, an
eval suite with a queued run and an online rule, a curation with a finished export (its file under a
temporary MEDIA_ROOT) and a queued one, a training job with metrics and an adapter, and a client per role
in the first."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from agent_registry import services
from agent_registry.models import (
    Agent,
    ApiKey,
    Membership,
    Prompt,
    PromptLabel,
    PromptLabelMove,
    PromptVersion,
    RequirementsVersion,
    Role,
    User,
    Workspace,
)
from agent_registry.tests.factories import (
    AgentFactory,
    MembershipFactory,
    UserFactory,
    requirements_answers,
)
from evals import dataset_items, online, runs
from evals import services as eval_services
from evals.models import Dataset, DatasetVersion, OnlineRule, Run, RunStatus, Suite, SuiteTarget
from frontend.tests import traces
from guardrails import services as guardrail_services
from guardrails.models import ApprovalEvent, ApprovalRequest, Budget, GuardrailPolicy, GuardrailViolation
from guardrails.tests.factories import ApprovalRequestFactory, BudgetFactory, GuardrailViolationFactory
from routing import services as routing_services
from routing.models import (
    AgentTool,
    CacheHit,
    ChainStep,
    Handoff,
    ModelTarget,
    RouterConfig,
    RoutingDecision,
    ShadowRun,
)
from routing.tests.factories import CacheEntryFactory, CacheHitFactory, RoutingDecisionFactory
from tracing import langfuse_bridge, replay, triage
from tracing import services as tracing_services
from tracing.models import (
    Alert,
    AlertRule,
    LangfuseExport,
    LangfuseMirror,
    ModelPriceOverride,
    Replay,
    ReviewItem,
    ReviewSample,
    Score,
    Trajectory,
    TriageSettings,
)
from tracing.tests.factories import AlertFactory, AlertRuleFactory
from trainer_bridge import jobs
from trainer_bridge import services as trainer_services
from trainer_bridge.models import Curation, Export, TrainingJob, TrainingMetric


@dataclass
class Tenant:
    workspace: Workspace
    agent: Agent
    prompt: Prompt
    # A prompt nothing uses (no production label, no trajectory), which can be deleted.
    draft_prompt: Prompt
    api_key: ApiKey
    trajectory: Trajectory
    replay: Replay
    sample: ReviewSample
    rule: AlertRule
    alert: Alert
    mirror: LangfuseMirror
    price: ModelPriceOverride
    target: ModelTarget
    tool: AgentTool
    decision: RoutingDecision
    handoff: Handoff
    hit: CacheHit
    violation: GuardrailViolation
    approval: ApprovalRequest
    budget: Budget
    suite: Suite
    eval_run: Run
    online_rule: OnlineRule
    curation: Curation
    export: Export  # finished, with its file
    queued_export: Export
    training_job: TrainingJob


TENANT_LANGFUSE_SECRET = "sk-lf-tenant-secret"


def _paused_mirror_with_a_failed_delivery(workspace: Workspace, trace_name: str) -> tuple[Trajectory, LangfuseMirror]:
    """Mirroring while the trajectory arrives queues its spans; pausing the mirror then fails that delivery."""
    langfuse_bridge.langfuse_mirror_configure(
        workspace=workspace,
        host="https://langfuse.example.com",
        public_key="pk-lf-tenant",
        secret_key=TENANT_LANGFUSE_SECRET,
    )
    trajectory = traces.conversation(workspace, trace_name)
    mirror = langfuse_bridge.langfuse_mirror_configure(
        workspace=workspace,
        host="https://langfuse.example.com",
        public_key="pk-lf-tenant",
        secret_key=None,
        enabled=False,
    )
    (export_id,) = LangfuseExport.objects.filter(workspace=workspace).values_list("pk", flat=True)
    assert langfuse_bridge.langfuse_export_deliver(export_id=export_id) is False
    return trajectory, mirror


def _tenant(workspace: Workspace, author: User, media: Path) -> Tenant:
    agent = AgentFactory.create(workspace=workspace, slug="ride-support", name="Ride support", owner=author)
    services.requirements_version_create(
        agent=agent, answers=requirements_answers(), message="initial", created_by=author
    )
    services.requirements_version_create(
        agent=agent,
        answers=requirements_answers(**{"io_gap.steps_p95": 6}),
        message="longer tail",
        created_by=author,
    )
    first = services.prompt_create(
        agent=agent,
        name="support/triage",
        type="text",
        template="Hello {{name}}, you asked about {{topic}}.",
        config={"model": "gpt-4o-mini"},
        commit_message="first",
        labels=["production"],
        created_by=author,
    )
    services.prompt_version_create(
        prompt=first.prompt, template="Hi {{name}}! About {{topic}}:", commit_message="friendlier", created_by=author
    )
    draft = services.prompt_create(
        agent=agent, name="support/welcome", type="text", template="Welcome!", created_by=author
    )
    api_key, _ = services.apikey_create(workspace=workspace, name="ingest", scopes=["ingest"], created_by=author)
    trajectory, mirror = _paused_mirror_with_a_failed_delivery(workspace, f"{workspace.slug}/refund")
    pending = replay.replay_create(original=trajectory, from_step=3, created_by=author)
    sample = triage.review_sample_create(
        workspace=workspace,
        strategy="random",
        window_start=trajectory.started_at - timedelta(hours=1),
        window_end=trajectory.started_at + timedelta(hours=1),
        budget=5,
        created_by=author,
    )
    rule = AlertRuleFactory.create(agent=agent, name="Loop rate", signal="loop", min_trajectories=1)
    target, tool, decision, handoff, hit = _routing(agent, trajectory)
    suite, eval_run, online_rule = _evals(agent)
    curation, export, queued_export, training_job = _training(workspace, author, media)
    return Tenant(
        workspace=workspace,
        agent=agent,
        prompt=first.prompt,
        draft_prompt=draft.prompt,
        api_key=api_key,
        trajectory=trajectory,
        replay=pending,
        sample=sample,
        rule=rule,
        alert=AlertFactory.create(rule=rule),
        mirror=mirror,
        price=tracing_services.model_price_set(
            workspace=workspace,
            model="acme-large",
            input_usd_per_million=Decimal("2.5"),
            output_usd_per_million=Decimal("10"),
        ),
        target=target,
        tool=tool,
        decision=decision,
        handoff=handoff,
        hit=hit,
        violation=GuardrailViolationFactory.create(agent=agent, trace_id=trajectory.trace_id, source="user"),
        approval=ApprovalRequestFactory.create(agent=agent, trace_id=trajectory.trace_id),
        budget=BudgetFactory.create(
            workspace=workspace, scope="workspace", scope_value="", period="month", limit_usd=Decimal("10")
        ),
        suite=suite,
        eval_run=eval_run,
        online_rule=online_rule,
        curation=curation,
        export=export,
        queued_export=queued_export,
        training_job=training_job,
    )


def _evals(agent: Agent) -> tuple[Suite, Run, OnlineRule]:
    """A suite on a two-item dataset with a queued run (no worker runs it), and an online rule."""
    workspace = agent.workspace
    evaluator = eval_services.evaluator_create(
        workspace=workspace, name="says_ok", config={"type": "regex", "pattern": "ok"}
    )
    dataset = eval_services.dataset_create(workspace=workspace, name="regressions", agent=agent)
    eval_services.dataset_version_create_from_items(
        dataset=dataset,
        items=[
            dataset_items.ItemData(task="Where is my receipt?", metadata={"tags": {"language": "en"}}),
            dataset_items.ItemData(task="¿Dónde está mi recibo?", metadata={"tags": {"language": "es"}}),
        ],
    )
    suite = eval_services.suite_create(
        workspace=workspace,
        name="answers",
        agent=agent,
        dataset=dataset,
        target=SuiteTarget.RECORDED,
        evaluators_used=[evaluator],
    )
    run = runs.run_create(suite=suite, dispatch=False)
    # Paused as a provider outage pauses a run (evals.runs), so that it can be resumed or cancelled.
    Run.objects.filter(pk=run.pk).update(status=RunStatus.PAUSED, pause_reason="fast: connection refused")
    run.refresh_from_db()
    rule = online.online_rule_create(agent=agent, name="audit", evaluators_used=[evaluator])
    return suite, run, rule


def _training(workspace: Workspace, author: User, media: Path) -> tuple[Curation, Export, Export, TrainingJob]:
    """A curation of the recorded trajectories by their own reward (groups of one kept), an ART export the
    task has written and one still queued, and a queued job on the first with two steps of metrics and an
    uploaded adapter."""
    # As an agent reporting `keel.reward` would have left it.
    Trajectory.objects.filter(workspace=workspace).update(reward=1.0)
    curation = trainer_services.curation_create(
        workspace=workspace,
        name="recorded",
        query={},
        grouping="first_request",
        reward={"source": "trajectory"},
        filters={"min_group_size": 1, "drop_equal_rewards": False},
        created_by=author,
    )
    export = trainer_services.export_create(curation=curation, format="art", dispatch=False)
    assert trainer_services.export_execute(export_id=export.pk) is not None
    export.refresh_from_db()
    queued = trainer_services.export_create(curation=curation, format="art", dispatch=False)
    job = jobs.job_create(
        export=export, method="grpo", base_model="tiny-model", config={"steps": 10}, created_by=author
    )
    for step, values in ((1, {"loss": 0.9, "reward_mean": 0.4}), (2, {"loss": 0.7, "reward_mean": 0.5})):
        TrainingMetric.objects.create(job=job, step=step, values=values)
    adapter = media / f"{workspace.slug}-adapter.tar.gz"
    adapter.write_bytes(gzip.compress(b"adapter"))
    # As the worker's upload (trainer_bridge.jobs.job_adapter_store) leaves it.
    TrainingJob.objects.filter(pk=job.pk).update(adapter_path=str(adapter), steps_done=2)
    job.refresh_from_db()
    return curation, export, queued, job


TENANT_PROVIDER_KEY = "sk-tenant-provider-key"


def _routing(agent: Agent, trajectory: Trajectory) -> tuple[ModelTarget, AgentTool, RoutingDecision, Handoff, CacheHit]:
    """A target with a key serving the agent, a one-step chain, a tool, a decision on the recorded
    trajectory with a judged shadow run, an open hand-off and a cache hit nobody judged yet."""
    workspace = agent.workspace
    target = routing_services.model_target_create(
        workspace=workspace, alias="fast", model="openai/gpt-4o-mini", api_key=TENANT_PROVIDER_KEY
    )
    routing_services.router_config_update(agent=agent, single_call_target="fast", shadow_rate=0.1)
    routing_services.chain_steps_set(agent=agent, steps=[{"name": "draft", "instructions": "Draft an answer."}])
    tool = routing_services.agent_tool_create(agent=agent, name="lookup_trip", description="Find a trip")
    decision = RoutingDecisionFactory.create(
        workspace=workspace,
        agent=agent,
        trace_id=trajectory.trace_id,
        request_text="I was charged twice for my ride",
        tier="chain",
        method="estimate",
        status="ok",
        quality=0.7,
        cost_usd=Decimal("0.0021"),
        latency_ms=900,
        features={"words": 7, "money": True},
        estimates={"single_call": {"quality": 0.5, "cost_usd": 0.001, "latency_ms": 400, "support": 3, "utility": 0.4}},
    )
    ShadowRun.objects.create(decision=decision, tier="agentic", status="done", quality=0.8, cost_usd=Decimal("0.01"))
    handoff = Handoff.objects.create(
        workspace=workspace,
        agent=agent,
        decision=decision,
        trace_id=trajectory.trace_id,
        reason="asked for a person",
        messages=[{"role": "user", "content": "Let me talk to a person"}],
    )
    entry = CacheEntryFactory.create(
        workspace=workspace, agent=agent, model_target=target, trace_id=trajectory.trace_id
    )
    hit = CacheHitFactory.create(entry=entry, trace_id=trajectory.trace_id, request_text="How do I reset my password?")
    return target, tool, decision, handoff, hit


@pytest.fixture
def media(tmp_path: Path, settings: Any) -> Path:
    """Exports and adapters go under a temporary MEDIA_ROOT."""
    settings.MEDIA_ROOT = tmp_path / "media"
    return tmp_path


@pytest.fixture
def tenant(workspace, media) -> Tenant:
    author = UserFactory.create(username="author")
    MembershipFactory.create(workspace=workspace, user=author, role=Role.OWNER)
    return _tenant(workspace, author, media)


@pytest.fixture
def other_tenant(other_workspace, media) -> Tenant:
    stranger = UserFactory.create(username="stranger")
    MembershipFactory.create(workspace=other_workspace, user=stranger, role=Role.OWNER)
    return _tenant(other_workspace, stranger, media)


def _client_for(workspace: Workspace, role: Role, username: str) -> tuple[Client, Membership]:
    user = UserFactory.create(username=username)
    membership = MembershipFactory.create(workspace=workspace, user=user, role=role)
    client = Client()
    client.force_login(user)
    return client, membership


@pytest.fixture
def member_client(tenant) -> Client:
    return _client_for(tenant.workspace, Role.MEMBER, "mia")[0]


@pytest.fixture
def viewer_client(tenant) -> Client:
    return _client_for(tenant.workspace, Role.VIEWER, "vic")[0]


@pytest.fixture
def owner_client(tenant) -> Client:
    return _client_for(tenant.workspace, Role.OWNER, "olga")[0]


def page_urls(tenant: Tenant) -> dict[str, str]:
    """Every page a member may GET, for the given tenant."""
    ws, agent, prompt = tenant.workspace.slug, tenant.agent.slug, tenant.prompt.pk
    return {
        "workspace_home": f"/w/{ws}/",
        "agent_list": f"/w/{ws}/agents/",
        "agent_detail": f"/w/{ws}/agents/{agent}/",
        "requirements_edit": f"/w/{ws}/agents/{agent}/requirements/",
        "requirements_history": f"/w/{ws}/agents/{agent}/requirements/history/",
        "requirements_diff": f"/w/{ws}/agents/{agent}/requirements/history/?a=1&b=2",
        "configuration": f"/w/{ws}/agents/{agent}/configuration/",
        "agent_prompt_list": f"/w/{ws}/agents/{agent}/prompts/",
        "prompt_list": f"/w/{ws}/prompts/",
        "prompt_detail": f"/w/{ws}/prompts/{prompt}/",
        "prompt_diff": f"/w/{ws}/prompts/{prompt}/?from=1&to=2",
        "prompt_render": f"/w/{ws}/prompts/{prompt}/render/?version=1&var.name=Ada&var.topic=refunds",
        "apikey_list": f"/w/{ws}/keys/",
        "trajectory_list": f"/w/{ws}/trajectories/",
        "trajectory_list_filtered": f"/w/{ws}/trajectories/?period=7d&status=ok&q=charged&order=-cost",
        "agent_trajectory_list": f"/w/{ws}/agents/{agent}/trajectories/",
        "trajectory_detail": f"/w/{ws}/trajectories/{tenant.trajectory.trace_id}/",
        "session_list": f"/w/{ws}/sessions/",
        "session_detail": f"/w/{ws}/sessions/{tenant.trajectory.session_id}/",
        "replay_detail": f"/w/{ws}/replays/{tenant.replay.pk}/",
        "review_list": f"/w/{ws}/review/",
        "review_informativeness": f"/w/{ws}/review/informativeness/",
        "review_sample": f"/w/{ws}/review/{tenant.sample.pk}/",
        "review_item": f"/w/{ws}/review/{tenant.sample.pk}/items/1/",
        "alert_list": f"/w/{ws}/alerts/",
        "alert_list_open": f"/w/{ws}/alerts/?show=open",
        "agent_triage": f"/w/{ws}/agents/{agent}/triage/",
        "agent_signals": f"/w/{ws}/agents/{agent}/signals/",
        "agent_signals_daily": f"/w/{ws}/agents/{agent}/signals/?period=30d",
        "agent_alert_rules": f"/w/{ws}/agents/{agent}/alert-rules/",
        "agent_alert_rule_edit": f"/w/{ws}/agents/{agent}/alert-rules/{tenant.rule.pk}/",
        "agent_settings": f"/w/{ws}/agents/{agent}/settings/",
        "integration_list": f"/w/{ws}/integrations/",
        "integration_list_price": f"/w/{ws}/integrations/?price={tenant.price.model}",
        "model_target_list": f"/w/{ws}/model-targets/",
        "model_target_edit": f"/w/{ws}/model-targets/{tenant.target.alias}/",
        "model_target_delete": f"/w/{ws}/model-targets/{tenant.target.alias}/delete/",
        "agent_router": f"/w/{ws}/agents/{agent}/router/",
        "agent_tool_edit": f"/w/{ws}/agents/{agent}/router/tools/{tenant.tool.name}/",
        "agent_router_report": f"/w/{ws}/agents/{agent}/router/report/",
        "agent_router_report_30d": f"/w/{ws}/agents/{agent}/router/report/?period=30d",
        "routing_decision_list": f"/w/{ws}/routing-decisions/",
        "routing_decision_list_filtered": f"/w/{ws}/routing-decisions/?agent={agent}&tier=chain&period=30d",
        "routing_decision_detail": f"/w/{ws}/routing-decisions/{tenant.decision.pk}/",
        "handoff_list": f"/w/{ws}/handoffs/",
        "cache_review": f"/w/{ws}/cache-review/",
        "cache_review_agent": f"/w/{ws}/cache-review/?agent={agent}&show=unreviewed",
        "agent_guardrails": f"/w/{ws}/agents/{agent}/guardrails/",
        "guardrail_violation_list": f"/w/{ws}/guardrails/violations/",
        "guardrail_violation_list_filtered": (
            f"/w/{ws}/guardrails/violations/?agent={agent}&layer=input&check=prompt_injection&action=block"
        ),
        "guardrail_approval_list": f"/w/{ws}/guardrails/approvals/",
        "guardrail_approval_detail": f"/w/{ws}/guardrails/approvals/{tenant.approval.pk}/",
        "guardrail_budget_list": f"/w/{ws}/guardrails/budgets/",
        "eval_overview": f"/w/{ws}/evals/",
        "eval_suite_create": f"/w/{ws}/evals/suites/new/",
        "eval_suite_detail": f"/w/{ws}/evals/suites/{tenant.suite.name}/",
        "eval_suite_edit": f"/w/{ws}/evals/suites/{tenant.suite.name}/edit/",
        "eval_run_list": f"/w/{ws}/evals/runs/",
        "eval_run_detail": f"/w/{ws}/evals/runs/{tenant.eval_run.pk}/",
        "eval_run_progress": f"/w/{ws}/evals/runs/{tenant.eval_run.pk}/progress/",
        "eval_run_compare": f"/w/{ws}/evals/compare/?b={tenant.eval_run.pk}",
        "eval_online_rule_list": f"/w/{ws}/evals/online-rules/",
        "eval_online_rule_edit": f"/w/{ws}/evals/online-rules/{tenant.online_rule.name}/",
        "training_curation_list": f"/w/{ws}/training/curations/",
        "training_curation_create": f"/w/{ws}/training/curations/new/",
        "training_curation_detail": f"/w/{ws}/training/curations/{tenant.curation.name}/",
        "training_curation_edit": f"/w/{ws}/training/curations/{tenant.curation.name}/edit/",
        "training_export_list": f"/w/{ws}/training/exports/",
        "training_export_detail": f"/w/{ws}/training/exports/{tenant.export.pk}/",
        "training_export_progress": f"/w/{ws}/training/exports/{tenant.queued_export.pk}/progress/",
        "training_export_download": f"/w/{ws}/training/exports/{tenant.export.pk}/download/",
        "training_job_list": f"/w/{ws}/training/jobs/",
        "training_job_create": f"/w/{ws}/training/jobs/new/",
        "training_job_detail": f"/w/{ws}/training/jobs/{tenant.training_job.pk}/",
        "training_job_metrics": f"/w/{ws}/training/jobs/{tenant.training_job.pk}/metrics/",
        "training_job_adapter": f"/w/{ws}/training/jobs/{tenant.training_job.pk}/adapter/",
    }


def post_cases(tenant: Tenant) -> dict[str, tuple[str, dict[str, Any]]]:
    """Every POST of the dashboard with a valid body: each would change something if it were allowed."""
    from frontend import forms

    ws, agent, prompt = tenant.workspace.slug, tenant.agent.slug, tenant.prompt.pk
    trace_id = tenant.trajectory.trace_id
    answers = forms.requirements_form_values(requirements_answers(**{"io_gap.steps_p95": 7}))
    return {
        "agent_create": (f"/w/{ws}/agents/", {"slug": "new-agent", "name": "New agent"}),
        "requirements_save": (f"/w/{ws}/agents/{agent}/requirements/", {**answers, "message": "more steps"}),
        "requirements_validate": (f"/w/{ws}/agents/{agent}/requirements/validate/", answers),
        "requirements_activate": (f"/w/{ws}/agents/{agent}/requirements/1/activate/", {}),
        "prompt_create": (
            f"/w/{ws}/agents/{agent}/prompts/",
            {"name": "greeting", "type": "text", "template": "Hi {{name}}", "config": "{}", "labels": "production"},
        ),
        "prompt_version_create": (
            f"/w/{ws}/prompts/{prompt}/versions/",
            {"template": "Hey {{name}}", "config": "{}", "commit_message": "shorter", "labels": "production"},
        ),
        "prompt_label_move": (f"/w/{ws}/prompts/{prompt}/labels/", {"label": "production", "version": "2"}),
        "prompt_label_delete": (f"/w/{ws}/prompts/{prompt}/labels/production/delete/", {}),
        "prompt_update": (f"/w/{ws}/prompts/{prompt}/edit/", {"description": "Sorts tickets", "tags": "support"}),
        "prompt_delete": (f"/w/{ws}/prompts/{tenant.draft_prompt.pk}/delete/", {}),
        "apikey_create": (f"/w/{ws}/keys/", {"name": "new key", "scopes": ["ingest", "read"]}),
        "apikey_revoke": (f"/w/{ws}/keys/{tenant.api_key.pk}/revoke/", {}),
        "trajectory_score_create": (
            f"/w/{ws}/trajectories/{trace_id}/scores/",
            {"name": "resolved", "data_type": "boolean", "verdict": "true"},
        ),
        "trajectory_replay_create": (
            f"/w/{ws}/trajectories/{trace_id}/replays/",
            {"from_step": "3", "prompt_version": "support/triage:2", "divergence": "stop", "max_steps": "5"},
        ),
        "review_sample_create": (f"/w/{ws}/review/", {"strategy": "random", "period": "7d", "budget": "5"}),
        "review_item_decide": (
            f"/w/{ws}/review/{tenant.sample.pk}/items/1/",
            {"decision": "informative", "failure_mode": "goal_drift", "note": "answered another question"},
        ),
        "alert_acknowledge": (f"/w/{ws}/alerts/{tenant.alert.pk}/acknowledge/", {}),
        "agent_triage_save": (
            f"/w/{ws}/agents/{agent}/triage/",
            {"language": "en", "weight_loop": "0.9", "review_budget_per_day": "0"},
        ),
        "agent_alert_rule_create": (
            f"/w/{ws}/agents/{agent}/alert-rules/",
            {
                "name": "Failure rate",
                "signal": "error_status",
                "threshold_percent": "5",
                "window_minutes": "60",
                "min_trajectories": "10",
                "severity": "page",
                "cooldown_minutes": "30",
                "enabled": "on",
            },
        ),
        "agent_alert_rule_edit": (
            f"/w/{ws}/agents/{agent}/alert-rules/{tenant.rule.pk}/",
            {
                "name": "Loop rate",
                "signal": "loop",
                "threshold_percent": "3",
                "window_minutes": "60",
                "min_trajectories": "20",
                "severity": "warning",
                "cooldown_minutes": "60",
            },
        ),
        "agent_alert_rule_delete": (f"/w/{ws}/agents/{agent}/alert-rules/{tenant.rule.pk}/delete/", {}),
        "agent_delete": (f"/w/{ws}/agents/{agent}/delete/", {}),
        "agent_settings_save": (
            f"/w/{ws}/agents/{agent}/settings/",
            {"name": "Ride support", "description": "Refunds", "status": "active", "trace_retention_days": "30"},
        ),
        "langfuse_mirror_configure": (
            f"/w/{ws}/integrations/langfuse/",
            {
                "host": "https://cloud.langfuse.com",
                "public_key": "pk-lf-new",
                "secret_key": "sk-lf-new",
                "enabled": "on",
            },
        ),
        "langfuse_export_retry": (f"/w/{ws}/integrations/langfuse/retry/", {}),
        "langfuse_mirror_delete": (f"/w/{ws}/integrations/langfuse/delete/", {}),
        "model_price_set": (
            f"/w/{ws}/integrations/model-prices/",
            {"model": "acme-large", "input_usd_per_million": "3", "output_usd_per_million": "12"},
        ),
        "model_price_delete": (f"/w/{ws}/integrations/model-prices/delete/", {"model": "acme-large"}),
        "model_target_create": (
            f"/w/{ws}/model-targets/",
            {
                "alias": "strong",
                "model": "openai/gpt-4o",
                "timeout_seconds": "30",
                "max_retries": "2",
                "failure_threshold": "3",
                "cooldown_seconds": "30",
                "enabled": "on",
            },
        ),
        "model_target_edit": (
            f"/w/{ws}/model-targets/{tenant.target.alias}/",
            {
                "model": "openai/gpt-4.1-mini",
                "timeout_seconds": "20",
                "max_retries": "1",
                "failure_threshold": "3",
                "cooldown_seconds": "30",
                "enabled": "on",
            },
        ),
        "model_target_delete": (f"/w/{ws}/model-targets/{tenant.target.alias}/delete/", {}),
        "agent_router_save": (
            f"/w/{ws}/agents/{agent}/router/",
            {
                "single_call_target": "fast",
                "neighbours": "20",
                "min_neighbours": "8",
                "cost_weight": "0.3",
                "latency_weight": "0.2",
                "risk_weight": "0.1",
                "shadow_rate": "25",
                "speculative_single_call": "on",
                "cache_threshold": "0.9",
                "cache_ttl_hours": "24",
                "human_message": "A person will answer.",
                "rule-0-name": "refunds",
                "rule-0-kind": "keywords",
                "rule-0-value": "refund",
                "rule-0-to_tier": "agentic",
                "rule-0-reason": "money",
            },
        ),
        "agent_chain_save": (
            f"/w/{ws}/agents/{agent}/router/chain/",
            {
                "step-0-name": "extract",
                "step-0-instructions": "Extract the trip.",
                "step-1-name": "answer",
                "step-1-instructions": "Answer.",
                "step-1-model_target": "fast",
            },
        ),
        "agent_tool_create": (
            f"/w/{ws}/agents/{agent}/router/tools/",
            {"name": "refund_ride", "parameters": '{"type": "object", "properties": {}}', "timeout_seconds": "10"},
        ),
        "agent_tool_edit": (
            f"/w/{ws}/agents/{agent}/router/tools/{tenant.tool.name}/",
            {"name": tenant.tool.name, "description": "Find one trip", "parameters": "", "timeout_seconds": "5"},
        ),
        "agent_tool_delete": (f"/w/{ws}/agents/{agent}/router/tools/{tenant.tool.name}/delete/", {}),
        "handoff_claim": (f"/w/{ws}/handoffs/{tenant.handoff.pk}/claim/", {}),
        "handoff_resolve": (f"/w/{ws}/handoffs/{tenant.handoff.pk}/resolve/", {"resolution": "Refunded the ride."}),
        "cache_hit_review": (f"/w/{ws}/cache-review/hits/{tenant.hit.pk}/", {"verdict": "false_hit"}),
        "agent_guardrails_save": (
            f"/w/{ws}/agents/{agent}/guardrails/",
            {
                "document": json.dumps(
                    guardrail_services.guardrail_policy_get(agent=tenant.agent).document.model_dump(mode="json")
                )
            },
        ),
        "guardrail_approval_decide": (
            f"/w/{ws}/guardrails/approvals/{tenant.approval.pk}/decide/",
            {"decision": "approve", "note": "refund is fair"},
        ),
        "guardrail_budget_create": (
            f"/w/{ws}/guardrails/budgets/",
            {"scope": "agent", "period": "day", "agent": str(tenant.agent.pk), "limit_usd": "5"},
        ),
        "guardrail_budget_delete": (f"/w/{ws}/guardrails/budgets/{tenant.budget.pk}/delete/", {}),
        "eval_suites_propose": (f"/w/{ws}/evals/propose/", {"agent": agent}),
        "eval_suite_save_new": (
            f"/w/{ws}/evals/suites/new/",
            {
                "name": "nightly",
                "agent": agent,
                "dataset": "regressions",
                "target": "recorded",
                "samples": "1",
                "concurrency": "1",
                "evaluators": ["says_ok"],
            },
        ),
        "eval_suite_save": (
            f"/w/{ws}/evals/suites/{tenant.suite.name}/edit/",
            {
                "dataset": "regressions",
                "target": "recorded",
                "samples": "2",
                "concurrency": "1",
                "evaluators": ["says_ok"],
            },
        ),
        "eval_suite_run": (f"/w/{ws}/evals/suites/{tenant.suite.name}/run/", {}),
        "eval_run_cancel": (f"/w/{ws}/evals/runs/{tenant.eval_run.pk}/cancel/", {}),
        "eval_run_resume": (f"/w/{ws}/evals/runs/{tenant.eval_run.pk}/resume/", {}),
        "eval_online_rule_create": (
            f"/w/{ws}/evals/online-rules/",
            {"name": "audit-2", "agent": agent, "evaluators": ["says_ok"], "sample_rate": "1", "delay_seconds": "60"},
        ),
        "eval_online_rule_save": (
            f"/w/{ws}/evals/online-rules/{tenant.online_rule.name}/",
            {"evaluators": ["says_ok"], "sample_rate": "0.5", "delay_seconds": "60"},
        ),
        "eval_online_rule_backfill": (
            f"/w/{ws}/evals/online-rules/{tenant.online_rule.name}/backfill/",
            {"start": "2026-01-01T00:00", "end": "2026-01-02T00:00"},
        ),
        "trajectory_dataset_add": (f"/w/{ws}/trajectories/{trace_id}/dataset/", {"dataset": "regressions"}),
        "review_dataset_add": (f"/w/{ws}/review/{tenant.sample.pk}/items/1/dataset/", {"new_name": "from-review"}),
        "training_curation_create": (f"/w/{ws}/training/curations/new/", {"name": "more", **CURATION_FORM}),
        "training_curation_preview": (f"/w/{ws}/training/curations/preview/", CURATION_FORM),
        "training_curation_save": (
            f"/w/{ws}/training/curations/{tenant.curation.name}/edit/",
            {**CURATION_FORM, "description": "edited"},
        ),
        "training_curation_export": (f"/w/{ws}/training/curations/{tenant.curation.name}/export/", {"format": "art"}),
        "training_export_cancel": (f"/w/{ws}/training/exports/{tenant.queued_export.pk}/cancel/", {}),
        "training_job_create": (
            f"/w/{ws}/training/jobs/new/",
            {
                "export": str(tenant.export.pk),
                "method": "grpo",
                "base_model": "tiny-model",
                "steps": "5",
                "learning_rate": "0.00001",
                "lora_r": "8",
            },
        ),
        "training_job_cancel": (f"/w/{ws}/training/jobs/{tenant.training_job.pk}/cancel/", {}),
    }


# The curation builder's form for the tenant's curation's settings.
CURATION_FORM = {
    "grouping": "first_request",
    "reward_source": "trajectory",
    "min_group_size": "1",
    "drop_unrewarded": "on",
    "dedupe": "on",
    "dedupe_threshold": "0.9",
    "validation_share": "0",
}


def db_state() -> dict[str, list[Any]]:
    """Everything a dashboard POST could change, to assert that a refused one changed nothing."""
    return {
        "agents": list(
            Agent.objects.order_by("pk").values_list(
                "pk", "slug", "name", "description", "status", "trace_retention_days", "current_requirements_id"
            )
        ),
        "requirements_versions": list(RequirementsVersion.objects.order_by("pk").values_list("pk", "version")),
        "prompts": list(Prompt.objects.order_by("pk").values_list("pk", "name", "description", "tags")),
        "prompt_versions": list(PromptVersion.objects.order_by("pk").values_list("pk", "version")),
        "labels": list(PromptLabel.objects.order_by("pk").values_list("prompt_id", "name", "version_id")),
        "label_moves": list(PromptLabelMove.objects.order_by("pk").values_list("pk", flat=True)),
        "api_keys": list(ApiKey.objects.order_by("pk").values_list("pk", "revoked_at")),
        "trajectories": list(Trajectory.objects.order_by("pk").values_list("pk", "trace_id", "status")),
        "scores": list(Score.objects.order_by("pk").values_list("pk", "name", "value", "string_value")),
        "replays": list(Replay.objects.order_by("pk").values_list("pk", "status")),
        "triage_settings": list(TriageSettings.objects.order_by("pk").values_list("pk", "weights", "language")),
        "review_samples": list(ReviewSample.objects.order_by("pk").values_list("pk", "strategy")),
        "review_items": list(
            ReviewItem.objects.order_by("pk").values_list("pk", "status", "informative", "failure_mode", "note")
        ),
        "alert_rules": list(AlertRule.objects.order_by("pk").values_list("pk", "name", "threshold", "enabled")),
        "alerts": list(Alert.objects.order_by("pk").values_list("pk", "acknowledged_at")),
        "langfuse_mirrors": list(
            LangfuseMirror.objects.order_by("pk").values_list(
                "pk", "workspace_id", "host", "public_key", "secret_key_encrypted", "enabled"
            )
        ),
        "langfuse_exports": list(LangfuseExport.objects.order_by("pk").values_list("pk", "status", "attempts")),
        "model_prices": list(
            ModelPriceOverride.objects.order_by("pk").values_list(
                "pk", "model", "input_usd_per_million", "output_usd_per_million", "cache_read_usd_per_million"
            )
        ),
        "model_targets": list(
            ModelTarget.objects.order_by("pk").values_list(
                "pk", "alias", "model", "api_key_encrypted", "timeout_seconds", "enabled", "fallbacks"
            )
        ),
        "router_configs": list(
            RouterConfig.objects.order_by("pk").values_list(
                "pk", "single_call_target_id", "rules", "shadow_rate", "cache_threshold", "human_message"
            )
        ),
        "chain_steps": list(ChainStep.objects.order_by("pk").values_list("pk", "name", "instructions")),
        "agent_tools": list(
            AgentTool.objects.order_by("pk").values_list("pk", "name", "description", "endpoint_secret_encrypted")
        ),
        "handoffs": list(Handoff.objects.order_by("pk").values_list("pk", "status", "assigned_to_id", "resolution")),
        "cache_hits": list(CacheHit.objects.order_by("pk").values_list("pk", "false_hit", "reviewed_by_id")),
        "guardrail_policies": list(
            GuardrailPolicy.objects.order_by("pk").values_list("pk", "document", "canary_secret_encrypted")
        ),
        "approvals": list(ApprovalRequest.objects.order_by("pk").values_list("pk", "status", "decided_by_id")),
        "approval_events": list(ApprovalEvent.objects.order_by("pk").values_list("pk", "kind")),
        "budgets": list(
            Budget.objects.order_by("pk").values_list(
                "pk", "scope", "scope_value", "period", "limit_usd", "limit_tokens"
            )
        ),
        "eval_suites": list(
            Suite.objects.order_by("pk").values_list("pk", "name", "samples", "schedule_cron", "dataset_id")
        ),
        "eval_runs": list(Run.objects.order_by("pk").values_list("pk", "status", "resume_after")),
        "online_rules": list(OnlineRule.objects.order_by("pk").values_list("pk", "name", "sample_rate", "enabled")),
        "datasets": list(Dataset.objects.order_by("pk").values_list("pk", "name")),
        "dataset_versions": list(DatasetVersion.objects.order_by("pk").values_list("pk", "version")),
        "curations": list(
            Curation.objects.order_by("pk").values_list(
                "pk", "name", "description", "query", "grouping", "reward", "filters"
            )
        ),
        "exports": list(Export.objects.order_by("pk").values_list("pk", "status", "format")),
        "training_jobs": list(TrainingJob.objects.order_by("pk").values_list("pk", "status", "config")),
    }
