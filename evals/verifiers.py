"""Deterministic evaluators: the verifiers an eval suite runs on each item, pure functions of (item, output).

Pure (no Django): eval runs, online rules, the NeMo Gym importer and the benchmark all call evaluators
through these types. Every evaluator has a `name`, a `version` and `evaluate(item, output) -> Score`;
every `Score` says which evaluator and which version produced it.

Built-ins (each constructible from a config dict, which is how suites store them):

- `exact_match`, `normalised_match` (case, whitespace, punctuation, Unicode NFKC, optionally numbers),
- `regex` (search, match or fullmatch; a pattern that does not compile is a configuration error),
- `json_schema` (output that is not JSON fails with a reason; it does not raise),
- `numeric_tolerance` (absolute and relative; the whole output, or its first or last number),
- `tool_calls` (τ-bench style: expected actions against the trajectory's tool calls; names and
  arguments as a subset or exactly, ordered or not, extra calls allowed or not),
- `final_state` (expected dict against the recorded final state, as a subset or exactly),
- `embedding_similarity` (cosine of `routing.embedding.embed_offline` vectors against a threshold).

A built-in's version is its code version plus a digest of its configuration ("1-3fa9c2d1"): changing
a suite's regex changes the version its scores carry, so scores from two configurations never mix.

Custom verifiers are Python functions registered in code with `@verifier("name", version=1)`.

Two kinds of failure are kept apart from a failed item:
- `EvaluatorConfigError` (a `ValueError` naming the field) is raised while building an evaluator,
  so a bad suite is refused when it is saved, not discovered as a column of zeros.
- `EvaluationError` is raised when an item lacks what the evaluator needs (no reference output, no
  expected tool calls); `evaluate_safely` turns it, and any other exception, into an errored Score
  with `score=None`: an item that could not be evaluated is not an item that scored 0, and run
  aggregates leave it out of the mean and count it separately.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import unicodedata
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

import jsonschema

from routing import embedding

Version = int | str


# --- errors -------------------------------------------------------------------------------------------


class EvaluatorConfigError(ValueError):
    """An evaluator's configuration is invalid; `field` names the offending key."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class EvaluationError(Exception):
    """The item or output lacks what the evaluator needs; the item is errored, not failed."""


class VerifierAlreadyRegistered(ValueError):
    pass


class VerifierNotFound(LookupError):
    pass


# --- the data an evaluator sees -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class EvalItem:
    """One dataset item: what was asked and what a correct answer looks like."""

    input: Any = None
    reference_output: str | None = None
    expected_tool_calls: tuple[ToolCall, ...] | None = None
    expected_final_state: Mapping[str, Any] | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ActionRecord:
    """One tool call of a trajectory and what became of it.

    `status` is "executed", "errored", "blocked" (a guardrail stopped it), "pending_approval",
    "rejected" (a person said no) or "client" (returned to the caller to run). `approved` is True when a
    person approved it before it ran, False when one rejected it, None when no approval was asked.
    """

    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    status: str = "executed"
    approved: bool | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class TrajectoryFacts:
    """What a trajectory did, as trajectory metrics read it: built from a stored trajectory, or from a
    gateway answer during a run. Counts are of the whole trajectory; `signals` are triage signal names."""

    trace_id: str = ""
    status: str = "ok"  # "ok" | "error"
    steps: int = 0  # model calls and tool calls
    model_calls: int = 0
    cost_usd: float | None = None
    latency_ms: float | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    tier: str | None = None
    escalated: bool = False  # handed to a person (the human tier, or a hand-off)
    actions: tuple[ActionRecord, ...] = ()
    guardrail_actions: tuple[str, ...] = ()  # each guardrail decision's action: "block", "redact", ...
    signals: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class EvalOutput:
    """What the agent produced: its final text and the tool calls of its trajectory, in order; with the
    trajectory's facts when it has one (trajectory metrics need them)."""

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    final_state: Mapping[str, Any] | None = None
    trajectory: TrajectoryFacts | None = None


@dataclass(frozen=True, slots=True)
class Score:
    """One evaluator's verdict on one output. An errored Score has `error` set, `score=None`, `passed=False`."""

    evaluator: str
    version: Version
    score: float | None
    passed: bool
    reason: str = ""
    error: str | None = None

    def __post_init__(self) -> None:
        if self.error is not None:
            if self.score is not None or self.passed:
                raise ValueError("an errored score has score=None and passed=False")
            return
        if self.score is None:
            raise ValueError("a score without an error needs a value")
        if isinstance(self.score, bool) or not isinstance(self.score, int | float):
            raise ValueError(f"score must be a number, got {self.score!r}")
        if not 0.0 <= self.score <= 1.0:  # also refuses NaN
            raise ValueError(f"score must be within 0..1, got {self.score!r}")

    @property
    def errored(self) -> bool:
        return self.error is not None


@runtime_checkable
class Evaluator(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def version(self) -> Version: ...

    def evaluate(self, item: EvalItem, output: EvalOutput) -> Score: ...


def evaluate_safely(evaluator: Evaluator, item: EvalItem, output: EvalOutput) -> Score:
    """`evaluator.evaluate(item, output)`, with any exception turned into an errored Score (score None)."""
    name = str(getattr(evaluator, "name", type(evaluator).__name__))
    version: Version = getattr(evaluator, "version", "unknown")
    try:
        result: object = evaluator.evaluate(item, output)  # object: a custom evaluator may break its contract
    except Exception as error:  # noqa: BLE001 - one broken evaluator must not take a run down; the item is errored
        return Score(name, version, None, False, error=f"{type(error).__name__}: {error}")
    if not isinstance(result, Score):
        return Score(name, version, None, False, error=f"evaluator returned {type(result).__name__}, not a Score")
    return result


# --- configuration helpers ----------------------------------------------------------------------------


def _check_type(field_name: str, value: object, types: type | tuple[type, ...], description: str) -> None:
    # bool is an int to Python, never to a config author.
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise EvaluatorConfigError(field_name, f"must be {description}, got {value!r}")
    if not isinstance(value, types):
        raise EvaluatorConfigError(field_name, f"must be {description}, got {value!r}")


def _check_choice(field_name: str, value: object, choices: Sequence[str]) -> None:
    if value not in choices:
        raise EvaluatorConfigError(field_name, f"must be one of {', '.join(choices)}, got {value!r}")


def _check_tolerance(field_name: str, value: object) -> None:
    _check_type(field_name, value, (int, float), "a number")
    assert isinstance(value, int | float)
    if not math.isfinite(value) or value < 0:
        raise EvaluatorConfigError(field_name, f"must be a finite number ≥ 0, got {value!r}")


def _reference(item: EvalItem) -> str:
    if item.reference_output is None:
        raise EvaluationError("the item has no reference output")
    return item.reference_output


def _shorten(value: object, limit: int = 120) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


class _BuiltIn:
    """Shared by the built-in evaluators: the name, the versioned config and the Score constructors."""

    TYPE: ClassVar[str]
    CODE_VERSION: ClassVar[int] = 1

    def config(self) -> dict[str, Any]:
        """The config dict that `evaluator_from_config` turns back into this evaluator."""
        values = {item.name: getattr(self, item.name) for item in dataclasses.fields(self) if item.init}  # type: ignore[arg-type]
        values = {key: list(value) if isinstance(value, tuple) else value for key, value in values.items()}
        if values.get("label") == "":
            del values["label"]
        return {"type": self.TYPE, **values}

    @property
    def name(self) -> str:
        return str(getattr(self, "label", "")) or self.TYPE

    @property
    def version(self) -> Version:
        settings = {key: value for key, value in self.config().items() if key not in ("type", "label")}
        digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()
        return f"{self.CODE_VERSION}-{digest[:8]}"

    def _score(self, score: float, passed: bool, reason: str) -> Score:
        return Score(self.name, self.version, score, passed, reason)

    def _verdict(self, passed: bool, reason: str) -> Score:
        return self._score(1.0 if passed else 0.0, passed, reason)

    def _check_label(self) -> None:
        _check_type("label", getattr(self, "label", ""), str, "a string")


# --- text matches -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExactMatch(_BuiltIn):
    """The output equals the reference, character for character (`strip`: ignoring outer whitespace)."""

    TYPE: ClassVar[str] = "exact_match"
    strip: bool = True
    label: str = ""

    def __post_init__(self) -> None:
        self._check_label()
        _check_type("strip", self.strip, bool, "true or false")

    def evaluate(self, item: EvalItem, output: EvalOutput) -> Score:
        expected, actual = _reference(item), output.text
        if self.strip:
            expected, actual = expected.strip(), actual.strip()
        if actual == expected:
            return self._verdict(True, "output equals the reference")
        return self._verdict(False, f"expected {_shorten(expected)!r}, got {_shorten(actual)!r}")


# Plain or with thousands separators, optional sign and decimals: "1,234.50", "-3", "0.5".
_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w])|[-+]?\.\d+")
_WHITESPACE = re.compile(r"\s+")


def _canonical_number(text: str) -> str:
    try:
        value = Decimal(text.replace(",", ""))
    except InvalidOperation:  # pragma: no cover - _NUMBER only matches parseable numbers
        return text
    canonical = format(value.normalize(), "f")
    return "0" if canonical in ("-0", "+0") else canonical


def normalise_text(
    text: str, *, case_sensitive: bool = False, ignore_punctuation: bool = True, normalise_numbers: bool = False
) -> str:
    """NFKC, case-folded, punctuation turned to spaces, whitespace collapsed; numbers canonical if asked.

    With `normalise_numbers`, "1,000.50", "1000.5" and "1000.50" all read "1000.5"; numbers are
    canonicalised before punctuation goes, so their separators survive as one token.
    """
    text = unicodedata.normalize("NFKC", text)
    if not case_sensitive:
        text = text.casefold()
    pieces: list[str] = []
    position = 0
    matches: Iterator[re.Match[str]] = _NUMBER.finditer(text) if normalise_numbers else iter(())
    for match in matches:
        pieces.append(
            _strip_punctuation(text[position : match.start()]) if ignore_punctuation else text[position : match.start()]
        )
        pieces.append(f" {_canonical_number(match.group())} ")
        position = match.end()
    tail = text[position:]
    pieces.append(_strip_punctuation(tail) if ignore_punctuation else tail)
    return _WHITESPACE.sub(" ", "".join(pieces)).strip()


def _strip_punctuation(text: str) -> str:
    return "".join(" " if unicodedata.category(character).startswith("P") else character for character in text)


@dataclass(frozen=True)
class NormalisedMatch(_BuiltIn):
    """The output equals the reference after `normalise_text` on both."""

    TYPE: ClassVar[str] = "normalised_match"
    case_sensitive: bool = False
    ignore_punctuation: bool = True
    normalise_numbers: bool = False
    label: str = ""

    def __post_init__(self) -> None:
        self._check_label()
        for name in ("case_sensitive", "ignore_punctuation", "normalise_numbers"):
            _check_type(name, getattr(self, name), bool, "true or false")

    def _normalise(self, text: str) -> str:
        return normalise_text(
            text,
            case_sensitive=self.case_sensitive,
            ignore_punctuation=self.ignore_punctuation,
            normalise_numbers=self.normalise_numbers,
        )

    def evaluate(self, item: EvalItem, output: EvalOutput) -> Score:
        expected, actual = self._normalise(_reference(item)), self._normalise(output.text)
        if actual == expected:
            return self._verdict(True, f"normalised output equals the reference: {_shorten(expected)!r}")
        return self._verdict(False, f"normalised: expected {_shorten(expected)!r}, got {_shorten(actual)!r}")


_REGEX_FLAGS = {
    "IGNORECASE": re.IGNORECASE,
    "MULTILINE": re.MULTILINE,
    "DOTALL": re.DOTALL,
    "VERBOSE": re.VERBOSE,
    "ASCII": re.ASCII,
}
_REGEX_FLAG_LETTERS = {"i": "IGNORECASE", "m": "MULTILINE", "s": "DOTALL", "x": "VERBOSE", "a": "ASCII"}


@dataclass(frozen=True)
class RegexMatch(_BuiltIn):
    """The output matches `pattern`: anywhere (`search`), at the start (`match`) or whole (`fullmatch`).

    `flags` are names ("IGNORECASE", "MULTILINE", "DOTALL", "VERBOSE", "ASCII") or their letters.
    """

    TYPE: ClassVar[str] = "regex"
    pattern: str = ""
    mode: Literal["search", "match", "fullmatch"] = "search"
    flags: tuple[str, ...] = ()
    label: str = ""
    _compiled: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._check_label()
        _check_type("pattern", self.pattern, str, "a string")
        if not self.pattern:
            raise EvaluatorConfigError("pattern", "must not be empty")
        _check_choice("mode", self.mode, ("search", "match", "fullmatch"))
        _check_type("flags", self.flags, (list, tuple), "a list of flag names")
        combined = 0
        names: list[str] = []
        for flag in self.flags:
            name = _REGEX_FLAG_LETTERS.get(flag, flag) if isinstance(flag, str) else ""
            if name not in _REGEX_FLAGS:
                raise EvaluatorConfigError("flags", f"unknown flag {flag!r}; known: {', '.join(_REGEX_FLAGS)}")
            combined |= _REGEX_FLAGS[name]
            names.append(name)
        object.__setattr__(self, "flags", tuple(names))
        try:
            compiled = re.compile(self.pattern, combined)
        except re.error as error:
            raise EvaluatorConfigError("pattern", f"does not compile: {error}") from error
        object.__setattr__(self, "_compiled", compiled)

    def evaluate(self, item: EvalItem, output: EvalOutput) -> Score:
        match = getattr(self._compiled, self.mode)(output.text)
        if match is None:
            return self._verdict(False, f"no {self.mode} of /{_shorten(self.pattern)}/ in {_shorten(output.text)!r}")
        return self._verdict(True, f"{self.mode} of /{_shorten(self.pattern)}/ matched {_shorten(match.group())!r}")


# --- structured output --------------------------------------------------------------------------------

_CODE_FENCE = re.compile(r"\A\s*```[\w-]*\s*\n(.*?)\n?\s*```\s*\Z", re.DOTALL)


@dataclass(frozen=True)
class JsonSchemaMatch(_BuiltIn):
    """The output parses as JSON and validates against `schema` (JSON Schema 2020-12).

    With `strip_code_fence`, output wrapped in one Markdown code fence (```json ... ```) is unwrapped first.
    """

    TYPE: ClassVar[str] = "json_schema"
    schema: Mapping[str, Any] = field(default_factory=dict)
    strip_code_fence: bool = True
    label: str = ""
    _validator: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._check_label()
        _check_type("schema", self.schema, (Mapping, bool), "a JSON Schema object")
        _check_type("strip_code_fence", self.strip_code_fence, bool, "true or false")
        try:
            jsonschema.Draft202012Validator.check_schema(self.schema)
        except jsonschema.SchemaError as error:
            raise EvaluatorConfigError("schema", f"is not a valid JSON Schema: {error.message}") from error
        object.__setattr__(self, "_validator", jsonschema.Draft202012Validator(self.schema))

    def evaluate(self, item: EvalItem, output: EvalOutput) -> Score:
        text = output.text
        if self.strip_code_fence and (fenced := _CODE_FENCE.match(text)):
            text = fenced.group(1)
        try:
            document = json.loads(text)
        except json.JSONDecodeError as error:
            return self._verdict(False, f"output is not JSON: {error}")
        errors = sorted(self._validator.iter_errors(document), key=lambda error: list(error.absolute_path))
        if not errors:
            return self._verdict(True, "output is valid against the schema")
        details = "; ".join(
            f"{'/'.join(str(part) for part in error.absolute_path) or '(root)'}: {error.message}"
            for error in errors[:3]
        )
        more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
        return self._verdict(False, f"{len(errors)} schema error(s): {_shorten(details, 400)}{more}")


# --- numbers ------------------------------------------------------------------------------------------


def _parse_number(text: str) -> float | None:
    cleaned = text.strip().replace(",", "")
    try:
        value = float(cleaned)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


@dataclass(frozen=True)
class NumericTolerance(_BuiltIn):
    """The output's number is within tolerance of the expected number: |a − e| ≤ max(absolute, relative·|e|).

    `extract`: "whole" (the trimmed output must be a number), "first" or "last" (the first or last number
    in the text). The expected number is `expected` if configured, else the item's reference output.
    """

    TYPE: ClassVar[str] = "numeric_tolerance"
    absolute_tolerance: float = 0.0
    relative_tolerance: float = 0.0
    extract: Literal["whole", "first", "last"] = "whole"
    expected: float | None = None
    label: str = ""

    def __post_init__(self) -> None:
        self._check_label()
        _check_tolerance("absolute_tolerance", self.absolute_tolerance)
        _check_tolerance("relative_tolerance", self.relative_tolerance)
        _check_choice("extract", self.extract, ("whole", "first", "last"))
        if self.expected is not None:
            _check_type("expected", self.expected, (int, float), "a number")
            if not math.isfinite(self.expected):
                raise EvaluatorConfigError("expected", f"must be finite, got {self.expected!r}")

    def _actual(self, text: str) -> float | None:
        if self.extract == "whole":
            return _parse_number(text)
        numbers = [number for match in _NUMBER.finditer(text) if (number := _parse_number(match.group())) is not None]
        if not numbers:
            return None
        return numbers[0] if self.extract == "first" else numbers[-1]

    def evaluate(self, item: EvalItem, output: EvalOutput) -> Score:
        expected = self.expected
        if expected is None:
            reference = _reference(item)
            expected = _parse_number(reference)
            if expected is None:
                raise EvaluationError(f"the reference output is not a number: {_shorten(reference)!r}")
        actual = self._actual(output.text)
        if actual is None:
            where = "the output is not a number" if self.extract == "whole" else "no number in the output"
            return self._verdict(False, f"{where}: {_shorten(output.text)!r}")
        allowed = max(self.absolute_tolerance, self.relative_tolerance * abs(expected))
        difference = abs(actual - expected)
        passed = difference <= allowed
        relation = "within" if passed else "outside"
        return self._verdict(
            passed, f"got {actual:g}, expected {expected:g}: difference {difference:g} {relation} {allowed:g}"
        )


# --- tool calls and final state (τ-bench style) --------------------------------------------------------


def _values_equal(expected: object, actual: object) -> bool:
    # JSON semantics: true is not 1, but 1 is 1.0.
    if isinstance(expected, bool) or isinstance(actual, bool):
        return type(expected) is type(actual) and expected == actual
    if isinstance(expected, Mapping) and isinstance(actual, Mapping):
        return expected.keys() == actual.keys() and all(_values_equal(expected[key], actual[key]) for key in expected)
    if isinstance(expected, list | tuple) and isinstance(actual, list | tuple):
        return len(expected) == len(actual) and all(_values_equal(e, a) for e, a in zip(expected, actual, strict=True))
    return expected == actual


def _values_subset(expected: object, actual: object) -> bool:
    """Every key of an expected mapping is in the actual one with a matching value, recursively; else equality."""
    if isinstance(expected, Mapping) and isinstance(actual, Mapping):
        return all(key in actual and _values_subset(value, actual[key]) for key, value in expected.items())
    return _values_equal(expected, actual)


def _call_text(call: ToolCall) -> str:
    return f"{call.name}({_shorten(dict(call.arguments), 80)})"


def _maximum_bipartite_matching(
    expected: Sequence[ToolCall], actual: Sequence[ToolCall], matches: Callable[[ToolCall, ToolCall], bool]
) -> dict[int, int]:
    """expected index -> actual index, as many pairs as possible (Kuhn's augmenting paths).

    Greedy first-fit is not enough once arguments match as subsets: an expected call with no
    arguments could take the only actual call that a more specific expected call needed.
    """
    candidates = [[j for j, call in enumerate(actual) if matches(wanted, call)] for wanted in expected]
    owner: dict[int, int] = {}  # actual index -> expected index

    def augment(i: int, seen: set[int]) -> bool:
        for j in candidates[i]:
            if j in seen:
                continue
            seen.add(j)
            if j not in owner or augment(owner[j], seen):
                owner[j] = i
                return True
        return False

    for i in range(len(expected)):
        augment(i, set())
    return {i: j for j, i in owner.items()}


def _longest_common_subsequence(
    expected: Sequence[ToolCall], actual: Sequence[ToolCall], matches: Callable[[ToolCall, ToolCall], bool]
) -> dict[int, int]:
    """expected index -> actual index for a longest in-order matching (dynamic programming)."""
    rows, columns = len(expected), len(actual)
    table = [[0] * (columns + 1) for _ in range(rows + 1)]
    for i in range(rows - 1, -1, -1):
        for j in range(columns - 1, -1, -1):
            if matches(expected[i], actual[j]):
                table[i][j] = table[i + 1][j + 1] + 1
            else:
                table[i][j] = max(table[i + 1][j], table[i][j + 1])
    pairs: dict[int, int] = {}
    i = j = 0
    while i < rows and j < columns:
        if matches(expected[i], actual[j]) and table[i][j] == table[i + 1][j + 1] + 1:
            pairs[i] = j
            i, j = i + 1, j + 1
        elif table[i + 1][j] >= table[i][j + 1]:
            i += 1
        else:
            j += 1
    return pairs


@dataclass(frozen=True)
class ExpectedToolCalls(_BuiltIn):
    """The trajectory made the item's expected tool calls (τ-bench's action check).

    - `arguments`: "subset" (each expected argument present with an equal value, nested objects
      compared as subsets too) or "exact" (the same arguments, no more);
    - `order`: "ordered" (expected calls appear in this order, possibly with others between them)
      or "unordered";
    - `extra_calls_allowed`: whether calls beyond the expected ones are tolerated.

    score = expected calls matched / expected calls (1.0 when none are expected); passed = every
    expected call matched and, unless extra calls are allowed, no other call was made.
    """

    TYPE: ClassVar[str] = "tool_calls"
    arguments: Literal["subset", "exact"] = "subset"
    order: Literal["ordered", "unordered"] = "unordered"
    extra_calls_allowed: bool = True
    label: str = ""

    def __post_init__(self) -> None:
        self._check_label()
        _check_choice("arguments", self.arguments, ("subset", "exact"))
        _check_choice("order", self.order, ("ordered", "unordered"))
        _check_type("extra_calls_allowed", self.extra_calls_allowed, bool, "true or false")

    def _matches(self, expected: ToolCall, actual: ToolCall) -> bool:
        if expected.name != actual.name:
            return False
        if self.arguments == "exact":
            return _values_equal(dict(expected.arguments), dict(actual.arguments))
        return _values_subset(dict(expected.arguments), dict(actual.arguments))

    def evaluate(self, item: EvalItem, output: EvalOutput) -> Score:
        if item.expected_tool_calls is None:
            raise EvaluationError("the item has no expected tool calls")
        expected, actual = item.expected_tool_calls, output.tool_calls
        pair = _longest_common_subsequence if self.order == "ordered" else _maximum_bipartite_matching
        pairs = pair(expected, actual, self._matches)
        missing = [expected[i] for i in range(len(expected)) if i not in pairs]
        used = set(pairs.values())
        extra = [call for j, call in enumerate(actual) if j not in used]
        score = len(pairs) / len(expected) if expected else 1.0
        passed = not missing and (self.extra_calls_allowed or not extra)
        parts = [f"{len(pairs)}/{len(expected)} expected calls matched ({self.order}, {self.arguments} arguments)"]
        if missing:
            parts.append("missing: " + ", ".join(_call_text(call) for call in missing[:5]))
        if extra:
            allowed = "allowed" if self.extra_calls_allowed else "not allowed"
            parts.append(f"{len(extra)} extra call(s), {allowed}: " + ", ".join(_call_text(call) for call in extra[:5]))
        return self._score(score, passed, "; ".join(parts))


@dataclass(frozen=True)
class FinalStateMatch(_BuiltIn):
    """The recorded final state holds the item's expected state (`subset`), or is exactly it (`exact`).

    score = expected keys matched / expected keys, with keys the expected state lacks counted as
    misses in `exact` mode; values compare as in `tool_calls` (nested objects as subsets in `subset`).
    """

    TYPE: ClassVar[str] = "final_state"
    mode: Literal["subset", "exact"] = "subset"
    label: str = ""

    def __post_init__(self) -> None:
        self._check_label()
        _check_choice("mode", self.mode, ("subset", "exact"))

    def evaluate(self, item: EvalItem, output: EvalOutput) -> Score:
        if item.expected_final_state is None:
            raise EvaluationError("the item has no expected final state")
        expected = item.expected_final_state
        if output.final_state is None:
            return self._verdict(False, "the output recorded no final state")
        actual = output.final_state
        compare = _values_equal if self.mode == "exact" else _values_subset
        wrong = [key for key in expected if key not in actual or not compare(expected[key], actual[key])]
        extra = [key for key in actual if key not in expected] if self.mode == "exact" else []
        total = len(expected) + len(extra)
        score = (len(expected) - len(wrong)) / total if total else 1.0
        passed = not wrong and not extra
        if passed:
            return self._score(score, passed, f"final state matches ({self.mode}, {len(expected)} keys)")
        parts = []
        for key in wrong[:5]:
            got = _shorten(actual[key], 60) if key in actual else "missing"
            parts.append(f"{key}: expected {_shorten(expected[key], 60)}, got {got}")
        if extra:
            parts.append("unexpected keys: " + ", ".join(str(key) for key in extra[:5]))
        return self._score(score, passed, "; ".join(parts))


# --- embedding similarity -----------------------------------------------------------------------------


@dataclass(frozen=True)
class EmbeddingSimilarity(_BuiltIn):
    """Cosine similarity of the output to the reference with Keel's offline embedding ≥ `threshold`.

    `routing.embedding.embed_offline` hashes content words and character trigrams: it rewards shared
    vocabulary, knows no synonyms and ignores negation (see its module docstring), so it suits answers
    that should restate the reference, not paraphrase checks. score = max(0, cosine).
    """

    TYPE: ClassVar[str] = "embedding_similarity"
    threshold: float = 0.8
    label: str = ""

    def __post_init__(self) -> None:
        self._check_label()
        _check_type("threshold", self.threshold, (int, float), "a number")
        if not 0.0 <= self.threshold <= 1.0:
            raise EvaluatorConfigError("threshold", f"must be within 0..1, got {self.threshold!r}")

    def evaluate(self, item: EvalItem, output: EvalOutput) -> Score:
        reference = _reference(item)
        similarity = embedding.cosine(embedding.embed_offline(output.text), embedding.embed_offline(reference))
        score = min(1.0, max(0.0, similarity))
        passed = similarity >= self.threshold
        relation = "≥" if passed else "<"
        return self._score(score, passed, f"cosine similarity {similarity:.3f} {relation} threshold {self.threshold:g}")


# --- custom verifiers ---------------------------------------------------------------------------------

VerifierFunction = Callable[[EvalItem, EvalOutput], "Score | bool | float"]


@dataclass(frozen=True)
class CustomVerifier:
    """A Python function registered with `@verifier`; its result is normalised into a Score.

    A bool is passed/failed (1.0 or 0.0); a number in 0..1 is the score, passed when ≥ `pass_threshold`;
    a Score is kept with this verifier's name and version stamped on it. Anything else raises, which
    `evaluate_safely` records as an errored item.
    """

    name: str
    version: Version
    function: VerifierFunction
    pass_threshold: float = 1.0

    def evaluate(self, item: EvalItem, output: EvalOutput) -> Score:
        result = self.function(item, output)
        if isinstance(result, Score):
            return dataclasses.replace(result, evaluator=self.name, version=self.version)
        if isinstance(result, bool):
            return Score(self.name, self.version, 1.0 if result else 0.0, result)
        if isinstance(result, int | float):
            value = float(result)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"verifier {self.name!r} returned {result!r}, outside 0..1")
            return Score(self.name, self.version, value, value >= self.pass_threshold)
        raise TypeError(f"verifier {self.name!r} returned {type(result).__name__}; expected a Score, bool or number")


class VerifierRegistry:
    """Custom verifiers by (name, version). Eval suites refer to them by name in their configs."""

    def __init__(self) -> None:
        self._verifiers: dict[tuple[str, Version], CustomVerifier] = {}

    def register(
        self, name: str, version: Version, function: VerifierFunction, *, pass_threshold: float = 1.0
    ) -> CustomVerifier:
        if not isinstance(name, str) or not name:
            raise ValueError("a verifier needs a non-empty name")
        if isinstance(version, bool) or not isinstance(version, int | str):
            raise ValueError(f"a verifier version is an int or a string, got {version!r}")
        if (name, version) in self._verifiers:
            raise VerifierAlreadyRegistered(f"verifier {name!r} version {version!r} is already registered")
        if not 0.0 <= pass_threshold <= 1.0:
            raise ValueError(f"pass_threshold must be within 0..1, got {pass_threshold!r}")
        registered = CustomVerifier(name, version, function, pass_threshold)
        self._verifiers[(name, version)] = registered
        return registered

    def verifier(
        self, name: str, *, version: Version = 1, pass_threshold: float = 1.0
    ) -> Callable[[VerifierFunction], VerifierFunction]:
        def decorate(function: VerifierFunction) -> VerifierFunction:
            self.register(name, version, function, pass_threshold=pass_threshold)
            return function

        return decorate

    def get(self, name: str, version: Version | None = None) -> CustomVerifier:
        """The verifier `name` at `version`; without a version, the one registered last under that name."""
        if version is not None:
            try:
                return self._verifiers[(name, version)]
            except KeyError:
                raise VerifierNotFound(f"no verifier {name!r} version {version!r}") from None
        for (registered_name, _), registered in reversed(self._verifiers.items()):
            if registered_name == name:
                return registered
        raise VerifierNotFound(f"no verifier {name!r}")

    def available(self) -> list[tuple[str, Version]]:
        """(name, version) of every registered verifier, in registration order."""
        return list(self._verifiers)


registry = VerifierRegistry()


def verifier(
    name: str, *, version: Version = 1, pass_threshold: float = 1.0
) -> Callable[[VerifierFunction], VerifierFunction]:
    """Register `function(item, output) -> Score | bool | float` as the custom verifier `name` at `version`.

    Registering the same name and version twice raises `VerifierAlreadyRegistered`: a changed
    function needs a new version, or old and new scores would claim the same provenance.
    """
    return registry.verifier(name, version=version, pass_threshold=pass_threshold)


def verifier_get(name: str, version: Version | None = None) -> CustomVerifier:
    return registry.get(name, version)


def verifiers_available() -> list[tuple[str, Version]]:
    return registry.available()


# --- construction from config -------------------------------------------------------------------------

BUILT_INS: dict[str, type[_BuiltIn]] = {
    evaluator.TYPE: evaluator
    for evaluator in (
        ExactMatch,
        NormalisedMatch,
        RegexMatch,
        JsonSchemaMatch,
        NumericTolerance,
        ExpectedToolCalls,
        FinalStateMatch,
        EmbeddingSimilarity,
    )
}
CUSTOM_TYPE = "custom"


def evaluator_from_config(config: Mapping[str, Any], *, verifiers: VerifierRegistry | None = None) -> Evaluator:
    """An evaluator from its stored config: {"type": "regex", "pattern": "...", ...}.

    Raises `EvaluatorConfigError` naming the field for an unknown type, an unknown key or a bad value.
    {"type": "custom", "name": ..., "version": ...} looks up a registered custom verifier.
    """
    if not isinstance(config, Mapping):
        raise EvaluatorConfigError("type", f"an evaluator config is an object, got {type(config).__name__}")
    kind = config.get("type")
    if kind is None:
        raise EvaluatorConfigError("type", "is required")
    known = [*BUILT_INS, CUSTOM_TYPE]
    _check_choice("type", kind, known)
    settings = {key: value for key, value in config.items() if key != "type"}
    if kind == CUSTOM_TYPE:
        return _custom_from_config(settings, verifiers or registry)
    evaluator_class = BUILT_INS[kind]
    accepted = {item.name for item in dataclasses.fields(evaluator_class) if item.init}  # type: ignore[arg-type]
    for key in settings:
        if key not in accepted:
            raise EvaluatorConfigError(str(key), f"is not a setting of {kind}; known: {', '.join(sorted(accepted))}")
    for key, value in settings.items():
        if isinstance(value, list):
            settings[key] = tuple(value)
    try:
        built = evaluator_class(**settings)
    except TypeError as error:  # pragma: no cover - unknown keys are caught above
        raise EvaluatorConfigError("type", str(error)) from error
    assert isinstance(built, Evaluator)
    return built


def _custom_from_config(settings: Mapping[str, Any], verifiers: VerifierRegistry) -> Evaluator:
    for key in settings:
        if key not in ("name", "version"):
            raise EvaluatorConfigError(str(key), "is not a setting of custom; known: name, version")
    name = settings.get("name")
    if not isinstance(name, str) or not name:
        raise EvaluatorConfigError("name", "a custom verifier config needs the verifier's name")
    version = settings.get("version")
    if version is not None and (isinstance(version, bool) or not isinstance(version, int | str)):
        raise EvaluatorConfigError("version", f"must be an int or a string, got {version!r}")
    try:
        return verifiers.get(name, version)
    except VerifierNotFound as error:
        raise EvaluatorConfigError("name", str(error)) from error


__all__ = [
    "BUILT_INS",
    "ActionRecord",
    "CustomVerifier",
    "EmbeddingSimilarity",
    "EvalItem",
    "EvalOutput",
    "EvaluationError",
    "Evaluator",
    "EvaluatorConfigError",
    "ExactMatch",
    "ExpectedToolCalls",
    "FinalStateMatch",
    "JsonSchemaMatch",
    "NormalisedMatch",
    "NumericTolerance",
    "RegexMatch",
    "Score",
    "ToolCall",
    "TrajectoryFacts",
    "VerifierAlreadyRegistered",
    "VerifierNotFound",
    "VerifierRegistry",
    "evaluate_safely",
    "evaluator_from_config",
    "normalise_text",
    "registry",
    "verifier",
    "verifier_get",
    "verifiers_available",
]
