"""Dataset items as data: validating one item, and reading and writing whole lists as JSONL and CSV.

Pure (no Django): the services store what this module accepts, and the download writes what it reads,
so an uploaded file, the JSON API and a downloaded file share one shape:

    {"task": str, "input_messages": [{"role", "content", ...}], "reference_output": str | null,
     "expected_tool_calls": [{"name", "arguments"}] | null, "expected_state": {...} | null,
     "metadata": {"tags": {"group": "value"}, ...}, "source_trace_id": str}

An item has input messages (OpenAI-style), a task text, or both; the rest is optional. In CSV the
structured fields are JSON in their cells and an empty cell means "not given".

A file is parsed whole before anything is stored: every problem is collected as a `ProblemRow` naming
its line (1-based, the CSV header is line 1) and field, so a malformed upload imports nothing and
says everything that is wrong with it at once.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from config.errors import InvalidJson
from config.json_body import holds_nul, json_loads_storable

FIELDS = (
    "key",
    "task",
    "input_messages",
    "reference_output",
    "expected_tool_calls",
    "expected_state",
    "metadata",
    "source_trace_id",
)
# The CSV cells that hold JSON.
_JSON_FIELDS = frozenset({"input_messages", "expected_tool_calls", "expected_state", "metadata"})
MESSAGE_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
TRACE_ID_MAX_CHARS = 32
KEY_MAX_CHARS = 200
# One file reports at most this many problems; the rest are the same mistake repeated.
MAX_PROBLEMS = 50


@dataclass(frozen=True, slots=True)
class Problem:
    """What is wrong with one field of one item; `line` is the file's line, or the item's index + 1."""

    line: int
    field: str
    message: str

    def as_dict(self) -> dict[str, Any]:
        return {"line": self.line, "field": self.field, "message": self.message}


class ItemsInvalid(ValueError):
    """Raised with every problem found; nothing of the input is usable."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        summary = "; ".join(f"line {item.line}, {item.field}: {item.message}" for item in problems[:5])
        super().__init__(summary)
        self.problems = tuple(problems)


@dataclass(frozen=True, slots=True)
class ItemData:
    # The item's identity across versions: comparisons of two runs pair items by it. Blank: not given, and
    # `items_keyed` derives it from the input, so an unchanged input keeps its key from version to version.
    key: str = ""
    task: str = ""
    input_messages: tuple[Mapping[str, Any], ...] = ()
    reference_output: str | None = None
    expected_tool_calls: tuple[Mapping[str, Any], ...] | None = None
    expected_state: Mapping[str, Any] | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    source_trace_id: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "task": self.task,
            "input_messages": [dict(message) for message in self.input_messages],
            "reference_output": self.reference_output,
            "expected_tool_calls": (
                None if self.expected_tool_calls is None else [dict(call) for call in self.expected_tool_calls]
            ),
            "expected_state": None if self.expected_state is None else dict(self.expected_state),
            "metadata": dict(self.metadata),
            "source_trace_id": self.source_trace_id,
        }


class _Collector:
    def __init__(self, line: int) -> None:
        self.line = line
        self.problems: list[Problem] = []

    def add(self, field_name: str, message: str) -> None:
        self.problems.append(Problem(self.line, field_name, message))


def _messages(value: object, problems: _Collector) -> tuple[Mapping[str, Any], ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        problems.add("input_messages", "must be a list of messages")
        return ()
    for index, message in enumerate(value):
        where = f"input_messages[{index}]"
        if not isinstance(message, dict):
            problems.add(where, "must be an object with a role and content")
        elif not isinstance(message.get("role"), str) or message["role"] not in MESSAGE_ROLES:
            problems.add(f"{where}.role", f"must be one of {', '.join(sorted(MESSAGE_ROLES))}")
        elif not isinstance(message.get("content"), str | list | None):
            problems.add(f"{where}.content", "must be text, a list of parts or null")
    return tuple(value)


def _tool_calls(value: object, problems: _Collector) -> tuple[Mapping[str, Any], ...] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        problems.add("expected_tool_calls", "must be a list of {name, arguments}")
        return None
    calls: list[Mapping[str, Any]] = []
    for index, call in enumerate(value):
        where = f"expected_tool_calls[{index}]"
        if not isinstance(call, dict):
            problems.add(where, "must be an object with a name and arguments")
            continue
        unknown = sorted(set(call) - {"name", "arguments"})
        if unknown:
            problems.add(f"{where}.{unknown[0]}", "is not a field of a tool call (name, arguments)")
        name = call.get("name")
        arguments = call.get("arguments", {})
        if not isinstance(name, str) or not name.strip():
            problems.add(f"{where}.name", "must be a non-empty string")
        if not isinstance(arguments, dict):
            problems.add(f"{where}.arguments", "must be an object")
        calls.append({"name": name, "arguments": arguments})
    return tuple(calls)


def _metadata(value: object, problems: _Collector) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.add("metadata", "must be an object")
        return {}
    tags = value.get("tags")
    if tags is not None:
        # Tags are the subgroups a run reports per group: each is a dimension with one value.
        if not isinstance(tags, dict):
            problems.add("metadata.tags", "must be an object of group name to value")
        else:
            for name, tag in tags.items():
                if not isinstance(tag, str | int | bool):
                    problems.add(f"metadata.tags.{name}", "must be a string, number or boolean")
    return value


def item_parse(data: object, *, line: int) -> ItemData:
    """One item from its JSON form; raises `ItemsInvalid` with every problem, each naming `line`."""
    problems = _Collector(line)
    if not isinstance(data, dict):
        raise ItemsInvalid([Problem(line, "item", "must be a JSON object")])
    for name in sorted(set(data) - set(FIELDS)):
        problems.add(name, f"is not a field of an item ({', '.join(FIELDS)})")
    for name in FIELDS:
        # A CSV cell may hold a NUL that no JSON escaping hid; PostgreSQL text cannot.
        if holds_nul(data.get(name)):
            problems.add(name, "holds a NUL character (\\u0000), which cannot be stored")

    task = data.get("task")
    if task is None:
        task = ""
    if not isinstance(task, str):
        problems.add("task", "must be text")
        task = ""
    messages = _messages(data.get("input_messages"), problems)
    messages_invalid = any(problem.field.startswith("input_messages") for problem in problems.problems)
    if not task.strip() and not messages and not messages_invalid:
        problems.add("input_messages", "an item needs input messages or a task")

    reference = data.get("reference_output")
    if reference == "":
        reference = None
    if reference is not None and not isinstance(reference, str):
        problems.add("reference_output", "must be text or null")
        reference = None

    state = data.get("expected_state")
    if state is not None and not isinstance(state, dict):
        problems.add("expected_state", "must be an object or null")
        state = None

    key = data.get("key")
    if key is None:
        key = ""
    if isinstance(key, int) and not isinstance(key, bool):
        key = str(key)  # a numeric id is a common habit; it is the same identity as its text
    if not isinstance(key, str) or len(key) > KEY_MAX_CHARS or (key and not key.strip()):
        problems.add("key", f"must be text of at most {KEY_MAX_CHARS} characters, not blank")
        key = ""

    trace_id = data.get("source_trace_id")
    if trace_id is None:
        trace_id = ""
    if not isinstance(trace_id, str) or len(trace_id) > TRACE_ID_MAX_CHARS:
        problems.add("source_trace_id", f"must be a trace id of at most {TRACE_ID_MAX_CHARS} characters")
        trace_id = ""

    item = ItemData(
        key=key,
        task=task,
        input_messages=messages,
        reference_output=reference,
        expected_tool_calls=_tool_calls(data.get("expected_tool_calls"), problems),
        expected_state=state,
        metadata=_metadata(data.get("metadata"), problems),
        source_trace_id=trace_id,
    )
    if problems.problems:
        raise ItemsInvalid(problems.problems)
    return item


def _parse_all(rows: Iterator[tuple[int, object]] | Sequence[tuple[int, object]]) -> list[ItemData]:
    items: list[ItemData] = []
    problems: list[Problem] = []
    key_lines: dict[str, int] = {}
    for line, data in rows:
        if isinstance(data, Problem):
            problems.append(data)
            continue
        try:
            item = item_parse(data, line=line)
        except ItemsInvalid as error:
            problems.extend(error.problems)
        else:
            items.append(item)
            if item.key and item.key in key_lines:
                problems.append(Problem(line, "key", f"repeats the key of line {key_lines[item.key]}"))
            key_lines.setdefault(item.key, line)
        if len(problems) >= MAX_PROBLEMS:
            break
    if problems:
        raise ItemsInvalid(problems[:MAX_PROBLEMS])
    return items


def items_parse(data: Sequence[object]) -> list[ItemData]:
    """Items from the JSON API; a problem's line is the item's position, counted from 1."""
    return _parse_all([(index + 1, item) for index, item in enumerate(data)])


def input_key(task: str, input_messages: Sequence[Mapping[str, Any]]) -> str:
    """The key an item without one gets: a hash of its input (task and messages), so that the same input
    in two versions is the same item, whatever happened to its reference, tags or position."""
    canonical = json.dumps(
        {"task": task, "input_messages": list(input_messages)},
        ensure_ascii=False,
        sort_keys=True,
        separators=(",", ":"),
        default=str,
    )
    return "input:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:24]


def items_keyed(items: Sequence[ItemData]) -> list[ItemData]:
    """The items, each with its key: the one it was given, else its input's hash; the second and later
    items with the same input get "#2", "#3"... after it. Raises `ItemsInvalid` (the line is the item's
    index + 1) when two items were given the same key."""
    problems: list[Problem] = []
    given: dict[str, int] = {}
    for index, item in enumerate(items):
        if not item.key:
            continue
        if item.key in given:
            problems.append(Problem(index + 1, "key", f"repeats the key of item {given[item.key]}"))
        given.setdefault(item.key, index + 1)
    if problems:
        raise ItemsInvalid(problems[:MAX_PROBLEMS])
    taken = set(given)
    keyed: list[ItemData] = []
    for item in items:
        if item.key:
            keyed.append(item)
            continue
        base = input_key(item.task, item.input_messages)
        key, repeat = base, 1
        while key in taken:
            repeat += 1
            key = f"{base}#{repeat}"
        taken.add(key)
        keyed.append(replace(item, key=key))
    return keyed


def content_text(content: Any) -> str | None:
    """The text of an OpenAI message's content (a string, or its text parts joined); None when it has none."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [str(part["text"]) for part in content if isinstance(part, dict) and isinstance(part.get("text"), str)]
        return "".join(texts) if texts else None
    return None


def _text(content: bytes) -> str:
    try:
        return content.decode("utf-8-sig")  # a spreadsheet's byte-order mark is not part of the header
    except UnicodeDecodeError as error:
        line = content[: error.start].count(b"\n") + 1
        raise ItemsInvalid([Problem(line, "file", "is not UTF-8 text")]) from None


def _jsonl_rows(text: str) -> Iterator[tuple[int, object]]:
    # split("\n"), not splitlines(): U+2028 and friends may stand unescaped inside a JSON string.
    for line, raw in enumerate(text.split("\n"), start=1):
        if not raw.strip():
            continue
        try:
            yield line, json_loads_storable(raw)
        except InvalidJson as error:
            yield line, Problem(line, "item", error.detail)


def _csv_rows(text: str) -> Iterator[tuple[int, object]]:
    reader = csv.DictReader(io.StringIO(text, newline=""), restkey="\x00extra")
    header = reader.fieldnames or []
    unknown = [name for name in header if name not in FIELDS]
    if unknown:
        yield 1, Problem(1, unknown[0], f"is not a column of an item ({', '.join(FIELDS)})")
        return
    try:
        for row in reader:
            line = reader.line_num
            if "\x00extra" in row:
                yield line, Problem(line, "row", f"has more cells than the header's {len(header)} columns")
                continue
            if all(not (value or "").strip() for value in row.values()):
                continue
            data: dict[str, object] = {}
            bad = False
            for name, value in row.items():
                if value is None or value == "":
                    continue
                if name in _JSON_FIELDS:
                    try:
                        data[name] = json_loads_storable(value)
                    except InvalidJson as error:
                        yield line, Problem(line, name, error.detail)
                        bad = True
                else:
                    data[name] = value
            if not bad:
                yield line, data
    except csv.Error as error:
        yield reader.line_num, Problem(reader.line_num, "row", f"is not valid CSV: {error}")


def items_from_file(content: bytes, *, file_format: str) -> list[ItemData]:
    """Every item of a JSONL or CSV file, or `ItemsInvalid` naming each bad line and field."""
    text = _text(content)
    if file_format == "jsonl":
        items = _parse_all(_jsonl_rows(text))
    elif file_format == "csv":
        items = _parse_all(_csv_rows(text))
    else:
        raise ItemsInvalid([Problem(0, "format", "must be jsonl or csv")])
    if not items:
        raise ItemsInvalid([Problem(1, "file", "holds no items")])
    return items


def items_to_jsonl(items: Sequence[ItemData]) -> str:
    return "".join(json.dumps(item.as_dict(), ensure_ascii=False, sort_keys=True) + "\n" for item in items)


def items_to_csv(items: Sequence[ItemData]) -> str:
    out = io.StringIO(newline="")
    # RFC 4180's CRLF: the writer quotes a cell holding any character of the line terminator, so a text
    # with a lone carriage return is quoted too (with "\n" alone it was not, and read back as two rows).
    writer = csv.DictWriter(out, fieldnames=FIELDS, lineterminator="\r\n")
    writer.writeheader()
    for item in items:
        row: dict[str, str] = {}
        for name, value in item.as_dict().items():
            if name in _JSON_FIELDS:
                empty = value is None or (name in ("input_messages", "metadata") and not value)
                row[name] = "" if empty else json.dumps(value, ensure_ascii=False, sort_keys=True)
            else:
                row[name] = value or ""
        writer.writerow(row)
    return out.getvalue()
