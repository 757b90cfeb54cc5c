"""System-prompt leakage in model outputs: the canary token, and long overlap with the system prompt.

Overlap is measured on word 4-gram shingles of case-folded, NFKC-normalised words with a light
plural fold, so whitespace, case, line breaks and punctuation changes do not hide a copy, and a
copy with a few words changed still shares most of its shingles. It triggers on a long contiguous
run (RUN_WORDS words), on many shared shingles anywhere (MATCHED_SHINGLES, which catches quoting in
pieces), or on most of a short prompt; a shared phrase of a few words ("happy to help with your
order") stays well below all three. Paraphrase and translation are not caught: a model-based check
can. Pure: no Django.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache

from guardrails.interface import CheckContext, CheckResult, Layer, scan_window, timed

SHINGLE = 4
RUN_WORDS = 12
MATCHED_SHINGLES = 10
COVERAGE = 0.5

_WORD = re.compile(r"\w+")


def _words(text: str) -> list[str]:
    folded = unicodedata.normalize("NFKC", text).casefold()
    return [word[:-1] if len(word) > 3 and word.endswith("s") else word for word in _WORD.findall(folded)]


@lru_cache(maxsize=256)
def _prompt_shingles(system_prompt: str) -> frozenset[tuple[str, ...]]:
    words = _words(system_prompt)
    return frozenset(tuple(words[i : i + SHINGLE]) for i in range(len(words) - SHINGLE + 1))


@dataclass(frozen=True, slots=True)
class Overlap:
    longest_run_words: int
    matched_shingles: int
    coverage: float  # share of the prompt's shingles found in the output
    score: float


def overlap_measure(output: str, system_prompt: str) -> Overlap:
    prompt = _prompt_shingles(system_prompt)
    if not prompt:
        return Overlap(0, 0, 0.0, 0.0)
    words = _words(output)
    matched: set[tuple[str, ...]] = set()
    run = longest = 0
    for i in range(len(words) - SHINGLE + 1):
        shingle = tuple(words[i : i + SHINGLE])
        if shingle in prompt:
            matched.add(shingle)
            run += 1
            longest = max(longest, run)
        else:
            run = 0
    longest_words = longest + SHINGLE - 1 if longest else 0
    coverage = len(matched) / len(prompt)
    # A short prompt cannot give a 12-word run; ask for most of it instead.
    run_needed = min(RUN_WORDS, max(SHINGLE + 2, int(0.7 * (len(prompt) + SHINGLE - 1))))
    score = 0.5 * max(longest_words / run_needed, len(matched) / MATCHED_SHINGLES, coverage / COVERAGE)
    return Overlap(longest_words, len(matched), coverage, min(1.0, score))


def canary_token(secret: str, prompt_name: str, version: int) -> str:
    """A marker to put in a prompt version's system prompt: stable for that version, 80 random-looking
    bits that do not occur in ordinary text, so finding it in an output proves the prompt leaked."""
    digest = hmac.new(secret.encode(), f"{prompt_name}\x00{version}".encode(), hashlib.sha256).hexdigest()
    return f"kc-{digest[:20]}"


def canary_found(output: str, canary: str) -> bool:
    """The canary, or its random part, anywhere in the output, across case, spacing and zero-width tricks."""
    squeezed = "".join(unicodedata.normalize("NFKC", output).casefold().split()).translate(_INVISIBLE)
    token = "".join(canary.casefold().split())
    core = token.split("-", 1)[-1] if len(token.split("-", 1)[-1]) >= 12 else token
    return token in squeezed or core in squeezed


_INVISIBLE = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff\u00ad"), None)


class SystemPromptLeakageCheck:
    """The output contains the canary, or a long (near-)verbatim part of the system prompt."""

    name = "system_prompt_leakage"
    layers = frozenset({Layer.OUTPUT})

    def check(self, content: str, context: CheckContext) -> CheckResult:
        def body() -> CheckResult:
            window = scan_window(content)
            if context.canary and canary_found(window, context.canary):
                return CheckResult(self.name, True, 1.0, "canary token in the output", 0.0)
            if not context.system_prompt:
                return CheckResult(self.name, False, 0.0, "no system prompt or canary to compare with", 0.0)
            overlap = overlap_measure(window, context.system_prompt)
            evidence = (
                f"longest run {overlap.longest_run_words} words, {overlap.matched_shingles} shared "
                f"{SHINGLE}-word shingles, {overlap.coverage:.0%} of the system prompt"
            )
            return CheckResult(self.name, overlap.score >= 0.5, overlap.score, evidence, 0.0)

        return timed(self.name, body)
