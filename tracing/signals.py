"""Triage signals: cheap, model-free detectors over a `TrajectoryView`. Pure module, no Django.

The layer rule: this module reads a `tracing.steps.TrajectoryView` and a `SignalConfig` and returns
values; it imports nothing from Django and touches no database, so it runs in the ingest path, in a
bulk recompute, in a notebook and in `bench/` alike. An import-linter contract holds it to that.

Taxonomy (after Chen et al., 2026, "Signals: Trajectory Sampling and Triage for Agentic
Interactions", plus the failure modes of the agent-lifecycle series, step 07):

| category | signal | kinds (`SignalInstance.kind`) |
|---|---|---|
| interaction | `misalignment` | correction, rephrase, clarification |
| interaction | `stagnation` | repetition, no_progress |
| interaction | `disengagement` | quit, human_request, negative_stance, unanswered_question, left_after_error |
| interaction | `satisfaction` | gratitude, confirmation, success |
| execution | `failure` | span_error, status_field, error_key, http_status, exit_code, exception_text |
| execution | `loop` | retry, cycling_arguments, repeated_pattern |
| environment | `exhaustion` | context_overflow, rate_limit, max_steps, timeout, token_budget, truncated_output |
| failure_mode | `hallucinated_tool_call` | unknown_tool, schema_violation, invalid_arguments |
| failure_mode | `context_exhaustion` | context_overflow |
| failure_mode | `cascading_error` | error_consumed |
| failure_mode | `goal_drift` | off_request |
| failure_mode | `silent_tool_api_change` | result_shape_changed |
| failure_mode | `infinite_loop` | hard_threshold, loop_at_step_limit |

Rules worth knowing:

- Errors caused by the environment (rate limits, timeouts, context overflow, budgets) are
  `exhaustion`, not `failure`: `failure` means the agent or its tools did something wrong.
- A correct hand-off to a human (a call to one of `SignalConfig.handoff_tools`, or the assistant
  announcing a transfer) is never a failure; it raises `disengagement/human_request` only when the
  user asked for a person.
- Giving up and negative stance are read only in user turns after the agent's first turn: an opening
  "please cancel my account" is the task and "the app doesn't work" the problem, not disengagement.
  Corrections, rephrases and satisfaction are read after the agent's first turn too.
- `disengagement/unanswered_question` is the user's question that the agent never answers: the finished
  trajectory ends on it, after the agent worked on it or with no model call reading it (a run stopped by a
  limit is `exhaustion` instead; a hand-off is an answer). A trajectory that ends on the agent's question
  ("Which booking do you mean?") is not flagged: asking is a normal turn, and a team that traces one
  request per trace gets the user's answer in the session's next trajectory.
- `disengagement/left_after_error` is the conversation ending right after the agent reports a failure, with
  the user not coming back. For a team that traces one request per trace (Keel's gateway does), only the
  session tells whether the user came back: a caller that knows the trajectory's session (same workspace,
  same non-empty `session_id`) has a later trajectory, one started after it, passes
  `signals_compute(..., session_continues=True)` and the flag is not raised. The view alone cannot tell;
  the default, False, reads the trajectory as the whole conversation.
- A tool result is a failure by its structure: an error status, flag, code or field, or a text that is an
  error message (its first line opens like one, or its last line is how a failing program ends). Error
  words or an HTTP status inside prose ("HTTP 404 means the resource was not found") are not a failure.
- A system message after the user has spoken opens another model call's context (a chain step, a
  sub-agent); the "user" messages given to it are the orchestrator's, not the user's, and are not read.
- Phrase lists live in one place, `ENGLISH_PHRASES`; an agent can replace them or add languages
  through `SignalConfig.phrases` and pick one with `SignalConfig.language`. Matching is on whole
  words after lower-casing and replacing punctuation with spaces, so "No, I meant" matches "no i meant".
- Every text is cut to `Thresholds.max_text_chars` (head and tail kept) before any matching or
  similarity, and tool results are walked with a node budget, so a 1 MB tool result costs little.

Severity: each instance has `severity` in [0, 1] and a `level`: "error" from 0.75, "warning" from
0.45, else "info" (satisfaction is always "info").

Triage score (`triage_score`), in [0, 1]. For each signal, its strength is the noisy-OR of its
instances' severities, `1 - prod(1 - severity)`, so a second instance adds less than the first and
no count of instances runs away. Signals with a positive weight `w` combine as a noisy-OR too:
`problem = 1 - prod(1 - w * strength)`. Signals with a negative weight damp the result:
`score = problem * prod(1 - |w| * strength)`. Nothing depends on the trajectory's length. Default
weights (`DEFAULT_WEIGHTS`, replace any of them with `SignalConfig.weights`):

| signal | weight | | signal | weight |
|---|---|---|---|---|
| hallucinated_tool_call | 0.80 | | misalignment | 0.60 |
| infinite_loop | 0.80 | | disengagement | 0.55 |
| cascading_error | 0.75 | | goal_drift | 0.50 |
| failure | 0.60 | | exhaustion | 0.45 |
| loop | 0.60 | | stagnation | 0.40 |
| context_exhaustion | 0.60 | | satisfaction | -0.30 |
| silent_tool_api_change | 0.60 | | | |

Default thresholds are the fields of `Thresholds`; the ones that decide most:

- rephrase: two consecutive user turns of >= 3 content tokens (stopwords removed) with token Jaccard
  >= 0.6, or an overlap coefficient >= 0.75 when both have >= 4 tokens, or character-trigram Jaccard
  >= 0.7; not when the later turn answers the agent ("yes", "ok"...), opens a follow-up ("now",
  "also", "what about"...) or brings a new number (2024 after 2023).
- repetition: an answer (>= 3 content tokens) with trigram Jaccard >= 0.85 to one of the previous two
  answers, with no new tool call in between; no progress: 3 answers in a row, without new tool calls,
  that each add < 30% new content tokens.
- loop: 3 identical calls (name, arguments and result) in a row; 4 calls of one tool that repeat at
  most 2 (arguments, result) pairs; or a 2-4 call pattern of >= 2 tools repeated 3 times. Polling
  whose results change and searches with new arguments are not loops.
- infinite loop: a loop of >= 6 repetitions, or a loop ending the run when a step, time or token
  limit was hit.
- goal drift: the final answer of >= 8 content tokens shares <= 10% of the content stems of the first
  and of the last user request (whichever is higher); hand-offs and error reports are not judged.
- cascading error: an id-like token (letters and digits, >= 5 characters) that first appears in a
  failed call's output and is then passed to a later call or stated in an answer that does not
  acknowledge the error.

What is read from the view: the message steps (user turns, history), the LLM calls' output messages
(answers, requested tool calls, `finish_reason` when present) and usage, the tool calls (arguments,
results, status, error), step errors, agent/chain outputs (`termination_reason`, `stop_reason`...),
the tool definitions and the totals. A user message that no LLM call read reaches the view when an
agent span (or the JSON ingest's root span) holds the whole message list; one that no span holds at
all cannot be seen.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from functools import lru_cache
from types import MappingProxyType
from typing import Any, Final, Generic, Literal, NamedTuple, TypeVar

from tracing.steps import Step, TrajectoryView, sorted_json

SignalCategory = Literal["interaction", "execution", "environment", "failure_mode"]
SeverityLevel = Literal["info", "warning", "error"]

SIGNAL_CATEGORIES: Final[Mapping[str, SignalCategory]] = MappingProxyType(
    {
        "misalignment": "interaction",
        "stagnation": "interaction",
        "disengagement": "interaction",
        "satisfaction": "interaction",
        "failure": "execution",
        "loop": "execution",
        "exhaustion": "environment",
        "hallucinated_tool_call": "failure_mode",
        "context_exhaustion": "failure_mode",
        "cascading_error": "failure_mode",
        "goal_drift": "failure_mode",
        "silent_tool_api_change": "failure_mode",
        "infinite_loop": "failure_mode",
    }
)
SIGNAL_NAMES: Final[tuple[str, ...]] = tuple(SIGNAL_CATEGORIES)

DEFAULT_WEIGHTS: Final[Mapping[str, float]] = MappingProxyType(
    {
        "hallucinated_tool_call": 0.8,
        "infinite_loop": 0.8,
        "cascading_error": 0.75,
        "failure": 0.6,
        "loop": 0.6,
        "context_exhaustion": 0.6,
        "silent_tool_api_change": 0.6,
        "misalignment": 0.6,
        "disengagement": 0.55,
        "goal_drift": 0.5,
        "exhaustion": 0.45,
        "stagnation": 0.4,
        "satisfaction": -0.3,
    }
)

DEFAULT_HANDOFF_TOOLS: Final[frozenset[str]] = frozenset(
    (
        "transfer_to_human",
        "transfer_to_human_agents",
        "escalate_to_human",
        "handoff_to_human",
        "request_human_review",
        "create_support_ticket",
    )
)


# --- Phrase lists (English defaults) --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PhraseLists:
    """The phrases of one language. Matched as whole words after normalisation (see the module docstring)."""

    # User turns.
    correction: tuple[str, ...]
    rephrase: tuple[str, ...]
    clarification: tuple[str, ...]
    follow_up: tuple[str, ...]  # openers of a new, related request: not a rephrase
    answer_prefix: tuple[str, ...]  # openers of an answer to the agent's question: not a rephrase
    quit: tuple[str, ...]
    human_request: tuple[str, ...]
    negative: tuple[str, ...]
    gratitude: tuple[str, ...]
    confirmation: tuple[str, ...]
    success: tuple[str, ...]
    # Assistant turns.
    # "anything else?" ends a task. No detector reads it since an answer ending on the agent's question is
    # no signal; kept so that stored settings that change it still apply.
    closing_question: tuple[str, ...]
    error_report: tuple[str, ...]  # the assistant telling the user something failed
    handoff: tuple[str, ...]  # the assistant announcing a transfer to a person
    acknowledgement: tuple[str, ...]  # words that show the assistant noticed an error
    stopwords: frozenset[str]


_HUMAN_VERBS: Final = (
    "speak to",
    "speak with",
    "talk to",
    "talk with",
    "connect me to",
    "connect me with",
    "transfer me to",
    "put me through to",
    "get me",
    "chat with",
    "i want",
    "i need",
    "let me talk to",
)
_HUMAN_TARGETS: Final = (
    "a human",
    "a person",
    "a real person",
    "a live agent",
    "a human agent",
    "a supervisor",
    "your supervisor",
    "a manager",
    "the manager",
    "your manager",
    "a representative",
    "customer service",
    "someone real",
)


def _words(text: str) -> list[str]:
    return text.split()


_STOPWORDS: Final = frozenset(
    _words(
        """
        a about above after again against all also am an and any are aren't as at be because been before being
        below between both but by can can't cannot could couldn't did didn't do does doesn't doing don't down
        during each few for from further get got had hadn't has hasn't have haven't having he he'd he'll he's
        her here here's hers herself him himself his how how's i i'd i'll i'm i've if in into is isn't it it's
        its itself just let let's like me more most mustn't my myself no nor not now of off on once only or
        other ought our ours ourselves out over own please same shan't she she'd she'll she's should shouldn't
        so some such than that that's the their theirs them themselves then there there's these they they'd
        they'll they're they've this those through to too under until up us very was wasn't we we'd we'll we're
        we've were weren't what what's when when's where where's which while who who's whom why why's will with
        won't would wouldn't you you'd you'll you're you've your yours yourself yourselves yes yeah ok okay sure
        thanks thank hi hello hey sorry great good well one two also really still want need could would can may
        might must shall will just know think see look make go going done
        """
    )
)

ENGLISH_PHRASES: Final = PhraseLists(
    correction=(
        "no i meant",
        "no i mean",
        "i meant",
        "that's not what i asked",
        "that is not what i asked",
        "not what i asked for",
        "that's not what i wanted",
        "not what i meant",
        "i already told you",
        "i already said",
        "as i said",
        "like i said",
        "i said",
        "you misunderstood",
        "you misunderstand",
        "you got it wrong",
        "that's wrong",
        "that is wrong",
        "that's not right",
        "that's incorrect",
        "that is incorrect",
        "wrong one",
        "not that one",
        "i didn't ask for",
        "i never asked",
        "that's not it",
        "read my message again",
    ),
    rephrase=(
        "let me rephrase",
        "to rephrase",
        "in other words",
        "let me try again",
        "let me put it another way",
        "what i'm asking is",
        "what i am asking is",
        "what i'm trying to say",
        "to be clear",
        "to clarify",
    ),
    clarification=(
        "i don't understand",
        "i do not understand",
        "what do you mean",
        "that makes no sense",
        "that doesn't make sense",
        "makes no sense",
        "i'm confused",
        "say that again",
    ),
    follow_up=(
        "now",
        "next",
        "also",
        "and",
        "what about",
        "how about",
        "same for",
        "same thing for",
        "another",
        "one more",
        "then",
    ),
    answer_prefix=(
        "yes",
        "yeah",
        "yep",
        "ok",
        "okay",
        "sure",
        "correct",
        "right",
        "exactly",
        "no thanks",
        "no thank you",
        "great",
        "perfect",
        "thanks",
        "thank you",
    ),
    quit=(
        "i give up",
        "forget it",
        "forget about it",
        "screw this",
        "why bother",
        "this is pointless",
        "i'm done with this",
        "i'll go elsewhere",
        "going elsewhere",
        "i'll do it myself",
        "waste of my time",
        "cancel my account",
    ),
    human_request=(
        *(f"{verb} {target}" for verb in _HUMAN_VERBS for target in _HUMAN_TARGETS),
        "escalate this",
        "human please",
        "real person please",
        "agent please",
        "representative please",
    ),
    negative=(
        "this is useless",
        "you're useless",
        "you are useless",
        "useless",
        "waste of time",
        "ridiculous",
        "terrible",
        "awful",
        "horrible",
        "frustrating",
        "annoying",
        "not helpful",
        "unhelpful",
        "still not working",
        "still doesn't work",
        "doesn't work",
        "does not work",
        "didn't work",
        "unacceptable",
        "worst experience",
        "worst service",
        "stupid",
        "thanks for nothing",
        "are you kidding",
        "seriously",
        "already tried that",
    ),
    gratitude=(
        "thank you",
        "thanks",
        "thx",
        "ty",
        "much appreciated",
        "appreciate it",
        "i appreciate",
        "that's helpful",
        "that was helpful",
        "very helpful",
        "you're the best",
        "cheers",
    ),
    confirmation=(
        "that works",
        "sounds good",
        "looks good",
        "looks great",
        "that's great",
        "that's perfect",
        "perfect",
        "exactly what i needed",
        "that's right",
        "that is right",
        "that's correct",
        "love it",
        "great job",
        "awesome",
    ),
    success=(
        "it worked",
        "that worked",
        "it works",
        "it's working",
        "works now",
        "working now",
        "that fixed it",
        "fixed it",
        "problem solved",
        "all set",
        "got it thanks",
        "received it",
    ),
    closing_question=(
        "anything else",
        "something else",
        "help you with today",
        "can i help with",
        "can i help you with",
        "let me know",
        "would you like me to also",
        "want me to also",
        "shall i also",
        "any other questions",
        "any further questions",
        "have a great day",
    ),
    error_report=(
        "something went wrong",
        "an error occurred",
        "ran into an error",
        "encountered an error",
        "i was unable to",
        "i wasn't able to",
        "i was not able to",
        "i couldn't complete",
        "i could not complete",
        "failed to",
        "is currently unavailable",
        "is down right now",
        "not able to complete",
    ),
    handoff=(
        "transfer you to",
        "transferring you to",
        "connect you with",
        "connecting you with",
        "connect you to",
        "connecting you to",
        "escalated this",
        "escalated your",
        "escalating this",
        "escalating your",
        "handed this over",
        "a human agent",
        "a specialist will",
        "a member of our team will",
        "a colleague will",
    ),
    acknowledgement=(
        "error",
        "failed",
        "fail",
        "failure",
        "problem",
        "issue",
        "unable",
        "couldn't",
        "could not",
        "sorry",
        "unfortunately",
        "went wrong",
        "did not work",
        "didn't work",
    ),
    stopwords=_STOPWORDS,
)

DEFAULT_PHRASES: Final[Mapping[str, PhraseLists]] = MappingProxyType({"en": ENGLISH_PHRASES})


# --- Configuration ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Thresholds:
    max_text_chars: int = 2000
    similarity_chars: int = 800
    snippet_chars: int = 160
    max_snippets: int = 3
    max_evidence_steps: int = 20
    max_turns: int = 200
    max_tool_calls: int = 500
    result_node_budget: int = 400
    rephrase_min_tokens: int = 3
    rephrase_token_jaccard: float = 0.6
    rephrase_trigram_jaccard: float = 0.7
    rephrase_overlap_coefficient: float = 0.75  # shared / smaller set, for turns of >= 4 content tokens
    repetition_min_tokens: int = 3
    repetition_trigram_jaccard: float = 0.85
    no_progress_turns: int = 3
    novelty_min_ratio: float = 0.3
    loop_repeats: int = 3
    loop_cycle_min_run: int = 4
    loop_pattern_repeats: int = 3
    infinite_loop_repeats: int = 6
    goal_drift_max_overlap: float = 0.1
    goal_drift_min_answer_tokens: int = 8
    goal_drift_min_request_tokens: int = 3
    cascade_min_marker_chars: int = 5
    context_window_ratio: float = 0.95


@dataclass(frozen=True, slots=True)
class SignalConfig:
    """Per-agent settings. Every field has a default, so `SignalConfig()` is the plain English setup.

    - `known_tools`: tool name -> JSON schema of its arguments (or None when only the name is known),
      added to the definitions the trajectory itself carries.
    - `tool_result_shapes`: tool name -> result shapes seen before (`tool_result_shape` of past results),
      the history the silent-API-change detector compares against.
    - `max_steps` (LLM calls), `context_window_tokens`, `max_output_tokens`, `token_budget`,
      `time_budget_seconds`: the agent's limits; a trajectory that reaches one is exhausted.
    - `weights`: signal -> weight for the triage score; missing signals take `DEFAULT_WEIGHTS`.
    """

    language: str = "en"
    phrases: Mapping[str, PhraseLists] = field(default_factory=lambda: DEFAULT_PHRASES)
    thresholds: Thresholds = field(default_factory=Thresholds)
    known_tools: Mapping[str, Mapping[str, Any] | None] = field(default_factory=dict)
    tool_result_shapes: Mapping[str, Sequence[Mapping[str, str]]] = field(default_factory=dict)
    handoff_tools: frozenset[str] = DEFAULT_HANDOFF_TOOLS
    max_steps: int | None = None
    context_window_tokens: int | None = None
    max_output_tokens: int | None = None
    token_budget: int | None = None
    time_budget_seconds: float | None = None
    weights: Mapping[str, float] = field(default_factory=lambda: DEFAULT_WEIGHTS)

    @property
    def phrase_lists(self) -> PhraseLists:
        return self.phrases.get(self.language) or self.phrases.get("en") or ENGLISH_PHRASES

    def weight(self, signal: str) -> float:
        value = self.weights.get(signal)
        return DEFAULT_WEIGHTS.get(signal, 0.0) if value is None else value


DEFAULT_CONFIG: Final = SignalConfig()


# --- Results ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SignalInstance:
    """One occurrence of a signal, with the steps and quoted text that show it."""

    signal: str
    kind: str
    category: SignalCategory
    severity: float
    level: SeverityLevel
    step_indices: tuple[int, ...]
    snippets: tuple[str, ...]
    why: str


@dataclass(frozen=True, slots=True)
class DetectorError:
    """A detector that raised; the others still ran."""

    detector: str
    message: str


@dataclass(frozen=True, slots=True)
class SignalReport:
    instances: tuple[SignalInstance, ...]
    detector_errors: tuple[DetectorError, ...]
    counts: Mapping[str, int]  # signal -> number of instances, only signals that fired
    triage_score: float
    # The shapes of the results `silent_tool_api_change` judges; only when a `tool_result_history` was given.
    result_shapes: tuple[ResultShape, ...] = ()

    @property
    def signals(self) -> frozenset[str]:
        return frozenset(self.counts)


Detector = Callable[["_Analysis"], list[SignalInstance]]


# --- Text helpers ----------------------------------------------------------------------------------------

# The role of a "user" message that an orchestrator gave to a later model call (see `_Analysis.turns`).
HANDED_ON_ROLE: Final = "handed_on"
_QUOTES: Final = str.maketrans({"\u2019": "'", "\u2018": "'", "\u201c": '"', "\u201d": '"'})
# A word: a run of word characters and apostrophes. Found with findall, half the time of replacing what
# lies between the words with spaces and splitting on them.
_WORD: Final = re.compile(r"[\w']+")
_ALL_CAPS_LETTERS: Final = 10


def _bound(text: str, limit: int) -> str:
    """Head and tail of an over-long text: errors tend to sit at either end."""
    if len(text) <= limit:
        return text
    head = limit // 2
    return text[:head] + " … " + text[len(text) - (limit - head) :]


# `_WORD`'s words of an ASCII text: every other character turned into a space, then split. A third of the
# expression's time (measured on the lower-cased text of a 366-character message: 5.4 against 14.6 µs).
_ASCII_NON_WORD: Final = str.maketrans(
    {chr(code): " " for code in range(128) if not (chr(code).isalnum() or chr(code) in "_'")}
)


def _normalize(text: str) -> str:
    """Lower-cased words separated by single spaces, padded with a space on each side."""
    text = text.lower()
    words = text.translate(_ASCII_NON_WORD).split() if text.isascii() else _WORD.findall(text.translate(_QUOTES))
    return " " + " ".join(words) + " " if words else " "


def _content_text(content: Any, limit: int) -> str:
    """The text of a message's content: a string, a list of parts, or a part; other content is ignored."""
    if content is None:
        return ""
    if isinstance(content, str):
        return _bound(content, limit)
    if isinstance(content, dict):
        for key in ("text", "content"):
            value = content.get(key)
            if isinstance(value, str):
                return _bound(value, limit)
        return ""
    if isinstance(content, (list, tuple)):
        texts: list[str] = []
        size = 0
        for part in content[:50]:
            text = _content_text(part, limit) if isinstance(part, (str, dict)) else ""
            if text:
                texts.append(text)
                size += len(text)
                if size >= limit:
                    break
        return _bound("\n".join(texts), limit)
    return ""


def _value_text(value: Any, limit: int, budget: int) -> str:
    """A bounded flat text of any JSON-like value: keys and scalars, walked with a node budget."""
    if isinstance(value, str):
        return _bound(value, limit)
    parts: list[str] = []
    size = 0
    stack: list[Any] = [value]
    nodes = 0
    while stack and nodes < budget and size < limit:
        item = stack.pop()
        nodes += 1
        if isinstance(item, str):
            piece = item[: limit - size]
        elif isinstance(item, dict):
            for key, child in reversed(list(item.items())[:budget]):
                stack.append(child)
                stack.append(f"{key}:")
            continue
        elif isinstance(item, (list, tuple)):
            stack.extend(reversed(item[:budget]))
            continue
        elif item is None:
            piece = "null"
        else:
            piece = str(item)
        parts.append(piece)
        size += len(piece) + 1
    return " ".join(parts)


def _snippet(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


@lru_cache(maxsize=4096)
def _split(normalized_text: str) -> list[str]:
    return normalized_text.split()


_CombinedIndex = dict[str, tuple[tuple[list[str], str], ...]]
_COMBINED_INDEXES: dict[int, tuple[PhraseLists, _CombinedIndex]] = {}


def _combined_index(phrases: PhraseLists) -> _CombinedIndex:
    """First word -> (phrase words, list name) over every list, longest first; one scan serves all lists."""
    cached = _COMBINED_INDEXES.get(id(phrases))
    if cached is not None and cached[0] is phrases:
        return cached[1]
    index: dict[str, list[tuple[list[str], str]]] = {}
    for item in fields(phrases):
        value = getattr(phrases, item.name)
        if not isinstance(value, tuple):
            continue
        for phrase in value:
            words = _normalize(phrase).split()
            if words:
                index.setdefault(words[0], []).append((words, item.name))
    combined = {
        first: tuple(sorted(group, key=lambda entry: len(entry[0]), reverse=True)) for first, group in index.items()
    }
    if len(_COMBINED_INDEXES) > 64:
        _COMBINED_INDEXES.clear()
    _COMBINED_INDEXES[id(phrases)] = (phrases, combined)
    return combined


def _scan(index: _CombinedIndex, normalized_text: str) -> tuple[dict[str, str], set[str]]:
    """Per list, its leftmost (then longest) phrase in the text; and the lists that open the text."""
    first: dict[str, str] = {}
    opening: set[str] = set()
    words = _split(normalized_text)
    lookup = index.get
    for position, word in enumerate(words):
        candidates = lookup(word)
        if candidates is None:
            continue
        for candidate, name in candidates:
            if words[position : position + len(candidate)] == candidate:
                if name not in first:
                    first[name] = " ".join(candidate)
                if position == 0:
                    opening.add(name)
    return first, opening


def _tokens(normalized_text: str, stopwords: frozenset[str]) -> list[str]:
    words = _split(normalized_text)
    if "'" in normalized_text:
        words = [word.strip("'").removesuffix("'s") for word in words]
    return [word for word in words if word and word not in stopwords and (len(word) > 1 or word.isdigit())]


@lru_cache(maxsize=16384)
def _stem(token: str) -> str:
    # Crude English suffix stripping: enough to meet "refunds" with "refund", "booked" with "booking".
    for suffix in ("ings", "ing", "ed", "es", "s"):
        if len(token) > len(suffix) + 2 and token.endswith(suffix):
            return token[: -len(suffix)]
    return token


def _trigrams(normalized_text: str, limit: int) -> frozenset[str]:
    text = normalized_text.strip()[:limit]
    return frozenset(text[i : i + 3] for i in range(max(len(text) - 2, 0)))


def _jaccard(left: frozenset[str] | set[str], right: frozenset[str] | set[str]) -> float:
    if not left or not right:
        return 0.0
    shared = len(left & right)
    return shared / (len(left) + len(right) - shared)


def _level(severity: float) -> SeverityLevel:
    return "error" if severity >= 0.75 else "warning" if severity >= 0.45 else "info"


def _canonical(value: Any, limit: int) -> str:
    """Arguments as comparable text: JSON with sorted keys; text that is JSON is parsed first."""
    if isinstance(value, str):
        if value[:1] in ("{", "[") and len(value) <= 20_000:
            try:
                value = json.loads(value)
            except (ValueError, RecursionError):
                return _bound(value, limit)
        else:
            return _bound(value, limit)
    try:
        text = sorted_json(value)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    return _bound(text, limit)


def _parsed(value: Any) -> Any:
    if isinstance(value, str) and value[:1] in ("{", "[") and len(value) <= 200_000:
        try:
            return json.loads(value)
        except (ValueError, RecursionError):
            return value
    return value


# --- Tool results: errors, exhaustion, shape ------------------------------------------------------------

_STATUS_KEYS: Final = ("status", "state", "result", "outcome")
_ERROR_STATUS_VALUES: Final = frozenset(("error", "failed", "failure", "fail", "exception", "fatal", "errored"))
_SUCCESS_FLAG_KEYS: Final = ("ok", "success", "succeeded", "successful")
_ERROR_FLAG_KEYS: Final = ("is_error", "isError", "failed", "has_error")
_ERROR_KEYS: Final = ("error", "errors", "exception", "error_message", "errorMessage", "err", "fault", "traceback")
_HTTP_KEYS: Final = ("status_code", "statusCode", "http_status", "httpStatus", "response_code", "status")
_EXIT_KEYS: Final = ("exit_code", "exitCode", "returncode", "return_code")
_ENVELOPE_KEYS: Final = ("response", "result", "data", "body", "payload")
_TELLING_CATEGORY: Final[Mapping[str, str]] = MappingProxyType(
    {
        **dict.fromkeys(_ENVELOPE_KEYS, "envelope"),
        **dict.fromkeys(_STATUS_KEYS, "status"),  # "result" is a status text or an envelope
        **dict.fromkeys(_SUCCESS_FLAG_KEYS, "success_flag"),
        **dict.fromkeys(_ERROR_FLAG_KEYS, "error_flag"),
        **{key: "http" for key in _HTTP_KEYS if key != "status"},
        "code": "code",
        **dict.fromkeys(_EXIT_KEYS, "exit"),
        **dict.fromkeys(_ERROR_KEYS, "error"),
    }
)
_TELLING_KEYS: Final = frozenset(_TELLING_CATEGORY)
_TELLING_ORDER: Final[Mapping[str, int]] = MappingProxyType(
    {
        key: position
        for position, key in enumerate(
            (
                *_STATUS_KEYS,
                *_SUCCESS_FLAG_KEYS,
                *_ERROR_FLAG_KEYS,
                *(key for key in _HTTP_KEYS if key != "status"),
                "code",
                *_EXIT_KEYS,
                *_ERROR_KEYS,
                *(key for key in _ENVELOPE_KEYS if key not in _STATUS_KEYS),
            )
        )
    }
)
_TERMINATION_KEYS: Final = (
    "termination_reason",
    "stop_reason",
    "finish_reason",
    "stopped_reason",
    "exit_reason",
    "status_reason",
)
_EMPTY_ERROR_TEXTS: Final = frozenset(("", "none", "null", "false", "0", "ok", "no", "n/a"))

# A text result failed when it *is* an error message: its first line opens like one, or its last line is how
# a failing program ends. An HTTP status or an error word inside prose is not enough: a documentation search
# that answers "HTTP 404 means the resource was not found" succeeded.
_HTTP_REASONS: Final = (
    r"bad request|unauthori[sz]ed|payment required|forbidden|not found|method not allowed|not acceptable"
    r"|request timeout|conflict|gone|payload too large|unprocessable (?:entity|content)|too many requests"
    r"|internal server error|not implemented|bad gateway|service unavailable|gateway timeout"
    r"|(?:client|server) error"
)
# What may follow an HTTP status that a line reports, rather than explains ("HTTP 404 means ..."): nothing,
# punctuation, a reason phrase or a capitalised word.
_STATUS_REPORTED: Final = r"(?=\s*(?:$|[:,.;\-\u2013]|(?i:" + _HTTP_REASONS + r")\b|[A-Z]))"
_ERROR_OPENING: Final = re.compile(
    "|".join(
        (
            r"(?i:traceback \(most recent call last\)|exception in thread\b)",
            r"(?i:error|fatal|exception|panic|failed|failure)(?:\s*[:!]|\s+[-\u2013]\s)",  # "Error: ...", "fatal: ..."
            r"(?i:error|failed|failure) (?:to|while|when|in|on|during)\b",  # "Failed to connect to db:5432"
            r"(?:ERROR|FATAL)(?=\s*[\d\[(:])",  # "ERROR 2003 (HY000): Can't connect"
            r"(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception|Fault)(?::|\s*$)",  # "ValueError: ...", "a.b.HTTPError: ..."
            r"(?i:HTTP(?:/\d(?:\.\d)?)?(?: error)?:? ?)[45]\d\d\b" + _STATUS_REPORTED,  # "HTTP/1.1 404 Not Found"
            r"(?i:(?:http )?status(?: code)?\s*[:=]?\s*)[45]\d\d\b" + _STATUS_REPORTED,  # "Status: 503"
            r"[45]\d\d\b\s*[:\-]?\s*(?i:" + _HTTP_REASONS + r")\b",  # "404 Not Found", "500 Server Error: ..."
            r"(?i:(?:request )?failed with (?:http )?(?:status(?: code)?|error) [45]\d\d\b)",
            # "Unknown tool: drop_table", "Permission denied (publickey)."; not "Permission denied errors mean ..."
            r"(?i:unknown (?:tool|function)|invalid (?:argument|parameter)s?|segmentation fault|permission denied"
            r"|command not found)(?=\s*(?:$|[:'\"`(,.;!\-]))",
        )
    )
)
_ERROR_CLOSING: Final = re.compile(
    r"(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception|Fault)(?::|\s*$)"  # a traceback's last line
    r"|(?i:(?:error|fatal|panic)\s*[:!])"
    r"|(?i:\S+: .*(?:command not found|no such file or directory|permission denied)\s*$)"  # "bash: x: ..."
    r"|(?i:.*\bexit(?:ed)? (?:with )?(?:code|status) [1-9]\d*\W*$)"
    r"|(?i:segmentation fault)\b"
)


def _text_error(text: str) -> bool:
    """Whether a text result is an error message (see `_ERROR_OPENING` and `_ERROR_CLOSING`)."""
    head = text[:300].lstrip()
    first_line = head.split("\n", 1)[0].strip()
    if first_line and _ERROR_OPENING.match(first_line):
        return True
    last_line = text[-300:].rstrip().rsplit("\n", 1)[-1].strip()
    return bool(last_line) and _ERROR_CLOSING.match(last_line) is not None


# (kind, words one of which must be in the lower-cased text, pattern). The words are a cheap gate:
# substring tests run at C speed, the alternations of the patterns do not.
_EXHAUSTION_PATTERNS: Final[tuple[tuple[str, tuple[str, ...], re.Pattern[str]], ...]] = tuple(
    (kind, words, re.compile(pattern))
    for kind, words, pattern in (
        (
            "context_overflow",
            ("context", "too long", "too many", "token limit"),
            r"context[ _-]?(?:length|window|limit)[ _-]?(?:exceeded|reached|overflow)|maximum context length"
            r"|context_length_exceeded|prompt is too long|input (?:is )?too long|too many (?:input )?tokens"
            r"|token limit (?:exceeded|reached)|exceeds the context",
        ),
        (
            "rate_limit",
            ("rate", "too many", "429", "quota", "throttl", "exhausted"),
            r"rate[ _-]?limit|too many requests|\b(?:http|status|error|code)[ :=]*429\b|\b429 too many"
            r"|quota (?:exceeded|exhausted)|throttl(?:ed|ing)|resource[ _]exhausted",
        ),
        (
            "max_steps",
            ("max", "limit"),
            r"max(?:imum)?[ _-]?(?:steps|iterations|turns|tool[ _]calls)[ _-]?(?:exceeded|reached|hit)"
            r"|(?:step|iteration|turn|recursion) limit|max_iterations|stopped due to iteration limit"
            r"|\bmax[ _-]?(?:steps|iterations|turns)\b",
        ),
        (
            "token_budget",
            ("budget", "quota", "credits"),
            r"token[ _-]?budget|budget (?:exceeded|exhausted)|insufficient[ _]quota|out of credits",
        ),
        (
            "timeout",
            ("deadline", "timed out", "timeout", "time"),
            r"deadline exceeded|timed out|\btimeout\b|time[ _-]?(?:budget|limit)[ _-]?(?:exceeded|reached)",
        ),
        (
            "truncated_output",
            ("finish_reason", "truncated", "max_tokens"),
            r"finish_reason[\"']?\s*[:=]\s*[\"']?length|\boutput (?:was )?truncated|\bmax_tokens\b",
        ),
    )
)


def _exhaustion_kind(text: str) -> str | None:
    if not text:
        return None
    lowered = text.lower()
    for kind, words, pattern in _EXHAUSTION_PATTERNS:
        if any(word in lowered for word in words) and pattern.search(lowered):
            return kind
    return None


def _truthy_error(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        return value.strip().lower() not in _EMPTY_ERROR_TEXTS
    if isinstance(value, (dict, list, tuple)):
        return bool(value)
    # Counts ({"errors": 3} in a lint report) are data, not a failed call.
    return False


def _http_code(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        code = value
    elif isinstance(value, str) and value.strip().isdigit() and len(value.strip()) == 3:
        code = int(value.strip())
    else:
        return None
    return code if 400 <= code <= 599 else None


def _dict_error(result: Mapping[str, Any], depth: int = 0) -> tuple[str, str] | None:
    """(kind, detail) when a structured result says the call failed.

    Only the keys that can tell are looked at, in the order of `_TELLING_ORDER`: a status field first,
    then flags, HTTP codes, exit codes, error keys, and last one level of envelope (`response`, `data`...).
    """
    present = _TELLING_KEYS.intersection(result.keys())
    if not present:
        return None
    for key in sorted(present, key=_TELLING_ORDER.__getitem__):
        value = result[key]
        category = _TELLING_CATEGORY[key]
        if category == "status":
            if isinstance(value, str) and value.strip().lower() in _ERROR_STATUS_VALUES:
                return "status_field", f"{key}={value}"
            # "status" may also hold an HTTP code, and "result" an envelope.
            if key == "status" and _http_code(value) is not None:
                return "http_status", f"{key}={value}"
            if isinstance(value, dict) and depth < 1:
                found = _dict_error(value, depth + 1)
                if found is not None:
                    return found
        elif category == "success_flag":
            if value is False:
                return "status_field", f"{key}=false"
        elif category == "error_flag":
            if value is True:
                return "status_field", f"{key}=true"
        elif category == "http":
            if _http_code(value) is not None:
                return "http_status", f"{key}={value}"
        elif category == "code":
            if _http_code(value) is not None and any(
                name in result for name in ("message", "error", "detail", "reason")
            ):
                return "http_status", f"code={value}"
        elif category == "exit":
            if isinstance(value, int) and not isinstance(value, bool) and value != 0:
                return "exit_code", f"{key}={value}"
        elif category == "error":
            if _truthy_error(value):
                return "error_key", key
        elif isinstance(value, dict) and depth < 1:
            found = _dict_error(value, depth + 1)
            if found is not None:
                return found
    return None


def tool_result_shape(result: Any, *, max_keys: int = 100) -> dict[str, str]:
    """The key shape of a tool result: key path (one level of nesting) -> JSON type name.

    Used to build `SignalConfig.tool_result_shapes` from past results and to compare a new one with them.
    """
    result = _parsed(result)
    if not isinstance(result, dict):
        return {"": _json_type(result)}
    shape: dict[str, str] = {}
    for key, value in list(result.items())[:max_keys]:
        shape[str(key)] = _json_type(value)
        if isinstance(value, dict):
            for inner_key, inner_value in list(value.items())[:max_keys]:
                shape[f"{key}.{inner_key}"] = _json_type(inner_value)
    return shape


class ResultShape(NamedTuple):
    """The shape of one tool result (`tool_result_shape`), and the span that carried the result."""

    tool_name: str
    shape: dict[str, str]
    span_id: str


# Given the shapes of a trajectory's results, the history to compare them with (see `signals_compute`).
ShapeHistory = Callable[[Sequence[ResultShape]], Mapping[str, Sequence[Mapping[str, str]]]]


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "unknown"


# --- JSON schema subset ---------------------------------------------------------------------------------

_TYPE_CHECKS: Final[Mapping[str, Callable[[Any], bool]]] = MappingProxyType(
    {
        "object": lambda value: isinstance(value, dict),
        "array": lambda value: isinstance(value, list),
        "string": lambda value: isinstance(value, str),
        "integer": lambda value: (
            (isinstance(value, int) and not isinstance(value, bool))
            or (isinstance(value, float) and value.is_integer())
        ),
        "number": lambda value: isinstance(value, (int, float)) and not isinstance(value, bool),
        "boolean": lambda value: isinstance(value, bool),
        "null": lambda value: value is None,
    }
)


def schema_violations(value: Any, schema: Any, *, path: str = "$", limit: int = 10) -> list[str]:
    """Violations of the JSON-schema subset tool definitions use.

    Covers `type` (one or a list), `required`, `properties`, `additionalProperties` (false or a schema),
    `enum`, `const`, `items`, `minimum`/`maximum`, `minLength`/`maxLength`, `anyOf`/`oneOf` (as "any of").
    Anything else in the schema is ignored, never an error.
    """
    found: list[str] = []
    _validate(value, schema, path, found, limit, 0)
    return found


_LEAF_SCHEMA_KEYS: Final = frozenset(("type", "description", "title", "default", "examples", "format"))


def _validate(value: Any, schema: Any, path: str, found: list[str], limit: int, depth: int) -> None:
    if not isinstance(schema, dict) or len(found) >= limit or depth > 16:
        return
    choices = schema.get("anyOf") or schema.get("oneOf")
    if (
        isinstance(choices, list)
        and choices
        and all(schema_violations(value, choice, path=path, limit=1) for choice in choices)
    ):
        found.append(f"{path}: matches none of the allowed schemas")
        return
    expected = schema.get("type")
    if isinstance(expected, str):
        expected = [expected]
    if isinstance(expected, list):
        known = [name for name in expected if isinstance(name, str) and name in _TYPE_CHECKS]
        if known and not any(_TYPE_CHECKS[name](value) for name in known):
            found.append(f"{path}: expected {'/'.join(known)}, got {_json_type(value)}")
            return
    enum = schema.get("enum")
    if isinstance(enum, list) and enum and value not in enum:
        found.append(f"{path}: {_snippet(repr(value), 40)} is not one of {_snippet(repr(enum), 60)}")
    if "const" in schema and value != schema["const"]:
        found.append(f"{path}: must be {_snippet(repr(schema['const']), 40)}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        minimum, maximum = schema.get("minimum"), schema.get("maximum")
        if isinstance(minimum, (int, float)) and value < minimum:
            found.append(f"{path}: {value} is below the minimum {minimum}")
        if isinstance(maximum, (int, float)) and value > maximum:
            found.append(f"{path}: {value} is above the maximum {maximum}")
    if isinstance(value, str):
        min_length, max_length = schema.get("minLength"), schema.get("maxLength")
        if isinstance(min_length, int) and len(value) < min_length:
            found.append(f"{path}: shorter than {min_length} characters")
        if isinstance(max_length, int) and len(value) > max_length:
            found.append(f"{path}: longer than {max_length} characters")
    if isinstance(value, dict):
        properties = schema.get("properties")
        properties = properties if isinstance(properties, dict) else {}
        required = schema.get("required")
        if isinstance(required, list):
            for name in required:
                if isinstance(name, str) and name not in value:
                    found.append(f"{path}: missing required property {name!r}")
        additional = schema.get("additionalProperties", True)
        for name, item in value.items():
            if name in properties:
                child = properties[name]
                if isinstance(child, dict) and child.keys() <= _LEAF_SCHEMA_KEYS:
                    # Most tool arguments are a plain typed leaf: check it here, without the full walk.
                    expected_type = child.get("type")
                    check = _TYPE_CHECKS.get(expected_type) if isinstance(expected_type, str) else None
                    if check is not None and not check(item):
                        found.append(f"{path}.{name}: expected {expected_type}, got {_json_type(item)}")
                    continue
                _validate(item, child, f"{path}.{name}", found, limit, depth + 1)
            elif additional is False:
                found.append(f"{path}: unknown property {name!r}")
            elif isinstance(additional, dict):
                _validate(item, additional, f"{path}.{name}", found, limit, depth + 1)
    if isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, dict):
            for position, item in enumerate(value[:100]):
                _validate(item, items, f"{path}[{position}]", found, limit, depth + 1)


# --- Shared reading of one trajectory -------------------------------------------------------------------
# Internal records are named tuples: a trajectory makes dozens of them and they are the cheapest to build.


class _Turn(NamedTuple):
    role: str
    step_index: int | None
    text: str
    normalized: str
    has_tool_calls: bool


class _Call(NamedTuple):
    name: str
    arguments: Any
    arguments_key: str
    result: Any
    step_index: int
    error_kind: str | None
    error_detail: str
    exhaustion_kind: str | None
    is_handoff: bool
    call_id: str | None


class _Requested(NamedTuple):
    name: str
    arguments: Any
    call_id: str | None
    step_index: int


class _Loop(NamedTuple):
    kind: str
    repeats: int
    first_call: int
    last_call: int
    step_indices: tuple[int, ...]
    label: str


_Value = TypeVar("_Value")


class _Lazy(Generic[_Value]):
    """`functools.cached_property` without its lock (Python 3.11 takes one on every first read)."""

    def __init__(self, function: Callable[[Any], _Value]) -> None:
        self.function = function
        self.name = function.__name__

    def __get__(self, instance: Any, owner: type | None = None) -> _Value:
        value = self.function(instance)
        instance.__dict__[self.name] = value
        return value


class _Analysis:
    """What several detectors read, computed once per trajectory and only when first asked for.

    A property that raises fails only the detectors that read it.
    """

    def __init__(
        self,
        view: TrajectoryView,
        config: SignalConfig,
        history: ShapeHistory | None = None,
        *,
        session_continues: bool = False,
    ) -> None:
        self.view = view
        self.config = config
        self.history = history
        self.session_continues = session_continues
        self.limits = config.thresholds
        self.phrases = config.phrase_lists
        self._tokens: dict[int, list[str]] = {}
        self._trigrams: dict[int, frozenset[str]] = {}
        self._result_texts: dict[int, str] = {}
        self._scans: dict[int, tuple[dict[str, str], set[str]]] = {}

    # Turns ---------------------------------------------------------------------------------------------

    @_Lazy
    def turns(self) -> list[_Turn]:
        limit = self.limits.max_text_chars
        turns: list[_Turn] = []
        handed_on = False
        for step in self.view.steps:
            if len(turns) >= self.limits.max_turns:
                break
            if step.kind == "message":
                role = step.role if isinstance(step.role, str) else "unknown"
                # A system message after the user has spoken opens another model call's context (a chain
                # step, a sub-agent): its "user" messages restate the request or carry the orchestrator's
                # instructions. Read as the user's words, the restated request was a rephrase of itself.
                if role == "system" and any(turn.role == "user" for turn in turns):
                    handed_on = True
                if role == "user" and handed_on:
                    role = HANDED_ON_ROLE
                turns.append(self._turn(role, step.index, _content_text(step.content, limit), False))
            elif step.kind == "llm_call":
                message = step.output_message
                if isinstance(message, dict):
                    calls = message.get("tool_calls")
                    text = _content_text(message.get("content"), limit)
                    turns.append(self._turn("assistant", step.index, text, bool(calls)))
        if not any(turn.role in ("user", "assistant") for turn in turns) and self.view.conversation:
            # Agents traced without LLM spans: the conversation sits on an agent span.
            anchor = next((step.index for step in self.view.steps if step.kind in ("agent", "span")), None)
            turns = []
            messages: Sequence[Any] = self.view.conversation[: self.limits.max_turns]
            for message in messages:
                if not isinstance(message, dict):
                    continue
                speaker = message.get("role")
                text = _content_text(message.get("content"), limit)
                turns.append(self._turn(speaker if isinstance(speaker, str) else "unknown", anchor, text, False))
        return turns

    def _turn(self, role: str, step_index: int | None, text: str, has_tool_calls: bool) -> _Turn:
        # Only what the user says and what the assistant answers is ever matched or compared.
        read = text and (role == "user" or (role == "assistant" and not has_tool_calls))
        return _Turn(role, step_index, text, _normalize(text) if read else " ", has_tool_calls)

    @_Lazy
    def user_turns(self) -> list[_Turn]:
        return [turn for turn in self.turns if turn.role == "user" and turn.text.strip()]

    @_Lazy
    def answers(self) -> list[_Turn]:
        """Assistant turns that speak to the user: text without tool calls."""
        return [
            turn for turn in self.turns if turn.role == "assistant" and turn.text.strip() and not turn.has_tool_calls
        ]

    @_Lazy
    def first_assistant_position(self) -> int:
        for position, turn in enumerate(self.turns):
            if turn.role == "assistant":
                return position
        return len(self.turns)

    @_Lazy
    def dialogue(self) -> list[_Turn]:
        """User turns and assistant answers, in order."""
        return [
            turn
            for turn in self.turns
            if turn.text.strip() and (turn.role == "user" or (turn.role == "assistant" and not turn.has_tool_calls))
        ]

    def tokens(self, turn: _Turn) -> list[str]:
        key = id(turn)
        found = self._tokens.get(key)
        if found is None:
            found = self._tokens[key] = _tokens(turn.normalized, self.phrases.stopwords)
        return found

    def phrases_in(self, turn: _Turn) -> dict[str, str]:
        """List name -> the first phrase of that list in the turn, for every list that has one."""
        scanned = self._scans.get(id(turn))
        return (scanned or self._scan(turn))[0]

    def found(self, turn: _Turn, field: str) -> str | None:
        """The first phrase of list `field` (a `PhraseLists` field) in the turn, else None."""
        scanned = self._scans.get(id(turn))
        return (scanned or self._scan(turn))[0].get(field)

    def starts(self, turn: _Turn, field: str) -> bool:
        """Whether the turn opens with a phrase of list `field`."""
        return field in self._scan(turn)[1]

    def _scan(self, turn: _Turn) -> tuple[dict[str, str], set[str]]:
        key = id(turn)
        scanned = self._scans.get(key)
        if scanned is None:
            scanned = self._scans[key] = _scan(_combined_index(self.phrases), turn.normalized)
        return scanned

    def trigrams(self, turn: _Turn) -> frozenset[str]:
        key = id(turn)
        found = self._trigrams.get(key)
        if found is None:
            found = self._trigrams[key] = _trigrams(turn.normalized, self.limits.similarity_chars)
        return found

    def snippet(self, text: str) -> str:
        return _snippet(text, self.limits.snippet_chars)

    # Tool calls ----------------------------------------------------------------------------------------

    @_Lazy
    def calls(self) -> list[_Call]:
        limit = self.limits.max_text_chars
        budget = self.limits.result_node_budget
        calls: list[_Call] = []
        for call in self.view.tool_calls[: self.limits.max_tool_calls]:
            name = call.name
            result = _parsed(call.result)
            error_kind: str | None = None
            error_detail = ""
            exhaustion: str | None = None
            if call.status == "error" or call.error:
                error_kind, error_detail = "span_error", _bound(call.error or "the tool span ended in error", limit)
            elif isinstance(result, dict):
                found = _dict_error(result)
                if found is not None:
                    error_kind, error_detail = found
            elif isinstance(result, str) and _text_error(result):
                error_kind, error_detail = "exception_text", _bound(result, limit)
            result_text = ""
            if error_kind is not None:
                result_text = _value_text(result, limit, budget) if result is not None else ""
                exhaustion = _exhaustion_kind(f"{error_detail} {result_text}")
                if exhaustion is None and isinstance(result, dict):
                    for key in _HTTP_KEYS:
                        if _http_code(result.get(key)) == 429:
                            exhaustion = "rate_limit"
            arguments = _parsed(call.arguments)
            calls.append(
                _Call(
                    name=name,
                    arguments=arguments,
                    arguments_key=_canonical(arguments, 2000),
                    result=result,
                    step_index=call.step_index,
                    error_kind=error_kind,
                    error_detail=error_detail,
                    exhaustion_kind=exhaustion,
                    is_handoff=name in self.config.handoff_tools,
                    call_id=call.call_id,
                )
            )
        return calls

    @_Lazy
    def call_shapes(self) -> dict[int, dict[str, str]]:
        """The shape of every result `detect_silent_tool_api_change` judges (not an error, not empty), by
        `id(call)`: computed once, for the history and the detector."""
        return {
            id(call): tool_result_shape(call.result)
            for call in self.calls
            if call.error_kind is None and call.result is not None
        }

    @_Lazy
    def result_shapes(self) -> list[ResultShape]:
        """The judged results' shapes with their tools and spans."""
        # `calls` is built from the first `max_tool_calls` of `view.tool_calls`, in order.
        return [
            ResultShape(call.name, self.call_shapes[id(call)], tool_call.span_id)
            for tool_call, call in zip(self.view.tool_calls, self.calls, strict=False)
            if id(call) in self.call_shapes
        ]

    @_Lazy
    def tool_result_history(self) -> Mapping[str, Sequence[Mapping[str, str]]]:
        if self.history is None:
            return self.config.tool_result_shapes
        return self.history(self.result_shapes)

    def result_text(self, call: _Call) -> str:
        """A bounded text of the call's result, computed when first needed (results can be large)."""
        key = id(call)
        found = self._result_texts.get(key)
        if found is None:
            result = call.result
            found = "" if result is None else _value_text(result, 2000, self.limits.result_node_budget)[:2000]
            self._result_texts[key] = found
        return found

    @_Lazy
    def requested(self) -> list[_Requested]:
        """Calls the assistant asked for (executed or not), from the LLM outputs and the tool calls."""
        requested: list[_Requested] = []
        seen_ids: set[str] = set()
        unidentified: list[tuple[str, Any]] = []
        # The tool span holds the same arguments already parsed; reading them saves a JSON parse per call.
        executed = {call.call_id: call.arguments for call in self.calls if call.call_id}
        for step in self.view.steps:
            if step.kind != "llm_call" or not isinstance(step.output_message, dict):
                continue
            calls = step.output_message.get("tool_calls")
            if not isinstance(calls, list):
                continue
            for call in calls[:50]:
                if not isinstance(call, dict):
                    continue
                function = call.get("function")
                function = function if isinstance(function, dict) else {}
                name = function.get("name")
                if not isinstance(name, str) or not name:
                    continue
                call_id = call.get("id") if isinstance(call.get("id"), str) else None
                arguments = function.get("arguments")
                if call_id in executed and not isinstance(executed[call_id], str):
                    arguments = executed[call_id]
                requested.append(_Requested(name, arguments, call_id, step.index))
                if call_id:
                    seen_ids.add(call_id)
                else:
                    unidentified.append((name, arguments))
        missing = [call for call in self.calls if not (call.call_id and call.call_id in seen_ids)]
        if missing:
            # Only calls the ids do not match are compared by name and arguments, which costs a JSON dump.
            seen_keys = {(name, _canonical(arguments, 2000)) for name, arguments in unidentified}
            requested.extend(
                _Requested(call.name, call.arguments, call.call_id, call.step_index)
                for call in missing
                if (call.name, call.arguments_key) not in seen_keys
            )
        return requested

    @_Lazy
    def tool_schemas(self) -> dict[str, Mapping[str, Any] | None]:
        schemas: dict[str, Mapping[str, Any] | None] = {}
        for definition in self.view.tool_definitions:
            function = definition.get("function") if isinstance(definition, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                continue
            parameters = function.get("parameters")
            schemas[function["name"]] = parameters if isinstance(parameters, dict) else None
        for name, schema in self.config.known_tools.items():
            if schema is not None or name not in schemas:
                schemas[name] = schema
        for name in self.config.handoff_tools:
            schemas.setdefault(name, None)
        return schemas

    # Environment ---------------------------------------------------------------------------------------

    @_Lazy
    def exhaustion_hits(self) -> list[tuple[str, int, str]]:
        """(kind, step index, evidence text) for every sign that a limit was reached."""
        hits: list[tuple[str, int, str]] = []
        limit = self.limits.max_text_chars
        budget = self.limits.result_node_budget
        for call in self.calls:
            if call.exhaustion_kind is not None:
                hits.append((call.exhaustion_kind, call.step_index, call.error_detail or self.result_text(call)))
        tool_steps = {call.step_index for call in self.calls}
        for step in self.view.steps:
            if step.index in tool_steps:
                continue
            if step.error:
                error = _bound(step.error, limit)
                kind = _exhaustion_kind(error)
                if kind is not None:
                    hits.append((kind, step.index, error))
                    continue
            if step.output is None and step.kind not in ("agent", "llm_call"):
                continue
            for value in self._termination_values(step):
                text = _value_text(value, limit, budget)
                kind = _exhaustion_kind(text) or ("truncated_output" if text.strip().lower() == "length" else None)
                if kind is not None:
                    hits.append((kind, step.index, text))
                    break
        hits.extend(self._limit_hits())
        return hits

    def _termination_values(self, step: Step) -> Iterator[Any]:
        if step.kind == "llm_call" and isinstance(step.output_message, dict):
            reason = step.output_message.get("finish_reason")
            if reason is not None:
                yield reason
        for value in (step.output, step.input if step.kind == "agent" else None):
            if value is None:
                continue
            value = _parsed(value)
            if isinstance(value, dict):
                for key in _TERMINATION_KEYS:
                    if key in value:
                        yield value[key]
            elif isinstance(value, str) and step.kind in ("agent", "chain", "span"):
                yield value[:500]

    def _limit_hits(self) -> list[tuple[str, int, str]]:
        config = self.config
        hits: list[tuple[str, int, str]] = []
        limits = (
            config.max_steps,
            config.token_budget,
            config.time_budget_seconds,
            config.context_window_tokens,
            config.max_output_tokens,
        )
        if all(limit is None for limit in limits):
            return hits
        llm_steps = [step for step in self.view.steps if step.kind == "llm_call"]
        last = self.view.steps[-1].index if self.view.steps else 0
        if config.max_steps is not None and llm_steps and len(llm_steps) >= config.max_steps:
            hits.append(("max_steps", llm_steps[-1].index, f"{len(llm_steps)} LLM calls, limit {config.max_steps}"))
        totals = self.view.totals
        if config.token_budget is not None and totals.total_tokens >= config.token_budget:
            hits.append(("token_budget", last, f"{totals.total_tokens} tokens, budget {config.token_budget}"))
        if config.time_budget_seconds is not None and totals.duration_ns >= config.time_budget_seconds * 1e9:
            seconds = totals.duration_ns / 1e9
            hits.append(("timeout", last, f"ran {seconds:.1f} s, budget {config.time_budget_seconds:g} s"))
        for step in llm_steps:
            usage = step.usage
            if usage is None:
                continue
            if (
                config.context_window_tokens is not None
                and usage.input_tokens is not None
                and usage.input_tokens >= config.context_window_tokens * self.limits.context_window_ratio
            ):
                hits.append(
                    (
                        "context_overflow",
                        step.index,
                        f"{usage.input_tokens} input tokens of a {config.context_window_tokens} window",
                    )
                )
            if (
                config.max_output_tokens is not None
                and usage.output_tokens is not None
                and usage.output_tokens >= config.max_output_tokens
            ):
                hits.append(
                    (
                        "truncated_output",
                        step.index,
                        f"{usage.output_tokens} output tokens, limit {config.max_output_tokens}",
                    )
                )
        return hits

    # Loops ---------------------------------------------------------------------------------------------

    @_Lazy
    def loops(self) -> list[_Loop]:
        limits = self.limits
        calls = self.calls
        loops: list[_Loop] = []
        if len(calls) < min(limits.loop_repeats, limits.loop_cycle_min_run, 2 * limits.loop_pattern_repeats):
            return loops
        covered: set[int] = set()
        # Identical calls (name, arguments and result) back to back: nothing new was learnt.
        start = 0
        while start < len(calls):
            end = start + 1
            head = calls[start]
            while (
                end < len(calls)
                and calls[end].name == head.name
                and calls[end].arguments_key == head.arguments_key
                and self.result_text(calls[end]) == self.result_text(head)
            ):
                end += 1
            if end - start >= limits.loop_repeats:
                loops.append(self._loop("retry", end - start, start, end - 1, calls[start].name))
                covered.update(range(start, end))
            start = end
        # One tool again and again, cycling through a few argument sets with the same results: a window
        # of the same-tool run where every call repeats an earlier one of the window at least once.
        window = limits.loop_cycle_min_run
        start = 0
        while start < len(calls):
            end = start + 1
            while end < len(calls) and calls[end].name == calls[start].name:
                end += 1
            for first in range(start, end - window + 1):
                if covered.intersection(range(first, first + window)):
                    continue
                pairs = {(calls[i].arguments_key, self.result_text(calls[i])) for i in range(first, first + window)}
                if len(pairs) <= window // 2:
                    last = first + window
                    # Extend while the calls keep repeating the same few pairs.
                    while last < end and (calls[last].arguments_key, self.result_text(calls[last])) in pairs:
                        last += 1
                    loops.append(self._loop("cycling_arguments", last - first, first, last - 1, calls[first].name))
                    covered.update(range(first, last))
                    break
            start = end
        # A pattern of 2-4 calls (two tools at least) repeated back to back.
        keys = [(call.name, call.arguments_key) for call in calls]
        position = 0
        while position < len(keys):
            found = False
            for size in (2, 3, 4):
                pattern = keys[position : position + size]
                if len(pattern) < size or len({name for name, _ in pattern}) < 2:
                    continue
                repeats = 1
                while keys[position + repeats * size : position + (repeats + 1) * size] == pattern:
                    repeats += 1
                if repeats >= limits.loop_pattern_repeats:
                    last = position + repeats * size - 1
                    if not covered.intersection(range(position, last + 1)):
                        label = " → ".join(name for name, _ in pattern)
                        loops.append(self._loop("repeated_pattern", repeats, position, last, label))
                        covered.update(range(position, last + 1))
                    position = last + 1
                    found = True
                    break
            if not found:
                position += 1
        return loops

    def _loop(self, kind: str, repeats: int, first: int, last: int, label: str) -> _Loop:
        indices = tuple(call.step_index for call in self.calls[first : last + 1])
        return _Loop(kind, repeats, first, last, indices[: self.limits.max_evidence_steps], label)

    # Instances -----------------------------------------------------------------------------------------

    def instance(
        self,
        signal: str,
        kind: str,
        severity: float,
        step_indices: Sequence[int | None],
        snippets: Sequence[str],
        why: str,
        *,
        level: SeverityLevel | None = None,
    ) -> SignalInstance:
        severity = min(max(severity, 0.0), 1.0)
        indices = tuple(dict.fromkeys(index for index in step_indices if index is not None))
        quoted = tuple(self.snippet(text) for text in snippets if text)[: self.limits.max_snippets]
        return SignalInstance(
            signal=signal,
            kind=kind,
            category=SIGNAL_CATEGORIES[signal],
            severity=round(severity, 3),
            level=level or _level(severity),
            step_indices=indices[: self.limits.max_evidence_steps],
            snippets=quoted,
            why=why,
        )


# --- Interaction detectors ------------------------------------------------------------------------------


def _is_answer_to_agent(analysis: _Analysis, turn: _Turn) -> bool:
    return analysis.starts(turn, "answer_prefix")


def detect_misalignment(analysis: _Analysis) -> list[SignalInstance]:
    found: list[SignalInstance] = []
    previous: _Turn | None = None
    previous_tokens: set[str] = set()
    for position, turn in enumerate(analysis.turns):
        if turn.role != "user" or not turn.text.strip():
            continue
        after_agent = position > analysis.first_assistant_position
        tokens = set(analysis.tokens(turn))
        if after_agent:
            phrases = analysis.phrases_in(turn)
            if (phrase := phrases.get("correction")) is not None:
                found.append(
                    analysis.instance(
                        "misalignment",
                        "correction",
                        0.7,
                        [turn.step_index],
                        [turn.text],
                        f'The user corrects the agent ("{phrase}").',
                    )
                )
            elif (phrase := phrases.get("rephrase")) is not None:
                found.append(
                    analysis.instance(
                        "misalignment",
                        "rephrase",
                        0.6,
                        [turn.step_index],
                        [turn.text],
                        f'The user rephrases the request ("{phrase}").',
                    )
                )
            elif (phrase := phrases.get("clarification")) is not None:
                found.append(
                    analysis.instance(
                        "misalignment",
                        "clarification",
                        0.45,
                        [turn.step_index],
                        [turn.text],
                        f'The user does not understand the agent ("{phrase}").',
                    )
                )
            elif previous is not None and _is_rephrase(analysis, previous, previous_tokens, turn, tokens):
                found.append(
                    analysis.instance(
                        "misalignment",
                        "rephrase",
                        0.6,
                        [previous.step_index, turn.step_index],
                        [previous.text, turn.text],
                        "The user asks again for nearly the same thing in other words.",
                    )
                )
        previous, previous_tokens = turn, tokens
    return found


_NUMBER: Final = re.compile(r"\d")


def _is_rephrase(analysis: _Analysis, previous: _Turn, before: set[str], turn: _Turn, now: set[str]) -> bool:
    limits = analysis.limits
    if len(before) < limits.rephrase_min_tokens or len(now) < limits.rephrase_min_tokens:
        return False
    if _is_answer_to_agent(analysis, turn) or analysis.starts(turn, "follow_up"):
        return False
    # New numbers or dates make it a new request ("sales for 2024" after "sales for 2023").
    if any(_NUMBER.search(token) for token in now - before):
        return False
    shared = _jaccard(before, now)
    if shared >= limits.rephrase_token_jaccard:
        return True
    if shared < 0.25:
        # Texts this far apart in words are far apart in characters too: skip the trigram comparison.
        return False
    smaller = min(len(before), len(now))
    if smaller >= 4 and len(before & now) / smaller >= limits.rephrase_overlap_coefficient:
        return True
    return _jaccard(analysis.trigrams(previous), analysis.trigrams(turn)) >= (limits.rephrase_trigram_jaccard)


def detect_stagnation(analysis: _Analysis) -> list[SignalInstance]:
    limits = analysis.limits
    found: list[SignalInstance] = []
    history: list[_Turn] = []
    seen_tokens: set[str] = set()
    stale: list[_Turn] = []
    calls = sorted(analysis.calls, key=lambda call: call.step_index)
    seen_calls: set[tuple[str, str]] = set()
    next_call = 0
    new_work = False
    for turn in analysis.answers:
        # Work done since the previous answer: a call not made before counts as progress.
        while next_call < len(calls) and calls[next_call].step_index < (turn.step_index or 0):
            key = (calls[next_call].name, calls[next_call].arguments_key)
            new_work = new_work or key not in seen_calls
            seen_calls.add(key)
            next_call += 1
        tokens = analysis.tokens(turn)
        if len(tokens) < limits.repetition_min_tokens:
            continue
        if not new_work:
            for earlier in reversed(history[-2:]):
                similarity = _jaccard(analysis.trigrams(turn), analysis.trigrams(earlier))
                if similarity >= limits.repetition_trigram_jaccard:
                    found.append(
                        analysis.instance(
                            "stagnation",
                            "repetition",
                            0.65 if similarity >= 0.95 else 0.55,
                            [earlier.step_index, turn.step_index],
                            [turn.text],
                            f"The assistant repeats an earlier answer ({similarity:.0%} alike) without new work "
                            "in between.",
                        )
                    )
                    break
        new = set(tokens) - seen_tokens
        if history and not new_work and len(new) / len(set(tokens)) < limits.novelty_min_ratio:
            stale.append(turn)
        else:
            if len(stale) >= limits.no_progress_turns:
                found.append(_no_progress(analysis, stale))
            stale = []
        seen_tokens.update(tokens)
        history.append(turn)
        new_work = False
    if len(stale) >= limits.no_progress_turns:
        found.append(_no_progress(analysis, stale))
    return found


def _no_progress(analysis: _Analysis, stale: list[_Turn]) -> SignalInstance:
    return analysis.instance(
        "stagnation",
        "no_progress",
        0.6,
        [turn.step_index for turn in stale],
        [stale[-1].text],
        f"{len(stale)} assistant answers in a row add almost nothing new.",
    )


def _handoff_announced(analysis: _Analysis, turn: _Turn) -> bool:
    return analysis.found(turn, "handoff") is not None


def detect_disengagement(analysis: _Analysis) -> list[SignalInstance]:
    found: list[SignalInstance] = []
    for position, turn in enumerate(analysis.turns):
        if turn.role != "user" or not turn.text.strip():
            continue
        # Before the agent has said or done anything the user cannot be giving up on it: an opening
        # "please cancel my account" is the task, "the app doesn't work" is the problem to solve.
        after_agent = position > analysis.first_assistant_position
        if after_agent and (phrase := analysis.found(turn, "quit")) is not None:
            found.append(
                analysis.instance(
                    "disengagement", "quit", 0.8, [turn.step_index], [turn.text], f'The user gives up ("{phrase}").'
                )
            )
            continue
        if (phrase := analysis.found(turn, "human_request")) is not None:
            found.append(
                analysis.instance(
                    "disengagement",
                    "human_request",
                    0.6,
                    [turn.step_index],
                    [turn.text],
                    f'The user asks for a person ("{phrase}").',
                )
            )
            continue
        negative = _negative_stance(analysis, turn) if after_agent else None
        if negative is not None:
            found.append(
                analysis.instance("disengagement", "negative_stance", 0.5, [turn.step_index], [turn.text], negative)
            )
    found.extend(_silent_ending(analysis))
    return found


_BURST: Final = re.compile(r"\?{2,}|!{2,}|[?!]{3,}")


def _negative_stance(analysis: _Analysis, turn: _Turn) -> str | None:
    if (phrase := analysis.found(turn, "negative")) is not None:
        return f'The user is unhappy ("{phrase}").'
    positive = analysis.found(turn, "gratitude") or analysis.found(turn, "confirmation")
    if positive is not None:
        return None
    upper = sum(map(str.isupper, turn.text))
    if upper >= _ALL_CAPS_LETTERS and upper >= 4 * sum(map(str.islower, turn.text)):
        return "The user writes in capitals."
    if _BURST.search(turn.text):
        return "The user's punctuation shows frustration."
    return None


def _silent_ending(analysis: _Analysis) -> list[SignalInstance]:
    if analysis.view.status == "running" or not analysis.user_turns:
        return []
    dialogue = analysis.dialogue
    if not dialogue:
        return []
    last = dialogue[-1]
    if last.role == "user":
        return _unanswered_question(analysis, last)
    if _handoff_announced(analysis, last) or any(call.is_handoff for call in analysis.calls):
        return []
    if analysis.session_continues:
        # The user's next request is the session's next trajectory: they came back after the error.
        return []
    if analysis.found(last, "error_report") is not None or (
        analysis.calls and analysis.calls[-1].error_kind is not None and not _recovered_after_last_error(analysis)
    ):
        return [
            analysis.instance(
                "disengagement",
                "left_after_error",
                0.6,
                [last.step_index],
                [last.text],
                "The conversation ends right after the agent reports a failure; the user does not come back.",
            )
        ]
    # Ending on the agent's own question ("Which booking do you mean?") is not read as the user leaving:
    # a team that traces one request per trace gets the answer in the session's next trajectory, and a
    # clarifying question is a normal turn either way.
    return []


def _unanswered_question(analysis: _Analysis, last: _Turn) -> list[SignalInstance]:
    """The user's last turn is a question and the trajectory, finished, holds no answer to it: the agent
    worked on it (an LLM call after it asked for tools, or failed) and stopped, or it came after the
    agent's last answer and no model call read it. Not when the question went to a person or the run
    reached a limit."""
    question = last.text.rstrip()[-200:]
    if not question.endswith("?") or last.step_index is None:
        return []
    steps = analysis.view.steps
    later = steps[last.step_index + 1 :]
    if any(call.is_handoff and call.step_index > last.step_index for call in analysis.calls):
        return []
    if analysis.exhaustion_hits:
        # A limit stopped the run before it could answer: that is `exhaustion`, as its errors are.
        return []
    # An LLM call whose output was not recorded may have answered: only a recorded output or an error counts.
    worked = any(
        step.kind == "llm_call" and (isinstance(step.output_message, dict) or step.status == "error") for step in later
    )
    # A dialogue read from an agent span alone may keep the answer outside its message list: only a
    # message step, past the agent's answers, shows a question nothing read.
    unread = (
        last.step_index < len(steps)
        and steps[last.step_index].kind == "message"
        and any(turn.role == "assistant" for turn in analysis.dialogue)
        and not any(step.kind == "llm_call" for step in later)
    )
    if not worked and not unread:
        return []
    return [
        analysis.instance(
            "disengagement",
            "unanswered_question",
            0.6,
            [last.step_index],
            [question],
            "The trajectory ends on a question from the user that the agent never answers.",
        )
    ]


def _recovered_after_last_error(analysis: _Analysis) -> bool:
    # An answer after the failing call that does not report an error means the agent worked around it.
    last_error_step = analysis.calls[-1].step_index
    answers_after = [turn for turn in analysis.answers if (turn.step_index or 0) > last_error_step]
    return bool(answers_after) and analysis.found(answers_after[-1], "error_report") is None


def detect_satisfaction(analysis: _Analysis) -> list[SignalInstance]:
    found: list[SignalInstance] = []
    for position, turn in enumerate(analysis.turns):
        if turn.role != "user" or position < analysis.first_assistant_position or not turn.text.strip():
            continue
        phrases = analysis.phrases_in(turn)
        if not phrases or any(field in phrases for field in ("negative", "correction", "quit", "human_request")):
            continue
        for kind, severity in (("success", 0.7), ("confirmation", 0.6), ("gratitude", 0.5)):
            phrase = phrases.get(kind)
            if phrase is not None:
                found.append(
                    analysis.instance(
                        "satisfaction",
                        kind,
                        severity,
                        [turn.step_index],
                        [turn.text],
                        f'The user is satisfied ("{phrase}").',
                        level="info",
                    )
                )
                break
    return found


# --- Execution detectors --------------------------------------------------------------------------------


def detect_failure(analysis: _Analysis) -> list[SignalInstance]:
    found: list[SignalInstance] = []
    tool_steps: set[int] = set()
    for call in analysis.calls:
        tool_steps.add(call.step_index)
        if call.error_kind is None or call.exhaustion_kind is not None or call.is_handoff:
            continue
        found.append(
            analysis.instance(
                "failure",
                call.error_kind,
                0.7,
                [call.step_index],
                [call.error_detail],
                f"The call to {call.name} failed ({_FAILURE_WHY[call.error_kind]}).",
            )
        )
    for step in analysis.view.steps:
        if step.index in tool_steps or step.status != "error":
            continue
        text = _bound(step.error or "error status", analysis.limits.max_text_chars)
        if _exhaustion_kind(text) is not None or (step.kind == "agent" and found):
            # Environment limits are exhaustion; an agent span failing because its tool did is one failure.
            continue
        found.append(
            analysis.instance(
                "failure",
                "span_error",
                0.8,
                [step.index],
                [text],
                f"The {step.kind.replace('_', ' ')} step {step.name!r} ended in error.",
            )
        )
    return found


_FAILURE_WHY: Final = {
    "span_error": "its span ended in error",
    "status_field": "its result has a failure status",
    "error_key": "its result carries an error",
    "http_status": "its result has an HTTP error status",
    "exit_code": "a non-zero exit code",
    "exception_text": "its output is an error or exception",
}


def detect_loop(analysis: _Analysis) -> list[SignalInstance]:
    limits = analysis.limits
    found: list[SignalInstance] = []
    for loop in analysis.loops:
        severity = min(0.6 + 0.05 * (loop.repeats - limits.loop_repeats), 0.9)
        why = {
            "retry": f"{loop.label} was called {loop.repeats} times in a row with the same arguments and result.",
            "cycling_arguments": f"{loop.label} was called {loop.repeats} times in a row, cycling through the "
            "same few arguments.",
            "repeated_pattern": f"The calls {loop.label} repeat {loop.repeats} times.",
        }[loop.kind]
        found.append(analysis.instance("loop", loop.kind, severity, loop.step_indices, [loop.label], why))
    return found


# --- Environment detectors ------------------------------------------------------------------------------

_EXHAUSTION_SEVERITY: Final = {
    "context_overflow": 0.75,
    "max_steps": 0.7,
    "token_budget": 0.7,
    "truncated_output": 0.55,
    "rate_limit": 0.5,
    "timeout": 0.5,
}
_EXHAUSTION_WHY: Final = {
    "context_overflow": "The context window was filled.",
    "max_steps": "The agent reached its step limit.",
    "token_budget": "The token budget ran out.",
    "truncated_output": "A model output was cut at its length limit.",
    "rate_limit": "A rate limit was hit.",
    "timeout": "A call or the run ran out of time.",
}


def detect_exhaustion(analysis: _Analysis) -> list[SignalInstance]:
    grouped: dict[str, list[tuple[int, str]]] = {}
    for kind, index, text in analysis.exhaustion_hits:
        grouped.setdefault(kind, []).append((index, text))
    return [
        analysis.instance(
            "exhaustion",
            kind,
            _EXHAUSTION_SEVERITY[kind],
            [index for index, _ in hits],
            [text for _, text in hits],
            _EXHAUSTION_WHY[kind] + (f" ({len(hits)} times)" if len(hits) > 1 else ""),
        )
        for kind, hits in grouped.items()
    ]


# --- Failure-mode detectors -----------------------------------------------------------------------------


def detect_hallucinated_tool_call(analysis: _Analysis) -> list[SignalInstance]:
    schemas = analysis.tool_schemas
    defined = set(schemas) - analysis.config.handoff_tools
    if not defined:
        # Without a single definition there is nothing to hold a call against.
        return []
    found: list[SignalInstance] = []
    for call in analysis.requested:
        if call.name not in schemas:
            found.append(
                analysis.instance(
                    "hallucinated_tool_call",
                    "unknown_tool",
                    0.85,
                    [call.step_index],
                    [f"{call.name}({_canonical(call.arguments, 120)})"],
                    f"The agent called {call.name!r}, which is not among its {len(defined)} defined tools.",
                )
            )
            continue
        schema = schemas[call.name]
        if schema is None:
            continue
        arguments = call.arguments
        if arguments is None or arguments == "":
            arguments = {}
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except (ValueError, RecursionError):
                found.append(
                    analysis.instance(
                        "hallucinated_tool_call",
                        "invalid_arguments",
                        0.7,
                        [call.step_index],
                        [arguments],
                        f"The arguments of the call to {call.name} are not valid JSON.",
                    )
                )
                continue
        violations = schema_violations(arguments, schema)
        if violations:
            found.append(
                analysis.instance(
                    "hallucinated_tool_call",
                    "schema_violation",
                    0.7,
                    [call.step_index],
                    violations,
                    f"The arguments of the call to {call.name} break its schema: {'; '.join(violations[:3])}.",
                )
            )
    return found


def detect_context_exhaustion(analysis: _Analysis) -> list[SignalInstance]:
    hits = [(index, text) for kind, index, text in analysis.exhaustion_hits if kind == "context_overflow"]
    if not hits:
        return []
    return [
        analysis.instance(
            "context_exhaustion",
            "context_overflow",
            0.8,
            [index for index, _ in hits],
            [text for _, text in hits],
            "The trajectory ran out of context window.",
        )
    ]


_MARKER_RUN: Final = re.compile(r"[\w-]+")
_ASCII_LETTERS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_ASCII_ALNUM: Final = _ASCII_LETTERS | frozenset("0123456789")


def cascade_markers(text: str) -> list[str]:
    """The id-like tokens of a text, in order: from a word (an ASCII letter or digit first) to the end of
    its run of word characters and hyphens, when that holds an ASCII letter and a digit and is at least 4
    characters long (`ride-7f3a9`, `TX4410`); else a word of at least 5 digits (`55012`).

    It finds what `\\b(?=[\\w-]*\\d)(?=[\\w-]*[A-Za-z])[A-Za-z0-9][\\w-]{3,}\\b|\\b\\d{5,}\\b` finds, in
    linear time: that pattern looked ahead to the end of the run from every word in it, so a failed
    call's output of `1-1-1-...` (any tool or user can produce one) cost the square of its length,
    about a second per failed call of the ingest path.
    """
    found: list[str] = []
    for run in _MARKER_RUN.findall(text):
        if not any(char.isdecimal() for char in run):
            continue  # both kinds need a digit
        size = len(run)
        end = len(run.rstrip("-"))  # a marker ends on the run's last word character
        # Whether run[i:] holds a digit, and an ASCII letter.
        digit_after = [False] * (size + 1)
        letter_after = [False] * (size + 1)
        for index in range(size - 1, -1, -1):
            digit_after[index] = digit_after[index + 1] or run[index].isdecimal()
            letter_after[index] = letter_after[index + 1] or run[index] in _ASCII_LETTERS
        position = 0
        while position < size:
            if run[position] == "-":
                position += 1
                continue
            word_end = run.find("-", position)
            word_end = size if word_end < 0 else word_end
            if (
                run[position] in _ASCII_ALNUM
                and digit_after[position]
                and letter_after[position]
                and end - position >= 4
            ):
                found.append(run[position:end])
                break  # the marker takes the rest of the run
            word = run[position:word_end]
            if len(word) >= 5 and word.isdecimal():
                found.append(word)
            position = word_end
    return found


def detect_cascading_error(analysis: _Analysis) -> list[SignalInstance]:
    calls = analysis.calls
    failing = [position for position, call in enumerate(calls) if call.error_kind is not None]
    if not failing:
        return []
    limits = analysis.limits
    found: list[SignalInstance] = []
    for position in failing:
        source = calls[position]
        error_text = f"{source.error_detail} {analysis.result_text(source)}"
        markers = {
            marker
            for marker in cascade_markers(error_text)
            if len(marker) >= limits.cascade_min_marker_chars and not marker.isalpha()
        }
        markers -= _known_before(analysis, source.step_index, markers)
        if not markers:
            continue
        consumer: tuple[int, str] | None = None
        for later in calls[position + 1 :]:
            used = next((marker for marker in sorted(markers) if marker in later.arguments_key), None)
            if used is not None:
                consumer = (later.step_index, f"{later.name} uses {used!r} from the failed {source.name} output")
                break
        if consumer is None:
            for turn in analysis.answers:
                if (turn.step_index or -1) <= source.step_index:
                    continue
                used = next((marker for marker in sorted(markers) if marker in turn.text), None)
                if used is not None and analysis.found(turn, "acknowledgement") is None:
                    consumer = (turn.step_index or source.step_index, f"the answer relies on {used!r}")
                    break
        if consumer is None:
            continue
        found.append(
            analysis.instance(
                "cascading_error",
                "error_consumed",
                0.8,
                [source.step_index, consumer[0]],
                [source.error_detail, consumer[1]],
                f"Output of the failed call to {source.name} is used later: {consumer[1]}.",
            )
        )
    return found


def _known_before(analysis: _Analysis, step_index: int, markers: set[str]) -> set[str]:
    """Markers that already appeared before the failing step (so they did not come from the error)."""
    known: set[str] = set()
    for turn in analysis.turns:
        if turn.step_index is not None and turn.step_index >= step_index:
            break
        known.update(marker for marker in markers if marker in turn.text)
    for call in analysis.calls:
        if call.step_index >= step_index:
            break
        known.update(
            marker for marker in markers if marker in call.arguments_key or marker in analysis.result_text(call)
        )
    for call in analysis.calls:
        if call.step_index == step_index:
            known.update(marker for marker in markers if marker in call.arguments_key)
    return known


def detect_goal_drift(analysis: _Analysis) -> list[SignalInstance]:
    limits = analysis.limits
    requests = [
        turn for turn in analysis.user_turns if len(set(analysis.tokens(turn))) >= limits.goal_drift_min_request_tokens
    ]
    answers = [
        turn for turn in analysis.answers if len(set(analysis.tokens(turn))) >= limits.goal_drift_min_answer_tokens
    ]
    if not requests or not answers:
        return []
    answer = answers[-1]
    if _handoff_announced(analysis, answer) or analysis.found(answer, "error_report"):
        return []
    answer_stems = {_stem(token) for token in analysis.tokens(answer)}
    best = 0.0
    for request in {id(turn): turn for turn in (requests[0], requests[-1])}.values():
        request_stems = {_stem(token) for token in analysis.tokens(request)}
        best = max(best, len(request_stems & answer_stems) / len(request_stems))
    if best > limits.goal_drift_max_overlap:
        return []
    return [
        analysis.instance(
            "goal_drift",
            "off_request",
            0.6,
            [requests[0].step_index, answer.step_index],
            [requests[0].text, answer.text],
            f"The final answer shares {best:.0%} of its content words with the user's request.",
        )
    ]


def detect_silent_tool_api_change(analysis: _Analysis) -> list[SignalInstance]:
    history = analysis.tool_result_history
    if not history:
        return []
    found: list[SignalInstance] = []
    reported: set[str] = set()
    for call in analysis.calls:
        shapes = history.get(call.name)
        shape = analysis.call_shapes.get(id(call))
        if not shapes or shape is None or call.name in reported:
            continue
        expected = set(shapes[0])
        for earlier in shapes[1:]:
            expected &= set(earlier)
        missing = sorted(key for key in expected if key not in shape)
        retyped = sorted(
            key for key in expected if key in shape and all(shape[key] != earlier.get(key) for earlier in shapes)
        )
        if not missing and not retyped:
            continue
        reported.add(call.name)
        details = []
        if missing:
            details.append(f"missing {', '.join(missing[:5])}")
        if retyped:
            details.append(f"type changed for {', '.join(retyped[:5])}")
        added = sorted(key for key in shape if all(key not in earlier for earlier in shapes))
        if added:
            details.append(f"new {', '.join(added[:5])}")
        found.append(
            analysis.instance(
                "silent_tool_api_change",
                "result_shape_changed",
                0.7,
                [call.step_index],
                ["; ".join(details)],
                f"The result of {call.name} no longer has the shape of its history: {'; '.join(details)}.",
            )
        )
    return found


def detect_infinite_loop(analysis: _Analysis) -> list[SignalInstance]:
    loops = analysis.loops
    if not loops:
        return []
    limits = analysis.limits
    found: list[SignalInstance] = []
    at_limit = any(kind in ("max_steps", "timeout", "token_budget") for kind, _, _ in analysis.exhaustion_hits)
    for loop in loops:
        if loop.repeats >= limits.infinite_loop_repeats:
            found.append(
                analysis.instance(
                    "infinite_loop",
                    "hard_threshold",
                    0.9,
                    loop.step_indices,
                    [loop.label],
                    f"A loop of {loop.label} ran {loop.repeats} times (limit {limits.infinite_loop_repeats}).",
                )
            )
        elif at_limit and loop.last_call >= len(analysis.calls) - 2:
            found.append(
                analysis.instance(
                    "infinite_loop",
                    "loop_at_step_limit",
                    0.85,
                    loop.step_indices,
                    [loop.label],
                    f"The run hit its limit while looping on {loop.label}.",
                )
            )
    return found


DETECTORS: Final[tuple[tuple[str, Detector], ...]] = (
    ("misalignment", detect_misalignment),
    ("stagnation", detect_stagnation),
    ("disengagement", detect_disengagement),
    ("satisfaction", detect_satisfaction),
    ("failure", detect_failure),
    ("loop", detect_loop),
    ("exhaustion", detect_exhaustion),
    ("hallucinated_tool_call", detect_hallucinated_tool_call),
    ("context_exhaustion", detect_context_exhaustion),
    ("cascading_error", detect_cascading_error),
    ("goal_drift", detect_goal_drift),
    ("silent_tool_api_change", detect_silent_tool_api_change),
    ("infinite_loop", detect_infinite_loop),
)

# A detector's bug must not stop the others or the ingest path: these are what code over odd data raises.
_DETECTOR_FAULTS: Final = (
    ArithmeticError,
    AttributeError,
    LookupError,
    RuntimeError,
    TypeError,
    ValueError,
    AssertionError,
    re.error,
)


# --- Entry points ---------------------------------------------------------------------------------------


def triage_score(instances: Sequence[SignalInstance], weights: Mapping[str, float] | None = None) -> float:
    """Combine signal instances into one score in [0, 1]; see the module docstring for the formula.

    `weights` maps a signal to its weight; signals it leaves out take `DEFAULT_WEIGHTS`.
    """
    absent: dict[str, float] = {}
    for instance in instances:
        severity = instance.severity if math.isfinite(instance.severity) else 0.0
        absent[instance.signal] = absent.get(instance.signal, 1.0) * (1.0 - min(max(severity, 0.0), 1.0))
    problem_absent = 1.0
    damping = 1.0
    for signal, remaining in absent.items():
        weight = weights.get(signal) if weights is not None else None
        if weight is None:
            weight = DEFAULT_WEIGHTS.get(signal, 0.0)
        if not math.isfinite(weight):
            continue
        strength = 1.0 - remaining
        contribution = min(abs(weight), 1.0) * strength
        if weight > 0:
            problem_absent *= 1.0 - contribution
        elif weight < 0:
            damping *= 1.0 - contribution
    score = (1.0 - problem_absent) * damping
    return round(min(max(score, 0.0), 1.0), 6)


def signals_compute(
    view: TrajectoryView,
    config: SignalConfig | None = None,
    *,
    session_continues: bool = False,
    detectors: Sequence[tuple[str, Detector]] | None = None,
    tool_result_history: ShapeHistory | None = None,
) -> SignalReport:
    """Run every detector (`DETECTORS` unless given) on one trajectory. Never raises for odd trajectories:
    a detector that fails is recorded in `detector_errors` and the others still run.

    `session_continues`: the trajectory's session has a later trajectory, so a conversation that ends on
    the agent's failure report is not one the user left (`disengagement/left_after_error`, see the rules).

    `tool_result_history`, when given, replaces `config.tool_result_shapes`: it receives the shapes of
    the trajectory's results and returns the history to compare them with, and the report carries
    those shapes (`result_shapes`). A caller that keeps the history from past results can so leave the
    trajectory's own out and record the new ones, from one pass over the results.
    """
    config = config or DEFAULT_CONFIG
    # Read at call time, not bound as a default, so the registry is the one place that lists detectors.
    detectors = DETECTORS if detectors is None else detectors
    analysis = _Analysis(view, config, tool_result_history, session_continues=session_continues)
    instances: list[SignalInstance] = []
    errors: list[DetectorError] = []
    for name, detector in detectors:
        try:
            instances.extend(detector(analysis))
        except _DETECTOR_FAULTS as error:
            errors.append(DetectorError(detector=name, message=f"{type(error).__name__}: {error}"[:500]))
    counts: dict[str, int] = {}
    for instance in instances:
        counts[instance.signal] = counts.get(instance.signal, 0) + 1
    result_shapes: tuple[ResultShape, ...] = ()
    if tool_result_history is not None:
        try:
            result_shapes = tuple(analysis.result_shapes)
        except _DETECTOR_FAULTS as error:
            errors.append(DetectorError(detector="result_shapes", message=f"{type(error).__name__}: {error}"[:500]))
    return SignalReport(
        instances=tuple(instances),
        detector_errors=tuple(errors),
        counts=MappingProxyType(counts),
        triage_score=triage_score(instances, config.weights),
        result_shapes=result_shapes,
    )
