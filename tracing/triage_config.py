"""An agent's triage settings as a `tracing.signals.SignalConfig`. Pure module, no Django.

`TriageSettings` (tracing.models) stores what a team changed from the defaults, as plain JSON; this
module validates that JSON and merges it over the defaults of `tracing.signals`:

- `phrases`: `{language: {list name: {"mode": "extend" | "replace", "phrases": [...]}}}`. "extend" adds
  the phrases to the English defaults of that list (so an agent that speaks German and English keeps
  the English phrases), "replace" uses only the given ones. List names are the fields of
  `signals.PhraseLists` (`correction`, `quit`, `human_request`, ..., `stopwords`).
- `language`: which language's lists the detectors read (a language with no lists reads English).
- `weights`: signal name → weight in [-1, 1]; signals left out keep `signals.DEFAULT_WEIGHTS`.
- `thresholds`: a few of `signals.Thresholds` (`EXPOSED_THRESHOLDS`, with their allowed ranges).
- `limits`: the agent's context window, output limit and token budget, which make `exhaustion` fire.
- `handoff_tools`: tool names that hand the conversation to a person, added to the defaults.

The step limit and the latency ceiling still come from the agent's requirements (the caller passes
them in `base`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

from tracing import signals

PHRASE_LIST_NAMES: Final[tuple[str, ...]] = tuple(item.name for item in dataclasses.fields(signals.PhraseLists))
PHRASE_MODES: Final = ("extend", "replace")
MAX_PHRASES_PER_LIST: Final = 500
MAX_PHRASE_CHARS: Final = 200

# name -> (minimum, maximum, integer?)
EXPOSED_THRESHOLDS: Final[Mapping[str, tuple[float, float, bool]]] = {
    "rephrase_token_jaccard": (0.0, 1.0, False),
    "rephrase_trigram_jaccard": (0.0, 1.0, False),
    "repetition_trigram_jaccard": (0.0, 1.0, False),
    "no_progress_turns": (2, 50, True),
    "loop_repeats": (2, 50, True),
    "loop_pattern_repeats": (2, 50, True),
    "infinite_loop_repeats": (3, 100, True),
    "goal_drift_max_overlap": (0.0, 1.0, False),
    "context_window_ratio": (0.5, 1.0, False),
}
THRESHOLD_HELP: Final[Mapping[str, str]] = {
    "rephrase_token_jaccard": "Two user turns this similar (token Jaccard) count as a rephrase.",
    "rephrase_trigram_jaccard": "Or this similar by character trigrams.",
    "repetition_trigram_jaccard": "An answer this similar to one of the previous two is a repetition.",
    "no_progress_turns": "Answers in a row that add little new content: stagnation.",
    "loop_repeats": "Identical tool calls in a row that make a loop.",
    "loop_pattern_repeats": "Repeats of a multi-tool pattern that make a loop.",
    "infinite_loop_repeats": "Repetitions that make a loop an infinite loop.",
    "goal_drift_max_overlap": "The final answer sharing at most this share of the request's words is goal drift.",
    "context_window_ratio": "Input tokens past this share of the context window: exhaustion.",
}
# name -> help; whole numbers >= 1, None to leave unset.
LIMITS: Final[Mapping[str, str]] = {
    "context_window_tokens": "The model's context window, in tokens.",
    "max_output_tokens": "The output token limit of one model call.",
    "token_budget": "Tokens one trajectory may spend in all.",
}
MAX_LANGUAGE_CHARS: Final = 16


def _problem(field: str, message: str) -> dict[str, str]:
    return {"field": field, "message": message}


def _phrase_problems(phrases: Any) -> list[dict[str, str]]:
    if not isinstance(phrases, Mapping):
        return [_problem("phrases", "must be an object: language -> list name -> {mode, phrases}")]
    problems: list[dict[str, str]] = []
    for language, lists in phrases.items():
        if not isinstance(language, str) or not language.strip() or len(language) > MAX_LANGUAGE_CHARS:
            problems.append(_problem("phrases", f"language {language!r}: 1 to {MAX_LANGUAGE_CHARS} characters"))
            continue
        if not isinstance(lists, Mapping):
            problems.append(_problem(f"phrases.{language}", "must be an object of lists"))
            continue
        for name, entry in lists.items():
            field = f"phrases.{language}.{name}"
            if name not in PHRASE_LIST_NAMES:
                problems.append(_problem(field, f"unknown list; one of {', '.join(PHRASE_LIST_NAMES)}"))
                continue
            if not isinstance(entry, Mapping) or entry.get("mode") not in PHRASE_MODES:
                problems.append(_problem(field, 'must be {"mode": "extend" or "replace", "phrases": [...]}'))
                continue
            items = entry.get("phrases")
            if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
                problems.append(_problem(field, "phrases must be a list of strings"))
            elif len(items) > MAX_PHRASES_PER_LIST:
                problems.append(_problem(field, f"at most {MAX_PHRASES_PER_LIST} phrases"))
            elif any(not item.strip() or len(item) > MAX_PHRASE_CHARS for item in items):
                problems.append(_problem(field, f"each phrase: 1 to {MAX_PHRASE_CHARS} characters"))
    return problems


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def settings_problems(
    *,
    language: Any,
    phrases: Any,
    weights: Any,
    thresholds: Any,
    limits: Any,
    handoff_tools: Any,
) -> list[dict[str, str]]:
    """What is wrong with these settings, one `{"field", "message"}` per problem; empty when valid."""
    problems: list[dict[str, str]] = []
    if not isinstance(language, str) or not language.strip() or len(language) > MAX_LANGUAGE_CHARS:
        problems.append(_problem("language", f"1 to {MAX_LANGUAGE_CHARS} characters, e.g. en, de"))
    problems.extend(_phrase_problems(phrases))
    if not isinstance(weights, Mapping):
        problems.append(_problem("weights", "must be an object: signal -> weight"))
    else:
        for name, weight in weights.items():
            if name not in signals.SIGNAL_NAMES:
                problems.append(_problem(f"weights.{name}", "unknown signal"))
            elif (number := _number(weight)) is None or not -1.0 <= number <= 1.0:
                problems.append(_problem(f"weights.{name}", "a number from -1 to 1"))
    if not isinstance(thresholds, Mapping):
        problems.append(_problem("thresholds", "must be an object: name -> number"))
    else:
        for name, value in thresholds.items():
            bounds = EXPOSED_THRESHOLDS.get(name)
            if bounds is None:
                problems.append(
                    _problem(f"thresholds.{name}", f"not adjustable; one of {', '.join(EXPOSED_THRESHOLDS)}")
                )
                continue
            low, high, whole = bounds
            number = _number(value)
            if number is None or not low <= number <= high or (whole and not number.is_integer()):
                kind = "a whole number" if whole else "a number"
                problems.append(_problem(f"thresholds.{name}", f"{kind} from {low:g} to {high:g}"))
    if not isinstance(limits, Mapping):
        problems.append(_problem("limits", "must be an object: name -> whole number"))
    else:
        for name, value in limits.items():
            if name not in LIMITS:
                problems.append(_problem(f"limits.{name}", f"unknown limit; one of {', '.join(LIMITS)}"))
            elif value is not None and ((number := _number(value)) is None or number < 1 or not number.is_integer()):
                problems.append(_problem(f"limits.{name}", "a whole number of at least 1, or null"))
    if not isinstance(handoff_tools, list) or not all(
        isinstance(name, str) and name.strip() and len(name) <= 300 for name in handoff_tools
    ):
        problems.append(_problem("handoff_tools", "a list of tool names"))
    return problems


def _merged(base: Sequence[str], added: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys([*base, *(phrase.strip() for phrase in added)]))


def phrase_lists_build(overrides: Mapping[str, Any], base: signals.PhraseLists) -> signals.PhraseLists:
    """One language's lists: `base` with each overridden list extended or replaced."""
    changes: dict[str, Any] = {}
    for name, entry in overrides.items():
        given = [phrase.strip() for phrase in entry["phrases"]]
        if name == "stopwords":
            words = frozenset(phrase.lower() for phrase in given)
            changes[name] = base.stopwords | words if entry["mode"] == "extend" else words
        else:
            current: tuple[str, ...] = getattr(base, name)
            changes[name] = _merged(current, given) if entry["mode"] == "extend" else tuple(dict.fromkeys(given))
    return dataclasses.replace(base, **changes)


def signal_config_build(
    base: signals.SignalConfig,
    *,
    language: str = "en",
    phrases: Mapping[str, Mapping[str, Any]] | None = None,
    weights: Mapping[str, float] | None = None,
    thresholds: Mapping[str, float] | None = None,
    limits: Mapping[str, int | None] | None = None,
    handoff_tools: Sequence[str] = (),
) -> signals.SignalConfig:
    """`base` (the defaults, with the limits the requirements set) changed by valid settings."""
    languages: dict[str, signals.PhraseLists] = dict(base.phrases)
    for code, lists in (phrases or {}).items():
        start = languages.get(code) or signals.DEFAULT_PHRASES.get(code) or signals.ENGLISH_PHRASES
        languages[code] = phrase_lists_build(lists, start)
    tuned: dict[str, Any] = {}
    for name, value in (thresholds or {}).items():
        tuned[name] = int(value) if EXPOSED_THRESHOLDS[name][2] else float(value)
    limit_values = {name: int(value) for name, value in (limits or {}).items() if value is not None}
    return dataclasses.replace(
        base,
        context_window_tokens=limit_values.get("context_window_tokens", base.context_window_tokens),
        max_output_tokens=limit_values.get("max_output_tokens", base.max_output_tokens),
        token_budget=limit_values.get("token_budget", base.token_budget),
        language=language,
        phrases=languages,
        weights={**signals.DEFAULT_WEIGHTS, **dict(weights or {})},
        thresholds=dataclasses.replace(base.thresholds, **tuned),
        handoff_tools=base.handoff_tools | frozenset(name.strip() for name in handoff_tools),
    )
