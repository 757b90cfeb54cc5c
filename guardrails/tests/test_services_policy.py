"""An agent's guardrail policy: the default its requirements derive, saving one, and the mandatory checks
a saved policy cannot drop or weaken (422, nothing saved)."""

from __future__ import annotations

import pytest

from agent_registry import services as registry_services
from agent_registry.tests.factories import AgentFactory, requirements_answers
from config import crypto
from guardrails import policy, services
from guardrails.exceptions import GuardrailPolicyInvalid
from guardrails.interface import Action, Layer
from guardrails.models import GuardrailPolicy
from guardrails.tests.factories import guard_target, guarded_agent

pytestmark = pytest.mark.django_db


def rules(effective: services.EffectivePolicy) -> list[tuple[str, str, str]]:
    return [(rule.check, rule.layer.value, rule.action.value) for rule in effective.document.checks]


def document_of(agent, **changes):
    return {**services.guardrail_policy_get(agent=agent).document.model_dump(mode="json"), **changes}


def test_the_default_policy_follows_the_requirements(workspace):
    agent = guarded_agent(workspace=workspace)

    effective = services.guardrail_policy_get(agent=agent)

    assert effective.saved is False
    assert rules(effective) == [
        ("prompt_injection", "input", "block"),
        ("indirect_injection", "input", "flag"),
        ("pii", "input", "redact"),
        ("pii", "output", "redact"),
        ("secrets", "output", "redact"),
        ("system_prompt_leakage", "output", "block"),
        ("output_handling", "output", "flag"),
        ("toxicity", "output", "flag"),
        ("indirect_injection", "tool", "block"),
    ]
    assert effective.document.pseudonymize is True  # the privacy answer says pseudonymize
    assert [(item.check, item.layer.value) for item in effective.mandatory] == [
        ("system_prompt_leakage", "output"),
        ("prompt_injection", "input"),
        ("indirect_injection", "tool"),
        ("pii", "input"),
        ("pii", "output"),
    ]
    assert GuardrailPolicy.objects.count() == 0


def test_without_requirements_only_leakage_is_mandatory_and_injection_is_flagged(workspace):
    agent = AgentFactory.create(workspace=workspace)

    effective = services.guardrail_policy_get(agent=agent)

    assert rules(effective) == [
        ("prompt_injection", "input", "flag"),
        ("indirect_injection", "input", "flag"),
        ("secrets", "output", "redact"),
        ("system_prompt_leakage", "output", "block"),
        ("output_handling", "output", "flag"),
        ("toxicity", "output", "flag"),
    ]
    assert effective.document.pseudonymize is False


def test_saving_a_stricter_policy(workspace):
    agent = guarded_agent(workspace=workspace)
    document = document_of(
        agent,
        checks=[*document_of(agent)["checks"], {"check": "topic", "layer": "input", "action": "block"}],
        allowed_topics=["rides", "refunds"],
        pii_kinds=["email", "card"],
    )

    effective = services.guardrail_policy_update(agent=agent, document=document)

    assert effective.saved is True
    assert ("topic", "input", "block") in rules(effective)
    assert effective.document.allowed_topics == ["rides", "refunds"]
    saved = GuardrailPolicy.objects.get()
    assert (saved.workspace_id, saved.agent_id) == (workspace.pk, agent.pk)
    assert crypto.decrypt(saved.canary_secret_encrypted) == effective.canary_secret
    assert effective.canary_secret not in saved.canary_secret_encrypted


def test_the_canary_secret_is_kept_across_saves_unless_rotated(workspace):
    agent = guarded_agent(workspace=workspace)
    first = services.guardrail_policy_update(agent=agent, document=document_of(agent))

    second = services.guardrail_policy_update(agent=agent, document=document_of(agent))
    rotated = services.guardrail_policy_update(agent=agent, document=document_of(agent), rotate_canary=True)

    assert second.canary_secret == first.canary_secret
    assert rotated.canary_secret != first.canary_secret
    assert GuardrailPolicy.objects.count() == 1


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        (
            lambda checks: [c for c in checks if c["check"] != "prompt_injection"],
            "checks.prompt_injection.input",
            "prompt_injection on input is mandatory (the agent has tools an injection could steer)",
        ),
        (
            lambda checks: [{**c, "action": "allow"} if c["check"] == "system_prompt_leakage" else c for c in checks],
            "checks.system_prompt_leakage.output",
            "system_prompt_leakage on output is mandatory (every agent has a system prompt to protect)",
        ),
        (
            lambda checks: [
                {**c, "action": "flag"} if (c["check"], c["layer"]) == ("pii", "input") else c for c in checks
            ],
            "checks.pii.input",
            "pii on input must redact or block (privacy says pseudonymize)",
        ),
    ],
)
def test_mandatory_checks_cannot_be_switched_off(workspace, change, field, message):
    agent = guarded_agent(workspace=workspace)
    before = services.guardrail_policy_update(agent=agent, document=document_of(agent))
    weakened = document_of(agent, checks=change(document_of(agent)["checks"]))

    with pytest.raises(GuardrailPolicyInvalid) as refused:
        services.guardrail_policy_update(agent=agent, document=weakened)

    assert refused.value.status == 422
    assert refused.value.extra["errors"] == [{"field": field, "message": message}]
    assert services.guardrail_policy_get(agent=agent).document == before.document


def test_tool_rules_of_an_agent_without_requirements_are_refused(workspace):
    agent = AgentFactory.create(workspace=workspace)

    with pytest.raises(GuardrailPolicyInvalid) as refused:
        services.guardrail_policy_update(agent=agent, document=document_of(agent, approval_tools=["lookup_trip"]))

    assert refused.value.extra["errors"] == [
        {
            "field": "approval_tools.0",
            "message": "'lookup_trip' is not a tool this agent may call; its tools are none: its requirements "
            "list no actions",
        }
    ]
    assert GuardrailPolicy.objects.count() == 0


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"checks": [{"check": "telepathy", "layer": "input", "action": "block"}]}, "unknown check 'telepathy'"),
        ({"checks": [{"check": "toxicity", "layer": "input", "action": "redact"}]}, "toxicity cannot redact"),
        ({"checks": [{"check": "toxicity", "layer": "moon", "action": "flag"}]}, "Input should be"),
        ({"tool_constraints": [{"tool": "t", "argument": "a", "op": "<=", "value": "x"}]}, "<= needs a number"),
        ({"tool_constraints": [{"tool": "t", "argument": "a", "op": "matches", "value": "("}]}, "invalid regular"),
        ({"rate_limits": [{"tool": "t"}]}, "needs per_conversation, per_day or both"),
        ({"surprise": True}, "Extra inputs are not permitted"),
    ],
)
def test_a_malformed_policy_is_refused(workspace, document, message):
    agent = AgentFactory.create(workspace=workspace)

    with pytest.raises(GuardrailPolicyInvalid, match="invalid guardrail policy") as refused:
        services.guardrail_policy_update(agent=agent, document=document_of(agent, **document))

    assert any(message in error["message"] for error in refused.value.extra["errors"])
    assert GuardrailPolicy.objects.count() == 0


def test_a_model_check_must_name_a_target_of_the_workspace(workspace, other_workspace):
    agent = AgentFactory.create(workspace=workspace)
    guard_target(other_workspace, alias="judge")
    judge = {"name": "refund_policy", "kind": "llm_judge", "layer": "output", "target": "judge", "instructions": "x"}

    with pytest.raises(GuardrailPolicyInvalid) as refused:
        services.guardrail_policy_update(agent=agent, document=document_of(agent, model_checks=[judge]))
    guard_target(workspace, alias="judge")
    effective = services.guardrail_policy_update(agent=agent, document=document_of(agent, model_checks=[judge]))

    assert refused.value.extra["errors"] == [
        {"field": "model_checks.refund_policy.target", "message": "no model target 'judge' in this workspace"}
    ]
    assert [rule.name for rule in effective.document.model_checks] == ["refund_policy"]


def test_actions_combine_to_the_most_severe():
    assert policy.action_combine([]) is Action.ALLOW
    assert policy.action_combine([Action.FLAG, Action.REDACT]) is Action.REDACT
    assert policy.action_combine([Action.REDACT, Action.REQUIRE_APPROVAL, Action.FLAG]) is Action.REQUIRE_APPROVAL
    assert policy.action_combine([Action.REQUIRE_APPROVAL, Action.BLOCK]) is Action.BLOCK


def test_the_tool_policy_lists_derived_constraints(workspace):
    agent = guarded_agent(workspace=workspace)

    tools = services.guardrail_policy_get(agent=agent).tools()

    assert tools.allow_list == frozenset({"lookup_trip", "issue_refund"})
    assert tools.approval_always == frozenset()
    assert [constraint.describe() for constraint in tools.constraints] == ["issue_refund.amount <= 20"]
    assert tools.assess("issue_refund", {"amount": 21}) == policy.Assessment(
        "require_approval", "issue_refund.amount <= 20 does not hold"
    )
    assert Layer.TOOL in {rule.layer for rule in services.guardrail_policy_get(agent=agent).document.checks}


def test_a_check_made_mandatory_after_saving_runs_anyway(workspace):
    agent = AgentFactory.create(workspace=workspace)
    document = document_of(agent)
    document["checks"] = [rule for rule in document["checks"] if rule["check"] != "prompt_injection"]
    services.guardrail_policy_update(agent=agent, document=document)

    # The agent gets tools and pseudonymised PII: injection and PII become mandatory.
    registry_services.requirements_version_create(agent=agent, answers=requirements_answers(), message="tools")
    effective = services.guardrail_policy_get(agent=agent)

    assert ("prompt_injection", "input", "block") in rules(effective)
    assert ("pii", "input", "redact") in rules(effective)
    assert ("indirect_injection", "tool", "block") in rules(effective)
    assert GuardrailPolicy.objects.get().document["checks"] == document["checks"]
