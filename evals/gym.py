"""An eval run's samples as NeMo Gym rollouts: writing them as JSONL, reading such files back, and their report.

Pure module, no Django: the services turn a run's outputs into `Rollout`s (one per sampled answer) and
stream `rollouts_lines` to a download; an uploaded file goes through `rollouts_read` and is stored as a
run. One line is one rollout in the shape NeMo Gym's rollout collection writes (its `BaseVerifyResponse`):

    {"responses_create_params": {"input": [{"role": "user", "content": "..."}]},
     "response": {"output": [{"type": "message", "role": "assistant",
                              "content": [{"type": "output_text", "text": "..."}]},
                             {"type": "function_call", "call_id": "...", "name": "...", "arguments": "{...}"}]},
     "reward": 1.0, "_ng_task_index": 0, "_ng_rollout_index": 0,
     "keel": {"task_index": 0, "sample": 0, "passed": true, "metadata": {...}}}

Gym's tools read the first three keys and group on `_ng_task_index`/`_ng_rollout_index`; everything else
Keel needs sits under the one "keel" key, which a Gym consumer ignores. An errored sample (no score) is
written with `"reward": null`, because a 0 would count it as a failure: Keel's metrics leave errored
samples out of every statistic.

Reading takes the files Keel writes and plain Gym files. Without the "keel" key a rollout's task is named
by a top-level `_ng_task_index`, `task_index`, `task_id`, `problem_id` or `instance_id` (the first
present), else by its `responses_create_params.input`: rollouts with identical input are one task. Tasks
are numbered in the order first seen, samples in file order within their task, and the other top-level
fields (verifier metrics, agent_ref, task fields) become the rollout's metadata. A plain file must give
every rollout a numeric reward (true/false read as 1/0).

A file is read whole before anything is returned: every problem is collected as a `Problem` naming its
line (from 1) and field, as for dataset items, so a bad file imports nothing and says all that is wrong.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Final, cast

from config.errors import InvalidJson
from config.json_body import json_loads_storable
from evals.dataset_items import MAX_PROBLEMS, Problem
from evals.metrics import DEFAULT_KS, ItemResult, RunReport, Sample, run_report

KEEL_KEY: Final = "keel"
# Past this many rollouts a file is refused: a run of 2,000 items at 16 samples is 32,000.
MAX_ROLLOUTS: Final = 200_000
# Binary rewards (Gym's common case) pass at 1; a continuous reward needs the caller's threshold.
DEFAULT_REWARD_PASS_THRESHOLD: Final = 1.0
# The top-level fields that name a task in a plain Gym file, in order of preference.
TASK_ID_FIELDS: Final = ("_ng_task_index", "task_index", "task_id", "problem_id", "instance_id")
_ROLLOUT_FIELDS: Final = frozenset({"responses_create_params", "response", "reward", "output", KEEL_KEY})
_GYM_INDEX_FIELDS: Final = frozenset({"_ng_task_index", "_ng_rollout_index"})


class RolloutsInvalid(ValueError):
    """Raised with every problem found in a rollouts file; nothing of it is usable."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        summary = "; ".join(f"line {problem.line}, {problem.field}: {problem.message}" for problem in problems[:5])
        super().__init__(summary)
        self.problems = tuple(problems)


@dataclass(frozen=True, slots=True)
class Rollout:
    """One sampled answer to one task: what the model was given, what it answered, and its reward.

    `input` is OpenAI-style messages (kept as a list of dicts, as JSON gives them) or a text.
    `output_items` are the Responses API output items (assistant messages, function calls); when none
    are given they are made from `output_text`, and when only items are given `output_text` is their
    message text, so a rollout always writes and reads back the same. `reward` None means errored;
    `passed` None means not known (or errored), and `rollout_passed` then applies a reward threshold.
    `metadata` holds subgroup tags under "tags", evaluator scores, the trace id and the like.
    """

    task_index: int
    sample: int
    input: str | list[dict[str, Any]]
    output_text: str = ""
    output_items: Sequence[Mapping[str, Any]] | None = ()
    reward: float | None = None
    passed: bool | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("task_index", "sample"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
        if not isinstance(self.input, str):
            object.__setattr__(self, "input", [dict(message) for message in self.input])
        if self.reward is not None:
            if isinstance(self.reward, bool) or not isinstance(self.reward, int | float):
                raise ValueError(f"reward must be a number or None, got {self.reward!r}")
            if not math.isfinite(self.reward):
                raise ValueError(f"reward must be finite, got {self.reward!r}")
            object.__setattr__(self, "reward", float(self.reward))
        items = tuple(dict(item) for item in self.output_items or ())
        if not items:
            items = output_items_build(self.output_text)
        elif not self.output_text:
            object.__setattr__(self, "output_text", output_items_text(items))
        elif output_items_text(items) != self.output_text:
            raise ValueError("output_text must be the text of the output items' assistant messages")
        object.__setattr__(self, "output_items", items)

    @property
    def errored(self) -> bool:
        return self.reward is None

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        """The output's function calls as {"name", "arguments"}, arguments decoded when they are JSON."""
        calls = []
        for item in self.output_items or ():
            if item.get("type") != "function_call":
                continue
            arguments = item.get("arguments")
            if isinstance(arguments, str):
                with contextlib.suppress(ValueError):  # else kept as the text the model produced
                    arguments = json.loads(arguments)
            calls.append({"name": item.get("name"), "arguments": arguments})
        return calls


def output_items_build(text: str, tool_calls: Iterable[Mapping[str, Any]] = ()) -> tuple[dict[str, Any], ...]:
    """Responses API output items for an answer: its text as one assistant message, then one
    `function_call` item per tool call ({"name", "arguments", optional "id"}), arguments as a JSON string
    as the Responses API carries them."""
    items: list[dict[str, Any]] = []
    if text:
        items.append(
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]},
        )
    for index, call in enumerate(tool_calls):
        arguments = call.get("arguments", {})
        items.append(
            {
                "type": "function_call",
                "call_id": str(call.get("id") or f"call_{index}"),
                "name": call.get("name"),
                "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments, sort_keys=True),
            }
        )
    return tuple(items)


def output_items_text(items: Iterable[Mapping[str, Any]]) -> str:
    """The text of the assistant messages among output items: their `output_text` parts, in order."""
    texts: list[str] = []
    for item in items:
        if item.get("type", "message") != "message" or item.get("role", "assistant") != "assistant":
            continue
        content = item.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts.extend(
                part["text"]
                for part in content
                if isinstance(part, dict) and part.get("type") == "output_text" and isinstance(part.get("text"), str)
            )
    return "\n".join(texts)


def rollout_passed(rollout: Rollout, *, threshold: float = DEFAULT_REWARD_PASS_THRESHOLD) -> bool:
    """Whether a rollout passed: as it says, else reward >= threshold; an errored one never passes."""
    if rollout.passed is not None:
        return rollout.passed
    return rollout.reward is not None and rollout.reward >= threshold


# --- Writing --------------------------------------------------------------------------------------------


def rollout_as_dict(rollout: Rollout) -> dict[str, Any]:
    """A rollout's line as a JSON object, in NeMo Gym's shape with Keel's fields under "keel"."""
    return {
        "responses_create_params": {"input": rollout.input},
        "response": {"output": [dict(item) for item in rollout.output_items or ()]},
        "reward": rollout.reward,
        "_ng_task_index": rollout.task_index,
        "_ng_rollout_index": rollout.sample,
        KEEL_KEY: {
            "task_index": rollout.task_index,
            "sample": rollout.sample,
            "passed": rollout.passed,
            "metadata": dict(rollout.metadata),
        },
    }


def rollouts_lines(rollouts: Iterable[Rollout]) -> Iterator[bytes]:
    """One UTF-8 JSON line per rollout, made as the rollouts are drawn (for a streaming response)."""
    for rollout in rollouts:
        line = json.dumps(rollout_as_dict(rollout), ensure_ascii=False, allow_nan=False)
        yield line.encode("utf-8") + b"\n"


def rollouts_write(rollouts: Iterable[Rollout], out: IO[bytes] | IO[str]) -> int:
    """Write the rollouts to `out` (binary or text) line by line, holding one at a time; how many."""
    written = 0
    text = isinstance(out, io.TextIOBase)
    for line in rollouts_lines(rollouts):
        if text:
            cast(IO[str], out).write(line.decode("utf-8"))
        else:
            cast(IO[bytes], out).write(line)
        written += 1
    return written


# --- Reading --------------------------------------------------------------------------------------------


def _raw_lines(content: bytes | Iterable[bytes]) -> Iterator[tuple[int, bytes]]:
    # Chunks of any size (an upload's chunks, a file's lines) are joined and split on b"\n" only: a
    # UTF-8 U+2028 inside a JSON string is not a line break.
    chunks: Iterable[bytes] = (content,) if isinstance(content, bytes | bytearray) else content
    pending = b""
    line = 0
    for chunk in chunks:
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for raw in complete:
            line += 1
            yield line, raw
    if pending:
        yield line + 1, pending


class _Collector:
    def __init__(self, line: int) -> None:
        self.line = line
        self.problems: list[Problem] = []

    def add(self, field_name: str, message: str) -> None:
        self.problems.append(Problem(self.line, field_name, message))


@dataclass(slots=True)
class _Parsed:
    """A line read, before its task is numbered (plain files number tasks across lines)."""

    line: int
    task_key: str | None  # set for a plain line; Keel's lines carry their own task_index
    task_index: int
    sample: int
    input: str | list[dict[str, Any]]
    output_text: str
    output_items: list[dict[str, Any]]
    reward: float | None
    passed: bool | None
    metadata: dict[str, Any]


def _reward(data: dict[str, Any], problems: _Collector, *, nullable: bool) -> float | None:
    value = data.get("reward")
    if value is None and nullable and "reward" in data:
        return None
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    if "reward" not in data:
        problems.add("reward", "is required")
    else:
        problems.add("reward", "must be a finite number" + (" or null (errored)" if nullable else ""))
    return None


def _input(data: dict[str, Any], problems: _Collector) -> str | list[dict[str, Any]]:
    params = data.get("responses_create_params")
    if not isinstance(params, dict):
        problems.add("responses_create_params", "must be an object with an input")
        return []
    value = params.get("input")
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        problems.add("responses_create_params.input", "must be text or a list of messages")
        return []
    for index, message in enumerate(value):
        if not isinstance(message, dict):
            problems.add(f"responses_create_params.input[{index}]", "must be an object")
    return value


def _output(data: dict[str, Any], problems: _Collector) -> tuple[str, list[dict[str, Any]]]:
    response = data.get("response")
    if isinstance(response, str):
        return response, []
    if response is None and isinstance(data.get("output"), str):
        return data["output"], []
    if not isinstance(response, dict) or not isinstance(response.get("output"), list):
        problems.add("response.output", "must be a list of output items (or response a string)")
        return "", []
    items = response["output"]
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            problems.add(f"response.output[{index}]", "must be an object")
        elif item.get("type") == "function_call" and not isinstance(item.get("name"), str):
            problems.add(f"response.output[{index}].name", "a function call needs a name")
    if any(not isinstance(item, dict) for item in items):
        return "", []
    return output_items_text(items), items


def _keel(block: object, problems: _Collector) -> tuple[int, int, bool | None, dict[str, Any]]:
    if not isinstance(block, dict):
        problems.add(KEEL_KEY, "must be an object with task_index, sample, passed and metadata")
        return 0, 0, None, {}
    numbers = []
    for name in ("task_index", "sample"):
        value = block.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            problems.add(f"{KEEL_KEY}.{name}", "must be a non-negative integer")
            value = 0
        numbers.append(value)
    passed = block.get("passed")
    if passed is not None and not isinstance(passed, bool):
        problems.add(f"{KEEL_KEY}.passed", "must be true, false or null")
        passed = None
    metadata = block.get("metadata", {})
    if not isinstance(metadata, dict):
        problems.add(f"{KEEL_KEY}.metadata", "must be an object")
        metadata = {}
    return numbers[0], numbers[1], passed, metadata


def _task_key(data: dict[str, Any], rollout_input: object) -> str:
    for name in TASK_ID_FIELDS:
        value = data.get(name)
        if value is not None:
            return json.dumps([name, value], sort_keys=True)
    # The input itself names the task; key order inside a message does not make a different task.
    return json.dumps(["input", rollout_input], sort_keys=True)


def _rollout_parse(data: object, *, line: int) -> tuple[_Parsed | None, list[Problem]]:
    problems = _Collector(line)
    if not isinstance(data, dict):
        return None, [Problem(line, "rollout", "must be a JSON object")]
    keel = KEEL_KEY in data
    rollout_input = _input(data, problems)
    output_text, output_items = _output(data, problems)
    reward = _reward(data, problems, nullable=keel)
    if keel:
        task_index, sample, passed, metadata = _keel(data[KEEL_KEY], problems)
        task_key = None
    else:
        task_index, sample, passed = 0, 0, None
        metadata = {name: value for name, value in data.items() if name not in _ROLLOUT_FIELDS | _GYM_INDEX_FIELDS}
        task_key = _task_key(data, rollout_input)
    if problems.problems:
        return None, problems.problems
    parsed = _Parsed(
        line, task_key, task_index, sample, rollout_input, output_text, output_items, reward, passed, metadata
    )
    return parsed, []


def rollouts_read(
    content: bytes | Iterable[bytes], *, threshold: float = DEFAULT_REWARD_PASS_THRESHOLD
) -> list[Rollout]:
    """Every rollout of a JSONL file (its bytes, whole or in chunks), or `RolloutsInvalid` naming each
    bad line and field. Tasks and samples as the module docstring describes.

    `passed` is what Keel wrote when it says; otherwise reward >= `threshold`, and None when errored.
    """
    parsed: list[_Parsed] = []
    problems: list[Problem] = []
    rollouts = 0
    for line, raw in _raw_lines(content):
        if len(problems) >= MAX_PROBLEMS:
            break
        if line == 1:
            raw = raw.removeprefix(b"\xef\xbb\xbf")
        raw = raw.rstrip(b"\r")
        if not raw.strip():
            continue
        rollouts += 1
        if rollouts > MAX_ROLLOUTS:
            problems.append(Problem(line, "file", f"holds more than {MAX_ROLLOUTS} rollouts"))
            break
        try:
            data = json_loads_storable(raw.decode("utf-8"))
        except UnicodeDecodeError:
            problems.append(Problem(line, "rollout", "is not UTF-8 text"))
            continue
        except InvalidJson as error:
            problems.append(Problem(line, "rollout", error.detail))
            continue
        rollout, found = _rollout_parse(data, line=line)
        problems.extend(found)
        if rollout is not None:
            parsed.append(rollout)
    problems.extend(_numbering_problems(parsed))
    if not parsed and not problems:
        problems.append(Problem(1, "file", "holds no rollouts"))
    if problems:
        raise RolloutsInvalid(problems[:MAX_PROBLEMS])
    return [
        Rollout(
            task_index=entry.task_index,
            sample=entry.sample,
            input=entry.input,
            output_text=entry.output_text,
            output_items=entry.output_items,
            reward=entry.reward,
            passed=_passed(entry, threshold),
            metadata=entry.metadata,
        )
        for entry in parsed
    ]


def _passed(entry: _Parsed, threshold: float) -> bool | None:
    if entry.passed is not None:
        return entry.passed
    return None if entry.reward is None else entry.reward >= threshold


def _numbering_problems(parsed: list[_Parsed]) -> list[Problem]:
    """Number the plain lines' tasks and samples in place; problems with Keel's own numbering."""
    problems: list[Problem] = []
    plain = [entry for entry in parsed if entry.task_key is not None]
    if plain and len(plain) != len(parsed):
        # A plain line's first-seen task number could collide with a Keel line's task_index.
        first_plain = plain[0].line
        first_keel = next(entry.line for entry in parsed if entry.task_key is None)
        problems.append(
            Problem(max(first_plain, first_keel), KEEL_KEY, "every rollout of a file carries it, or none does")
        )
        return problems
    if plain:
        tasks: dict[str, int] = {}
        samples: dict[int, int] = {}
        for entry in plain:
            assert entry.task_key is not None
            entry.task_index = tasks.setdefault(entry.task_key, len(tasks))
            entry.sample = samples.get(entry.task_index, 0)
            samples[entry.task_index] = entry.sample + 1
        return problems
    seen: set[tuple[int, int]] = set()
    for entry in parsed:
        if (entry.task_index, entry.sample) in seen:
            problems.append(
                Problem(entry.line, f"{KEEL_KEY}.sample", f"repeats sample {entry.sample} of task {entry.task_index}")
            )
        seen.add((entry.task_index, entry.sample))
    return problems


# --- The report -----------------------------------------------------------------------------------------


def _tag_value(value: object) -> str | list[str] | None:
    if isinstance(value, str):
        return value
    if isinstance(value, bool | int | float):
        return json.dumps(value)
    if isinstance(value, list) and all(isinstance(entry, str) for entry in value):
        return value
    return None


def _task_tags(metadata: Mapping[str, Any], subgroup_key: str | None) -> dict[str, str | list[str]]:
    tags: dict[str, str | list[str]] = {}
    declared = metadata.get("tags")
    if isinstance(declared, dict):
        for key, value in declared.items():
            if (tag := _tag_value(value)) is not None:
                tags[str(key)] = tag
    # A plain Gym file keeps task fields (say "category") at the top level, so in the metadata.
    if (
        subgroup_key is not None
        and subgroup_key not in tags
        and (tag := _tag_value(metadata.get(subgroup_key))) is not None
    ):
        tags[subgroup_key] = tag
    return tags


def rollouts_items(
    rollouts: Iterable[Rollout],
    *,
    threshold: float = DEFAULT_REWARD_PASS_THRESHOLD,
    subgroup_key: str | None = None,
) -> list[ItemResult]:
    """One `ItemResult` per task, in task order, its samples in sample order: the reward is the score,
    `rollout_passed` says whether it passed, and the first sample's metadata gives the tags."""
    tasks: dict[int, list[Rollout]] = {}
    for rollout in rollouts:
        tasks.setdefault(rollout.task_index, []).append(rollout)
    items = []
    for task_index, task_rollouts in sorted(tasks.items()):
        task_rollouts.sort(key=lambda rollout: rollout.sample)
        items.append(
            ItemResult(
                item_id=str(task_index),
                samples=tuple(
                    Sample(rollout.reward, rollout_passed(rollout, threshold=threshold)) for rollout in task_rollouts
                ),
                tags=_task_tags(task_rollouts[0].metadata, subgroup_key),
            )
        )
    return items


def rollouts_report(
    rollouts: Iterable[Rollout],
    *,
    ks: Sequence[int] = DEFAULT_KS,
    threshold: float = DEFAULT_REWARD_PASS_THRESHOLD,
    subgroup_key: str | None = None,
    worst_metric: str = "mean",
) -> RunReport:
    """The report `evals.metrics.run_report` makes for a run, from its rollouts (see `rollouts_items`).

    Subgroups for `subgroup_key` only when given, else for every tag key the tasks carry, as for a run.
    """
    items = rollouts_items(rollouts, threshold=threshold, subgroup_key=subgroup_key)
    tag_keys = [subgroup_key] if subgroup_key is not None else None
    return run_report(items, ks, tag_keys=tag_keys, worst_metric=worst_metric)
