"""config/compiled_query.py: a queryset compiled once returns what the queryset returns, for any values."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db.models import F, Model
from django.db.models.functions import Lower

from agent_registry import services
from agent_registry.models import ApiKey
from config.compiled_query import CompiledQuery, CompiledQueryError, CompiledValues
from guardrails.models import Budget
from guardrails.tests.factories import BudgetFactory

pytestmark = pytest.mark.django_db


def _fields(instance: Model) -> dict[str, object]:
    return {field.attname: getattr(instance, field.attname) for field in type(instance)._meta.concrete_fields}


def _typed(instance: Model) -> dict[str, tuple[object, type]]:
    return {name: (value, type(value)) for name, value in _fields(instance).items()}


BY_LIMIT = CompiledQuery(
    Budget,
    lambda workspace_id, floor: Budget.objects.filter(workspace_id=workspace_id, limit_usd__gte=floor).order_by("pk"),
    workspace_id=-7_100_001,
    floor=Decimal("-7100.01"),
)


def test_rows_are_the_querysets_instances_with_their_types(workspace, other_workspace, django_assert_num_queries):
    for value in ("0.50", "2.00", "9.99"):
        BudgetFactory.create(workspace=workspace, period="day", scope="end_user", scope_value=value, limit_usd=value)
    BudgetFactory.create(workspace=other_workspace, limit_usd=Decimal("5"))

    for floor in (Decimal("0"), Decimal("1.5"), Decimal("100")):
        expected = list(Budget.objects.filter(workspace_id=workspace.pk, limit_usd__gte=floor).order_by("pk"))
        with django_assert_num_queries(1):
            found = BY_LIMIT.rows(workspace_id=workspace.pk, floor=floor)
        assert [_typed(budget) for budget in found] == [_typed(budget) for budget in expected]
        assert all(budget._state.adding is False and budget._state.db == "default" for budget in found)


def test_converted_columns_come_back_as_the_orm_converts_them(workspace):
    """A JSON list and aware datetimes go through the ORM's own converters."""
    key, _ = services.apikey_create(workspace=workspace, name="k", scopes=["ingest", "read"])
    by_prefix = CompiledQuery(ApiKey, lambda prefix: ApiKey.objects.filter(prefix=prefix)[:1], prefix="keel-sentinel")

    found = by_prefix.first(prefix=key.prefix)

    assert found is not None
    assert _typed(found) == _typed(ApiKey.objects.get(pk=key.pk))
    assert found.scopes == ["ingest", "read"]
    assert by_prefix.first(prefix="nothing") is None


def test_a_sentinel_the_orm_transforms_is_refused():
    """Were a value changed on its way into the SQL, the caller's value could not take its place."""
    lowered = CompiledQuery(
        Budget,
        lambda value: Budget.objects.annotate(low=Lower("scope_value")).filter(low=value.lower()),
        value="Keel-Sentinel",
    )

    with pytest.raises(CompiledQueryError, match="value"):
        lowered.rows(value="x")


def test_values_must_name_every_sentinel():
    with pytest.raises(TypeError):
        BY_LIMIT.rows(workspace_id=1)


def test_values_are_the_querysets_rows_annotations_included(workspace):
    for value in ("0.50", "2.00", "9.99"):
        BudgetFactory.create(workspace=workspace, period="day", scope="end_user", scope_value=value, limit_usd=value)

    def build(workspace_id, scope, limit):
        return (
            Budget.objects.filter(workspace_id=workspace_id, scope=scope)
            .annotate(doubled=F("limit_usd") * 2)
            .order_by("-limit_usd")
            .values_list("doubled", "scope_value", "created_at")[:limit]
        )

    query = CompiledValues(
        lambda workspace_id, scope: build(workspace_id, scope, 2), workspace_id=-7_100_002, scope="s"
    )

    found = query.values(workspace_id=workspace.pk, scope="end_user")

    expected = [list(row) for row in build(workspace.pk, "end_user", 2)]
    assert found == expected
    assert [[type(value) for value in row] for row in found] == [[type(value) for value in row] for row in expected]
    assert query.values(workspace_id=workspace.pk, scope="workspace") == []
