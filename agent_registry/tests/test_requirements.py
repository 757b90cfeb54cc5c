"""The pure requirements module: validation, the feasibility rules, derived configuration, diffs."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from agent_registry import requirements
from agent_registry.requirements import (
    Change,
    Requirements,
    Severity,
    derived_configuration,
    feasibility_check,
    field_label,
    requirements_diff,
)
from agent_registry.tests.factories import NO_TIER_LEFT, requirements_answers


def _parse(**changes: Any) -> Requirements:
    return Requirements.model_validate(requirements_answers(**changes))


def _findings(**changes: Any) -> list[tuple[str, Severity]]:
    return [(finding.code, finding.severity) for finding in feasibility_check(_parse(**changes))]


def _errors(**changes: Any) -> list[tuple[tuple[str | int, ...], str]]:
    with pytest.raises(ValidationError) as raised:
        Requirements.model_validate(requirements_answers(**changes))
    return [(error["loc"], error["msg"]) for error in raised.value.errors()]


FULL_AUTONOMY_AUDITED = {
    "error_surface.decision_authority": "full_autonomy",
    "constraints.governance": "full_audit_trail",
}
ALL_TIERS = ["single_call", "chain", "agentic", "human"]


# --- Validation -------------------------------------------------------------------------------


def test_the_factory_answers_are_valid_and_feasible():
    assert feasibility_check(_parse()) == []


def test_to_json_round_trips_the_answers():
    parsed = _parse()

    assert Requirements.model_validate(parsed.to_json()) == parsed
    assert parsed.to_json()["constraints"]["cost"]["per_request_ceiling_usd"] == "0.50"


def test_an_unknown_enum_value_names_its_field():
    assert _errors(**{"error_surface.decision_authority": "benevolent_dictator"}) == [
        (
            ("error_surface", "decision_authority"),
            "Input should be 'advisory', 'bounded_autonomy' or 'full_autonomy'",
        )
    ]


def test_negative_steps_are_refused():
    assert _errors(**{"io_gap.steps_median": -1}) == [
        (("io_gap", "steps_median"), "Input should be greater than or equal to 0")
    ]


def test_a_p95_below_the_median_names_steps_p95():
    assert _errors(**{"io_gap.steps_median": 4, "io_gap.steps_p95": 3}) == [
        (("io_gap", "steps_p95"), "Value error, steps_p95 must be at least steps_median")
    ]


def test_a_default_tier_that_is_not_enabled_is_refused():
    assert _errors(**{"routing.default_tier": "agentic"}) == [
        (("routing",), "Value error, default_tier must be one of enabled_tiers")
    ]


def test_escalation_to_a_disabled_tier_is_refused():
    rules = [{"trigger": "keywords", "value": "lawsuit", "to_tier": "agentic"}]

    assert _errors(**{"routing.escalation_rules": rules}) == [
        (("routing",), "Value error, escalation to agentic, which is not an enabled tier")
    ]


def test_a_repeated_tier_is_refused():
    assert _errors(**{"routing.enabled_tiers": ["single_call", "human", "single_call"]}) == [
        (("routing",), "Value error, enabled_tiers must not repeat a tier")
    ]


def test_duplicate_action_names_are_refused():
    actions = [
        {"name": "issue_refund", "mode": "execute", "stakes": "low"},
        {"name": "issue_refund", "mode": "recommend", "stakes": "high"},
    ]

    assert _errors(**{"error_surface.actions": actions}) == [
        (("error_surface",), "Value error, action names must be unique; repeated: issue_refund")
    ]


def test_duplicate_metric_names_across_output_and_trajectory_are_refused():
    assert _errors(**{"evaluation.output_metrics": [{"name": "policy_compliance_rate", "target": 0.9}]}) == [
        (("evaluation",), "Value error, metric names must be unique; repeated: policy_compliance_rate")
    ]


def test_an_amount_trigger_needs_a_number():
    rules = [{"trigger": "amount_over", "value": "lots", "to_tier": "human"}]

    assert _errors(**{"routing.escalation_rules": rules}) == [
        (("routing", "escalation_rules", 0), "Value error, value must be a number for trigger amount_over")
    ]


def test_unknown_fields_are_refused():
    answers = requirements_answers()
    answers["io_gap"]["steps_mean"] = 3

    with pytest.raises(ValidationError) as raised:
        Requirements.model_validate(answers)

    assert [(error["loc"], error["type"]) for error in raised.value.errors()] == [
        (("io_gap", "steps_mean"), "extra_forbidden")
    ]


def test_enabled_tiers_are_kept_in_escalation_order():
    parsed = _parse(**{"routing.enabled_tiers": ["human", "chain", "single_call"]})

    assert [tier.value for tier in parsed.routing.enabled_tiers] == ["single_call", "chain", "human"]


# --- Feasibility ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        pytest.param(
            {
                "constraints.latency.latency_class": "inline",
                "constraints.latency.hard_ceiling_ms": 2000,
                "routing.enabled_tiers": ALL_TIERS,
            },
            [("inline_latency_with_agentic_tier", Severity.ERROR)],
            id="inline_latency_with_agentic_tier",
        ),
        pytest.param(
            {"constraints.latency.hard_ceiling_ms": 300_001},
            [("latency_ceiling_outside_class", Severity.WARNING)],
            id="latency_ceiling_outside_class",
        ),
        pytest.param(
            {"constraints.cost.single_call_cost_usd": "0.20"},
            [("cost_ceiling_below_tier_estimate", Severity.ERROR)],
            id="cost_ceiling_below_tier_estimate",
        ),
        pytest.param(
            {
                "constraints.cost.per_resolution_ceiling_usd": "5",
                "constraints.cost.comparison_point": "a human agent",
                "constraints.cost.comparison_cost_usd": "3",
            },
            [("resolution_costs_more_than_comparison", Severity.WARNING)],
            id="resolution_costs_more_than_comparison",
        ),
        pytest.param(
            {"evaluation.trajectory_metrics": []},
            [("autonomous_actions_without_trajectory_audit", Severity.ERROR)],
            id="autonomous_actions_without_trajectory_audit",
        ),
        pytest.param(
            {"error_surface.decision_authority": "advisory"},
            [("advisory_agent_executes_actions", Severity.ERROR)],
            id="advisory_agent_executes_actions",
        ),
        pytest.param(
            {"constraints.governance": "output_monitoring"},
            [("governance_below_authority", Severity.WARNING)],
            id="governance_below_authority",
        ),
        pytest.param(
            {
                "error_surface.actions": [
                    {"name": "cancel_account", "mode": "execute", "stakes": "high", "side_effects": True}
                ]
            },
            [("high_stakes_action_without_approval", Severity.ERROR)],
            id="high_stakes_action_without_approval",
        ),
        pytest.param(
            {**FULL_AUTONOMY_AUDITED, "error_surface.recoverability": "irreversible"},
            [("irreversible_full_autonomy", Severity.WARNING)],
            id="irreversible_full_autonomy",
        ),
        pytest.param(
            {"io_gap.steps_predictable": False},
            [("unpredictable_gap_goes_to_humans", Severity.INFO)],
            id="unpredictable_gap_goes_to_humans",
        ),
        pytest.param(
            {
                "io_gap.steps_predictable": False,
                "routing.enabled_tiers": ["single_call", "chain"],
                "routing.escalation_rules": [{"trigger": "intent", "value": "complaint", "to_tier": "chain"}],
            },
            [("unpredictable_gap_without_agentic_tier", Severity.ERROR)],
            id="unpredictable_gap_without_agentic_tier",
        ),
        pytest.param(
            {"io_gap.steps_p95": 6},
            [("io_gap_exceeds_tiers", Severity.INFO)],
            id="io_gap_exceeds_tiers_goes_to_humans",
        ),
        pytest.param(
            {
                "io_gap.steps_p95": 6,
                "routing.enabled_tiers": ["single_call", "chain"],
                "routing.escalation_rules": [{"trigger": "intent", "value": "complaint", "to_tier": "chain"}],
            },
            [("io_gap_exceeds_tiers", Severity.ERROR)],
            id="io_gap_exceeds_tiers_without_a_human",
        ),
        pytest.param(
            {"routing.mode": "single_level"},
            [("single_level_with_several_tiers", Severity.WARNING)],
            id="single_level_with_several_tiers",
        ),
        pytest.param(
            {
                "io_gap.steps_p95": 2,
                "routing.enabled_tiers": ["single_call"],
                "routing.escalation_rules": [],
                "routing.signal": "classifier",
            },
            [("adaptive_with_one_tier", Severity.WARNING)],
            id="adaptive_with_one_tier",
        ),
        pytest.param(
            {"routing.escalation_rules": []},
            [("adaptive_rules_without_rules", Severity.WARNING)],
            id="adaptive_rules_without_rules",
        ),
        pytest.param(
            {**FULL_AUTONOMY_AUDITED, "constraints.privacy.pii_handling": "allowed"},
            [("raw_pii_under_full_autonomy", Severity.WARNING)],
            id="raw_pii_under_full_autonomy",
        ),
    ],
)
def test_each_feasibility_rule_fires_on_its_trigger(changes, expected):
    assert _findings(**changes) == expected


def test_no_rule_fires_on_the_factory_answers():
    # The cases above each add exactly one finding to this empty baseline.
    assert _findings() == []


def test_findings_come_errors_first_then_warnings_then_info():
    findings = _findings(
        **{
            "io_gap.steps_predictable": False,  # info
            "constraints.governance": "output_monitoring",  # warning
            "evaluation.trajectory_metrics": [],  # error
        }
    )

    assert findings == [
        ("autonomous_actions_without_trajectory_audit", Severity.ERROR),
        ("governance_below_authority", Severity.WARNING),
        ("unpredictable_gap_goes_to_humans", Severity.INFO),
    ]


def test_a_finding_names_its_fields_and_explains_itself():
    (finding,) = feasibility_check(_parse(**{"constraints.cost.single_call_cost_usd": "0.20"}))

    assert finding.fields == ("constraints.cost.per_request_ceiling_usd", "routing.enabled_tiers")
    assert finding.message == (
        "The chain tier costs at least 3x a single call (estimate $0.60; 3-5x), above the per-request ceiling of $0.50."
    )


def test_a_high_stakes_finding_names_the_action():
    actions = [{"name": "cancel_account", "mode": "execute", "stakes": "high", "side_effects": True}]

    (finding,) = feasibility_check(_parse(**{"error_surface.actions": actions}))

    assert finding.fields == ("error_surface.actions.cancel_account",)


def test_a_high_stakes_action_with_approval_is_feasible():
    actions = [
        {
            "name": "cancel_account",
            "mode": "execute",
            "stakes": "high",
            "side_effects": True,
            "requires_approval": True,
        }
    ]

    assert _findings(**{"error_surface.actions": actions}) == []


def test_an_advisory_agent_may_only_recommend_changes():
    actions = [
        {"name": "lookup_trip", "mode": "execute", "stakes": "low"},
        {"name": "issue_refund", "mode": "recommend", "stakes": "moderate", "side_effects": True},
    ]

    assert _findings(**{"error_surface.decision_authority": "advisory", "error_surface.actions": actions}) == []


# --- Derived configuration --------------------------------------------------------------------


def _derived(**changes: Any) -> dict[str, Any]:
    configuration: dict[str, Any] = derived_configuration(_parse(**changes)).model_dump(mode="json")
    return configuration


def test_tier_budgets_follow_the_latency_and_cost_walls():
    assert _derived()["tier_budgets"]["value"] == [
        {"tier": "single_call", "time_budget_ms": 30000, "cost_budget_usd": "0.01", "max_steps": 2},
        {"tier": "chain", "time_budget_ms": 30000, "cost_budget_usd": "0.05", "max_steps": 5},
        {"tier": "human", "time_budget_ms": None, "cost_budget_usd": None, "max_steps": None},
    ]


def test_the_agentic_tier_gets_twice_the_p95_steps_and_the_request_ceiling():
    derived = _derived(
        **{
            "routing.enabled_tiers": ALL_TIERS,
            "constraints.latency.hard_ceiling_ms": 60_000,
            "constraints.latency.latency_class": "asynchronous",
        }
    )

    assert derived["tier_budgets"]["value"][2] == {
        "tier": "agentic",
        "time_budget_ms": 60000,
        "cost_budget_usd": "0.50",  # 100 x $0.01 is above the $0.50 ceiling
        "max_steps": 10,
    }


@pytest.mark.parametrize(("steps_p95", "max_steps"), [(0, 4), (1, 4), (2, 4), (3, 6), (25, 50), (1000, 50)])
def test_the_agentic_step_limit_stays_between_4_and_50(steps_p95, max_steps):
    derived = _derived(**{"routing.enabled_tiers": ALL_TIERS, "io_gap.steps_median": 0, "io_gap.steps_p95": steps_p95})

    assert [budget["max_steps"] for budget in derived["tier_budgets"]["value"]] == [2, 5, max_steps, None]


def test_the_latency_class_caps_the_time_budget():
    derived = _derived(**{"constraints.latency.hard_ceiling_ms": 45_000})

    assert [budget["time_budget_ms"] for budget in derived["tier_budgets"]["value"]] == [30000, 30000, None]


def test_without_a_single_call_cost_every_tier_gets_the_request_ceiling():
    cost = {"per_request_ceiling_usd": "0.50"}

    derived = _derived(**{"constraints.cost": cost})

    assert [budget["cost_budget_usd"] for budget in derived["tier_budgets"]["value"]] == ["0.50", "0.50", None]


def test_an_inline_latency_wall_removes_the_agentic_tier():
    derived = _derived(
        **{
            "constraints.latency.latency_class": "inline",
            "constraints.latency.hard_ceiling_ms": 1500,
            "routing.enabled_tiers": ["single_call", "agentic"],
            "routing.default_tier": "agentic",
            "routing.escalation_rules": [],
            "routing.signal": "classifier",
        }
    )

    assert derived["allowed_tiers"]["value"] == ["single_call"]
    assert derived["router"]["value"]["default_tier"] == "single_call"
    assert derived["tier_budgets"]["value"] == [
        {"tier": "single_call", "time_budget_ms": 1500, "cost_budget_usd": "0.01", "max_steps": 2}
    ]


def test_a_latency_wall_that_rules_out_every_tier_leaves_no_default():
    derived = _derived(**NO_TIER_LEFT)

    assert derived["allowed_tiers"]["value"] == []
    assert derived["router"]["value"]["tiers"] == []
    assert derived["router"]["value"]["default_tier"] is None
    assert derived["tier_budgets"]["value"] == []


def test_approval_rules_for_each_kind_of_action():
    actions = [
        {"name": "lookup_trip", "mode": "execute", "stakes": "low"},
        {
            "name": "issue_refund",
            "mode": "execute",
            "stakes": "moderate",
            "side_effects": True,
            "autonomy_limit_usd": "20",
        },
        {"name": "ban_rider", "mode": "execute", "stakes": "high", "side_effects": True, "requires_approval": True},
        {
            "name": "send_voucher",
            "mode": "execute",
            "stakes": "moderate",
            "side_effects": True,
            "requires_approval": True,
        },
        {"name": "add_note", "mode": "execute", "stakes": "low", "side_effects": True},
        {"name": "suggest_credit", "mode": "recommend", "stakes": "moderate", "side_effects": True},
    ]

    derived = _derived(**{"error_surface.actions": actions})

    assert derived["approval_rules"]["value"] == [
        {"action": "issue_refund", "approval": "above_amount", "amount_usd": "20"},
        {"action": "ban_rider", "approval": "always"},
        {"action": "send_voucher", "approval": "always"},
        {"action": "add_note", "approval": "never"},
    ]
    assert derived["tool_allow_list"]["value"] == [
        "lookup_trip",
        "issue_refund",
        "ban_rider",
        "send_voucher",
        "add_note",
        "suggest_credit",
    ]


def test_mandatory_guardrails_for_an_agent_with_tools_and_pseudonymised_pii():
    assert _derived()["mandatory_guardrails"]["value"] == [
        {"check": "system_prompt_leakage", "layer": "output", "why": "every agent has a system prompt to protect"},
        {"check": "prompt_injection", "layer": "input", "why": "the agent has tools an injection could steer"},
        {"check": "indirect_injection", "layer": "tool", "why": "tool results enter the model's context"},
        {"check": "action_boundary", "layer": "tool", "why": "only the listed actions may be called"},
        {"check": "pii", "layer": "input", "why": "privacy says pseudonymize"},
        {"check": "pii", "layer": "output", "why": "PII must not reach the user or tools"},
        {"check": "budget", "layer": "request", "why": "autonomous spending needs a hard cap"},
    ]


def test_an_advisory_agent_without_tools_that_may_see_pii_only_guards_its_system_prompt():
    derived = _derived(
        **{
            "error_surface.decision_authority": "advisory",
            "error_surface.actions": [],
            "constraints.privacy.pii_handling": "allowed",
            "constraints.governance": "output_monitoring",
        }
    )

    assert derived["mandatory_guardrails"]["value"] == [
        {"check": "system_prompt_leakage", "layer": "output", "why": "every agent has a system prompt to protect"}
    ]


def test_eval_suites_follow_the_metrics_and_the_router():
    assert _derived()["eval_suites"]["value"] == [
        {"name": "output-quality", "schedule": "nightly", "metrics": ["resolution_rate"], "kind": "offline"},
        {"name": "trajectory-audit", "schedule": "online", "metrics": ["policy_compliance_rate"], "kind": "online"},
        {"name": "router-accuracy", "schedule": "weekly", "metrics": ["routing_accuracy"], "kind": "offline"},
    ]


def test_a_single_tier_without_metrics_has_no_eval_suite():
    derived = _derived(
        **{
            "error_surface.actions": [],
            "evaluation.output_metrics": [],
            "evaluation.trajectory_metrics": [],
            "io_gap.steps_p95": 2,
            "routing.mode": "single_level",
            "routing.enabled_tiers": ["single_call"],
            "routing.escalation_rules": [],
        }
    )

    assert derived["eval_suites"]["value"] == []


@pytest.mark.parametrize(
    ("governance", "rate"),
    [("output_monitoring", 0.05), ("policy_compliance_auditing", 0.25), ("full_audit_trail", 1.0)],
)
def test_the_sampling_rate_follows_governance(governance, rate):
    assert _derived(**{"constraints.governance": governance})["trajectory_sampling_rate"]["value"] == rate


def test_budgets_include_the_daily_total():
    cost = {
        "per_request_ceiling_usd": "0.50",
        "per_resolution_ceiling_usd": "2.5",
        "single_call_cost_usd": "0.01",
        "expected_daily_requests": 1000,
    }

    assert _derived(**{"constraints.cost": cost})["budgets"]["value"] == {
        "per_request_usd": "0.50",
        "per_resolution_usd": "2.5",
        "per_day_usd": "500.00",
    }


def test_the_router_carries_the_routing_answers():
    assert _derived()["router"]["value"] == {
        "mode": "adaptive",
        "tiers": ["single_call", "chain", "human"],
        "default_tier": "single_call",
        "signal": "rules",
        "escalation_rules": [{"trigger": "keywords", "value": "unsafe, assault", "to_tier": "human", "reason": ""}],
    }


def test_every_derived_value_names_its_sources():
    configuration = derived_configuration(_parse())

    assert configuration.trajectory_sampling_rate.sources == ("constraints.governance",)
    assert configuration.approval_rules.sources == ("error_surface.actions",)
    assert all(value.sources and value.explanation for _, value in configuration)


# --- Diff -------------------------------------------------------------------------------------


def test_identical_answers_have_no_diff():
    assert requirements_diff(requirements_answers(), requirements_answers()) == []


def test_a_changed_value_is_reported_with_both_sides():
    after = requirements_answers(**{"io_gap.steps_p95": 8})

    assert requirements_diff(requirements_answers(), after) == [
        Change(path="io_gap.steps_p95", kind="changed", before=5, after=8)
    ]


def test_added_and_removed_fields():
    before = requirements_answers()
    after = requirements_answers(**{"constraints.cost.expected_daily_requests": 1000})
    del after["constraints"]["cost"]["single_call_cost_usd"]

    assert requirements_diff(before, after) == [
        Change(path="constraints.cost.expected_daily_requests", kind="added", after=1000),
        Change(path="constraints.cost.single_call_cost_usd", kind="removed", before="0.01"),
    ]


def test_actions_are_compared_by_name_not_by_position():
    before = requirements_answers()
    lookup, refund = before["error_surface"]["actions"]
    after = requirements_answers(
        **{
            "error_surface.actions": [
                {**refund, "autonomy_limit_usd": "50"},
                {"name": "cancel_trip", "mode": "recommend", "stakes": "moderate"},
            ]
        }
    )
    assert lookup["name"] == "lookup_trip"

    assert requirements_diff(before, after) == [
        Change(path="error_surface.actions.cancel_trip.mode", kind="added", after="recommend"),
        Change(path="error_surface.actions.cancel_trip.name", kind="added", after="cancel_trip"),
        Change(path="error_surface.actions.cancel_trip.stakes", kind="added", after="moderate"),
        Change(path="error_surface.actions.issue_refund.autonomy_limit_usd", kind="changed", before="20", after="50"),
        Change(path="error_surface.actions.lookup_trip.mode", kind="removed", before="execute"),
        Change(path="error_surface.actions.lookup_trip.name", kind="removed", before="lookup_trip"),
        Change(path="error_surface.actions.lookup_trip.stakes", kind="removed", before="low"),
    ]


def test_reordering_named_actions_is_no_change():
    before = requirements_answers()
    after = requirements_answers(**{"error_surface.actions": list(reversed(before["error_surface"]["actions"]))})

    assert requirements_diff(before, after) == []


def test_plain_lists_are_compared_whole():
    after = requirements_answers(**{"io_gap.atomic_operations": ["extraction"]})

    assert requirements_diff(requirements_answers(), after) == [
        Change(
            path="io_gap.atomic_operations",
            kind="changed",
            before=["extraction", "classification", "decision_action"],
            after=["extraction"],
        )
    ]


def test_changes_come_in_question_order():
    after = requirements_answers(**{"routing.mode": "single_level", "error_surface.recoverability": "hours"})

    assert [change.path for change in requirements_diff(requirements_answers(), after)] == [
        "error_surface.recoverability",
        "routing.mode",
    ]


def test_field_label_reads_a_dotted_path():
    assert field_label("constraints.latency.hard_ceiling_ms") == "Constraint feasibility › latency › hard ceiling ms"
    assert field_label("io_gap") == "I/O gap"


# --- Properties -------------------------------------------------------------------------------


def _enum(enum: type[Any]) -> st.SearchStrategy[str]:
    return st.sampled_from([member.value for member in enum])


_money = st.decimals(min_value=Decimal("0"), max_value=Decimal("1000"), places=2).map(str)
_maybe_money = st.one_of(st.none(), _money)
# Few names, so that duplicates (a validation error) come up too.
_name = st.sampled_from(["lookup_trip", "issue_refund", "cancel_trip", "notify_rider"])
_tier = _enum(requirements.Tier)

_action = st.fixed_dictionaries(
    {"name": _name, "mode": _enum(requirements.ActionMode), "stakes": _enum(requirements.Stakes)},
    optional={"side_effects": st.booleans(), "requires_approval": st.booleans(), "autonomy_limit_usd": _money},
)


def _metrics(names: list[str]) -> st.SearchStrategy[list[dict[str, Any]]]:
    metric = st.fixed_dictionaries(
        {"name": st.sampled_from(names), "target": st.floats(min_value=0, max_value=1)},
        optional={"comparator": _enum(requirements.Comparator)},
    )
    return st.lists(metric, max_size=2, unique_by=lambda item: item["name"])


def _unique_mostly(element: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[list[dict[str, Any]]]:
    # Mostly distinct names; sometimes a repeat, which is a validation error.
    return st.one_of(
        st.lists(element, max_size=4, unique_by=lambda item: item["name"]),
        st.lists(element, max_size=4, unique_by=lambda item: item["name"]),
        st.lists(element, max_size=4),
    )


def _rule(tiers: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {
            "trigger": _enum(requirements.EscalationTrigger),
            "value": st.sampled_from(["0.5", "100", "refund, chargeback", "complaint"]),
            # Mostly an enabled tier; now and then any tier (a validation error when it is disabled).
            "to_tier": st.one_of(st.sampled_from(tiers), st.sampled_from(tiers), _tier),
        }
    )


@st.composite
def _io_gap(draw: st.DrawFn) -> dict[str, Any]:
    median = draw(st.integers(min_value=0, max_value=1000))
    # Mostly a p95 at or above the median; sometimes anything in range.
    p95 = draw(st.one_of(st.integers(min_value=median, max_value=1000), st.integers(min_value=0, max_value=1000)))
    return {
        "steps_median": median,
        "steps_p95": p95,
        "steps_predictable": draw(st.booleans()),
        "output_verifiable_from_input": draw(st.booleans()),
        "atomic_operations": draw(st.lists(_enum(requirements.AtomicOperation), min_size=1, max_size=3)),
    }


@st.composite
def _routing(draw: st.DrawFn) -> dict[str, Any]:
    unique_tiers = st.lists(_tier, min_size=1, max_size=4, unique=True)
    tiers = draw(st.one_of(unique_tiers, unique_tiers, unique_tiers, st.lists(_tier, min_size=1)))
    return {
        "mode": draw(_enum(requirements.RoutingMode)),
        "enabled_tiers": tiers,
        "default_tier": draw(st.one_of(st.sampled_from(tiers), st.sampled_from(tiers), _tier)),
        "signal": draw(_enum(requirements.RoutingSignal)),
        "escalation_rules": draw(st.lists(_rule(tiers), max_size=2)),
    }


answers_strategy = st.fixed_dictionaries(
    {
        "error_surface": st.fixed_dictionaries(
            {
                "decision_authority": _enum(requirements.DecisionAuthority),
                "error_cost": st.fixed_dictionaries(
                    {"worse_direction": _enum(requirements.ErrorDirection)},
                    optional={"ratio": st.floats(min_value=1, max_value=1_000_000)},
                ),
                "recoverability": _enum(requirements.Recoverability),
                "actions": _unique_mostly(_action),
            }
        ),
        "io_gap": _io_gap(),
        "constraints": st.fixed_dictionaries(
            {
                "latency": st.fixed_dictionaries(
                    {
                        "latency_class": _enum(requirements.LatencyClass),
                        "hard_ceiling_ms": st.integers(min_value=1, max_value=7 * 24 * 3600 * 1000),
                    }
                ),
                "cost": st.fixed_dictionaries(
                    {"per_request_ceiling_usd": _money},
                    optional={
                        "per_resolution_ceiling_usd": _maybe_money,
                        "comparison_cost_usd": _maybe_money,
                        "single_call_cost_usd": _maybe_money,
                        "expected_daily_requests": st.one_of(st.none(), st.integers(0, 10_000_000)),
                    },
                ),
                "privacy": st.fixed_dictionaries({"pii_handling": _enum(requirements.PiiHandling)}),
                "governance": _enum(requirements.GovernanceLevel),
            }
        ),
        "pareto": st.fixed_dictionaries(
            {
                "quality_vs_speed": st.integers(0, 100),
                "autonomy_vs_control": st.integers(0, 100),
                "generality_vs_reliability": st.integers(0, 100),
                "primary_axis": _enum(requirements.ParetoAxis),
            }
        ),
        "evaluation": st.fixed_dictionaries(
            {
                # "accuracy" in both lists is a (rare) repeat across them.
                "output_metrics": _metrics(["resolution_rate", "csat", "accuracy"]),
                "trajectory_metrics": _metrics(["policy_compliance_rate", "escalation_accuracy", "accuracy"]),
            }
        ),
        "routing": _routing(),
    }
)

# Anything JSON can hold, to put where the schema expects something else.
_json = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8)),
    lambda children: st.one_of(st.lists(children, max_size=3), st.dictionaries(st.text(max_size=5), children)),
    max_leaves=6,
)


def _leaf_paths(value: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    if isinstance(value, dict) and value:
        return [leaf for key, item in value.items() for leaf in _leaf_paths(item, (*path, key))]
    return [path]


def _check_valid(parsed: Requirements) -> None:
    findings = feasibility_check(parsed)
    configuration = derived_configuration(parsed)
    inline_error = "inline_latency_with_agentic_tier" in {finding.code for finding in findings}
    assert configuration.allowed_tiers.value == [
        tier.value for tier in parsed.routing.enabled_tiers if not (tier is requirements.Tier.AGENTIC and inline_error)
    ]
    assert configuration.router.value["tiers"] == configuration.allowed_tiers.value
    assert requirements_diff(parsed.to_json(), parsed.to_json()) == []


@settings(max_examples=400, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(answers=answers_strategy)
def test_answers_from_the_schema_validate_or_raise_a_validation_error_and_never_break_the_checks(answers):
    try:
        parsed = Requirements.model_validate(answers)
    except ValidationError:
        return
    _check_valid(parsed)


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(answers=answers_strategy, data=st.data())
def test_answers_with_any_value_in_any_field_raise_only_validation_errors(answers, data):
    path = data.draw(st.sampled_from(_leaf_paths(answers)))
    node = answers
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = data.draw(_json)

    try:
        parsed = Requirements.model_validate(answers)
    except ValidationError:
        return
    _check_valid(parsed)


@settings(max_examples=200, deadline=None, database=None)
@given(
    steps_median=st.integers(min_value=0, max_value=1000),
    extra=st.integers(min_value=0, max_value=1000),
    tiers=st.sets(st.sampled_from(list(requirements.Tier)), min_size=1),
    latency_class=st.sampled_from(list(requirements.LatencyClass)),
    governance=st.sampled_from(list(requirements.GovernanceLevel)),
)
def test_valid_variations_of_the_factory_answers_never_break_the_checks(
    steps_median, extra, tiers, latency_class, governance
):
    ordered = [tier.value for tier in requirements.TIER_ORDER if tier in tiers]
    answers = requirements_answers(
        **{
            "io_gap.steps_median": steps_median,
            "io_gap.steps_p95": min(1000, steps_median + extra),
            "constraints.latency.latency_class": latency_class.value,
            "constraints.governance": governance.value,
            "routing.enabled_tiers": ordered,
            "routing.default_tier": ordered[-1],
            "routing.escalation_rules": [],
        }
    )

    _check_valid(Requirements.model_validate(answers))
