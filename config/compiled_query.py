"""Querysets compiled to SQL once per process, then run with new values: for the reads every gateway request
makes, where building and compiling the queryset again cost more than running it.

    targets = CompiledQuery(
        ModelTarget,
        lambda workspace_id, alias: ModelTarget.objects.filter(workspace_id=workspace_id, alias=alias)[:1],
        workspace_id=-7_000_001,
        alias="keel-sentinel:alias",
    )
    targets.first(workspace_id=1, alias="stub-chat")  # the instance the queryset returns, or None

The queryset is built once with a sentinel for each value (a value of the field's type that no real query
uses) and compiled by the ORM; each sentinel in the compiled parameters becomes the caller's value. What
the ORM writes into the SQL text itself, such as a slice's LIMIT, is fixed at compilation. Values
come back through the converters the ORM itself would apply, and instances through `Model.from_db`, so
what a query returns is what its queryset returns; the tests of each use compare the two.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from django.db import connection
from django.db.models import Model, QuerySet

M = TypeVar("M", bound=Model)


class CompiledQueryError(RuntimeError):
    """A sentinel did not survive compilation (the ORM transformed it), so the SQL cannot be reused."""


@dataclass(frozen=True, slots=True)
class _Compiled:
    sql: str
    # Per parameter of the SQL: the name of the caller's value, or None for a constant of the query.
    names: tuple[str | None, ...]
    constants: tuple[object, ...]
    # (position, [(converter, expression)]) for the columns whose database values the ORM converts.
    converters: tuple[tuple[int, tuple[tuple[Any, Any], ...]], ...]


class CompiledValues:
    """A `values_list()` queryset compiled once; `values()` returns its rows, each a list of values."""

    def __init__(self, build: Callable[..., QuerySet[Any]], **sentinels: object) -> None:
        self.build = build
        self.sentinels = sentinels
        self._compiled: _Compiled | None = None
        self._lock = threading.Lock()

    def _queryset(self) -> QuerySet[Any]:
        return self.build(**self.sentinels)

    def _compile(self) -> _Compiled:
        queryset = self._queryset()
        compiler = queryset.query.get_compiler(using=connection.alias)
        sql, params = compiler.as_sql()
        names: list[str | None] = []
        for value in params:
            name = next(
                (
                    key
                    for key, sentinel in self.sentinels.items()
                    if type(value) is type(sentinel) and value == sentinel
                ),
                None,
            )
            names.append(name)
        missing = set(self.sentinels) - set(names)
        if missing:
            raise CompiledQueryError(f"{queryset.model.__name__}: sentinels {sorted(missing)} not in the compiled SQL")
        converters = compiler.get_converters([column[0] for column in compiler.select])
        return _Compiled(
            sql=sql,
            names=tuple(names),
            constants=tuple(params),
            converters=tuple(
                (position, tuple((converter, expression) for converter in functions))
                for position, (functions, expression) in sorted(converters.items())
            ),
        )

    def compiled(self) -> _Compiled:
        if self._compiled is None:
            with self._lock:
                if self._compiled is None:
                    self._compiled = self._compile()
        return self._compiled

    def statement(self, **values: object) -> tuple[str, list[Any]]:
        """The SQL and its parameters for these values, for a caller that runs it itself."""
        compiled = self.compiled()
        if values.keys() != self.sentinels.keys():
            raise TypeError(f"expected values for {sorted(self.sentinels)}, got {sorted(values)}")
        params = [
            constant if name is None else values[name]
            for name, constant in zip(compiled.names, compiled.constants, strict=True)
        ]
        return compiled.sql, params

    def converted(self, row: Sequence[Any]) -> list[Any]:
        """A fetched row's values as the ORM converts them."""
        values = list(row)
        for position, converters in self.compiled().converters:
            for converter, expression in converters:
                values[position] = converter(values[position], expression, connection)
        return values

    def values(self, **values: object) -> list[list[Any]]:
        sql, params = self.statement(**values)
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            fetched = cursor.fetchall()
        return [self.converted(row) for row in fetched]


class CompiledQuery(CompiledValues, Generic[M]):
    """A queryset of `model` compiled once; `rows()` returns its instances."""

    def __init__(self, model: type[M], build: Callable[..., QuerySet[M]], **sentinels: object) -> None:
        super().__init__(build, **sentinels)
        self.model = model
        self.attnames = [field.attname for field in model._meta.concrete_fields]

    def _queryset(self) -> QuerySet[Any]:
        return self.build(**self.sentinels).values_list(*self.attnames)

    def rows(self, **values: object) -> list[M]:
        """The instances the queryset built with these values returns, in its order."""
        return [self.model.from_db(connection.alias, self.attnames, row) for row in self.values(**values)]

    def first(self, **values: object) -> M | None:
        """The first instance, for a queryset that is sliced to one row (`[:1]`)."""
        found = self.rows(**values)
        return found[0] if found else None
