"""Forms of the dashboard.

The requirements editor names every input by its dotted path in the answers (`io_gap.steps_p95`,
`error_surface.actions.0.name`), the same path that `services.requirements_parse` puts in an error's
`field`, so an error finds its input without a translation table. `requirements_answers_from_post`
and `requirements_form_values` convert between posted data and answers; like the layout they read,
they use no Django, so the round trip is cheap to test.

The other forms are ordinary Django forms: they check shapes (required, JSON, dates) and the
services check the rules, whose errors the views put back on the fields.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from enum import StrEnum
from typing import Any, Literal

from django import forms
from django.utils import timezone

from agent_registry import requirements as req
from agent_registry.models import Agent, Prompt, PromptType, Scope
from config.errors import InvalidJson
from config.json_body import json_loads_storable
from tracing import signals
from tracing.models import DivergencePolicy, ScoreDataType, TrajectoryStatus
from tracing.selectors import TrajectoryFilter

# --- The requirements editor: layout -------------------------------------------------------------

Kind = Literal["select", "text", "textarea", "int", "decimal", "float", "checkbox", "multi", "range"]


@dataclass(frozen=True)
class InputSpec:
    """One input; `key` is its path from the root of the answers, or from its row."""

    key: str
    label: str
    kind: Kind
    choices: tuple[tuple[str, str], ...] = ()
    # Blank means "none" (the answer is null) rather than "not answered".
    optional: bool = False
    help: str = ""
    poles: tuple[str, str] = ("", "")
    placeholder: str = ""
    # Whether the input spans the form's two columns; by default, the kinds that need the room do.
    wide: bool | None = None
    # Columns taken in a row of a repeatable list.
    span: int = 1


@dataclass(frozen=True)
class RowsSpec:
    """A repeatable list of objects (actions, metrics, escalation rules)."""

    key: str
    label: str
    item_label: str
    inputs: tuple[InputSpec, ...]
    help: str = ""
    # The CSS grid columns of one row.
    columns: str = "repeat(4, minmax(0, 1fr))"


@dataclass(frozen=True)
class GroupSpec:
    title: str
    items: tuple[InputSpec | RowsSpec, ...]
    help: str = ""


@dataclass(frozen=True)
class SectionSpec:
    key: str
    title: str
    guidance: str
    groups: tuple[GroupSpec, ...]


def _choices(enum: type[StrEnum], labels: Mapping[str, str] | None = None) -> tuple[tuple[str, str], ...]:
    labels = labels or {}
    return tuple(
        (member.value, labels.get(member.value, member.value.replace("_", " ").capitalize())) for member in enum
    )


TIER_LABELS = {"single_call": "Single call", "chain": "Chain", "agentic": "Agentic loop", "human": "Human"}
_METRIC_INPUTS = (
    InputSpec("name", "Name", "text", placeholder="e.g. resolution_rate"),
    InputSpec("description", "Description", "text"),
    InputSpec("comparator", "Comparator", "select", _choices(req.Comparator, {">=": "≥ at least", "<=": "≤ at most"})),
    InputSpec("target", "Target", "float"),
)

_METRIC_COLUMNS = "minmax(0, 1.3fr) minmax(0, 2fr) minmax(0, 1fr) minmax(0, .8fr)"

_SECTION_GROUPS: dict[str, tuple[GroupSpec, ...]] = {
    "error_surface": (
        GroupSpec(
            "Decision authority",
            (
                InputSpec(
                    "error_surface.decision_authority",
                    "Decision authority",
                    "select",
                    _choices(
                        req.DecisionAuthority,
                        {
                            "advisory": "Advisory: recommends, a human acts",
                            "bounded_autonomy": "Bounded autonomy: acts within guardrails",
                            "full_autonomy": "Full autonomy: decides and acts",
                        },
                    ),
                    help="What may the agent do without a human confirming it?",
                ),
                InputSpec(
                    "error_surface.recoverability",
                    "Recoverability horizon",
                    "select",
                    _choices(req.Recoverability),
                    help="How quickly can a mistake be detected and reversed?",
                ),
            ),
        ),
        GroupSpec(
            "Error cost asymmetry",
            (
                InputSpec(
                    "error_surface.error_cost.worse_direction",
                    "Worse error",
                    "select",
                    _choices(
                        req.ErrorDirection,
                        {
                            "false_positive": "False positives are worse",
                            "false_negative": "False negatives are worse",
                            "symmetric": "Both cost the same",
                        },
                    ),
                ),
                InputSpec(
                    "error_surface.error_cost.ratio",
                    "Cost ratio",
                    "float",
                    help="Cost of the worse error divided by the cost of the other; at least 1.",
                ),
                InputSpec("error_surface.error_cost.description", "Why", "textarea"),
            ),
        ),
        GroupSpec(
            "Action boundary",
            (
                RowsSpec(
                    "error_surface.actions",
                    "Actions",
                    "action",
                    (
                        InputSpec("name", "Name", "text", placeholder="e.g. issue_refund"),
                        InputSpec("description", "Description", "text", span=2),
                        InputSpec("mode", "Mode", "select", _choices(req.ActionMode)),
                        InputSpec("stakes", "Stakes", "select", _choices(req.Stakes)),
                        InputSpec("side_effects", "Side effects", "checkbox"),
                        InputSpec("requires_approval", "Needs approval", "checkbox"),
                        InputSpec(
                            "autonomy_limit_usd", "Autonomy limit (USD)", "decimal", optional=True, placeholder="none"
                        ),
                    ),
                    help="Every tool the agent may call. Actions it executes with side effects (a refund, a "
                    "write) widen the error surface; an autonomy limit lets such an action run on its own up "
                    "to an amount and asks a human above it.",
                ),
                InputSpec("error_surface.notes", "Notes", "textarea"),
            ),
        ),
    ),
    "io_gap": (
        GroupSpec(
            "Information-acquisition steps",
            (
                InputSpec("io_gap.steps_median", "Steps, median case", "int"),
                InputSpec("io_gap.steps_p95", "Steps, 95th percentile", "int"),
                InputSpec(
                    "io_gap.steps_predictable",
                    "The number of steps can be predicted in advance",
                    "checkbox",
                    help="If it depends on what the agent discovers, it cannot.",
                ),
                InputSpec(
                    "io_gap.output_verifiable_from_input",
                    "The output can be verified from the input alone",
                    "checkbox",
                    help="Summaries and extractions can; refunds and code changes need independent checking.",
                ),
                InputSpec(
                    "io_gap.atomic_operations",
                    "Atomic operations",
                    "multi",
                    _choices(req.AtomicOperation, {"decision_action": "Decision / action"}),
                ),
                InputSpec("io_gap.notes", "Notes", "textarea"),
            ),
        ),
    ),
    "constraints": (
        GroupSpec(
            "Latency",
            (
                InputSpec(
                    "constraints.latency.latency_class",
                    "Latency class",
                    "select",
                    _choices(
                        req.LatencyClass,
                        {
                            "inline": "Inline: under 2 s, the user is blocked",
                            "conversational": "Conversational: 2 to 30 s, in a dialogue",
                            "asynchronous": "Asynchronous: minutes to hours, in the background",
                        },
                    ),
                    help="What is the user doing while waiting?",
                ),
                InputSpec("constraints.latency.hard_ceiling_ms", "Hard ceiling (ms)", "int"),
                InputSpec("constraints.latency.notes", "Notes", "textarea"),
            ),
        ),
        GroupSpec(
            "Cost",
            (
                InputSpec("constraints.cost.per_request_ceiling_usd", "Per-request ceiling (USD)", "decimal"),
                InputSpec(
                    "constraints.cost.per_resolution_ceiling_usd",
                    "Per-resolution ceiling (USD)",
                    "decimal",
                    optional=True,
                ),
                InputSpec(
                    "constraints.cost.single_call_cost_usd",
                    "Cost of one model call (USD)",
                    "decimal",
                    optional=True,
                    help="Tier estimates multiply it: chain 3-5x, agentic loop 10-100x.",
                ),
                InputSpec(
                    "constraints.cost.expected_daily_requests", "Expected requests per day", "int", optional=True
                ),
                InputSpec(
                    "constraints.cost.comparison_point",
                    "Comparison point",
                    "text",
                    help="What the agent replaces, e.g. a human support interaction.",
                ),
                InputSpec("constraints.cost.comparison_cost_usd", "Comparison cost (USD)", "decimal", optional=True),
            ),
        ),
        GroupSpec(
            "Privacy and information flow",
            (
                InputSpec(
                    "constraints.privacy.pii_handling",
                    "PII handling",
                    "select",
                    _choices(req.PiiHandling, {"no_pii": "No PII", "pseudonymize": "Pseudonymise"}),
                ),
                InputSpec("constraints.privacy.may_see", "May see", "textarea", wide=False),
                InputSpec("constraints.privacy.may_infer", "May infer", "textarea", wide=False),
                InputSpec("constraints.privacy.may_store", "May store", "textarea", wide=False),
                InputSpec("constraints.privacy.may_transmit", "May transmit", "textarea", wide=False),
            ),
        ),
        GroupSpec(
            "Safety, reversibility and governance",
            (
                InputSpec(
                    "constraints.governance",
                    "Governance level",
                    "select",
                    _choices(req.GovernanceLevel),
                    help="Advisory agents need output monitoring, bounded autonomy policy-compliance "
                    "auditing, full autonomy a full audit trail.",
                ),
            ),
        ),
    ),
    "pareto": (
        GroupSpec(
            "Trade-off axes",
            (
                InputSpec("pareto.quality_vs_speed", "Deliberation", "range", poles=("Quality", "Speed")),
                InputSpec("pareto.autonomy_vs_control", "Agency", "range", poles=("Autonomy", "Control")),
                InputSpec("pareto.generality_vs_reliability", "Scope", "range", poles=("Generality", "Reliability")),
                InputSpec(
                    "pareto.primary_axis",
                    "Primary axis",
                    "select",
                    _choices(
                        req.ParetoAxis,
                        {
                            "quality_speed": "Quality vs speed",
                            "autonomy_control": "Autonomy vs control",
                            "generality_reliability": "Generality vs reliability",
                        },
                    ),
                    help="The axis to optimise; the others are satisficed.",
                ),
                InputSpec("pareto.rationale", "Rationale", "textarea"),
            ),
        ),
    ),
    "evaluation": (
        GroupSpec(
            "Metrics",
            (
                RowsSpec(
                    "evaluation.output_metrics",
                    "Output metrics",
                    "output metric",
                    _METRIC_INPUTS,
                    columns=_METRIC_COLUMNS,
                    help="Measured on the final answer: resolution rate, CSAT, faithfulness.",
                ),
                RowsSpec(
                    "evaluation.trajectory_metrics",
                    "Trajectory metrics",
                    "trajectory metric",
                    _METRIC_INPUTS,
                    columns=_METRIC_COLUMNS,
                    help="Measured on the steps: policy compliance, action appropriateness, escalation accuracy.",
                ),
                InputSpec("evaluation.notes", "Notes", "textarea"),
            ),
        ),
    ),
    "routing": (
        GroupSpec(
            "Tiers",
            (
                InputSpec(
                    "routing.mode",
                    "Mode",
                    "select",
                    _choices(req.RoutingMode, {"single_level": "Single level", "adaptive": "Adaptive"}),
                ),
                InputSpec("routing.enabled_tiers", "Enabled tiers", "multi", _choices(req.Tier, TIER_LABELS)),
                InputSpec("routing.default_tier", "Default tier", "select", _choices(req.Tier, TIER_LABELS)),
                InputSpec("routing.signal", "Routing signal", "select", _choices(req.RoutingSignal)),
            ),
        ),
        GroupSpec(
            "Escalation",
            (
                RowsSpec(
                    "routing.escalation_rules",
                    "Escalation rules",
                    "rule",
                    (
                        InputSpec(
                            "trigger",
                            "Trigger",
                            "select",
                            _choices(req.EscalationTrigger, {"amount_over": "Amount over"}),
                        ),
                        InputSpec("value", "Value", "text", placeholder="terms, intent, amount or threshold"),
                        InputSpec("to_tier", "To tier", "select", _choices(req.Tier, TIER_LABELS)),
                        InputSpec("reason", "Reason", "text"),
                    ),
                    help="When a request moves to a deeper tier, and why.",
                    columns="minmax(0, 1fr) minmax(0, 1.5fr) minmax(0, 1fr) minmax(0, 1.5fr)",
                ),
                InputSpec("routing.notes", "Notes", "textarea"),
            ),
        ),
    ),
}

REQUIREMENTS_SECTIONS: tuple[SectionSpec, ...] = tuple(
    SectionSpec(key, title, guidance, _SECTION_GROUPS[key]) for key, title, guidance in req.QUESTIONS
)


def _walk(sections: Iterable[SectionSpec]) -> Iterable[InputSpec | RowsSpec]:
    for section in sections:
        for group in section.groups:
            yield from group.items


SCALAR_INPUTS: tuple[InputSpec, ...] = tuple(
    item for item in _walk(REQUIREMENTS_SECTIONS) if isinstance(item, InputSpec)
)
ROWS: tuple[RowsSpec, ...] = tuple(item for item in _walk(REQUIREMENTS_SECTIONS) if isinstance(item, RowsSpec))
_SCALARS_BY_NAME = {spec.key: spec for spec in SCALAR_INPUTS}
_ROWS_BY_NAME = {rows.key: rows for rows in ROWS}

# What a new agent's editor starts from: the schema's own defaults, so an untouched input means
# what the schema would have assumed.
REQUIREMENTS_STARTING_ANSWERS: dict[str, Any] = {
    "error_surface": {"error_cost": {"ratio": 1}},
    "io_gap": {"steps_predictable": True},
    "pareto": {"quality_vs_speed": 50, "autonomy_vs_control": 50, "generality_vs_reliability": 50},
    "routing": {"signal": "rules"},
}


# --- The requirements editor: posted data <-> answers ---------------------------------------------

_OMIT = object()
_INTEGER = re.compile(r"^[+-]?\d+$")


def _convert(spec: InputSpec, raw: Sequence[str] | None) -> Any:
    """One input's posted values as an answer; `_OMIT` leaves the key out so the schema reports
    "Field required" (or applies its default) instead of a type error about an empty string."""
    if spec.kind == "checkbox":
        # An unchecked box posts nothing; the editor always renders every box, so absent is false.
        return raw is not None and len(raw) > 0 and raw[-1] not in ("", "off", "false")
    if spec.kind == "multi":
        return [value for value in raw or () if value]
    if raw is None:
        return _OMIT
    text = raw[-1].strip() if raw else ""
    if spec.kind in ("text", "textarea"):
        return text
    if not text:
        return None if spec.optional else _OMIT
    if spec.kind in ("int", "range") and _INTEGER.match(text):
        return int(text)
    if spec.kind == "float":
        try:
            return float(text)
        except ValueError:
            return text
    # Selects and decimals stay strings: the schema parses them exactly (Decimal from "0.50") and
    # anything unparsable comes back as a field error with the schema's own message.
    return text


def _is_blank(spec: InputSpec, raw: Sequence[str] | None) -> bool:
    if spec.kind == "checkbox":
        return not _convert(spec, raw)
    return not any(value.strip() for value in raw or ())


def _set(answers: dict[str, Any], path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    node = answers
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value


def _get(answers: Mapping[str, Any], path: str) -> Any:
    node: Any = answers
    for key in path.split("."):
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return node


def _row_indices(data: Mapping[str, Sequence[str]], rows: RowsSpec) -> list[int]:
    prefix = rows.key + "."
    keys = {spec.key for spec in rows.inputs}
    indices = set()
    for name in data:
        if not name.startswith(prefix):
            continue
        index, _, key = name[len(prefix) :].partition(".")
        if index.isascii() and index.isdigit() and key in keys:
            indices.add(int(index))
    return sorted(indices)


def requirements_answers_from_post(data: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    """Posted editor data (each input name to its list of values) as a nested answers dict.

    Rows may be numbered with gaps (the editor removes rows without renumbering); they keep their
    order, and a row left entirely blank is dropped rather than reported as an invalid item.
    """
    answers: dict[str, Any] = {}
    for spec in SCALAR_INPUTS:
        value = _convert(spec, data.get(spec.key))
        if value is not _OMIT:
            _set(answers, spec.key, value)
    for rows in ROWS:
        items = []
        for index in _row_indices(data, rows):
            raws = {spec.key: data.get(f"{rows.key}.{index}.{spec.key}") for spec in rows.inputs}
            if all(_is_blank(spec, raws[spec.key]) for spec in rows.inputs):
                continue
            item: dict[str, Any] = {}
            for spec in rows.inputs:
                value = _convert(spec, raws[spec.key])
                if value is not _OMIT:
                    item[spec.key] = value
            items.append(item)
        _set(answers, rows.key, items)
    return answers


def _format(spec: InputSpec, value: Any) -> list[str]:
    if spec.kind == "checkbox":
        return ["on"] if value else []
    if spec.kind == "multi":
        return [str(item) for item in value or ()]
    return [""] if value is None else [str(value)]


def requirements_form_values(answers: Mapping[str, Any]) -> dict[str, list[str]]:
    """The inverse of `requirements_answers_from_post`: the values that prefill the editor."""
    values: dict[str, list[str]] = {}
    for spec in SCALAR_INPUTS:
        values[spec.key] = _format(spec, _get(answers, spec.key))
    for rows in ROWS:
        for index, item in enumerate(_get(answers, rows.key) or ()):
            for spec in rows.inputs:
                values[f"{rows.key}.{index}.{spec.key}"] = _format(spec, _get(item, spec.key))
    return values


# --- The requirements editor: errors and findings -------------------------------------------------

_ROW_INPUT = re.compile(r"^(?P<rows>.+)\.(?P<index>\d+)\.(?P<key>[a-z_]+)$")


def input_is_known(name: str) -> bool:
    if name in _SCALARS_BY_NAME:
        return True
    match = _ROW_INPUT.match(name)
    if match is None or match["rows"] not in _ROWS_BY_NAME:
        return False
    return any(spec.key == match["key"] for spec in _ROWS_BY_NAME[match["rows"]].inputs)


def requirements_field_errors(errors: Iterable[Mapping[str, str]]) -> dict[str, list[str]]:
    """Validation errors keyed by the input they belong to.

    A model-level rule reports on its object (`io_gap`) with a message that starts with the field's
    name ("steps_p95 must be at least steps_median"); such an error goes to that field's input.
    Errors about a whole list, row or section keep their path: the editor has a slot for each.
    """
    keyed: dict[str, list[str]] = {}
    for error in errors:
        path = str(error.get("field", ""))
        message = str(error.get("message", "invalid")).removeprefix("Value error, ")
        if not input_is_known(path):
            first_word = message.split(" ", 1)[0]
            candidate = f"{path}.{first_word}" if path and path != "answers" else first_word
            if input_is_known(candidate) or candidate in _ROWS_BY_NAME:
                path = candidate
        keyed.setdefault(path or "answers", []).append(message)
    return keyed


def anchor_id(name: str) -> str:
    """The element id of an input, a list of rows or a section, for links and `aria-describedby`."""
    return "f-" + name.replace(".", "-")


@dataclass(frozen=True)
class FindingTarget:
    name: str
    anchor: str
    label: str


def finding_targets(fields: Iterable[str], values: Mapping[str, Sequence[str]]) -> list[FindingTarget]:
    """The inputs a feasibility finding points at. Findings name an action by its name
    (`error_surface.actions.issue_refund`); the editor names it by its row, found from the values."""
    targets = []
    for path in fields:
        name = path
        if not input_is_known(path) and path not in _ROWS_BY_NAME:
            rows_key, _, item_name = path.rpartition(".")
            if rows_key in _ROWS_BY_NAME:
                prefix = rows_key + "."
                name = next(
                    (
                        key
                        for key, raw in values.items()
                        if key.startswith(prefix) and key.endswith(".name") and list(raw)[-1:] == [item_name]
                    ),
                    rows_key,
                )
        targets.append(FindingTarget(name=name, anchor=anchor_id(name), label=req.field_label(path)))
    return targets


# --- The requirements editor: bound for rendering -------------------------------------------------


@dataclass(frozen=True)
class Option:
    value: str
    label: str
    selected: bool


@dataclass(frozen=True)
class BoundInput:
    spec: InputSpec
    name: str
    id: str
    value: str
    options: tuple[Option, ...]
    errors: tuple[str, ...]
    flagged: bool

    @property
    def checked(self) -> bool:
        return self.spec.kind == "checkbox" and self.value not in ("", "off", "false")

    @property
    def is_wide(self) -> bool:
        if self.spec.wide is not None:
            return self.spec.wide
        return self.spec.kind in ("textarea", "multi", "range")


@dataclass(frozen=True)
class BoundRow:
    index: str
    id: str
    inputs: tuple[BoundInput, ...]
    errors: tuple[str, ...]


@dataclass(frozen=True)
class BoundRows:
    spec: RowsSpec
    id: str
    rows: tuple[BoundRow, ...]
    blank_row: BoundRow
    next_index: int
    errors: tuple[str, ...]
    flagged: bool
    is_rows: bool = True


@dataclass(frozen=True)
class BoundGroup:
    title: str
    help: str
    items: tuple[BoundInput | BoundRows, ...]


@dataclass(frozen=True)
class BoundSection:
    number: int
    key: str
    id: str
    title: str
    guidance: str
    groups: tuple[BoundGroup, ...]
    errors: tuple[str, ...]
    error_count: int
    flagged: bool


@dataclass(frozen=True)
class _Binding:
    values: Mapping[str, Sequence[str]]
    errors: Mapping[str, Sequence[str]]
    flagged: Collection[str]
    error_names: set[str] = field(default_factory=set)

    def input(self, spec: InputSpec, name: str) -> BoundInput:
        raw = list(self.values.get(name, ()))
        value = raw[-1] if raw else ""
        options = tuple(
            Option(choice, label, choice in raw if spec.kind == "multi" else choice == value)
            for choice, label in spec.choices
        )
        errors = tuple(self.errors.get(name, ()))
        if errors:
            self.error_names.add(name)
        return BoundInput(spec, name, anchor_id(name), value, options, errors, name in self.flagged)


def requirements_form_bind(
    values: Mapping[str, Sequence[str]],
    errors: Mapping[str, Sequence[str]] | None = None,
    flagged: Collection[str] = (),
) -> list[BoundSection]:
    """The editor's sections with each input's value, errors, and whether a finding points at it."""
    errors = errors or {}
    sections = []
    for number, section in enumerate(REQUIREMENTS_SECTIONS, start=1):
        binding = _Binding(values, errors, flagged)
        groups = []
        for group in section.groups:
            items: list[BoundInput | BoundRows] = []
            for item in group.items:
                if isinstance(item, InputSpec):
                    items.append(binding.input(item, item.key))
                    continue
                indices = _row_indices(values, item)
                rows = []
                for index in indices:
                    row_name = f"{item.key}.{index}"
                    inputs = tuple(binding.input(spec, f"{row_name}.{spec.key}") for spec in item.inputs)
                    rows.append(BoundRow(str(index), anchor_id(row_name), inputs, tuple(errors.get(row_name, ()))))
                    if errors.get(row_name):
                        binding.error_names.add(row_name)
                blank = BoundRow(
                    "__index__",
                    anchor_id(f"{item.key}.__index__"),
                    tuple(
                        BoundInput(
                            spec,
                            f"{item.key}.__index__.{spec.key}",
                            anchor_id(f"{item.key}.__index__.{spec.key}"),
                            "",
                            tuple(Option(choice, label, False) for choice, label in spec.choices),
                            (),
                            False,
                        )
                        for spec in item.inputs
                    ),
                    (),
                )
                rows_errors = tuple(errors.get(item.key, ()))
                if rows_errors:
                    binding.error_names.add(item.key)
                items.append(
                    BoundRows(
                        spec=item,
                        id=anchor_id(item.key),
                        rows=tuple(rows),
                        blank_row=blank,
                        next_index=(indices[-1] + 1) if indices else 0,
                        errors=rows_errors,
                        flagged=item.key in flagged,
                    )
                )
            groups.append(BoundGroup(group.title, group.help, tuple(items)))
        section_errors = tuple(errors.get(section.key, ()))
        nested_errors = sum(len(messages) for name, messages in errors.items() if name.startswith(section.key + "."))
        sections.append(
            BoundSection(
                number=number,
                key=section.key,
                id=f"q-{section.key}",
                title=section.title,
                guidance=section.guidance,
                groups=tuple(groups),
                errors=section_errors,
                error_count=len(section_errors) + nested_errors,
                flagged=any(name.startswith(section.key + ".") for name in flagged),
            )
        )
    return sections


# --- Prompts ---------------------------------------------------------------------------------------

_LABEL_SPLIT = re.compile(r"[\s,]+")


def labels_parse(text: str) -> list[str]:
    """`production, staging` as a list, in order, without repeats."""
    return list(dict.fromkeys(label for label in _LABEL_SPLIT.split(text.strip()) if label))


def storable_json_check(text: str) -> None:
    """Refuse, as the API does, JSON the standard parser reads but PostgreSQL would refuse mid-write (a
    500): NaN, Infinity, NUL characters, lone surrogates, nesting past what orjson reads."""
    try:
        json_loads_storable(text)
    except InvalidJson as error:
        raise forms.ValidationError(f"Not JSON Keel can store: it {error.detail}.") from None


def template_parse(prompt_type: str, text: str) -> Any:
    """A text template is the text; a chat template is a JSON list of messages."""
    if prompt_type != PromptType.CHAT:
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise forms.ValidationError(
            f"A chat template must be JSON: {error.msg} at line {error.lineno}, column {error.colno}."
        ) from None


def template_format(template: Any) -> str:
    """A stored template as the editor shows it."""
    if isinstance(template, str):
        return template
    return json.dumps(template, indent=2, ensure_ascii=False)


def config_format(config: Any) -> str:
    return json.dumps(config or {}, indent=2, sort_keys=True, ensure_ascii=False)


class _PromptContentForm(forms.Form):
    template = forms.CharField(
        strip=False,
        widget=forms.Textarea(attrs={"rows": 10, "spellcheck": "false", "class": "mono"}),
        help_text="Variables are written {{name}}. A chat template is a JSON list of "
        '{"role": ..., "content": ...} messages.',
    )
    config = forms.CharField(
        label="Model configuration",
        required=False,
        initial="{}",
        widget=forms.Textarea(attrs={"rows": 4, "spellcheck": "false", "class": "mono"}),
        help_text='A JSON object: {"model": "gpt-4o-mini", "temperature": 0.2}.',
    )
    commit_message = forms.CharField(max_length=500, required=False)
    labels = forms.CharField(
        required=False,
        max_length=500,
        help_text="Comma-separated; these labels move to the new version (e.g. staging).",
    )

    def prompt_type(self) -> str:
        raise NotImplementedError

    def clean_config(self) -> dict[str, Any]:
        text = str(self.cleaned_data.get("config") or "").strip() or "{}"
        try:
            value = json.loads(text)
        except json.JSONDecodeError as error:
            raise forms.ValidationError(
                f"Not valid JSON: {error.msg} at line {error.lineno}, column {error.colno}."
            ) from None
        if not isinstance(value, dict):
            raise forms.ValidationError("The configuration must be a JSON object.")
        return value

    def clean_labels(self) -> list[str]:
        return labels_parse(str(self.cleaned_data.get("labels") or ""))

    def clean(self) -> dict[str, Any] | None:
        cleaned = super().clean()
        if cleaned is not None and "template" in cleaned:
            try:
                cleaned["template"] = template_parse(self.prompt_type(), cleaned["template"])
            except forms.ValidationError as error:
                self.add_error("template", error)
        return cleaned


class PromptCreateForm(_PromptContentForm):
    name = forms.CharField(max_length=200, help_text="Unique in the workspace; '/' makes folders, e.g. support/triage.")
    type = forms.ChoiceField(choices=PromptType.choices, initial=PromptType.TEXT, widget=forms.RadioSelect)

    field_order = ("name", "type", "template", "config", "commit_message", "labels")

    def prompt_type(self) -> str:
        return str(self.cleaned_data.get("type") or PromptType.TEXT)


class PromptVersionForm(_PromptContentForm):
    def __init__(self, *args: Any, prompt_type: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._prompt_type = prompt_type

    def prompt_type(self) -> str:
        return self._prompt_type


class PromptLabelMoveForm(forms.Form):
    label = forms.CharField(max_length=64)
    version = forms.IntegerField(min_value=1)


class PromptDetailsForm(forms.Form):
    """What describes a prompt; its name and versions never change. The service checks the limits."""

    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}))
    tags = forms.CharField(
        required=False, max_length=4000, help_text="Comma-separated, e.g. support, refunds. Clients see them."
    )

    @classmethod
    def for_prompt(cls, prompt: Prompt, data: Any = None) -> PromptDetailsForm:
        return cls(data, initial={"description": prompt.description, "tags": ", ".join(prompt.tags)})

    def clean_tags(self) -> list[str]:
        text = str(self.cleaned_data.get("tags") or "")
        return list(dict.fromkeys(tag.strip() for tag in text.split(",") if tag.strip()))


@dataclass(frozen=True)
class RenderInput:
    version: int | None
    variables: dict[str, str]
    placeholders: dict[str, list[dict[str, Any]]]
    errors: dict[str, str]


def render_input_parse(query: Mapping[str, str]) -> RenderInput:
    """The try-it box's query: `version`, `var.<name>` values and `placeholder.<name>` JSON lists.
    A blank variable counts as not given, so rendering names it as missing."""
    errors: dict[str, str] = {}
    version_text = query.get("version", "").strip()
    version = int(version_text) if version_text.isascii() and version_text.isdigit() else None
    variables = {
        key.removeprefix("var."): value for key, value in query.items() if key.startswith("var.") and value != ""
    }
    placeholders: dict[str, list[dict[str, Any]]] = {}
    for key, text in query.items():
        if not key.startswith("placeholder.") or not text.strip():
            continue
        name = key.removeprefix("placeholder.")
        try:
            value = json.loads(text)
        except json.JSONDecodeError as error:
            errors[key] = f"Not valid JSON: {error.msg}."
            continue
        if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
            errors[key] = "A placeholder takes a JSON list of messages."
            continue
        placeholders[name] = value
    return RenderInput(version=version, variables=variables, placeholders=placeholders, errors=errors)


# --- Agents and API keys -----------------------------------------------------------------------------


class AgentCreateForm(forms.Form):
    slug = forms.SlugField(
        max_length=64, help_text="Lowercase letters, digits and hyphens; used in URLs and by the API."
    )
    name = forms.CharField(max_length=200)
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}))


class ApiKeyCreateForm(forms.Form):
    name = forms.CharField(max_length=200, help_text="Where the key is used, e.g. production ingest.")
    scopes = forms.MultipleChoiceField(
        choices=Scope.choices, widget=forms.CheckboxSelectMultiple, initial=[Scope.INGEST]
    )
    agents = forms.TypedMultipleChoiceField(
        coerce=int,
        required=False,
        widget=forms.SelectMultiple(attrs={"size": 5}),
        help_text="None selected: the key works for every agent of the workspace.",
    )
    expires_on = forms.DateField(
        required=False,
        widget=forms.DateInput(attrs={"type": "date"}),
        help_text="Optional. The key stops working at the end of this day (UTC).",
    )

    def __init__(self, *args: Any, agents: Iterable[Agent], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The choices are the workspace's agents, so an id from another workspace is "not a valid choice".
        self._agents = {agent.pk: agent for agent in agents}
        agent_field = self.fields["agents"]
        if isinstance(agent_field, forms.TypedMultipleChoiceField):
            agent_field.choices = [(pk, f"{agent.name} ({agent.slug})") for pk, agent in self._agents.items()]

    def clean_agents(self) -> list[Agent]:
        return [self._agents[pk] for pk in self.cleaned_data.get("agents") or ()]

    def clean_expires_on(self) -> date | None:
        expires_on: date | None = self.cleaned_data.get("expires_on")
        if expires_on is not None and expires_on < timezone.now().date():
            raise forms.ValidationError("The expiry date is in the past.")
        if expires_on == date.max:
            # The key stops at the end of the day, which is past the last date a datetime can hold.
            raise forms.ValidationError("Choose an earlier expiry date.")
        return expires_on

    def expires_at(self) -> datetime | None:
        expires_on: date | None = self.cleaned_data.get("expires_on")
        if expires_on is None:
            return None
        return datetime.combine(expires_on + timedelta(days=1), time.min, tzinfo=UTC)


# --- Trajectories -------------------------------------------------------------------------------------

PERIODS: dict[str, tuple[str, timedelta | None]] = {
    "": ("Any time", None),
    "1h": ("Last hour", timedelta(hours=1)),
    "24h": ("Last 24 hours", timedelta(hours=24)),
    "7d": ("Last 7 days", timedelta(days=7)),
    "30d": ("Last 30 days", timedelta(days=30)),
    "custom": ("Custom range", None),
}
# Newest first is the default, so it has no value of its own and stays out of shared links.
TRAJECTORY_ORDERS = (
    ("", "Newest first"),
    ("started_at", "Oldest first"),
    ("-cost", "Most expensive"),
    ("cost", "Cheapest"),
    ("-latency", "Slowest"),
    ("latency", "Fastest"),
    ("-steps", "Most steps"),
    ("steps", "Fewest steps"),
    ("-tokens", "Most tokens"),
    ("tokens", "Fewest tokens"),
    ("-triage_score", "Most worth reviewing"),
)
_DATETIME_LOCAL = "%Y-%m-%dT%H:%M"


class _DateTimeLocalInput(forms.DateTimeInput):
    input_type = "datetime-local"

    def __init__(self) -> None:
        super().__init__(format=_DATETIME_LOCAL)


@dataclass(frozen=True)
class TrajectoryQuery:
    """What a filter form asks the trajectory list for (tracing.selectors.trajectory_list's arguments)."""

    filters: TrajectoryFilter
    order: str


class TrajectoryFilterForm(forms.Form):
    """The list's filters, read from the query string so that a filtered list is a link to share.

    Invalid fields are reported and left out; the valid ones still filter.
    """

    q = forms.CharField(
        label="Search", required=False, max_length=500, widget=forms.TextInput(attrs={"type": "search"})
    )
    agent = forms.ChoiceField(required=False)
    period = forms.ChoiceField(label="Time", required=False, choices=[(k, v[0]) for k, v in PERIODS.items()])
    started_after = forms.DateTimeField(
        label="From (UTC)", required=False, input_formats=[_DATETIME_LOCAL], widget=_DateTimeLocalInput()
    )
    started_before = forms.DateTimeField(
        label="To (UTC)", required=False, input_formats=[_DATETIME_LOCAL], widget=_DateTimeLocalInput()
    )
    status = forms.ChoiceField(required=False, choices=[("", "Any status"), *TrajectoryStatus.choices])
    tag = forms.CharField(required=False, max_length=200)
    session = forms.CharField(required=False, max_length=500)
    user = forms.CharField(required=False, max_length=500)
    prompt = forms.ChoiceField(label="Prompt", required=False)
    prompt_version = forms.IntegerField(label="Version", required=False, min_value=1)
    score = forms.ChoiceField(label="Score", required=False)
    score_min = forms.FloatField(label="Score at least", required=False)
    score_max = forms.FloatField(label="Score at most", required=False)
    signal = forms.ChoiceField(
        label="Signal",
        required=False,
        choices=[("", "Any signal"), *((name, name.replace("_", " ").capitalize()) for name in signals.SIGNAL_NAMES)],
    )
    order = forms.ChoiceField(label="Order", required=False, choices=TRAJECTORY_ORDERS)

    def __init__(
        self,
        *args: Any,
        agents: Iterable[Agent],
        prompt_names: Iterable[str],
        score_names: Iterable[str],
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._agents = {agent.slug: agent for agent in agents}
        self._set_choices("agent", [("", "All agents"), *((a.slug, a.name) for a in self._agents.values())])
        self._set_choices("prompt", [("", "Any prompt"), *((name, name) for name in prompt_names)])
        self._set_choices("score", [("", "Any score"), *((name, name) for name in score_names)])

    def _set_choices(self, name: str, choices: list[tuple[str, str]]) -> None:
        field = self.fields[name]
        if isinstance(field, forms.ChoiceField):
            field.choices = choices

    def query(self, now: datetime) -> TrajectoryQuery:
        """The filters of the valid fields (call after is_valid())."""
        data = self.cleaned_data
        period = data.get("period") or ""
        started_after: datetime | None = None
        started_before: datetime | None = None
        span = PERIODS.get(period, ("", None))[1]
        if span is not None:
            started_after = now - span
        elif period == "custom":
            started_after = _as_utc(data.get("started_after"))
            started_before = _as_utc(data.get("started_before"))
        agent = self._agents.get(data.get("agent") or "")
        score = data.get("score") or None
        return TrajectoryQuery(
            filters=TrajectoryFilter(
                agent_id=agent.pk if agent is not None else None,
                started_after=started_after,
                started_before=started_before,
                status=data.get("status") or None,
                tag=(data.get("tag") or "").strip() or None,
                session_id=(data.get("session") or "").strip() or None,
                user_id=(data.get("user") or "").strip() or None,
                prompt_name=data.get("prompt") or None,
                prompt_version=data.get("prompt_version") if data.get("prompt") else None,
                score_name=score,
                score_min=data.get("score_min") if score else None,
                score_max=data.get("score_max") if score else None,
                search=(data.get("q") or "").strip() or None,
                signal=data.get("signal") or None,
            ),
            order=data.get("order") or "-started_at",
        )

    @property
    def active_count(self) -> int:
        """How many filters narrow the list (for the "Clear" link)."""
        if not self.is_bound:
            return 0
        ignored = {"order", "started_after", "started_before", "prompt_version", "score_min", "score_max"}
        return sum(1 for name in self.fields if name not in ignored and self.data.get(name))


def _as_utc(value: datetime | None) -> datetime | None:
    """A datetime-local value is naive; the dashboard shows and reads times in UTC."""
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if timezone.is_naive(value) else value.astimezone(UTC)


class ScoreForm(forms.Form):
    """A reviewer's score of a trajectory or of one of its steps (by span id)."""

    name = forms.CharField(max_length=200, help_text="e.g. resolved, helpfulness, escalation.")
    data_type = forms.ChoiceField(
        label="Type", choices=ScoreDataType.choices, initial=ScoreDataType.NUMERIC, widget=forms.RadioSelect
    )
    value = forms.FloatField(label="Value", required=False, help_text="A number, for a numeric score.")
    verdict = forms.TypedChoiceField(
        label="Verdict",
        required=False,
        choices=[("", "—"), ("true", "Yes"), ("false", "No")],
        coerce=lambda text: text == "true",
        empty_value=None,
    )
    category = forms.CharField(label="Category", required=False, max_length=200)
    correction = forms.CharField(
        label="Corrected output",
        required=False,
        max_length=100_000,
        widget=forms.Textarea(attrs={"rows": 4}),
        help_text="What the agent should have answered.",
    )
    span_id = forms.CharField(label="Attach to", required=False, max_length=16)
    comment = forms.CharField(required=False, max_length=10_000, widget=forms.Textarea(attrs={"rows": 2}))

    def clean(self) -> dict[str, Any] | None:
        cleaned = super().clean()
        if cleaned is None:
            return None
        data_type = cleaned.get("data_type")
        needs = {
            ScoreDataType.NUMERIC: ("value", "A numeric score needs a value."),
            ScoreDataType.BOOLEAN: ("verdict", "Choose yes or no."),
            ScoreDataType.CATEGORICAL: ("category", "A categorical score needs a category."),
            ScoreDataType.CORRECTION: ("correction", "Write the corrected output."),
        }
        if data_type in needs:
            field_name, message = needs[data_type]
            value = cleaned.get(field_name)
            if value is None or (isinstance(value, str) and not value.strip()):
                self.add_error(field_name, message)
        return cleaned

    def score_arguments(self) -> dict[str, Any]:
        """The keyword arguments of tracing.services.score_create for this score."""
        data = self.cleaned_data
        data_type = data["data_type"]
        value: float | bool | None = None
        string_value = ""
        if data_type == ScoreDataType.NUMERIC:
            value = data["value"]
        elif data_type == ScoreDataType.BOOLEAN:
            value = data["verdict"]
        elif data_type == ScoreDataType.CATEGORICAL:
            string_value = data["category"].strip()
        else:
            string_value = data["correction"]
        return {
            "name": data["name"].strip(),
            "data_type": data_type,
            "value": value,
            "string_value": string_value,
            "span_id": data["span_id"].strip().lower(),
            "comment": data["comment"].strip(),
        }


# --- Replays --------------------------------------------------------------------------------------------

REPLAY_MAX_STEPS = 50


class ReplayForm(forms.Form):
    """A counterfactual replay of a trajectory from one of its steps (tracing.replay.replay_create)."""

    from_step = forms.IntegerField(label="From step", min_value=0)
    prompt_version = forms.ChoiceField(
        label="Prompt version",
        required=False,
        help_text="Its system prompt replaces the recorded one; rendered with the variables the run recorded.",
    )
    model = forms.CharField(
        label="Model",
        required=False,
        max_length=300,
        help_text="A model target's alias, or a litellm model string (gpt-4o-mini); blank keeps the recorded model.",
    )
    divergence = forms.ChoiceField(
        label="When the model calls a tool the recording never saw",
        choices=DivergencePolicy.choices,
        initial=DivergencePolicy.STOP,
        widget=forms.RadioSelect,
    )
    stub_result = forms.CharField(
        label="Stub result",
        required=False,
        max_length=100_000,
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false", "class": "mono"}),
        help_text='JSON served for such a call under "stub"; blank serves a generic stub.',
    )
    max_steps = forms.IntegerField(
        label="Model calls at most", min_value=1, max_value=REPLAY_MAX_STEPS, initial=20, required=False
    )

    def __init__(self, *args: Any, prompts: Iterable[Any], **kwargs: Any) -> None:
        """`prompts`: the agent's prompts (agent_registry.selectors.prompt_list), newest version first."""
        super().__init__(*args, **kwargs)
        choices: list[tuple[str, str]] = [("", "Keep the recorded prompt")]
        for prompt in prompts:
            labels: dict[int, list[str]] = {}
            for label in prompt.labels.all():
                labels.setdefault(label.version.version, []).append(label.name)
            for number in range(prompt.latest_version or 0, 0, -1):
                names = sorted(labels.get(number, []))
                suffix = f" ({', '.join(names)})" if names else ""
                choices.append((f"{prompt.name}:{number}", f"{prompt.name} v{number}{suffix}"))
        field = self.fields["prompt_version"]
        if isinstance(field, forms.ChoiceField):
            field.choices = choices

    def clean_stub_result(self) -> Any:
        text = str(self.cleaned_data.get("stub_result") or "").strip()
        if not text:
            return None
        try:
            return json.loads(text)
        except json.JSONDecodeError as error:
            raise forms.ValidationError(
                f"Not valid JSON: {error.msg} at line {error.lineno}, column {error.colno}."
            ) from None

    def prompt_version_wanted(self) -> tuple[str, int] | None:
        """(prompt name, version number) of the chosen version, or None to keep the recorded prompt."""
        value = str(self.cleaned_data.get("prompt_version") or "")
        if not value:
            return None
        name, _, number = value.rpartition(":")
        return name, int(number)
