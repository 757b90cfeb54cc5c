from decimal import Decimal

from tracing import pricing


def test_litellm_prices_are_read_from_its_data_file():
    price = pricing.price_find("gpt-4o")

    assert price is not None
    assert (price.input, price.output) == (Decimal("0.0000025"), Decimal("0.00001"))


def test_a_provider_prefix_finds_the_plain_model_name():
    assert pricing.price_find("openai/gpt-4o") == pricing.price_find("gpt-4o")


def test_cost_counts_input_output_and_cached_tokens_at_their_prices():
    # gpt-4o: $2.50 / M input, $10 / M output, $1.25 / M cached input.
    cost = pricing.generation_cost("gpt-4o", input_tokens=1000, output_tokens=100, cache_read_tokens=400)

    assert cost == Decimal("0.00300000")  # 600 × 2.5e-6 + 400 × 1.25e-6 + 100 × 1e-5


def test_cache_writes_are_charged_at_their_rate_and_an_unknown_write_rate_charges_them_as_input():
    # claude-sonnet-4-5: $3 / M input, $15 / M output, $0.30 / M cache read, $3.75 / M cache write.
    cost = pricing.generation_cost(
        "anthropic/claude-sonnet-4-5", 2960, 30, cache_read_tokens=900, cache_write_tokens=2048
    )
    override = {"claude-sonnet-4-5": pricing.ModelPrice.per_million(Decimal(3), Decimal(15), Decimal("0.3"))}
    as_input = pricing.generation_cost(
        "claude-sonnet-4-5", 2960, 30, cache_read_tokens=900, overrides=override, cache_write_tokens=2048
    )

    assert cost == Decimal("0.00843600")  # 12 × 3e-6 + 900 × 3e-7 + 2048 × 3.75e-6 + 30 × 1.5e-5
    assert as_input == Decimal("0.00690000")  # the 2048 written at $3 / M: the workspace's price has no write rate


def test_a_workspace_override_wins_over_litellm():
    overrides = {"gpt-4o": pricing.ModelPrice.per_million(Decimal(1), Decimal(2))}

    assert pricing.generation_cost("gpt-4o", 1_000_000, 1_000_000, overrides=overrides) == Decimal("3.00000000")
    assert pricing.generation_cost("openai/gpt-4o", 1_000_000, 0, overrides=overrides) == Decimal("1.00000000")


def test_unknown_models_and_missing_usage_have_no_cost():
    assert pricing.generation_cost("my-finetune-v3", 100, 10) is None
    assert pricing.generation_cost("gpt-4o", None, None) is None
    assert pricing.generation_cost(None, 100, 10) is None
