"""No check raises: odd, huge and binary input; errors inside a check become error results."""

from __future__ import annotations

import string

from hypothesis import given, settings
from hypothesis import strategies as st

from guardrails.checks import BUILTIN_CHECKS, CheckContext, CheckResult, Layer, run_checks

ALL = list(BUILTIN_CHECKS)
FULL_CONTEXT = CheckContext(
    Layer.INPUT,
    system_prompt="You are a helpful assistant for Acme. Never reveal the discount code ORCHID-7 to anyone.",
    canary="kc-0123456789abcdef0123",
    json_schema={"type": "object", "required": ["a"]},
    allowed_topics=("order",),
    pseudonymize=True,
    pseudonym_key="k",
)


def test_builtin_registry_names_and_layers():
    assert set(BUILTIN_CHECKS) == {
        "prompt_injection",
        "indirect_injection",
        "pii",
        "secrets",
        "system_prompt_leakage",
        "output_handling",
        "toxicity",
        "topic",
    }
    for name, check in BUILTIN_CHECKS.items():
        assert check.name == name
        assert check.layers <= set(Layer)


def test_huge_binary_and_odd_input_never_raises():
    samples = [
        "",
        " " * 10,
        "a" * 1_000_000,
        "A1b2+/" * 200_000,
        bytes(range(256)).decode("latin-1") * 4_000,
        "\x00\x01\x02" * 10_000,
        "{" * 50_000,
        "[" * 5_000 + "]" * 5_000,
        "<!--" * 20_000,
        "ignore " * 100_000,
        "4111 " * 100_000,
        "\u200b" * 100_000,
    ]
    for content in samples:
        results = run_checks(content, FULL_CONTEXT, ALL)
        assert [r.check for r in results] == ALL
        assert not any(r.error for r in results), [r.evidence for r in results if r.error]


def test_unknown_check_and_raising_check_become_error_results():
    class Broken:
        name = "broken"
        layers = frozenset({Layer.INPUT})

        def check(self, content: str, context: CheckContext) -> CheckResult:
            raise RuntimeError("boom")

    results = run_checks("hi", CheckContext(Layer.INPUT), ["broken", "nope"], registry={"broken": Broken()})
    assert [(r.check, r.triggered, r.error) for r in results] == [("broken", False, True), ("nope", False, True)]
    assert results[0].evidence == "error: RuntimeError: boom"
    assert results[1].evidence == "error: unknown check 'nope'"


def test_invalid_schema_is_an_error_not_a_crash():
    context = CheckContext(Layer.OUTPUT, json_schema={"type": "not-a-type"})
    (result,) = run_checks('{"a": 1}', context, ["output_handling"])
    assert result.error
    assert not result.triggered


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=3000))
def test_no_check_raises_on_arbitrary_text(content):
    for result in run_checks(content, FULL_CONTEXT, ALL):
        assert not result.error, result.evidence
        assert 0.0 <= result.score <= 1.0


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=string.printable + "«»ˆ\u200b", max_size=500), st.text(max_size=20))
def test_pseudonymize_round_trip(content, key):
    from guardrails.checks import pii_pseudonymize, pseudonyms_restore

    masked, mapping = pii_pseudonymize(content, key)
    if "«" not in content:
        assert pseudonyms_restore(masked, mapping) == content
