from django.urls import URLPattern, URLResolver, include, path, register_converter

from frontend import (
    alerts,
    evals_views,
    guardrails_views,
    review,
    routing_views,
    settings_views,
    training_views,
    triage_views,
    views,
)
from frontend.converters import AnyTextConverter

app_name = "frontend"
register_converter(AnyTextConverter, "anytext")

agent_patterns: list[URLPattern | URLResolver] = [
    path("", views.agent_detail_view, name="agent_detail"),
    path("requirements/", views.requirements_edit_view, name="requirements_edit"),
    path("requirements/validate/", views.requirements_validate_view, name="requirements_validate"),
    path("requirements/history/", views.requirements_history_view, name="requirements_history"),
    path("requirements/<int:version>/activate/", views.requirements_activate_view, name="requirements_activate"),
    path("configuration/", views.configuration_view, name="configuration"),
    path("prompts/", views.agent_prompt_list_view, name="agent_prompt_list"),
    path("trajectories/", views.agent_trajectory_list_view, name="agent_trajectory_list"),
    path("triage/", triage_views.agent_triage_view, name="agent_triage"),
    path("signals/", triage_views.agent_signals_view, name="agent_signals"),
    path("alert-rules/", alerts.agent_alert_rules_view, name="agent_alert_rules"),
    path("alert-rules/<int:rule_id>/", alerts.agent_alert_rule_edit_view, name="agent_alert_rule_edit"),
    path("alert-rules/<int:rule_id>/delete/", alerts.agent_alert_rule_delete_view, name="agent_alert_rule_delete"),
    path("settings/", settings_views.agent_settings_view, name="agent_settings"),
    path("delete/", settings_views.agent_delete_view, name="agent_delete"),
    path("router/", routing_views.agent_router_view, name="agent_router"),
    path("router/chain/", routing_views.agent_chain_save_view, name="agent_chain_save"),
    path("router/tools/", routing_views.agent_tool_create_view, name="agent_tool_create"),
    path("router/tools/<str:tool_name>/", routing_views.agent_tool_edit_view, name="agent_tool_edit"),
    path("router/tools/<str:tool_name>/delete/", routing_views.agent_tool_delete_view, name="agent_tool_delete"),
    path("router/report/", routing_views.agent_router_report_view, name="agent_router_report"),
    path("guardrails/", guardrails_views.agent_guardrails_view, name="agent_guardrails"),
]

review_patterns: list[URLPattern | URLResolver] = [
    path("", review.review_list_view, name="review_list"),
    path("informativeness/", review.review_informativeness_view, name="review_informativeness"),
    path("<int:sample_id>/", review.review_sample_view, name="review_sample"),
    path("<int:sample_id>/items/<int:position>/", review.review_item_view, name="review_item"),
    path(
        "<int:sample_id>/items/<int:position>/dataset/",
        evals_views.review_dataset_add_view,
        name="review_dataset_add",
    ),
]

trajectory_patterns: list[URLPattern | URLResolver] = [
    path("", views.trajectory_detail_view, name="trajectory_detail"),
    path("scores/", views.trajectory_score_create_view, name="trajectory_score_create"),
    path("replays/", views.trajectory_replay_create_view, name="trajectory_replay_create"),
    path("dataset/", evals_views.trajectory_dataset_add_view, name="trajectory_dataset_add"),
]

prompt_patterns: list[URLPattern | URLResolver] = [
    path("", views.prompt_detail_view, name="prompt_detail"),
    path("versions/", views.prompt_version_create_view, name="prompt_version_create"),
    path("labels/", views.prompt_label_move_view, name="prompt_label_move"),
    path("labels/<str:label>/delete/", views.prompt_label_delete_view, name="prompt_label_delete"),
    path("edit/", views.prompt_update_view, name="prompt_update"),
    path("delete/", views.prompt_delete_view, name="prompt_delete"),
    path("render/", views.prompt_render_view, name="prompt_render"),
]

integration_patterns: list[URLPattern | URLResolver] = [
    path("", settings_views.integration_list_view, name="integration_list"),
    path("langfuse/", settings_views.langfuse_mirror_configure_view, name="langfuse_mirror_configure"),
    path("langfuse/retry/", settings_views.langfuse_export_retry_view, name="langfuse_export_retry"),
    path("langfuse/delete/", settings_views.langfuse_mirror_delete_view, name="langfuse_mirror_delete"),
    path("model-prices/", settings_views.model_price_set_view, name="model_price_set"),
    path("model-prices/delete/", settings_views.model_price_delete_view, name="model_price_delete"),
]

routing_patterns: list[URLPattern | URLResolver] = [
    path("model-targets/", routing_views.model_target_list_view, name="model_target_list"),
    path("model-targets/<slug:alias>/", routing_views.model_target_edit_view, name="model_target_edit"),
    path("model-targets/<slug:alias>/delete/", routing_views.model_target_delete_view, name="model_target_delete"),
    path("routing-decisions/", routing_views.routing_decision_list_view, name="routing_decision_list"),
    path(
        "routing-decisions/<int:decision_id>/",
        routing_views.routing_decision_detail_view,
        name="routing_decision_detail",
    ),
    path("handoffs/", routing_views.handoff_list_view, name="handoff_list"),
    path("handoffs/<int:handoff_id>/claim/", routing_views.handoff_claim_view, name="handoff_claim"),
    path("handoffs/<int:handoff_id>/resolve/", routing_views.handoff_resolve_view, name="handoff_resolve"),
    path("cache-review/", routing_views.cache_review_view, name="cache_review"),
    path("cache-review/hits/<int:hit_id>/", routing_views.cache_hit_review_view, name="cache_hit_review"),
]

guardrail_patterns: list[URLPattern | URLResolver] = [
    path("violations/", guardrails_views.guardrail_violation_list_view, name="guardrail_violation_list"),
    path("approvals/", guardrails_views.guardrail_approval_list_view, name="guardrail_approval_list"),
    path(
        "approvals/<int:approval_id>/",
        guardrails_views.guardrail_approval_detail_view,
        name="guardrail_approval_detail",
    ),
    path(
        "approvals/<int:approval_id>/decide/",
        guardrails_views.guardrail_approval_decide_view,
        name="guardrail_approval_decide",
    ),
    path("budgets/", guardrails_views.guardrail_budget_list_view, name="guardrail_budget_list"),
    path(
        "budgets/<int:budget_id>/delete/",
        guardrails_views.guardrail_budget_delete_view,
        name="guardrail_budget_delete",
    ),
]

eval_patterns: list[URLPattern | URLResolver] = [
    path("", evals_views.eval_overview_view, name="eval_overview"),
    path("propose/", evals_views.eval_suites_propose_view, name="eval_suites_propose"),
    path("suites/new/", evals_views.eval_suite_create_view, name="eval_suite_create"),
    path("suites/<str:name>/", evals_views.eval_suite_detail_view, name="eval_suite_detail"),
    path("suites/<str:name>/edit/", evals_views.eval_suite_edit_view, name="eval_suite_edit"),
    path("suites/<str:name>/run/", evals_views.eval_suite_run_view, name="eval_suite_run"),
    path("runs/", evals_views.eval_run_list_view, name="eval_run_list"),
    path("runs/<int:run_id>/", evals_views.eval_run_detail_view, name="eval_run_detail"),
    path("runs/<int:run_id>/progress/", evals_views.eval_run_progress_view, name="eval_run_progress"),
    path("runs/<int:run_id>/cancel/", evals_views.eval_run_cancel_view, name="eval_run_cancel"),
    path("runs/<int:run_id>/resume/", evals_views.eval_run_resume_view, name="eval_run_resume"),
    path("compare/", evals_views.eval_run_compare_view, name="eval_run_compare"),
    path("online-rules/", evals_views.eval_online_rule_list_view, name="eval_online_rule_list"),
    path("online-rules/<str:name>/", evals_views.eval_online_rule_edit_view, name="eval_online_rule_edit"),
    path(
        "online-rules/<str:name>/backfill/",
        evals_views.eval_online_rule_backfill_view,
        name="eval_online_rule_backfill",
    ),
]

training_patterns: list[URLPattern | URLResolver] = [
    path("curations/", training_views.training_curation_list_view, name="training_curation_list"),
    path("curations/new/", training_views.training_curation_create_view, name="training_curation_create"),
    path("curations/preview/", training_views.training_curation_preview_view, name="training_curation_preview"),
    path("curations/<str:name>/", training_views.training_curation_detail_view, name="training_curation_detail"),
    path("curations/<str:name>/edit/", training_views.training_curation_edit_view, name="training_curation_edit"),
    path("curations/<str:name>/export/", training_views.training_curation_export_view, name="training_curation_export"),
    path("exports/", training_views.training_export_list_view, name="training_export_list"),
    path("exports/<int:export_id>/", training_views.training_export_detail_view, name="training_export_detail"),
    path(
        "exports/<int:export_id>/progress/",
        training_views.training_export_progress_view,
        name="training_export_progress",
    ),
    path("exports/<int:export_id>/cancel/", training_views.training_export_cancel_view, name="training_export_cancel"),
    path(
        "exports/<int:export_id>/download/",
        training_views.training_export_download_view,
        name="training_export_download",
    ),
    path("jobs/", training_views.training_job_list_view, name="training_job_list"),
    path("jobs/new/", training_views.training_job_create_view, name="training_job_create"),
    path("jobs/<int:job_id>/", training_views.training_job_detail_view, name="training_job_detail"),
    path("jobs/<int:job_id>/metrics/", training_views.training_job_metrics_view, name="training_job_metrics"),
    path("jobs/<int:job_id>/cancel/", training_views.training_job_cancel_view, name="training_job_cancel"),
    path("jobs/<int:job_id>/adapter/", training_views.training_job_adapter_view, name="training_job_adapter"),
]

workspace_patterns: list[URLPattern | URLResolver] = [
    path("", views.workspace_home_view, name="workspace_home"),
    path("agents/", views.agent_list_view, name="agent_list"),
    path("agents/<slug:agent_slug>/", include(agent_patterns)),
    path("prompts/", views.prompt_list_view, name="prompt_list"),
    path("prompts/<int:prompt_id>/", include(prompt_patterns)),
    path("trajectories/", views.trajectory_list_view, name="trajectory_list"),
    path("trajectories/<str:trace_id>/", include(trajectory_patterns)),
    path("replays/<int:replay_id>/", views.replay_detail_view, name="replay_detail"),
    path("sessions/", views.session_list_view, name="session_list"),
    path("sessions/<anytext:session_id>/", views.session_detail_view, name="session_detail"),
    path("review/", include(review_patterns)),
    path("alerts/", alerts.alert_list_view, name="alert_list"),
    path("alerts/<int:alert_id>/acknowledge/", alerts.alert_acknowledge_view, name="alert_acknowledge"),
    path("keys/", views.apikey_list_view, name="apikey_list"),
    path("keys/<int:key_id>/revoke/", views.apikey_revoke_view, name="apikey_revoke"),
    path("integrations/", include(integration_patterns)),
    path("audit-log/", settings_views.audit_event_list_view, name="audit_event_list"),
    path("", include(routing_patterns)),
    path("guardrails/", include(guardrail_patterns)),
    path("evals/", include(eval_patterns)),
    path("training/", include(training_patterns)),
]

urlpatterns: list[URLPattern | URLResolver] = [
    path("login/", views.LoginView.as_view(), name="login"),
    path("logout/", views.LogoutView.as_view(), name="logout"),
    path("", views.home_view, name="home"),
    path("w/<slug:workspace_slug>/", include(workspace_patterns)),
]
