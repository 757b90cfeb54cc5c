"""The requirements editor's pure conversions, and the small parsers of the other forms."""

from __future__ import annotations

import typing
from typing import Any

import pytest
from django import forms as django_forms
from pydantic import BaseModel

from agent_registry import requirements
from agent_registry.tests.factories import requirements_answers
from frontend import forms

FULL_ANSWERS: dict[str, Any] = requirements_answers(
    **{
        "error_surface.notes": "Humans for disputes.",
        "error_surface.actions": [
            {
                "name": "issue_refund",
                "description": "Refund a charge",
                "mode": "execute",
                "stakes": "moderate",
                "side_effects": True,
                "requires_approval": True,
                "autonomy_limit_usd": "20.50",
            },
            {"name": "lookup_trip", "mode": "recommend", "stakes": "low"},
        ],
        "io_gap.notes": "Four to five steps for a double charge.",
        "constraints.latency.notes": "Abandonment cliff at 2-3 minutes.",
        "constraints.cost": {
            "per_request_ceiling_usd": "0.50",
            "per_resolution_ceiling_usd": "2.00",
            "comparison_point": "Human agent",
            "comparison_cost_usd": "8",
            "single_call_cost_usd": "0.01",
            "expected_daily_requests": 40000,
        },
        "constraints.privacy": {
            "may_see": "Trip IDs",
            "may_infer": "Nothing",
            "may_store": "30 days",
            "may_transmit": "IDs only",
            "pii_handling": "pseudonymize",
        },
        "pareto.rationale": "Quality over speed.",
        "evaluation.output_metrics": [
            {"name": "resolution_rate", "description": "Closed", "target": 0.7, "comparator": ">="},
            {"name": "recontact_rate", "target": 0.15, "comparator": "<="},
        ],
        "evaluation.notes": "Trajectory logging from day one.",
        "routing.signal": "classifier",
        "routing.escalation_rules": [
            {"trigger": "keywords", "value": "unsafe", "to_tier": "human", "reason": "Safety"},
            {"trigger": "amount_over", "value": "20", "to_tier": "human"},
        ],
        "routing.notes": "The router has its own eval.",
    }
)


def _canonical(answers: dict[str, Any]) -> dict[str, Any]:
    return requirements.Requirements.model_validate(answers).to_json()


@pytest.mark.parametrize("answers", [requirements_answers(), FULL_ANSWERS], ids=["factory", "every_field"])
def test_post_data_round_trips_to_the_same_answers(answers):
    posted = forms.requirements_form_values(_canonical(answers))

    assert _canonical(forms.requirements_answers_from_post(posted)) == _canonical(answers)


def test_post_data_is_typed_like_the_answers():
    posted = forms.requirements_form_values(_canonical(requirements_answers()))

    answers = forms.requirements_answers_from_post(posted)

    assert answers["io_gap"]["steps_p95"] == 5
    assert answers["io_gap"]["steps_predictable"] is True
    assert answers["io_gap"]["output_verifiable_from_input"] is False
    assert answers["io_gap"]["atomic_operations"] == ["extraction", "classification", "decision_action"]
    assert answers["error_surface"]["actions"][1]["autonomy_limit_usd"] == "20"
    assert answers["error_surface"]["actions"][0]["autonomy_limit_usd"] is None
    assert answers["evaluation"]["output_metrics"] == [
        {"name": "resolution_rate", "description": "", "comparator": ">=", "target": 0.7}
    ]
    assert answers["pareto"]["quality_vs_speed"] == 30


def _leaf_paths(model: type[BaseModel], prefix: str = "") -> set[str]:
    """Every answer a person gives: model fields, with lists of objects as `<list>.*.<field>`."""
    paths = set()
    for name, field in model.model_fields.items():
        annotation = field.annotation
        path = f"{prefix}{name}"
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            paths |= _leaf_paths(annotation, f"{path}.")
            continue
        item = typing.get_args(annotation)[0] if typing.get_origin(annotation) is list else None
        if isinstance(item, type) and issubclass(item, BaseModel):
            paths |= _leaf_paths(item, f"{path}.*.")
        else:
            paths.add(path)
    return paths


def test_the_editor_has_an_input_for_every_answer_in_the_schema():
    inputs = {spec.key for spec in forms.SCALAR_INPUTS}
    inputs |= {f"{rows.key}.*.{spec.key}" for rows in forms.ROWS for spec in rows.inputs}

    assert inputs == _leaf_paths(requirements.Requirements)


def test_the_editor_follows_the_order_and_words_of_the_six_questions():
    assert [(s.key, s.title, s.guidance) for s in forms.REQUIREMENTS_SECTIONS] == list(requirements.QUESTIONS)


def test_selects_offer_exactly_the_schema_vocabulary():
    by_key = {spec.key: spec for spec in forms.SCALAR_INPUTS}

    assert [value for value, _ in by_key["constraints.latency.latency_class"].choices] == [
        "inline",
        "conversational",
        "asynchronous",
    ]
    assert [value for value, _ in by_key["routing.enabled_tiers"].choices] == [t.value for t in requirements.Tier]
    assert by_key["routing.enabled_tiers"].kind == "multi"
    assert by_key["pareto.quality_vs_speed"].kind == "range"


def test_rows_keep_their_order_across_gaps_and_blank_rows_are_dropped():
    posted = forms.requirements_form_values(_canonical(requirements_answers()))
    for key in [key for key in posted if key.startswith("error_surface.actions.")]:
        del posted[key]
    posted |= {
        "error_surface.actions.7.name": ["second"],
        "error_surface.actions.7.mode": ["recommend"],
        "error_surface.actions.7.stakes": ["low"],
        "error_surface.actions.3.name": ["first"],
        "error_surface.actions.3.mode": ["execute"],
        "error_surface.actions.3.stakes": ["high"],
        "error_surface.actions.3.requires_approval": ["on"],
        "error_surface.actions.9.name": [""],
        "error_surface.actions.9.mode": [""],
        "error_surface.actions.9.autonomy_limit_usd": ["  "],
    }

    actions = forms.requirements_answers_from_post(posted)["error_surface"]["actions"]

    assert [(a["name"], a["requires_approval"], a["side_effects"]) for a in actions] == [
        ("first", True, False),
        ("second", False, False),
    ]


def test_a_blank_required_number_is_left_out_so_the_schema_says_it_is_required():
    posted = forms.requirements_form_values(_canonical(requirements_answers()))
    posted["io_gap.steps_median"] = [""]
    posted["constraints.cost.per_resolution_ceiling_usd"] = [""]

    answers = forms.requirements_answers_from_post(posted)

    assert "steps_median" not in answers["io_gap"]
    assert answers["constraints"]["cost"]["per_resolution_ceiling_usd"] is None


def test_unparsable_numbers_reach_the_schema_unchanged():
    posted = forms.requirements_form_values(_canonical(requirements_answers()))
    posted["io_gap.steps_p95"] = ["five"]
    posted["evaluation.output_metrics.0.target"] = ["high"]

    answers = forms.requirements_answers_from_post(posted)

    assert answers["io_gap"]["steps_p95"] == "five"
    assert answers["evaluation"]["output_metrics"][0]["target"] == "high"


def test_field_errors_go_to_the_input_they_name():
    errors = forms.requirements_field_errors(
        [
            {"field": "io_gap.steps_p95", "message": "Value error, steps_p95 must be at least steps_median"},
            {"field": "routing", "message": "Value error, default_tier must be one of enabled_tiers"},
            {"field": "routing.escalation_rules.1", "message": "Value error, value must be a number for trigger x"},
            {"field": "error_surface", "message": "Value error, action names must be unique; repeated: a"},
            {"field": "error_surface.actions.0.name", "message": "String should match pattern"},
        ]
    )

    assert errors == {
        "io_gap.steps_p95": ["steps_p95 must be at least steps_median"],
        "routing.default_tier": ["default_tier must be one of enabled_tiers"],
        "routing.escalation_rules.1.value": ["value must be a number for trigger x"],
        "error_surface": ["action names must be unique; repeated: a"],
        "error_surface.actions.0.name": ["String should match pattern"],
    }


def test_findings_about_a_named_action_point_at_its_row():
    values = forms.requirements_form_values(_canonical(requirements_answers()))

    targets = forms.finding_targets(
        ("error_surface.actions.issue_refund", "routing.enabled_tiers", "evaluation.trajectory_metrics"), values
    )

    assert [(t.name, t.anchor) for t in targets] == [
        ("error_surface.actions.1.name", "f-error_surface-actions-1-name"),
        ("routing.enabled_tiers", "f-routing-enabled_tiers"),
        ("evaluation.trajectory_metrics", "f-evaluation-trajectory_metrics"),
    ]
    assert targets[1].label == "Routing policy › enabled tiers"


def test_bound_sections_carry_values_errors_and_flags():
    values = forms.requirements_form_values(_canonical(requirements_answers()))

    sections = forms.requirements_form_bind(
        values,
        errors={"io_gap.steps_p95": ["too small"], "error_surface": ["names repeat"]},
        flagged=["constraints.latency.latency_class"],
    )

    by_name = {
        item.name: item
        for section in sections
        for group in section.groups
        for item in group.items
        if isinstance(item, forms.BoundInput)
    }
    assert by_name["io_gap.steps_p95"].errors == ("too small",)
    assert by_name["io_gap.steps_p95"].value == "5"
    assert by_name["constraints.latency.latency_class"].flagged is True
    assert [o.value for o in by_name["routing.enabled_tiers"].options if o.selected] == [
        "single_call",
        "chain",
        "human",
    ]
    assert [(s.key, s.error_count) for s in sections if s.error_count] == [("error_surface", 1), ("io_gap", 1)]
    actions = next(
        item
        for group in sections[0].groups
        for item in group.items
        if isinstance(item, forms.BoundRows) and item.spec.key == "error_surface.actions"
    )
    assert [row.index for row in actions.rows] == ["0", "1"]
    assert actions.next_index == 2
    assert actions.blank_row.inputs[0].name == "error_surface.actions.__index__.name"


def test_labels_parse_splits_on_commas_and_spaces_without_repeats():
    assert forms.labels_parse(" production, staging  production\ncanary,") == ["production", "staging", "canary"]


def test_a_chat_template_must_be_json():
    assert forms.template_parse("chat", '[{"role": "user", "content": "hi"}]') == [{"role": "user", "content": "hi"}]
    assert forms.template_parse("text", "[not json]") == "[not json]"
    with pytest.raises(django_forms.ValidationError, match="must be JSON"):
        forms.template_parse("chat", "[{'role': 'user'}]")


def test_render_input_reads_variables_and_placeholders():
    parsed = forms.render_input_parse(
        {
            "version": "2",
            "var.name": "Ada",
            "var.empty": "",
            "placeholder.history": '[{"role": "user", "content": "earlier"}]',
            "placeholder.broken": "{",
        }
    )

    assert parsed.version == 2
    assert parsed.variables == {"name": "Ada"}
    assert parsed.placeholders == {"history": [{"role": "user", "content": "earlier"}]}
    assert list(parsed.errors) == ["placeholder.broken"]
