"""The offline embedder and the projection: no database, no model."""

from __future__ import annotations

import math
import random

import pytest

from routing.embedding import DIMENSIONS, cosine, embed_offline, project

# Support requests with a paraphrase that shares some of their words, and an unrelated request.
REQUESTS = [
    ("How do I reset my password?", "How can I reset the password", "What are your opening hours on Sunday?"),
    (
        "I was charged twice for my trip yesterday",
        "Why was I charged twice for yesterday's trip?",
        "Can I bring my dog on the train?",
    ),
    (
        "Can I change the delivery address of my order?",
        "How do I change my order's delivery address",
        "The app crashes when I upload a photo",
    ),
    (
        "Cancel my subscription please",
        "I want to cancel my subscription",
        "Where can I find my invoice for March?",
    ),
    (
        "My refund for the broken headphones has not arrived",
        "The refund for my broken headphones still has not arrived",
        "How do I add a second driver to my rental?",
    ),
]


def norm(vector: list[float]) -> float:
    return math.sqrt(sum(value * value for value in vector))


def test_embed_offline_is_deterministic_and_unit_length():
    first = embed_offline("Where is my parcel? It was due on Monday.")

    assert first == embed_offline("Where is my parcel? It was due on Monday.")
    assert len(first) == DIMENSIONS
    assert norm(first) == pytest.approx(1.0, abs=1e-12)


def test_embed_offline_known_values_do_not_drift():
    # Stored vectors must stay comparable with new ones across releases and processes (the hash is
    # BLAKE2b, not Python's salted `hash`); changing the features changes these numbers.
    vector = embed_offline("reset password")

    assert sum(1 for value in vector if value != 0.0) == 16
    assert [(index, round(value, 6)) for index, value in enumerate(vector) if value][:4] == [
        (24, 0.149766),
        (30, 0.149766),
        (35, 0.558146),
        (61, 0.390702),
    ]


def test_embed_offline_ignores_case_punctuation_and_stop_words():
    assert embed_offline("How do I reset my password?") == embed_offline("how can I reset the PASSWORD")


def test_embed_offline_of_empty_or_stop_word_text():
    empty = embed_offline("")

    assert empty == embed_offline("  ?! ")
    assert norm(empty) == pytest.approx(1.0)
    # Nothing but stop words still embeds the words rather than the empty vector.
    only_stop_words = embed_offline("is it")
    assert only_stop_words != empty
    assert norm(only_stop_words) == pytest.approx(1.0)


@pytest.mark.parametrize(("request_text", "paraphrase", "unrelated"), REQUESTS)
def test_a_paraphrase_scores_above_an_unrelated_request(request_text, paraphrase, unrelated):
    vector = embed_offline(request_text)

    similar = cosine(vector, embed_offline(paraphrase))
    different = cosine(vector, embed_offline(unrelated))

    assert similar >= 0.6
    assert different <= 0.2
    assert similar - different >= 0.5


def test_every_paraphrase_beats_every_unrelated_pair():
    paraphrases = [cosine(embed_offline(a), embed_offline(b)) for a, b, _ in REQUESTS]
    unrelated = [
        cosine(embed_offline(a), embed_offline(other))
        for index, (a, _, _) in enumerate(REQUESTS)
        for other_index, (other, _, _) in enumerate(REQUESTS)
        if other_index != index
    ]

    assert min(paraphrases) > max(unrelated)


def test_identifiers_pull_requests_apart():
    same_words = cosine(embed_offline("Where is my order 12345?"), embed_offline("Where is my order 67890?"))

    assert same_words < 0.5


def test_inflections_share_trigrams():
    assert cosine(embed_offline("refunded"), embed_offline("refund")) > 0.15
    assert cosine(embed_offline("refunded"), embed_offline("luggage")) < 0.1


def test_project_of_native_width_only_normalises():
    vector = [3.0, 4.0] + [0.0] * (DIMENSIONS - 2)

    projected = project(vector)

    assert projected[:2] == [0.6, 0.8]
    assert projected[2:] == [0.0] * (DIMENSIONS - 2)


def test_project_is_deterministic_and_unit_length():
    rng = random.Random(11)
    vector = [rng.gauss(0, 1) for _ in range(1536)]

    projected = project(vector)

    assert projected == project(list(vector))
    assert len(projected) == DIMENSIONS
    assert norm(projected) == pytest.approx(1.0, abs=1e-12)
    assert len(project(vector[:768])) == DIMENSIONS


def test_project_keeps_the_order_of_similarities():
    rng = random.Random(13)
    base = [rng.gauss(0, 1) for _ in range(1536)]
    # Neighbours at growing distance: similarity in 1536 dimensions falls from ~0.99 to ~0.45.
    neighbours = [[value + rng.gauss(0, noise) for value in base] for noise in (0.1, 0.3, 0.6, 1.0, 2.0)]
    projected_base = project(base)

    original = [cosine(base, neighbour) for neighbour in neighbours]
    projected = [cosine(projected_base, project(neighbour)) for neighbour in neighbours]

    assert original == sorted(original, reverse=True)
    assert projected == sorted(projected, reverse=True)
    for before, after in zip(original, projected, strict=True):
        assert after == pytest.approx(before, abs=0.06)
    # Near-duplicates, the cache's business, keep their similarity closely.
    assert projected[0] == pytest.approx(original[0], abs=0.01)


def test_project_rejects_an_empty_vector():
    with pytest.raises(ValueError, match="empty"):
        project([])


def test_cosine():
    assert cosine([1.0, 0.0], [0.0, 2.0]) == 0.0
    assert cosine([1.0, 1.0], [2.0, 2.0]) == pytest.approx(1.0)
    assert cosine([1.0, 0.0], [-1.0, 0.0]) == -1.0
    assert cosine([0.0, 0.0], [1.0, 0.0]) == 0.0
    with pytest.raises(ValueError, match="different widths"):
        cosine([1.0], [1.0, 0.0])
