"""A workspace's own model prices, set, changed and read back through the API, against the spans they price."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from opentelemetry.trace import Tracer

from tracing import pricing
from tracing.models import Span, Trajectory

pytestmark = pytest.mark.django_db


def _chat(tracer: Tracer, name: str, model: str, **extra: Any) -> None:
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": model,
        "gen_ai.usage.input_tokens": 1_000_000,
        "gen_ai.usage.output_tokens": 100_000,
    }
    attributes.update(extra)
    with tracer.start_as_current_span(name, attributes=attributes):
        pass


def _price(client, model: str, input_usd: str, output_usd: str) -> None:
    body = {"model": model, "input_usd_per_million": input_usd, "output_usd_per_million": output_usd}
    response = client.put("/api/v1/model-prices", body, content_type="application/json")
    assert response.status_code == 200, response.content


def _cost(name: str) -> Decimal | None:
    return Span.objects.get(name=name).cost_usd


def test_a_price_set_then_changed_prices_new_spans_and_leaves_stored_ones(
    otel, workspace, other_workspace, api_client_for
):
    client = api_client_for(workspace)
    _price(client, "my-finetune", "1", "2")
    _chat(otel.tracer(), "first", "my-finetune")
    otel.ingest(workspace)

    _price(client, "my-finetune", "3", "4")
    _chat(otel.tracer(), "second", "my-finetune")
    otel.ingest(workspace)
    _chat(otel.tracer(), "elsewhere", "my-finetune")
    otel.ingest(other_workspace)

    assert _cost("first") == Decimal("1.20000000")  # 1 M × $1 + 0.1 M × $2, as it was priced then
    assert _cost("second") == Decimal("3.40000000")
    assert _cost("elsewhere") is None  # another workspace's price is not this one's
    assert client.get("/api/v1/model-prices").json() == [
        {
            "model": "my-finetune",
            "input_usd_per_million": "3.000000",
            "output_usd_per_million": "4.000000",
            "cache_read_usd_per_million": None,
        }
    ]


def test_a_removed_price_leaves_new_spans_to_litellms_map_and_stored_ones_as_priced(
    otel, workspace, other_workspace, api_client_for
):
    client = api_client_for(workspace)
    _price(client, "openai/gpt-4o-mini", "100", "200")
    _price(api_client_for(other_workspace), "openai/gpt-4o-mini", "100", "200")
    _chat(otel.tracer(), "priced", "openai/gpt-4o-mini")
    otel.ingest(workspace)

    removed = client.delete("/api/v1/model-prices/openai/gpt-4o-mini")
    again = client.delete("/api/v1/model-prices/openai/gpt-4o-mini")
    _chat(otel.tracer(), "mapped", "openai/gpt-4o-mini")
    otel.ingest(workspace)

    assert removed.status_code == 204
    assert again.status_code == 404
    assert again.json()["code"] == "model_price_not_found"
    assert _cost("priced") == Decimal("120.00000000")
    mapped = pricing.generation_cost("openai/gpt-4o-mini", 1_000_000, 100_000)
    assert mapped is not None
    assert _cost("mapped") == mapped < Decimal(1)
    assert client.get("/api/v1/model-prices").json() == []
    # The other workspace's price of the same model is its own.
    assert len(api_client_for(other_workspace).get("/api/v1/model-prices").json()) == 1


def test_a_reported_cost_of_zero_gives_way_to_the_workspaces_price_and_any_other_reported_cost_stands(
    otel, workspace, api_client_for
):
    # An SDK that does not know a fine-tune reports its cost as 0; the workspace priced it for that reason.
    _price(api_client_for(workspace), "my-finetune", "1", "2")
    tracer = otel.tracer()
    _chat(tracer, "zero", "my-finetune", **{"gen_ai.usage.cost": 0.0})
    _chat(tracer, "reported", "my-finetune", **{"gen_ai.usage.cost": 0.5})
    _chat(tracer, "zero, not priced here", "gpt-4o", **{"gen_ai.usage.cost": 0.0})
    otel.ingest(workspace)

    assert _cost("zero") == Decimal("1.20000000")
    assert _cost("reported") == Decimal("0.50000000")
    assert _cost("zero, not priced here") == Decimal(0)


def test_a_late_span_of_a_stored_trace_is_priced_anew_and_its_stored_spans_keep_their_cost(
    otel, workspace, api_client_for
):
    client = api_client_for(workspace)
    tracer = otel.tracer()
    with tracer.start_as_current_span("invoke_agent", attributes={"gen_ai.operation.name": "invoke_agent"}):
        _chat(tracer, "before", "gpt-4o")
        otel.ingest(workspace)  # the call's span is exported before its agent's
        _price(client, "gpt-4o", "1", "2")
        _chat(tracer, "after", "gpt-4o")
    otel.ingest(workspace)

    assert _cost("before") == Decimal("3.50000000")  # litellm's $2.50 and $10 per million
    assert _cost("after") == Decimal("1.20000000")
    assert Trajectory.objects.get(workspace=workspace).cost_usd == Decimal("4.70000000")


def test_a_price_for_a_model_also_prices_its_dated_snapshots(otel, workspace, api_client_for):
    # OpenAI answers a request for gpt-4o with the snapshot that served it; spans carry that response model.
    _price(api_client_for(workspace), "gpt-4o", "1", "2")
    tracer = otel.tracer()
    _chat(tracer, "openai", "gpt-4o", **{"gen_ai.response.model": "gpt-4o-2024-08-06"})
    _chat(tracer, "prefixed", "openai/gpt-4o-2024-11-20")
    _chat(tracer, "other", "gpt-4o-mini-2024-07-18")  # another model: litellm's price
    otel.ingest(workspace)

    assert _cost("openai") == _cost("prefixed") == Decimal("1.20000000")
    assert _cost("other") == Decimal("0.21000000")  # 1 M × $0.15 + 0.1 M × $0.60


def test_a_price_for_the_snapshot_itself_wins_over_the_models():
    overrides = {
        "gpt-4o": pricing.ModelPrice.per_million(Decimal(1), Decimal(2)),
        "gpt-4o-2024-08-06": pricing.ModelPrice.per_million(Decimal(3), Decimal(4)),
    }

    assert pricing.price_find("gpt-4o-2024-08-06", overrides) == overrides["gpt-4o-2024-08-06"]
    assert pricing.price_find("gpt-4o-2024-11-20", overrides) == overrides["gpt-4o"]
    assert pricing.price_find("gpt-4o-20241120", overrides) == overrides["gpt-4o"]
    assert pricing.price_find("vertex_ai/gpt-4o@20241120", overrides) == overrides["gpt-4o"]
    assert pricing.price_find("gpt-4o-2024-11-20") == pricing.litellm_prices()["gpt-4o-2024-11-20"]
