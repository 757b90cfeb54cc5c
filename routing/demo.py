"""The demo workspace's gateway traffic, produced by the gateway itself.

Model targets on the demo's fake provider (routing/demo_provider.py: `keel-demo/...`, no model server
needed) with prices for them (one named for the model tracing.demo's recorded ride agent asks for, so that
replays resume it offline), the ride-support router (a rule, intents for its requirements' escalation
rules, a two-step chain, every request shadowed and judged by a judge target, the semantic cache) and the
shopping assistant's (single call, cache). Then requests go through `routing.gateway.chat_completion`
exactly as an app's would. After the first wave, the trajectories are assembled and their outcomes
scored, so that the second wave's similar requests are routed by the learned estimate. A third wave is
served with the cache off and the speculative single call on, then the router is set back. Shadow runs are
executed, one cache hit is reviewed, and one hand-off is resolved. The ride-support agent's requirements
do not enable the agentic tier, so the demo has no tool loop (the tests run one). Idempotent: a
workspace whose ride-support agent already has routing decisions is left alone.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from agent_registry import selectors as registry_selectors
from agent_registry.models import ApiKey, Workspace
from agent_registry.services import apikey_create
from routing import cache, gateway, services, shadow
from routing.chat import ChatCompletionRequest
from routing.models import CacheHit, Handoff, ModelTarget, RoutingDecision, ShadowRun, ShadowStatus
from tracing import demo as tracing_demo
from tracing import services as tracing_services
from tracing.models import BatchStatus, IngestBatch

COMPANY = {"company": "Acme Rides"}
STORE = {"store": "Acme Outfitters"}
RIDE_WAVE = (
    "Where can I download the receipt for my trip yesterday?",
    "How do I change the payment card on my account?",
    "Can I book a ride for someone else?",
    "What does the airport surcharge cover?",
    "Compare the fare of my airport trip with the quote I got in the app",
    "Compare my last two trips to the office, why was one more expensive?",
    "I was charged twice for trip T4417, please refund the duplicate",
    "Refund the cancellation fee on trip T2210, the driver never arrived",
    "The driver was unsafe and drove through red lights",
    "I was charged $240 for a 10 minute ride, I dispute this",
    "Where can I download the receipt for my trip last week?",
    "How do I reset my password?",
)
RIDE_SECOND_WAVE = (
    "Compare the fare of my airport trip with the price shown before booking",
    "Where do I find the receipt for yesterday's trip?",
    "How do I change the card I pay with?",
    "Compare my two trips to the office, one cost more",
    "How do I reset my password?",
    "How can I reset my password?",
    "My driver took a detour, compare the route with the usual one",
    "Can I book a ride for my mother?",
)
# Served with the speculative single call and the cache off: simple requests that no rule decides and that
# look like single-call requests, so each starts the single call before the learned estimate decides. On the
# demo's judged outcomes the estimate sends them to the chain, so each pays for a single call it does not
# use: the setting's cost, on their trajectories (the benchmark measures what it saves).
RIDE_THIRD_WAVE = (
    "Where can I get the receipt for this morning's trip?",
    "How do I update the card on my account?",
    "My airport fare was higher than the quote in the app, why?",
    "Can I book a ride for a friend?",
)
SHOPPING_WAVE = (
    "Waterproof hiking boots under $150",
    "A warm sleeping bag for winter camping",
    "Waterproof hiking boots under $150",
    "A lightweight tent for two people",
    "Waterproof hiking boots under 150 dollars",
)


def _target(workspace: Workspace, alias: str, model: str, tier: str) -> ModelTarget:
    existing = ModelTarget.objects.filter(workspace=workspace, alias=alias).first()
    if existing is not None:
        return existing
    return services.model_target_create(workspace=workspace, alias=alias, model=model, tier=tier, max_retries=1)


def _gateway_key(workspace: Workspace) -> ApiKey:
    owner = registry_selectors.workspace_owner(workspace=workspace)
    key, _ = apikey_create(workspace=workspace, name="demo gateway client", scopes=["gateway"], created_by=owner)
    return key


def _ask(key: ApiKey, model: str, text: str, variables: dict[str, Any], conversation: str) -> None:
    request = ChatCompletionRequest.model_validate(
        {"model": model, "messages": [{"role": "user", "content": text}], "variables": variables}
    )
    gateway.chat_completion(api_key=key, request=request, conversation_id=conversation)


def _settle(workspace: Workspace) -> None:
    """What the worker and beat would do next: store the spans, run shadows, score outcomes."""
    for batch_id in IngestBatch.objects.filter(workspace=workspace, status=BatchStatus.PENDING).values_list(
        "pk", flat=True
    ):
        tracing_services.span_batch_process(batch_id=batch_id)
    for run_id in ShadowRun.objects.filter(decision__workspace=workspace, status=ShadowStatus.PENDING).values_list(
        "pk", flat=True
    ):
        shadow.shadow_run_execute(shadow_run_id=run_id)
    for batch_id in IngestBatch.objects.filter(workspace=workspace, status=BatchStatus.PENDING).values_list(
        "pk", flat=True
    ):
        tracing_services.span_batch_process(batch_id=batch_id)
    shadow.routing_decision_outcomes_refresh(delay_seconds=0)


def demo_routing_seed(workspace: Workspace) -> int:
    """Seed the demo's gateway traffic unless it is there; returns how many requests were sent."""
    ride = registry_selectors.agent_get(workspace=workspace, slug="ride-support")
    shopping = registry_selectors.agent_get(workspace=workspace, slug="shopping-assistant")
    if RoutingDecision.objects.filter(agent=ride).exists():
        return 0
    # The demo models' prices, as an operator sets them for models litellm's price map does not know.
    for model, input_price, output_price in (
        ("keel-demo/fast", "0.15", "0.60"),
        ("keel-demo/strong", "2.50", "10.00"),
        ("keel-demo/judge", "0.50", "1.50"),
        (f"keel-demo/{tracing_demo.RIDE.model}", "2.50", "10.00"),  # gpt-4o's list price
    ):
        tracing_services.model_price_set(
            workspace=workspace,
            model=model,
            input_usd_per_million=Decimal(input_price),
            output_usd_per_million=Decimal(output_price),
        )
    fast = _target(workspace, "demo-fast", "keel-demo/fast", "single_call")
    strong = _target(workspace, "demo-strong", "keel-demo/strong", "agentic")
    judge = _target(workspace, "demo-judge", "keel-demo/judge", "")
    # The model the demo's recorded ride-support agent asks for (tracing.demo), served on the demo provider:
    # replays call a recorded model through the target of that name, so the demo's replay that resumes the
    # agent on its own model, and a user's replay of a recording with no model named, run offline too.
    recorded = tracing_demo.RIDE.model
    _target(workspace, recorded, f"keel-demo/{recorded}", "")
    services.router_config_update(
        agent=ride,
        single_call_target=fast,
        agentic_target=strong,
        judge_target=judge,
        rules=[
            {
                "name": "multi-step comparison",
                "kind": "pattern",
                "value": r"\bcompare\b",
                "to_tier": "chain",
                "reason": "comparisons need the trip looked up, then the fares matched",
            }
        ],
        intents={
            "fare_dispute": ["charged twice", "overcharged", "refund the duplicate", "dispute"],
            "cancellation": ["cancellation fee", "never arrived", "cancelled"],
        },
        shadow_rate=1.0,  # every demo request is shadowed: a full router report, and no chance in the demo
        min_neighbours=6,
        cache_enabled=True,
    )
    services.chain_steps_set(
        agent=ride,
        steps=[
            {
                "name": "classify",
                "instructions": "Classify the rider's request. Answer JSON with the output schema {intent, summary}.",
                "output_schema": {
                    "type": "object",
                    "required": ["intent", "summary"],
                    "properties": {"intent": {"type": "string"}, "summary": {"type": "string"}},
                },
            },
            {
                "name": "answer",
                "instructions": "Answer the rider using the classification.",
                "model_target": "demo-strong",
            },
        ],
    )
    services.router_config_update(agent=shopping, single_call_target=fast, cache_enabled=True, cache_threshold=0.9)
    key = _gateway_key(workspace)

    requests = [("agent/ride-support", text, COMPANY) for text in RIDE_WAVE]
    requests += [("agent/shopping-assistant", text, STORE) for text in SHOPPING_WAVE]
    for index, (model, text, variables) in enumerate(requests):
        _ask(key, model, text, variables, conversation=f"demo-{index}")
    _settle(workspace)
    # The second wave: similar requests, now with outcomes to learn from.
    for index, text in enumerate(RIDE_SECOND_WAVE):
        _ask(key, "agent/ride-support", text, COMPANY, conversation=f"demo-b{index}")
    _settle(workspace)
    # The third wave: the single call starts while the learned router decides (routing/speculation.py); then
    # the router is set back as it was.
    services.router_config_update(agent=ride, cache_enabled=False, speculative_single_call=True)
    for index, text in enumerate(RIDE_THIRD_WAVE):
        _ask(key, "agent/ride-support", text, COMPANY, conversation=f"demo-c{index}")
    services.router_config_update(agent=ride, cache_enabled=True, speculative_single_call=False)
    _settle(workspace)

    owner = registry_selectors.workspace_owner(workspace=workspace)
    hit = CacheHit.objects.filter(agent=shopping).order_by("similarity").first()
    if hit is not None and owner is not None:
        cache.cache_hit_review(hit=hit, false_hit=hit.similarity < 0.99, reviewed_by=owner)
    handoff = Handoff.objects.filter(agent=ride).order_by("created_at").first()
    if handoff is not None:
        services.handoff_resolve(
            handoff=handoff, user=owner, resolution="Called the rider; safety team opened a case on the driver."
        )
    return len(requests) + len(RIDE_SECOND_WAVE) + len(RIDE_THIRD_WAVE)
