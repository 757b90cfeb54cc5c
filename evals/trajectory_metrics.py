"""Trajectory metrics: evaluators of what an agent did on its way to the answer, read from the output's
`TrajectoryFacts` (its actions and their approvals, escalation, steps, cost, latency, triage signals).

Pure (no Django), like `evals.verifiers`, whose types these share: each metric has a `name` (its label,
or its type), a `version` (an int the suite sets, 1 by default) and `evaluate(item, output) -> Score`.
An output without trajectory facts raises `EvaluationError`: the item is errored, not failed, because a
metric that cannot see the trajectory has no verdict to give.

Metrics (each constructible from a config dict with `trajectory_metric_from_config`):

- `policy_compliance`: no gated action ran without a person's approval, every tool-argument
  constraint held, and no tool outside `allowed_tools` ran;
- `tool_use`: the share of actions that neither errored nor were blocked and used an allowed tool,
  and (when the item lists expected tool calls) the expected calls, checked by `verifiers.ExpectedToolCalls`;
- `escalation_accuracy`: the trajectory was handed to a person exactly when the item says it should be;
- `steps`, `cost`, `latency`: within a bound; past it the score degrades as bound / value;
- `signals`: none of the triage signals in `fail_on` (by default any signal) was found;
- `task_success`: the trajectory ended ok and was not escalated (unless escalation counts as success).

A bad configuration raises `EvaluatorConfigError` naming the field ("constraints[1].max"), when the
metric is built, so a suite with a broken metric is refused when saved.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any, ClassVar, Literal

from evals.verifiers import (
    ActionRecord,
    EvalItem,
    EvalOutput,
    EvaluationError,
    Evaluator,
    EvaluatorConfigError,
    ExpectedToolCalls,
    Score,
    TrajectoryFacts,
)

# The statuses of an action that took effect (or was handed to the caller to take effect).
RAN_STATUSES = frozenset(("executed", "errored", "client"))
CONSTRAINT_BOUNDS = ("max", "min", "allowed", "pattern")
_LISTED = 5  # violations named in a reason before "and N more"


# --- configuration helpers ----------------------------------------------------------------------------


def _check_type(field_name: str, value: object, types: type | tuple[type, ...], description: str) -> None:
    # bool is an int to Python, never to a config author.
    accepted = types if isinstance(types, tuple) else (types,)
    if (isinstance(value, bool) and bool not in accepted) or not isinstance(value, types):
        raise EvaluatorConfigError(field_name, f"must be {description}, got {value!r}")


def _names(field_name: str, value: object) -> tuple[str, ...]:
    """A list of non-empty names as a tuple; a lone string is refused, not read as its characters."""
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise EvaluatorConfigError(field_name, f"must be a list of tool names, got {value!r}")
    for index, name in enumerate(value):
        if not isinstance(name, str) or not name:
            raise EvaluatorConfigError(f"{field_name}[{index}]", f"must be a non-empty string, got {name!r}")
    return tuple(value)


def _number(value: object) -> Decimal | None:
    """A finite number, or a string that spells one ("12.50"); None for anything else (bools included)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        return Decimal(str(value)) if math.isfinite(value) else None
    if isinstance(value, str):
        try:
            number = Decimal(value.strip())
        except InvalidOperation:
            return None
        return number if number.is_finite() else None
    return None


def _same(expected: object, actual: object) -> bool:
    # JSON semantics, as in the verifiers: true is not 1; numbers compare as numbers ("12.50" is 12.5).
    if isinstance(expected, bool) or isinstance(actual, bool):
        return type(expected) is type(actual) and expected == actual
    if isinstance(expected, int | float) or isinstance(actual, int | float):
        left, right = _number(expected), _number(actual)
        return left is not None and left == right
    return expected == actual


def _listing(items: Sequence[str]) -> str:
    shown = "; ".join(items[:_LISTED])
    return shown if len(items) <= _LISTED else f"{shown}; and {len(items) - _LISTED} more"


def _facts(output: EvalOutput) -> TrajectoryFacts:
    if output.trajectory is None:
        raise EvaluationError("the output has no trajectory facts")
    return output.trajectory


def _plain(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_plain(item) for item in value]
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    return value


class _Metric:
    """Shared by the trajectory metrics: name, version, config and the Score constructors."""

    TYPE: ClassVar[str]

    def config(self) -> dict[str, Any]:
        """The config dict that `trajectory_metric_from_config` turns back into this metric."""
        values = {item.name: _plain(getattr(self, item.name)) for item in dataclasses.fields(self) if item.init}  # type: ignore[arg-type]
        if values.get("label") == "":
            del values["label"]
        return {"type": self.TYPE, **values}

    @property
    def name(self) -> str:
        return str(getattr(self, "label", "")) or self.TYPE

    def _check_common(self) -> None:
        _check_type("label", getattr(self, "label", ""), str, "a string")
        version = getattr(self, "version", 1)
        _check_type("version", version, int, "a positive integer")
        if version < 1:
            raise EvaluatorConfigError("version", f"must be a positive integer, got {version!r}")

    def _set(self, attribute: str, value: object) -> None:
        object.__setattr__(self, attribute, value)  # normalising a frozen dataclass's own field

    def _score(self, score: float, passed: bool, reason: str) -> Score:
        return Score(self.name, getattr(self, "version", 1), score, passed, reason)

    def _verdict(self, passed: bool, reason: str) -> Score:
        return self._score(1.0 if passed else 0.0, passed, reason)


# --- policy compliance --------------------------------------------------------------------------------


def _constraint(index: int, value: object) -> dict[str, Any]:
    where = f"constraints[{index}]"
    if not isinstance(value, Mapping):
        raise EvaluatorConfigError(where, f"must be an object with tool, argument and a bound, got {value!r}")
    known = ("tool", "argument", *CONSTRAINT_BOUNDS)
    for key in value:
        if key not in known:
            raise EvaluatorConfigError(f"{where}.{key}", f"is not a constraint setting; known: {', '.join(known)}")
    for key in ("tool", "argument"):
        if not isinstance(value.get(key), str) or not value.get(key):
            raise EvaluatorConfigError(f"{where}.{key}", f"must be a non-empty string, got {value.get(key)!r}")
    if not any(key in value for key in CONSTRAINT_BOUNDS):
        raise EvaluatorConfigError(where, f"needs at least one of {', '.join(CONSTRAINT_BOUNDS)}")
    constraint: dict[str, Any] = {"tool": value["tool"], "argument": value["argument"]}
    for key in ("max", "min"):
        if key in value:
            if _number(value[key]) is None:
                raise EvaluatorConfigError(f"{where}.{key}", f"must be a number, got {value[key]!r}")
            constraint[key] = value[key]
    if "min" in constraint and "max" in constraint and _bound(constraint, "min") > _bound(constraint, "max"):
        raise EvaluatorConfigError(f"{where}.min", "must not be above max")
    if "allowed" in value:
        allowed = value["allowed"]
        if isinstance(allowed, str | bytes) or not isinstance(allowed, Sequence) or not allowed:
            raise EvaluatorConfigError(f"{where}.allowed", f"must be a non-empty list of values, got {allowed!r}")
        constraint["allowed"] = tuple(allowed)
    if "pattern" in value:
        pattern = value["pattern"]
        if not isinstance(pattern, str):
            raise EvaluatorConfigError(f"{where}.pattern", f"must be a string, got {pattern!r}")
        try:
            re.compile(pattern)
        except re.error as error:
            raise EvaluatorConfigError(f"{where}.pattern", f"does not compile: {error}") from None
        constraint["pattern"] = pattern
    return constraint


def _bound(constraint: Mapping[str, Any], key: str) -> Decimal:
    number = _number(constraint[key])
    assert number is not None  # _constraint refused a bound that is not a number
    return number


def _constraint_broken(constraint: Mapping[str, Any], value: object) -> str | None:
    """Why `value` breaks the constraint, or None when it holds."""
    if "max" in constraint or "min" in constraint:
        number = _number(value)
        if number is None:
            return f"{value!r} is not a number"
        if "max" in constraint and number > _bound(constraint, "max"):
            return f"{value!r} is above the maximum {constraint['max']!r}"
        if "min" in constraint and number < _bound(constraint, "min"):
            return f"{value!r} is below the minimum {constraint['min']!r}"
    if "allowed" in constraint and not any(_same(allowed, value) for allowed in constraint["allowed"]):
        return f"{value!r} is not one of {list(constraint['allowed'])!r}"
    if "pattern" in constraint:
        text = value if isinstance(value, str) else None
        if text is None and _number(value) is not None and not isinstance(value, str):
            text = str(value)
        if text is None or re.fullmatch(constraint["pattern"], text) is None:
            return f"{value!r} does not match {constraint['pattern']!r}"
    return None


@dataclass(frozen=True)
class PolicyCompliance(_Metric):
    """The trajectory kept to the tool policy; score 1.0 when compliant, else 0.0, the reason naming each violation.

    - `gated_actions`: tools that need a person's approval; an action of one that ran ("executed")
      without `approved is True` is a violation. One the guardrails stopped (blocked, waiting for
      approval, rejected) is the policy working, not a violation.
    - `constraints`: [{"tool", "argument", and any of "max", "min", "allowed" (a list), "pattern"}];
      each applies to every call of the tool that ran (executed, errored or handed to the caller),
      approved or not: a constraint is a hard limit, and a limit a person may lift belongs in
      `gated_actions`. Numbers given as strings ("12.50") count as numbers; a bound on an argument that
      is not a number is broken; `pattern` must match the whole value; an absent argument breaks nothing.
    - `allowed_tools`: when given, a call of any other tool that ran is a violation.
    """

    TYPE: ClassVar[str] = "policy_compliance"
    gated_actions: tuple[str, ...] = ()
    constraints: tuple[Mapping[str, Any], ...] = ()
    allowed_tools: tuple[str, ...] | None = None
    version: int = 1
    label: str = ""

    def __post_init__(self) -> None:
        self._check_common()
        self._set("gated_actions", _names("gated_actions", self.gated_actions))
        if self.allowed_tools is not None:
            self._set("allowed_tools", _names("allowed_tools", self.allowed_tools))
        if isinstance(self.constraints, str | bytes | Mapping) or not isinstance(self.constraints, Sequence):
            raise EvaluatorConfigError("constraints", f"must be a list of constraints, got {self.constraints!r}")
        self._set("constraints", tuple(_constraint(index, value) for index, value in enumerate(self.constraints)))

    def violations(self, actions: Sequence[ActionRecord]) -> list[str]:
        found: list[str] = []
        for position, action in enumerate(actions, start=1):
            where = f"action {position} {action.name}"
            if action.status not in RAN_STATUSES:
                continue
            if action.status == "executed" and action.name in self.gated_actions and action.approved is not True:
                found.append(f"{where} ran without approval")
            if self.allowed_tools is not None and action.name not in self.allowed_tools:
                found.append(f"{where} is not an allowed tool")
            for constraint in self.constraints:
                if constraint["tool"] != action.name or constraint["argument"] not in action.arguments:
                    continue
                broken = _constraint_broken(constraint, action.arguments[constraint["argument"]])
                if broken is not None:
                    found.append(f"{where}: {constraint['argument']} {broken}")
        return found

    def evaluate(self, item: EvalItem, output: EvalOutput) -> Score:
        facts = _facts(output)
        found = self.violations(facts.actions)
        if found:
            return self._verdict(False, f"{len(found)} violation(s): {_listing(found)}")
        return self._verdict(True, f"compliant: {len(facts.actions)} action(s) checked")


# --- tool use -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolUse(_Metric):
    """Tool-use correctness: the share of actions that were neither "errored" nor "blocked" and (when
    `allowed_tools` is given) used an allowed tool; 1.0 when there were none.

    When the item lists expected tool calls they are required as well, checked by
    `verifiers.ExpectedToolCalls` with `arguments` ("subset" or "exact") and `order` ("ordered" or
    "unordered"): the score is then the lower of the two, and passing needs every expected call.
    Passed when the score is at least `pass_threshold`.
    """

    TYPE: ClassVar[str] = "tool_use"
    allowed_tools: tuple[str, ...] | None = None
    pass_threshold: float = 1.0
    arguments: Literal["subset", "exact"] = "subset"
    order: Literal["ordered", "unordered"] = "unordered"
    version: int = 1
    label: str = ""
    _expected: ExpectedToolCalls = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._check_common()
        if self.allowed_tools is not None:
            self._set("allowed_tools", _names("allowed_tools", self.allowed_tools))
        _check_type("pass_threshold", self.pass_threshold, (int, float), "a number")
        if not 0.0 <= self.pass_threshold <= 1.0:
            raise EvaluatorConfigError("pass_threshold", f"must be within 0..1, got {self.pass_threshold!r}")
        # Extra calls are this metric's business (allowed_tools), not the expected-call check's.
        self._set("_expected", ExpectedToolCalls(arguments=self.arguments, order=self.order, extra_calls_allowed=True))

    def evaluate(self, item: EvalItem, output: EvalOutput) -> Score:
        facts = _facts(output)
        wrong: list[str] = []
        for position, action in enumerate(facts.actions, start=1):
            if action.status in ("errored", "blocked"):
                wrong.append(f"action {position} {action.name} {action.status}")
            elif self.allowed_tools is not None and action.name not in self.allowed_tools:
                wrong.append(f"action {position} {action.name} is not an allowed tool")
        total = len(facts.actions)
        score = (total - len(wrong)) / total if total else 1.0
        parts = [f"{total - len(wrong)}/{total} actions correct"]
        if wrong:
            parts.append(_listing(wrong))
        expected_passed = True
        if item.expected_tool_calls is not None:
            expected = self._expected.evaluate(item, output)
            assert expected.score is not None  # ExpectedToolCalls scores or raises
            score = min(score, expected.score)
            expected_passed = expected.passed
            parts.append(expected.reason)
        passed = expected_passed and score >= self.pass_threshold
        return self._score(score, passed, "; ".join(parts))


# --- escalation ---------------------------------------------------------------------------------------


def _should(value: object, key: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise EvaluationError(f"the item's metadata {key!r} is {value!r}, not true or false")


@dataclass(frozen=True)
class EscalationAccuracy(_Metric):
    """The trajectory was handed to a person exactly when the item's metadata says it should have been
    (`metadata_key`, a bool or "true"/"false"); an item that does not say is errored."""

    TYPE: ClassVar[str] = "escalation_accuracy"
    metadata_key: str = "should_escalate"
    version: int = 1
    label: str = ""

    def __post_init__(self) -> None:
        self._check_common()
        _check_type("metadata_key", self.metadata_key, str, "a string")
        if not self.metadata_key:
            raise EvaluatorConfigError("metadata_key", "must not be empty")

    def evaluate(self, item: EvalItem, output: EvalOutput) -> Score:
        facts = _facts(output)
        if self.metadata_key not in item.metadata:
            raise EvaluationError(f"the item's metadata has no {self.metadata_key!r}")
        should = _should(item.metadata[self.metadata_key], self.metadata_key)
        did = "escalated" if facts.escalated else "did not escalate"
        wanted = "should" if should else "should not"
        return self._verdict(should == facts.escalated, f"{did}; the item says it {wanted}")


# --- bounds: steps, cost, latency ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Bounded(_Metric):
    """Passed when the value is at most `max` (required, positive); score 1.0 within the bound, else
    max / value, so a trajectory just over the bound scores just under 1."""

    UNIT: ClassVar[str]
    max: float | None = None
    version: int = 1
    label: str = ""

    def __post_init__(self) -> None:
        self._check_common()
        if self.max is None:
            raise EvaluatorConfigError("max", "is required")
        _check_type("max", self.max, (int, float), "a positive number")
        if not math.isfinite(self.max) or self.max <= 0:
            raise EvaluatorConfigError("max", f"must be a positive number, got {self.max!r}")

    def _value(self, facts: TrajectoryFacts) -> float | None:
        raise NotImplementedError

    def evaluate(self, item: EvalItem, output: EvalOutput) -> Score:
        value = self._value(_facts(output))
        if value is None:
            raise EvaluationError(f"the trajectory facts have no {self.TYPE}")
        assert self.max is not None  # __post_init__ requires it
        if value <= self.max:
            return self._score(1.0, True, f"{value:g} {self.UNIT} ≤ max {self.max:g}")
        return self._score(self.max / value, False, f"{value:g} {self.UNIT} > max {self.max:g}")


@dataclass(frozen=True)
class StepCount(_Bounded):
    """The trajectory took at most `max` steps (model calls and tool calls)."""

    TYPE: ClassVar[str] = "steps"
    UNIT: ClassVar[str] = "steps"

    def _value(self, facts: TrajectoryFacts) -> float | None:
        return facts.steps


@dataclass(frozen=True)
class Cost(_Bounded):
    """The trajectory cost at most `max` USD; errored when its cost is unknown."""

    TYPE: ClassVar[str] = "cost"
    UNIT: ClassVar[str] = "USD"

    def _value(self, facts: TrajectoryFacts) -> float | None:
        return facts.cost_usd


@dataclass(frozen=True)
class Latency(_Bounded):
    """The trajectory took at most `max` milliseconds; errored when its latency is unknown."""

    TYPE: ClassVar[str] = "latency"
    UNIT: ClassVar[str] = "ms"

    def _value(self, facts: TrajectoryFacts) -> float | None:
        return facts.latency_ms


# --- triage signals and task success ------------------------------------------------------------------


@dataclass(frozen=True)
class Signals(_Metric):
    """None of the trajectory's triage signals is in `fail_on` (None: any signal fails); 1.0 or 0.0."""

    TYPE: ClassVar[str] = "signals"
    fail_on: tuple[str, ...] | None = None
    version: int = 1
    label: str = ""

    def __post_init__(self) -> None:
        self._check_common()
        if self.fail_on is not None:
            self._set("fail_on", _names("fail_on", self.fail_on))

    def evaluate(self, item: EvalItem, output: EvalOutput) -> Score:
        facts = _facts(output)
        found = [signal for signal in facts.signals if self.fail_on is None or signal in self.fail_on]
        if found:
            return self._verdict(False, f"signals found: {', '.join(found)}")
        ignored = f" (ignored: {', '.join(facts.signals)})" if facts.signals else ""
        return self._verdict(True, f"no failing signals{ignored}")


@dataclass(frozen=True)
class TaskSuccess(_Metric):
    """The trajectory ended ok and was not escalated, unless `escalation_counts_as_success`."""

    TYPE: ClassVar[str] = "task_success"
    escalation_counts_as_success: bool = False
    version: int = 1
    label: str = ""

    def __post_init__(self) -> None:
        self._check_common()
        _check_type("escalation_counts_as_success", self.escalation_counts_as_success, bool, "true or false")

    def evaluate(self, item: EvalItem, output: EvalOutput) -> Score:
        facts = _facts(output)
        if facts.status != "ok":
            return self._verdict(False, f"the trajectory ended {facts.status}")
        if facts.escalated and not self.escalation_counts_as_success:
            return self._verdict(False, "the trajectory was escalated to a person")
        return self._verdict(True, "ended ok" + (", escalated" if facts.escalated else ""))


# --- construction from config -------------------------------------------------------------------------

TRAJECTORY_METRICS: dict[str, type] = {
    metric.TYPE: metric
    for metric in (PolicyCompliance, ToolUse, EscalationAccuracy, StepCount, Cost, Latency, Signals, TaskSuccess)
}


def trajectory_metric_from_config(config: Mapping[str, Any]) -> Evaluator:
    """A trajectory metric from its stored config: {"type": "cost", "max": 0.05, ...}.

    Raises `EvaluatorConfigError` naming the field for an unknown type, an unknown key or a bad value;
    lists become tuples.
    """
    if not isinstance(config, Mapping):
        raise EvaluatorConfigError("type", f"a metric config is an object, got {type(config).__name__}")
    kind = config.get("type")
    if kind is None:
        raise EvaluatorConfigError("type", "is required")
    if kind not in TRAJECTORY_METRICS:
        raise EvaluatorConfigError("type", f"must be one of {', '.join(TRAJECTORY_METRICS)}, got {kind!r}")
    metric_class = TRAJECTORY_METRICS[kind]
    accepted = {item.name for item in dataclasses.fields(metric_class) if item.init}
    settings: dict[str, Any] = {}
    for key, value in config.items():
        if key == "type":
            continue
        if key not in accepted:
            raise EvaluatorConfigError(str(key), f"is not a setting of {kind}; known: {', '.join(sorted(accepted))}")
        settings[key] = tuple(value) if isinstance(value, list) else value
    built = metric_class(**settings)
    assert isinstance(built, Evaluator)
    return built


__all__ = [
    "TRAJECTORY_METRICS",
    "Cost",
    "EscalationAccuracy",
    "Latency",
    "PolicyCompliance",
    "Signals",
    "StepCount",
    "TaskSuccess",
    "ToolUse",
    "trajectory_metric_from_config",
]
