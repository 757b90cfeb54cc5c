"""Costs as a finance-minded user checks them: OTLP spans of several models in, Keel's cost per span and per
trajectory out, against litellm's price map (the rates below are its entries, the arithmetic done by hand)."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from opentelemetry.trace import Tracer

from tracing.models import Span, Trajectory

pytestmark = pytest.mark.django_db


def _chat(tracer: Tracer, name: str, model: str, input_tokens: int, output_tokens: int, **extra: Any) -> None:
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": model,
        "gen_ai.usage.input_tokens": input_tokens,
        "gen_ai.usage.output_tokens": output_tokens,
    }
    attributes.update(extra)
    with tracer.start_as_current_span(name, attributes=attributes):
        pass


def _costs() -> dict[str, Decimal | None]:
    return {span.name: span.cost_usd for span in Span.objects.exclude(span_type="agent")}


def test_each_model_costs_what_litellm_prices_it_at(otel, workspace):
    tracer = otel.tracer()
    with tracer.start_as_current_span("invoke_agent", attributes={"gen_ai.operation.name": "invoke_agent"}):
        # gpt-4o: $2.50 / M input, $1.25 / M cached input, $10 / M output; input counts include cached ones.
        _chat(tracer, "gpt-4o", "gpt-4o", 1000, 100, **{"gen_ai.usage.cache_read.input_tokens": 400})
        # gpt-4o-mini: $0.15 / M, $0.075 / M cached, $0.60 / M.
        _chat(tracer, "mini", "gpt-4o-mini", 1000, 100, **{"gen_ai.usage.cache_read.input_tokens": 400})
        # claude-sonnet-4-5: $3 / M, $0.30 / M cache reads, $15 / M.
        _chat(tracer, "sonnet", "claude-sonnet-4-5", 1000, 100, **{"gen_ai.usage.cache_read.input_tokens": 400})
        _chat(tracer, "prefixed", "openai/gpt-4o", 1000, 100)
        _chat(tracer, "snapshot", "gpt-4o-2024-08-06", 1000, 100)
        # o3-mini: $1.10 / M, $4.40 / M; reasoning tokens are part of the output tokens and priced as output.
        _chat(tracer, "reasoning", "o3-mini", 1000, 500, **{"gen_ai.usage.reasoning.output_tokens": 300})
        _chat(tracer, "unknown", "my-finetune-v3", 1000, 100)
    otel.ingest(workspace)

    assert _costs() == {
        "gpt-4o": Decimal("0.00300000"),  # 600 × 2.5e-6 + 400 × 1.25e-6 + 100 × 1e-5
        "mini": Decimal("0.00018000"),  # 600 × 1.5e-7 + 400 × 7.5e-8 + 100 × 6e-7
        "sonnet": Decimal("0.00342000"),  # 600 × 3e-6 + 400 × 3e-7 + 100 × 1.5e-5
        "prefixed": Decimal("0.00350000"),  # 1000 × 2.5e-6 + 100 × 1e-5
        "snapshot": Decimal("0.00350000"),
        "reasoning": Decimal("0.00330000"),  # 1000 × 1.1e-6 + 500 × 4.4e-6
        "unknown": None,
    }
    trajectory = Trajectory.objects.get(workspace=workspace)
    assert trajectory.cost_usd == Decimal("0.01690000")
    assert (trajectory.input_tokens, trajectory.output_tokens) == (7000, 1100)


def test_a_long_prompt_costs_the_long_context_price(otel, workspace):
    # gemini-2.5-pro: $1.25 / M input, $0.125 / M cached, $10 / M output up to 200k input tokens; past them
    # the whole call is $2.50 / M, $0.25 / M cached and $15 / M (litellm's `_above_200k_tokens` entries).
    tracer = otel.tracer()
    with tracer.start_as_current_span("invoke_agent", attributes={"gen_ai.operation.name": "invoke_agent"}):
        _chat(tracer, "short", "gemini-2.5-pro", 200_000, 1000)
        _chat(tracer, "long", "gemini-2.5-pro", 300_000, 2000, **{"gen_ai.usage.cache_read.input_tokens": 100_000})
    otel.ingest(workspace)

    assert _costs() == {
        "short": Decimal("0.26000000"),  # 200,000 × 1.25e-6 + 1,000 × 1e-5
        "long": Decimal("0.55500000"),  # 200,000 × 2.5e-6 + 100,000 × 2.5e-7 + 2,000 × 1.5e-5
    }
    assert Trajectory.objects.get(workspace=workspace).cost_usd == Decimal("0.81500000")


def test_a_cost_the_span_reports_wins_and_an_agent_that_sums_its_calls_is_not_counted_twice(
    otel, workspace, api_client_for
):
    tracer = otel.tracer()
    with tracer.start_as_current_span(
        "invoke_agent",
        attributes={
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.conversation.id": "s-1",
            # The agent reports the sum of its calls: tokens and cost.
            "gen_ai.usage.input_tokens": 4000,
            "gen_ai.usage.output_tokens": 400,
            "gen_ai.usage.cost": 1.2535,
        },
    ):
        _chat(tracer, "otel", "gpt-4o", 1000, 100, **{"gen_ai.usage.cost": 0.5})
        _chat(tracer, "openinference", "gpt-4o", 1000, 100, **{"llm.cost.total": 0.25})
        _chat(
            tracer,
            "langfuse",
            "gpt-4o",
            1000,
            100,
            **{"langfuse.observation.cost_details": json.dumps({"input": 0.3, "output": 0.2})},
        )
        _chat(tracer, "computed", "gpt-4o", 1000, 100)
    otel.ingest(workspace)

    assert _costs() == {
        "otel": Decimal("0.50000000"),
        "openinference": Decimal("0.25000000"),
        "langfuse": Decimal("0.50000000"),
        "computed": Decimal("0.00350000"),
    }
    trajectory = Trajectory.objects.get(workspace=workspace)
    assert (trajectory.input_tokens, trajectory.output_tokens, trajectory.cost_usd) == (
        4000,
        400,
        Decimal("1.25350000"),
    )
    client = api_client_for(workspace, scopes=["read"])
    (listed,) = client.get("/api/v1/trajectories").json()["items"]
    detail = client.get(f"/api/v1/trajectories/{trajectory.trace_id}").json()
    (in_session,) = client.get("/api/v1/sessions/s-1").json()["trajectories"]
    assert listed["cost"] == detail["cost"] == in_session["cost"] == "1.25350000"
    assert listed["tokens"] == detail["tokens"] == in_session["tokens"] == {"input": 4000, "output": 400, "total": 4400}
