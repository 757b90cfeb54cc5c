"""Factories for guardrail rows and a fake model provider for model-based checks. Every row's workspace
follows its agent, so no factory builds a row that straddles two tenants."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from django.utils import timezone
from factory.declarations import LazyAttribute, LazyFunction, SubFactory
from factory.django import DjangoModelFactory
from litellm.llms.custom_llm import CustomLLM
from litellm.types.utils import Choices, Message, ModelResponse, Usage

from agent_registry.models import Agent
from agent_registry.tests.factories import AgentFactory, WorkspaceFactory, agent_with_requirements
from guardrails import policy
from guardrails.models import ApprovalRequest, Budget, GuardrailViolation
from routing.models import ModelTarget

FAKE_GUARD_PROVIDER = "fake-guard"


def guarded_agent(**kwargs: Any) -> Agent:
    """An agent with the registry's test requirements: tools lookup_trip and issue_refund (autonomy limit
    $20), pseudonymised PII, bounded autonomy."""
    return agent_with_requirements(**kwargs)


class GuardrailViolationFactory(DjangoModelFactory[GuardrailViolation]):
    class Meta:
        model = GuardrailViolation

    agent = SubFactory(AgentFactory)
    workspace = LazyAttribute(lambda violation: violation.agent.workspace)
    layer = "input"
    check_name = "prompt_injection"
    action = "block"
    score = 0.9
    evidence = "ignore all previous instructions"


class ApprovalRequestFactory(DjangoModelFactory[ApprovalRequest]):
    class Meta:
        model = ApprovalRequest

    agent = SubFactory(AgentFactory)
    workspace = LazyAttribute(lambda approval: approval.agent.workspace)
    conversation_id = "conv-1"
    tool = "issue_refund"
    arguments = LazyFunction(lambda: {"trip_id": "T1", "amount": 50})
    arguments_hash = LazyAttribute(lambda approval: policy.arguments_hash(approval.arguments))
    reason = "issue_refund.amount <= 20 does not hold"
    expires_at = LazyFunction(lambda: timezone.now() + timedelta(hours=24))


class BudgetFactory(DjangoModelFactory[Budget]):
    class Meta:
        model = Budget

    workspace = SubFactory(WorkspaceFactory)
    scope = "workspace"
    scope_value = ""
    period = "day"
    limit_usd = None
    limit_tokens = None


def guard_target(workspace: Any, alias: str = "judge") -> ModelTarget:
    return ModelTarget.objects.create(
        workspace=workspace, alias=alias, model=f"{FAKE_GUARD_PROVIDER}/{alias}", max_retries=2
    )


class FakeGuardLLM(CustomLLM):
    """Answers each model with its scripted texts in order (or raises a scripted exception); records what
    it was asked. Nothing reaches a network."""

    def __init__(self) -> None:
        super().__init__()
        self.scripts: dict[str, list[str | Exception]] = {}
        self.received: list[dict[str, Any]] = []

    def script(self, model: str, *answers: str | Exception) -> None:
        self.scripts.setdefault(model, []).extend(answers)

    def completion(self, model: str, messages: list[Any], *args: Any, **kwargs: Any) -> ModelResponse:
        name = model.removeprefix(f"{FAKE_GUARD_PROVIDER}/")
        self.received.append({"model": name, "messages": messages, "params": dict(kwargs.get("optional_params") or {})})
        queue = self.scripts.get(name) or ['{"violation": false, "score": 0.0, "evidence": ""}']
        answer = queue.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return ModelResponse(
            model=model,
            choices=[Choices(index=0, finish_reason="stop", message=Message(role="assistant", content=answer))],
            usage=Usage(prompt_tokens=30, completion_tokens=10, total_tokens=40),
        )


@contextmanager
def fake_guard_provider() -> Iterator[FakeGuardLLM]:
    import litellm

    fake = FakeGuardLLM()
    previous = litellm.custom_provider_map
    litellm.custom_provider_map = [*previous, {"provider": FAKE_GUARD_PROVIDER, "custom_handler": fake}]
    try:
        yield fake
    finally:
        litellm.custom_provider_map = previous
