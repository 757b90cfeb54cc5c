"""LLM judges: evaluators that ask a model for a verdict, for outputs no deterministic verifier can check.

Pure (no Django, no Celery): the model is injected as a `Complete` callable, `(messages,
response_format) -> reply text`, so eval runs, online rules and tests all hand the judge a model
the same way, and a test hands it a scripted fake.

Four judges, each constructible from a config dict (`judge_from_config`):

- `llm_judge` (`RubricJudge`): one output against a written rubric, on a binary, 1-5 or 0-10 scale
  normalised to 0..1; the judge's reasoning is the Score's reason.
- `pairwise_judge` (`PairwiseJudge`): which of two outputs is better; asked in both orders, and a
  winner only when both orders agree, since judges favour a slot more often than one would hope.
- `group_judge` (`GroupJudge`, RULER style): one call sees every candidate for the same task and
  scores them relative to each other; candidates are shown in a seeded shuffled order.
- `reference_free` (`ReferenceFreeJudge`, Compute-as-Teacher style): a synthesiser reads the group's
  rollouts without the task and writes an estimated reference answer and yes/no criteria; an
  independent judge then scores each rollout by the share of criteria it meets.

Failures are kept apart, as in `evals.verifiers`:
- `ModelUnavailable` raised by a `Complete` (a provider outage) propagates out of every judge: the
  caller pauses the run, since no verdict was given, good or bad.
- A reply that is not what was asked for (not JSON, missing fields, values out of range) is retried
  with the same request up to `max_attempts`, and then the item gets an errored Score (`score=None`):
  a judge that could not answer is not a judge that said 0.

`judge_calibration` compares judge scores with human scores (agreement, Cohen's kappa, Pearson,
Spearman, mean absolute error), to decide whether a judge can be trusted.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol, TypeVar, runtime_checkable

from evals.verifiers import EvalItem, EvalOutput, Evaluator, EvaluatorConfigError, Score, Version

# --- the model, as the judges see it ------------------------------------------------------------------


class ModelUnavailable(Exception):
    """The judge's model could not be reached (provider outage); the caller pauses the run rather than scoring."""


Complete = Callable[[list[dict[str, Any]], dict[str, Any] | None], str]  # (messages, response_format) -> reply text

JUDGE_TYPES = ("llm_judge", "pairwise_judge", "group_judge", "reference_free")
SCALES = ("binary", "1-5", "0-10")
_SCALE_BOUNDS: dict[str, tuple[int, int]] = {"binary": (0, 1), "1-5": (1, 5), "0-10": (0, 10)}

# Enough of each field for a judge to follow the conversation, not so much that one long tool result
# crowds out the rubric. Long text keeps its start and its end, where answers usually are.
_INPUT_MESSAGE_LIMIT = 2_000
_INPUT_LIMIT = 6_000
_OUTPUT_LIMIT = 4_000
_CANDIDATE_LIMIT = 3_000
_REFERENCE_LIMIT = 2_000
_TOOL_CALL_LIMIT = 300
_TOOL_CALLS_SHOWN = 20
_REASON_LIMIT = 4_000
_MIN_CRITERIA, _MAX_CRITERIA = 3, 8

T = TypeVar("T")


class _InvalidReply(Exception):
    """One reply was not what was asked for; `problem` reads after "the judge's reply ...": "was not valid JSON"."""

    def __init__(self, problem: str, detail: str) -> None:
        super().__init__(f"{problem}: {detail}")
        self.problem = problem
        self.detail = detail


class _NoValidReply(Exception):
    """Every attempt gave an invalid reply; the message is the errored Score's `error`."""


def _ask(
    complete: Complete,
    messages: list[dict[str, Any]],
    response_format: dict[str, Any],
    parse: Callable[[dict[str, Any]], T],
    *,
    max_attempts: int,
    role: str = "judge",
) -> T:
    """`parse` of the first valid reply; the same request again after an invalid one, up to `max_attempts`.

    `ModelUnavailable` is deliberately not caught: an outage is not an invalid reply.
    """
    last: _InvalidReply | None = None
    for _ in range(max_attempts):
        reply: object = complete(messages, response_format)
        try:
            if not isinstance(reply, str):
                raise _InvalidReply("was not text", type(reply).__name__)
            return parse(_json_object(reply))
        except _InvalidReply as problem:
            last = problem
    assert last is not None
    attempts = f"{max_attempts} attempt{'s' if max_attempts != 1 else ''}"
    raise _NoValidReply(f"the {role}'s reply {last.problem} after {attempts}: {last.detail}")


_FENCE = re.compile(r"```[\w-]*[ \t]*\n?(.*?)```", re.DOTALL)


def _json_object(reply: str) -> dict[str, Any]:
    """The JSON object in a reply: the whole reply, a ```json fence in it, or the first object in the text."""
    text = reply.strip()
    candidates = [text, *(match.group(1).strip() for match in _FENCE.finditer(text))]
    first_error = ""
    for candidate in candidates:
        try:
            document = json.loads(candidate)
        except json.JSONDecodeError as error:
            first_error = first_error or str(error)
            continue
        if isinstance(document, dict):
            return document
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", text):
        try:
            document, _ = decoder.raw_decode(text, match.start())
        except json.JSONDecodeError:
            continue
        if isinstance(document, dict):
            return document
    if not first_error:
        raise _InvalidReply("was not a JSON object", _shorten(text, 200))
    raise _InvalidReply("was not valid JSON", f"{first_error} in {_shorten(text, 200)!r}")


def _text_field(document: Mapping[str, Any], key: str, *, required: bool = True) -> str:
    value = document.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise _InvalidReply(f"had no text {key!r}", f"got {_shorten(value, 80)}")
    return value


def _number_field(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _InvalidReply(f"had a {what} that is not a number", f"got {_shorten(value, 80)}")
    return float(value)


def _json_schema_format(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "strict": True, "schema": schema}}


# --- what the judge is shown --------------------------------------------------------------------------


def _shorten(value: object, limit: int) -> str:
    """`value` as text, at most about `limit` characters: its start and its end, with the cut marked."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str, ensure_ascii=False)
    if len(text) <= limit:
        return text
    keep = max(limit // 2, 1)
    return f"{text[:keep]} … [{len(text) - 2 * keep} characters omitted] … {text[-keep:]}"


def _message_text(content: object) -> str:
    # OpenAI-style content parts: keep the text parts, name the others.
    if content is None:  # an assistant message that only called tools
        return ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(str(part["text"]))
            elif isinstance(part, Mapping):
                parts.append(f"[{part.get('type', 'part')}]")
            else:
                parts.append(str(part))
        return " ".join(parts)
    return content if isinstance(content, str) else _shorten(content, _INPUT_MESSAGE_LIMIT)


def render_input(value: object) -> str:
    """An item's input as a judge reads it: a task string, or a conversation as "role: content" lines."""
    if isinstance(value, Mapping) and isinstance(value.get("messages"), list):
        value = value["messages"]
    if isinstance(value, list) and all(isinstance(message, Mapping) for message in value):
        lines = [
            f"{message.get('role', 'user')}: {_shorten(_message_text(message.get('content')), _INPUT_MESSAGE_LIMIT)}"
            for message in value
        ]
        return _shorten("\n".join(lines), _INPUT_LIMIT)
    if value is None:
        return "(no input recorded)"
    return _shorten(value, _INPUT_LIMIT)


def render_tool_calls(output: EvalOutput) -> str:
    """The output's tool calls, one a line as name(arguments); "" when it made none."""
    lines = [
        f"- {call.name}({_shorten(dict(call.arguments), _TOOL_CALL_LIMIT)})"
        for call in output.tool_calls[:_TOOL_CALLS_SHOWN]
    ]
    if len(output.tool_calls) > _TOOL_CALLS_SHOWN:
        lines.append(f"- … and {len(output.tool_calls) - _TOOL_CALLS_SHOWN} more")
    return "\n".join(lines)


def _render_output(output: EvalOutput, tag: str, limit: int, attributes: str = "") -> str:
    parts = [f"<{tag}{attributes}>", _shorten(output.text, limit) or "(no text)"]
    if calls := render_tool_calls(output):
        parts += ["Tool calls:", calls]
    parts.append(f"</{tag}>")
    return "\n".join(parts)


def _render_task(item: EvalItem) -> str:
    return f"<task>\n{render_input(item.input)}\n</task>"


def _render_reference(item: EvalItem, use_reference: bool) -> list[str]:
    if not use_reference or item.reference_output is None:
        return []
    return [f"<reference>\n{_shorten(item.reference_output, _REFERENCE_LIMIT)}\n</reference>"]


def _messages(system: str, user_parts: Sequence[str]) -> list[dict[str, Any]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(user_parts)}]


# --- configuration checks -----------------------------------------------------------------------------


def _check_type(field_name: str, value: object, types: type | tuple[type, ...], description: str) -> None:
    # bool is an int to Python, never to a config author.
    allowed = types if isinstance(types, tuple) else (types,)
    if (isinstance(value, bool) and bool not in allowed) or not isinstance(value, types):
        raise EvaluatorConfigError(field_name, f"must be {description}, got {value!r}")


def _check_common(judge: _Judge) -> None:
    _check_type("name", judge.name, str, "a string")
    if not judge.name.strip():
        raise EvaluatorConfigError("name", "must not be empty")
    _check_type("version", judge.version, int, "a whole number")
    if judge.version < 1:
        raise EvaluatorConfigError("version", f"must be at least 1, got {judge.version!r}")
    _check_type("max_attempts", judge.max_attempts, int, "a whole number")
    if not 1 <= judge.max_attempts <= 10:
        raise EvaluatorConfigError("max_attempts", f"must be within 1..10, got {judge.max_attempts!r}")
    if judge.model is not None:
        _check_type("model", judge.model, str, "a model alias")
    if not callable(judge.complete):
        raise EvaluatorConfigError("complete", "must be a callable (messages, response_format) -> text")


def _check_rubric(rubric: object, *, required: bool) -> None:
    _check_type("rubric", rubric, str, "text")
    assert isinstance(rubric, str)
    if required and not rubric.strip():
        raise EvaluatorConfigError("rubric", "is required")


def _check_threshold(value: object) -> None:
    _check_type("pass_threshold", value, (int, float), "a number")
    assert isinstance(value, int | float)
    if not 0.0 <= value <= 1.0:  # also refuses NaN
        raise EvaluatorConfigError("pass_threshold", f"must be within 0..1, got {value!r}")


class _Judge:
    """Shared settings; the concrete judges are frozen dataclasses that declare them."""

    TYPE: ClassVar[str]
    name: str
    version: int
    model: str | None
    max_attempts: int
    complete: Complete

    def _errored(self, error: str) -> Score:
        return Score(self.name, self.version, None, False, error=error)


# --- rubric judge -------------------------------------------------------------------------------------

_RUBRIC_SYSTEM = (
    "You are an impartial evaluator of an AI agent's work. Judge the agent's response to the task against the "
    "rubric, and only the rubric. Think it through before deciding, and put that reasoning in the reply first. "
    'Reply with one JSON object and nothing else: {"reasoning": "<why>", "score": <score>}.'
)
_SCALE_INSTRUCTIONS = {
    "binary": "Score 1 if the response satisfies the rubric, 0 if it does not.",
    "1-5": "Score from 1 (does not satisfy the rubric at all) to 5 (fully satisfies it), a whole number.",
    "0-10": "Score from 0 (does not satisfy the rubric at all) to 10 (fully satisfies it), a whole number.",
}


@dataclass(frozen=True, kw_only=True)
class RubricJudge(_Judge):
    """Config type "llm_judge": one output against `rubric`, on `scale`, normalised to 0..1.

    1-5 maps 1 → 0.0 and 5 → 1.0; 0-10 maps n → n/10. `pass_threshold` defaults to 1 for a binary
    scale and 0.5 otherwise. With `use_reference`, an item's reference output is shown to the judge.
    """

    TYPE: ClassVar[str] = "llm_judge"
    complete: Complete = field(repr=False, compare=False)
    rubric: str
    name: str = "llm_judge"
    version: int = 1
    scale: Literal["binary", "1-5", "0-10"] = "1-5"
    pass_threshold: float | None = None
    use_reference: bool = True
    model: str | None = None
    max_attempts: int = 3

    def __post_init__(self) -> None:
        _check_common(self)
        _check_rubric(self.rubric, required=True)
        if self.scale not in SCALES:
            raise EvaluatorConfigError("scale", f"must be one of {', '.join(SCALES)}, got {self.scale!r}")
        if self.pass_threshold is None:
            object.__setattr__(self, "pass_threshold", 1.0 if self.scale == "binary" else 0.5)
        _check_threshold(self.pass_threshold)
        _check_type("use_reference", self.use_reference, bool, "true or false")

    @property
    def response_format(self) -> dict[str, Any]:
        low, high = _SCALE_BOUNDS[self.scale]
        score: dict[str, Any] = {"type": "integer", "minimum": low, "maximum": high}
        if self.scale == "binary":
            score = {"type": "integer", "enum": [0, 1]}
        return _json_schema_format(
            "judge_verdict",
            {
                "type": "object",
                "properties": {"reasoning": {"type": "string"}, "score": score},
                "required": ["reasoning", "score"],
                "additionalProperties": False,
            },
        )

    def messages(self, item: EvalItem, output: EvalOutput) -> list[dict[str, Any]]:
        return _messages(
            _RUBRIC_SYSTEM,
            [
                f"<rubric>\n{self.rubric}\n</rubric>",
                _SCALE_INSTRUCTIONS[self.scale],
                _render_task(item),
                *_render_reference(item, self.use_reference),
                _render_output(output, "response", _OUTPUT_LIMIT),
            ],
        )

    def _parse(self, document: dict[str, Any]) -> tuple[float, str]:
        reasoning = _text_field(document, "reasoning")
        if "score" not in document:
            raise _InvalidReply("had no 'score'", _shorten(document, 200))
        raw = document["score"]
        if self.scale == "binary" and isinstance(raw, bool):
            raw = int(raw)
        value = _number_field(raw, "score")
        low, high = _SCALE_BOUNDS[self.scale]
        if not low <= value <= high or (self.scale == "binary" and value not in (0, 1)):
            raise _InvalidReply("had a score outside the scale", f"{raw!r} is not on the {self.scale} scale")
        return (value - low) / (high - low), reasoning

    def evaluate(self, item: EvalItem, output: EvalOutput) -> Score:
        try:
            value, reasoning = _ask(
                self.complete,
                self.messages(item, output),
                self.response_format,
                self._parse,
                max_attempts=self.max_attempts,
            )
        except _NoValidReply as error:
            return self._errored(str(error))
        assert self.pass_threshold is not None
        return Score(self.name, self.version, value, value >= self.pass_threshold, _shorten(reasoning, _REASON_LIMIT))


# --- pairwise judge -----------------------------------------------------------------------------------

_DEFAULT_PAIRWISE_RUBRIC = "Which response better accomplishes the task: correct, complete, helpful and honest."
_PAIRWISE_SYSTEM = (
    "You are an impartial evaluator comparing two responses of AI agents to the same task. The order in which "
    "they are shown says nothing about their quality, and neither does their length. Think it through before "
    "deciding, and put that reasoning in the reply first. Reply with one JSON object and nothing else: "
    '{"reasoning": "<why>", "winner": "1" | "2" | "tie"}.'
)
_PAIRWISE_FORMAT = _json_schema_format(
    "pairwise_verdict",
    {
        "type": "object",
        "properties": {"reasoning": {"type": "string"}, "winner": {"type": "string", "enum": ["1", "2", "tie"]}},
        "required": ["reasoning", "winner"],
        "additionalProperties": False,
    },
)


@dataclass(frozen=True, slots=True)
class PairwiseVerdict:
    """Which of two outputs won, asked in both orders.

    `reasoning` is the judge's reasoning for (a, b) and then for (b, a). `consistent`: both orders gave the
    same answer. `position_bias`: both orders preferred the same slot, so the judge picked a position, not
    an output. An `error` (no valid reply after retries) comes with winner "tie" and consistent=False.
    """

    winner: Literal["a", "b", "tie"]
    reasoning: tuple[str, str]
    consistent: bool
    position_bias: bool
    error: str | None = None


@dataclass(frozen=True, kw_only=True)
class PairwiseJudge(_Judge):
    """Config type "pairwise_judge": `compare(item, a, b)` judges (a, b) and then (b, a)."""

    TYPE: ClassVar[str] = "pairwise_judge"
    complete: Complete = field(repr=False, compare=False)
    rubric: str = _DEFAULT_PAIRWISE_RUBRIC
    name: str = "pairwise_judge"
    version: int = 1
    use_reference: bool = True
    model: str | None = None
    max_attempts: int = 3

    def __post_init__(self) -> None:
        _check_common(self)
        _check_rubric(self.rubric, required=True)
        _check_type("use_reference", self.use_reference, bool, "true or false")

    def messages(self, item: EvalItem, first: EvalOutput, second: EvalOutput) -> list[dict[str, Any]]:
        return _messages(
            _PAIRWISE_SYSTEM,
            [
                f"<rubric>\n{self.rubric}\n</rubric>",
                _render_task(item),
                *_render_reference(item, self.use_reference),
                _render_output(first, "response", _CANDIDATE_LIMIT, ' id="1"'),
                _render_output(second, "response", _CANDIDATE_LIMIT, ' id="2"'),
            ],
        )

    @staticmethod
    def _parse(document: dict[str, Any]) -> tuple[str, str]:
        reasoning = _text_field(document, "reasoning")
        winner = document.get("winner")
        if isinstance(winner, int) and not isinstance(winner, bool):
            winner = str(winner)
        if winner not in ("1", "2", "tie"):
            raise _InvalidReply("had a winner other than 1, 2 or tie", f"got {_shorten(winner, 80)}")
        assert isinstance(winner, str)
        return winner, reasoning

    def compare(self, item: EvalItem, a: EvalOutput, b: EvalOutput) -> PairwiseVerdict:
        try:
            slot_ab, reasoning_ab = _ask(
                self.complete, self.messages(item, a, b), _PAIRWISE_FORMAT, self._parse, max_attempts=self.max_attempts
            )
            slot_ba, reasoning_ba = _ask(
                self.complete, self.messages(item, b, a), _PAIRWISE_FORMAT, self._parse, max_attempts=self.max_attempts
            )
        except _NoValidReply as error:
            return PairwiseVerdict("tie", ("", ""), consistent=False, position_bias=False, error=str(error))
        first_order = {"1": "a", "2": "b", "tie": "tie"}[slot_ab]
        second_order = {"1": "b", "2": "a", "tie": "tie"}[slot_ba]
        reasoning = (reasoning_ab, reasoning_ba)
        if first_order == second_order:
            winner: Literal["a", "b", "tie"] = "a" if first_order == "a" else "b" if first_order == "b" else "tie"
            return PairwiseVerdict(winner, reasoning, consistent=True, position_bias=False)
        return PairwiseVerdict(
            "tie", reasoning, consistent=False, position_bias=slot_ab == slot_ba and slot_ab in ("1", "2")
        )


# --- group judge (RULER) ------------------------------------------------------------------------------


@runtime_checkable
class GroupEvaluator(Protocol):
    """Scores every output for one item together: one Score per output, in the outputs' order."""

    @property
    def name(self) -> str: ...

    @property
    def version(self) -> Version: ...

    def evaluate_group(self, item: EvalItem, outputs: Sequence[EvalOutput]) -> list[Score]: ...


def is_group_evaluator(candidate: object) -> bool:
    """Whether `candidate` scores outputs as a group (`evaluate_group`) rather than one at a time."""
    return isinstance(candidate, GroupEvaluator)


_DEFAULT_GROUP_RUBRIC = (
    "A candidate that achieves the task's goal scores higher than one that does not. Among candidates that "
    "achieve it, a more efficient one (fewer unnecessary steps and tool calls) scores higher. A candidate that "
    "makes progress scores higher than one that makes none."
)
_GROUP_SYSTEM = (
    "You are an impartial evaluator. Every candidate below is an attempt by an AI agent at the same task. "
    "Compare them with each other and give each a score from 0 to 1 for how well it achieves the task under "
    "the rubric: the scores are relative, so a better candidate gets a higher score than a worse one. The order "
    "of the candidates says nothing about their quality. Reply with one JSON object and nothing else: "
    '{"reasoning": "<comparison>", "scores": [{"id": "<candidate id>", "score": <0..1>, '
    '"explanation": "<why>"}]}, with every candidate id exactly once.'
)


def _candidate_ids(count: int) -> list[str]:
    return [f"candidate-{number}" for number in range(1, count + 1)]


def _group_seed(seed: int, item: EvalItem, outputs: Sequence[EvalOutput]) -> str:
    # The seed alone would show every group of the same size in the same order, a position bias of its own;
    # mixing in the group's content varies the order between items while staying reproducible.
    content = json.dumps(
        [item.input, [output.text for output in outputs]], sort_keys=True, default=str, ensure_ascii=False
    )
    return f"{seed}:{hashlib.sha256(content.encode()).hexdigest()}"


@dataclass(frozen=True, kw_only=True)
class GroupJudge(_Judge):
    """Config type "group_judge" (RULER): one call scores all N outputs for an item relative to each other.

    The outputs are shown as candidate-1..candidate-N in an order shuffled by a random generator seeded from
    `seed` and the group, and the scores are mapped back; each id must appear exactly once in the reply.
    Scores are kept as given (0..1); passed = score ≥ `pass_threshold`.
    """

    TYPE: ClassVar[str] = "group_judge"
    complete: Complete = field(repr=False, compare=False)
    rubric: str = _DEFAULT_GROUP_RUBRIC
    name: str = "group_judge"
    version: int = 1
    pass_threshold: float = 0.5
    seed: int = 0
    use_reference: bool = True
    model: str | None = None
    max_attempts: int = 3

    def __post_init__(self) -> None:
        _check_common(self)
        _check_rubric(self.rubric, required=True)
        _check_threshold(self.pass_threshold)
        _check_type("seed", self.seed, int, "a whole number")
        _check_type("use_reference", self.use_reference, bool, "true or false")

    def presentation_order(self, item: EvalItem, outputs: Sequence[EvalOutput]) -> list[int]:
        """The outputs' indices in the order the judge sees them: candidate-1 is outputs[order[0]]."""
        order = list(range(len(outputs)))
        random.Random(_group_seed(self.seed, item, outputs)).shuffle(order)  # noqa: S311 - an order, not a secret
        return order

    @staticmethod
    def response_format(ids: Sequence[str]) -> dict[str, Any]:
        entry = {
            "type": "object",
            "properties": {
                "id": {"type": "string", "enum": list(ids)},
                "score": {"type": "number", "minimum": 0, "maximum": 1},
                "explanation": {"type": "string"},
            },
            "required": ["id", "score", "explanation"],
            "additionalProperties": False,
        }
        return _json_schema_format(
            "group_scores",
            {
                "type": "object",
                "properties": {"reasoning": {"type": "string"}, "scores": {"type": "array", "items": entry}},
                "required": ["reasoning", "scores"],
                "additionalProperties": False,
            },
        )

    def messages(self, item: EvalItem, shown: Sequence[tuple[str, EvalOutput]]) -> list[dict[str, Any]]:
        return _messages(
            _GROUP_SYSTEM,
            [
                f"<rubric>\n{self.rubric}\n</rubric>",
                _render_task(item),
                *_render_reference(item, self.use_reference),
                *(_render_output(output, "candidate", _CANDIDATE_LIMIT, f' id="{id_}"') for id_, output in shown),
            ],
        )

    @staticmethod
    def _parser(ids: Sequence[str]) -> Callable[[dict[str, Any]], tuple[str, dict[str, tuple[float, str]]]]:
        def parse(document: dict[str, Any]) -> tuple[str, dict[str, tuple[float, str]]]:
            reasoning = _text_field(document, "reasoning", required=False)
            entries = document.get("scores")
            if not isinstance(entries, list):
                raise _InvalidReply("had no 'scores' list", _shorten(document, 200))
            scores: dict[str, tuple[float, str]] = {}
            for entry in entries:
                if not isinstance(entry, Mapping):
                    raise _InvalidReply("had a score entry that is not an object", _shorten(entry, 80))
                id_ = entry.get("id")
                if id_ not in ids:
                    raise _InvalidReply("named an unknown candidate", f"{_shorten(id_, 80)}; known: {', '.join(ids)}")
                assert isinstance(id_, str)
                if id_ in scores:
                    raise _InvalidReply("named a candidate twice", id_)
                value = _number_field(entry.get("score"), "score")
                if not 0.0 <= value <= 1.0:
                    raise _InvalidReply("had a score outside 0..1", f"{id_}: {value!r}")
                scores[id_] = (value, _text_field(entry, "explanation", required=False))
            if missing := [id_ for id_ in ids if id_ not in scores]:
                raise _InvalidReply("left out candidates", ", ".join(missing))
            return reasoning, scores

        return parse

    def evaluate_group(self, item: EvalItem, outputs: Sequence[EvalOutput]) -> list[Score]:
        if not outputs:
            return []
        order = self.presentation_order(item, outputs)
        ids = _candidate_ids(len(outputs))
        shown = [(id_, outputs[index]) for id_, index in zip(ids, order, strict=True)]
        try:
            reasoning, scores = _ask(
                self.complete,
                self.messages(item, shown),
                self.response_format(ids),
                self._parser(ids),
                max_attempts=self.max_attempts,
            )
        except _NoValidReply as error:
            return [self._errored(str(error)) for _ in outputs]
        results: list[Score | None] = [None] * len(outputs)
        for id_, index in zip(ids, order, strict=True):
            value, explanation = scores[id_]
            reason = _shorten(explanation or reasoning, _REASON_LIMIT)
            results[index] = Score(self.name, self.version, value, value >= self.pass_threshold, reason)
        return [result for result in results if result is not None]


# --- reference-free judge (Compute as Teacher) --------------------------------------------------------

_SYNTHESISER_SYSTEM = (
    "Below are several responses that AI agents wrote independently for the same task; the task itself is not "
    "shown. Read them all, weigh where they agree and where they disagree, and write the single best answer "
    "they are reaching for. It need not match any of them: if they share a mistake, correct it. Then write "
    f"{_MIN_CRITERIA} to {_MAX_CRITERIA} criteria that a correct answer satisfies, each a short statement that "
    "can be checked with yes or no. Reply with one JSON object and nothing else: "
    '{"reasoning": "<how you reconciled them>", "reference_answer": "<the answer>", "criteria": ["<criterion>"]}.'
)
_SYNTHESISER_FORMAT = _json_schema_format(
    "estimated_reference",
    {
        "type": "object",
        "properties": {
            "reasoning": {"type": "string"},
            "reference_answer": {"type": "string"},
            "criteria": {
                "type": "array",
                "items": {"type": "string"},
                "minItems": _MIN_CRITERIA,
                "maxItems": _MAX_CRITERIA,
            },
        },
        "required": ["reasoning", "reference_answer", "criteria"],
        "additionalProperties": False,
    },
)
_CRITERIA_SYSTEM = (
    "You are an impartial evaluator. Check an AI agent's response against each numbered criterion, using the "
    "reference answer to decide what is correct, and say for each whether the response meets it. Reply with one "
    'JSON object and nothing else: {"reasoning": "<why>", "criteria": [{"number": <n>, "met": true | false}]}, '
    "with every criterion number exactly once."
)
_CRITERIA_FORMAT = _json_schema_format(
    "criteria_verdicts",
    {
        "type": "object",
        "properties": {
            "reasoning": {"type": "string"},
            "criteria": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"number": {"type": "integer"}, "met": {"type": "boolean"}},
                    "required": ["number", "met"],
                    "additionalProperties": False,
                },
            },
        },
        "required": ["reasoning", "criteria"],
        "additionalProperties": False,
    },
)


@dataclass(frozen=True, slots=True)
class EstimatedReference:
    """What the synthesiser made of a group's rollouts: an answer and the yes/no criteria a correct answer meets."""

    answer: str
    criteria: tuple[str, ...]


def _parse_estimated_reference(document: dict[str, Any]) -> EstimatedReference:
    answer = _text_field(document, "reference_answer")
    if not answer.strip():
        raise _InvalidReply("had an empty 'reference_answer'", _shorten(document, 200))
    criteria = document.get("criteria")
    if not isinstance(criteria, list) or not all(
        isinstance(criterion, str) and criterion.strip() for criterion in criteria
    ):
        raise _InvalidReply("had no list of criteria", f"got {_shorten(criteria, 200)}")
    if not _MIN_CRITERIA <= len(criteria) <= _MAX_CRITERIA:
        raise _InvalidReply(
            f"had {len(criteria)} criteria, not {_MIN_CRITERIA} to {_MAX_CRITERIA}", _shorten(criteria, 200)
        )
    return EstimatedReference(answer, tuple(criterion.strip() for criterion in criteria))


def _criteria_parser(count: int) -> Callable[[dict[str, Any]], dict[int, bool]]:
    def parse(document: dict[str, Any]) -> dict[int, bool]:
        entries = document.get("criteria")
        if not isinstance(entries, list):
            raise _InvalidReply("had no 'criteria' list", _shorten(document, 200))
        verdicts: dict[int, bool] = {}
        for entry in entries:
            number = entry.get("number") if isinstance(entry, Mapping) else None
            met = entry.get("met") if isinstance(entry, Mapping) else None
            if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= count:
                raise _InvalidReply("named an unknown criterion", f"{_shorten(entry, 80)}; known: 1..{count}")
            if number in verdicts:
                raise _InvalidReply("named a criterion twice", str(number))
            if not isinstance(met, bool):
                raise _InvalidReply("had a criterion without a true or false 'met'", _shorten(entry, 80))
            verdicts[number] = met
        if missing := [str(number) for number in range(1, count + 1) if number not in verdicts]:
            raise _InvalidReply("left out criteria", ", ".join(missing))
        return verdicts

    return parse


@dataclass(frozen=True, kw_only=True)
class ReferenceFreeJudge(_Judge):
    """Config type "reference_free" (Compute as Teacher): a score without a reference output.

    Step 1: `synthesise` reads the group's rollouts, and not the task, so it reconciles what the rollouts
    say rather than solving the task afresh, and writes an estimated reference answer and 3-8 yes/no
    criteria. Step 2: `complete`, an independent judge (the config may name another model), checks each
    rollout against the criteria with the estimated reference; score = share of criteria met.
    """

    TYPE: ClassVar[str] = "reference_free"
    complete: Complete = field(repr=False, compare=False)
    synthesise: Complete = field(repr=False, compare=False)
    name: str = "reference_free"
    version: int = 1
    pass_threshold: float = 0.5
    model: str | None = None
    synthesiser_model: str | None = None
    max_attempts: int = 3

    def __post_init__(self) -> None:
        _check_common(self)
        _check_threshold(self.pass_threshold)
        if self.synthesiser_model is not None:
            _check_type("synthesiser_model", self.synthesiser_model, str, "a model alias")
        if not callable(self.synthesise):
            raise EvaluatorConfigError("synthesise", "must be a callable (messages, response_format) -> text")

    @staticmethod
    def synthesiser_messages(outputs: Sequence[EvalOutput]) -> list[dict[str, Any]]:
        # The task is left out on purpose: see the class docstring.
        return _messages(
            _SYNTHESISER_SYSTEM,
            [
                _render_output(output, "response", _CANDIDATE_LIMIT, f' id="{number}"')
                for number, output in enumerate(outputs, start=1)
            ],
        )

    @staticmethod
    def judge_messages(item: EvalItem, reference: EstimatedReference, output: EvalOutput) -> list[dict[str, Any]]:
        criteria = "\n".join(f"{number}. {criterion}" for number, criterion in enumerate(reference.criteria, start=1))
        return _messages(
            _CRITERIA_SYSTEM,
            [
                _render_task(item),
                f"<reference>\n{_shorten(reference.answer, _REFERENCE_LIMIT)}\n</reference>",
                f"<criteria>\n{criteria}\n</criteria>",
                _render_output(output, "response", _OUTPUT_LIMIT),
            ],
        )

    def estimate_reference(self, outputs: Sequence[EvalOutput]) -> EstimatedReference:
        """Step 1 alone; raises `_NoValidReply` when the synthesiser gives no valid reply."""
        return _ask(
            self.synthesise,
            self.synthesiser_messages(outputs),
            _SYNTHESISER_FORMAT,
            _parse_estimated_reference,
            max_attempts=self.max_attempts,
            role="synthesiser",
        )

    def _score(self, item: EvalItem, reference: EstimatedReference, output: EvalOutput) -> Score:
        try:
            verdicts = _ask(
                self.complete,
                self.judge_messages(item, reference, output),
                _CRITERIA_FORMAT,
                _criteria_parser(len(reference.criteria)),
                max_attempts=self.max_attempts,
            )
        except _NoValidReply as error:
            return self._errored(str(error))
        met = sum(verdicts.values())
        total = len(reference.criteria)
        unmet = [f"{number}. {reference.criteria[number - 1]}" for number in sorted(verdicts) if not verdicts[number]]
        reason = f"{met} of {total} criteria met"
        if unmet:
            reason += "; unmet: " + "; ".join(unmet)
        reason += f"; estimated reference: {_shorten(reference.answer, 300)!r}"
        value = met / total
        return Score(self.name, self.version, value, value >= self.pass_threshold, _shorten(reason, _REASON_LIMIT))

    def evaluate_group(self, item: EvalItem, outputs: Sequence[EvalOutput]) -> list[Score]:
        if not outputs:
            return []
        try:
            reference = self.estimate_reference(outputs)
        except _NoValidReply as error:
            return [self._errored(str(error)) for _ in outputs]
        return [self._score(item, reference, output) for output in outputs]


# --- calibration against people -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Calibration:
    """How a judge's scores compare with people's on the same items; None where a figure is undefined."""

    n: int
    agreement: float | None  # share of items where judge and person agree on pass/fail
    cohen_kappa: float | None  # that agreement beyond chance
    pearson: float | None
    spearman: float | None
    mean_absolute_error: float | None


def _pearson(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    if len(xs) < 2:
        return None
    # Compared as values, not as a spread: the mean of three 0.7s is not exactly 0.7 in floating point.
    if len(set(xs)) == 1 or len(set(ys)) == 1:
        return None
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    covariance = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True))
    spread_x = sum((x - mean_x) ** 2 for x in xs)
    spread_y = sum((y - mean_y) ** 2 for y in ys)
    return max(-1.0, min(1.0, covariance / math.sqrt(spread_x * spread_y)))


def _average_ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing the mean of the ranks they span."""
    order = sorted(range(len(values)), key=lambda index: values[index])
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for position in range(start, end + 1):
            ranks[order[position]] = (start + end) / 2 + 1
        start = end + 1
    return ranks


def judge_calibration(
    judge_scores: Sequence[float | None], human_scores: Sequence[float | None], *, threshold: float = 0.5
) -> Calibration:
    """Judge against human scores, item by item; pairs where either score is None are left out.

    Pass/fail is score ≥ `threshold` on both sides. Kappa, Pearson and Spearman are None for fewer than two
    pairs or when a side does not vary; agreement and mean absolute error are None only with no pairs.
    """
    if len(judge_scores) != len(human_scores):
        raise ValueError(f"{len(judge_scores)} judge scores but {len(human_scores)} human scores")
    pairs = [
        (float(judge), float(human))
        for judge, human in zip(judge_scores, human_scores, strict=True)
        if judge is not None and human is not None
    ]
    n = len(pairs)
    if n == 0:
        return Calibration(0, None, None, None, None, None)
    judges = [judge for judge, _ in pairs]
    humans = [human for _, human in pairs]
    judge_passes = [judge >= threshold for judge in judges]
    human_passes = [human >= threshold for human in humans]
    agreement = sum(j == h for j, h in zip(judge_passes, human_passes, strict=True)) / n
    kappa: float | None = None
    if n >= 2:
        judge_rate, human_rate = sum(judge_passes) / n, sum(human_passes) / n
        chance = judge_rate * human_rate + (1 - judge_rate) * (1 - human_rate)
        if chance < 1:
            kappa = (agreement - chance) / (1 - chance)
    return Calibration(
        n=n,
        agreement=agreement,
        cohen_kappa=kappa,
        pearson=_pearson(judges, humans),
        spearman=_pearson(_average_ranks(judges), _average_ranks(humans)),
        mean_absolute_error=sum(abs(judge - human) for judge, human in pairs) / n,
    )


# --- construction from config -------------------------------------------------------------------------

_COMMON_KEYS = ("name", "version", "model", "max_attempts")
_SETTINGS: dict[str, tuple[str, ...]] = {
    "llm_judge": (*_COMMON_KEYS, "rubric", "scale", "pass_threshold", "use_reference"),
    "pairwise_judge": (*_COMMON_KEYS, "rubric", "use_reference"),
    "group_judge": (*_COMMON_KEYS, "rubric", "pass_threshold", "seed", "use_reference"),
    "reference_free": (*_COMMON_KEYS, "pass_threshold", "synthesiser_model"),
}


def judge_from_config(
    config: Mapping[str, Any], *, complete_for: Callable[[str | None], Complete]
) -> Evaluator | GroupEvaluator | PairwiseJudge:
    """A judge from its stored config: {"type": "llm_judge", "name": ..., "rubric": ..., "model": "alias"}.

    `complete_for(model)` gives the callable for a model alias (None: the default judge model). A
    reference_free judge's synthesiser uses `synthesiser_model`, else `model`. Raises
    `EvaluatorConfigError` naming the field for an unknown type, an unknown key or a bad value.
    """
    if not isinstance(config, Mapping):
        raise EvaluatorConfigError("type", f"a judge config is an object, got {type(config).__name__}")
    kind = config.get("type")
    if kind is None:
        raise EvaluatorConfigError("type", "is required")
    if kind not in JUDGE_TYPES:
        raise EvaluatorConfigError("type", f"must be one of {', '.join(JUDGE_TYPES)}, got {kind!r}")
    settings = {str(key): value for key, value in config.items() if key != "type"}
    accepted = _SETTINGS[kind]
    for key in settings:
        if key not in accepted:
            raise EvaluatorConfigError(key, f"is not a setting of {kind}; known: {', '.join(sorted(accepted))}")
    if kind == "llm_judge" and "rubric" not in settings:
        raise EvaluatorConfigError("rubric", "is required")
    model = settings.get("model")
    if model is not None:
        _check_type("model", model, str, "a model alias")
    if kind == "llm_judge":
        return RubricJudge(complete=complete_for(model), **settings)
    if kind == "pairwise_judge":
        return PairwiseJudge(complete=complete_for(model), **settings)
    if kind == "group_judge":
        return GroupJudge(complete=complete_for(model), **settings)
    synthesiser_model = settings.get("synthesiser_model", model)
    if synthesiser_model is not None:
        _check_type("synthesiser_model", synthesiser_model, str, "a model alias")
    return ReferenceFreeJudge(complete=complete_for(model), synthesise=complete_for(synthesiser_model), **settings)


__all__ = [
    "JUDGE_TYPES",
    "SCALES",
    "Calibration",
    "Complete",
    "EstimatedReference",
    "GroupEvaluator",
    "GroupJudge",
    "ModelUnavailable",
    "PairwiseJudge",
    "PairwiseVerdict",
    "ReferenceFreeJudge",
    "RubricJudge",
    "is_group_evaluator",
    "judge_calibration",
    "judge_from_config",
    "render_input",
    "render_tool_calls",
]
