"""Who may call what: every route of `config.urls` against every role.

The routes come from the URL configuration (tests/security/routes.py: Django's resolver walked to its
leaves, each django-ninja operation with its methods). The tables below say, for each route, who is let
in: the key scope an API operation needs, the membership role a dashboard page needs to be read and to
be posted to. A route the tables do not name fails `test_every_route_has_an_entry`, and so does an
entry whose route is gone, so a new endpoint cannot go untested.

Each route is then called, with a real request on rows of our workspace (world.py), by every role:
anonymous, a viewer, a member and an owner of our workspace, the owner of another workspace, a key with
each scope (read from `Scope`, so a new scope is a new column), the other workspace's key with every
scope, and our expired and revoked keys with every scope. A refused caller gets exactly the status the
table implies (401 without a live key, 403 without the scope or role, 404 for another workspace's rows,
a redirect to sign in for a dashboard page without a session). An allowed API caller gets the status the
entry states for its request; an allowed dashboard reader gets 200. Each request runs in a savepoint
that is rolled back after it, so a delete by an allowed caller takes nothing from the next caller.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.http import HttpResponseBase
from django.test import Client
from django.urls import resolve, reverse

from agent_registry.models import Role, Scope
from agent_registry.tests.factories import UserFactory, requirements_answers
from frontend.tests.conftest import page_urls, post_cases
from tests.security.routes import Route, all_routes, example_url
from tests.security.world import KEY_ROLES, KEYS, ROLES, SESSION_ROLES, World, rolled_back

pytestmark = pytest.mark.django_db

READ, WRITE, INGEST, GATEWAY, TRAIN = (
    Scope.READ.value,
    Scope.WRITE.value,
    Scope.INGEST.value,
    Scope.GATEWAY.value,
    Scope.TRAIN.value,
)
OBJECT, WORKSPACE = "object", "workspace"
# Placeholders for our rows in paths and bodies: <agent>, <trace>, ... (world.py: World.values).
PLACEHOLDER = re.compile(r"<(\w+)>")
NDJSON = "application/x-ndjson"
ROLLOUT = (
    b'{"responses_create_params": {"input": [{"role": "user", "content": "Where is my receipt?"}]},'
    b' "response": {"output": [{"type": "message", "role": "assistant",'
    b' "content": [{"type": "output_text", "text": "It is in your inbox."}]}]},'
    b' "reward": 1.0, "task_id": "receipt"}\n'
)


@dataclass(frozen=True)
class Api:
    """One API request and who may make it. `ok` is what a key with one of `scopes` gets for it.

    `tenancy` says what the other workspace's key (holding every scope) must get: OBJECT when the request
    names a row of ours (path or body), which it must not find (404); WORKSPACE when the request acts on
    the caller's own workspace, which it may, seeing nothing of ours. By default a path with a
    placeholder names a row."""

    method: str
    path: str
    scopes: frozenset[str]
    ok: int
    body: Any = None
    content_type: str = "application/json"
    tenancy: str = ""
    # What the other workspace's key gets where that is not "let in": 404 for a resource its workspace
    # does not have (a singleton such as the Langfuse mirror).
    other: int | None = None

    @property
    def names_our_rows(self) -> bool:
        return self.tenancy == OBJECT or (not self.tenancy and "<" in self.path)


@dataclass(frozen=True)
class Public:
    """A request every caller gets the same answer to. The OpenAPI schemas take seconds to build, and
    their view reads no credentials at all, so they are asked for by a visitor, a session and a key
    rather than by every role."""

    method: str
    path: str
    status: int
    costly: bool = False


def api(method: str, path: str, scope: str | tuple[str, ...], ok: int, body: Any = None, **options: Any) -> Api:
    scopes = frozenset((scope,) if isinstance(scope, str) else scope)
    return Api(method=method, path=path, scopes=scopes, ok=ok, body=body, **options)


def get(path: str, scope: str = READ, ok: int = 200, **options: Any) -> Api:
    return api("GET", path, scope, ok, **options)


# --- The API ---------------------------------------------------------------------------------------------

API: dict[str, Api | Public] = {
    # agent_registry
    "api:workspace_get_api": get("/api/v1/workspace"),
    "api:agent_list_api": get("/api/v1/agents"),
    "api:agent_create_api": api("POST", "/api/v1/agents", WRITE, 201, {"slug": "matrix-agent", "name": "Matrix"}),
    "api:agent_get_api": get("/api/v1/agents/<agent>"),
    "api:agent_update_api": api("PATCH", "/api/v1/agents/<agent>", WRITE, 200, {"description": "Changed"}),
    "api:agent_delete_api": api("DELETE", "/api/v1/agents/<agent>", WRITE, 204),
    "api:requirements_schema_api": get("/api/v1/requirements/schema"),
    "api:requirements_check_api": api(
        "POST", "/api/v1/requirements/check", READ, 200, {"answers": requirements_answers()}
    ),
    "api:requirements_version_list_api": get("/api/v1/agents/<agent>/requirements"),
    "api:requirements_version_create_api": api(
        "POST", "/api/v1/agents/<agent>/requirements", WRITE, 201, {"answers": requirements_answers(), "message": "m"}
    ),
    "api:requirements_current_api": get("/api/v1/agents/<agent>/requirements/current"),
    "api:requirements_diff_api": get("/api/v1/agents/<agent>/requirements/diff?from_version=1&to_version=2"),
    "api:requirements_version_get_api": get("/api/v1/agents/<agent>/requirements/1"),
    "api:requirements_version_activate_api": api("POST", "/api/v1/agents/<agent>/requirements/1/activate", WRITE, 200),
    "api:agent_feasibility_api": get("/api/v1/agents/<agent>/feasibility"),
    "api:agent_configuration_api": get("/api/v1/agents/<agent>/configuration"),
    "api:prompt_list_api": get("/api/v1/prompts"),
    "api:prompt_create_api": api(
        "POST",
        "/api/v1/prompts",
        WRITE,
        201,
        {"agent": "<agent>", "name": "matrix/new", "template": "Hi {{name}}"},
        tenancy=OBJECT,
    ),
    "api:prompt_version_list_api": get("/api/v1/prompts/<prompt>/versions"),
    "api:prompt_version_create_api": api(
        "POST", "/api/v1/prompts/<prompt>/versions", WRITE, 201, {"template": "Hello again {{name}}"}
    ),
    "api:prompt_version_get_api": get("/api/v1/prompts/<prompt>/versions/1"),
    # Versions are immutable: the operation exists to say so, to a caller allowed to write.
    "api:prompt_version_edit_api": api("PUT", "/api/v1/prompts/<prompt>/versions/1", WRITE, 405),
    "api:prompt_label_history_api": get("/api/v1/prompts/<prompt>/labels"),
    "api:prompt_label_move_api": api("PUT", "/api/v1/prompts/<prompt>/labels/staging", WRITE, 200, {"version": 2}),
    "api:prompt_label_delete_api": api("DELETE", "/api/v1/prompts/<prompt>/labels/production", WRITE, 204),
    "api:prompt_diff_api": get("/api/v1/prompts/<prompt>/diff?from_version=1&to_version=2"),
    "api:prompt_render_api": api(
        "POST", "/api/v1/prompts/<prompt>/render", READ, 200, {"variables": {"name": "Ada", "topic": "refunds"}}
    ),
    "api:prompt_get_api": get("/api/v1/prompts/<prompt>"),
    "api:prompt_update_api": api("PATCH", "/api/v1/prompts/<prompt>", WRITE, 200, {"description": "Sorts"}),
    "api:prompt_delete_api": api("DELETE", "/api/v1/prompts/<draft_prompt>", WRITE, 204),
    "api:apikey_list_api": get("/api/v1/keys"),
    "api:apikey_create_api": api("POST", "/api/v1/keys", WRITE, 201, {"name": "matrix", "scopes": [WRITE]}),
    "api:apikey_revoke_api": api("DELETE", "/api/v1/keys/<key>", WRITE, 200),
    # The audit log covers the whole workspace: a write key reads it (owners, in the dashboard).
    "api:audit_event_list_api": get("/api/v1/audit-events", scope=WRITE),
    # tracing
    "api:trajectories_ingest_api": api(
        "POST",
        "/api/v1/ingest/trajectories",
        INGEST,
        202,
        {"messages": [{"role": "user", "content": "Where is my refund?"}, {"role": "assistant", "content": "Sent."}]},
    ),
    "api:trajectory_list_api": get("/api/v1/trajectories"),
    "api:trajectory_get_api": get("/api/v1/trajectories/<trace>"),
    "api:trajectory_score_list_api": get("/api/v1/trajectories/<trace>/scores"),
    "api:score_create_api": api(
        "POST", "/api/v1/trajectories/<trace>/scores", WRITE, 201, {"name": "resolved", "value": 1.0}
    ),
    "api:session_list_api": get("/api/v1/sessions"),
    "api:session_get_api": get("/api/v1/sessions/<session>"),
    "api:model_price_list_api": get("/api/v1/model-prices"),
    "api:model_price_set_api": api(
        "PUT",
        "/api/v1/model-prices",
        WRITE,
        200,
        {"model": "matrix-model", "input_usd_per_million": 1, "output_usd_per_million": 2},
    ),
    "api:model_price_delete_api": api("DELETE", "/api/v1/model-prices/<price>", WRITE, 204),
    "api:replay_create_api": api("POST", "/api/v1/trajectories/<trace>/replays", WRITE, 202, {"from_step": 3}),
    "api:replay_list_api": get("/api/v1/trajectories/<trace>/replays"),
    "api:replay_get_api": get("/api/v1/replays/<replay>"),
    # The replay has not run (no worker here): its diff is not there yet, to a caller allowed to read it.
    "api:replay_diff_api": get("/api/v1/replays/<replay>/diff", ok=409),
    "api:langfuse_mirror_get_api": get("/api/v1/integrations/langfuse", other=404),
    "api:langfuse_mirror_configure_api": api(
        "PUT",
        "/api/v1/integrations/langfuse",
        WRITE,
        200,
        {"host": "https://langfuse.example.com", "public_key": "pk-lf-matrix", "secret_key": "sk-lf-matrix"},
    ),
    "api:langfuse_mirror_delete_api": api("DELETE", "/api/v1/integrations/langfuse", WRITE, 204),
    "api:langfuse_export_retry_api": api("POST", "/api/v1/integrations/langfuse/retry", WRITE, 200, other=404),
    "api:triage_settings_get_api": get("/api/v1/agents/<agent>/triage-settings"),
    "api:triage_settings_update_api": api(
        "PUT", "/api/v1/agents/<agent>/triage-settings", WRITE, 200, {"language": "es"}
    ),
    "api:review_sample_list_api": get("/api/v1/review/samples"),
    "api:review_sample_create_api": api("POST", "/api/v1/review/samples", WRITE, 201, {"strategy": "random"}),
    "api:review_sample_get_api": get("/api/v1/review/samples/<sample>"),
    "api:review_item_decide_api": api(
        "PUT",
        "/api/v1/review/items/<item>",
        WRITE,
        200,
        {"informative": True, "failure_mode": "goal_drift", "note": "answered another question"},
    ),
    "api:review_failure_mode_list_api": get("/api/v1/review/failure-modes"),
    "api:review_informativeness_api": get("/api/v1/review/informativeness"),
    "api:trajectory_otlp_api": get("/api/v1/trajectories/<trace>/otlp"),
    "api:alert_rule_list_api": get("/api/v1/alert-rules"),
    "api:alert_rule_create_api": api(
        "POST",
        "/api/v1/alert-rules",
        WRITE,
        201,
        {"name": "Matrix", "signal": "loop", "threshold": 0.1, "agent": "<agent>"},
        tenancy=OBJECT,
    ),
    "api:alert_rule_get_api": get("/api/v1/alert-rules/<rule>"),
    "api:alert_rule_update_api": api(
        "PUT", "/api/v1/alert-rules/<rule>", WRITE, 200, {"name": "Loop rate", "signal": "loop", "threshold": 0.2}
    ),
    "api:alert_rule_delete_api": api("DELETE", "/api/v1/alert-rules/<rule>", WRITE, 204),
    "api:alert_list_api": get("/api/v1/alerts"),
    "api:alert_get_api": get("/api/v1/alerts/<alert>"),
    "api:alert_acknowledge_api": api("POST", "/api/v1/alerts/<alert>/acknowledge", WRITE, 200),
    # routing
    "api:model_target_list_api": get("/api/v1/model-targets"),
    "api:model_target_create_api": api(
        "POST", "/api/v1/model-targets", WRITE, 201, {"alias": "matrix-new", "model": "openai/gpt-4o"}
    ),
    "api:model_target_get_api": get("/api/v1/model-targets/<target>"),
    "api:model_target_update_api": api("PATCH", "/api/v1/model-targets/<target>", WRITE, 200, {"timeout_seconds": 20}),
    "api:model_target_delete_api": api("DELETE", "/api/v1/model-targets/<gateway_target>", WRITE, 204),
    "api:router_config_get_api": get("/api/v1/agents/<agent>/router"),
    "api:router_config_update_api": api("PUT", "/api/v1/agents/<agent>/router", WRITE, 200, {"shadow_rate": 0.2}),
    "api:chain_get_api": get("/api/v1/agents/<agent>/chain"),
    "api:chain_set_api": api(
        "PUT", "/api/v1/agents/<agent>/chain", WRITE, 200, {"steps": [{"name": "draft", "instructions": "Draft."}]}
    ),
    "api:agent_tool_list_api": get("/api/v1/agents/<agent>/tools"),
    "api:agent_tool_create_api": api(
        "POST", "/api/v1/agents/<agent>/tools", WRITE, 201, {"name": "refund_ride", "description": "Refund a ride"}
    ),
    "api:agent_tool_update_api": api(
        "PATCH", "/api/v1/agents/<agent>/tools/<tool>", WRITE, 200, {"description": "Find one trip"}
    ),
    "api:agent_tool_delete_api": api("DELETE", "/api/v1/agents/<agent>/tools/<tool>", WRITE, 204),
    "api:routing_decision_list_api": get("/api/v1/routing-decisions"),
    "api:routing_decision_get_api": get("/api/v1/routing-decisions/<decision>"),
    "api:router_report_api": get("/api/v1/agents/<agent>/router-report"),
    "api:handoff_list_api": get("/api/v1/handoffs"),
    "api:handoff_resolve_api": api(
        "POST", "/api/v1/handoffs/<handoff>/resolve", WRITE, 200, {"resolution": "Refunded the ride."}
    ),
    # guardrails: an agent checks its own traffic with its gateway key; a write key may too.
    "api:guardrail_check_api": api(
        "POST",
        "/api/v1/guardrails/check",
        (GATEWAY, WRITE),
        200,
        {"agent": "<agent>", "layer": "input", "content": "Where is my refund?"},
        tenancy=OBJECT,
    ),
    "api:tool_call_authorize_api": api(
        "POST",
        "/api/v1/guardrails/tool-calls",
        (GATEWAY, WRITE),
        200,
        {"agent": "<agent>", "tool": "<tool>", "arguments": {"trip_id": "T-1"}},
        tenancy=OBJECT,
    ),
    "api:guardrail_policy_get_api": get("/api/v1/agents/<agent>/guardrail-policy"),
    "api:guardrail_policy_update_api": api("PUT", "/api/v1/agents/<agent>/guardrail-policy", WRITE, 200, "<policy>"),
    "api:violation_list_api": get("/api/v1/guardrails/violations"),
    "api:approval_list_api": get("/api/v1/approvals"),
    "api:approval_get_api": get("/api/v1/approvals/<approval>"),
    "api:approval_decide_api": api(
        "POST", "/api/v1/approvals/<approval>/decide", WRITE, 200, {"approved": True, "note": "fair"}
    ),
    "api:budget_list_api": get("/api/v1/budgets"),
    "api:budget_create_api": api(
        "POST", "/api/v1/budgets", WRITE, 201, {"scope": "workspace", "period": "day", "limit_usd": 5}
    ),
    "api:budget_delete_api": api("DELETE", "/api/v1/budgets/<budget>", WRITE, 204),
    "api:budget_status_api": get("/api/v1/budgets/status"),
    # evals
    "api:dataset_list_api": get("/api/v1/datasets"),
    "api:dataset_create_api": api("POST", "/api/v1/datasets", WRITE, 201, {"name": "matrix-set"}),
    "api:dataset_get_api": get("/api/v1/datasets/<dataset>"),
    "api:dataset_version_list_api": get("/api/v1/datasets/<dataset>/versions"),
    "api:dataset_version_create_api": api(
        "POST", "/api/v1/datasets/<dataset>/versions", WRITE, 201, {"items": [{"task": "Where is my receipt?"}]}
    ),
    "api:dataset_upload_api": api(
        "POST",
        "/api/v1/datasets/<dataset>/upload?format=jsonl",
        WRITE,
        201,
        b'{"task": "Where is my receipt?"}\n',
        content_type=NDJSON,
    ),
    "api:dataset_add_trajectories_api": api(
        "POST", "/api/v1/datasets/<dataset>/from-trajectories", WRITE, 201, {"trace_ids": ["<trace>"]}
    ),
    "api:dataset_version_download_api": get("/api/v1/datasets/<dataset>/versions/1/download"),
    "api:dataset_version_items_api": get("/api/v1/datasets/<dataset>/versions/1/items"),
    "api:evaluator_list_api": get("/api/v1/evaluators"),
    "api:evaluator_create_api": api(
        "POST", "/api/v1/evaluators", WRITE, 201, {"name": "matrix_eval", "config": {"type": "regex", "pattern": "ok"}}
    ),
    "api:evaluator_versions_api": get("/api/v1/evaluators/<evaluator>/versions"),
    "api:evaluator_version_create_api": api(
        "POST", "/api/v1/evaluators/<evaluator>/versions", WRITE, 201, {"config": {"type": "regex", "pattern": "yes"}}
    ),
    "api:evaluator_calibration_api": get("/api/v1/evaluators/<evaluator>/calibration"),
    "api:suite_list_api": get("/api/v1/suites"),
    "api:suite_create_api": api(
        "POST",
        "/api/v1/suites",
        WRITE,
        201,
        {
            "name": "matrix-suite",
            "agent": "<agent>",
            "dataset": "<dataset>",
            "target": "recorded",
            "evaluators": ["<evaluator>"],
        },
        tenancy=OBJECT,
    ),
    "api:suite_propose_api": api("POST", "/api/v1/suites/propose", WRITE, 201, {"agent": "<agent>"}, tenancy=OBJECT),
    "api:suite_get_api": get("/api/v1/suites/<suite>"),
    "api:suite_update_api": api("PATCH", "/api/v1/suites/<suite>", WRITE, 200, {"description": "Nightly"}),
    "api:suite_delete_api": api("DELETE", "/api/v1/suites/<suite>", WRITE, 204),
    "api:suite_history_api": get("/api/v1/suites/<suite>/history"),
    "api:run_create_api": api("POST", "/api/v1/suites/<suite>/runs", WRITE, 202, {"name": "matrix run"}),
    "api:run_list_api": get("/api/v1/runs"),
    "api:run_compare_api": get("/api/v1/runs/compare?baseline=<run>&candidate=<run>", tenancy=OBJECT),
    "api:run_import_api": api("POST", "/api/v1/runs/import?name=matrix", WRITE, 201, ROLLOUT, content_type=NDJSON),
    "api:run_get_api": get("/api/v1/runs/<run>"),
    "api:run_items_api": get("/api/v1/runs/<run>/items"),
    "api:run_cancel_api": api("POST", "/api/v1/runs/<run>/cancel", WRITE, 200),
    "api:run_resume_api": api("POST", "/api/v1/runs/<run>/resume", WRITE, 200),
    "api:run_rollouts_api": get("/api/v1/runs/<run>/rollouts"),
    "api:online_rule_list_api": get("/api/v1/online-rules"),
    "api:online_rule_create_api": api(
        "POST",
        "/api/v1/online-rules",
        WRITE,
        201,
        {"name": "matrix-rule", "agent": "<agent>", "evaluators": ["<evaluator>"]},
        tenancy=OBJECT,
    ),
    "api:online_rule_get_api": get("/api/v1/online-rules/<online_rule>"),
    "api:online_rule_update_api": api("PATCH", "/api/v1/online-rules/<online_rule>", WRITE, 200, {"sample_rate": 0.5}),
    "api:online_rule_backfill_api": api(
        "POST",
        "/api/v1/online-rules/<online_rule>/backfill",
        WRITE,
        202,
        {"start": "2026-01-01T00:00:00Z", "end": "2026-01-02T00:00:00Z"},
    ),
    "api:regression_list_api": get("/api/v1/regressions"),
    # trainer_bridge
    "api:curation_list_api": get("/api/v1/curations"),
    "api:curation_create_api": api(
        "POST", "/api/v1/curations", WRITE, 201, {"name": "matrix-curation", "reward": {"source": "trajectory"}}
    ),
    "api:curation_preview_unsaved_api": api(
        "POST", "/api/v1/curations/preview", READ, 200, {"reward": {"source": "trajectory"}}
    ),
    "api:curation_get_api": get("/api/v1/curations/<curation>"),
    "api:curation_update_api": api("PATCH", "/api/v1/curations/<curation>", WRITE, 200, {"description": "Kept"}),
    "api:curation_preview_api": get("/api/v1/curations/<curation>/preview"),
    "api:export_create_api": api("POST", "/api/v1/curations/<curation>/exports", WRITE, 202, {"format": "art"}),
    "api:export_list_api": get("/api/v1/exports"),
    "api:export_get_api": get("/api/v1/exports/<export>"),
    "api:export_cancel_api": api("POST", "/api/v1/exports/<queued_export>/cancel", WRITE, 200),
    "api:export_download_api": get("/api/v1/exports/<export>/download"),
    "api:export_manifest_api": get("/api/v1/exports/<export>/manifest"),
    "api:job_list_api": get("/api/v1/training-jobs"),
    "api:job_create_api": api(
        "POST",
        "/api/v1/training-jobs",
        WRITE,
        201,
        {"export": "<export>", "method": "grpo", "base_model": "tiny-model"},
        tenancy=OBJECT,
    ),
    "api:job_get_api": get("/api/v1/training-jobs/<job>"),
    "api:job_cancel_api": api("POST", "/api/v1/training-jobs/<job>/cancel", WRITE, 200),
    "api:job_adapter_download_api": get("/api/v1/training-jobs/<job>/adapter"),
    # The GPU worker's side: a `train` key only, and no read or write key can act as a worker.
    "api:job_claim_api": api("POST", "/api/v1/training-jobs/claim", TRAIN, 200, {"worker": "matrix-gpu-2"}),
    "api:job_data_api": get("/api/v1/training-jobs/<job>/data/train", scope=TRAIN),
    "api:job_heartbeat_api": api("POST", "/api/v1/training-jobs/<job>/heartbeat", TRAIN, 204),
    "api:job_metrics_api": api(
        "POST", "/api/v1/training-jobs/<job>/metrics", TRAIN, 204, {"step": 3, "metrics": {"loss": 0.5}}
    ),
    "api:job_adapter_api": api(
        "POST", "/api/v1/training-jobs/<job>/adapter", TRAIN, 204, {"location": "s3://adapters/matrix"}
    ),
    "api:job_finish_api": api(
        "POST", "/api/v1/training-jobs/<job>/finish", TRAIN, 200, {"status": "failed", "error": "out of memory"}
    ),
    # The paths Langfuse's SDKs call (they send Basic auth; a Bearer key works as well).
    "langfuse:langfuse_prompt_get_api": get("/api/public/v2/prompts/<prompt>"),
    "langfuse:langfuse_prompt_create_api": api(
        "POST", "/api/public/v2/prompts", WRITE, 201, {"name": "<prompt>", "prompt": "Hey {{name}}"}, tenancy=OBJECT
    ),
    # Another workspace's key may score a trace id it names: the score waits in its own workspace.
    "langfuse:langfuse_scores_create_api": api(
        "POST",
        "/api/public/scores",
        INGEST,
        202,
        [{"traceId": "<trace>", "name": "matrix", "value": 1}],
        tenancy=WORKSPACE,
    ),
    # OTLP and the gateway: Django views outside ninja, authenticated the same way.
    "otlp-traces": api("POST", "/v1/traces", INGEST, 200, {"resourceSpans": []}),
    "langfuse-otlp-traces": api("POST", "/api/public/otel/v1/traces", INGEST, 200, {"resourceSpans": []}),
    "gateway-chat-completions": api(
        "POST",
        "/v1/chat/completions",
        GATEWAY,
        200,
        {"model": "<gateway_target>", "messages": [{"role": "user", "content": "Where is my refund?"}]},
        tenancy=OBJECT,
    ),
    "gateway-models": get("/v1/models", scope=GATEWAY),
    "gateway-model": get("/v1/models/<gateway_target>", scope=GATEWAY),
    # The API's description is public, as the contract says (DESIGN.md); the roots only name the docs.
    "api:openapi-json": Public("GET", "/api/v1/openapi.json", 200, costly=True),
    "api:openapi-view": Public("GET", "/api/v1/docs", 200),
    "api:api-root": Public("GET", "/api/v1/", 404),
    "langfuse:openapi-json": Public("GET", "/api/public/openapi.json", 200, costly=True),
    "langfuse:api-root": Public("GET", "/api/public/", 404),
}


# --- The dashboard ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Page:
    """A dashboard route: the methods it answers, the role that may read it and the role that may post."""

    methods: tuple[str, ...]
    view: Role = Role.VIEWER
    post: Role = Role.MEMBER
    # A page names a row of ours when its path has more than the workspace in it, or when this says so
    # (a row named in the query string).
    names_a_row: bool = False


GET_ONLY = Page(("GET",))
POST_ONLY = Page(("POST",))
FORM = Page(("GET", "POST"))
# A confirmation page before a destructive post: only those who may post see it.
CONFIRM = Page(("GET", "POST"), view=Role.MEMBER)
OWNER_CONFIRM = Page(("GET", "POST"), view=Role.OWNER, post=Role.OWNER)

DASHBOARD: dict[str, Page] = {
    "frontend:workspace_home": GET_ONLY,
    "frontend:agent_list": FORM,
    "frontend:agent_detail": GET_ONLY,
    "frontend:requirements_edit": FORM,
    "frontend:requirements_validate": POST_ONLY,
    "frontend:requirements_history": GET_ONLY,
    "frontend:requirements_activate": POST_ONLY,
    "frontend:configuration": GET_ONLY,
    "frontend:agent_prompt_list": FORM,
    "frontend:agent_trajectory_list": GET_ONLY,
    "frontend:agent_triage": FORM,
    "frontend:agent_signals": GET_ONLY,
    "frontend:agent_alert_rules": FORM,
    "frontend:agent_alert_rule_edit": FORM,
    "frontend:agent_alert_rule_delete": POST_ONLY,
    "frontend:agent_settings": FORM,
    "frontend:agent_delete": CONFIRM,
    "frontend:agent_router": FORM,
    "frontend:agent_chain_save": POST_ONLY,
    "frontend:agent_tool_create": POST_ONLY,
    "frontend:agent_tool_edit": FORM,
    "frontend:agent_tool_delete": POST_ONLY,
    "frontend:agent_router_report": GET_ONLY,
    "frontend:agent_guardrails": FORM,
    "frontend:prompt_list": GET_ONLY,
    "frontend:prompt_detail": GET_ONLY,
    "frontend:prompt_version_create": POST_ONLY,
    "frontend:prompt_label_move": POST_ONLY,
    "frontend:prompt_label_delete": CONFIRM,
    "frontend:prompt_update": POST_ONLY,
    "frontend:prompt_delete": CONFIRM,
    "frontend:prompt_render": GET_ONLY,
    "frontend:trajectory_list": GET_ONLY,
    "frontend:trajectory_detail": GET_ONLY,
    "frontend:trajectory_score_create": POST_ONLY,
    "frontend:trajectory_replay_create": POST_ONLY,
    "frontend:trajectory_dataset_add": POST_ONLY,
    "frontend:replay_detail": GET_ONLY,
    "frontend:session_list": GET_ONLY,
    "frontend:session_detail": GET_ONLY,
    "frontend:review_list": FORM,
    "frontend:review_informativeness": GET_ONLY,
    "frontend:review_sample": GET_ONLY,
    "frontend:review_item": FORM,
    "frontend:review_dataset_add": POST_ONLY,
    "frontend:alert_list": GET_ONLY,
    "frontend:alert_acknowledge": POST_ONLY,
    # Keys and the Langfuse mirror (which holds a secret) are the owner's.
    "frontend:apikey_list": Page(("GET", "POST"), post=Role.OWNER),
    "frontend:apikey_revoke": OWNER_CONFIRM,
    "frontend:integration_list": GET_ONLY,
    "frontend:langfuse_mirror_configure": Page(("POST",), post=Role.OWNER),
    "frontend:langfuse_export_retry": Page(("POST",), post=Role.OWNER),
    "frontend:langfuse_mirror_delete": OWNER_CONFIRM,
    "frontend:audit_event_list": Page(("GET",), view=Role.OWNER),
    "frontend:model_price_set": POST_ONLY,
    "frontend:model_price_delete": POST_ONLY,
    "frontend:model_target_list": FORM,
    "frontend:model_target_edit": FORM,
    "frontend:model_target_delete": FORM,
    "frontend:routing_decision_list": GET_ONLY,
    "frontend:routing_decision_detail": GET_ONLY,
    "frontend:handoff_list": GET_ONLY,
    "frontend:handoff_claim": POST_ONLY,
    "frontend:handoff_resolve": POST_ONLY,
    "frontend:cache_review": GET_ONLY,
    "frontend:cache_hit_review": POST_ONLY,
    "frontend:guardrail_violation_list": GET_ONLY,
    "frontend:guardrail_approval_list": GET_ONLY,
    "frontend:guardrail_approval_detail": GET_ONLY,
    "frontend:guardrail_approval_decide": POST_ONLY,
    "frontend:guardrail_budget_list": FORM,
    "frontend:guardrail_budget_delete": POST_ONLY,
    "frontend:eval_overview": GET_ONLY,
    "frontend:eval_suites_propose": POST_ONLY,
    "frontend:eval_suite_create": FORM,
    "frontend:eval_suite_detail": GET_ONLY,
    "frontend:eval_suite_edit": FORM,
    "frontend:eval_suite_run": POST_ONLY,
    "frontend:eval_run_list": GET_ONLY,
    "frontend:eval_run_detail": GET_ONLY,
    "frontend:eval_run_progress": GET_ONLY,
    "frontend:eval_run_cancel": POST_ONLY,
    "frontend:eval_run_resume": POST_ONLY,
    "frontend:eval_run_compare": Page(("GET",), names_a_row=True),
    "frontend:eval_online_rule_list": FORM,
    "frontend:eval_online_rule_edit": FORM,
    "frontend:eval_online_rule_backfill": POST_ONLY,
    "frontend:training_curation_list": GET_ONLY,
    "frontend:training_curation_create": FORM,
    "frontend:training_curation_preview": POST_ONLY,
    "frontend:training_curation_detail": GET_ONLY,
    "frontend:training_curation_edit": FORM,
    "frontend:training_curation_export": POST_ONLY,
    "frontend:training_export_list": GET_ONLY,
    "frontend:training_export_detail": GET_ONLY,
    "frontend:training_export_progress": GET_ONLY,
    "frontend:training_export_cancel": POST_ONLY,
    "frontend:training_export_download": GET_ONLY,
    "frontend:training_job_list": GET_ONLY,
    "frontend:training_job_create": FORM,
    "frontend:training_job_detail": GET_ONLY,
    "frontend:training_job_metrics": GET_ONLY,
    "frontend:training_job_cancel": POST_ONLY,
    "frontend:training_job_adapter": GET_ONLY,
}

# Sign-in, sign-out and the landing page need no membership. {(method, who): (status, where it sends)};
# a visitor has no session (anonymous, or any key: keys do not open the dashboard), a user has one.
SIGN_IN: dict[str, tuple[str, dict[tuple[str, str], tuple[int, str]]]] = {
    "frontend:login": (
        "/login/",
        {
            ("GET", "visitor"): (200, ""),
            ("POST", "visitor"): (200, ""),  # no credentials: the form again, with its error
            ("GET", "user"): (302, "/"),
            ("POST", "user"): (302, "/"),
        },
    ),
    "frontend:logout": (
        "/logout/",
        {
            ("GET", "visitor"): (405, ""),
            ("POST", "visitor"): (302, "/login/"),
            ("GET", "user"): (405, ""),
            ("POST", "user"): (302, "/login/"),
        },
    ),
    "frontend:home": (
        "/",
        {
            ("GET", "visitor"): (302, "/login/"),
            ("POST", "visitor"): (405, ""),
            ("GET", "user"): (302, "/w/"),
            ("POST", "user"): (405, ""),
        },
    ),
}

# Everything under admin/ is Django's admin site: staff only. None of the roles is staff, so each is sent
# to the admin's sign-in page, but for the sign-in page itself and sign-out (back to the admin's index,
# which then asks for sign-in).
ADMIN_PREFIX = "admin:"
ADMIN_EXCEPTIONS: dict[str, tuple[int, str]] = {
    "admin:login": (200, ""),
    "admin:logout": (302, "/admin/"),
}


def _routes() -> list[Route]:
    return all_routes()


ROUTES = _routes()
API_ROUTES = [route for route in ROUTES if route.name in API or route.namespace in ("api", "langfuse")]
DASHBOARD_ROUTES = [route for route in ROUTES if route.namespace == "frontend"]


# --- Making the calls -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    status: int
    location: str
    content: str

    def __str__(self) -> str:
        where = f" -> {self.location}" if self.location else ""
        return f"{self.status}{where} {self.content[:160]!r}"


def fill(value: Any, values: dict[str, Any]) -> Any:
    """Our rows' ids and names in place of <placeholders>; a placeholder alone keeps its value's type."""
    if isinstance(value, str):
        whole = PLACEHOLDER.fullmatch(value)
        if whole:
            return values[whole[1]]
        return PLACEHOLDER.sub(lambda match: str(values[match[1]]), value)
    if isinstance(value, dict):
        return {key: fill(item, values) for key, item in value.items()}
    if isinstance(value, list):
        return [fill(item, values) for item in value]
    return value


def _content(response: HttpResponseBase) -> str:
    # The test client closes a response itself (a streamed one once it is read to the end); closing it
    # again here would close the database connection, transaction and all.
    raw = b"".join(response.streaming_content) if response.streaming else response.content  # type: ignore[attr-defined]
    return raw.decode(errors="replace")


def send(client: Client, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Answer:
    if isinstance(body, bytes):
        data: Any = body
    elif body is None:
        data = ""
    else:
        data = json.dumps(body)
    with rolled_back(method):
        response = client.generic(method, path, data=data, content_type=content_type)
        content = _content(response)
    return Answer(response.status_code, response.get("Location", ""), content)


def post_form(client: Client, path: str, data: dict[str, Any]) -> Answer:
    with rolled_back():
        response = client.post(path, data)
        content = _content(response)
    return Answer(response.status_code, response.get("Location", ""), content)


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    duplicated = sorted({key for key in keys if keys.count(key) > 1})
    assert not duplicated, f"keys given twice in one object: {duplicated}"
    return dict(pairs)


def _leaks(world: World, answer: Answer) -> list[str]:
    return [marker for marker in world.markers if marker in answer.content]


def _is_login(answer: Answer, login: str = "/login/") -> bool:
    return answer.status == 302 and urlsplit(answer.location).path == login


def _allowed(answer: Answer) -> bool:
    """Let through: not refused, not missing, not broken, not sent to sign in."""
    return answer.status < 500 and answer.status not in (401, 403, 404, 405) and not _is_login(answer)


# --- The tests --------------------------------------------------------------------------------------------


def test_every_route_has_an_entry() -> None:
    admin = {route.name for route in ROUTES if route.name.startswith(ADMIN_PREFIX)}
    tabled = set(API) | set(DASHBOARD) | set(SIGN_IN)
    served = {route.name for route in ROUTES} - admin

    assert sorted(served - tabled) == [], "routes with no entry in the access tables"
    assert sorted(tabled - served) == [], "entries for routes that no longer exist"
    assert sorted(set(ADMIN_EXCEPTIONS) - admin) == []


@pytest.mark.parametrize("route", API_ROUTES, ids=lambda route: route.name)
def test_api_route(world: World, route: Route) -> None:
    entry = API.get(route.name)
    assert entry is not None, f"{route.name} ({route.pattern}) is not in the API table"
    path = fill(entry.path, world.values)
    # Several operations share a path (one per method): the path must be this route's.
    assert resolve(urlsplit(path).path).route == route.pattern, f"{entry.path} is not {route.pattern}"
    if route.methods is not None:
        assert entry.method in route.methods, f"{route.name} answers {sorted(route.methods)}"
    clients = {role: caller.client() for role, caller in world.callers.items()}
    problems: list[str] = []

    if isinstance(entry, Public):
        for role in ("anonymous", "owner", "other_key") if entry.costly else ROLES:
            answer = send(clients[role], entry.method, path)
            if answer.status != entry.status:
                problems.append(f"{role}: expected {entry.status}, got {answer}")
        assert not problems, "\n".join(problems)
        if path.endswith("openapi.json"):
            # Swagger UI reads the schema as YAML, which refuses a key twice in one object (a response
            # declared as 200 and as "200" once left the docs page loading for ever).
            schema = json.loads(answer.content, object_pairs_hook=_no_duplicate_keys)
            assert schema["paths"]
        return

    body = fill(entry.body, world.values)
    for role in ROLES:
        answer = send(clients[role], entry.method, path, body, entry.content_type)
        if role in KEY_ROLES:
            scope = role.partition(":")[2]
            expected = entry.ok if scope in entry.scopes else 403
            if answer.status != expected:
                problems.append(f"{role}: expected {expected}, got {answer}")
        elif role == "other_key":
            if entry.other is not None:
                if answer.status != entry.other or _leaks(world, answer):
                    problems.append(f"{role}: expected {entry.other} and nothing of ours, got {answer}")
            elif entry.names_our_rows:
                if answer.status != 404:
                    problems.append(f"{role} on our rows: expected 404, got {answer}")
            elif not _allowed(answer) or _leaks(world, answer):
                problems.append(
                    f"{role} on its own workspace: expected to be let in and see nothing of ours, got {answer}"
                )
        elif answer.status != 401:  # no live key: anonymous, a dashboard session, an expired or revoked key
            problems.append(f"{role}: expected 401, got {answer}")

    if route.methods is None:
        # A Django view outside ninja declares its methods in a decorator: another method is 405.
        other = "GET" if entry.method != "GET" else "POST"
        allowed_role = next(role for role in KEY_ROLES if role.partition(":")[2] in entry.scopes)
        answer = send(clients[allowed_role], other, path)
        if answer.status != 405:
            problems.append(f"{allowed_role} with {other}: expected 405, got {answer}")
    assert not problems, "\n".join(problems)


@pytest.fixture(scope="module")
def dashboard_requests(world: World) -> dict[str, tuple[str, dict[str, Any] | None]]:
    """For each dashboard route, a URL on our rows and, when it takes posts, the valid form the
    dashboard's own tests post to it (frontend/tests/conftest.py)."""
    requests: dict[str, tuple[str, dict[str, Any] | None]] = {}
    for url, data in post_cases(world.ours).values():
        requests.setdefault(resolve(urlsplit(url).path).view_name, (url, data))
    for url in page_urls(world.ours).values():
        name = resolve(urlsplit(url).path).view_name
        if name not in requests:
            requests[name] = (url, None)
    for route in DASHBOARD_ROUTES:
        # A workspace-wide page the dashboard's tests do not visit yet needs no row to be named.
        if route.name not in requests and route.pattern.count("<") == 1 and route.name not in SIGN_IN:
            requests[route.name] = (reverse(route.name, kwargs={"workspace_slug": world.ours.workspace.slug}), None)
    return requests


def _their_url(world: World, url: str) -> str:
    """The same URL under the other workspace: our rows' names and ids in a workspace that has none."""
    ours = f"/w/{world.ours.workspace.slug}/"
    assert url.startswith(ours)
    return f"/w/{world.theirs.slug}/" + url.removeprefix(ours)


def _dashboard_expected(page: Page, role: str, method: str) -> int | None:
    """The status a member of our workspace gets; None: let in."""
    rank = {Role.VIEWER: 0, Role.MEMBER: 1, Role.OWNER: 2}
    required = page.post if method == "POST" else page.view
    if rank[Role(role)] < rank[required]:
        return 403
    if method not in page.methods:
        return 405
    return None


@pytest.mark.parametrize("route", DASHBOARD_ROUTES, ids=lambda route: route.name)
def test_dashboard_route(
    world: World, dashboard_requests: dict[str, tuple[str, dict[str, Any] | None]], route: Route
) -> None:
    if route.name in SIGN_IN:
        _check_sign_in(world, route)
        return
    page = DASHBOARD.get(route.name)
    assert page is not None, f"{route.name} ({route.pattern}) is not in the dashboard table"
    url, data = dashboard_requests[route.name]
    names_a_row = page.names_a_row or len(re.findall(r"<[^>]+>", route.pattern)) > 1
    clients = {role: caller.client() for role, caller in world.callers.items()}
    problems: list[str] = []

    def call(role: str, method: str, target: str) -> Answer:
        if method == "POST":
            return post_form(clients[role], target, data or {})
        return send(clients[role], method, target)

    for method in ("GET", "POST"):
        for role in ROLES:
            answer = call(role, method, url)
            if role == "anonymous" or role in KEYS:
                # No session: sign in first (a key does not open the dashboard), and come back here.
                if not (_is_login(answer) and "next=" in answer.location):
                    problems.append(f"{role} {method}: expected a redirect to sign in, got {answer}")
            elif role == "other_owner":
                if answer.status != 404:
                    problems.append(f"{role} {method} in our workspace: expected 404, got {answer}")
                theirs = call(role, method, _their_url(world, url))
                expected = 405 if method not in page.methods else (404 if names_a_row else None)
                if expected is None:
                    if not _allowed(theirs) or _leaks(world, theirs):
                        problems.append(f"{role} {method} in its workspace: expected in, nothing of ours; {theirs}")
                elif theirs.status != expected:
                    problems.append(f"{role} {method} on our rows in its workspace: expected {expected}, got {theirs}")
            else:
                status = _dashboard_expected(page, role, method)
                if status is not None:
                    if answer.status != status:
                        problems.append(f"{role} {method}: expected {status}, got {answer}")
                elif method == "GET" and answer.status != 200:
                    problems.append(f"{role} GET: expected 200, got {answer}")
                elif method == "POST" and not (_allowed(answer) and answer.status in (200, 302)):
                    problems.append(f"{role} POST: expected 200 or a redirect onwards, got {answer}")
    assert not problems, "\n".join(problems)


def _check_sign_in(world: World, route: Route) -> None:
    url, expected = SIGN_IN[route.name]
    assert resolve(url).view_name == route.name
    problems = []
    for role in ROLES:
        who = "user" if role in SESSION_ROLES or role == "other_owner" else "visitor"
        for method in ("GET", "POST"):
            client = world.callers[role].client()
            answer = post_form(client, url, {}) if method == "POST" else send(client, method, url)
            status, where = expected[(method, who)]
            if answer.status != status or not urlsplit(answer.location).path.startswith(where):
                problems.append(f"{role} {method}: expected {status} {where}, got {answer}")
    assert not problems, "\n".join(problems)


def test_admin_is_for_staff_only(world: World) -> None:
    """The admin's one gate (AdminSite.admin_view) treats every caller who is not staff alike, so each of
    its routes is called by a visitor and by our owner, and its index by every role."""
    admin = [route for route in ROUTES if route.name.startswith(ADMIN_PREFIX)]
    assert len(admin) > 20
    clients = {role: caller.client() for role, caller in world.callers.items()}
    calls = [(route, role) for route in admin for role in ("anonymous", "owner")]
    calls += [(next(route for route in admin if route.name == "admin:index"), role) for role in ROLES]
    problems = []
    for route, role in calls:
        url = example_url(route)
        answer = send(clients[role], "GET", url)
        status, where = ADMIN_EXCEPTIONS.get(route.name, (302, "/admin/login/"))
        if answer.status != status or not urlsplit(answer.location).path.startswith(where):
            problems.append(f"{route.name} {url} {role}: expected {status} {where}, got {answer}")
    assert not problems, "\n".join(problems[:40])

    staff = UserFactory.create(username="matrix-staff", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(staff)
    assert client.get("/admin/").status_code == 200
