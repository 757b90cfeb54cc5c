"""The vocabulary every guardrail check speaks: layers, actions, context, results, the Check protocol.

Pure (no Django): the gateway, the standalone check API and the benchmark all call checks through
these types. A check never sees a policy; it reports what it found, and the agent's policy (in
`guardrails.services`) turns results into an `Action`.
"""

from __future__ import annotations

import re
import time
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

# Content longer than this is scanned as its first SCAN_HEAD and last SCAN_TAIL characters by the
# classifying checks (injection, leakage, toxicity, topic, output handling): attacks sit at the start
# or the end of what a model reads, and the cap keeps a 1 MB tool result linear and fast. The PII and
# secrets checks scan everything, because redaction must be complete (their regexes are linear).
SCAN_HEAD = 48_000
SCAN_TAIL = 16_000


class Layer(StrEnum):
    INPUT = "input"
    SYSTEM = "system"
    OUTPUT = "output"
    # Tool results and tool arguments entering the model; inter-agent messages use INPUT with source="agent".
    TOOL = "tool"


class Action(StrEnum):
    ALLOW = "allow"
    FLAG = "flag"
    REDACT = "redact"
    BLOCK = "block"
    REQUIRE_APPROVAL = "require_approval"


@dataclass(frozen=True, slots=True)
class CheckContext:
    layer: Layer
    source: str = "user"  # user | document | tool_result | agent | model
    system_prompt: str | None = None
    canary: str | None = None
    json_schema: Mapping[str, Any] | None = None
    allowed_topics: tuple[str, ...] = ()
    pii_kinds: frozenset[str] | None = None  # None: every kind
    pseudonymize: bool = False
    pseudonym_key: str = ""


@dataclass(frozen=True, slots=True)
class Finding:
    kind: str
    start: int
    end: int
    text: str


@dataclass(frozen=True, slots=True)
class CheckResult:
    check: str
    triggered: bool
    score: float  # 0..1
    evidence: str
    latency_ms: float
    redacted: str | None = None  # the content with findings replaced, from checks that can redact
    findings: tuple[Finding, ...] = ()
    error: bool = False  # the check raised; run_checks recorded it instead


class Check(Protocol):
    name: str
    layers: frozenset[Layer]

    def check(self, content: str, context: CheckContext) -> CheckResult: ...


ALL_LAYERS = frozenset(Layer)
INPUT_LAYERS = frozenset({Layer.INPUT, Layer.TOOL})


def scan_window(content: str) -> str:
    """The part of `content` a classifying check reads (see SCAN_HEAD)."""
    if len(content) <= SCAN_HEAD + SCAN_TAIL:
        return content
    return content[:SCAN_HEAD] + "\n" + content[-SCAN_TAIL:]


_SPACES = re.compile(r"[^\S\n]+")
_NEWLINES = re.compile(r" ?\n[\s]*")
ZERO_WIDTH = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff\u00ad\u180e"), None)


def normalize(text: str) -> str:
    """Case-folded NFKC text without zero-width characters; runs of spaces become one space and runs of
    blank lines one newline (line starts matter to role markers such as "system:").

    Full-width letters, ligatures and mathematical alphabets fold to ASCII under NFKC, which undoes the
    cheapest obfuscations of a trigger phrase.
    """
    folded = unicodedata.normalize("NFKC", text).translate(ZERO_WIDTH).casefold()
    return _NEWLINES.sub("\n", _SPACES.sub(" ", folded)).strip()


def timed(name: str, body: Callable[[], CheckResult]) -> CheckResult:
    """Run a check body and stamp its wall time (ms) on the result."""
    started = time.perf_counter()
    result = body()
    elapsed = (time.perf_counter() - started) * 1000
    return CheckResult(
        check=name,
        triggered=result.triggered,
        score=min(1.0, max(0.0, result.score)),
        evidence=result.evidence,
        latency_ms=elapsed,
        redacted=result.redacted,
        findings=result.findings,
        error=result.error,
    )


def combine(weights: list[float]) -> float:
    """Noisy-or of independent cues: 1 - prod(1 - w)."""
    remaining = 1.0
    for weight in weights:
        remaining *= 1.0 - weight
    return 1.0 - remaining
