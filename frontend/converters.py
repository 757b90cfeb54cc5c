"""Path converters for values the dashboard does not choose: a session id is whatever an agent sent."""

from __future__ import annotations


class AnyTextConverter:
    """Any non-empty text, slashes and line breaks included. Django's `path` converter stops at a line
    break, so one session id with a newline in it made every page that links to it fail to reverse (the
    trajectory list, the session list, the trajectory) and its own page unreachable."""

    regex = r"(?s:.+)"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value
