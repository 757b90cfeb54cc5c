"""PII and secrets: validated detection, redaction, reversible pseudonyms."""

from __future__ import annotations

import pytest

from guardrails.checks import BUILTIN_CHECKS, CheckContext, Layer, pii_pseudonymize, pseudonyms_restore
from guardrails.pii import iban_valid, luhn_valid, pii_detect, pseudonym_for, secrets_detect

USER = CheckContext(Layer.INPUT)


def _kinds(text):
    return [d.kind for d in pii_detect(text)]


def test_luhn():
    assert luhn_valid("4111 1111 1111 1111")
    assert luhn_valid("378282246310005")
    assert not luhn_valid("4111 1111 1111 1112")
    assert not luhn_valid("0000 0000 0000 0000")  # one repeated digit is never a card
    assert not luhn_valid("4111")


def test_iban_mod97_and_length():
    assert iban_valid("DE89 3704 0044 0532 0130 00")
    assert iban_valid("GB29NWBK60161331926819")
    assert not iban_valid("DE89 3704 0044 0532 0130 01")  # check digits wrong
    assert not iban_valid("DE89 3704 0044 0532 0130")  # too short for Germany
    assert not iban_valid("DE00 0000 0000 0000 0000 00")


@pytest.mark.parametrize(
    ("text", "kind", "value"),
    [
        ("mail me at maria.garcia+shop@mail.example.org today", "email", "maria.garcia+shop@mail.example.org"),
        ("call +44 20 7946 0958 please", "phone", "+44 20 7946 0958"),
        ("my cell is (415) 555-0132", "phone", "(415) 555-0132"),
        ("portable : 06 12 34 56 78", "phone", "06 12 34 56 78"),
        ("card 4111-1111-1111-1111 exp 08/27", "card", "4111-1111-1111-1111"),
        ("IBAN DE89 3704 0044 0532 0130 00 thanks", "iban", "DE89 3704 0044 0532 0130 00"),
        ("SSN: 123-45-6789", "ssn", "123-45-6789"),
        ("NI number AB 12 34 56 C", "nino", "AB 12 34 56 C"),
        ("Mi DNI es 12345678Z.", "national_id", "12345678Z"),
        ("I live at 221 Baker Street, London", "address", "221 Baker Street"),
        ("Ship it to 221B Baker Street please", "address", "221B Baker Street"),
        ("We are at 1600 Amphitheatre Parkway, Mountain View", "address", "1600 Amphitheatre Parkway"),
        ("Livrez au 12 rue de la Paix, Paris", "address", "12 rue de la Paix"),
        ("Flat 2, 5 The Crescent, Hove", "address", "5 The Crescent"),
        ("Hello, my name is Aisha Khan and I need help", "person", "Aisha Khan"),
        ("Best regards,\nLukas Berg\n", "person", "Lukas Berg"),
    ],
)
def test_pii_detects_each_kind(text, kind, value):
    found = [(d.kind, d.text) for d in pii_detect(text)]
    assert (kind, value) in found


@pytest.mark.parametrize(
    "text",
    [
        "Order #483920 shipped on 2024-03-12.",
        "Version 4.12.3 fixes issue 4411.",
        "The card 4111 1111 1111 1112 in the docs has a bad checksum.",
        "Reference DE00 0000 0000 0000 0000 00 is a placeholder.",
        "ISBN 978-3-16-148410-0 is the second edition.",
        "Use request id 123e4567-e89b-12d3-a456-426614174000.",
        "The lottery numbers were 4 8 15 16 23 42.",
        "Product code 000-00-0000 for all samples; SSN 666-12-3456 is never issued.",
        "Part 5 Street Fighter review: great combos.",
    ],
)
def test_pii_spares_lookalike_numbers(text):
    assert pii_detect(text) == []


@pytest.mark.parametrize(
    "text",
    [
        "Your refund of $12 is on its way",
        "Your refund of $12.50 is on its way",
        "A refund of €40 is on its way to your card",
        "Your 2 parcels are on their way",
        "It costs 15 dollars one way",
        "The depot is 10 minutes down the road",
        "I have 2 questions before we close",
    ],
)
def test_pii_spares_amounts_and_counts_before_street_words(text):
    assert [d for d in pii_detect(text) if d.kind == "address"] == []


def test_pii_finds_the_address_after_an_amount():
    found = [(d.kind, d.text) for d in pii_detect("Your refund of $12 is on its way to 221B Baker Street, London")]
    assert found == [("address", "221B Baker Street")]


def test_pii_redaction_labels_each_finding():
    result = BUILTIN_CHECKS["pii"].check("Write to ana@example.com or call +1 415 555 0132.", USER)
    assert result.triggered
    assert result.redacted == "Write to [EMAIL] or call [PHONE]."
    assert [f.kind for f in result.findings] == ["email", "phone"]


def test_pii_kinds_limit_what_is_reported():
    context = CheckContext(Layer.INPUT, pii_kinds=frozenset({"email"}))
    result = BUILTIN_CHECKS["pii"].check("ana@example.com, +44 20 7946 0958", context)
    assert [f.kind for f in result.findings] == ["email"]
    assert result.redacted == "[EMAIL], +44 20 7946 0958"


def test_pseudonyms_are_stable_keyed_and_reversible():
    text = "Refund IBAN GB29 NWBK 6016 1331 9268 19 for ana@example.com (again: ana@example.com)."
    masked, mapping = pii_pseudonymize(text, key="k1")
    assert "ana@example.com" not in masked
    assert "GB29" not in masked
    assert masked.count(pseudonym_for("email", "ana@example.com", "k1")) == 2
    assert len(mapping) == 2
    assert pseudonyms_restore(masked, mapping) == text
    # the same value gives the same token across messages, another key another token
    assert pseudonym_for("email", "ANA@example.com", "k1") == pseudonym_for("email", "ana@example.com", "k1")
    assert pseudonym_for("email", "ana@example.com", "k2") != pseudonym_for("email", "ana@example.com", "k1")
    # a model's answer that reuses the token is restored; unknown tokens are left alone
    answer = f"I sent it to {pseudonym_for('email', 'ana@example.com', 'k1')} and «EMAIL_00000000»."
    assert pseudonyms_restore(answer, mapping) == "I sent it to ana@example.com and «EMAIL_00000000»."


def test_pii_check_pseudonymizes_when_asked():
    context = CheckContext(Layer.INPUT, pseudonymize=True, pseudonym_key="secret")
    result = BUILTIN_CHECKS["pii"].check("I am at 10 Downing Street", context)
    assert result.redacted == f"I am at {pseudonym_for('address', '10 Downing Street', 'secret')}"
    assert result.redacted.startswith("I am at «ADDRESS_")


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("aws_access_key_id = AKIAIOSFODNN7EXAMPLE", "aws_access_key"),
        ("OPENAI_API_KEY=sk-proj-abcdefghijklmnopqrstuvwxyz012345", "openai_key"),
        ("token ghp_" + "a1B2c3D4e5" * 4, "github_token"),
        ("xoxb-123456789012-abcdefghijkl", "slack_token"),
        ("-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----", "private_key"),
        ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N", "jwt"),
        ("db password: f8Kq2xZ9pLm4Rt7WvB3n", "generic_secret"),
    ],
)
def test_secrets_detects_keys(text, kind):
    assert kind in [d.kind for d in secrets_detect(text)]


@pytest.mark.parametrize(
    "text",
    [
        "Reset your password from the settings page.",
        "The token bucket algorithm limits the request rate.",
        "password: correcthorsebatterystaple",  # low-entropy words
        "Ask the skier about the sk-i lift.",
    ],
)
def test_secrets_spares_ordinary_text(text):
    assert secrets_detect(text) == []


def test_secrets_redacts():
    result = BUILTIN_CHECKS["secrets"].check("key AKIAIOSFODNN7EXAMPLE here", USER)
    assert result.redacted == "key [SECRET] here"
