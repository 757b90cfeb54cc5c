"""Request embeddings for the semantic cache and the learned router: pure functions, standard library only.

Every vector Keel stores is 256 wide (`EMBEDDING_DIMENSIONS` in routing/models.py) and L2-normalised,
so one HNSW index with cosine distance serves the offline embedder and every provider's model.

`embed_offline` needs no model and no download: it hashes lexical features of the text into 256 signed
buckets (the "hashing trick"). What it is good at, and what it is not:

- Requests that share their content words score high, whatever the word order, stop words,
  capitalisation and punctuation: "How do I reset my password?" and "how can I reset the password"
  score 1.0, "I was charged twice for my trip yesterday" and "Why was I charged twice for yesterday's
  trip?" about 0.75; unrelated support requests score near 0 (within about ±0.15, the noise of 256
  buckets).
- Inflections and typos still share most character trigrams ("refund", "refunded", "refnd"), which
  pull such pairs together a little.
- Scripts written without spaces (Chinese, Japanese, Thai) are one "word" per run of characters;
  only their character trigrams match.
- It knows no synonyms: "I want my money back" and "please refund me" share nothing and score near 0,
  so a cache on it misses paraphrases that a provider embedding would catch. Misses cost money, not
  correctness.
- It does not understand negation or roles: "cancel my order" and "do not cancel my order" score high.
  Tokens with digits (order numbers, amounts, dates) weigh double and get no trigrams, so two
  requests that differ only in an identifier fall apart ("Where is my order 12345?" against
  "... 67890?" scores about 0.4), but a long request with one changed number can still clear a loose
  threshold. Keep cache thresholds high (0.93 and up) on it and watch the false-hit review.

`project` brings a provider embedding of any width to 256 with a fixed sparse random projection (a
sparse Johnson–Lindenstrauss transform), so nearness survives the change of width.

Speed: about 0.1 ms for a 50-word request once its words have been seen (per-word features are
cached), about 0.5 ms when every word is new; `project` about 0.8 ms for 1,536 wide.
"""

from __future__ import annotations

import itertools
import math
import operator
import random
import re
from collections.abc import Callable, Sequence
from functools import cache, lru_cache
from hashlib import blake2b

DIMENSIONS = 256  # routing.models.EMBEDDING_DIMENSIONS; this module imports no Django

# Short function words that say little about what a request asks; negations and question words
# stay, because they change what the answer should be.
STOP_WORDS = frozenset(
    """a an the and or but if then so of to in on at by for from with about as into onto over
    is am are was were be been being do does did have has had i me my mine we us our you your
    it its this that these those there here please hi hello hey thanks thank just can could
    would will shall should may might must s t d ll m re ve""".split()  # noqa: SIM905 - a word list reads better as prose
)

_TOKEN = re.compile(r"[^\W_]+")

_UNIGRAM_WEIGHT = 1.0
_BIGRAM_WEIGHT = 0.7
_TRIGRAMS_WEIGHT = 0.6  # the weight of all of one word's character trigrams together
_NUMBER_WEIGHT = 2.0  # tokens with a digit: identifiers and amounts matter for whether an answer fits
_EMPTY_FEATURE = "\x00empty"

Features = tuple[tuple[int, float], ...]  # (signed bucket, weight): bucket + 1, negated for a minus sign


def _bucket(feature: str) -> int:
    """A stable signed bucket for a feature: 1..256 or -1..-256 (the sign of the hashing trick)."""
    digest = int.from_bytes(blake2b(feature.encode(), digest_size=8).digest(), "little")
    index = digest % DIMENSIONS + 1
    return index if (digest >> 32) & 1 else -index


@lru_cache(maxsize=65_536)
def _word_features(word: str) -> Features:
    # Cached per word: a request's vocabulary repeats across requests, so most words cost a dict look-up.
    if any(character.isdigit() for character in word):
        return ((_bucket("w:" + word), _NUMBER_WEIGHT),)
    marked = f"<{word}>"
    trigrams = [marked[start : start + 3] for start in range(len(marked) - 2)]
    each = _TRIGRAMS_WEIGHT / math.sqrt(len(trigrams))
    return ((_bucket("w:" + word), _UNIGRAM_WEIGHT), *((_bucket("c:" + trigram), each) for trigram in trigrams))


@lru_cache(maxsize=65_536)
def _bigram_bucket(first: str, second: str) -> int:
    return _bucket(f"b:{first} {second}")


def embed_offline(text: str) -> list[float]:
    """A deterministic, L2-normalised 256-wide embedding of `text` that needs no model.

    Features: lower-cased word unigrams (stop words dropped unless nothing else is left), bigrams of
    the remaining words, and character trigrams of each word with boundary marks; each feature is
    hashed with BLAKE2b to a bucket and a sign. A feature seen n times weighs 1 + ln n (sublinear tf),
    so a repeated word does not drown the rest. Empty text gets one fixed vector.
    """
    words = _TOKEN.findall(text.casefold())
    content = [word for word in words if word not in STOP_WORDS] or words

    counts: dict[tuple[str, int, float], int] = {}
    for word in content:
        for bucket, weight in _word_features(word):
            key = (word, bucket, weight)
            counts[key] = counts.get(key, 0) + 1
    for first, second in itertools.pairwise(content):
        key = (f"{first} {second}", _bigram_bucket(first, second), _BIGRAM_WEIGHT)
        counts[key] = counts.get(key, 0) + 1

    vector = [0.0] * DIMENSIONS
    for (_, bucket, weight), count in counts.items():
        value = weight * (1.0 + math.log(count))
        if bucket > 0:
            vector[bucket - 1] += value
        else:
            vector[-bucket - 1] -= value
    if not counts:
        bucket = _bucket(_EMPTY_FEATURE)
        vector[abs(bucket) - 1] = 1.0
    return _normalised(vector)


# Each input coordinate feeds this many output coordinates with a random sign (Kane and Nelson's sparse
# JL transform). A dense matrix preserves distances no better at this width and costs 30 times more in
# pure Python (1536 x 256 multiply-adds per request).
_NONZEROS_PER_COLUMN = 16
_PROJECTION_SEED = "keel.routing.embedding.project/v1"


@cache
def _projection(width: int, dimensions: int) -> tuple[tuple[Callable[[Sequence[float]], tuple[float, ...]], ...], ...]:
    """For each output coordinate, getters for the input coordinates added to it and subtracted from it.

    Generated from a fixed seed per (width, dimensions), so every process projects alike; changing the
    seed or the scheme would make stored vectors incomparable with new ones."""
    generator = random.Random(f"{_PROJECTION_SEED}/{width}/{dimensions}")  # noqa: S311 - not for security
    plus: list[list[int]] = [[] for _ in range(dimensions)]
    minus: list[list[int]] = [[] for _ in range(dimensions)]
    nonzeros = min(_NONZEROS_PER_COLUMN, dimensions)
    for column in range(width):
        for row in generator.sample(range(dimensions), nonzeros):
            (plus if generator.getrandbits(1) else minus)[row].append(column)
    return tuple((_getter(plus[row]), _getter(minus[row])) for row in range(dimensions))


def _getter(indexes: list[int]) -> Callable[[Sequence[float]], tuple[float, ...]]:
    if not indexes:
        return lambda _vector: ()
    if len(indexes) == 1:
        index = indexes[0]
        return lambda vector: (vector[index],)
    return operator.itemgetter(*indexes)


def project(vector: Sequence[float], dimensions: int = DIMENSIONS) -> list[float]:
    """`vector` brought to `dimensions` wide and L2-normalised.

    A vector of that width is only normalised. Any other width goes through a fixed seeded sparse
    random projection (scaled ±1 entries, 16 per input coordinate), which keeps inner products of
    normalised vectors in expectation; the error on a squared distance d² is about d²·√(2/256), so
    near-duplicates (the cache's business) keep their similarity within about ±0.01.
    """
    if not vector:
        raise ValueError("cannot project an empty vector")
    if len(vector) == dimensions:
        return _normalised([float(value) for value in vector])
    values = tuple(float(value) for value in vector)
    return _normalised(
        [math.fsum(add(values)) - math.fsum(subtract(values)) for add, subtract in _projection(len(values), dimensions)]
    )


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """Cosine similarity of two vectors of one width; 0.0 when either is all zeros."""
    if len(a) != len(b):
        raise ValueError(f"vectors of different widths: {len(a)} and {len(b)}")
    dot = math.fsum(x * y for x, y in zip(a, b, strict=True))
    norms = math.sqrt(math.fsum(x * x for x in a)) * math.sqrt(math.fsum(y * y for y in b))
    return dot / norms if norms else 0.0


def _normalised(vector: list[float]) -> list[float]:
    norm = math.sqrt(math.fsum(value * value for value in vector))
    if norm == 0.0:
        raise ValueError("cannot normalise a vector of zeros")
    return [value / norm for value in vector]
