"""Every route Keel serves, read from the URL configuration: Django's resolver walked to its leaves, and
for the django-ninja APIs each operation with its HTTP methods (a ninja URL pattern serves one path and
dispatches by method among the operations registered on it).

The security tests are generated from this list, so a route added to `config.urls` is a route they test,
or a route they fail on because nobody said who may call it."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from django.urls import URLPattern, URLResolver, get_resolver
from ninja.operation import PathView


@dataclass(frozen=True)
class Route:
    name: str  # with its namespace: "api:agent_list_api", "frontend:agent_list", "admin:index", "otlp-traces"
    pattern: str  # the full route, "api/v1/agents/<slug>"
    # The operation's methods for a ninja route; None for a Django view (its methods are not declared
    # anywhere a test can read them, so the tables state them and the tests check them).
    methods: frozenset[str] | None
    callback: Callable[..., Any]

    @property
    def namespace(self) -> str:
        return self.name.partition(":")[0] if ":" in self.name else ""

    @property
    def csrf_exempt(self) -> bool:
        return bool(getattr(self.callback, "csrf_exempt", False))

    @property
    def is_ninja(self) -> bool:
        return _path_view(self.callback) is not None


def _path_view(callback: Callable[..., Any]) -> PathView | None:
    """The ninja PathView behind a URL pattern's view (its view function closes over the PathView)."""
    if not inspect.isfunction(callback):
        return None
    owner = inspect.getclosurevars(callback).nonlocals.get("self")
    return owner if isinstance(owner, PathView) else None


def _walk(patterns: Sequence[URLPattern | URLResolver], prefix: str, namespace: str) -> Iterator[Route]:
    for entry in patterns:
        if isinstance(entry, URLResolver):
            inner = f"{namespace}{entry.namespace}:" if entry.namespace else namespace
            yield from _walk(entry.url_patterns, prefix + str(entry.pattern), inner)
            continue
        name = f"{namespace}{entry.name}" if entry.name else f"{namespace}<unnamed {prefix}{entry.pattern}>"
        methods = None
        path_view = _path_view(entry.callback)
        if path_view is not None:
            url_name = (entry.name or "").rpartition(":")[2]
            operations = [op for op in path_view.operations if op.view_func.__name__ == url_name]
            if len(operations) != 1:
                raise LookupError(f"no single ninja operation named {url_name!r} at {prefix}{entry.pattern}")
            methods = frozenset(operations[0].methods)
        yield Route(name=name, pattern=prefix + str(entry.pattern), methods=methods, callback=entry.callback)


def all_routes() -> list[Route]:
    return list(_walk(get_resolver().url_patterns, "", ""))


def example_url(route: Route, workspace_slug: str = "any") -> str:
    """A URL that resolves to the route, with "1" for every other parameter: for checks that come before
    a view looks anything up (sign-in, CSRF)."""
    path = route.pattern.replace("(?P<url>.*)", "nothing-here/")  # the admin's final catch-all
    path = re.sub(r"\(\?P<\w+>([^|)]*)[^)]*\)", r"\1", path)  # a regex group: its first alternative
    path = path.replace("<slug:workspace_slug>", workspace_slug)
    path = re.sub(r"<(?:\w+:)?\w+>", "1", path).replace("^", "").replace("$", "")
    return "/" + path
