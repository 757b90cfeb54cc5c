"""An agent's guardrail policy: its shape, the default its requirements derive, the rules a saved policy must
keep, and the action boundary it configures (allow-list, argument constraints, approvals, rate limits).

Pure module: no Django. The services store the document and call `policy_errors` on every save; the
evaluation service and the action boundary read it through `ToolPolicy` and `rule_for`.

Mandatory checks come from `derived_configuration(...).mandatory_guardrails`: a saved policy may make them
stricter but may not switch them off (no rule, or `allow`), and PII on the input of an agent whose privacy
answer says to redact or pseudonymise must redact or block.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any, Literal

import regex
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agent_registry.requirements import PiiHandling, Requirements, derived_configuration
from guardrails.interface import Action, Layer
from guardrails.pii import PII_KINDS

# Most severe first: when several checks hit, the first of these among their actions wins.
SEVERITY: tuple[Action, ...] = (Action.BLOCK, Action.REQUIRE_APPROVAL, Action.REDACT, Action.FLAG, Action.ALLOW)
TEXT_CHECKS = (
    "prompt_injection",
    "indirect_injection",
    "pii",
    "secrets",
    "system_prompt_leakage",
    "output_handling",
    "toxicity",
    "topic",
)
# Checks whose result carries the content with the finding taken out; `redact` means nothing for others.
REDACTABLE_CHECKS = frozenset({"pii", "secrets"})
# Mandatory guardrails that are not text checks, so a policy cannot switch them off: the action boundary
# (enforced in the gateway) and budgets (guardrails/budgets.py; not yet called by the gateway).
STRUCTURAL_CHECKS = frozenset({"action_boundary", "budget"})
# The argument a derived `autonomy_limit_usd` constrains unless the policy names another.
DEFAULT_AMOUNT_ARGUMENT = "amount"
SLUG = r"^[a-z][a-z0-9_]{0,63}$"

# A `matches` constraint runs a pattern the policy's author wrote on an argument the model wrote. Some
# patterns backtrack catastrophically (`(a+)+$`, `(\w+\s?)+$` on a long argument) and would hold the request's
# thread for minutes, so every match runs under this time limit (the `regex` engine stops itself). A match
# that runs out proves nothing, so the constraint counts as broken: the call is blocked or waits for a
# person, as the constraint says (fail closed), and the refusal is recorded as `failed_closed`.
PATTERN_TIMEOUT_SECONDS = 0.05

Operator = Literal["<=", "<", ">=", ">", "==", "!=", "in", "not_in", "matches"]
NUMERIC_OPERATORS = frozenset({"<=", "<", ">=", ">"})


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


class CheckRule(Strict):
    check: Annotated[str, Field(max_length=64)]
    layer: Layer
    action: Action
    # None: the check's own decision (`triggered`); a number: a hit is score >= threshold.
    threshold: Annotated[float, Field(ge=0, le=1)] | None = None

    @field_validator("check")
    @classmethod
    def _known_check(cls, value: str) -> str:
        if value not in TEXT_CHECKS:
            raise ValueError(f"unknown check {value!r}; the checks are {', '.join(TEXT_CHECKS)}")
        return value

    @model_validator(mode="after")
    def _redact_only_where_possible(self) -> CheckRule:
        if self.action is Action.REDACT and self.check not in REDACTABLE_CHECKS:
            raise ValueError(f"{self.check} cannot redact; use flag, block or require_approval")
        return self


class ModelCheckRule(Strict):
    """A check that asks a model: an LLM judge with instructions, or a guard model (Llama Guard style)."""

    name: Annotated[str, Field(pattern=SLUG)]
    kind: Literal["llm_judge", "guard_model"]
    layer: Layer
    target: Annotated[str, Field(min_length=1, max_length=100)]  # a ModelTarget alias of the workspace
    action: Action = Action.BLOCK
    threshold: Annotated[float, Field(ge=0, le=1)] = 0.5
    instructions: Annotated[str, Field(max_length=4000)] = ""
    timeout_seconds: Annotated[float, Field(gt=0, le=60)] = 5.0
    # Fail closed (the default): a check that errs or times out counts as a hit; fail open lets it pass.
    fail_open: bool = False

    @model_validator(mode="after")
    def _no_redact(self) -> ModelCheckRule:
        if self.action is Action.REDACT:
            raise ValueError("a model-based check cannot redact; use flag, block or require_approval")
        if self.kind == "llm_judge" and not self.instructions:
            raise ValueError("an llm_judge check needs instructions: what counts as a violation")
        return self


class ArgumentConstraint(Strict):
    tool: Annotated[str, Field(min_length=1, max_length=200)]
    argument: Annotated[str, Field(min_length=1, max_length=200)]  # dotted for nested: "refund.amount"
    op: Operator
    value: Any
    on_violation: Literal["block", "require_approval"] = "block"

    @model_validator(mode="after")
    def _value_fits_operator(self) -> ArgumentConstraint:
        if self.op in NUMERIC_OPERATORS and _number(self.value) is None:
            raise ValueError(f"{self.op} needs a number, not {self.value!r}")
        if self.op in ("in", "not_in") and not isinstance(self.value, list):
            raise ValueError(f"{self.op} needs a list of values")
        if self.op == "matches":
            if not isinstance(self.value, str) or len(self.value) > 500:
                raise ValueError("matches needs a regular expression (at most 500 characters)")
            try:
                # The engine the constraint runs on (see PATTERN_TIMEOUT_SECONDS), so what saves also runs.
                regex.compile(self.value)
            except regex.error as error:
                raise ValueError(f"invalid regular expression: {error}") from None
        return self

    def describe(self) -> str:
        return f"{self.tool}.{self.argument} {self.op} {json.dumps(self.value, default=str)}"


class RateLimit(Strict):
    tool: Annotated[str, Field(min_length=1, max_length=200)]  # "*": every tool, counted together
    per_conversation: Annotated[int, Field(ge=0)] | None = None
    per_day: Annotated[int, Field(ge=0)] | None = None

    @model_validator(mode="after")
    def _has_limit(self) -> RateLimit:
        if self.per_conversation is None and self.per_day is None:
            raise ValueError("a rate limit needs per_conversation, per_day or both")
        return self


class PolicyDocument(Strict):
    checks: list[CheckRule] = Field(default_factory=list, max_length=50)
    model_checks: list[ModelCheckRule] = Field(default_factory=list, max_length=10)
    pii_kinds: list[Annotated[str, Field(max_length=32)]] | None = None  # None: every kind the check knows
    pseudonymize: bool = False
    allowed_topics: list[Annotated[str, Field(max_length=200)]] = Field(default_factory=list, max_length=100)
    tool_constraints: list[ArgumentConstraint] = Field(default_factory=list, max_length=100)
    rate_limits: list[RateLimit] = Field(default_factory=list, max_length=100)
    approval_tools: list[Annotated[str, Field(max_length=200)]] = Field(default_factory=list, max_length=100)
    amount_arguments: dict[str, str] = Field(default_factory=dict)  # tool → argument its autonomy limit reads
    approval_ttl_hours: Annotated[int, Field(ge=1, le=24 * 30)] = 24
    # Through the gateway an answer that an output check may block or redact is sent once it passed, as a
    # whole. With `stream_live` it streams as the model writes it, and the output checks run after it has
    # gone out: they record what they find but can no longer block or redact it.
    stream_live: bool = False

    @model_validator(mode="after")
    def _unique(self) -> PolicyDocument:
        pairs = [(rule.check, rule.layer) for rule in self.checks]
        duplicates = sorted({f"{check} on {layer.value}" for check, layer in pairs if pairs.count((check, layer)) > 1})
        if duplicates:
            raise ValueError(f"one rule per check and layer: {', '.join(duplicates)} appear more than once")
        names = [rule.name for rule in self.model_checks]
        clashes = sorted({name for name in names if names.count(name) > 1 or name in TEXT_CHECKS})
        if clashes:
            raise ValueError(f"model check names must be unique and differ from built-in checks: {', '.join(clashes)}")
        return self

    def rules_for(self, layer: Layer, source: str = "user") -> list[CheckRule]:
        return [rule for rule in self.checks if rule.layer is layer and check_applies(rule.check, layer, source)]

    def model_rules_for(self, layer: Layer) -> list[ModelCheckRule]:
        return [rule for rule in self.model_checks if rule.layer is layer]


def check_applies(check: str, layer: Layer, source: str) -> bool:
    """Indirect injection is instructions hidden in data: on the input layer it reads documents, tool results
    and other agents' messages, not what the user typed (direct injection covers that)."""
    return not (check == "indirect_injection" and layer is Layer.INPUT and source == "user")


# --- Defaults and mandatory rules -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Mandatory:
    check: str
    layer: Layer
    why: str


def mandatory_checks(requirements: Requirements | None) -> list[Mandatory]:
    """The text checks the requirements make mandatory (the boundary and budgets are always enforced)."""
    if requirements is None:
        return [Mandatory("system_prompt_leakage", Layer.OUTPUT, "every agent has a system prompt to protect")]
    derived = derived_configuration(requirements).mandatory_guardrails.value
    return [
        Mandatory(item["check"], Layer(item["layer"]), item["why"])
        for item in derived
        if item["check"] not in STRUCTURAL_CHECKS
    ]


# What a default rule does on a hit, per (check, layer); a mandatory pair gets at least this.
_DEFAULT_ACTIONS: dict[tuple[str, Layer], Action] = {
    ("prompt_injection", Layer.INPUT): Action.BLOCK,
    ("indirect_injection", Layer.INPUT): Action.FLAG,
    ("indirect_injection", Layer.TOOL): Action.BLOCK,
    ("pii", Layer.INPUT): Action.REDACT,
    ("pii", Layer.OUTPUT): Action.REDACT,
    ("pii", Layer.TOOL): Action.FLAG,
    ("secrets", Layer.OUTPUT): Action.REDACT,
    ("system_prompt_leakage", Layer.OUTPUT): Action.BLOCK,
    ("output_handling", Layer.OUTPUT): Action.FLAG,
    ("toxicity", Layer.OUTPUT): Action.FLAG,
}


def default_policy(requirements: Requirements | None) -> PolicyDocument:
    """The policy an agent runs until one is saved: the mandatory checks with their default actions, plus
    the cheap output checks every agent benefits from (secrets, output handling, toxicity) and injection
    on input, flagged where not mandatory."""
    pairs: dict[tuple[str, Layer], Action] = {}
    for item in mandatory_checks(requirements):
        pairs[(item.check, item.layer)] = _DEFAULT_ACTIONS.get((item.check, item.layer), Action.BLOCK)
    for check, layer in (
        ("prompt_injection", Layer.INPUT),
        ("indirect_injection", Layer.INPUT),
        ("secrets", Layer.OUTPUT),
        ("output_handling", Layer.OUTPUT),
        ("toxicity", Layer.OUTPUT),
    ):
        pairs.setdefault(
            (check, layer), Action.FLAG if check == "prompt_injection" else _DEFAULT_ACTIONS[(check, layer)]
        )
    pseudonymize = (
        requirements is not None and requirements.constraints.privacy.pii_handling is PiiHandling.PSEUDONYMIZE
    )
    rules = [CheckRule(check=check, layer=layer, action=action) for (check, layer), action in pairs.items()]
    layer_order = list(Layer)
    rules.sort(key=lambda rule: (layer_order.index(rule.layer), TEXT_CHECKS.index(rule.check)))
    return PolicyDocument(checks=rules, pseudonymize=pseudonymize)


def policy_errors(document: PolicyDocument, requirements: Requirements | None) -> list[dict[str, str]]:
    """Why a policy may not be saved: [{"field", "message"}]; empty when it keeps every mandatory check and
    names only PII kinds the check knows."""
    errors: list[dict[str, str]] = []
    # The PII check looks for the kinds named and no others: an unknown name alone would find nothing.
    unknown = sorted(set(document.pii_kinds or ()) - set(PII_KINDS))
    if unknown:
        errors.append(
            {"field": "pii_kinds", "message": f"unknown: {', '.join(unknown)}; the kinds are {', '.join(PII_KINDS)}"}
        )
    # An empty list names no kind, so every PII rule would find nothing and pass personal data through,
    # mandatory or not; null is what means "every kind".
    if document.pii_kinds == [] and any(rule.check == "pii" for rule in document.checks):
        errors.append(
            {
                "field": "pii_kinds",
                "message": "an empty list switches the pii rules off; use null for every kind, or name the kinds",
            }
        )
    errors += _tool_name_errors(document, requirements)
    by_pair = {(rule.check, rule.layer): rule for rule in document.checks}
    for item in mandatory_checks(requirements):
        rule = by_pair.get((item.check, item.layer))
        field = f"checks.{item.check}.{item.layer.value}"
        if rule is None or rule.action is Action.ALLOW:
            errors.append({"field": field, "message": f"{item.check} on {item.layer.value} is mandatory ({item.why})"})
        elif item.check == "pii" and item.layer is Layer.INPUT and rule.action not in (Action.REDACT, Action.BLOCK):
            errors.append(
                {
                    "field": field,
                    "message": f"pii on input must redact or block ({item.why})",
                }
            )
    return errors


def _tool_name_errors(document: PolicyDocument, requirements: Requirements | None) -> list[dict[str, str]]:
    """Tool rules that name a tool the agent cannot call apply to nothing: a typo (`issue_refnd`) would leave
    the real tool unconstrained, unlimited or ungated with no sign of it."""
    allow_list = (
        frozenset(derived_configuration(requirements).tool_allow_list.value)
        if requirements is not None
        else frozenset()
    )
    known = ", ".join(sorted(allow_list)) or "none: its requirements list no actions"
    named = [
        *((f"tool_constraints.{index}.tool", rule.tool) for index, rule in enumerate(document.tool_constraints)),
        *(
            (f"rate_limits.{index}.tool", rule.tool)
            for index, rule in enumerate(document.rate_limits)
            if rule.tool != "*"
        ),
        *((f"approval_tools.{index}", tool) for index, tool in enumerate(document.approval_tools)),
        *((f"amount_arguments.{tool}", tool) for tool in document.amount_arguments),
    ]
    return [
        {"field": field, "message": f"{tool!r} is not a tool this agent may call; its tools are {known}"}
        for field, tool in named
        if tool not in allow_list
    ]


def policy_enforced(document: PolicyDocument, requirements: Requirements | None) -> PolicyDocument:
    """The document with every mandatory check in force. A saved policy was valid when saved, but the
    requirements may have changed since (a new tool makes injection mandatory): a missing or weakened
    mandatory rule runs with its default action until the policy is saved again."""
    if not policy_errors(document, requirements):
        return document
    by_pair = {(rule.check, rule.layer): rule for rule in document.checks}
    for item in mandatory_checks(requirements):
        default = _DEFAULT_ACTIONS.get((item.check, item.layer), Action.BLOCK)
        rule = by_pair.get((item.check, item.layer))
        weak = rule is None or rule.action is Action.ALLOW
        if item.check == "pii" and item.layer is Layer.INPUT and rule is not None:
            weak = weak or rule.action not in (Action.REDACT, Action.BLOCK)
        if weak:
            by_pair[(item.check, item.layer)] = CheckRule(
                check=item.check, layer=item.layer, action=default, threshold=rule.threshold if rule else None
            )
    return document.model_copy(update={"checks": list(by_pair.values())})


# --- Combining --------------------------------------------------------------------------------


def action_combine(actions: Iterable[Action]) -> Action:
    """The most severe action: block > require_approval > redact > flag > allow."""
    present = set(actions)
    return next((action for action in SEVERITY if action in present), Action.ALLOW)


# --- The action boundary ----------------------------------------------------------------------


def canonical_arguments(arguments: Any) -> str:
    """One text per argument set, whatever the key order, so a retried call matches its approval."""
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def arguments_hash(arguments: Any) -> str:
    return hashlib.sha256(canonical_arguments(arguments).encode()).hexdigest()


def _number(value: Any) -> Decimal | None:
    if isinstance(value, bool) or not isinstance(value, (int, float, str, Decimal)):
        return None
    try:
        number = Decimal(str(value))
    except InvalidOperation:
        return None
    return number if number.is_finite() else None


def _json_number(value: Decimal) -> int | float:
    return int(value) if value == value.to_integral_value() else float(value)


_MISSING = object()


def _argument(arguments: Any, path: str) -> Any:
    node = arguments
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _equal(left: Any, right: Any) -> bool:
    left_number, right_number = _number(left), _number(right)
    if left_number is not None and right_number is not None and not isinstance(left, str | bool):
        return left_number == right_number
    return bool(left == right)


class PatternFailed(Exception):
    """A `matches` pattern could not decide: it ran past PATTERN_TIMEOUT_SECONDS, or the engine refused it."""


def constraint_holds(constraint: ArgumentConstraint, arguments: Any) -> bool:
    """Whether the call's arguments satisfy the constraint; a missing or mistyped argument does not.
    Raises PatternFailed when a `matches` pattern cannot decide in time."""
    actual = _argument(arguments, constraint.argument)
    if actual is _MISSING:
        return False
    op = constraint.op
    if op in NUMERIC_OPERATORS:
        number, bound = _number(actual), _number(constraint.value)
        if number is None or bound is None or isinstance(actual, str):
            return False
        return {
            "<=": number <= bound,
            "<": number < bound,
            ">=": number >= bound,
            ">": number > bound,
        }[op]
    if op == "==":
        return _equal(actual, constraint.value)
    if op == "!=":
        return not _equal(actual, constraint.value)
    if op in ("in", "not_in"):
        found = any(_equal(actual, candidate) for candidate in constraint.value)
        return found if op == "in" else not found
    # matches: the whole text must match, and only text can.
    if not isinstance(actual, str):
        return False
    try:
        return regex.fullmatch(constraint.value, actual, timeout=PATTERN_TIMEOUT_SECONDS) is not None
    except TimeoutError:
        raise PatternFailed(f"its pattern ran past {PATTERN_TIMEOUT_SECONDS * 1000:.0f} ms on this argument") from None
    except regex.error as error:  # a document saved before patterns were compiled with this engine
        raise PatternFailed(f"its pattern cannot run: {error}") from None


Decision = Literal["allow", "block", "require_approval"]


@dataclass(frozen=True, slots=True)
class Assessment:
    decision: Decision
    reason: str
    # A constraint that could not be checked (its pattern ran out of time) counted as broken.
    failed_closed: bool = False


@dataclass(frozen=True, slots=True)
class ToolPolicy:
    allow_list: frozenset[str]
    approval_always: frozenset[str]
    constraints: tuple[ArgumentConstraint, ...]
    rate_limits: tuple[RateLimit, ...]
    approval_ttl_hours: int

    def assess(self, tool: str, arguments: Any) -> Assessment:
        """What the policy says of a call before counting and approvals: blocked, gated, or allowed."""
        if tool not in self.allow_list:
            return Assessment("block", f"{tool} is not on this agent's tool allow-list")
        gated: list[str] = []
        failed_closed = False
        for constraint in self.constraints:
            if constraint.tool != tool:
                continue
            try:
                if constraint_holds(constraint, arguments):
                    continue
                why = ""
            except PatternFailed as failure:
                failed_closed = True
                why = f" (not checked: {failure}; counted as broken)"
            if constraint.on_violation == "block":
                return Assessment("block", f"{tool} breaks the constraint {constraint.describe()}{why}", failed_closed)
            gated.append(f"{constraint.describe()} does not hold{why}")
        if tool in self.approval_always:
            gated.insert(0, f"{tool} always needs a person's approval")
        if gated:
            return Assessment("require_approval", "; ".join(gated), failed_closed)
        return Assessment("allow", "")

    def limits_for(self, tool: str) -> list[RateLimit]:
        return [limit for limit in self.rate_limits if limit.tool in (tool, "*")]


def tool_policy(requirements: Requirements | None, document: PolicyDocument) -> ToolPolicy:
    """The action boundary: only the requirements' actions may be called (none without requirements);
    `always` approval rules and the policy's `approval_tools` wait for a person; an autonomy limit becomes
    `<tool>.amount <= limit`, which waits for a person when broken; the policy's own constraints block."""
    allow_list: frozenset[str] = frozenset()
    always: set[str] = set(document.approval_tools)
    derived_constraints: list[ArgumentConstraint] = []
    if requirements is not None:
        configuration = derived_configuration(requirements)
        allow_list = frozenset(configuration.tool_allow_list.value)
        for rule in configuration.approval_rules.value:
            if rule["approval"] == "always":
                always.add(rule["action"])
            elif rule["approval"] == "above_amount":
                derived_constraints.append(
                    ArgumentConstraint(
                        tool=rule["action"],
                        argument=document.amount_arguments.get(rule["action"], DEFAULT_AMOUNT_ARGUMENT),
                        op="<=",
                        value=_json_number(Decimal(rule["amount_usd"])),
                        on_violation="require_approval",
                    )
                )
    return ToolPolicy(
        allow_list=allow_list,
        approval_always=frozenset(always),
        constraints=(*document.tool_constraints, *derived_constraints),
        rate_limits=tuple(document.rate_limits),
        approval_ttl_hours=document.approval_ttl_hours,
    )
