"""The router, a pure function: rules of each kind, continuation, single-level mode, the learned estimate
(escalating only when the gain pays), cold start, the human floor, odd messages and outcome quality."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from routing.router import (
    HUMAN_QUALITY_FLOOR,
    MAX_TEXT_CHARS,
    WEIGHT_MAX,
    Decision,
    Neighbour,
    Policy,
    Request,
    Rule,
    TierEstimate,
    TierProfile,
    default_profiles,
    outcome_quality,
    parse_amounts,
    request_features,
    request_text,
    route,
    rule_errors,
)

ALL_TIERS = ("single_call", "chain", "agentic", "human")
# Round numbers, so the penalties are easy to follow: with a $0.10 ceiling, a 10 s budget and weights
# 0.3 / 0.2 / 0.1, a single call costs 0.03 + 0.02 + 0.01 = 0.06 of utility and a chain 0.195.
PROFILES = {
    "single_call": TierProfile("single_call", cost_usd=0.01, latency_ms=1000.0, risk=0.1),
    "chain": TierProfile("chain", cost_usd=0.04, latency_ms=3000.0, risk=0.15),
    "agentic": TierProfile("agentic", cost_usd=0.3, latency_ms=20000.0, risk=0.3),
    "human": TierProfile("human", cost_usd=4.0, latency_ms=3_600_000.0, risk=0.02),
}


def make_policy(**overrides: Any) -> Policy:
    values: dict[str, Any] = {
        "mode": "adaptive",
        "tiers": ("single_call", "chain", "human"),
        "default_tier": "single_call",
        "signal": "learned_difficulty",
        "rules": (),
        "intents": {},
        "profiles": PROFILES,
        "cost_weight": 0.3,
        "latency_weight": 0.2,
        "risk_weight": 0.1,
        "neighbours": 20,
        "min_neighbours": 8,
        "cost_ceiling_usd": 0.1,
        "latency_budget_ms": 10000.0,
    }
    values.update(overrides)
    return Policy(**values)


def ask(*texts: str, **request: Any) -> Request:
    return Request(messages=[{"role": "user", "content": text} for text in texts], **request)


def neighbours(tier: str, quality: float, count: int = 5, **fields: Any) -> list[Neighbour]:
    values: dict[str, Any] = {"similarity": 1.0, "tier": tier, "quality": quality, "cost_usd": None, "latency_ms": None}
    values.update(fields)
    return [Neighbour(**values) for _ in range(count)]


def rule(kind: str, value: str, to_tier: str = "human", **fields: str) -> Rule:
    return Rule(name=f"{kind}-rule", kind=kind, value=value, to_tier=to_tier, **fields)


def route_with_rule(text: str, kind: str, value: str) -> Decision:
    policy = make_policy(signal="rules", rules=(rule(kind, value),), intents={"billing": ("invoice", "charged")})
    return route(ask(text), policy, [])


# --- Rules -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "matched"),
    [
        ("I want to CANCEL my order", True),
        ("Please cancel.", True),
        ("The cancellation policy?", False),  # whole words only
        ("Give me a refund now", True),
        ("refunds are slow", False),
        ("hello", False),
    ],
)
def test_keywords_rule_matches_whole_terms_in_any_case(text: str, matched: bool) -> None:
    decision = route_with_rule(text, "keywords", "cancel, refund")

    assert (decision.tier, decision.method) == (("human", "rule") if matched else ("single_call", "default"))


def test_keywords_rule_records_the_terms_it_found_and_says_them_in_the_reason() -> None:
    decision = route_with_rule("Cancel it, and I want a REFUND", "keywords", "cancel, refund, c++")

    assert decision.rule == "keywords-rule"
    assert decision.features["keywords"] == {"keywords-rule": ["cancel", "refund"]}
    assert decision.reason == 'rule \'keywords-rule\': the request mentions "cancel", "refund", so human'


def test_keywords_rule_matches_a_term_with_punctuation() -> None:
    assert route_with_rule("Is c++ supported?", "keywords", "c++").tier == "human"


def test_pattern_rule_matches_a_regular_expression_in_any_case() -> None:
    decision = route_with_rule("My order ORD-12345 never came", "pattern", r"ord-\d{5}")

    assert (decision.tier, decision.method) == ("human", "rule")
    assert decision.reason == "rule 'pattern-rule': the request matches /ord-\\d{5}/ ('ORD-12345'), so human"


def test_an_invalid_pattern_never_matches_and_is_reported() -> None:
    decision = route_with_rule("anything ([", "pattern", "([")

    assert (decision.tier, decision.method) == ("single_call", "default")
    assert decision.features["rules"] == {"pattern-rule": "invalid"}
    assert rule_errors([rule("pattern", "([")]) == [
        "rule 'pattern-rule': invalid regular expression: unterminated character set at position 2"
    ]


def test_a_pattern_that_backtracks_without_end_is_stopped_and_recorded_as_timed_out() -> None:
    # (a|aa)+$ on 60 a's and a "b": the re module takes 0.4 s on 28 a's, and 1.6 times longer for each more.
    decision = route_with_rule("a" * 60 + "b", "pattern", r"(a|aa)+$")

    assert (decision.tier, decision.method) == ("single_call", "default")
    assert decision.features["rules"] == {"pattern-rule": "timed_out"}


def test_rule_errors_names_each_problem() -> None:
    rules = [
        rule("pattern", "ok|fine"),
        rule("telepathy", "x"),
        rule("amount_over", "lots"),
        rule("low_confidence", "0.5"),
        rule("stakes", "vibes"),
        rule("signal", "boredom"),
        rule("keywords", " , "),
        Rule(name="to-nowhere", kind="keywords", value="x", to_tier="gold"),
    ]

    assert rule_errors(rules) == [
        "rule 'telepathy-rule': unknown kind 'telepathy'",
        "rule 'amount_over-rule': amount_over needs a number, not 'lots'",
        "rule 'stakes-rule': unknown stakes category 'vibes' (one of safety, legal, money)",
        "rule 'signal-rule': unknown signal 'boredom' (one of misalignment, disengagement)",
        "rule 'keywords-rule': no keywords given",
        "rule 'to-nowhere': unknown tier 'gold'",
    ]


def test_intent_rule_matches_the_label_whose_phrases_match_most() -> None:
    decision = route_with_rule("I was charged twice on my invoice", "intent", "billing")

    assert decision.features["intent"] == "billing"
    assert decision.reason == "rule 'intent-rule': the request's intent is 'billing', so human"


def test_intent_is_none_without_a_matching_phrase() -> None:
    decision = route_with_rule("Where is my parcel?", "intent", "billing")

    assert decision.features["intent"] is None
    assert decision.tier == "single_call"


def test_intent_takes_the_label_with_more_matching_phrases() -> None:
    intents = {"shipping": ("parcel",), "billing": ("invoice", "charged", "parcel")}
    features = request_features(ask("The parcel invoice: I was charged"), make_policy(intents=intents))

    assert features["intent"] == "billing"


@pytest.mark.parametrize(
    ("text", "amounts"),
    [
        ("It was $25", [25.0]),
        ("about 25 dollars", [25.0]),
        ("USD 1,200.50 taken", [1200.5]),
        ("€30 and 30 eur and 30€", [30.0, 30.0, 30.0]),
        ("£12.99 or 5 bucks", [12.99, 5.0]),
        ("$5k deposit", [5000.0]),
        ("usd40", [40.0]),
        ("3 items, order 12345, 2024", []),
        ("", []),
    ],
)
def test_money_amounts_are_parsed(text: str, amounts: list[float]) -> None:
    assert parse_amounts(text) == amounts


@pytest.mark.parametrize(("text", "matched"), [("refund $150 please", True), ("refund $100", False), ("150", False)])
def test_amount_over_rule_compares_the_largest_amount(text: str, matched: bool) -> None:
    decision = route_with_rule(text, "amount_over", "100")

    assert decision.tier == ("human" if matched else "single_call")


def test_amount_over_reason_gives_the_amount_and_the_limit() -> None:
    policy = make_policy(signal="rules", rules=(rule("amount_over", "100", reason="large refunds need a person"),))

    decision = route(ask("I paid USD 1,200.50 twice"), policy, [])

    assert decision.reason == (
        "rule 'amount_over-rule': an amount of 1,200.50 is over 100.00, so human (large refunds need a person)"
    )
    assert decision.features["amounts"] == [1200.5]
    assert decision.features["max_amount"] == 1200.5


@pytest.mark.parametrize(
    ("text", "category"),
    [
        ("My driver made me feel unsafe", "safety"),
        ("I was injured in an accident", "safety"),
        ("I'll call my lawyer", "legal"),
        ("I will sue you", "legal"),
        ("I want a chargeback", "money"),
        ("This is fraud", "money"),
    ],
)
def test_stakes_rule_matches_its_category(text: str, category: str) -> None:
    decision = route_with_rule(text, "stakes", category)

    assert (decision.tier, decision.method) == ("human", "rule")
    assert category in decision.features["stakes"]


def test_stakes_rule_does_not_match_another_category() -> None:
    decision = route_with_rule("I want a refund", "stakes", "safety")

    assert decision.features["stakes"] == ["money"]
    assert decision.tier == "single_call"


def test_disengagement_signal_rule_matches_a_request_for_a_person() -> None:
    decision = route_with_rule("This is useless. Let me talk to a human!", "signal", "disengagement")

    assert (decision.tier, decision.method) == ("human", "rule")
    assert decision.features["signal_evidence"] == {"disengagement": ["this is useless", "talk to a human"]}


def test_misalignment_signal_needs_an_earlier_turn_to_correct() -> None:
    policy = make_policy(signal="rules", rules=(rule("signal", "misalignment", to_tier="chain"),))

    first = route(ask("That's not what I asked"), policy, [])
    later = route(ask("Change my address", "That's not what I asked"), policy, [])

    assert first.tier == "single_call"
    assert (later.tier, later.method) == ("chain", "rule")
    assert later.features["signal_evidence"] == {"misalignment": ["that's not what i asked"]}


def test_a_repeated_request_is_misalignment() -> None:
    features = request_features(
        ask("How do I change my delivery address", "ok", "how do I change my delivery address?"), make_policy()
    )

    assert features["signal_evidence"] == {"misalignment": ["repeated request"]}


def test_low_confidence_rule_is_not_applicable_before_a_tier_ran() -> None:
    decision = route_with_rule("anything", "low_confidence", "0.5")

    assert decision.features["rules"] == {"low_confidence-rule": "not_applicable"}
    assert decision.tier == "single_call"


def test_the_first_matching_rule_wins_and_rules_to_disabled_tiers_are_skipped() -> None:
    rules = (
        Rule(name="to-agentic", kind="keywords", value="refund", to_tier="agentic"),
        Rule(name="to-chain", kind="keywords", value="refund", to_tier="chain"),
        Rule(name="to-human", kind="keywords", value="refund", to_tier="human"),
    )

    decision = route(ask("refund"), make_policy(rules=rules), [])

    assert (decision.tier, decision.rule) == ("chain", "to-chain")
    assert decision.features["rules"] == {"to-agentic": "tier_disabled", "to-chain": "matched", "to-human": "matched"}


def test_a_request_that_brings_tools_goes_past_a_chain_to_a_tier_that_offers_them() -> None:
    to_chain = (Rule(name="to-chain", kind="keywords", value="refund", to_tier="chain"),)

    with_agentic = route(ask("refund", offers_tools=True), make_policy(rules=to_chain, tiers=ALL_TIERS), [])
    without = route(ask("refund", offers_tools=True), make_policy(rules=to_chain), [])
    no_tools = route(ask("refund"), make_policy(rules=to_chain, tiers=ALL_TIERS), [])
    only_chain = route(ask("refund", offers_tools=True), make_policy(rules=to_chain, tiers=("chain", "human")), [])

    assert (with_agentic.tier, with_agentic.rule) == ("agentic", "to-chain")
    assert with_agentic.reason.endswith("; the request brings its own tools, which a chain cannot offer, so agentic")
    assert without.tier == "single_call"
    assert no_tools.tier == only_chain.tier == "chain"


# --- Modes and continuation --------------------------------------------------------------------


def test_single_level_mode_sends_everything_to_the_default_tier() -> None:
    policy = make_policy(mode="single_level", default_tier="chain", rules=(rule("keywords", "refund"),))

    decision = route(ask("refund", conversation_tier="human"), policy, neighbours("human", 1.0, 10))

    assert (decision.tier, decision.method, decision.rule) == ("chain", "single_level", "")
    assert decision.reason == "single-level routing: every request goes to chain"


def test_a_conversation_continues_on_its_tier() -> None:
    decision = route(ask("and my other order?", conversation_tier="chain"), make_policy(), neighbours("chain", 0.1, 10))

    assert (decision.tier, decision.method) == ("chain", "continuation")
    assert decision.reason == "continues the conversation on chain, the tier of its earlier turns"


def test_a_conversation_on_a_disabled_tier_is_routed_afresh() -> None:
    decision = route(ask("hello", conversation_tier="agentic"), make_policy(signal="rules"), [])

    assert (decision.tier, decision.method) == ("single_call", "default")


def test_a_rule_to_a_dearer_tier_escalates_a_conversation() -> None:
    policy = make_policy(rules=(rule("signal", "disengagement"),))

    decision = route(ask("where is it", "forget it, get me a real person", conversation_tier="chain"), policy, [])

    assert (decision.tier, decision.method) == ("human", "rule")


def test_a_rule_to_a_cheaper_tier_does_not_move_a_conversation() -> None:
    policy = make_policy(rules=(rule("keywords", "hello", to_tier="single_call"),))

    decision = route(ask("hello", conversation_tier="chain"), policy, [])

    assert (decision.tier, decision.method) == ("chain", "continuation")


# --- The learned estimate ----------------------------------------------------------------------


def test_estimate_escalates_when_the_quality_gain_outweighs_the_added_cost() -> None:
    similar = neighbours("single_call", 0.5) + neighbours("chain", 0.9)

    decision = route(ask("Where is my parcel"), make_policy(), similar)

    assert (decision.tier, decision.method) == ("chain", "estimate")
    assert decision.reason == (
        "chain: expected quality 0.84 vs 0.56 for single_call from 10 similar requests; "
        "the gain 0.29 outweighs the added cost, latency and risk (0.13)"
    )
    # Pooled prior 0.7 (0.7012 for a chain at difficulty 0.008), counted as two neighbours.
    assert decision.estimates["single_call"].quality == pytest.approx(3.9 / 7)
    assert decision.estimates["chain"].quality == pytest.approx((2 * 0.7012 + 4.5) / 7)
    assert decision.estimates["single_call"].utility == pytest.approx(3.9 / 7 - 0.06)
    assert decision.estimates["chain"].utility == pytest.approx((2 * 0.7012 + 4.5) / 7 - 0.195)
    assert decision.estimates["chain"].support == 5.0
    assert decision.features["neighbours_known"] == 10


def test_estimate_stays_cheap_when_the_gain_does_not_pay() -> None:
    similar = neighbours("single_call", 0.5) + neighbours("chain", 0.65)

    decision = route(ask("Where is my parcel"), make_policy(), similar)

    assert (decision.tier, decision.method) == ("single_call", "estimate")
    assert decision.reason == (
        "single_call: expected quality 0.52 from 10 similar requests; chain would gain 0.11, "
        "not more than its added cost, latency and risk (0.14)"
    )


def test_estimate_stays_cheap_when_a_dearer_tier_would_do_worse() -> None:
    similar = neighbours("single_call", 0.9) + neighbours("chain", 0.6)

    decision = route(ask("Where is my parcel"), make_policy(), similar)

    assert decision.tier == "single_call"
    assert decision.reason == (
        "single_call: expected quality 0.86 from 10 similar requests; chain would not do better (0.64)"
    )


def test_estimate_escalates_past_a_tier_that_does_not_pay_to_one_that_does() -> None:
    policy = make_policy(tiers=("single_call", "chain", "agentic"), cost_weight=0.1, latency_weight=0.0)
    similar = neighbours("single_call", 0.3) + neighbours("chain", 0.35) + neighbours("agentic", 0.95)

    decision = route(ask("Where is my parcel"), policy, similar)

    assert decision.tier == "agentic"


def test_neighbour_costs_refine_the_tier_profile() -> None:
    similar = neighbours("single_call", 0.5) + neighbours("chain", 0.9, cost_usd=0.004, latency_ms=1000.0)

    decision = route(ask("Where is my parcel"), make_policy(), similar)

    assert decision.estimates["chain"].cost_usd == pytest.approx((2 * 0.04 + 5 * 0.004) / 7)
    assert decision.estimates["chain"].latency_ms == pytest.approx((2 * 3000 + 5 * 1000) / 7)
    assert decision.estimates["single_call"].cost_usd == 0.01


def test_only_the_nearest_neighbours_count() -> None:
    similar = neighbours("chain", 0.9, 8, similarity=0.95) + neighbours("single_call", 0.1, 12, similarity=0.5)

    decision = route(ask("Where is my parcel"), make_policy(neighbours=8, min_neighbours=8), similar)

    assert decision.features["neighbours_known"] == 8
    assert decision.estimates["single_call"].support == 0.0


def test_neighbours_without_quality_do_not_count() -> None:
    similar = neighbours("single_call", 0.5, 4) + [Neighbour(0.9, "chain", None, 0.01, 100.0)] * 10

    decision = route(ask("Where is my parcel"), make_policy(), similar)

    assert (decision.method, decision.features["neighbours_known"]) == ("cold_start", 4)


@pytest.mark.parametrize("signal", ["classifier", "confidence"])
def test_other_learned_signals_use_the_estimate(signal: str) -> None:
    similar = neighbours("single_call", 0.5) + neighbours("chain", 0.9)

    assert route(ask("Where is my parcel"), make_policy(signal=signal), similar).method == "estimate"


def test_a_person_takes_it_when_every_automated_tier_is_below_the_floor() -> None:
    similar = neighbours("single_call", 0.1) + neighbours("chain", 0.1)

    decision = route(ask("Where is my parcel"), make_policy(), similar)

    assert (decision.tier, decision.method) == ("human", "estimate")
    assert decision.reason == (
        f"human: every automated tier's expected quality is below {HUMAN_QUALITY_FLOOR:.2f} "
        "(best chain 0.10) from 10 similar requests, so a person takes it"
    )


def test_the_estimate_never_picks_a_person_above_the_floor_even_if_people_do_better() -> None:
    similar = neighbours("single_call", 0.4) + neighbours("human", 1.0)

    decision = route(ask("Where is my parcel"), make_policy(), similar)

    assert decision.tier != "human"


def test_without_the_human_tier_a_low_estimate_stays_automated() -> None:
    similar = neighbours("single_call", 0.1) + neighbours("chain", 0.1)

    decision = route(ask("Where is my parcel"), make_policy(tiers=("single_call", "chain")), similar)

    assert decision.tier == "single_call"


def test_estimates_serialise_to_json() -> None:
    decision = route(
        ask("Where is my parcel"), make_policy(), neighbours("single_call", 0.5) + neighbours("chain", 0.9)
    )

    estimates = decision.estimates_json()

    assert list(estimates) == ["single_call", "chain", "human"]
    assert estimates["single_call"] == {
        "quality": 0.5571,
        "support": 5.0,
        "cost_usd": 0.01,
        "latency_ms": 1000.0,
        "risk": 0.1,
        "utility": 0.4971,
    }
    json.dumps(estimates, allow_nan=False)


# --- Cold start and default --------------------------------------------------------------------

HARD = "Compare the three plans for each of my accounts and then calculate which is cheaper across the year?"


def test_cold_start_with_too_few_neighbours_keeps_an_easy_request_on_the_default_tier() -> None:
    decision = route(ask("Where is my parcel"), make_policy(), neighbours("chain", 0.9, 3))

    assert (decision.tier, decision.method) == ("single_call", "cold_start")
    assert decision.reason == (
        "only 3 similar requests with a known outcome (8 needed); difficulty 0.01 is low, so the default tier, "
        "single_call"
    )
    assert set(decision.estimates) == {"single_call", "chain", "human"}


def test_cold_start_sends_a_hard_request_to_the_cheapest_tier_that_fits() -> None:
    decision = route(ask(HARD), make_policy(tiers=("single_call", "chain", "agentic")), [])

    assert (decision.tier, decision.method) == ("chain", "cold_start")
    assert decision.features["difficulty"] == 0.516
    assert decision.reason == (
        "only 0 similar requests with a known outcome (8 needed); difficulty 0.52 "
        "(cues: compare, for each, and then, calculate, across) suggests chain, so chain"
    )


def test_cold_start_takes_a_dearer_tier_when_the_fitting_one_is_disabled() -> None:
    decision = route(ask(HARD), make_policy(tiers=("single_call", "agentic")), [])

    assert decision.tier == "agentic"


def test_cold_start_never_goes_below_the_default_tier_nor_to_a_person() -> None:
    policy = make_policy(tiers=("single_call", "chain", "human"), default_tier="chain")

    assert route(ask("hi"), policy, []).tier == "chain"
    assert route(ask(HARD * 5, has_tools=True), make_policy(tiers=("single_call", "human")), []).tier == "single_call"


def test_routing_by_rules_uses_the_default_tier_when_no_rule_matches() -> None:
    decision = route(ask(HARD), make_policy(signal="rules", default_tier="chain"), neighbours("single_call", 1.0, 20))

    assert (decision.tier, decision.method) == ("chain", "default")
    assert decision.reason == "no rule matched; requests routed by rules go to the default tier, chain"
    assert decision.estimates == {}


def test_a_default_tier_that_is_not_enabled_falls_back_to_the_cheapest_enabled_one() -> None:
    decision = route(ask("hi"), make_policy(signal="rules", tiers=("chain", "agentic"), default_tier="human"), [])

    assert decision.tier == "chain"


# --- Features and odd messages -----------------------------------------------------------------


def test_request_features_are_json_and_count_what_they_say() -> None:
    request = Request(
        messages=[
            {"role": "system", "content": "You are a helpful agent."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Why was I charged $40? And when is the refund due?"},
        ],
        has_tools=True,
    )

    features = request_features(request, make_policy())

    assert features == {
        "chars": 50,
        "words": 11,
        "questions": 2,
        "turns": 2,
        "amounts": [40.0],
        "max_amount": 40.0,
        "intent": None,
        "stakes": ["money"],
        "stakes_terms": {"money": ["refund"]},
        "signals": [],
        "signal_evidence": {},
        "has_tools": True,
        "difficulty_cues": [],
        "difficulty": 0.247,
        "keywords": {},
        "rules": {},
    }
    json.dumps(features, allow_nan=False)


def test_request_text_is_the_last_user_message() -> None:
    messages = [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "x"},
        {"role": "user", "content": "second"},
    ]

    assert request_text(messages) == "second"


def test_request_text_falls_back_to_all_user_text_when_the_last_message_is_empty() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "first"},
        {"role": "user", "content": "more"},
        {"role": "user", "content": None},
    ]

    assert request_text(messages) == "first\nmore"


def test_request_text_reads_text_parts_and_skips_the_rest() -> None:
    content = [
        {"type": "text", "text": "look at"},
        {"type": "image_url", "image_url": {"url": "data:..."}},
        "this",
        {"type": "text", "text": 42},
        None,
    ]

    assert request_text([{"role": "user", "content": content}]) == "look at\nthis"


def test_request_text_is_bounded() -> None:
    assert len(request_text([{"role": "user", "content": "word " * 100_000}])) == MAX_TEXT_CHARS


@pytest.mark.parametrize(
    "messages",
    [
        [],
        [{"role": "tool", "content": "refund"}],
        [{"role": None, "content": None}, {"content": "no role"}, "not a message", None, 7],
        [{"role": "user", "content": {"text": "a dict"}}],
        [{"role": "user", "content": b"bytes"}],
        "not a list",
        None,
    ],
)
def test_odd_messages_route_to_the_default_tier(messages: Any) -> None:
    decision = route(Request(messages=messages), make_policy(signal="rules", rules=(rule("keywords", "refund"),)), [])

    assert (decision.tier, decision.method) == ("single_call", "default")
    assert decision.features["chars"] == 0


def test_a_huge_conversation_is_routed_on_its_bounded_text() -> None:
    # Speed is measured in bench/bench_gateway.py; here only that the size changes nothing.
    messages = [{"role": "user", "content": "That's not what I asked. " * 2000}] * 500
    policy = make_policy(rules=(rule("signal", "misalignment"),))

    decision = route(Request(messages=messages), policy, [])

    assert decision.tier == "human"


# --- Priors ------------------------------------------------------------------------------------


def test_default_profiles_follow_the_framework_multiples() -> None:
    profiles = default_profiles(ALL_TIERS, 0.01, 5000.0)

    assert profiles == {
        "single_call": TierProfile("single_call", cost_usd=0.01, latency_ms=1500.0, risk=0.1),
        "chain": TierProfile("chain", cost_usd=0.04, latency_ms=4500.0, risk=0.15),
        # 18 s is over the 5 s budget: the timeout risk is added.
        "agentic": TierProfile("agentic", cost_usd=0.3, latency_ms=18000.0, risk=pytest.approx(0.5)),  # type: ignore[arg-type]
        "human": TierProfile("human", cost_usd=4.0, latency_ms=14_400_000.0, risk=pytest.approx(0.22)),  # type: ignore[arg-type]
    }


def test_default_profiles_without_a_price_or_budget() -> None:
    profiles = default_profiles(("single_call", "mystery"), None, None)

    assert profiles == {
        "single_call": TierProfile("single_call", cost_usd=0.002, latency_ms=1500.0, risk=0.1),
        "mystery": TierProfile("mystery", cost_usd=0.002, latency_ms=1500.0, risk=0.1),
    }


def test_missing_or_broken_profiles_fall_back_to_the_priors() -> None:
    profiles = {"chain": TierProfile("chain", cost_usd=float("nan"), latency_ms=1.0, risk=0.1)}
    similar = neighbours("single_call", 0.5) + neighbours("chain", 0.9)

    decision = route(ask("Where is my parcel"), make_policy(profiles=profiles), similar)

    assert decision.estimates["chain"].cost_usd == 0.008
    assert decision.estimates["single_call"].cost_usd == 0.002


def test_the_data_types_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        rule("keywords", "x").value = "y"  # type: ignore[misc]
    estimate = TierEstimate("chain", quality=0.5, support=1.0, cost_usd=0.1, latency_ms=10.0, risk=0.1, utility=0.2)
    assert not hasattr(estimate, "__dict__")


# --- Outcome quality ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scores", "expected"),
    [
        ([("numeric", 0.8)], 0.8),
        ([("numeric", 4)], 0.8),
        ([("numeric", 7)], 0.7),
        ([("boolean", True), ("boolean", False)], 0.5),
        ([("boolean", "true"), ("numeric", "0.5")], 0.75),
        ([("categorical", "good"), ("numeric", 1.0)], 1.0),
    ],
)
def test_outcome_quality_from_scores(scores: list[tuple[str, Any]], expected: float) -> None:
    quality, source = outcome_quality(status="error", scores=scores, signal_counts={"failure": 3}, triage_score=0.9)

    assert quality == pytest.approx(expected)
    assert source == "score"


def test_unusable_scores_are_ignored() -> None:
    scores = [("numeric", 42), ("numeric", -1), ("numeric", float("nan")), ("categorical", "bad"), ("boolean", 3)]

    assert outcome_quality(status="pending", scores=scores, signal_counts={}, triage_score=0.0) == (None, "")


def test_outcome_quality_of_an_error_is_zero() -> None:
    assert outcome_quality(status="error", scores=[], signal_counts={}, triage_score=0.0) == (0.0, "status")


def test_outcome_quality_of_an_unremarkable_success() -> None:
    assert outcome_quality(status="ok", scores=[], signal_counts={}, triage_score=0.0) == (0.75, "signals")


def test_problem_signals_lower_the_quality_and_satisfaction_raises_it() -> None:
    lowered = outcome_quality(status="ok", scores=[], signal_counts={"failure": 1, "loop": 2}, triage_score=0.0)
    raised = outcome_quality(status="ok", scores=[], signal_counts={"satisfaction": 1}, triage_score=0.0)

    assert lowered == (round(0.75 * 0.5 * 0.65 * 0.65, 4), "signals")
    assert raised == (0.875, "signals")


def test_the_triage_score_caps_the_quality() -> None:
    assert outcome_quality(status="ok", scores=[], signal_counts={"satisfaction": 2}, triage_score=0.6) == (
        0.4,
        "signals",
    )


def test_nothing_known_of_a_pending_request() -> None:
    assert outcome_quality(status="pending", scores=[], signal_counts={"failure": 1}, triage_score=0.5) == (None, "")


# --- Never raises ------------------------------------------------------------------------------

TEXTS = st.one_of(
    st.text(max_size=80),
    st.lists(
        st.sampled_from(
            ["refund", "$250", "talk to a human", "no, I said", "compare", "and then", "?", "unsafe", "€", "1,000"]
        ),
        max_size=8,
    ).map(" ".join),
)
CONTENT = st.one_of(
    st.none(),
    TEXTS,
    st.integers(),
    st.lists(st.one_of(TEXTS, st.fixed_dictionaries({"type": st.just("text"), "text": TEXTS}), st.none()), max_size=3),
)
MESSAGES = st.lists(
    st.one_of(
        st.fixed_dictionaries(
            {"role": st.sampled_from(["user", "assistant", "system", "tool", "x"]), "content": CONTENT}
        ),
        st.none(),
        st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
    ),
    max_size=6,
)
NUMBERS = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), st.floats(min_value=0, max_value=1))
RULES = st.builds(
    Rule,
    name=st.text(max_size=8),
    kind=st.sampled_from(["keywords", "pattern", "intent", "amount_over", "stakes", "signal", "low_confidence", "x"]),
    value=st.one_of(TEXTS, st.sampled_from(["([", "[[a]", "100", "safety", "money", "disengagement"])),
    to_tier=st.sampled_from([*ALL_TIERS, "gold"]),
    reason=st.text(max_size=10),
)


@st.composite
def policies(draw: st.DrawFn) -> Policy:
    tiers = tuple(tier for tier in ALL_TIERS if draw(st.booleans())) or (draw(st.sampled_from(ALL_TIERS)),)
    return make_policy(
        mode=draw(st.sampled_from(["adaptive", "single_level"])),
        tiers=tiers,
        default_tier=draw(st.sampled_from(tiers)),
        signal=draw(st.sampled_from(["rules", "classifier", "learned_difficulty", "confidence"])),
        rules=tuple(draw(st.lists(RULES, max_size=4))),
        intents=draw(st.dictionaries(st.text(max_size=6), st.lists(TEXTS, max_size=3).map(tuple), max_size=2)),
        profiles=draw(st.sampled_from([PROFILES, {}, default_profiles(tiers, None, None)])),
        cost_weight=draw(st.floats(allow_nan=True)),
        latency_weight=draw(st.floats(min_value=0, max_value=2)),
        neighbours=draw(st.integers(min_value=0, max_value=30)),
        min_neighbours=draw(st.integers(min_value=0, max_value=10)),
        cost_ceiling_usd=draw(NUMBERS),
        latency_budget_ms=draw(NUMBERS),
    )


NEIGHBOURS = st.lists(
    st.builds(
        Neighbour,
        similarity=st.floats(allow_nan=True, allow_infinity=True),
        tier=st.sampled_from([*ALL_TIERS, "gold"]),
        quality=NUMBERS,
        cost_usd=NUMBERS,
        latency_ms=NUMBERS,
    ),
    max_size=25,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    messages=MESSAGES,
    policy=policies(),
    similar=NEIGHBOURS,
    has_tools=st.booleans(),
    conversation_tier=st.one_of(st.none(), st.sampled_from([*ALL_TIERS, "gold"])),
)
def test_route_never_raises_and_always_picks_an_enabled_tier(
    messages: Any, policy: Policy, similar: list[Neighbour], has_tools: bool, conversation_tier: str | None
) -> None:
    decision = route(
        Request(messages=messages, has_tools=has_tools, conversation_tier=conversation_tier), policy, similar
    )

    assert decision.tier in policy.tiers
    assert decision.method in {"rule", "estimate", "cold_start", "default", "continuation", "single_level"}
    assert decision.reason
    json.dumps(decision.features, allow_nan=False)
    json.dumps(decision.estimates_json(), allow_nan=False)


def test_an_absurd_weight_counts_as_the_largest_allowed_and_the_decision_stays_storable() -> None:
    """Found by the property test above: a weight near the largest float times a normalised cost
    overflowed to infinity, and the decision could not be written as JSON."""
    huge = make_policy(cost_weight=1.7e308, latency_weight=1e308, cost_ceiling_usd=0.0078125)
    capped = make_policy(cost_weight=WEIGHT_MAX, latency_weight=WEIGHT_MAX, cost_ceiling_usd=0.0078125)

    decision = route(ask("Where is my driver?"), huge, [])

    json.dumps(decision.estimates_json(), allow_nan=False)
    assert decision.estimates_json() == route(ask("Where is my driver?"), capped, []).estimates_json()
