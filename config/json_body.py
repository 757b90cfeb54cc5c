"""Request bodies as JSON that Keel can store. Pure module, no Django.

orjson refuses invalid UTF-8, lone surrogates, NaN and Infinity, and nesting past 1024 levels; the
standard library's parser accepts the first three (which PostgreSQL then refuses, mid-write) and
overflows the stack on deep nesting. A NUL character is valid JSON but no PostgreSQL text or jsonb
value can hold it, so it is refused here too, before anything is written.
"""

from __future__ import annotations

from typing import Any

import orjson

from config.errors import InvalidJson


def holds_nul(document: Any) -> bool:
    """Whether a NUL character is in any string (or key) of a JSON document."""
    # Iterative: orjson allows nesting 1024 deep, past Python's recursion limit.
    stack = [document]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            if "\x00" in node:
                return True
        elif isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


def json_loads_storable(text: bytes | str) -> Any:
    """The JSON document in `text` (UTF-8 bytes, or a str); raises `InvalidJson` whose detail reads after
    the name of what was parsed ("is not valid JSON: ...", "holds a NUL character ...")."""
    try:
        document = orjson.loads(text)
    except orjson.JSONDecodeError as error:
        raise InvalidJson(f"is not valid JSON: {error}") from None
    # In valid JSON a NUL can only be the escape \u0000, so most documents skip the walk.
    escaped = b"\\u0000" in text if isinstance(text, bytes) else "\\u0000" in text
    if escaped and holds_nul(document):
        raise InvalidJson("holds a NUL character (\\u0000), which Keel cannot store")
    return document


def json_body_loads(body: bytes) -> Any:
    """The JSON document in a request body; raises `InvalidJson` ("the body is not valid JSON: ...")."""
    try:
        return json_loads_storable(body)
    except InvalidJson as error:
        raise InvalidJson(f"the body {error.detail}") from None
