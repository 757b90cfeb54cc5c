"""The router: which tier serves a request (a single call, a chain, an agentic loop or a person), and why.

Pure module, no Django: the gateway builds a `Policy` from the agent's requirements and router
configuration, a `Request` from the OpenAI-style messages, and `Neighbour`s from past routing decisions
found by embedding similarity; `route` returns a `Decision` with the features it saw, its estimate per
tier and a reason a person can read. An import-linter contract holds this module to the standard library.

The order `route` decides in:

1. Single-level mode: every request goes to the default tier.
2. Rules, in order, first match wins (only rules to enabled tiers count).
3. Continuation: a conversation stays on the tier its earlier turns used. A matching rule still wins
   when it escalates to a dearer tier, because the signals a rule can look for (a user correcting the
   agent, asking for a person, raising a safety issue) mostly appear after the first turn.
4. The learned estimate (signal `learned_difficulty`; `classifier` and `confidence` are treated the
   same way), when at least `min_neighbours` similar past requests have a known quality: start at the
   cheapest enabled tier and escalate only when "the expected quality gain exceeds the added latency
   cost, failure risk and monitoring burden" (the requirements framework), i.e. when the dearer tier's
   quality gain is larger than its added weighted cost, latency and risk. A person is chosen by the
   estimate only when every automated tier's expected quality is below `HUMAN_QUALITY_FLOOR`.
5. Otherwise a rule-free cold start (learned signal, too few neighbours): a cheap difficulty heuristic
   may pick a chain or agentic tier; with the `rules` signal, the default tier.

Whichever step chose a chain, a request that brings its own tools goes to the agentic loop or the single
call instead, when one is enabled: a chain's declared steps never offer the model the caller's tools.

`route` never raises on odd input: messages of any shape, invalid regular expressions, NaN numbers and
unknown tier names all degrade to a decision with a reason.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, Final

import regex

SINGLE_CALL: Final = "single_call"
CHAIN: Final = "chain"
AGENTIC: Final = "agentic"
HUMAN: Final = "human"
TIERS: Final[tuple[str, ...]] = (SINGLE_CALL, CHAIN, AGENTIC, HUMAN)

# The values of `routing.models.DecisionMethod`.
METHOD_RULE: Final = "rule"
METHOD_ESTIMATE: Final = "estimate"
METHOD_COLD_START: Final = "cold_start"
METHOD_DEFAULT: Final = "default"
METHOD_CONTINUATION: Final = "continuation"
METHOD_SINGLE_LEVEL: Final = "single_level"

SINGLE_LEVEL_MODE: Final = "single_level"
LEARNED_SIGNALS: Final = frozenset({"learned_difficulty", "classifier", "confidence"})

RULE_KINDS: Final = frozenset({"keywords", "pattern", "intent", "amount_over", "stakes", "signal", "low_confidence"})

# What the router reads of a request; the rest of a huge message changes no decision.
MAX_TEXT_CHARS: Final = 4000
# Signals look at the recent conversation only, so a thousand-turn history costs what fifty do.
MAX_CONVERSATION_MESSAGES: Final = 50

# The learned estimate. The prior counts as this many neighbours of similarity 1, so two or three close
# neighbours move an estimate a long way and a single far one barely does.
PRIOR_STRENGTH: Final = 2.0
# How much more a dearer tier is expected to get right on a hard request (difficulty 1) than the
# pooled quality of similar requests: a prior only, which the tier's own neighbours soon outweigh.
TIER_QUALITY_LIFT: Final[Mapping[str, float]] = {SINGLE_CALL: 0.0, CHAIN: 0.15, AGENTIC: 0.25, HUMAN: 0.3}
# Below this expected quality on every automated tier, the request is better off with a person.
HUMAN_QUALITY_FLOOR: Final = 0.35
# A normalised cost or latency is capped, so one absurd price cannot drown the quality term.
MAX_NORMALISED_PENALTY: Final = 2.0
# The largest cost, latency or risk weight a configuration may set (routing.services refuses more); a
# larger one reaching the router counts as this, so a penalty stays finite and its decision storable.
WEIGHT_MAX: Final = 10.0

# Cold start: difficulty from which a chain, and an agentic loop, fits the request.
CHAIN_DIFFICULTY: Final = 0.4
AGENTIC_DIFFICULTY: Final = 0.7

# Tier priors (`default_profiles`). Cost relative to one call follows the framework's back-of-envelope
# (single 1x, chain 3-5x, agentic 10-100x); latency grows less than cost because a chain's steps are
# short and an agentic loop's calls are mostly small.
DEFAULT_SINGLE_CALL_COST_USD: Final = 0.002
DEFAULT_SINGLE_CALL_LATENCY_MS: Final = 1500.0
TIER_COST_MULTIPLIER: Final[Mapping[str, float]] = {SINGLE_CALL: 1.0, CHAIN: 4.0, AGENTIC: 30.0}
TIER_LATENCY_MULTIPLIER: Final[Mapping[str, float]] = {SINGLE_CALL: 1.0, CHAIN: 3.0, AGENTIC: 12.0}
# A few minutes of a support person's time, and an answer within hours.
HUMAN_COST_USD: Final = 4.0
HUMAN_LATENCY_MS: Final = 4 * 3600 * 1000.0
# Failure risk: each step more can fail, an agentic loop can also act wrongly; a person rarely fails.
TIER_RISK: Final[Mapping[str, float]] = {SINGLE_CALL: 0.1, CHAIN: 0.15, AGENTIC: 0.3, HUMAN: 0.02}
# A tier expected to take longer than the latency budget risks a timeout on top.
OVER_BUDGET_RISK: Final = 0.2

STAKES_PHRASES: Final[Mapping[str, tuple[str, ...]]] = {
    "safety": (
        "accident", "crash", "crashed", "injured", "injury", "hurt", "assault", "assaulted", "harassment",
        "harassed", "harassing", "unsafe", "not safe", "police", "emergency", "threat", "threatened",
        "threatening", "weapon", "gun", "knife", "abuse", "abused", "abusive", "stalking", "attacked",
        "ambulance", "hospital", "bleeding", "drunk", "sexual", "self harm", "suicide",
    ),
    "legal": (
        "lawyer", "attorney", "lawsuit", "sue", "suing", "legal action", "court", "solicitor", "subpoena",
        "small claims", "liable", "liability", "gdpr", "data protection", "regulator", "ombudsman",
    ),
    "money": (
        "refund", "refunded", "chargeback", "fraud", "fraudulent", "dispute", "disputed", "double charged",
        "charged twice", "overcharged", "unauthorized charge", "unauthorised charge", "scam", "scammed",
        "stolen card", "billing error",
    ),
}  # fmt: skip

SIGNAL_PHRASES: Final[Mapping[str, tuple[str, ...]]] = {
    "misalignment": (
        "that's not what i asked", "not what i asked", "not what i meant", "not what i said", "no, i said",
        "no i meant", "i already said", "i already told you", "as i said", "like i said", "you misunderstood",
        "you misunderstand", "you're not listening", "you are not listening", "that's wrong", "that is wrong",
        "that doesn't answer", "you didn't answer", "read my question", "i asked you",
    ),
    "disengagement": (
        "talk to a human", "speak to a human", "talk to a person", "speak to a person", "talk to someone",
        "speak to someone", "real person", "real human", "a human please", "human agent", "live agent",
        "talk to an agent", "speak to an agent", "representative", "this is useless", "you're useless",
        "you are useless", "useless", "waste of time", "forget it", "never mind", "nevermind", "i give up",
        "pointless", "not helpful", "not helping",
    ),
}  # fmt: skip

# Cues that a request needs several information-acquisition steps.
DIFFICULTY_CUES: Final[tuple[str, ...]] = (
    "and then", "after that", "compare", "comparison", "versus", "for each", "for every", "each of",
    "step by step", "multiple", "several", "all of", "analyse", "analyze", "investigate", "plan",
    "research", "calculate", "troubleshoot", "debug", "figure out", "look up", "find out", "across",
    "breakdown", "break down", "reconcile",
)  # fmt: skip

_NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
_CURRENCY_SYMBOL = r"[$€£¥]"
_CURRENCY_CODE = r"usd|eur|gbp|cad|aud|chf|jpy|inr"
_CURRENCY_WORD = r"dollars?|bucks|euros?|pounds?|" + _CURRENCY_CODE
# "$25", "USD 1,200.50", "€30", "$5k" (the currency first) or "25 dollars", "30 eur", "30€" (after).
_MONEY = re.compile(
    rf"(?:(?:{_CURRENCY_SYMBOL}|(?<![a-z])(?:{_CURRENCY_CODE}))\s?(?P<before>{_NUMBER})\s?(?P<before_k>k\b)?)"
    rf"|(?:(?<![\w.,])(?P<after>{_NUMBER})\s?(?P<after_k>k\b)?\s?(?:{_CURRENCY_SYMBOL}|(?:{_CURRENCY_WORD})\b))",
    re.IGNORECASE,
)
MAX_AMOUNTS: Final = 20
_PUNCTUATION = re.compile(r"[^\w]+")


# --- Inputs ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Rule:
    """A routing rule. Kinds:

    - `keywords`: any of the comma-separated terms appears (whole words, any case);
    - `pattern`: the regular expression matches (any case); an invalid one never matches;
    - `intent`: the request's intent label (from the policy's intents) equals the value;
    - `amount_over`: a money amount in the request exceeds the value (currencies are not converted);
    - `stakes`: a stakes marker of the named category (`safety`, `legal`, `money`) appears;
    - `signal`: `misalignment` (the user corrects the agent or repeats a request) or `disengagement`
      (asks for a person, gives up) shows in the conversation;
    - `low_confidence`: judged after a tier ran, so the router records it as not applicable.
    """

    name: str
    kind: str
    value: str
    to_tier: str
    reason: str = ""


@dataclass(frozen=True, slots=True)
class TierProfile:
    """What a tier is expected to cost, take and risk for this agent, before any neighbour says more."""

    tier: str
    cost_usd: float
    latency_ms: float
    risk: float


@dataclass(frozen=True, slots=True)
class Policy:
    """An agent's routing policy, from its requirements and router configuration.

    The estimate's utility is quality - cost_weight * cost / cost_ceiling_usd - latency_weight * latency /
    latency_budget_ms - risk_weight * risk; without a ceiling or a budget, cost and latency are divided by
    the dearest automated tier's prior instead, so that tier counts 1. Each ratio is capped at 2.
    """

    mode: str
    tiers: tuple[str, ...]  # enabled, cheapest first
    default_tier: str
    signal: str
    rules: tuple[Rule, ...]
    intents: Mapping[str, tuple[str, ...]]
    profiles: Mapping[str, TierProfile]
    cost_weight: float
    latency_weight: float
    risk_weight: float
    neighbours: int
    min_neighbours: int
    cost_ceiling_usd: float | None
    latency_budget_ms: float | None


@dataclass(frozen=True, slots=True)
class Request:
    messages: Sequence[Mapping[str, Any]]
    has_tools: bool = False  # offers tools, or carries tool calls or results
    conversation_tier: str | None = None
    offers_tools: bool = False  # the caller's own tool definitions (`tools`), which a chain cannot offer the model


@dataclass(frozen=True, slots=True)
class Neighbour:
    """A past request similar to this one, the tier that served it and how it went."""

    similarity: float
    tier: str
    quality: float | None
    cost_usd: float | None
    latency_ms: float | None


# --- Outputs -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TierEstimate:
    tier: str
    quality: float
    support: float  # the summed similarity of the neighbours this tier served
    cost_usd: float
    latency_ms: float
    risk: float
    utility: float

    def as_json(self) -> dict[str, float]:
        return {
            "quality": round(self.quality, 4),
            "support": round(self.support, 4),
            "cost_usd": round(self.cost_usd, 8),
            "latency_ms": round(self.latency_ms, 1),
            "risk": round(self.risk, 4),
            "utility": round(self.utility, 4),
        }


@dataclass(frozen=True, slots=True)
class Decision:
    tier: str
    method: str
    rule: str
    reason: str
    features: dict[str, Any]
    estimates: dict[str, TierEstimate]

    def estimates_json(self) -> dict[str, dict[str, float]]:
        return {tier: estimate.as_json() for tier, estimate in self.estimates.items()}


# --- Rules -------------------------------------------------------------------------------------


# A pattern rule runs a regular expression the agent's owner wrote on text the caller wrote. Some patterns
# backtrack catastrophically (`(a+)+$` on a long request) and would hold the request's thread for minutes,
# so each search runs under this limit (the `regex` engine stops itself). A search that runs out has found
# nothing: the rule is recorded as "timed_out" and routing goes on without it.
PATTERN_TIMEOUT_SECONDS = 0.05


@dataclass(frozen=True, slots=True)
class _CompiledRule:
    rule: Rule
    matcher: Any  # keywords rules: an re.Pattern; pattern rules: a regex.Pattern (searched with a time limit)
    threshold: float | None  # amount_over rules
    error: str


def rule_errors(rules: Sequence[Rule]) -> list[str]:
    """What is wrong with each rule, in words; an empty list when every rule can match."""
    return [
        f"rule {compiled.rule.name!r}: {compiled.error}" for compiled in _compiled_rules(tuple(rules)) if compiled.error
    ]


@lru_cache(maxsize=256)
def _compiled_rules(rules: tuple[Rule, ...]) -> tuple[_CompiledRule, ...]:
    return tuple(_compile_rule(rule) for rule in rules)


def _compile_rule(rule: Rule) -> _CompiledRule:
    kind = str(rule.kind)
    value = str(rule.value)
    if str(rule.to_tier) not in TIERS:
        return _CompiledRule(rule, None, None, f"unknown tier {rule.to_tier!r}")
    if kind == "keywords":
        terms = _split_terms(value)
        if not terms:
            return _CompiledRule(rule, None, None, "no keywords given")
        return _CompiledRule(rule, _any_term_pattern(terms), None, "")
    if kind == "pattern":
        try:
            # A pattern a future Python will read differently (a nested set) still works today.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                return _CompiledRule(rule, regex.compile(value, regex.IGNORECASE | regex.V0), None, "")
        except (regex.error, RecursionError, OverflowError) as error:
            return _CompiledRule(rule, None, None, f"invalid regular expression: {error}")
    if kind in ("amount_over", "low_confidence"):
        threshold = _finite_float(value)
        if threshold is None:
            return _CompiledRule(rule, None, None, f"{kind} needs a number, not {value!r}")
        return _CompiledRule(rule, None, threshold, "")
    if kind == "stakes" and value.strip().lower() not in STAKES_PHRASES:
        return _CompiledRule(
            rule, None, None, f"unknown stakes category {value!r} (one of {', '.join(STAKES_PHRASES)})"
        )
    if kind == "signal" and value.strip().lower() not in SIGNAL_PHRASES:
        return _CompiledRule(rule, None, None, f"unknown signal {value!r} (one of {', '.join(SIGNAL_PHRASES)})")
    if kind == "intent" and not value.strip():
        return _CompiledRule(rule, None, None, "no intent label given")
    if kind not in RULE_KINDS:
        return _CompiledRule(rule, None, None, f"unknown kind {kind!r}")
    return _CompiledRule(rule, None, None, "")


def _split_terms(value: str) -> list[str]:
    return [term.strip() for term in value.split(",") if term.strip()]


def _any_term_pattern(terms: Sequence[str]) -> re.Pattern[str]:
    # Longest first, so "talk to a human" wins over "human"; lookarounds instead of \b so a term that
    # starts or ends with punctuation ("$", "c++") still matches as a whole word.
    alternatives = [
        r"\s+".join(re.escape(word) for word in term.split()) for term in sorted(terms, key=len, reverse=True)
    ]
    return re.compile(r"(?<!\w)(?:" + "|".join(alternatives) + r")(?!\w)", re.IGNORECASE)


def _normalise(text: str) -> str:
    """Lower case, punctuation to spaces: "No, I meant" reads "no i meant", as the phrase lists do."""
    return " ".join(_PUNCTUATION.sub(" ", text.lower().replace("’", "'")).split())


def _phrase_pattern(phrases: Sequence[str]) -> re.Pattern[str] | None:
    normalised = sorted({_normalise(phrase) for phrase in phrases} - {""}, key=len, reverse=True)
    if not normalised:
        return None
    return re.compile(r"(?<!\w)(?:" + "|".join(re.escape(phrase) for phrase in normalised) + r")(?!\w)")


# A found phrase as the lists write it ("that's not what i asked"), for features and reasons.
_AS_WRITTEN: Final = {
    _normalise(phrase): phrase for phrases in (*STAKES_PHRASES.values(), *SIGNAL_PHRASES.values()) for phrase in phrases
}
_STAKES_PATTERNS: Final = {category: _phrase_pattern(phrases) for category, phrases in STAKES_PHRASES.items()}
_SIGNAL_PATTERNS: Final = {signal: _phrase_pattern(phrases) for signal, phrases in SIGNAL_PHRASES.items()}
_DIFFICULTY_PATTERN: Final = _phrase_pattern(DIFFICULTY_CUES)


@lru_cache(maxsize=256)
def _compiled_intents(intents: tuple[tuple[str, tuple[str, ...]], ...]) -> tuple[tuple[str, re.Pattern[str]], ...]:
    compiled = []
    for label, phrases in intents:
        pattern = _phrase_pattern(phrases)
        if pattern is not None:
            compiled.append((label, pattern))
    return tuple(compiled)


def _intents_key(intents: object) -> tuple[tuple[str, tuple[str, ...]], ...]:
    if not isinstance(intents, Mapping):
        return ()
    key = []
    for label, phrases in intents.items():
        if isinstance(phrases, str):
            phrases = (phrases,)
        if isinstance(label, str) and isinstance(phrases, Sequence):
            key.append((label, tuple(phrase for phrase in phrases if isinstance(phrase, str))))
    return tuple(key)


# --- Reading a request -------------------------------------------------------------------------


def _content_text(content: object) -> str:
    if isinstance(content, str):
        return content[: MAX_TEXT_CHARS * 2]
    if isinstance(content, Sequence) and not isinstance(content, bytes | bytearray):
        parts = []
        for part in content[:100]:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "\n".join(parts)[: MAX_TEXT_CHARS * 2]
    return ""


def _user_texts(messages: object) -> list[str]:
    """The text of every user message, oldest first (images and other parts carry no text)."""
    if not isinstance(messages, Sequence) or isinstance(messages, str | bytes | bytearray):
        return []
    return [
        _content_text(message.get("content"))
        for message in messages
        if isinstance(message, Mapping) and message.get("role") == "user"
    ]


def request_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """The text to embed and match rules against: the last user message's, else all user text."""
    return _request_text(_user_texts(messages))


def _request_text(texts: Sequence[str]) -> str:
    last = texts[-1].strip() if texts else ""
    text = last or "\n".join(text for text in texts if text.strip()).strip()
    return text[:MAX_TEXT_CHARS]


def parse_amounts(text: str) -> list[float]:
    """Money amounts written in the text, in order: "$25", "25 dollars", "USD 1,200.50", "€30", "30 eur"."""
    amounts = []
    for match in _MONEY.finditer(text):
        number = match.group("before") or match.group("after")
        thousands = match.group("before_k") or match.group("after_k")
        amount = float(number.replace(",", "")) * (1000 if thousands else 1)
        if math.isfinite(amount):
            amounts.append(amount)
        if len(amounts) == MAX_AMOUNTS:
            break
    return amounts


def _phrases_found(pattern: re.Pattern[str] | None, normalised: str) -> list[str]:
    if pattern is None:
        return []
    return list(dict.fromkeys(_AS_WRITTEN.get(found, found) for found in pattern.findall(normalised)))


def _repeats_earlier_request(normalised_texts: Sequence[str]) -> bool:
    """The last user message asks again what an earlier one asked (mostly the same words)."""
    if len(normalised_texts) < 2:
        return False
    last = set(normalised_texts[-1].split())
    if len(last) < 3:
        return False
    for earlier in normalised_texts[:-1]:
        words = set(earlier.split())
        if words and len(last & words) / len(last | words) >= 0.8:
            return True
    return False


def _signals(texts: Sequence[str]) -> dict[str, list[str]]:
    """Misalignment and disengagement in the conversation, each with the phrases that showed it."""
    normalised = [_normalise(text[:MAX_TEXT_CHARS]) for text in texts[-MAX_CONVERSATION_MESSAGES:]]
    evidence: dict[str, list[str]] = {}
    # A correction needs something to correct: the first user message cannot be one.
    corrections = [
        phrase for text in normalised[1:] for phrase in _phrases_found(_SIGNAL_PATTERNS["misalignment"], text)
    ]
    if _repeats_earlier_request(normalised):
        corrections.append("repeated request")
    if corrections:
        evidence["misalignment"] = list(dict.fromkeys(corrections))
    giving_up = [phrase for text in normalised for phrase in _phrases_found(_SIGNAL_PATTERNS["disengagement"], text)]
    if giving_up:
        evidence["disengagement"] = list(dict.fromkeys(giving_up))
    return evidence


def _intent(normalised: str, intents: object) -> str | None:
    """The label whose phrases appear most often (distinct phrases); the first label on a tie."""
    best_label, best_count = None, 0
    for label, pattern in _compiled_intents(_intents_key(intents)):
        count = len(_phrases_found(pattern, normalised))
        if count > best_count:
            best_label, best_count = label, count
    return best_label


def _difficulty(*, words: int, questions: int, turns: int, cues: int, has_tools: bool) -> float:
    """A cheap guess at how many steps a request needs, 0 (one lookup) to 1 (an open-ended task)."""
    score = min(0.48, 0.12 * cues)
    score += min(0.2, 0.1 * max(0, questions - 1))
    score += min(0.2, words / 500)
    score += min(0.1, 0.025 * max(0, turns - 1))
    score += 0.1 if has_tools else 0.0
    return round(min(1.0, score), 3)


@dataclass(frozen=True, slots=True)
class _Analysis:
    features: dict[str, Any]
    matched: _CompiledRule | None  # the first rule that matched, to an enabled tier
    detail: str  # what it matched, in words


def _analyse(request: Request, policy: Policy) -> _Analysis:
    messages = getattr(request, "messages", None)
    texts = _user_texts(messages)
    text = _request_text(texts)
    normalised = _normalise(text)
    amounts = parse_amounts(text)
    stakes = {
        category: found
        for category, pattern in _STAKES_PATTERNS.items()
        if (found := _phrases_found(pattern, normalised))
    }
    signals = _signals(texts)
    cues = _phrases_found(_DIFFICULTY_PATTERN, normalised)
    has_tools = getattr(request, "has_tools", False) is True
    words = len(normalised.split())
    questions = text.count("?")
    intent = _intent(normalised, getattr(policy, "intents", None))
    features: dict[str, Any] = {
        "chars": len(text),
        "words": words,
        "questions": questions,
        "turns": len(texts),
        "amounts": amounts,
        "max_amount": max(amounts) if amounts else None,
        "intent": intent,
        "stakes": list(stakes),
        "stakes_terms": stakes,
        "signals": list(signals),
        "signal_evidence": signals,
        "has_tools": has_tools,
        "difficulty_cues": cues,
        "difficulty": _difficulty(
            words=words, questions=questions, turns=len(texts), cues=len(cues), has_tools=has_tools
        ),
        "keywords": {},
        "rules": {},
    }
    enabled = set(_enabled_tiers(policy))
    rules = getattr(policy, "rules", ())
    compiled_rules = (
        _compiled_rules(tuple(rule for rule in rules if isinstance(rule, Rule))) if isinstance(rules, Sequence) else ()
    )
    matched: _CompiledRule | None = None
    matched_detail = ""
    for compiled in compiled_rules:
        status, detail = _rule_status(compiled, text, features)
        if status == "matched" and compiled.rule.to_tier not in enabled:
            status = "tier_disabled"
        features["rules"][str(compiled.rule.name)] = status
        if status == "matched" and matched is None:
            matched, matched_detail = compiled, detail
    return _Analysis(features=features, matched=matched, detail=matched_detail)


def _rule_status(compiled: _CompiledRule, text: str, features: dict[str, Any]) -> tuple[str, str]:
    """Whether a rule matches ("matched", "no_match", "not_applicable", "invalid", "timed_out") and what it saw."""
    rule = compiled.rule
    if compiled.error:
        return "invalid", ""
    value = str(rule.value).strip().lower()
    if rule.kind == "keywords" and compiled.matcher is not None:
        terms = list(dict.fromkeys(found.lower() for found in compiled.matcher.findall(text)))
        features["keywords"][str(rule.name)] = terms
        return ("matched", f"the request mentions {_quoted(terms)}") if terms else ("no_match", "")
    if rule.kind == "pattern" and compiled.matcher is not None:
        try:
            found = compiled.matcher.search(text, timeout=PATTERN_TIMEOUT_SECONDS)
        except TimeoutError:
            return "timed_out", ""
        return (
            ("matched", f"the request matches /{rule.value}/ ({found.group(0)[:60]!r})") if found else ("no_match", "")
        )
    if rule.kind == "intent":
        intent = features["intent"]
        matches = intent is not None and intent.strip().lower() == value
        return ("matched", f"the request's intent is {intent!r}") if matches else ("no_match", "")
    if rule.kind == "amount_over" and compiled.threshold is not None:
        largest = features["max_amount"]
        if largest is not None and largest > compiled.threshold:
            return "matched", f"an amount of {largest:,.2f} is over {compiled.threshold:,.2f}"
        return "no_match", ""
    if rule.kind == "stakes":
        terms = features["stakes_terms"].get(value)
        return ("matched", f"{value} stakes ({_quoted(terms)})") if terms else ("no_match", "")
    if rule.kind == "signal":
        evidence = features["signal_evidence"].get(value)
        return ("matched", f"{value} in the conversation ({_quoted(evidence)})") if evidence else ("no_match", "")
    return "not_applicable", ""


def _quoted(terms: Sequence[str]) -> str:
    return ", ".join(f'"{term}"' for term in terms[:5])


def request_features(request: Request, policy: Policy) -> dict[str, Any]:
    """What the router sees in a request, JSON-serialisable, stored with the decision.

    Amounts, stakes, intent, difficulty and keywords come from the request text (`request_text`);
    signals from the whole conversation. `rules` maps each rule's name to "matched", "no_match",
    "not_applicable" (low_confidence), "invalid", "timed_out" (a pattern that ran out of time on this
    request: not matched) or "tier_disabled" (matched, but to a disabled tier).
    """
    return _analyse(request, policy).features


# --- Estimating tiers --------------------------------------------------------------------------


def default_profiles(
    tiers: Sequence[str], single_call_cost_usd: float | None, latency_budget_ms: float | None
) -> dict[str, TierProfile]:
    """Priors per tier before any neighbour is known.

    Cost: a single call at `single_call_cost_usd` (else $0.002), a chain 4x, an agentic loop 30x (the
    framework's 1x / 3-5x / 10-100x), a person $4 or 100 calls, whichever is more. Latency: 1.5 s, 3x,
    12x; a person four hours. Risk: agentic 0.3 > chain 0.15 > single call 0.1 > person 0.02, plus 0.2
    for a tier whose expected latency is over `latency_budget_ms` (it risks a timeout). A tier name the
    router does not know gets the single call's priors.
    """
    base_cost = _finite_float(single_call_cost_usd)
    if base_cost is None or base_cost <= 0:
        base_cost = DEFAULT_SINGLE_CALL_COST_USD
    budget = _finite_float(latency_budget_ms)
    profiles = {}
    for tier in tiers:
        if tier == HUMAN:
            cost, latency = max(HUMAN_COST_USD, 100 * base_cost), HUMAN_LATENCY_MS
        else:
            cost = base_cost * TIER_COST_MULTIPLIER.get(tier, 1.0)
            latency = DEFAULT_SINGLE_CALL_LATENCY_MS * TIER_LATENCY_MULTIPLIER.get(tier, 1.0)
        risk = TIER_RISK.get(tier, TIER_RISK[SINGLE_CALL])
        if budget is not None and budget > 0 and latency > budget:
            risk = min(1.0, risk + OVER_BUDGET_RISK)
        profiles[tier] = TierProfile(tier=tier, cost_usd=cost, latency_ms=latency, risk=risk)
    return profiles


def _profile(policy: Policy, tier: str) -> TierProfile:
    profiles = policy.profiles if isinstance(policy.profiles, Mapping) else {}
    profile = profiles.get(tier)
    if isinstance(profile, TierProfile):
        cost, latency, risk = (
            _finite_float(profile.cost_usd),
            _finite_float(profile.latency_ms),
            _finite_float(profile.risk),
        )
        if cost is not None and latency is not None and risk is not None:
            return TierProfile(
                tier=tier, cost_usd=max(0.0, cost), latency_ms=max(0.0, latency), risk=min(1.0, max(0.0, risk))
            )
    return default_profiles((tier,), None, policy.latency_budget_ms)[tier]


@dataclass(frozen=True, slots=True)
class _Known:
    weight: float
    tier: str
    quality: float
    cost_usd: float | None
    latency_ms: float | None


def _known_neighbours(neighbours: Sequence[Neighbour], limit: int) -> list[_Known]:
    """The nearest neighbours with a known quality, up to `limit`, with clean numbers."""
    known = []
    for neighbour in neighbours if isinstance(neighbours, Sequence) else ():
        quality = _finite_float(getattr(neighbour, "quality", None))
        similarity = _finite_float(getattr(neighbour, "similarity", None))
        if quality is None or similarity is None:
            continue
        cost = _finite_float(getattr(neighbour, "cost_usd", None))
        latency = _finite_float(getattr(neighbour, "latency_ms", None))
        known.append(
            _Known(
                weight=min(1.0, max(0.0, similarity)),
                tier=str(getattr(neighbour, "tier", "")),
                quality=min(1.0, max(0.0, quality)),
                cost_usd=None if cost is None or cost < 0 else cost,
                latency_ms=None if latency is None or latency < 0 else latency,
            )
        )
    known.sort(key=lambda item: item.weight, reverse=True)
    return known[:limit] if limit > 0 else known


def _shrunk(prior: float, observed: Sequence[tuple[float, float]]) -> float:
    """The similarity-weighted mean of the observations, pulled toward the prior by `PRIOR_STRENGTH`."""
    weight = sum(w for w, _ in observed)
    return (PRIOR_STRENGTH * prior + sum(w * value for w, value in observed)) / (PRIOR_STRENGTH + weight)


def _estimates(policy: Policy, known: Sequence[_Known], difficulty: float) -> dict[str, TierEstimate]:
    total_weight = sum(item.weight for item in known)
    if total_weight > 0:
        pooled = sum(item.weight * item.quality for item in known) / total_weight
    else:
        pooled = sum(item.quality for item in known) / len(known) if known else 0.5
    tiers = _enabled_tiers(policy)
    profiles = {tier: _profile(policy, tier) for tier in tiers}
    automated = [profiles[tier] for tier in tiers if tier != HUMAN] or list(profiles.values())
    cost_scale = _positive(policy.cost_ceiling_usd) or max((p.cost_usd for p in automated), default=0.0) or 1.0
    latency_scale = _positive(policy.latency_budget_ms) or max((p.latency_ms for p in automated), default=0.0) or 1.0
    cost_weight = _weight(policy.cost_weight)
    latency_weight = _weight(policy.latency_weight)
    risk_weight = _weight(policy.risk_weight)
    estimates = {}
    for tier in tiers:
        profile = profiles[tier]
        served = [item for item in known if item.tier == tier]
        prior = min(1.0, max(0.0, pooled + TIER_QUALITY_LIFT.get(tier, 0.0) * difficulty))
        quality = _shrunk(prior, [(item.weight, item.quality) for item in served])
        cost = _shrunk(profile.cost_usd, [(item.weight, item.cost_usd) for item in served if item.cost_usd is not None])
        latency = _shrunk(
            profile.latency_ms, [(item.weight, item.latency_ms) for item in served if item.latency_ms is not None]
        )
        penalty = (
            cost_weight * min(MAX_NORMALISED_PENALTY, cost / cost_scale)
            + latency_weight * min(MAX_NORMALISED_PENALTY, latency / latency_scale)
            + risk_weight * profile.risk
        )
        estimates[tier] = TierEstimate(
            tier=tier,
            quality=quality,
            support=sum((item.weight for item in served), 0.0),
            cost_usd=cost,
            latency_ms=latency,
            risk=profile.risk,
            utility=quality - penalty,
        )
    return estimates


def _penalty(estimate: TierEstimate) -> float:
    return estimate.quality - estimate.utility


def _choose_by_estimate(estimates: Mapping[str, TierEstimate], tiers: Sequence[str], evidence: int) -> tuple[str, str]:
    """Start at the cheapest automated tier; escalate when a dearer tier's quality gain over the current
    choice exceeds its added weighted cost, latency and risk (equivalently: its utility is higher)."""
    automated = [tier for tier in tiers if tier != HUMAN and tier in estimates]
    from_similar = f"from {evidence} similar request{'s' if evidence != 1 else ''}"
    if HUMAN in estimates and all(estimates[tier].quality < HUMAN_QUALITY_FLOOR for tier in automated):
        best = max(automated, key=lambda tier: estimates[tier].quality, default=None)
        if best is None:
            return HUMAN, f"{HUMAN}: no automated tier is enabled"
        return HUMAN, (
            f"{HUMAN}: every automated tier's expected quality is below {HUMAN_QUALITY_FLOOR:.2f} "
            f"(best {best} {estimates[best].quality:.2f}) {from_similar}, so a person takes it"
        )
    start = automated[0]
    current = start
    for tier in automated[1:]:
        gain = estimates[tier].quality - estimates[current].quality
        added = _penalty(estimates[tier]) - _penalty(estimates[current])
        if gain > added:
            current = tier
    chosen, cheapest = estimates[current], estimates[start]
    if current != start:
        gain = chosen.quality - cheapest.quality
        added = _penalty(chosen) - _penalty(cheapest)
        return current, (
            f"{current}: expected quality {chosen.quality:.2f} vs {cheapest.quality:.2f} for {start} {from_similar}; "
            f"the gain {gain:.2f} outweighs the added cost, latency and risk ({added:.2f})"
        )
    dearer = automated[1:]
    if not dearer:
        return current, f"{current}: expected quality {chosen.quality:.2f} {from_similar}; no dearer tier is enabled"
    closest = max(dearer, key=lambda tier: estimates[tier].utility)
    gain = estimates[closest].quality - chosen.quality
    added = _penalty(estimates[closest]) - _penalty(chosen)
    if gain <= 0:
        return current, (
            f"{current}: expected quality {chosen.quality:.2f} {from_similar}; "
            f"{closest} would not do better ({estimates[closest].quality:.2f})"
        )
    return current, (
        f"{current}: expected quality {chosen.quality:.2f} {from_similar}; {closest} would gain {gain:.2f}, "
        f"not more than its added cost, latency and risk ({added:.2f})"
    )


# --- Routing -----------------------------------------------------------------------------------


def _enabled_tiers(policy: Policy) -> tuple[str, ...]:
    tiers = getattr(policy, "tiers", ())
    if isinstance(tiers, str) or not isinstance(tiers, Sequence):
        return ()
    return tuple(dict.fromkeys(tier for tier in tiers if isinstance(tier, str)))


def route(request: Request, policy: Policy, neighbours: Sequence[Neighbour]) -> Decision:
    """The tier for this request, the method that chose it and why (see the module docstring)."""
    decision = _route(request, policy, neighbours)
    if decision.tier != CHAIN or getattr(request, "offers_tools", False) is not True:
        return decision
    # A chain runs its declared steps and never offers the model the caller's tools: a request that brings
    # tools goes to the tier above it that does (the agentic loop), else to the single call.
    tiers = _enabled_tiers(policy)
    capable = [tier for tier in (AGENTIC, SINGLE_CALL) if tier in tiers]
    if not capable:
        return decision
    reason = f"{decision.reason}; the request brings its own tools, which a chain cannot offer, so {capable[0]}"
    return replace(decision, tier=capable[0], reason=reason)


def _route(request: Request, policy: Policy, neighbours: Sequence[Neighbour]) -> Decision:
    analysis = _analyse(request, policy)
    features = analysis.features
    tiers = _enabled_tiers(policy)
    default = policy.default_tier if policy.default_tier in tiers else (tiers[0] if tiers else str(policy.default_tier))

    def decided(
        tier: str, method: str, reason: str, rule: str = "", estimates: dict[str, TierEstimate] | None = None
    ) -> Decision:
        return Decision(
            tier=tier, method=method, rule=rule, reason=reason, features=features, estimates=estimates or {}
        )

    if policy.mode == SINGLE_LEVEL_MODE:
        return decided(default, METHOD_SINGLE_LEVEL, f"single-level routing: every request goes to {default}")

    rank = {tier: position for position, tier in enumerate(tiers)}
    continuing = getattr(request, "conversation_tier", None)
    matched = analysis.matched
    if matched is not None and (continuing not in rank or rank[matched.rule.to_tier] > rank[str(continuing)]):
        rule = matched.rule
        reason = f"rule {rule.name!r}: {analysis.detail}, so {rule.to_tier}"
        if str(rule.reason).strip():
            reason += f" ({str(rule.reason).strip()})"
        return decided(rule.to_tier, METHOD_RULE, reason, rule=rule.name)
    if isinstance(continuing, str) and continuing in rank:
        return decided(
            continuing,
            METHOD_CONTINUATION,
            f"continues the conversation on {continuing}, the tier of its earlier turns",
        )

    learned = policy.signal in LEARNED_SIGNALS
    if not learned:
        return decided(
            default, METHOD_DEFAULT, f"no rule matched; requests routed by rules go to the default tier, {default}"
        )

    limit = _whole(policy.neighbours, default=0)
    known = _known_neighbours(neighbours, limit)
    needed = max(1, _whole(policy.min_neighbours, default=1))
    difficulty = float(features["difficulty"])
    estimates = _estimates(policy, known, difficulty) if tiers else {}
    features["neighbours_known"] = len(known)
    if len(known) >= needed and any(tier != HUMAN for tier in tiers):
        tier, reason = _choose_by_estimate(estimates, tiers, len(known))
        return decided(tier, METHOD_ESTIMATE, reason, estimates=estimates)

    tier, reason = _cold_start(tiers, default, difficulty, features["difficulty_cues"])
    evidence = (
        f"only {len(known)} similar request{'s' if len(known) != 1 else ''} with a known outcome ({needed} needed)"
    )
    return decided(tier, METHOD_COLD_START, f"{evidence}; {reason}", estimates=estimates)


def _cold_start(tiers: Sequence[str], default: str, difficulty: float, cues: Sequence[str]) -> tuple[str, str]:
    """The cheapest automated tier that fits the difficulty heuristic, never below the default tier."""
    cue_words = f" (cues: {', '.join(cues[:5])})" if cues else ""
    if difficulty < CHAIN_DIFFICULTY:
        return default, f"difficulty {difficulty:.2f} is low, so the default tier, {default}"
    needed = AGENTIC if difficulty >= AGENTIC_DIFFICULTY else CHAIN
    order = {tier: position for position, tier in enumerate(TIERS)}
    automated = [tier for tier in tiers if tier != HUMAN]
    fitting = [tier for tier in automated if order.get(tier, 0) >= order[needed]]
    candidate = fitting[0] if fitting else (automated[-1] if automated else default)
    position = {tier: index for index, tier in enumerate(tiers)}
    if position.get(candidate, -1) <= position.get(default, -1):
        return (
            default,
            f"difficulty {difficulty:.2f}{cue_words} suggests {needed}; the default tier, {default}, serves it",
        )
    return candidate, f"difficulty {difficulty:.2f}{cue_words} suggests {needed}, so {candidate}"


# --- Numbers -----------------------------------------------------------------------------------


def _finite_float(value: object) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None


def _positive(value: object) -> float | None:
    number = _finite_float(value)
    return number if number is not None and number > 0 else None


def _weight(value: object) -> float:
    number = _finite_float(value)
    return min(WEIGHT_MAX, max(0.0, number)) if number is not None else 0.0


def _whole(value: object, *, default: int) -> int:
    number = _finite_float(value)
    return max(0, int(number)) if number is not None else default


# --- Outcomes ----------------------------------------------------------------------------------

# How much one instance of a signal lowers the quality of a finished request.
SIGNAL_PENALTY: Final[Mapping[str, float]] = {
    "failure": 0.5,
    "loop": 0.35,
    "infinite_loop": 0.5,
    "exhaustion": 0.3,
    "misalignment": 0.3,
    "disengagement": 0.4,
    "hallucinated_tool_call": 0.4,
    "cascading_error": 0.4,
    "goal_drift": 0.3,
    "stagnation": 0.2,
}
# One instance of satisfaction closes this share of the distance to 1.
SATISFACTION_LIFT: Final = 0.5
# A request that finished without error and raised no signal: probably adequate, not proven good.
UNREMARKABLE_QUALITY: Final = 0.75


def outcome_quality(
    *, status: str, scores: Sequence[tuple[str, Any]], signal_counts: Mapping[str, int], triage_score: float
) -> tuple[float | None, str]:
    """The quality (0..1) of a finished request and where it came from: "score", "status" or "signals".

    Scores are `(data_type, value)` pairs, by a person or through the API: numeric values in 0..1 count
    as they are, up to 5 as a five-point rating (value / 5), up to 10 as a ten-point one (value / 10);
    booleans count 1 or 0; categorical and other values are ignored. Their mean wins over everything.
    Else an error status is quality 0. Else a finished ("ok") request starts at `UNREMARKABLE_QUALITY`;
    each instance of a problem signal takes its `SIGNAL_PENALTY` share off, each satisfaction lifts it,
    and the result is capped by 1 - triage_score. (None, "") when nothing is known (e.g. still pending).
    """
    values = [value for value in (_score_value(data_type, raw) for data_type, raw in scores) if value is not None]
    if values:
        return sum(values) / len(values), "score"
    if status == "error":
        return 0.0, "status"
    if status != "ok":
        return None, ""
    quality = UNREMARKABLE_QUALITY
    for signal, count in signal_counts.items():
        instances = _whole(count, default=0)
        if signal == "satisfaction":
            quality += (1.0 - quality) * (1.0 - (1.0 - SATISFACTION_LIFT) ** instances)
        elif signal in SIGNAL_PENALTY:
            quality *= (1.0 - SIGNAL_PENALTY[signal]) ** instances
    triage = _finite_float(triage_score)
    if triage is not None and triage > 0:
        quality = min(quality, 1.0 - min(1.0, triage))
    return round(min(1.0, max(0.0, quality)), 4), "signals"


def _score_value(data_type: object, value: object) -> float | None:
    kind = str(data_type).lower()
    if kind == "boolean":
        if isinstance(value, bool):
            return 1.0 if value else 0.0
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return 1.0 if value.strip().lower() == "true" else 0.0
        number = _finite_float(value)
        return number if number in (0.0, 1.0) else None
    if kind != "numeric":
        return None
    number = _finite_float(value)
    if number is None or number < 0:
        return None
    if number <= 1:
        return number
    if number <= 5:
        return number / 5
    if number <= 10:
        return number / 10
    return None
