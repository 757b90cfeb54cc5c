"""The gateway's model calls skip litellm's success logging (routing/providers.py): Keel prices and records
each call itself, and litellm's logging thread would compete with the request for the interpreter lock."""

from __future__ import annotations

from typing import Any

import pytest

from routing import providers
from routing.models import ModelTarget
from routing.tests.fakes import FAKE_PROVIDER

pytestmark = pytest.mark.django_db


@pytest.fixture
def handed_over(monkeypatch) -> list[Any]:
    """What litellm hands to its logging thread."""
    import litellm.utils

    submitted: list[Any] = []
    executor = litellm.utils.executor
    monkeypatch.setattr(executor, "submit", lambda *args, **kwargs: submitted.append(args))
    return submitted


def test_a_gateway_call_hands_nothing_to_litellms_logging_thread(workspace, fake, handed_over):
    import litellm

    target = ModelTarget.objects.create(workspace=workspace, alias="fast", model=f"{FAKE_PROVIDER}/fast")
    messages = [{"role": "user", "content": "ping"}]

    litellm.completion(model=target.model, messages=messages)
    assert len(handed_over) == 1  # litellm's own behaviour, which the gateway's calls avoid

    completion = providers.completion(target=target, messages=messages)

    assert completion.message["content"] == "fast answers: ping"
    assert len(handed_over) == 1
