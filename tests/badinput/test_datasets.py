"""Dataset versions from generated items: POST /datasets/{name}/versions (JSON) and /upload (JSONL, CSV).

Valid items round-trip: the version is created, and its download, in either format, holds the same
items. Mutated items and files are either taken the same way or refused with a 4xx naming the line
and field, leaving every table as it was. (evals/tests/test_datasets_api.py has the hand-written
cases; this is the generated sweep.)
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evals import dataset_items
from evals import services as evals_services
from tests.badinput.conftest import assert_refused, fuzz, json_paths, json_replace, rolled_back, row_counts

pytestmark = pytest.mark.django_db

TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=30)
WORD = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=10).filter(str.strip)
# Floats beyond 1e15 come back from PostgreSQL's jsonb as the integer of their decimal digits (1e300 as
# 10**300, which is not the float 1e300), so the round trip compares only magnitudes jsonb keeps exactly.
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(-1e15, 1e15, allow_nan=False, allow_infinity=False)
    | TEXT,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(WORD, children, max_size=3),
    max_leaves=8,
)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(sorted(dataset_items.MESSAGE_ROLES)), "content": st.one_of(TEXT, st.none())}
)
ITEM = st.fixed_dictionaries(
    {"task": WORD},
    optional={
        "input_messages": st.lists(MESSAGE, max_size=3),
        "reference_output": TEXT,
        "expected_tool_calls": st.lists(
            st.fixed_dictionaries({"name": WORD, "arguments": st.dictionaries(WORD, JSON, max_size=2)}), max_size=2
        ),
        "expected_state": st.dictionaries(WORD, JSON, max_size=3),
        "metadata": st.fixed_dictionaries(
            {}, optional={"tags": st.dictionaries(WORD, st.one_of(WORD, st.booleans()), max_size=2), "note": JSON}
        ),
        "source_trace_id": st.text("0123456789abcdef", max_size=32),
    },
)
ITEMS = st.lists(ITEM, min_size=1, max_size=5)


@pytest.fixture
def dataset(workspace):
    return evals_services.dataset_create(workspace=workspace, name="fuzzed", description="", agent=None)


def _jsonl(items: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(item, ensure_ascii=False) + "\n" for item in items).encode()


def _csv(items: list[dict[str, Any]]) -> bytes:
    out = io.StringIO(newline="")
    writer = csv.DictWriter(out, fieldnames=dataset_items.FIELDS, lineterminator="\r\n")
    writer.writeheader()
    for item in items:
        writer.writerow(
            {
                name: json.dumps(value, ensure_ascii=False)
                if name in ("input_messages", "expected_tool_calls", "expected_state", "metadata")
                else value
                for name, value in item.items()
            }
        )
    return out.getvalue().encode()


def _as_stored(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # Stored with a key each: none is given here, so each gets its input's hash.
    parsed = [dataset_items.item_parse(item, line=1) for item in items]
    return [item.as_dict() for item in dataset_items.items_keyed(parsed)]


def _post(client: Any, how: str, items: list[dict[str, Any]] | bytes) -> Any:
    if how == "json":
        return client.post(
            "/api/v1/datasets/fuzzed/versions", json.dumps({"items": items}), content_type="application/json"
        )
    content_type = "application/x-ndjson" if how == "jsonl" else "text/csv"
    body = items if isinstance(items, bytes) else (_jsonl(items) if how == "jsonl" else _csv(items))
    return client.post(f"/api/v1/datasets/fuzzed/upload?format={how}", body, content_type=content_type)


def _downloaded(client: Any, version: int, file_format: str) -> list[dict[str, Any]]:
    response = client.get(f"/api/v1/datasets/fuzzed/versions/{version}/download?format={file_format}")
    assert response.status_code == 200, response.content[:300]
    content = b"".join(response.streaming_content) if response.streaming else response.content
    return [item.as_dict() for item in dataset_items.items_from_file(content, file_format=file_format)]


@fuzz(40)
@given(items=ITEMS, how=st.sampled_from(["json", "jsonl", "csv"]))
def test_valid_items_are_stored_and_download_as_sent(client, dataset, items, how):
    with rolled_back():
        response = _post(client, how, items)

        assert response.status_code == 201, response.content[:500]
        version = response.json()["version"]
        assert response.json()["item_count"] == len(items)
        expected = _as_stored(items)
        assert _downloaded(client, version, "jsonl") == expected
        assert _downloaded(client, version, "csv") == expected


def _stored_whole_or_refused(client: Any, how: str, body: list[Any] | bytes) -> None:
    before = row_counts()
    response = _post(client, how, body)
    if response.status_code == 201:
        version = response.json()["version"]
        assert len(_downloaded(client, version, "jsonl")) == response.json()["item_count"]
        return
    error = assert_refused(response, 400, 413, 422)
    assert row_counts() == before
    if response.status_code == 422 and error["code"] == "dataset_items_invalid":
        assert all({"line", "field", "message"} <= set(problem) for problem in error["errors"]), error


ODD = st.one_of(JSON, st.sampled_from(["", 0, -1, 1e308, "x" * 40, {"role": "wizard"}, [[]], {"tags": [1]}]))


@fuzz(50)
@given(
    items=ITEMS,
    edits=st.lists(st.tuples(st.integers(0, 10**6), ODD), min_size=1, max_size=3),
    how=st.sampled_from(["json", "jsonl"]),
)
def test_mutated_items_are_stored_whole_or_refused_leaving_nothing(client, dataset, items, edits, how):
    document: Any = items
    for choice, value in edits:
        candidates = json_paths(document)[1:] or [()]
        document = json_replace(document, candidates[choice % len(candidates)], value)
    if how == "jsonl" and not isinstance(document, list):
        document = [document]
    with rolled_back():
        _stored_whole_or_refused(client, how, document if how == "json" else _jsonl(document))


@fuzz(50)
@given(
    items=ITEMS,
    cut=st.integers(0, 10**6),
    junk=st.binary(max_size=12),
    how=st.sampled_from(["jsonl", "csv"]),
)
def test_damaged_files_are_stored_whole_or_refused_leaving_nothing(client, dataset, items, cut, junk, how):
    body = _jsonl(items) if how == "jsonl" else _csv(items)
    at = cut % (len(body) + 1)

    with rolled_back():
        _stored_whole_or_refused(client, how, body[:at] + junk + body[at:])
