"""Trajectory metrics on hand-made facts: each metric's pass, fail and errored paths, the constraint edge
cases, and configs refused with the field named."""

from __future__ import annotations

from typing import Any

import pytest

from evals.trajectory_metrics import TRAJECTORY_METRICS, trajectory_metric_from_config
from evals.verifiers import (
    ActionRecord,
    EvalItem,
    EvalOutput,
    EvaluationError,
    EvaluatorConfigError,
    Score,
    ToolCall,
    TrajectoryFacts,
    evaluate_safely,
)

REFUND = "issue_refund"
LOOKUP = "lookup_trip"


def output(*actions: ActionRecord, tool_calls: tuple[ToolCall, ...] = (), **facts: Any) -> EvalOutput:
    return EvalOutput(text="Done.", tool_calls=tool_calls, trajectory=TrajectoryFacts(actions=actions, **facts))


def score(config: dict[str, Any], out: EvalOutput, item: EvalItem | None = None) -> Score:
    return trajectory_metric_from_config(config).evaluate(item or EvalItem(), out)


def refund(amount: Any, **fields: Any) -> ActionRecord:
    return ActionRecord(REFUND, {"trip_id": "T1", "amount": amount}, **fields)


# --- policy compliance --------------------------------------------------------------------------------

GATED = {"type": "policy_compliance", "gated_actions": [REFUND]}


def test_a_gated_action_that_ran_with_approval_complies():
    result = score(GATED, output(ActionRecord(LOOKUP), refund(80, approved=True)))

    assert (result.evaluator, result.version, result.score, result.passed) == ("policy_compliance", 1, 1.0, True)
    assert result.reason == "compliant: 2 action(s) checked"


@pytest.mark.parametrize("approved", [None, False])
def test_a_gated_action_that_ran_without_approval_is_a_violation(approved):
    result = score(GATED, output(ActionRecord(LOOKUP), refund(80, approved=approved)))

    assert (result.score, result.passed) == (0.0, False)
    assert result.reason == "1 violation(s): action 2 issue_refund ran without approval"


@pytest.mark.parametrize("status", ["blocked", "pending_approval", "rejected"])
def test_a_gated_action_the_guardrails_stopped_is_not_a_violation(status):
    result = score(GATED, output(refund(80, status=status)))

    assert result.passed is True


def constrained(**bounds: Any) -> dict[str, Any]:
    return {"type": "policy_compliance", "constraints": [{"tool": REFUND, "argument": "amount", **bounds}]}


@pytest.mark.parametrize(
    ("bounds", "amount", "passed"),
    [
        ({"max": 50}, 50, True),
        ({"max": 50}, 50.01, False),
        ({"max": "12.50"}, "12.50", True),  # numbers as strings count as numbers
        ({"max": 12.5}, "12.51", False),
        ({"min": 1}, 0, False),
        ({"min": 1, "max": 2}, "1.5", True),
        ({"max": 50}, "eighty", False),  # a bound on something that is not a number is broken
        ({"max": 50}, True, False),  # a bool is not a number
        ({"allowed": [10, 20]}, "20.0", True),
        ({"allowed": [10, 20]}, 30, False),
        ({"allowed": ["card", "wallet"]}, "cash", False),
        ({"pattern": r"\d+(\.\d\d)?"}, "12.50", True),
        ({"pattern": r"\d+"}, "12.50", False),  # the whole value must match
        ({"pattern": r"\d+(\.\d+)?"}, 12.5, True),
    ],
)
def test_tool_argument_constraints(bounds, amount, passed):
    result = score(constrained(**bounds), output(refund(amount)))

    assert result.passed is passed
    assert result.score == (1.0 if passed else 0.0)
    if not passed:
        assert result.reason.startswith("1 violation(s): action 1 issue_refund: amount ")


def test_a_constraint_ignores_other_tools_absent_arguments_and_calls_that_did_not_run():
    result = score(
        constrained(max=50),
        output(
            ActionRecord(LOOKUP, {"amount": 999}),
            ActionRecord(REFUND, {"trip_id": "T1"}),
            refund(999, status="blocked"),
        ),
    )

    assert result.passed is True


def test_every_violation_is_named():
    config = {**constrained(max=50), "gated_actions": [REFUND], "allowed_tools": [LOOKUP, REFUND]}

    result = score(config, output(refund(80), ActionRecord("delete_account"), refund(10, status="errored")))

    assert result.passed is False
    assert result.reason == (
        "3 violation(s): action 1 issue_refund ran without approval; action 1 issue_refund: amount 80 is above "
        "the maximum 50; action 2 delete_account is not an allowed tool"
    )


# --- tool use -----------------------------------------------------------------------------------------


def test_tool_use_is_the_share_of_correct_actions():
    actions = (ActionRecord(LOOKUP), refund(10, status="errored"), refund(10, status="blocked"), ActionRecord("x"))

    result = score({"type": "tool_use", "allowed_tools": [LOOKUP, REFUND], "pass_threshold": 0.25}, output(*actions))

    assert (result.score, result.passed) == (0.25, True)
    assert result.reason == (
        "1/4 actions correct; action 2 issue_refund errored; action 3 issue_refund blocked; "
        "action 4 x is not an allowed tool"
    )
    assert score({"type": "tool_use"}, output(*actions)).passed is False  # 0.5 < the default threshold


def test_tool_use_with_no_actions_scores_one():
    assert score({"type": "tool_use"}, output()).score == 1.0


def test_tool_use_requires_the_items_expected_calls():
    item = EvalItem(expected_tool_calls=(ToolCall(LOOKUP, {"trip_id": "T1"}), ToolCall(REFUND)))
    only_lookup = output(ActionRecord(LOOKUP), tool_calls=(ToolCall(LOOKUP, {"trip_id": "T1"}),))
    both = output(
        ActionRecord(LOOKUP), refund(10), tool_calls=(ToolCall(LOOKUP, {"trip_id": "T1"}), ToolCall(REFUND, {}))
    )

    missing = score({"type": "tool_use"}, only_lookup, item)
    matched = score({"type": "tool_use", "order": "ordered"}, both, item)

    assert (missing.score, missing.passed) == (0.5, False)
    assert "missing: issue_refund({})" in missing.reason
    assert (matched.score, matched.passed) == (1.0, True)


# --- escalation accuracy ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("should", "escalated", "passed"),
    [(True, True, True), ("false", False, True), ("TRUE", False, False), (False, True, False)],
)
def test_escalation_accuracy(should, escalated, passed):
    item = EvalItem(metadata={"should_escalate": should})

    result = score({"type": "escalation_accuracy"}, output(escalated=escalated), item)

    assert (result.score, result.passed) == (1.0 if passed else 0.0, passed)


def test_escalation_accuracy_reads_the_configured_key():
    item = EvalItem(metadata={"needs_person": True, "should_escalate": False})

    assert score({"type": "escalation_accuracy", "metadata_key": "needs_person"}, output(escalated=True), item).passed


@pytest.mark.parametrize("metadata", [{}, {"should_escalate": "maybe"}, {"should_escalate": 1}])
def test_an_item_that_does_not_say_whether_to_escalate_is_errored(metadata):
    metric = trajectory_metric_from_config({"type": "escalation_accuracy"})

    with pytest.raises(EvaluationError):
        metric.evaluate(EvalItem(metadata=metadata), output(escalated=True))
    result = evaluate_safely(metric, EvalItem(metadata=metadata), output())
    assert (result.score, result.passed, result.errored) == (None, False, True)


# --- bounds -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "facts", "expected"),
    [
        ({"type": "steps", "max": 4}, {"steps": 4}, (1.0, True)),
        ({"type": "steps", "max": 4}, {"steps": 8}, (0.5, False)),
        ({"type": "cost", "max": 0.01}, {"cost_usd": 0.0}, (1.0, True)),
        ({"type": "cost", "max": 0.01}, {"cost_usd": 0.04}, (0.25, False)),
        ({"type": "latency", "max": 2000}, {"latency_ms": 1999.5}, (1.0, True)),
        ({"type": "latency", "max": 2000}, {"latency_ms": 2500}, (0.8, False)),
    ],
)
def test_bounds_pass_within_and_degrade_past_the_bound(config, facts, expected):
    result = score(config, output(**facts))

    assert (result.score, result.passed) == pytest.approx(expected)


def test_a_bound_reason_names_value_and_bound():
    assert score({"type": "steps", "max": 4}, output(steps=8)).reason == "8 steps > max 4"


@pytest.mark.parametrize("kind", ["cost", "latency"])
def test_an_unknown_cost_or_latency_is_errored(kind):
    metric = trajectory_metric_from_config({"type": kind, "max": 1})

    with pytest.raises(EvaluationError, match=f"no {kind}"):
        metric.evaluate(EvalItem(), output(cost_usd=None, latency_ms=None))


@pytest.mark.parametrize("kind", sorted(TRAJECTORY_METRICS))
def test_every_metric_errors_on_an_output_without_trajectory_facts(kind):
    config: dict[str, Any] = {"type": kind, "max": 1} if kind in ("steps", "cost", "latency") else {"type": kind}
    metric = trajectory_metric_from_config(config)

    result = evaluate_safely(metric, EvalItem(metadata={"should_escalate": True}), EvalOutput(text="hi"))

    assert result.error == "EvaluationError: the output has no trajectory facts"


# --- signals and task success -------------------------------------------------------------------------


def test_any_signal_fails_by_default():
    result = score({"type": "signals"}, output(signals=("tool_error", "user_frustration")))

    assert (result.score, result.passed) == (0.0, False)
    assert result.reason == "signals found: tool_error, user_frustration"
    assert score({"type": "signals"}, output()).passed is True


def test_signals_fail_only_on_those_listed():
    config = {"type": "signals", "fail_on": ["user_frustration"]}

    assert score(config, output(signals=("tool_error",))).passed is True
    assert score(config, output(signals=("tool_error", "user_frustration"))).reason == "signals found: user_frustration"


@pytest.mark.parametrize(
    ("facts", "counts", "passed"),
    [
        ({"status": "ok"}, False, True),
        ({"status": "error"}, True, False),
        ({"status": "ok", "escalated": True}, False, False),
        ({"status": "ok", "escalated": True}, True, True),
    ],
)
def test_task_success(facts, counts, passed):
    result = score({"type": "task_success", "escalation_counts_as_success": counts}, output(**facts))

    assert (result.score, result.passed) == (1.0 if passed else 0.0, passed)


# --- names, versions and configuration ----------------------------------------------------------------


def test_label_and_version_name_the_score():
    result = score({"type": "signals", "label": "clean run", "version": 3}, output())

    assert (result.evaluator, result.version) == ("clean run", 3)


def test_config_round_trips_with_lists_as_tuples():
    config = {
        "type": "policy_compliance",
        "gated_actions": [REFUND],
        "constraints": [{"tool": REFUND, "argument": "method", "allowed": ["card", "wallet"]}],
        "allowed_tools": [LOOKUP, REFUND],
        "version": 2,
        "label": "policy",
    }

    metric = trajectory_metric_from_config(config)

    assert metric.gated_actions == (REFUND,)  # type: ignore[attr-defined]
    assert metric.constraints[0]["allowed"] == ("card", "wallet")  # type: ignore[attr-defined]
    assert metric.config() == config  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"type": "nope"}, "type"),
        ({}, "type"),
        ({"type": "steps"}, "max"),
        ({"type": "cost", "max": 0}, "max"),
        ({"type": "latency", "max": "fast"}, "max"),
        ({"type": "steps", "max": True}, "max"),
        ({"type": "signals", "colour": "red"}, "colour"),
        ({"type": "signals", "fail_on": "tool_error"}, "fail_on"),
        ({"type": "signals", "version": 0}, "version"),
        ({"type": "signals", "label": 7}, "label"),
        ({"type": "tool_use", "pass_threshold": 1.5}, "pass_threshold"),
        ({"type": "tool_use", "order": "random"}, "order"),
        ({"type": "tool_use", "allowed_tools": ["", "x"]}, "allowed_tools[0]"),
        ({"type": "escalation_accuracy", "metadata_key": ""}, "metadata_key"),
        ({"type": "task_success", "escalation_counts_as_success": "yes"}, "escalation_counts_as_success"),
        ({"type": "policy_compliance", "gated_actions": [REFUND, 3]}, "gated_actions[1]"),
        ({"type": "policy_compliance", "constraints": {"tool": REFUND}}, "constraints"),
        ({"type": "policy_compliance", "constraints": ["max 50"]}, "constraints[0]"),
        (constrained(), "constraints[0]"),
        ({"type": "policy_compliance", "constraints": [{"argument": "amount", "max": 1}]}, "constraints[0].tool"),
        (constrained(max="lots"), "constraints[0].max"),
        (constrained(min=5, max=1), "constraints[0].min"),
        (constrained(allowed=[]), "constraints[0].allowed"),
        (constrained(allowed="card"), "constraints[0].allowed"),
        (constrained(pattern="("), "constraints[0].pattern"),
        (constrained(max=1, unit="USD"), "constraints[0].unit"),
    ],
)
def test_a_bad_config_names_the_field(config, field):
    with pytest.raises(EvaluatorConfigError) as raised:
        trajectory_metric_from_config(config)

    assert raised.value.field == field
