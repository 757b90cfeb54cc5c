"""`GET /v1/models/{model}`, which the openai client's `models.retrieve` calls: one of what the key may call."""

from __future__ import annotations

import openai
import pytest

from agent_registry import services as registry_services
from routing.models import RouterConfig
from routing.tests.conftest import gateway_agent, targets

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def keys(live_server, workspace, fake):
    agent = gateway_agent(workspace)
    fast, strong = targets(workspace)
    RouterConfig.objects.create(agent=agent, single_call_target=fast, agentic_target=strong)
    _, whole = registry_services.apikey_create(workspace=workspace, name="whole", scopes=["gateway"])
    _, limited = registry_services.apikey_create(workspace=workspace, name="agents", scopes=["gateway"], agents=[agent])
    _, ingest = registry_services.apikey_create(workspace=workspace, name="ingest", scopes=["ingest"])

    def client(raw: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=raw, max_retries=0)

    return client(whole), client(limited), client(ingest)


def test_the_openai_client_retrieves_an_agent_and_a_target_the_key_may_call(keys):
    whole, limited, ingest = keys

    agent = whole.models.retrieve("agent/ride-support")
    assert (agent.id, agent.object, agent.owned_by) == ("agent/ride-support", "model", "keel:agent")
    target = whole.models.retrieve("fast")
    assert (target.id, target.owned_by) == ("fast", "keel:target:fake-gateway/fast")
    assert limited.models.retrieve("agent/ride-support").id == "agent/ride-support"

    with pytest.raises(openai.NotFoundError) as unknown:
        whole.models.retrieve("agent/nobody")
    assert unknown.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):  # a key limited to agents may not call targets
        limited.models.retrieve("fast")
    with pytest.raises(openai.PermissionDeniedError):
        ingest.models.retrieve("fast")
    with pytest.raises(openai.PermissionDeniedError):
        ingest.models.list()
