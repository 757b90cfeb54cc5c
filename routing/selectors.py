"""Reads of the gateway's data plane, always scoped to a workspace (or an agent already scoped to one)."""

from __future__ import annotations

import functools
import struct
import weakref
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final

import psycopg
from django.db import connection
from django.db.backends.postgresql.operations import DatabaseOperations as PostgresOperations
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper
from django.db.models import Case, Exists, F, IntegerField, OuterRef, QuerySet, Subquery, Value, When
from django.db.models.functions import Concat
from pgvector.django import CosineDistance
from psycopg.adapt import Dumper
from psycopg.pq import Format

from agent_registry.models import Agent, ApiKey, PromptVersion, Workspace
from agent_registry.selectors import apikey_agent_ids
from config.compiled_query import CompiledQuery, CompiledValues
from config.config_cache import NotifiedCache
from config.errors import NotFound
from config.process_cache import TtlCache, instance_copy
from config.unavailable import DATABASE_UNAVAILABLE
from routing import router
from routing.models import CacheEntry, ModelTarget, RouterConfig, RoutingDecision


class ModelNotFound(NotFound):
    code = "model_not_found"


# --- The gateway's agent ---------------------------------------------------------------------------
#
# Every gateway request needs the agent (if the key may call it), its router configuration with its
# model targets, and its production prompt version. One statement reads the agent, whether the key may
# call it, and a fingerprint of the rest: the configuration's time of change, each of its targets' time
# of change and health (failures and cooldown are written with UPDATE, which leaves updated_at alone),
# and the version the production label points at. The process keeps the configuration (with its
# targets) and the prompt version for a few seconds and uses them only while the fingerprint matches,
# so an edit made by any process shows on the next request; the time limit bounds memory and what the
# fingerprint cannot see. Prompt versions are never edited, so they are kept by id. Each request gets
# copies: the provider layer writes a target's health on its instance.
#
# The statement is compiled by Django once per process and prepared once per database session (a
# PREPARE outlives rollbacks; it goes with the connection): on the benchmark machine compiling it took
# about 1 ms and planning its joins another, running it 0.2 ms. A pooler in transaction mode
# (PgBouncer) would break this: a PREPARE stays on the server connection it ran on.

GATEWAY_CACHE_SECONDS: Final = 5.0
GATEWAY_CACHE_SIZE: Final = 1024
_ROUTER_TARGETS: Final = ("single_call_target", "agentic_target", "judge_target", "embedding_target")
_TARGET_STATE: Final = ("updated_at", "consecutive_failures", "cooldown_until")
_FINGERPRINT: Final = (
    "router_config__id",
    "router_config__updated_at",
    *(f"router_config__{target}__{column}" for target in _ROUTER_TARGETS for column in _TARGET_STATE),
)
# Stand-ins for the statement's parameters while Django compiles it (replaced before it is sent).
_WORKSPACE_PLACEHOLDER: Final = -7_700_001
_KEY_PLACEHOLDER: Final = -7_700_002
_SLUG_PLACEHOLDER: Final = "gateway-slug-placeholder"
_STATEMENT: Final = "keel_gateway_agent"
# The database sessions (psycopg connections) that have prepared the statement.
_prepared_sessions: weakref.WeakSet[Any] = weakref.WeakSet()

router_configs_cache: TtlCache[int, tuple[tuple[object, ...], RouterConfig | None]] = TtlCache(
    seconds=GATEWAY_CACHE_SECONDS, size=GATEWAY_CACHE_SIZE
)
prompt_versions_cache: TtlCache[int, PromptVersion] = TtlCache(seconds=GATEWAY_CACHE_SECONDS, size=GATEWAY_CACHE_SIZE)


@dataclass(frozen=True, slots=True)
class GatewayAgent:
    agent: Agent
    config: RouterConfig | None
    production_version: PromptVersion | None


@dataclass(frozen=True, slots=True)
class _AgentStatement:
    prepare: str  # PREPARE <name> (workspace id, key id, slug) AS <the query>
    agent_fields: tuple[str, ...]
    # (position, the field's converters) for the agent's fields that convert what the database sends.
    converters: tuple[tuple[int, tuple[Any, ...]], ...]

    def agent(self, row: tuple[object, ...]) -> Agent:
        values = list(row[: len(self.agent_fields)])
        for position, converters in self.converters:
            for converter in converters:
                values[position] = converter(values[position], None, connection)
        return Agent.from_db(connection.alias, list(self.agent_fields), values)


@lru_cache(maxsize=1)
def _agent_statement() -> _AgentStatement:
    # As production_prompt_version chooses: the `<slug>/system` prompt's production version, else the
    # production version of the agent's first prompt by name.
    production = (
        PromptVersion.objects.filter(prompt__agent=OuterRef("pk"), labels__name="production")
        .annotate(
            gateway_preferred=Case(
                When(prompt__name=Concat(OuterRef("slug"), Value("/system")), then=Value(0)),
                default=Value(1),
                output_field=IntegerField(),
            )
        )
        .order_by("gateway_preferred", "prompt__name", "pk")
        .values("pk")[:1]
    )
    # As apikey_agent_ids reads it: a key with agents may call only those.
    key_agents = ApiKey.agents.through.objects.filter(apikey_id=_KEY_PLACEHOLDER)
    agent_fields = tuple(field.attname for field in Agent._meta.concrete_fields)
    converters = tuple(
        (position, tuple(field.get_db_converters(connection)))
        for position, field in enumerate(Agent._meta.concrete_fields)
        if field.get_db_converters(connection)
    )
    fingerprint = {f"gateway_fingerprint_{number}": F(path) for number, path in enumerate(_FINGERPRINT)}
    query = (
        Agent.objects.filter(workspace_id=_WORKSPACE_PLACEHOLDER, slug=_SLUG_PLACEHOLDER)
        .annotate(
            gateway_key_limited=Exists(key_agents),
            gateway_key_allows=Exists(key_agents.filter(agent_id=OuterRef("pk"))),
            gateway_production_version=Subquery(production),
            **fingerprint,
        )
        .order_by("pk")
        .values_list(
            *agent_fields, "gateway_key_limited", "gateway_key_allows", "gateway_production_version", *fingerprint
        )[:1]
    )
    sql, params = query.query.get_compiler(using=connection.alias).as_sql()
    pieces = sql.split("%s")
    assert "%%" not in sql, sql
    assert len(pieces) == len(params) + 1, sql
    # The placeholders become the statement's parameters; every other value is a constant of the query.
    positions = {_WORKSPACE_PLACEHOLDER: "$1", _KEY_PLACEHOLDER: "$2", _SLUG_PLACEHOLDER: "$3"}
    parts = [pieces[0]]
    operations = connection.ops
    assert isinstance(operations, PostgresOperations)
    for value, piece in zip(params, pieces[1:], strict=True):
        parts += [positions.get(value) or operations.compose_sql("%s", [value]), piece]
    body = "".join(parts)
    assert all(position in body for position in positions.values()), body
    return _AgentStatement(
        prepare=f"PREPARE {_STATEMENT} (bigint, bigint, text) AS {body}",
        agent_fields=agent_fields,
        converters=converters,
    )


# The agent rows as the statement returns them, kept until an agent, a key, a prompt or a router config
# changes (config/config_cache.py); each request makes its own instances from them.
_agent_rows: NotifiedCache[tuple[int, int, str], tuple[object, ...] | None] = NotifiedCache(size=GATEWAY_CACHE_SIZE)


def _agent_row(*, api_key: ApiKey, slug: str) -> tuple[object, ...] | None:
    return _agent_rows.get(
        (api_key.workspace_id, api_key.pk, slug), functools.partial(_agent_row_read, api_key=api_key, slug=slug)
    )


def _agent_row_read(*, api_key: ApiKey, slug: str) -> tuple[object, ...] | None:
    statement = _agent_statement()
    with connection.cursor() as cursor:
        # A prepared statement lives as long as its session, whatever happens to transactions.
        session = connection.connection
        if session not in _prepared_sessions:
            cursor.execute("SELECT 1 FROM pg_prepared_statements WHERE name = %s", [_STATEMENT])
            if cursor.fetchone() is None:
                cursor.execute(statement.prepare)
            _prepared_sessions.add(session)
        cursor.execute(f"EXECUTE {_STATEMENT} (%s, %s, %s)", [api_key.workspace_id, api_key.pk, slug])
        row = cursor.fetchone()
    return None if row is None else tuple(row)


def _router_config(agent: Agent, fingerprint: tuple[object, ...]) -> RouterConfig | None:
    kept = router_configs_cache.get(agent.pk)
    if kept is None or kept[0] != fingerprint:
        # Read after the fingerprint: a change in between shows as a mismatch next time, never as staleness.
        kept = (fingerprint, router_config_find(agent=agent) if fingerprint[0] is not None else None)
        router_configs_cache.put(agent.pk, kept)
    return instance_copy(kept[1])


def _prompt_version(agent: Agent, version_id: int | None) -> PromptVersion | None:
    if version_id is None:
        return None
    version = prompt_versions_cache.get(version_id)
    if version is None:
        version = PromptVersion.objects.select_related("prompt").filter(pk=version_id).first()
        if version is None:  # the label moved on and this version went since the agent was read
            return production_prompt_version(agent=agent)
        prompt_versions_cache.put(version_id, version)
    return instance_copy(version)


def gateway_agent_context(*, api_key: ApiKey, slug: str) -> GatewayAgent:
    """The agent a key may call through the gateway (its workspace, within the key's agents), with its
    router configuration and production prompt version as router_config_find and production_prompt_version
    read them: one statement when the process has the last two already."""
    row = _agent_row(api_key=api_key, slug=slug)
    statement = _agent_statement()
    count = len(statement.agent_fields)
    if row is not None:
        key_limited, key_allows, version_id = row[count : count + 3]
        if not key_limited or key_allows:
            agent = statement.agent(row)
            return GatewayAgent(
                agent=agent,
                config=_router_config(agent, row[count + 3 :]),
                production_version=_prompt_version(agent, version_id if isinstance(version_id, int) else None),
            )
    raise ModelNotFound(f"there is no agent {slug!r} this key may call (model 'agent/{slug}')")


# Every request that names a target alias reads it (compiled once: config/compiled_query.py).
_enabled_target = CompiledQuery(
    ModelTarget,
    lambda workspace_id, alias: ModelTarget.objects.filter(
        workspace_id=workspace_id, alias=alias, enabled=True
    ).order_by("pk")[:1],
    workspace_id=-7_000_001,
    alias="keel-sentinel:alias",
)


_enabled_targets: NotifiedCache[tuple[int, str], ModelTarget | None] = NotifiedCache(size=GATEWAY_CACHE_SIZE)


def gateway_target_get(*, workspace: Workspace, alias: str) -> ModelTarget:
    kept = _enabled_targets.get(
        (workspace.pk, alias), functools.partial(_enabled_target.first, workspace_id=workspace.pk, alias=alias)
    )
    # A copy for each request: the provider layer writes the target's health on its instance.
    target = instance_copy(kept)
    if target is None:
        raise ModelNotFound(f"there is no model target {alias!r}; call an agent as 'agent/<slug>' or a target alias")
    return target


def gateway_models(*, api_key: ApiKey) -> tuple[list[Agent], list[ModelTarget]]:
    """What `/v1/models` lists for a key: its agents, and the workspace's enabled targets (a key limited
    to agents may call only those agents)."""
    allowed = apikey_agent_ids(api_key=api_key)
    agents = Agent.objects.filter(workspace_id=api_key.workspace_id).order_by("slug")
    if allowed is not None:
        return list(agents.filter(pk__in=allowed)), []
    return list(agents), list(
        ModelTarget.objects.filter(workspace_id=api_key.workspace_id, enabled=True).order_by("alias")
    )


def router_config_find(*, agent: Agent) -> RouterConfig | None:
    return (
        RouterConfig.objects.select_related("single_call_target", "agentic_target", "judge_target", "embedding_target")
        .filter(agent=agent)
        .first()
    )


def production_prompt_version(*, agent: Agent) -> PromptVersion | None:
    """The prompt version the gateway applies: the production version of the agent's `<slug>/system`
    prompt, else of its first prompt (by name) that has a production label."""
    versions = PromptVersion.objects.select_related("prompt").filter(prompt__agent=agent, labels__name="production")
    preferred = versions.filter(prompt__name=f"{agent.slug}/system").first()
    return preferred or versions.order_by("prompt__name").first()


def _nearest(agent_id: int, vector: object, limit: int) -> QuerySet[Any]:
    return (
        RoutingDecision.objects.filter(
            agent_id=agent_id, quality__isnull=False, cache_hit=False, embedding__isnull=False
        )
        .annotate(distance=CosineDistance("embedding", Value(vector)))
        .order_by("distance")
        .values_list("distance", "tier", "quality", "cost_usd", "latency_ms")[:limit]
    )


# Compiled once per limit (it is part of the SQL): every adaptive gateway request runs it.
_nearest_compiled: dict[int, CompiledValues] = {}


class _QueryVector(tuple[float, ...]):
    """A vector sent as a statement's parameter in pgvector's binary form: two 16-bit words (the width,
    then zero) and the values as big-endian 32-bit floats. Nothing formats 256 floats as text on the way
    out, nor parses them on the server."""

    __slots__ = ()


class _QueryVectorDumper(Dumper):
    format = Format.BINARY  # no oid: the server takes the type from the operator (vector <=> vector)

    def dump(self, obj: _QueryVector) -> bytes:
        return struct.pack(f">HH{len(obj)}f", len(obj), 0, *obj)


def _server_bound_cursor() -> CursorWrapper:
    """A cursor of Django's connection that sends parameters apart from the statement (psycopg's
    server-side binding; Django's own cursors write them into the SQL), so a vector can travel in
    binary. Django wraps it as its own: execute wrappers, query logging and error mapping apply. Django's
    health check is not run (see routing_neighbours)."""
    connection.ensure_connection()
    with connection.wrap_database_errors:
        cursor = psycopg.Cursor(connection.connection)
    cursor.adapters.register_dumper(_QueryVector, _QueryVectorDumper)
    connection.validate_thread_sharing()
    wrapper = CursorDebugWrapper if connection.queries_logged else CursorWrapper
    return wrapper(cursor, connection)


def _nearest_rows(query: CompiledValues, sql: str, params: list[Any]) -> list[list[Any]]:
    with _server_bound_cursor() as cursor:
        # An HNSW scan with a filter can end early; let pgvector keep scanning until enough rows pass. The
        # two statements go out in one pipeline, which the server runs as one transaction (there is one
        # sync, at its end), so SET LOCAL lasts for the search alone: one round trip instead of BEGIN,
        # SET, SELECT and COMMIT. Inside the caller's transaction it lasts until that ends.
        with connection.wrap_database_errors, connection.connection.pipeline():
            cursor.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
            cursor.execute(sql, params)
        return [query.converted(row) for row in cursor.fetchall()]


def routing_neighbours(*, agent: Agent, embedding: list[float], limit: int) -> list[router.Neighbour]:
    """The agent's past requests nearest to this one whose outcome is known (cache hits aside).

    The search is often a request's only statement, and Django's health check would add a round trip
    before it (SELECT 1, once per request on a persistent connection; on the benchmark machine a round trip
    to a backend that has been idle for a model call's length costs several times one to a busy backend).
    The search goes without it: a connection that broke since its last use (the server restarted) fails
    the search instead, which, being a read, runs once more on a new connection. Inside the caller's
    transaction there is nothing to run again on: the error propagates."""
    query = _nearest_compiled.get(limit)
    if query is None:
        query = CompiledValues(
            lambda agent_id, vector: _nearest(agent_id, vector, limit),
            agent_id=-7_000_004,
            vector="keel-sentinel:vector",
        )
        _nearest_compiled[limit] = query
    sql, params = query.statement(agent_id=agent.pk, vector=_QueryVector(embedding))
    try:
        rows = _nearest_rows(query, sql, params)
    except DATABASE_UNAVAILABLE:
        if connection.in_atomic_block:
            raise
        connection.close()
        rows = _nearest_rows(query, sql, params)
    return [
        router.Neighbour(
            similarity=max(0.0, 1.0 - float(distance)),
            tier=tier,
            quality=quality,
            cost_usd=None if cost is None else float(cost),
            latency_ms=None if latency is None else float(latency),
        )
        for distance, tier, quality, cost, latency in rows
    ]


def conversation_tier(*, agent: Agent, conversation_id: str) -> str | None:
    if not conversation_id:
        return None
    return (
        RoutingDecision.objects.filter(agent=agent, conversation_id=conversation_id)
        .order_by("-created_at")
        .values_list("tier", flat=True)
        .first()
    )


def cache_entry_count(*, agent: Agent) -> int:
    return CacheEntry.objects.filter(agent=agent).count()
