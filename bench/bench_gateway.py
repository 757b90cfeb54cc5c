"""The routing gateway: its overhead over calling litellm directly, its throughput, the router's decision
time and the semantic cache's look-up time (issue 5), in one run against one stub model server.

    python -m bench.bench_gateway [--quick]

Everything runs against `bench/stub_model_server.py` in a process of its own (OpenAI-compatible, fixed
latency `STUB_LATENCY_MS`, asyncio), on a database of its own (`keel_bench_gateway`) on the
benchmarks' embedded PostgreSQL, with Keel's web server and worker started as bench/stack.py starts
them (gunicorn 2 × 4 threads, a Celery worker of concurrency 2, DEBUG off).

1. **Overhead**, sequential, one keep-alive connection: the same kind of request (a short support
   question under a rendered system prompt) (a) by `litellm.completion` in this process, with the
   arguments the gateway passes, (a') by a raw httpx POST in this process (no litellm: the least a caller
   spends; the gateway itself calls an OpenAI-compatible server such as the stub without litellm,
   routing/openai_compatible.py), and (b) over HTTP through the gateway, as `agent/<slug>` with
   adaptive routing (the learned router: offline embedding, the 20 nearest of 20,000 past decisions,
   the estimate), as the same agent with the speculative single call (its twin, with the same past
   decisions: the single call starts before the router decides, routing/speculation.py), as
   `agent/<slug>` with single-level routing, and as a model alias (plain proxying).
   Cache off. The kinds run in interleaved blocks, so a change of load on the shared machine hits all of
   them alike; after each gateway block the worker's ingest backlog is drained before the next block,
   so it never runs under a direct block. Each request carries a marker that the stub records with its
   own receive and answer times (CLOCK_MONOTONIC, shared by all processes), so each request's time
   splits into the provider's share and everything else ("outside the provider").
   Overhead = gateway − direct (a), per percentile, as issue 5 asks, and gateway − raw (a').
   **The floor** under those figures, in the same blocks: a request the gateway refuses at once (an
   unknown model, 404: key auth and body parsing, no model call, no agent) over the same kind of
   connection, each after the stub's latency of idle, as every gateway request has after its model call;
   and in phase 3, a `SELECT 1` back to back and after the same idle.
2. **Throughput**: 50 client threads, each with its own keep-alive connection, for a fixed time after a
   warm-up, through the gateway (adaptive agent) and directly through litellm (50 threads in this
   process); requests/s, errors by status, latency p50/p99.
3. **Where the gateway's time goes**: the same request through Django's test client in this process
   (no gunicorn), with the gateway's stages timed by wrapping their module functions, the SQL it
   sends counted, and one cProfile.
4. **Router**: in this process, with Keel stopped: `gateway._policy`, the offline embedder,
   `selectors.routing_neighbours` (k = 20 over 20,000 past decisions) and `router.route` timed apart,
   over generated support requests (single- and multi-turn, some with amounts, stakes, cues).
5. **Cache**: 100,000 entries written by COPY over scopes of 45,000 down to 50 entries (so both the
   exact plan and the HNSW plan of `cache_lookup` are used), then 1,000 look-ups (repeats, requests
   with a word dropped, new requests) timed in this process; `EXPLAIN ANALYZE` of the statements a
   look-up sends, replayed in one transaction, says whether the HNSW index was used.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import io
import json
import pstats
import random
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from bench import stack
from bench.harness import VAR_DIR, Report, Stopwatch, load_average, percentile
from config.run import worker_nice

STUB_LATENCY_MS = 20.0
CONCURRENT_CLIENTS = 50
NEIGHBOURS = 20
CACHE_THRESHOLD = 0.93
STALE_BATCH_SECONDS = 5.0
COMPANY = "Acme Rides"
SYSTEM_TEMPLATE = (
    "You are {{company}}'s ride support assistant. Answer in two or three sentences, politely, and never "
    "promise a refund you cannot see in the customer's account."
)
# Issue 5's targets, in milliseconds.
OVERHEAD_P50_TARGET = 5.0
OVERHEAD_P99_TARGET = 15.0
ROUTER_P99_TARGET = 5.0
CACHE_P99_TARGET = 10.0


@dataclass(frozen=True)
class Size:
    database: str
    blocks: int
    per_block: dict[str, int]
    warmup: int
    throughput_seconds: float
    throughput_warmup_seconds: float
    drain_timeout: float
    inprocess_requests: int
    router_requests: int
    past_decisions: int
    cache_scopes: tuple[int, ...]
    cache_lookups: int


KINDS = ("direct", "raw", "adaptive", "speculative", "remote", "remote_speculative", "single_level", "alias")
GATEWAY_KINDS = KINDS[2:]
KIND_LABELS = {
    "direct": "litellm.completion, in process",
    "raw": "httpx POST to the stub, in process (no litellm)",
    "adaptive": "gateway, agent/<slug>, adaptive routing",
    "speculative": "gateway, agent/<slug>, adaptive routing, speculative single call",
    "remote": "gateway, agent/<slug>, adaptive routing, embedder on the stub",
    "remote_speculative": "gateway, agent/<slug>, adaptive routing, embedder on the stub, speculative single call",
    "single_level": "gateway, agent/<slug>, single-level routing",
    "alias": "gateway, model alias (proxy)",
}
# Not a kind of answered request: the gateway's floor (see the docstring), run in the same blocks.
REFUSED = "refused"
REFUSED_LABEL = "gateway, unknown model (404 before any work), after the stub's latency of idle"
SEQUENTIAL_KINDS = (*KINDS, REFUSED)  # what the sequential blocks run, in this order
FULL = Size(
    database="keel_bench_gateway",
    blocks=10,
    per_block={
        "direct": 200,
        "raw": 100,
        "adaptive": 200,
        "speculative": 200,
        "remote": 100,
        "remote_speculative": 100,
        "single_level": 50,
        "alias": 50,
        REFUSED: 50,
    },
    warmup=100,
    throughput_seconds=20.0,
    throughput_warmup_seconds=3.0,
    drain_timeout=300.0,
    inprocess_requests=200,
    router_requests=2000,
    past_decisions=20_000,
    cache_scopes=(45_000, 20_000, 10_000, *(5_000,) * 4, 2_500, 1_500, 500, *(50,) * 10),
    cache_lookups=1000,
)
# --quick: every phase, small (a smoke test, not figures).
QUICK = Size(
    database="keel_bench_gateway_quick",
    blocks=2,
    per_block={
        "direct": 20,
        "raw": 10,
        "adaptive": 20,
        "speculative": 20,
        "remote": 10,
        "remote_speculative": 10,
        "single_level": 10,
        "alias": 10,
        REFUSED: 10,
    },
    warmup=5,
    throughput_seconds=1.0,
    throughput_warmup_seconds=0.5,
    drain_timeout=5.0,
    inprocess_requests=10,
    router_requests=200,
    past_decisions=2000,
    cache_scopes=(6000, 1500, 400, 50, 50),
    cache_lookups=100,
)


# --- Requests ------------------------------------------------------------------------------------------

DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday", "yesterday", "last week")
CITIES = ("Lisbon", "Porto", "Madrid", "Berlin", "Leeds", "Lyon", "Austin", "Denver", "Dublin", "Turin")
ITEMS = ("phone", "wallet", "laptop", "umbrella", "keys", "backpack", "headphones", "jacket", "passport")
DEVICES = ("iPhone", "Android phone", "iPad", "Pixel", "Samsung tablet")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September")
# Requests the router sends to a single call: questions one answer settles.
SIMPLE = (
    "Where can I find the receipt for my trip on {day}?",
    "How do I change the email address on my account to {email}?",
    "My promo code {code} says it has expired, can I still use it?",
    "What time does pick-up at {city} airport start on {day}?",
    "The app keeps logging me out since the update on my {device}.",
    "Can I add a stop to the ride I booked for {day}?",
    "How do I update the card I pay with?",
    "I rated my driver {stars} stars by mistake, can I change it?",
    "Is there a luggage limit on airport rides from {city}?",
    "How long does it take for a cancelled ride to disappear from my history?",
    "Why does my trip {trip} show a waiting fee?",
    "Can I book a ride for someone else in {city}?",
    "How do I turn off the marketing emails?",
    "Does {city} have rides with child seats?",
    "My invoice for trip {trip} has the wrong company name, how do I fix it?",
)
# Requests that trip rules, cues, amounts or stakes.
HARD = (
    "I was charged ${amount} twice for one ride on {day}, trip {trip}.",
    "Compare my last {count} trips and explain why the fares differ so much.",
    "The driver on trip {trip} was unsafe and ran a red light in {city}.",
    "For each of my trips in {month}, list the tolls, the tip and the waiting fee.",
    "I left my {item} in the car on trip {trip}, and then the driver stopped answering; can you find out "
    "who it was and get it back?",
    "I want to talk to a human, this is not helping at all.",
    "My account was used for {count} rides in {city} that I never took, total {amount} euros, is this fraud?",
    "Can you investigate why the app charged me a cancellation fee of ${small} when the driver cancelled?",
    "I'm going to contact a lawyer about the charge of ${amount} on trip {trip}.",
    "Please break down the fare of trip {trip} step by step and then compare it with the estimate.",
)
ASSISTANT_REPLIES = (
    "I'm sorry about that. Could you tell me the trip number?",
    "Thanks, I can see the trip. What would you like me to check?",
    "I understand. Let me look into it.",
    "Could you confirm the email address on your account?",
)
FOLLOW_UPS = (
    "It's trip {trip}.",
    "No, I said the second trip, not the first.",
    "I already told you, the charge is ${amount}.",
    "Can you just refund it?",
    "That's not what I asked.",
    "Thanks, and the receipt too please.",
)


class Requests:
    """Varied ride-support requests from templates, deterministic per seed."""

    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)  # noqa: S311 - test data, not security

    def _fill(self, template: str) -> str:
        pick = self.random
        return template.format(
            day=pick.choice(DAYS),
            city=pick.choice(CITIES),
            item=pick.choice(ITEMS),
            device=pick.choice(DEVICES),
            month=pick.choice(MONTHS),
            email=f"rider{pick.randint(1, 99_999)}@example.com",
            code=f"RIDE{pick.randint(100, 999)}",
            stars=pick.randint(1, 4),
            trip=f"T{pick.randint(100_000, 999_999)}",
            amount=pick.choice((12, 25, 48, 75, 120, 250, 480)),
            small=pick.choice((3, 5, 8)),
            count=pick.randint(2, 6),
        )

    def simple(self) -> str:
        return self._fill(self.random.choice(SIMPLE))

    def any(self) -> str:
        return self._fill(self.random.choice(SIMPLE if self.random.random() < 0.6 else HARD))

    def conversation(self) -> list[dict[str, str]]:
        """One to four user turns (a sixth of them multi-turn), the last one the request."""
        messages = [{"role": "user", "content": self.any()}]
        if self.random.random() < 1 / 6:
            for _ in range(self.random.randint(1, 3)):
                messages.append({"role": "assistant", "content": self.random.choice(ASSISTANT_REPLIES)})
                messages.append({"role": "user", "content": self._fill(self.random.choice(FOLLOW_UPS))})
        return messages


STARTED = time.monotonic()


def _progress(message: str) -> None:
    print(f"[{time.monotonic() - STARTED:5.0f} s, load {load_average()}] {message}", flush=True)


# --- Statistics ----------------------------------------------------------------------------------------


def _ms(values: Sequence[float], share: float) -> str:
    value = percentile(values, share)
    return "–" if value != value else f"{value:.2f}"


def _distribution(values: Sequence[float]) -> list[str]:
    return [_ms(values, 0.5), _ms(values, 0.95), _ms(values, 0.99), _ms(values, 1.0)]


def _verdict(value: float, target: float) -> str:
    return f"{'met' if value <= target else '**not met**'} (≤ {target:g} ms)"


# --- Database helpers ------------------------------------------------------------------------------------


def _vector_text(vector: Sequence[float]) -> str:
    return "[" + ",".join(f"{value:.7g}" for value in vector) + "]"


def _copy_default(field: Any) -> object:
    value = field.get_default()
    return json.dumps(value) if isinstance(value, (dict, list)) else value


def _copy_rows(model: Any, columns: Sequence[str], rows: Iterator[Sequence[object]]) -> int:
    """Write rows into a model's table by COPY. `columns` are field attnames (JSON and vectors as text);
    every other field gets its model default, unless the database has one of its own."""
    from django.db import connection
    from django.db.models import NOT_PROVIDED

    given = {model._meta.get_field(name).attname for name in columns}
    others = [
        field
        for field in model._meta.concrete_fields
        if not field.primary_key and field.attname not in given and field.db_default is NOT_PROVIDED
    ]
    names = ", ".join([model._meta.get_field(name).column for name in columns] + [f.column for f in others])
    defaults = tuple(_copy_default(field) for field in others)
    connection.ensure_connection()
    count = 0
    raw = connection.connection
    assert raw is not None
    with raw.cursor() as cursor, cursor.copy(f"COPY {model._meta.db_table} ({names}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row((*row, *defaults))
            count += 1
    raw.commit()
    return count


@contextlib.contextmanager
def _hnsw_rebuilt_after(table: str) -> Iterator[dict[str, float]]:
    """Drop the table's HNSW indexes for a bulk load and build them again after it (much faster than
    inserting row by row into the graph); yields a dict that gets the build's seconds."""
    from django.db import connection

    timings: dict[str, float] = {}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s AND indexdef ILIKE %s",
            [table, "%using hnsw%"],
        )
        indexes = cursor.fetchall()
        for name, _ in indexes:
            cursor.execute(f'DROP INDEX "{name}"')
    yield timings
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("SET maintenance_work_mem = '1GB'")
        for _, definition in indexes:
            cursor.execute(definition)
        cursor.execute(f"VACUUM ANALYZE {table}")
        cursor.execute("RESET maintenance_work_mem")
    timings["index_seconds"] = time.perf_counter() - started


@dataclass
class Captured:
    statements: list[tuple[str, Any]] = field(default_factory=list)

    def __call__(self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        self.statements.append((sql, params))
        return execute(sql, params, many, context)


@dataclass
class QueryTimer:
    milliseconds: list[float] = field(default_factory=list)

    def __call__(self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            self.milliseconds.append((time.perf_counter() - started) * 1000)


def _explain(call: Callable[[], object]) -> list[tuple[str, str]]:
    """Run `call`, then replay the statements it sent in one transaction (its `SET`s and `set_config`s
    included), with `EXPLAIN (ANALYZE, BUFFERS)` in front of each query; returns (query, plan) pairs."""
    from django.db import connection, transaction

    captured = Captured()
    with connection.execute_wrapper(captured):
        call()
    plans = []
    with transaction.atomic(), connection.cursor() as cursor:
        for sql, params in _statements_split(captured.statements):
            statement = sql.lstrip().upper()
            if statement.startswith(
                ("SAVEPOINT", "RELEASE", "ROLLBACK", "PREPARE", "SELECT 1 FROM PG_PREPARED_STATEMENTS")
            ):
                continue
            # A query, or a prepared one (EXECUTE: its plan as it runs, generic or not).
            if statement.startswith(("EXECUTE", "WITH")) or (
                statement.startswith("SELECT") and "SET_CONFIG" not in statement
            ):
                # This cursor writes parameters into the SQL: a vector the search sent in binary goes as text.
                params = [_vector_text(value) if isinstance(value, tuple) else value for value in params]
                cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
                plans.append((sql, "\n".join(row[0] for row in cursor.fetchall())))
            else:
                cursor.execute(sql, params)
    return plans


def _statements_split(statements: Sequence[tuple[str, Any]]) -> Iterator[tuple[str, list[Any]]]:
    """Each statement alone, with its own parameters: a query string of several statements (the cache's
    HNSW settings and its search go as one) is cut at its semicolons, none of which is inside a literal."""
    for sql, params in statements:
        remaining = list(params or [])
        for part in sql.split("; "):
            taken = part.count("%s")
            yield part, remaining[:taken]
            remaining = remaining[taken:]


def _plans_report(report: Report, what: str, plans: Sequence[tuple[str, str]], index: str) -> None:
    for sql, plan in plans:
        if "<=>" in sql or "::vector" in sql:
            report.line(f"{what}, the vector search: {_plan_summary(plan, index)}.")
        else:
            report.line(f"{what}, `{' '.join(sql.split())[:60]}…`:")
        report.code(plan)


def _plan_summary(plan: str, index: str) -> str:
    if index in plan:
        return f"index scan on `{index}` (HNSW)"
    if "Index" in plan:
        return "another index, then the distances computed (no HNSW)"
    return "sequential scan (no HNSW)"


# --- Fixtures ----------------------------------------------------------------------------------------------


@dataclass
class Fixtures:
    workspace: Any
    raw_key: str
    adaptive: Any
    speculative: Any  # the adaptive agent's twin with the speculative single call (routing/speculation.py)
    remote: Any  # twins that embed through a model target on the stub (`/v1/embeddings`), without and with it
    remote_speculative: Any
    single_level: Any
    target: Any
    api_base: str


def _fixtures(api_base: str) -> Fixtures:
    from agent_registry import services as registry
    from agent_registry.models import Scope, User
    from agent_registry.tests.factories import requirements_answers
    from config import crypto
    from routing.models import ChainStep, ModelTarget, RouterConfig

    owner = User.objects.create_user(username="bench-owner", password=None)
    workspace = registry.workspace_create(slug="bench", name="Benchmark", owner=owner)
    target, embedder = (
        ModelTarget.objects.create(
            workspace=workspace,
            alias=alias,
            model=model,
            api_base=api_base,
            api_key_encrypted=crypto.encrypt("sk-bench-stub"),
            tier=tier,
            timeout_seconds=30.0,
        )
        for alias, model, tier in (
            ("stub-chat", "openai/stub", "single_call"),
            ("stub-embedding", "openai/stub-embedding", ""),
        )
    )
    adaptive = registry.agent_create(workspace=workspace, slug="ride-support", name="Ride support")
    speculative = registry.agent_create(workspace=workspace, slug="ride-support-speculative", name="Ride support")
    remote = registry.agent_create(workspace=workspace, slug="ride-support-remote", name="Ride support")
    remote_speculative = registry.agent_create(
        workspace=workspace, slug="ride-support-remote-speculative", name="Ride support"
    )
    learned = (adaptive, speculative, remote, remote_speculative)
    for agent in learned:
        registry.requirements_version_create(
            agent=agent,
            answers=requirements_answers(
                **{
                    "routing.enabled_tiers": ["single_call", "chain", "agentic", "human"],
                    "routing.signal": "learned_difficulty",
                    "routing.escalation_rules": [
                        {"trigger": "keywords", "value": "unsafe, assault", "to_tier": "human", "reason": "safety"},
                        {"trigger": "amount_over", "value": "100", "to_tier": "human", "reason": "high-value dispute"},
                    ],
                }
            ),
            message="benchmark",
        )
    single_level = registry.agent_create(workspace=workspace, slug="ride-faq", name="Ride FAQ")
    registry.requirements_version_create(
        agent=single_level,
        answers=requirements_answers(
            **{
                "routing.mode": "single_level",
                "routing.enabled_tiers": ["single_call"],
                "routing.default_tier": "single_call",
                "routing.escalation_rules": [],
                "io_gap.steps_median": 1,
                "io_gap.steps_p95": 1,
            }
        ),
        message="benchmark",
    )
    for agent in (*learned, single_level):
        registry.prompt_create(
            agent=agent,
            name=f"{agent.slug}/system",
            type="chat",
            template=[{"role": "system", "content": SYSTEM_TEMPLATE}, {"role": "user", "content": "{{message}}"}],
            labels=["production"],
        )
    for agent in learned:
        # The adaptive agent's other tiers work too (on the same stub), so a request the router sends there
        # is answered rather than refused; only single-call answers count in the overhead figures.
        RouterConfig.objects.create(
            agent=agent,
            single_call_target=target,
            agentic_target=target,
            cache_enabled=False,
            speculative_single_call=agent in (speculative, remote_speculative),
            embedding_target=embedder if agent in (remote, remote_speculative) else None,
            rules=[
                {"name": "multi-step", "kind": "pattern", "value": r"\b(compare|for each)\b", "to_tier": "chain"},
                {"name": "lost items", "kind": "keywords", "value": "left my, lost my", "to_tier": "agentic"},
            ],
            intents={
                "billing": ["charged", "charge", "fee", "refund", "invoice", "receipt"],
                "account": ["email", "password", "card", "logging me out"],
            },
            neighbours=NEIGHBOURS,
        )
        for position, name in enumerate(("classify", "answer"), start=1):
            ChainStep.objects.create(agent=agent, position=position, name=name, instructions=f"Step {name}.")
    RouterConfig.objects.create(agent=single_level, single_call_target=target, cache_enabled=False)
    _, raw_key = registry.apikey_create(workspace=workspace, name="bench gateway", scopes=[Scope.GATEWAY])
    return Fixtures(
        workspace, raw_key, adaptive, speculative, remote, remote_speculative, single_level, target, api_base
    )


# Quality of past decisions per tier: the single call is good enough for most requests, so the learned
# router's estimate keeps simple requests there (the tier the overhead figures are about).
PAST_QUALITY = {"single_call": 0.9, "chain": 0.84, "agentic": 0.86, "human": 0.95}
PAST_TIERS = (("single_call", 0.72), ("chain", 0.18), ("agentic", 0.07), ("human", 0.03))
PAST_COST = {"single_call": 0.002, "chain": 0.008, "agentic": 0.06, "human": 4.0}
PAST_LATENCY = {"single_call": 1400, "chain": 4200, "agentic": 16_000, "human": 3_600_000}


def _past_decisions(agents: Sequence[Any], remote: Sequence[Any], count: int) -> dict[str, float]:
    """`count` routing decisions of each of `agents` and `remote` (the same ones for each) with known
    outcomes, as the learned router reads them back: embedded offline for `agents`, as the stub's
    `/v1/embeddings` embeds them (projected to 256 wide, as routing/cache.py does) for `remote`."""
    from django.utils import timezone

    from bench.stub_model_server import text_embedding as stub_embedding
    from routing import embedding as embedder
    from routing.models import RoutingDecision

    texts = Requests(seed=11)
    pick = random.Random(12)  # noqa: S311 - test data, not security
    now = timezone.now()
    tiers = [tier for tier, _ in PAST_TIERS]
    weights = [weight for _, weight in PAST_TIERS]
    started = time.perf_counter()

    def rows() -> Iterator[Sequence[object]]:
        for number in range(count):
            text = texts.any()
            tier = pick.choices(tiers, weights)[0]
            quality = min(1.0, max(0.0, pick.gauss(PAST_QUALITY[tier], 0.1)))
            offline = _vector_text(embedder.embed_offline(text))
            projected = _vector_text(embedder.project(stub_embedding(text))) if remote else ""
            for position, agent in enumerate((*agents, *remote)):
                yield (
                    agent.workspace_id,
                    agent.pk,
                    f"{position * count + number:032x}",
                    text,
                    offline if agent in agents else projected,
                    "{}",
                    "{}",
                    tier,
                    "estimate",
                    "benchmark",
                    0,
                    False,
                    "ok",
                    int(PAST_LATENCY[tier] * pick.uniform(0.6, 1.6)),
                    f"{PAST_COST[tier] * pick.uniform(0.5, 1.5):.8f}",
                    round(quality, 3),
                    "score",
                    now - timedelta(minutes=number),
                )

    columns = (
        "workspace_id",
        "agent_id",
        "trace_id",
        "request_text",
        "embedding",
        "features",
        "estimates",
        "tier",
        "method",
        "reason",
        "decision_us",
        "cache_hit",
        "status",
        "latency_ms",
        "cost_usd",
        "quality",
        "quality_source",
        "created_at",
    )
    with _hnsw_rebuilt_after(RoutingDecision._meta.db_table) as timings:
        _copy_rows(RoutingDecision, columns, rows())
    timings["load_seconds"] = time.perf_counter() - started - timings["index_seconds"]
    return timings


# --- Calls ---------------------------------------------------------------------------------------------------


@dataclass
class Sample:
    kind: str
    marker: str
    total_ms: float
    status: int
    tier: str | None = None
    trace_id: str | None = None
    provider_ms: float | None = None


Call = Callable[[str], tuple[int, str | None, str | None]]  # content -> (status, tier, trace id)


def _direct_caller(fixtures: Fixtures) -> Call:
    import httpx
    import litellm
    from openai import OpenAIError

    system = SYSTEM_TEMPLATE.replace("{{company}}", COMPANY)

    def call(content: str) -> tuple[int, str | None, str | None]:
        try:
            litellm.completion(
                model=fixtures.target.model,
                api_base=fixtures.api_base,
                api_key="sk-bench-stub",
                timeout=fixtures.target.timeout_seconds,
                messages=[{"role": "system", "content": system}, {"role": "user", "content": content}],
            )
        except (OpenAIError, httpx.HTTPError) as error:
            return getattr(error, "status_code", None) or 0, None, None
        return 200, None, None

    return call


def _raw_caller(fixtures: Fixtures) -> tuple[Call, Callable[[], None]]:
    """The least a Python caller can do: one keep-alive httpx client, the request's JSON, the answer parsed."""
    import httpx

    client = httpx.Client(headers={"Authorization": "Bearer sk-bench-stub"}, timeout=fixtures.target.timeout_seconds)
    url = f"{fixtures.api_base.rstrip('/')}/chat/completions"
    system = SYSTEM_TEMPLATE.replace("{{company}}", COMPANY)
    model = fixtures.target.model.removeprefix("openai/")

    def call(content: str) -> tuple[int, str | None, str | None]:
        body = {
            "model": model,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": content}],
        }
        try:
            response = client.post(url, json=body)
            response.json()
        except (httpx.HTTPError, ValueError):
            return 0, None, None
        return response.status_code, None, None

    return call, client.close


def _gateway_caller(fixtures: Fixtures, port: int, kind: str) -> tuple[Call, Callable[[], None]]:
    """A caller with its own keep-alive connection, and the function that closes it."""
    import httpx

    client = httpx.Client(
        base_url=f"http://127.0.0.1:{port}",
        headers={"Authorization": f"Bearer {fixtures.raw_key}"},
        timeout=60.0,
    )
    model = {
        "adaptive": f"agent/{fixtures.adaptive.slug}",
        "speculative": f"agent/{fixtures.speculative.slug}",
        "remote": f"agent/{fixtures.remote.slug}",
        "remote_speculative": f"agent/{fixtures.remote_speculative.slug}",
        "single_level": f"agent/{fixtures.single_level.slug}",
        "alias": fixtures.target.alias,
        REFUSED: "no-such-model",
    }[kind]
    system = SYSTEM_TEMPLATE.replace("{{company}}", COMPANY)

    def call(content: str) -> tuple[int, str | None, str | None]:
        if kind in ("alias", REFUSED):
            body: dict[str, Any] = {
                "model": model,
                "messages": [{"role": "system", "content": system}, {"role": "user", "content": content}],
            }
        else:
            body = {
                "model": model,
                "messages": [{"role": "user", "content": content}],
                "variables": {"company": COMPANY},
            }
        try:
            response = client.post("/v1/chat/completions", json=body)
        except httpx.HTTPError:
            return 0, None, None
        return response.status_code, response.headers.get("X-Keel-Tier"), response.headers.get("X-Keel-Trace-Id")

    return call, client.close


def _stub_timings(stub_port: int) -> dict[str, tuple[int, int]]:
    import httpx

    data = httpx.get(f"http://127.0.0.1:{stub_port}/_timings", timeout=10).json()
    return {key: (value[0], value[1]) for key, value in data.items()}


class Markers:
    def __init__(self) -> None:
        self.count = 0

    def next(self, kind: str) -> str:
        self.count += 1
        return f"{kind[0]}{self.count}"


def _sequential(kind: str, call: Call, texts: Requests, count: int, markers: Markers) -> list[Sample]:
    samples = []
    for _ in range(count):
        marker = markers.next(kind)
        content = f"{texts.simple()} [bench:{marker}]"
        if kind == REFUSED:
            time.sleep(STUB_LATENCY_MS / 1000)  # the idle a model call leaves in Keel's processes; untimed
        started = time.monotonic_ns()
        status, tier, trace_id = call(content)
        samples.append(Sample(kind, marker, (time.monotonic_ns() - started) / 1e6, status, tier, trace_id))
    return samples


@dataclass
class Worker:
    """Keel's Celery worker during the HTTP phases: restarted if it dies, and what it lost."""

    keel: stack.Processes
    environment: dict[str, str]
    crashes: list[str] = field(default_factory=list)
    lost_batches: int = 0

    def ensure_alive(self) -> None:
        if "worker" in self.keel.alive():
            return
        log = stack.LOG_DIR / "gateway-worker.log"
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
        self.crashes.append(lines[-1][:200] if lines else "no log")
        _progress(f"the worker died ({self.crashes[-1]}); starting another")
        concurrency = self.environment.get("KEEL_WORKER_CONCURRENCY", "2")
        self.keel.start(
            "worker",
            [str(stack.BIN / "celery"), "-A", "config", "worker", "-l", "warning", "-c", concurrency],
            self.environment,
            log,
            nice=worker_nice(self.environment),
        )


def _ingest_drained(worker: Worker, timeout: float) -> float:
    """Wait until the worker has processed every span batch; returns the seconds waited.

    A dead worker is started again. A batch still pending after the others drained (for
    `STALE_BATCH_SECONDS`) lost its message in the broker (as when the worker died reading it): the
    benchmark processes it itself, as Beat's sweeper would after a minute, and counts it."""
    from tracing import services as tracing_services
    from tracing.models import IngestBatch

    started = time.perf_counter()
    time.sleep(0.25)  # the web process writes a request's record up to KEEL_WRITE_BEHIND_HOLD_MS after answering
    unfinished = IngestBatch.objects.filter(status__in=("pending", "processing"))
    last_count, last_change = -1, started
    while time.perf_counter() - started < timeout:
        count = unfinished.count()
        if count == 0:
            break
        now = time.perf_counter()
        if count != last_count:
            last_count, last_change = count, now
        worker.ensure_alive()
        if now - last_change > STALE_BATCH_SECONDS:
            for batch_id in unfinished.filter(status="pending").values_list("pk", flat=True):
                tracing_services.span_batch_process(batch_id=batch_id)
                worker.lost_batches += 1
            last_change = time.perf_counter()
        time.sleep(0.1)
    return time.perf_counter() - started


@dataclass
class Throughput:
    requests: int = 0
    seconds: float = 0.0
    statuses: Counter[int] = field(default_factory=Counter)
    tiers: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)


def _concurrent(
    make_caller: Callable[[], tuple[Call, Callable[[], None]]], clients: int, warmup: float, seconds: float
) -> Throughput:
    """`clients` threads call as fast as answers come; counts what finished in the window after warm-up."""
    result = Throughput(seconds=seconds)
    lock = threading.Lock()
    barrier = threading.Barrier(clients + 1)
    window: list[float] = []

    def client(number: int) -> None:
        call, close = make_caller()
        texts = Requests(seed=1000 + number)
        barrier.wait()
        start, end = window
        try:
            while (now := time.monotonic()) < end:
                status, tier, _ = call(texts.simple())
                finished = time.monotonic()
                if now >= start:
                    with lock:
                        result.requests += 1
                        result.statuses[status] += 1
                        if tier:
                            result.tiers[tier] += 1
                        result.latencies.append((finished - now) * 1000)
        finally:
            close()

    threads = [threading.Thread(target=client, args=(number,), daemon=True) for number in range(clients)]
    for thread in threads:
        thread.start()
    began = time.monotonic()
    window.extend((began + warmup, began + warmup + seconds))
    barrier.wait()
    for thread in threads:
        thread.join()
    return result


# --- Phase 1 and 2: over HTTP --------------------------------------------------------------------------------


@dataclass
class HttpFigures:
    samples: dict[str, list[Sample]]
    drain_seconds: list[float]
    throughput: dict[str, Throughput]
    decision_features: list[dict[str, Any]]
    speculative_decisions: dict[str, list[tuple[str, dict[str, Any]]]]  # kind -> (tier, features) per request


def _http_phases(fixtures: Fixtures, size: Size, web_port: int, stub_port: int, worker: Worker) -> HttpFigures:
    from routing.models import RoutingDecision

    direct = _direct_caller(fixtures)
    callers: dict[str, tuple[Call, Callable[[], None]]] = {
        "direct": (direct, lambda: None),
        "raw": _raw_caller(fixtures),
    }
    for kind in SEQUENTIAL_KINDS[2:]:
        callers[kind] = _gateway_caller(fixtures, web_port, kind)
    markers = Markers()
    texts = Requests(seed=7)

    # Warm-up: litellm's first call imports and builds its client; each gunicorn worker imports litellm
    # on its first gateway request, so the warm-up also runs from several connections at once.
    _progress("warm-up")
    for kind in SEQUENTIAL_KINDS:
        _sequential(kind, callers[kind][0], texts, size.warmup, markers)
    _concurrent(lambda: _gateway_caller(fixtures, web_port, "adaptive"), 8, 0.0, size.throughput_warmup_seconds)
    _ingest_drained(worker, size.drain_timeout)
    _stub_timings(stub_port)

    samples: dict[str, list[Sample]] = {kind: [] for kind in SEQUENTIAL_KINDS}
    drains = []
    for block in range(size.blocks):
        _progress(f"block {block + 1}/{size.blocks}")
        for kind in SEQUENTIAL_KINDS:
            taken = _sequential(kind, callers[kind][0], texts, size.per_block[kind], markers)
            if kind not in ("direct", "raw"):
                drains.append(_ingest_drained(worker, size.drain_timeout))
            timings = _stub_timings(stub_port)
            for sample in taken:
                seen = timings.get(sample.marker)
                if seen is not None:
                    sample.provider_ms = (seen[1] - seen[0]) / 1e6
            samples[kind] += taken
    for _, close in callers.values():
        close()
    trace_ids = [sample.trace_id for sample in samples["adaptive"] if sample.trace_id]
    features = list(
        RoutingDecision.objects.filter(agent=fixtures.adaptive, trace_id__in=trace_ids).values_list(
            "features", flat=True
        )
    )
    speculative_decisions = {
        kind: list(
            RoutingDecision.objects.filter(
                agent=agent, trace_id__in=[sample.trace_id for sample in samples[kind] if sample.trace_id]
            ).values_list("tier", "features")
        )
        for kind, agent in (("speculative", fixtures.speculative), ("remote_speculative", fixtures.remote_speculative))
    }

    throughput = {}
    _progress("throughput, gateway")
    throughput["adaptive"] = _concurrent(
        lambda: _gateway_caller(fixtures, web_port, "adaptive"),
        CONCURRENT_CLIENTS,
        size.throughput_warmup_seconds,
        size.throughput_seconds,
    )
    drains.append(_ingest_drained(worker, size.drain_timeout))
    _progress("throughput, direct")
    throughput["direct"] = _concurrent(
        lambda: (_direct_caller(fixtures), lambda: None),
        CONCURRENT_CLIENTS,
        size.throughput_warmup_seconds,
        size.throughput_seconds,
    )
    _stub_timings(stub_port)
    return HttpFigures(samples, drains, throughput, features, speculative_decisions)


def _report_http(report: Report, figures: HttpFigures) -> None:
    samples = figures.samples
    direct = [s for s in samples["direct"] if s.status == 200]
    report.line("#### Overhead over litellm, sequential (one keep-alive connection), cache off")
    report.line()
    report.line(
        f"Stub latency {STUB_LATENCY_MS:g} ms. Each kind's requests ran in interleaved blocks; only answered "
        'requests (200, and for agents the single-call tier) count. "Outside the provider" is each request\'s '
        "time less the stub's own receive-to-answer time for it: the caller's, litellm's (direct) and (through "
        "the gateway) Keel's work plus both loopback hops. Keel's web and worker were running; the web process "
        "wrote each request's record after answering (its write-behind thread, as `make run` runs it), and the "
        "worker's backlog was drained after each gateway block (so it ran during gateway blocks, as in "
        "production, and never during a direct one)."
    )
    report.line()
    rows = []
    outside_rows = []
    for kind in KINDS:
        taken = samples[kind]
        good = [s for s in taken if s.status == 200 and (kind in ("direct", "raw", "alias") or s.tier == "single_call")]
        statuses = Counter(s.status for s in taken)
        tiers = Counter(s.tier for s in taken if s.tier)
        note = ", ".join(f"{status}: {count}" for status, count in sorted(statuses.items()))
        if tiers:
            note += "; tiers " + ", ".join(f"{tier} {count}" for tier, count in tiers.most_common())
        totals = [s.total_ms for s in good]
        rows.append([KIND_LABELS[kind], len(good), *_distribution(totals), note])
        outside = [s.total_ms - s.provider_ms for s in good if s.provider_ms is not None]
        provider = [s.provider_ms for s in good if s.provider_ms is not None]
        outside_rows.append([KIND_LABELS[kind], len(outside), *_distribution(outside), _ms(provider, 0.5)])
    report.table(["requests", "n", "p50 ms", "p95 ms", "p99 ms", "max ms", "statuses"], rows)
    report.line("Time outside the provider, per request:")
    report.line()
    report.table(["requests", "n", "p50 ms", "p95 ms", "p99 ms", "max ms", "stub's own time p50 ms"], outside_rows)

    direct_totals = [s.total_ms for s in direct]
    direct_outside = [s.total_ms - s.provider_ms for s in direct if s.provider_ms is not None]
    raw_totals = [s.total_ms for s in samples["raw"] if s.status == 200]
    overhead_rows = []
    for kind in GATEWAY_KINDS:
        good = [s for s in samples[kind] if s.status == 200 and (kind == "alias" or s.tier == "single_call")]
        totals = [s.total_ms for s in good]
        outside = [s.total_ms - s.provider_ms for s in good if s.provider_ms is not None]
        row: list[object] = [KIND_LABELS[kind]]
        for share in (0.5, 0.95, 0.99):
            row.append(f"{percentile(totals, share) - percentile(direct_totals, share):.2f}")
        for share in (0.5, 0.99):
            row.append(f"{percentile(outside, share) - percentile(direct_outside, share):.2f}")
        for share in (0.5, 0.99):
            row.append(f"{percentile(totals, share) - percentile(raw_totals, share):.2f}")
        p50 = percentile(totals, 0.5) - percentile(direct_totals, 0.5)
        p99 = percentile(totals, 0.99) - percentile(direct_totals, 0.99)
        row.append(f"p50 {_verdict(p50, OVERHEAD_P50_TARGET)}; p99 {_verdict(p99, OVERHEAD_P99_TARGET)}")
        overhead_rows.append(row)
    report.line(
        "Overhead = gateway − direct (litellm), per percentile (of the whole time, and of the time outside the "
        "provider); and gateway − raw HTTP, the least any Python caller spends. Keel calls an OpenAI-compatible "
        "server such as the stub without litellm (routing/openai_compatible.py), so what litellm costs a direct "
        "caller is not in the gateway's time: the raw columns are what the gateway adds to a caller that spends "
        "nothing."
    )
    report.line()
    report.table(
        [
            "through",
            "p50 ms",
            "p95 ms",
            "p99 ms",
            "outside p50 ms",
            "outside p99 ms",
            "over raw HTTP p50 ms",
            "over raw HTTP p99 ms",
            "target (issue 5)",
        ],
        overhead_rows,
    )
    refused = samples[REFUSED]
    floor = [s.total_ms for s in refused if s.status == 404]
    refusals = ", ".join(f"{status}: {count}" for status, count in sorted(Counter(s.status for s in refused).items()))
    report.line(
        "The floor under every gateway figure above, in the same blocks: a request the gateway refuses before any "
        "work (unknown model: key auth and body parsing, no model call, no agent), over a keep-alive connection of "
        f"its own, each sent after {STUB_LATENCY_MS:g} ms of idle as a model call leaves Keel's processes "
        "(the idle is not timed). The direct call has no such hop: this is the HTTP client, the loopback hop, "
        "gunicorn and Django before Keel's own work starts."
    )
    report.line()
    report.table(
        ["requests", "n", "p50 ms", "p95 ms", "p99 ms", "max ms", "statuses"],
        [[REFUSED_LABEL, len(floor), *_distribution(floor), refusals]],
    )

    features = figures.decision_features
    lookup = [f.get("lookup_us", 0) / 1000 for f in features if "lookup_us" in f]
    routed = [f.get("router_us", 0) / 1000 for f in features if "router_us" in f]
    if features:
        report.line(
            "As the gateway itself timed them (RoutingDecision.features of the adaptive requests above): "
            f"embedding + neighbour search p50 {_ms(lookup, 0.5)} ms, p99 {_ms(lookup, 0.99)} ms; "
            f"`router.route` p50 {_ms(routed, 0.5)} ms, p99 {_ms(routed, 0.99)} ms; "
            f"neighbours known p50 {percentile([float(f.get('neighbours_known', 0)) for f in features], 0.5):.0f}."
        )
        report.line()
    report.line(
        "The speculative twins (routing/speculation.py): the same agent, policy and past decisions, with the "
        "single call started before the router's embedding, neighbour search and estimate, and taken when the "
        "router chose the single call. The twins with the embedder on the stub embed each request through "
        f"the stub's `/v1/embeddings`, which answers after the same {STUB_LATENCY_MS:g} ms as a chat call, as with a "
        "provider's embedding model. Requests that started a speculative call and went to another tier paid "
        "for a single call they did not use; the others were decided by a rule or looked too hard for a single "
        "call, and started none:"
    )
    report.line()
    speculation_rows = []
    for kind, decisions in figures.speculative_decisions.items():
        started = [(tier, f["speculative"]) for tier, f in decisions if "speculative" in f]
        unused = Counter(tier for tier, used in started if not used)
        speculation_rows.append(
            [
                KIND_LABELS[kind],
                len(decisions),
                len(started),
                len(started) - sum(unused.values()),
                f"{sum(unused.values())} ({100 * sum(unused.values()) / max(1, len(decisions)):.1f} %)",
                ", ".join(f"{tier} {count}" for tier, count in unused.most_common()) or "none",
            ]
        )
    report.table(["requests", "n", "speculative calls", "taken", "not used", "tiers chosen instead"], speculation_rows)
    drains = figures.drain_seconds
    report.line(
        f"Worker backlog drained after each gateway block in p50 {percentile(drains, 0.5):.2f} s, "
        f"max {max(drains, default=0):.2f} s."
    )
    report.line()

    report.line(f"#### Throughput, {CONCURRENT_CLIENTS} concurrent clients (threads, one keep-alive connection each)")
    report.line()
    rows = []
    for kind in ("adaptive", "direct"):
        result = figures.throughput[kind]
        ok = result.statuses.get(200, 0)
        errors = ", ".join(
            f"{status or 'connection'}: {count}" for status, count in sorted(result.statuses.items()) if status != 200
        )
        rows.append(
            [
                KIND_LABELS[kind],
                f"{result.seconds:g}",
                f"{result.requests / result.seconds:.1f}",
                f"{ok / result.seconds:.1f}",
                errors or "none",
                _ms(result.latencies, 0.5),
                _ms(result.latencies, 0.99),
                ", ".join(f"{tier} {count}" for tier, count in result.tiers.most_common()) or "–",
            ]
        )
    report.table(
        ["through", "window s", "requests/s", "answered/s", "errors by status", "p50 ms", "p99 ms", "tiers"], rows
    )
    report.line(
        "The gateway runs as `make run` starts it: gunicorn 2 workers × 4 threads, so at most 8 requests are in "
        "Keel at once and the other clients queue; the 50 client threads run in the benchmark's own process "
        "on the same 2 cores. Direct: 50 threads calling litellm.completion in one process."
    )
    report.line()


# --- Phase 3: where the gateway's time goes --------------------------------------------------------------------


STAGES = (
    ("routing.gateway", "_plan"),
    ("routing.gateway", "_policy"),
    ("routing.cache", "request_embed"),
    ("routing.selectors", "routing_neighbours"),
    ("routing.router", "route"),
    ("routing.gateway", "_decision_span"),
    ("routing.providers", "completion"),
    ("routing.openai_compatible", "chat"),
    ("routing.gateway", "_record"),
    ("routing.gateway", "_store"),
    ("tracing.services", "ingest_spans_accept"),
    ("routing.gateway", "_answer"),
)


@dataclass
class StageTimer:
    """Milliseconds per stage of the request being served (a stage called twice adds up)."""

    current: dict[str, float] = field(default_factory=dict)

    def take(self) -> dict[str, float]:
        taken, self.current = self.current, {}
        return taken


@contextlib.contextmanager
def _stages_timed() -> Iterator[StageTimer]:
    """Wrap the gateway's stage functions (module attributes, looked up at call time) with a timer."""
    import importlib

    timer = StageTimer()
    originals = []
    for module_name, name in STAGES:
        module = importlib.import_module(module_name)
        original = getattr(module, name, None)
        if original is None:
            continue

        def timed(*args: Any, _original: Any = original, _key: str = f"{module_name}.{name}", **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return _original(*args, **kwargs)
            finally:
                timer.current[_key] = timer.current.get(_key, 0.0) + (time.perf_counter() - started) * 1000

        functools.update_wrapper(timed, original)
        setattr(module, name, timed)
        originals.append((module, name, original))
    try:
        yield timer
    finally:
        for module, name, original in originals:
            setattr(module, name, original)


def _database_probe(count: int) -> dict[str, list[float]]:
    """Round trips to the benchmark's PostgreSQL: a read (back to back, and after a model call's length of
    idle), and a one-row committed write with the server's settings (`synchronous_commit = on`: the commit
    waits for the WAL to reach the disk) and without that wait, in a scratch table that is dropped
    afterwards."""
    from django.db import connection

    timings: dict[str, list[float]] = defaultdict(list)
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE bench_commit_probe (id bigserial PRIMARY KEY, payload text)")
        try:
            for key, statement in (
                ("read", "SELECT 1"),
                ("read_idle", "SELECT 1"),
                ("commit", "INSERT INTO bench_commit_probe (payload) VALUES ('x')"),
                ("commit_async", "INSERT INTO bench_commit_probe (payload) VALUES ('x')"),
            ):
                if key == "commit_async":
                    cursor.execute("SET synchronous_commit = off")
                for _ in range(count):
                    if key == "read_idle":
                        time.sleep(STUB_LATENCY_MS / 1000)  # the idle of a model call; not timed
                    started = time.perf_counter()
                    cursor.execute(statement)
                    timings[key].append((time.perf_counter() - started) * 1000)
            cursor.execute("RESET synchronous_commit")
        finally:
            cursor.execute("DROP TABLE bench_commit_probe")
    return timings


def _inprocess(report: Report, fixtures: Fixtures, count: int) -> None:
    from django.db import connection
    from django.test import Client

    client = Client(headers={"Authorization": f"Bearer {fixtures.raw_key}"}, SERVER_NAME="127.0.0.1")
    texts = Requests(seed=21)

    def ask() -> Any:
        body = {
            "model": f"agent/{fixtures.adaptive.slug}",
            "messages": [{"role": "user", "content": texts.simple()}],
            "variables": {"company": COMPANY},
        }
        return client.post("/v1/chat/completions", data=json.dumps(body), content_type="application/json")

    for _ in range(20):
        ask()
    stages: dict[str, list[float]] = defaultdict(list)
    tiers: Counter[str] = Counter()
    last_statements: list[str] = []
    with _stages_timed() as timer:
        for _ in range(count):
            captured = QueryTimer()
            statements = Captured()
            started = time.perf_counter()
            with connection.execute_wrapper(captured), connection.execute_wrapper(statements):
                response = ask()
            total = (time.perf_counter() - started) * 1000
            taken = timer.take()
            tier = response.headers.get("X-Keel-Tier") if response.status_code == 200 else str(response.status_code)
            tiers[tier or "none"] += 1
            if tier != "single_call":
                continue
            stages["whole"].append(total)
            stages["own"].append(total - taken.get("routing.providers.completion", 0.0))
            for key, value in taken.items():
                stages[key].append(value)
            stages["queries"].append(float(len(captured.milliseconds)))
            stages["query_ms"].append(sum(captured.milliseconds))
            last_statements = [sql for sql, _ in statements.statements]

    report.line("#### Where the gateway's time goes (adaptive agent, in process, no gunicorn)")
    report.line()
    report.line(
        f"{count} requests through Django's test client in the benchmark's process (URLconf, middleware, key "
        "auth, the view; no HTTP server), each stage timed by wrapping its module function; only requests "
        f"answered by the single-call tier count (tiers: {dict(tiers.most_common())}). The stages nest: `_plan` "
        "holds `_policy`, `request_embed`, `routing_neighbours`, `route` and `_decision_span`; "
        "`providers.completion` holds `openai_compatible.chat` (the stub is called without litellm), which "
        "holds the stub's 20 ms. `_record` closes "
        "the trace and hands the writes to the write-behind thread (config/write_behind.py), as `make run` "
        "does; `_store` (the decision and the spans, in one transaction) holds `ingest_spans_accept`, and "
        "both are timed in that thread while the requests go on, so they are not part of Keel's own time."
    )
    report.line()
    rows: list[list[object]] = [
        ["whole request (test client)", len(stages["whole"]), *_distribution(stages["whole"])],
        ["whole − `providers.completion` (Keel's own)", len(stages["own"]), *_distribution(stages["own"])],
    ]
    for module_name, name in STAGES:
        values = stages.get(f"{module_name}.{name}", [])
        if values:
            rows.append([f"`{module_name}.{name}`", len(values), *_distribution(values)])
    rows.append(["SQL statements per request (count)", len(stages["queries"]), *_distribution(stages["queries"])])
    rows.append(
        [
            "SQL time per request (ms, in the database driver)",
            len(stages["query_ms"]),
            *_distribution(stages["query_ms"]),
        ]
    )
    report.table(["stage", "requests", "p50 ms", "p95 ms", "p99 ms", "max ms"], rows)
    probe = _database_probe(max(50, count))
    report.line(
        "The database from this process, same socket, autocommit: `SELECT 1` p50 "
        f"{_ms(probe['read'], 0.5)} ms, p99 {_ms(probe['read'], 0.99)} ms back to back, and p50 "
        f"{_ms(probe['read_idle'], 0.5)} ms, p99 {_ms(probe['read_idle'], 0.99)} ms each after "
        f"{STUB_LATENCY_MS:g} ms of idle (as the neighbour search runs: a model call after the request's last "
        "statement); a one-row INSERT and its commit p50 "
        f"{_ms(probe['commit'], 0.5)} ms, p99 {_ms(probe['commit'], 0.99)} ms (the server's "
        "`synchronous_commit = on`: the commit waits for the WAL to reach the disk); the same with "
        f"`synchronous_commit = off` p50 {_ms(probe['commit_async'], 0.5)} ms, "
        f"p99 {_ms(probe['commit_async'], 0.99)} ms."
    )
    report.line()
    report.line("The SQL statements of one single-call request, in order (first 110 characters):")
    report.code("\n".join(" ".join(sql.split())[:110] for sql in last_statements))

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(count):
        ask()
    profiler.disable()
    output = io.StringIO()
    stats = pstats.Stats(profiler, stream=output)
    stats.sort_stats("cumulative").print_stats(
        r"routing/|tracing/|agent_registry/|config/|httpx/_client|litellm/(main|utils|cost)", 40
    )
    text = output.getvalue()
    report.line(f"cProfile of {count} more requests (cumulative; Keel's modules, httpx's and litellm's entry points):")
    report.code(text[text.find("   ncalls") :] if "   ncalls" in text else text)
    by_own = io.StringIO()
    pstats.Stats(profiler, stream=by_own).sort_stats("tottime").print_stats(25)
    text = by_own.getvalue()
    report.line("The same profile by own time (all modules), top 25:")
    report.code(text[text.find("   ncalls") :] if "   ncalls" in text else text)


# --- Phase 4: the router ---------------------------------------------------------------------------------------


def _router(report: Report, fixtures: Fixtures, size: Size) -> None:
    from agent_registry.models import Agent
    from routing import cache, gateway, router, selectors
    from routing import embedding as embedder

    agent = Agent.objects.select_related("current_requirements").get(pk=fixtures.adaptive.pk)
    config = selectors.router_config_find(agent=agent)
    single_agent = Agent.objects.select_related("current_requirements").get(pk=fixtures.single_level.pk)
    single_policy, _ = gateway._policy(single_agent, selectors.router_config_find(agent=single_agent))
    texts = Requests(seed=31)
    conversations = [texts.conversation() for _ in range(size.router_requests)]
    warmup = min(100, size.router_requests // 10)

    timings: dict[str, list[float]] = defaultdict(list)
    tiers: Counter[str] = Counter()
    methods: Counter[str] = Counter()
    neighbour_counts = []
    for number, messages in enumerate(conversations):
        clock = time.perf_counter
        started = clock()
        policy, _ = gateway._policy(agent, config)
        policy_built = clock()
        text = router.request_text(messages)[: gateway.REQUEST_TEXT_LIMIT]
        vector = embedder.embed_offline(text)
        embedded = clock()
        cache.request_embed(text=text, target=None)
        request_embedded = clock()
        neighbours = selectors.routing_neighbours(agent=agent, embedding=vector, limit=policy.neighbours)
        found = clock()
        request = router.Request(messages=messages, has_tools=False)
        decision = router.route(request, policy, neighbours)
        routed = clock()
        router.route(request, policy, [])
        cold = clock()
        router.route(request, single_policy, [])
        single = clock()
        if number < warmup:
            continue
        timings["policy"].append((policy_built - started) * 1000)
        timings["embed"].append((embedded - policy_built) * 1000)
        timings["request_embed"].append((request_embedded - embedded) * 1000)
        timings["neighbours"].append((found - request_embedded) * 1000)
        timings["route"].append((routed - found) * 1000)
        timings["route_cold"].append((cold - routed) * 1000)
        timings["route_single"].append((single - cold) * 1000)
        timings["embed_route"].append((embedded - policy_built + routed - found) * 1000)
        timings["decision"].append((embedded - started + routed - request_embedded) * 1000)
        tiers[decision.tier] += 1
        methods[decision.method] += 1
        neighbour_counts.append(len(neighbours))

    measured = len(conversations) - warmup
    report.line("#### Router decision time (in process, Keel stopped)")
    report.line()
    report.line(
        f"{measured} generated support requests (after {warmup} warm-up), 60 % simple and 40 % with amounts, "
        "stakes, difficulty cues or rules, a sixth of them multi-turn; the adaptive agent's policy (four tiers, "
        f"learned signal, 2 requirements rules, 2 router rules, 2 intents); {NEIGHBOURS} neighbours from "
        f"{size.past_decisions:,} past decisions with known quality."
    )
    report.line()
    labels = (
        ("route", f"`router.route`, {NEIGHBOURS} neighbours (the target: excludes the embedding)"),
        ("route_cold", "`router.route`, no neighbours (cold start)"),
        ("route_single", "`router.route`, single-level policy"),
        ("embed", "`embedding.embed_offline` (the offline embedder)"),
        ("request_embed", "`cache.request_embed`, no target (offline)"),
        ("embed_route", "offline embedding + `router.route` (the target with the offline embedder)"),
        ("neighbours", f"`selectors.routing_neighbours`, k = {NEIGHBOURS}, {size.past_decisions:,} decisions"),
        ("policy", "`gateway._policy` (built per request)"),
        ("decision", "policy + embedding + neighbours + route (the gateway's whole decision)"),
    )
    rows = []
    for key, label in labels:
        values = timings[key]
        target = ""
        if key in ("route", "embed_route"):
            target = _verdict(percentile(values, 0.99), ROUTER_P99_TARGET) + " at p99"
        rows.append([label, *_distribution(values), target])
    report.table(["measured", "p50 ms", "p95 ms", "p99 ms", "max ms", "target (issue 5)"], rows)
    report.line(
        f"Decisions: tiers {dict(tiers.most_common())}; methods {dict(methods.most_common())}; neighbours "
        f"returned p50 {percentile([float(n) for n in neighbour_counts], 0.5):.0f}, "
        f"min {min(neighbour_counts, default=0)}."
    )
    report.line()
    probe = embedder.embed_offline(texts.simple())
    plans = _explain(lambda: selectors.routing_neighbours(agent=agent, embedding=probe, limit=NEIGHBOURS))
    _plans_report(report, "`routing_neighbours`", plans, "routingdecision_embedding")


# --- Phase 5: the cache ----------------------------------------------------------------------------------------


@dataclass
class Scope:
    agent: Any
    target: Any
    system_hash: str
    size: int
    texts: list[str] = field(default_factory=list)


def _cache_load(fixtures: Fixtures, sizes: Sequence[int]) -> tuple[list[Scope], dict[str, float]]:
    from django.utils import timezone

    from agent_registry import services as registry
    from agent_registry.models import User
    from config import crypto
    from routing import cache
    from routing import embedding as embedder
    from routing.models import CacheEntry, ModelTarget

    owner = User.objects.get(username="bench-owner")
    other = registry.workspace_create(slug="bench-other", name="Benchmark (second workspace)", owner=owner)
    workspaces = [fixtures.workspace, other]
    targets = {
        workspace.pk: ModelTarget.objects.get_or_create(
            workspace=workspace,
            alias="stub-chat",
            defaults={
                "model": "openai/stub",
                "api_base": fixtures.api_base,
                "api_key_encrypted": crypto.encrypt("sk-bench-stub"),
            },
        )[0]
        for workspace in workspaces
    }
    scopes = []
    for number, entries in enumerate(sizes):
        workspace = workspaces[number % 2]
        agent = registry.agent_create(workspace=workspace, slug=f"cached-{number}", name=f"Cached {number}")
        system = cache.system_hash(f"single_call\nYou are support agent {number}.")
        scopes.append(Scope(agent, targets[workspace.pk], system, entries))

    texts = Requests(seed=41)
    now = timezone.now()
    started = time.perf_counter()
    embed_seconds = 0.0

    def rows() -> Iterator[Sequence[object]]:
        nonlocal embed_seconds
        # Every stored request is distinct: a cache stores a request only when it missed, and thousands of
        # identical vectors (templates without slots) would make a pathological HNSW graph.
        seen: set[str] = set()
        for scope in scopes:
            for _ in range(scope.size):
                text = texts.any()
                while text in seen:
                    text = texts.any()
                seen.add(text)
                scope.texts.append(text)
                embedding_started = time.perf_counter()
                vector = embedder.embed_offline(text)
                embed_seconds += time.perf_counter() - embedding_started
                yield (
                    scope.agent.workspace_id,
                    scope.agent.pk,
                    scope.target.pk,
                    None,
                    scope.system_hash,
                    text,
                    cache.request_hash(text),
                    _vector_text(vector),
                    json.dumps({"message": {"role": "assistant", "content": "Cached answer."}}),
                    "0" * 32,
                    0,
                    now,
                    now + timedelta(days=1),
                )

    columns = (
        "workspace_id",
        "agent_id",
        "model_target_id",
        "prompt_version_id",
        "system_hash",
        "request_text",
        "request_hash",
        "embedding",
        "response",
        "trace_id",
        "hit_count",
        "created_at",
        "expires_at",
    )
    with _hnsw_rebuilt_after(CacheEntry._meta.db_table) as timings:
        _copy_rows(CacheEntry, columns, rows())
    timings["load_seconds"] = time.perf_counter() - started - timings["index_seconds"]
    timings["embed_seconds"] = embed_seconds
    return scopes, timings


def _drop_a_word(text: str, pick: random.Random) -> str:
    words = text.split()
    candidates = [i for i, word in enumerate(words) if len(word) > 3 and not any(c.isdigit() for c in word)]
    if candidates:
        del words[pick.choice(candidates)]
    return " ".join(words)


def _cache(report: Report, fixtures: Fixtures, size: Size) -> None:
    from routing import cache
    from routing import embedding as embedder

    _progress(f"cache: loading {sum(size.cache_scopes):,} entries")
    scopes, timings = _cache_load(fixtures, size.cache_scopes)
    limit = getattr(cache, "EXACT_SCAN_LIMIT", None)
    by_size: dict[int, list[Scope]] = defaultdict(list)
    for scope in scopes:
        by_size[scope.size].append(scope)
    pick = random.Random(51)  # noqa: S311 - test data, not security
    texts = Requests(seed=52)
    planned = []
    for _ in range(size.cache_lookups + 50):
        scope = pick.choice(by_size[pick.choice(sorted(by_size))])
        roll = pick.random()
        if roll < 0.4:
            kind, text = (
                "stored request, other case and punctuation",
                pick.choice(scope.texts).upper().rstrip("?.") + "!!",
            )
        elif roll < 0.6:
            kind, text = "stored request, one word dropped", _drop_a_word(pick.choice(scope.texts), pick)
        else:
            # A booking reference of its own keeps a generated request from repeating a stored one word
            # for word (the templates are few).
            kind, text = "newly generated request", f"{texts.any()} (booking ref B{pick.randint(10**5, 10**6)})"
        planned.append((scope, kind, text, embedder.embed_offline(text)))

    def lookup(scope: Scope, text: str, vector: list[float]) -> tuple[Any, float] | None:
        # As the gateway looks up: with the request's text, which finds an exact repeat by its hash first.
        return cache.cache_lookup(
            agent=scope.agent,
            model_target=scope.target,
            prompt_version=None,
            system_prompt_hash=scope.system_hash,
            embedding=vector,
            threshold=CACHE_THRESHOLD,
            request_text=text,
        )

    for scope, _, text, vector in planned[:50]:
        lookup(scope, text, vector)
    _progress(f"cache: {size.cache_lookups} look-ups")
    results: list[tuple[Scope, str, float, bool, float | None]] = []
    for scope, kind, text, vector in planned[50:]:
        started = time.perf_counter()
        found = lookup(scope, text, vector)
        elapsed = (time.perf_counter() - started) * 1000
        results.append((scope, kind, elapsed, found is not None, found[1] if found else None))

    report.line(f"#### Cache look-up, {sum(size.cache_scopes):,} entries")
    report.line()
    report.line(
        f"Entries written by COPY over {len(scopes)} scopes in 2 workspaces (one agent each, prompt version "
        f"NULL), embeddings from the offline embedder on generated requests "
        f"({timings['embed_seconds']:.1f} s of embedding); the HNSW index built after the load in "
        f"{timings['index_seconds']:.1f} s, then VACUUM ANALYZE. {size.cache_lookups} `cache.cache_lookup` "
        f"calls in process (threshold {CACHE_THRESHOLD}, after 50 untimed), each with the request's text as "
        "the gateway passes it (a stored text is found by its hash before any search) and on a scope drawn by "
        "size class: 40 % a stored request in other case and punctuation, 20 % a stored request with one word "
        "dropped, 40 % new requests, so none is a repeat word for word and every look-up searches. Scopes of "
        f"up to {limit if limit is not None else '?'} entries are searched exactly, "
        "larger ones through the HNSW index (`cache.EXACT_SCAN_LIMIT`)."
    )
    report.line()
    all_times = [elapsed for _, _, elapsed, _, _ in results]
    rows: list[list[object]] = [
        [
            "all",
            len(all_times),
            *_distribution(all_times),
            _verdict(percentile(all_times, 0.99), CACHE_P99_TARGET) + " at p99",
        ]
    ]
    for entries in sorted(by_size, reverse=True):
        values = [elapsed for scope, _, elapsed, _, _ in results if scope.size == entries]
        plan = "" if limit is None else ("exact" if entries <= limit else "HNSW")
        rows.append([f"scope of {entries:,} ({plan})", len(values), *_distribution(values), ""])
    for kind in (
        "stored request, other case and punctuation",
        "stored request, one word dropped",
        "newly generated request",
    ):
        values = [elapsed for _, k, elapsed, _, _ in results if k == kind]
        rows.append([kind, len(values), *_distribution(values), ""])
    report.table(["look-ups", "n", "p50 ms", "p95 ms", "p99 ms", "max ms", "target (issue 5)"], rows)
    hit_rows = []
    for kind in (
        "stored request, other case and punctuation",
        "stored request, one word dropped",
        "newly generated request",
    ):
        taken = [r for r in results if r[1] == kind]
        hits = [r for r in taken if r[3]]
        large = [r for r in taken if limit is not None and r[0].size > limit]
        hit_rows.append(
            [
                kind,
                len(taken),
                f"{len(hits) / len(taken):.1%}" if taken else "–",
                f"{sum(r[3] for r in large) / len(large):.1%}" if large else "–",
            ]
        )
    report.table(["look-ups", "n", "answered from the cache", "of those on HNSW scopes"], hit_rows)
    largest = max(scopes, key=lambda scope: scope.size)
    smallest = min(scopes, key=lambda scope: scope.size)
    for scope in (largest, smallest):
        # A request not stored word for word: the search runs (an exact repeat would end at the hash).
        text = scope.texts[0].upper()
        vector = embedder.embed_offline(text)
        plans = _explain(lambda scope=scope, text=text, vector=vector: lookup(scope, text, vector))  # type: ignore[misc]
        _plans_report(report, f"Look-up in the scope of {scope.size:,}", plans, "cacheentry_embedding")


# --- The run -------------------------------------------------------------------------------------------------


def run(report: Report, *, quick: bool) -> None:
    size = QUICK if quick else FULL
    clock = Stopwatch()
    database = stack.database_fresh(size.database)
    environment = stack.keel_environment(database, VAR_DIR / "broker-gateway")
    _progress(f"migrating {database.name}")
    stack.keel_migrate(environment)
    stack.django_setup(environment)

    stub_port, web_port = stack.free_port(), stack.free_port()
    api_base = f"http://127.0.0.1:{stub_port}/v1"
    stub = stack.Processes()
    stub.start(
        "stub",
        [
            sys.executable,
            "-m",
            "bench.stub_model_server",
            "--port",
            str(stub_port),
            "--latency-ms",
            f"{STUB_LATENCY_MS:g}",
        ],
        environment,
        stack.LOG_DIR / "gateway-stub.log",
    )
    try:
        if not stack.wait_for_http(stub_port, "/health", timeout=30):
            raise RuntimeError(f"the stub model server did not start; see {stack.LOG_DIR / 'gateway-stub.log'}")
        fixtures = _fixtures(api_base)
        _progress(f"loading {size.past_decisions:,} past routing decisions")
        decisions = _past_decisions(
            (fixtures.adaptive, fixtures.speculative),
            (fixtures.remote, fixtures.remote_speculative),
            size.past_decisions,
        )
        report.line(
            f"Stub model server: bench/stub_model_server.py, {STUB_LATENCY_MS:g} ms fixed latency, asyncio, own "
            f"process. Past routing decisions of the adaptive agent and of each of its three twins (speculative "
            f"single call; embedder on the stub; both): {size.past_decisions:,} each (loaded in "
            f"{decisions['load_seconds']:.1f} s, HNSW index built in {decisions['index_seconds']:.1f} s)."
        )
        report.line()
        _progress("starting Keel")
        with stack.keel_running(environment, web_port, "gateway") as keel:
            worker = Worker(keel, environment)
            figures = _http_phases(fixtures, size, web_port, stub_port, worker)
            _progress("stopping Keel")
            # The worker's backlog is drained already; a Celery warm shutdown on the filesystem broker
            # would take half a minute more.
            keel.stop(timeout=5)
        _report_http(report, figures)
        if worker.crashes or worker.lost_batches:
            report.line(
                f"**The Celery worker died {len(worker.crashes)} time(s)** during the HTTP phases and was started "
                f"again; {worker.lost_batches} span batch(es) lost their broker message and were processed by "
                "the benchmark between blocks. Last log line of each death: "
                + "; ".join(f"`{line}`" for line in worker.crashes)
            )
            report.line()
        _progress("in process")
        _inprocess(report, fixtures, size.inprocess_requests)
        _progress("router")
        _router(report, fixtures, size)
        _cache(report, fixtures, size)
    finally:
        stub.stop()
        stack.server_stop()
    report.line(f"_Whole benchmark: {clock.seconds():.0f} s._")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="every phase, small: a smoke test, not figures")
    arguments = parser.parse_args()
    run(Report("bench_gateway"), quick=arguments.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
