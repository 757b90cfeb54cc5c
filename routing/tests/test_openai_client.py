"""The official `openai` client works against the gateway unchanged (a live server, the fake provider)."""

from __future__ import annotations

import openai
import pytest

from agent_registry import services as registry_services
from routing.models import RouterConfig, RoutingDecision
from routing.tests.conftest import gateway_agent, targets
from routing.tests.fakes import say

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def client(live_server, workspace, fake):
    agent = gateway_agent(workspace)
    fast, strong = targets(workspace)
    RouterConfig.objects.create(agent=agent, single_call_target=fast, agentic_target=strong)
    _, raw = registry_services.apikey_create(workspace=workspace, name="openai", scopes=["gateway"])
    return openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=raw, max_retries=0)


def test_chat_completions_models_and_streaming_through_the_openai_client(client, fake):
    fake.script("fast", say("Your trip T1 cost $12.50."), say("Streaming works fine"), say("Streaming works fine"))

    completion = client.chat.completions.create(
        model="agent/ride-support",
        messages=[{"role": "user", "content": "What did trip T1 cost?"}],
        extra_body={"variables": {"company": "Acme"}},
        extra_headers={"X-Keel-Conversation-Id": "chat-9"},
    )
    assert completion.choices[0].message.content == "Your trip T1 cost $12.50."
    assert completion.usage is not None
    assert completion.usage.total_tokens == 48

    stream = client.chat.completions.create(
        model="agent/ride-support",
        messages=[{"role": "user", "content": "Say it streams"}],
        extra_body={"variables": {"company": "Acme"}},
        stream=True,
    )
    assert "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices) == "Streaming works fine"

    chunks = list(
        client.chat.completions.create(
            model="agent/ride-support",
            messages=[{"role": "user", "content": "Say it streams"}],
            extra_body={"variables": {"company": "Acme"}},
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert [chunk.usage is not None for chunk in chunks].count(True) == 1
    usage = chunks[-1].usage
    assert usage is not None
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens > 0
    assert chunks[-1].choices == []

    assert [model.id for model in client.models.list()] == ["agent/ride-support", "fast", "strong"]
    assert RoutingDecision.objects.filter(conversation_id="chat-9").count() == 1


def test_errors_reach_the_openai_client_as_its_own_exceptions(client):
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="agent/nobody", messages=[{"role": "user", "content": "hi"}])
    assert "nobody" in str(missing.value)

    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model="agent/ride-support", messages=[], extra_body={"variables": {"company": "A"}}
        )
