"""Reads of the gateway's data plane, always scoped to a workspace (or an agent already scoped to one)."""

from __future__ import annotations

import functools
import struct
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final

import psycopg
from django.db import DEFAULT_DB_ALIAS, ProgrammingError, connection, connections
from django.db.backends.postgresql.operations import DatabaseOperations as PostgresOperations
from django.db.models import Case, Exists, F, IntegerField, OuterRef, Q, QuerySet, Subquery, Value, When
from django.db.models.functions import Concat
from pgvector.django import CosineDistance
from psycopg import generators as libpq
from psycopg.pq import ExecStatus

from agent_registry.models import Agent, ApiKey, Prompt, PromptVersion
from agent_registry.selectors import apikey_agent_ids, apikey_agent_ids_kept
from config.compiled_query import CompiledQuery
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
# The database sessions (psycopg connections) and the statements each has prepared (by name).
_prepared_sessions: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()

router_configs_cache: TtlCache[int, tuple[tuple[object, ...], RouterConfig | None]] = TtlCache(
    seconds=GATEWAY_CACHE_SECONDS, size=GATEWAY_CACHE_SIZE
)
prompt_versions_cache: TtlCache[int, PromptVersion] = TtlCache(seconds=GATEWAY_CACHE_SECONDS, size=GATEWAY_CACHE_SIZE)


@dataclass(frozen=True, slots=True)
class GatewayAgent:
    agent: Agent
    config: RouterConfig | None
    production_version: PromptVersion | None
    # The agent's `<slug>/system` prompt when no version of it is labelled production (the gateway refuses
    # to serve the agent rather than serve another prompt, or none, in its place).
    unlabelled_prompt: str | None = None


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


def _statement_body(query: QuerySet[Any], positions: dict[object, str]) -> str:
    """The query's SQL for a PREPARE: each placeholder value in `positions` becomes that parameter; every
    other value is a constant of the statement."""
    sql, params = query.query.get_compiler(using=connection.alias).as_sql()
    pieces = sql.split("%s")
    assert "%%" not in sql, sql
    assert len(pieces) == len(params) + 1, sql
    operations = connection.ops
    assert isinstance(operations, PostgresOperations)
    parts = [pieces[0]]
    for value, piece in zip(params, pieces[1:], strict=True):
        parts += [positions.get(value) or operations.compose_sql("%s", [value]), piece]
    body = "".join(parts)
    assert all(position in body for position in positions.values()), body
    return body


def _statement_prepared(name: str, prepare: str) -> None:
    """Run `prepare` (PREPARE <name> ...) in the session of Django's connection unless it has the statement.
    A prepared statement lives as long as its session, whatever happens to transactions: a rollback does
    not undo it."""
    connection.ensure_connection()
    session = connection.connection
    names = _prepared_sessions.get(session)
    if names is not None and name in names:
        return
    if names is None:
        names = _prepared_sessions[session] = set()
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_prepared_statements WHERE name = %s", [name])
        if cursor.fetchone() is None:
            cursor.execute(prepare)
    names.add(name)


@lru_cache(maxsize=1)
def _agent_statement() -> _AgentStatement:
    # As production_prompt_version chooses: the `<slug>/system` prompt's production version; only when the
    # agent has no such prompt, the production version of its first prompt by name.
    system_prompt = Prompt.objects.filter(agent=OuterRef("pk"), name=Concat(OuterRef("slug"), Value("/system")))
    # The same prompt, seen from inside the version's subquery (whose outer query is the agent's).
    system_prompt_inner = Prompt.objects.filter(
        agent=OuterRef(OuterRef("pk")), name=Concat(OuterRef(OuterRef("slug")), Value("/system"))
    )
    production = (
        PromptVersion.objects.filter(prompt__agent=OuterRef("pk"), labels__name="production")
        .filter(Q(prompt__name=Concat(OuterRef("slug"), Value("/system"))) | ~Exists(system_prompt_inner))
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
            gateway_system_prompt=Exists(system_prompt),
            **fingerprint,
        )
        .order_by("pk")
        .values_list(
            *agent_fields,
            "gateway_key_limited",
            "gateway_key_allows",
            "gateway_production_version",
            "gateway_system_prompt",
            *fingerprint,
        )[:1]
    )
    body = _statement_body(query, {_WORKSPACE_PLACEHOLDER: "$1", _KEY_PLACEHOLDER: "$2", _SLUG_PLACEHOLDER: "$3"})
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
    _statement_prepared(_STATEMENT, statement.prepare)
    with connection.cursor() as cursor:
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
        key_limited, key_allows, version_id, has_system_prompt = row[count : count + 4]
        if not key_limited or key_allows:
            agent = statement.agent(row)
            version = _prompt_version(agent, version_id if isinstance(version_id, int) else None)
            return GatewayAgent(
                agent=agent,
                config=_router_config(agent, row[count + 4 :]),
                production_version=version,
                unlabelled_prompt=f"{agent.slug}/system" if version is None and has_system_prompt else None,
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


def gateway_target_get(*, api_key: ApiKey, alias: str) -> ModelTarget:
    """The enabled target a key may proxy to by alias: none for a key limited to agents, which may call
    only those agents (as gateway_models lists)."""
    workspace_id = api_key.workspace_id
    kept = (
        _enabled_targets.get(
            (workspace_id, alias), functools.partial(_enabled_target.first, workspace_id=workspace_id, alias=alias)
        )
        if apikey_agent_ids_kept(api_key=api_key) is None
        else None
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
    """The prompt version the gateway applies: `labelled_prompt_version` of the production label."""
    return labelled_prompt_version(agent=agent, label="production")


def labelled_prompt_version(*, agent: Agent, label: str) -> PromptVersion | None:
    """The version labelled `label` of the prompt the gateway serves for the agent: its `<slug>/system`
    prompt's, and None when that prompt has no version with the label. Only an agent without such a prompt
    is served its first prompt by name that has a version with the label."""
    versions = PromptVersion.objects.select_related("prompt").filter(prompt__agent=agent, labels__name=label)
    system_name = f"{agent.slug}/system"
    preferred = versions.filter(prompt__name=system_name).first()
    if preferred is not None or Prompt.objects.filter(agent=agent, name=system_name).exists():
        return preferred
    return versions.order_by("prompt__name").first()


# --- The learned router's neighbours ------------------------------------------------------------------
#
# Every adaptive gateway request searches the agent's past decisions, usually as its only statement, on a
# backend that has sat idle for the length of the previous model call. The search is a statement
# prepared once per database session and executed through libpq directly: one round trip, no parsing or
# planning on the server, no cursor on the client. Measured on the benchmark machine after 30 ms idle,
# with 0.5 ms of Python before it (as the gateway has), at 47 ns per loop: p50 2.2 ms for the ORM-compiled
# statement sent in a pipeline with SET LOCAL, 1.7 ms for it prepared through a psycopg cursor, 1.4-1.5 ms
# this way (1.1-1.2 ms of it the libpq call itself).
# pgvector's iterative scan, which a filtered HNSW search needs to find `limit` rows, is on for every
# session of Keel's (routing/apps.py), so no SET goes with it.

_NEAREST_STATEMENT: Final = "keel_routing_neighbours_{limit}"
_NEAREST_AGENT_PLACEHOLDER: Final = -7_000_004
_NEAREST_VECTOR_PLACEHOLDER: Final = "keel-sentinel:vector"


def _nearest(agent_id: int, vector: object, limit: int) -> QuerySet[Any]:
    return (
        RoutingDecision.objects.filter(
            agent_id=agent_id, quality__isnull=False, cache_hit=False, embedding__isnull=False
        )
        .annotate(distance=CosineDistance("embedding", Value(vector)))
        .order_by("distance")
        .values_list("distance", "tier", "quality", "cost_usd", "latency_ms")[:limit]
    )


@lru_cache(maxsize=8)
def _nearest_prepare_sql(limit: int) -> str:
    """PREPARE of the search, `$1` the query vector and `$2` the agent's id (the limit is part of the SQL)."""
    queryset = _nearest(_NEAREST_AGENT_PLACEHOLDER, _NEAREST_VECTOR_PLACEHOLDER, limit)
    body = _statement_body(queryset, {_NEAREST_VECTOR_PLACEHOLDER: "$1", _NEAREST_AGENT_PLACEHOLDER: "$2"})
    return f"PREPARE {_NEAREST_STATEMENT.format(limit=limit)} (vector, bigint) AS {body}"


def _nearest_execute(session: Any, name: str, vector: bytes, agent_id: int) -> psycopg.pq.abc.PGresult:
    pgconn = session.pgconn
    with session.lock:
        pgconn.send_query_prepared(name.encode(), [vector, str(agent_id).encode()], param_formats=[1, 0])
        session.wait(libpq.send(pgconn))
        results = session.wait(libpq.fetch_many(pgconn))
    result: psycopg.pq.abc.PGresult = results[-1]
    if result.status != ExecStatus.TUPLES_OK:
        raise psycopg.errors.error_from_result(result, encoding=session.info.encoding)
    return result


def _nearest_rows(agent_id: int, embedding: Sequence[float], limit: int) -> list[tuple[bytes | None, ...]]:
    """The search's rows as the server sends them (text). Django's execute wrappers see it, as
    `EXECUTE <name> (%s::vector, %s)` with the vector (a tuple) and the agent's id, and so does its query
    log when it keeps one."""
    database = connections[DEFAULT_DB_ALIAS]  # this thread's, looked up once (`connection` is a proxy)
    database.ensure_connection()
    database.validate_thread_sharing()
    name = _NEAREST_STATEMENT.format(limit=limit)
    _statement_prepared(name, _nearest_prepare_sql(limit))
    session = database.connection
    # pgvector's binary form: two 16-bit words (the width, then zero), then big-endian 32-bit floats.
    vector = struct.pack(f">HH{len(embedding)}f", len(embedding), 0, *embedding)

    def execute(sql: str, params: Any, many: bool, context: dict[str, Any]) -> list[tuple[bytes | None, ...]]:
        with database.wrap_database_errors:
            result = _nearest_execute(session, name, vector, agent_id)
        value = result.get_value
        return [
            (value(row, 0), value(row, 1), value(row, 2), value(row, 3), value(row, 4)) for row in range(result.ntuples)
        ]

    executor: Callable[..., list[tuple[bytes | None, ...]]] = execute
    for wrapper in reversed(database.execute_wrappers):
        executor = functools.partial(wrapper, executor)
    sql = f"EXECUTE {name} (%s::vector, %s)"
    started = time.monotonic()
    rows = executor(sql, [tuple(embedding), agent_id], False, {"connection": database, "cursor": None})
    if database.queries_logged:
        database.queries_log.append(
            {
                "sql": f"EXECUTE {name} (<vector({len(embedding)})>, {agent_id})",
                "time": f"{time.monotonic() - started:.3f}",
            }
        )
    return rows


def _number(value: bytes | None) -> float | None:
    return None if value is None else float(value)


def _neighbour(row: tuple[bytes | None, ...]) -> router.Neighbour:
    distance, tier, quality, cost, latency = row
    # Never NULL: the search skips rows without an embedding, and a decision's tier is NOT NULL.
    assert distance is not None
    assert tier is not None
    return router.Neighbour(
        similarity=max(0.0, 1.0 - float(distance)),
        tier=tier.decode(),
        quality=_number(quality),
        cost_usd=_number(cost),
        latency_ms=_number(latency),
    )


def routing_neighbours(*, agent: Agent, embedding: list[float], limit: int) -> list[router.Neighbour]:
    """The agent's past requests nearest to this one whose outcome is known (cache hits aside).

    The search is often a request's only statement, and Django's health check would add a round trip
    before it (SELECT 1, once per request on a persistent connection; on the benchmark machine a round trip
    to a backend that has been idle for a model call's length costs several times one to a busy backend).
    The search goes without it: a connection that broke since its last use (the server restarted) fails
    the search instead, which, being a read, runs once more on a new connection; so does a session that
    lost its prepared statements, after preparing the search again. Inside the caller's transaction there
    is nothing to run again on: the error propagates."""
    try:
        rows = _nearest_rows(agent.pk, embedding, limit)
    except DATABASE_UNAVAILABLE:
        if connection.in_atomic_block:
            raise
        connection.close()
        rows = _nearest_rows(agent.pk, embedding, limit)
    except ProgrammingError as error:
        # The session lost its prepared statements (DEALLOCATE, DISCARD ALL) since the process noted them.
        if connection.in_atomic_block or not isinstance(error.__cause__, psycopg.errors.InvalidSqlStatementName):
            raise
        _prepared_sessions.pop(connection.connection, None)
        rows = _nearest_rows(agent.pk, embedding, limit)
    return [_neighbour(row) for row in rows]


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
