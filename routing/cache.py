"""The semantic cache: services and selectors of `CacheEntry` and `CacheHit`, and request embeddings.

An entry answers again only within its exact scope: the workspace (through the agent), the agent, the
model target, the prompt version (NULL when the agent has none) and the SHA-256 of the system prompt
as sent. Only the user's request is embedded, so a long shared system prompt cannot make unrelated
requests look alike. Agentic requests, requests with tools or tool results, and (unless the agent
allows it) requests carrying an end-user id are never cached: their answers depend on more than the
request text.

Hits keep the request they answered beside the entry, so a person can flag false hits; the threshold
report weighs hit rate against the flagged false-hit rate. An entry that served hits outlives its
expiry (never served again) for `HIT_RETENTION`, so those reviews keep their original.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, TypedDict

import httpx
from django.db import connection, transaction
from django.db.models import Count, Exists, F, OuterRef, Q, QuerySet
from django.utils import timezone
from openai import OpenAIError

from agent_registry.models import Agent, PromptLabel, PromptVersion, User, Workspace
from config import crypto
from config.errors import KeelError
from config.process_cache import TtlCache
from config.redact import redact
from routing import embedding as embedder
from routing import openai_compatible, providers
from routing.models import (
    EMBEDDING_DIMENSIONS,
    CacheEntry,
    CacheHit,
    ModelTarget,
    RouterConfig,
    RoutingDecision,
    TierChoice,
)

logger = logging.getLogger("routing.cache")

# How long an expired or invalidated entry that served hits is kept for the review page and the
# threshold report. Entries without hits go as soon as they expire.
HIT_RETENTION = timedelta(days=30)
SWEEP_BATCH = 1000
DEFAULT_REPORT_THRESHOLDS = (0.80, 0.85, 0.90, 0.93, 0.95, 0.97, 0.99)

# A scope with at most this many live entries is searched exactly: every vector of the scope compared,
# found through the scope index (about 2.5 ms for 5,000 entries). A larger scope is searched through the
# HNSW index, which is cheap when the scope is a sizeable share of the table (about 2-4 ms at 100,000
# entries, scopes of 5% and up) but unreliable for a small one: the graph holds every scope, so a walk
# filtered to a few rows can end before it meets them.
EXACT_SCAN_LIMIT = 5000
# The HNSW search of a large scope: candidates kept per step (in the benchmark pgvector's default of 40
# missed 3 of 100 near-duplicates, 64 none, and 100 cost 0.8 ms more), and how many rows the iterative
# scan (pgvector 0.8) may visit before it gives up. Several nearest rows are fetched and re-ranked
# here, because relaxed ordering may hand them over slightly out of order.
HNSW_EF_SEARCH = 64
HNSW_MAX_SCAN_TUPLES = 20_000
HNSW_CANDIDATES = 5
# How long a process keeps a scope's count (which plan it takes) before counting again, and how many
# scopes it keeps. Counting a large scope costs as much as searching it (2.5-3.5 ms at 100,000 entries):
# the scope index has neither the expiry nor the workspace, so each counted row is read from the table.
SCOPE_SIZE_SECONDS = 60.0
SCOPE_SIZES_KEPT = 10_000

# litellm raises openai's exception classes for every provider; a transport error may escape as httpx's.
# A malformed answer (no data, no vector) shows up as one of the built-in lookup and value errors.
_PROVIDER_ERRORS = (OpenAIError, httpx.HTTPError, crypto.DecryptionFailed, LookupError, TypeError, ValueError)


class CacheScopeMismatch(KeelError):
    """The model target or prompt version of a cache entry belongs to another workspace or agent."""

    code = "cache_scope_mismatch"


# --- Embeddings -----------------------------------------------------------------------------------------


EmbeddingSource = Literal["offline", "provider", "offline_fallback"]


@dataclass(frozen=True, slots=True)
class Embedding:
    """A request's 256-wide unit vector and where it came from: the offline embedder (no target), the
    target's provider, or the offline embedder because the provider failed. Vectors of different
    sources are not comparable; a fallback vector simply finds no provider-made entry."""

    vector: list[float]
    source: EmbeddingSource


def request_embed(*, text: str, target: ModelTarget | None) -> Embedding:
    """Embed the user's request with the target's model (projected to 256 wide), or
    offline when there is no target or the provider fails (logged as `routing.embedding_fallback`)."""
    if target is None:
        return Embedding(vector=embedder.embed_offline(text), source="offline")
    try:
        vector = _provider_embed(text=text, target=target)
    except _PROVIDER_ERRORS as error:
        logger.warning(
            "routing.embedding_fallback",
            extra={
                "target_id": target.pk,
                "model": target.model,
                "error": redact(f"{type(error).__name__}: {error}", _target_key(target)),
            },
        )
        return Embedding(vector=embedder.embed_offline(text), source="offline_fallback")
    return Embedding(vector=vector, source="provider")


def _target_key(target: ModelTarget) -> str:
    try:
        return crypto.decrypt(target.api_key_encrypted) if target.api_key_encrypted else ""
    except crypto.DecryptionFailed:
        return ""


def _provider_embed(*, text: str, target: ModelTarget) -> list[float]:
    arguments = providers.call_arguments(target)
    if openai_compatible.serves(target.model, target.api_base):
        (vector,) = openai_compatible.embed(arguments, [text])
        return embedder.project(vector, EMBEDDING_DIMENSIONS)
    import litellm  # takes seconds to import; only processes that embed through a provider pay for it

    response = litellm.embedding(**arguments, input=[text])
    item = response.data[0]
    values = item["embedding"] if isinstance(item, Mapping) else item.embedding
    if not isinstance(values, Sequence) or isinstance(values, str) or not values:
        raise ValueError(f"the provider answered no embedding vector ({type(values).__name__})")
    return embedder.project([float(value) for value in values], EMBEDDING_DIMENSIONS)


# --- Eligibility and scope --------------------------------------------------------------------------------


def cache_eligibility(
    *, config: RouterConfig | None, tier: str, has_tools: bool, end_user: str | None
) -> tuple[bool, str]:
    """Whether this request may be answered from (and stored in) the cache, and if not, why: one of
    `no_config`, `cache_disabled`, `agentic_tier`, `human_tier`, `tool_request`, `end_user`; the
    reason is "" when it may."""
    if config is None:
        return False, "no_config"
    if not config.cache_enabled:
        return False, "cache_disabled"
    if tier == TierChoice.AGENTIC:
        return False, "agentic_tier"
    if tier == TierChoice.HUMAN:
        return False, "human_tier"
    if has_tools:
        return False, "tool_request"
    if end_user and not config.cache_end_user_requests:
        return False, "end_user"
    return True, ""


def request_uses_tools(*, messages: Iterable[Mapping[str, Any]], tools: Sequence[Any] | None = None) -> bool:
    """Whether a chat request offers tools or carries tool calls or tool results (OpenAI's shapes,
    legacy `functions` included): the `has_tools` of `cache_eligibility`."""
    if tools:
        return True
    for message in messages:
        if message.get("role") in ("tool", "function") or message.get("tool_calls") or message.get("function_call"):
            return True
    return False


def request_hash(request_text: str) -> str:
    """The SHA-256 (hex) of a request's text, which finds exact repeats through an index."""
    return hashlib.sha256(request_text.encode()).hexdigest()


def system_hash(system_prompt: str) -> str:
    """The SHA-256 (hex) of the system prompt exactly as sent, the last part of an entry's scope."""
    return hashlib.sha256(system_prompt.encode()).hexdigest()


def _scope_check(*, agent: Agent, model_target: ModelTarget, prompt_version: PromptVersion | None) -> None:
    if model_target.workspace_id != agent.workspace_id:
        raise CacheScopeMismatch(f"model target {model_target.alias!r} belongs to another workspace")
    if prompt_version is not None and prompt_version.prompt.agent_id != agent.pk:
        raise CacheScopeMismatch(f"prompt version {prompt_version.pk} belongs to another agent")


def _vector_check(vector: Sequence[float]) -> None:
    if len(vector) != EMBEDDING_DIMENSIONS:
        raise ValueError(f"a cache embedding is {EMBEDDING_DIMENSIONS} wide, not {len(vector)}")


# --- Look-up -------------------------------------------------------------------------------------------


def cache_lookup(
    *,
    agent: Agent,
    model_target: ModelTarget,
    prompt_version: PromptVersion | None,
    system_prompt_hash: str,
    embedding: list[float],
    threshold: float,
    now: datetime | None = None,
    request_text: str | None = None,
) -> tuple[CacheEntry, float] | None:
    """The unexpired entry of exactly this scope nearest to `embedding`, with its cosine similarity
    (1 - cosine distance), when that similarity is at least `threshold`; else None. The entry comes
    without its embedding (deferred).

    With `request_text`, an entry stored for the very same text is found first, by its hash: an
    approximate index can miss a vector that many identical entries share, and exact repeats are the
    commonest hits.

    Two plans, chosen by the size of the scope, counted up to `EXACT_SCAN_LIMIT` + 1 rows (and that count
    kept a minute, see `_scope_sizes`): a small scope is searched exactly, a large one through the HNSW
    index. The threshold is applied here rather than in SQL, so that on a miss (the usual case) the index
    walk stops at the scope's first rows instead of hunting for a match that is not there.
    """
    _vector_check(embedding)
    now = now or timezone.now()
    version_id = prompt_version.pk if prompt_version is not None else None
    key = (agent.workspace_id, agent.pk, model_target.pk, version_id, system_prompt_hash)
    version = [] if version_id is None else [version_id]
    scope_params: list[Any] = [agent.workspace_id, agent.pk, model_target.pk, *version, system_prompt_hash, now]
    size = _scope_size(key, _scope_where(prompt_version=version_id is not None), scope_params)
    if size == 0:
        return None
    approximate = size > EXACT_SCAN_LIMIT
    statement = _lookup_statement(
        approximate=approximate, repeat=request_text is not None, prompt_version=version_id is not None
    )
    params: list[Any] = []
    if request_text is not None:
        params += [*scope_params, request_hash(request_text), request_text]
    params += [_vector_literal(embedding), *scope_params]
    entries = _lookup_rows(statement, params, approximate=approximate)
    # Relaxed ordering may hand the HNSW candidates over slightly out of order: re-ranked here.
    entry = min(entries, key=lambda entry: (entry.distance, entry.pk), default=None)  # type: ignore[attr-defined]
    if entry is None:
        return None
    similarity = 1.0 - float(entry.distance)  # type: ignore[attr-defined]
    return (entry, similarity) if similarity >= threshold else None


# Each scope's live entries, counted up to `EXACT_SCAN_LIMIT` + 1, as this process last counted them. A
# stale count only picks the plan: a scope that has grown past the limit since is still searched exactly
# (slower, never wrong); one that has shrunk below it is searched through the index, which may miss one of
# the few entries left (a miss, answered by the model). An empty scope is not kept but counted again each
# time, so the entry stored after its first miss is found at once.
_scope_sizes: TtlCache[tuple[object, ...], int] = TtlCache(seconds=SCOPE_SIZE_SECONDS, size=SCOPE_SIZES_KEPT)


def _scope_size(key: tuple[object, ...], where: str, params: Sequence[Any]) -> int:
    size = _scope_sizes.get(key)
    if size is None:
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT COUNT(*) FROM (SELECT 1 FROM routing_cacheentry WHERE {where} LIMIT %s) AS scope",
                [*params, EXACT_SCAN_LIMIT + 1],
            )
            (size,) = cursor.fetchone()
        if size:
            _scope_sizes.put(key, size)
    return size


def cache_scope_sizes_forget() -> None:
    """Drop this process's scope counts (tests that change `EXACT_SCAN_LIMIT` or a scope's size start clean)."""
    _scope_sizes.clear()


# The look-up is one SQL statement, written here rather than compiled from a queryset: compiling the
# filters, the deferred field and a distance over a 256-float list cost more than the search itself (a
# scope of 50, bench machine at 60-68 ns per loop: 3.78 ms a look-up through the queryset, 0.85 ms its
# statement alone, 0.90 ms a look-up now). Every column but the embedding is read: the caller has the
# request's own vector.
_SCOPE_WHERE = (
    "workspace_id = %s AND agent_id = %s AND model_target_id = %s AND prompt_version_id {version}"
    " AND system_hash = %s AND expires_at > %s"
)


def _scope_where(*, prompt_version: bool) -> str:
    """The scope's live entries. Its parameters: the workspace, agent, model target, prompt version (only
    when `prompt_version`: without one the scope is the agent's entries with none), system hash and now."""
    return _SCOPE_WHERE.format(version="= %s" if prompt_version else "IS NULL")


# A small scope is searched exactly: the distance plus zero is not the indexed expression, so the planner
# compares every vector of the scope (found through the scope index) instead of walking the HNSW index. A
# large one walks the index and takes several nearest rows (see `HNSW_CANDIDATES`). Either search carries
# only ids and distances; the rows are read after, by id: sorting whole rows cost a scope of 5,000 about
# 2 ms more (10.2 against 12.2 ms, bench machine at 68 ns per loop).
_EXACT_SEARCH = (
    "(embedding <=> %s::vector) + 0.0 AS distance FROM routing_cacheentry WHERE {where} ORDER BY distance, id LIMIT 1"
)
_APPROXIMATE_SEARCH = (
    f"embedding <=> %s::vector AS distance FROM routing_cacheentry WHERE {{where}} ORDER BY distance"
    f" LIMIT {HNSW_CANDIDATES}"
)
# The exact repeat of the request (see `cache_lookup`) comes first; when there is one the search is not run
# (`NOT EXISTS` over the repeat is a one-time filter, not evaluated per row).
_REPEAT = (
    "WITH repeat AS MATERIALIZED (SELECT id, 0.0::float8 AS distance FROM routing_cacheentry WHERE {where}"
    " AND request_hash = %s AND request_text = %s ORDER BY created_at DESC LIMIT 1),"
    " nearest AS (SELECT * FROM repeat UNION ALL (SELECT id, {search}))"
)
# The HNSW search of a large scope, in the same transaction as the settings it needs (`set_config(...,
# true)` lasts until the transaction ends; a query string of two statements is one transaction). A filtered
# HNSW scan hands over `ef_search` rows and the scope filter may leave none of them; the iterative scan
# keeps walking until enough rows pass. With sorting off the planner cannot prefer the scope index and a
# sort of the whole scope (tens of milliseconds for a large one).
_HNSW_SETTINGS_SQL = (
    "SELECT set_config('hnsw.iterative_scan', 'relaxed_order', true), set_config('hnsw.ef_search', %s, true),"
    " set_config('hnsw.max_scan_tuples', %s, true), set_config('enable_sort', 'off', true)"
)


def _entry_fields() -> list[Any]:
    return [field for field in CacheEntry._meta.concrete_fields if field.attname != "embedding"]


def _lookup_statement(*, approximate: bool, repeat: bool, prompt_version: bool) -> str:
    """The look-up's SQL. Its parameters, in order: with `repeat` the scope's (see `_scope_where`), the
    request's hash and its text; then the vector and the scope's."""
    where = _scope_where(prompt_version=prompt_version)
    search = (_APPROXIMATE_SEARCH if approximate else _EXACT_SEARCH).format(
        where=where + (" AND NOT EXISTS (SELECT FROM repeat)" if repeat else "")
    )
    nearest = _REPEAT.format(where=where, search=search) if repeat else f"WITH nearest AS (SELECT id, {search})"
    columns = ", ".join(f"entry.{field.column}" for field in _entry_fields())
    return f"{nearest} SELECT {columns}, nearest.distance FROM nearest JOIN routing_cacheentry entry USING (id)"


def _vector_literal(embedding: Sequence[float]) -> str:
    return "[" + ",".join(map(repr, map(float, embedding))) + "]"


def _lookup_rows(statement: str, params: list[Any], *, approximate: bool) -> list[CacheEntry]:
    """The entries the statement returns, each with its `distance`; the embedding is deferred."""
    fields = _entry_fields()
    names = [field.attname for field in fields]
    converters = [(index, field.get_db_converters(connection)) for index, field in enumerate(fields)]
    converters = [(index, functions) for index, functions in converters if functions]

    def rows() -> list[tuple[Any, ...]]:
        with connection.cursor() as cursor:
            if not approximate:
                cursor.execute(statement, params)
            else:
                # Two statements in one query string (Django's client-side binding cursor sends it as a
                # simple query): the search's result is the second.
                cursor.execute(
                    f"{_HNSW_SETTINGS_SQL}; {statement}", [str(HNSW_EF_SEARCH), str(HNSW_MAX_SCAN_TUPLES), *params]
                )
                cursor.nextset()
            return list(cursor.fetchall())

    if approximate and connection.in_atomic_block:
        # Inside the caller's transaction the settings would outlive the search; rolling a savepoint back
        # undoes them (the search wrote nothing).
        savepoint = transaction.savepoint()
        try:
            found = rows()
        finally:
            transaction.savepoint_rollback(savepoint)
    else:
        found = rows()
    entries = []
    for row in found:
        values = list(row[:-1])
        for index, functions in converters:
            for convert in functions:
                values[index] = convert(values[index], None, connection)
        entry = CacheEntry.from_db(connection.alias, names, values)
        entry.distance = row[-1]  # type: ignore[attr-defined]
        entries.append(entry)
    return entries


# --- Writes -------------------------------------------------------------------------------------------------


def cache_store(
    *,
    agent: Agent,
    model_target: ModelTarget,
    prompt_version: PromptVersion | None,
    system_prompt_hash: str,
    request_text: str,
    embedding: list[float],
    response: dict[str, Any],
    trace_id: str,
    ttl_seconds: int,
    now: datetime | None = None,
) -> CacheEntry:
    """Store an answer for this scope until `now + ttl_seconds`.

    Preconditions: the request passed `cache_eligibility`, the answer is a final one (no tool calls),
    and `embedding` came from the same embedder later look-ups of this agent use."""
    _vector_check(embedding)
    if ttl_seconds <= 0:
        raise ValueError(f"a cache entry needs a positive time to live, not {ttl_seconds}")
    _scope_check(agent=agent, model_target=model_target, prompt_version=prompt_version)
    now = now or timezone.now()
    entry = CacheEntry(
        workspace_id=agent.workspace_id,
        agent=agent,
        model_target=model_target,
        prompt_version=prompt_version,
        system_hash=system_prompt_hash,
        request_text=request_text,
        request_hash=request_hash(request_text),
        embedding=embedding,
        response=response,
        trace_id=trace_id,
        created_at=now,
        expires_at=now + timedelta(seconds=ttl_seconds),
    )
    entry.save()
    return entry


@transaction.atomic
def cache_hit_record(*, entry: CacheEntry, trace_id: str, request_text: str, similarity: float) -> CacheHit:
    """Record that `entry` answered the request of trace `trace_id`; the entry's counter moves in the
    database, so concurrent hits all count."""
    hit = CacheHit(
        workspace_id=entry.workspace_id,
        agent_id=entry.agent_id,
        entry=entry,
        trace_id=trace_id,
        request_text=request_text,
        similarity=similarity,
    )
    hit.save()
    CacheEntry.objects.filter(pk=entry.pk).update(hit_count=F("hit_count") + 1)
    return hit


def cache_hit_review(*, hit: CacheHit, false_hit: bool, reviewed_by: User) -> CacheHit:
    """A person's verdict on a hit: `false_hit=True` when the stored answer did not fit the request.
    A later verdict replaces an earlier one. Precondition: `reviewed_by` may write in the hit's workspace."""
    hit.false_hit = false_hit
    hit.reviewed_by = reviewed_by
    hit.reviewed_at = timezone.now()
    hit.save(update_fields=["false_hit", "reviewed_by", "reviewed_at"])
    return hit


def cache_entries_invalidate_for_prompt(
    *, agent: Agent, keep_prompt_version_ids: Collection[int], now: datetime | None = None
) -> int:
    """Retire the agent's entries made under a prompt version not in `keep_prompt_version_ids` (the
    versions that hold a label now); entries made without a prompt version are not affected. Returns
    how many were retired: deleted, or, for entries that served hits, expired now and left to the
    sweep after `HIT_RETENTION`, so their hits stay reviewable. Either way none is served again."""
    stale = CacheEntry.objects.filter(agent=agent, prompt_version__isnull=False).exclude(
        prompt_version_id__in=list(keep_prompt_version_ids)
    )
    return _entries_retire(stale, now or timezone.now())


def cache_entries_retire_for_target(*, target: ModelTarget, now: datetime | None = None) -> int:
    """Retire the entries a model target answered, before it is deleted: as for a prompt version no label
    holds, the entries that served hits stay (expired, and their target then None) while those hits are
    reviewable, and the others go. Returns how many were retired."""
    return _entries_retire(CacheEntry.objects.filter(model_target=target), now or timezone.now())


def _entries_retire(stale: QuerySet[CacheEntry], now: datetime) -> int:
    """Delete the entries that served no hit; expire the others now, so their hits stay reviewable."""
    has_hits = Exists(CacheHit.objects.filter(entry=OuterRef("pk")))
    expired = stale.filter(has_hits, expires_at__gt=now).update(expires_at=now)
    return expired + _delete_in_batches(stale.filter(~has_hits))


def cache_entries_invalidate_stale_prompts(*, now: datetime | None = None) -> int:
    """Retire, for every agent, the entries of prompt versions that no label points at any more (a label
    moved: a deploy or a rollback). The gateway already scopes look-ups to the production version, so
    such entries are never served; this reclaims them. Returns how many were retired."""
    # A version belongs to one agent and an entry's version to the entry's agent (cache_store checks),
    # so "no label holds it" is the same test for every agent at once.
    stale = CacheEntry.objects.filter(prompt_version__isnull=False).exclude(
        prompt_version_id__in=PromptLabel.objects.values("version_id")
    )
    return _entries_retire(stale, now or timezone.now())


def cache_entries_sweep(*, now: datetime | None = None) -> int:
    """Delete expired entries in batches of `SWEEP_BATCH`: at once when they served no hit, after
    `HIT_RETENTION` when they did (their hits go with them). Safe to run concurrently and repeatedly."""
    now = now or timezone.now()
    has_hits = Exists(CacheHit.objects.filter(entry=OuterRef("pk")))
    expired = CacheEntry.objects.filter(Q(expires_at__lte=now - HIT_RETENTION) | Q(~has_hits, expires_at__lte=now))
    return _delete_in_batches(expired)


def _delete_in_batches(entries: QuerySet[CacheEntry]) -> int:
    deleted = 0
    while True:
        ids = list(entries.order_by("pk").values_list("pk", flat=True)[:SWEEP_BATCH])
        if not ids:
            return deleted
        with transaction.atomic():
            CacheHit.objects.filter(entry_id__in=ids).delete()
            # `only` keeps Django's delete from loading every vector and answer of the batch.
            _, per_model = CacheEntry.objects.filter(pk__in=ids).only("pk").delete()
        deleted += per_model.get(CacheEntry._meta.label, 0)
        if len(ids) < SWEEP_BATCH:
            return deleted


# --- Selectors ----------------------------------------------------------------------------------------------


def cache_hits_for_review(
    *, workspace: Workspace, agent: Agent | None = None, only_unreviewed: bool = False, limit: int = 100
) -> list[CacheHit]:
    """The workspace's cache hits, newest first, each with the entry it was answered from (request and
    stored answer) and its reviewer, for the review page."""
    hits = CacheHit.objects.filter(workspace=workspace).select_related("entry", "agent", "reviewed_by")
    if agent is not None:
        hits = hits.filter(agent=agent)
    if only_unreviewed:
        hits = hits.filter(false_hit__isnull=True)
    return list(hits.order_by("-created_at", "-pk")[:limit])


class ThresholdRow(TypedDict):
    threshold: float
    hits: int
    decisions: int
    hit_rate: float | None
    reviewed: int
    false_hits: int
    false_hit_rate: float | None
    lower_bound: bool


def cache_threshold_report(
    *,
    agent: Agent,
    thresholds: Sequence[float] = DEFAULT_REPORT_THRESHOLDS,
    since: datetime | None = None,
) -> list[ThresholdRow]:
    """Hit rate against flagged false-hit rate, had the agent's cache threshold been each of `thresholds`.

    Over the agent's cache hits and routing decisions created at or after `since` (all of them when
    None), for each threshold t (in the order given):

    - `hits`: recorded hits whose similarity is at least t, the requests the cache would still have
      answered at t;
    - `decisions`: the agent's routing decisions (every gateway request is one; a hit is one with
      `cache_hit=True`); `hit_rate` = hits / decisions, None without decisions;
    - `reviewed`: those hits a person has judged; `false_hits`: those flagged false;
      `false_hit_rate` = false_hits / reviewed, None when none was reviewed.

    Only hits are on record, not near misses, so below the threshold in force the report cannot see
    the requests that would have been answered too: rows with t below the agent's current threshold
    have `lower_bound=True`, their hit counts being at least what is shown.
    """
    hits = CacheHit.objects.filter(agent=agent)
    decisions = RoutingDecision.objects.filter(agent=agent)
    if since is not None:
        hits = hits.filter(created_at__gte=since)
        decisions = decisions.filter(created_at__gte=since)
    aggregates: dict[str, Any] = {}
    for index, threshold in enumerate(thresholds):
        served = Q(similarity__gte=threshold)
        aggregates[f"hits_{index}"] = Count("pk", filter=served)
        aggregates[f"reviewed_{index}"] = Count("pk", filter=served & Q(false_hit__isnull=False))
        aggregates[f"false_{index}"] = Count("pk", filter=served & Q(false_hit=True))
    counts = hits.aggregate(**aggregates) if aggregates else {}
    decision_count = decisions.count()
    current = RouterConfig.objects.filter(agent=agent).values_list("cache_threshold", flat=True).first()

    rows: list[ThresholdRow] = []
    for index, threshold in enumerate(thresholds):
        served_count, reviewed, false_hits = (
            counts[f"hits_{index}"],
            counts[f"reviewed_{index}"],
            counts[f"false_{index}"],
        )
        rows.append(
            ThresholdRow(
                threshold=threshold,
                hits=served_count,
                decisions=decision_count,
                hit_rate=served_count / decision_count if decision_count else None,
                reviewed=reviewed,
                false_hits=false_hits,
                false_hit_rate=false_hits / reviewed if reviewed else None,
                lower_bound=current is not None and threshold < current,
            )
        )
    return rows
