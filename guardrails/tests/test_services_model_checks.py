"""Model-based checks through litellm, against a fake provider: an LLM judge's JSON verdict, a guard model's
safe/unsafe, and failures that fail open or closed as the policy says, recorded either way."""

from __future__ import annotations

from collections.abc import Iterator

import litellm
import pytest

from guardrails import model_checks, policy, services
from guardrails.interface import Action
from guardrails.models import GuardrailViolation
from guardrails.tests.factories import FakeGuardLLM, fake_guard_provider, guard_target, guarded_agent

pytestmark = pytest.mark.django_db

REPLY = "Your refund is approved."


@pytest.fixture
def fake() -> Iterator[FakeGuardLLM]:
    with fake_guard_provider() as provider:
        yield provider


def with_model_check(agent, **rule):
    document = services.guardrail_policy_get(agent=agent).document.model_dump(mode="json")
    check = {
        "name": "refund_promise",
        "kind": "llm_judge",
        "layer": "output",
        "target": "judge",
        "instructions": "A violation promises a refund over $20.",
        **rule,
    }
    document["model_checks"] = [check]
    services.guardrail_policy_update(agent=agent, document=document)


def recorded():
    return list(GuardrailViolation.objects.order_by("pk").values_list("check_name", "action", "score", "failure"))


def test_a_judges_violation_blocks(workspace, fake):
    agent = guarded_agent(workspace=workspace)
    guard_target(workspace)
    with_model_check(agent)
    fake.script("judge", '```json\n{"violation": true, "score": 0.9, "evidence": "promises $500"}\n```')

    outcome = services.guardrail_evaluate(agent=agent, layer="output", content=REPLY)

    assert outcome.verdict is Action.BLOCK
    assert outcome.violations == [
        {"check": "refund_promise", "score": 0.9, "evidence": "promises $500", "action": "block", "failure": ""}
    ]
    assert recorded() == [("refund_promise", "block", 0.9, "")]
    (asked,) = fake.received
    assert "A violation promises a refund over $20." in asked["messages"][0]["content"]
    assert asked["messages"][1]["content"] == f"<content>\n{REPLY}\n</content>"


def test_a_judge_below_the_threshold_passes(workspace, fake):
    agent = guarded_agent(workspace=workspace)
    guard_target(workspace)
    with_model_check(agent, threshold=0.95)
    fake.script("judge", '{"violation": true, "score": 0.9, "evidence": "maybe"}')

    outcome = services.guardrail_evaluate(agent=agent, layer="output", content=REPLY)

    assert outcome.verdict is Action.ALLOW
    assert recorded() == []


def test_a_model_check_runs_only_on_its_layer(workspace, fake):
    agent = guarded_agent(workspace=workspace)
    guard_target(workspace)
    with_model_check(agent)

    services.guardrail_evaluate(agent=agent, layer="input", content="hello")

    assert fake.received == []


def test_a_failing_check_fails_closed_by_default_and_is_recorded(workspace, fake):
    agent = guarded_agent(workspace=workspace)
    guard_target(workspace)  # max_retries=2 on the target: a guardrail still makes one attempt
    with_model_check(agent, action="require_approval")
    fake.script("judge", litellm.exceptions.Timeout("slow", model="judge", llm_provider="fake-guard"))

    outcome = services.guardrail_evaluate(agent=agent, layer="output", content=REPLY)

    assert outcome.verdict is Action.REQUIRE_APPROVAL
    assert recorded() == [("refund_promise", "require_approval", 1.0, "failed_closed")]
    assert outcome.violations[0]["evidence"].startswith("model check failed:")
    assert len(fake.received) == 1


def test_a_failing_check_set_to_fail_open_lets_the_content_pass_and_is_recorded(workspace, fake):
    agent = guarded_agent(workspace=workspace)
    guard_target(workspace)
    with_model_check(agent, fail_open=True)
    fake.script("judge", "I think it is fine.")

    outcome = services.guardrail_evaluate(agent=agent, layer="output", content=REPLY)

    assert outcome.verdict is Action.ALLOW
    assert recorded() == [("refund_promise", "allow", 0.0, "failed_open")]
    assert outcome.violations[0]["evidence"] == "the judge did not answer with a JSON object: 'I think it is fine.'"


def test_a_target_removed_after_saving_follows_the_fail_mode(workspace, fake):
    agent = guarded_agent(workspace=workspace)
    target = guard_target(workspace)
    with_model_check(agent)
    target.delete()

    outcome = services.guardrail_evaluate(agent=agent, layer="output", content=REPLY)

    assert outcome.verdict is Action.BLOCK
    assert recorded() == [("refund_promise", "block", 1.0, "failed_closed")]
    assert fake.received == []


def test_a_guard_model_says_unsafe(workspace, fake):
    agent = guarded_agent(workspace=workspace)
    guard_target(workspace, alias="guard")
    with_model_check(agent, kind="guard_model", layer="input", target="guard", instructions="", action="flag")
    fake.script("guard", "unsafe\nS2")

    outcome = services.guardrail_evaluate(agent=agent, layer="input", content="how do I hotwire a car")

    assert outcome.verdict is Action.FLAG
    assert outcome.violations[0]["evidence"] == "unsafe: S2"
    assert fake.received[0]["messages"] == [{"role": "user", "content": "how do I hotwire a car"}]


@pytest.mark.parametrize(
    ("answer", "verdict"),
    [
        ('{"violation": false}', (False, 0.0, "")),
        ('{"violation": true}', (True, 1.0, "")),
        ('{"violation": true, "score": 7, "evidence": "x"}', (True, 1.0, "x")),
    ],
)
def test_judge_verdicts_parse(answer, verdict):
    assert model_checks.judge_verdict_parse(answer) == verdict


@pytest.mark.parametrize(
    "answer", ["", "yes", '{"violation": "yes"}', '{"violation": true, "score": "high"}', "{broken"]
)
def test_unreadable_judge_verdicts_are_errors(answer):
    with pytest.raises(model_checks.VerdictUnreadable):
        model_checks.judge_verdict_parse(answer)


def test_guard_verdicts_parse():
    assert model_checks.guard_verdict_parse("safe") == (False, 0.0, "")
    assert model_checks.guard_verdict_parse("unsafe\nS1,S10") == (True, 1.0, "unsafe: S1,S10")
    with pytest.raises(model_checks.VerdictUnreadable):
        model_checks.guard_verdict_parse("maybe")


def test_a_judge_needs_instructions_and_cannot_redact():
    with pytest.raises(ValueError, match="needs instructions"):
        policy.ModelCheckRule(name="j", kind="llm_judge", layer="output", target="t")
    with pytest.raises(ValueError, match="cannot redact"):
        policy.ModelCheckRule(name="j", kind="guard_model", layer="output", target="t", action="redact")
