"""Writes of tracing: accepting ingest, turning batches into spans and trajectories, scores, retention.

OTLP requests, the bulk of ingest, are stored in the request: `ingest_otlp_accept` decodes the spans,
writes those not stored yet and re-assembles each touched trajectory while holding its row lock, and
commits before the client hears "OK", so whatever Keel acknowledged is queryable at once and survives any
crash after that point. A process stores at most KEEL_INGEST_CONCURRENCY requests at a time and lets at
most KEEL_INGEST_WAITING more wait for a turn; one that finds the line full, or cannot start within
KEEL_INGEST_MAX_QUEUE_SECONDS, is refused with 429 and Retry-After.

JSON trajectories and Keel's own spans (the gateway's) take the other way, through a queue: their
accept functions store the body as one `IngestBatch` row and commit before answering, and
`span_batch_process` runs in a worker: it claims the batch with a conditional UPDATE (so a redelivered
task is a no-op) and writes it as above. A batch whose worker died stays `processing` until its lease
expires; `ingest_batch_sweep` then hands it to another worker. An OTLP request whose spans Keel fails to
write for a reason other than the database (a bug) is kept the same way, as a batch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import logging
import re
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import orjson
import psycopg
from django.conf import settings
from django.db import InterfaceError, OperationalError, connection, transaction
from django.db.models import Exists, F, Min, OuterRef, Q, Sum
from django.utils import timezone
from django.utils.text import slugify

from agent_registry import audit
from agent_registry import selectors as registry_selectors
from agent_registry import services as registry_services
from agent_registry.exceptions import AgentSlugTaken
from agent_registry.models import Agent, AgentStatus, ApiKey, AuditAction, PromptVersion, User, Workspace
from config import dispatch
from config.config_cache import NotifiedCache, config_free_transaction
from tracing import exceptions, langfuse_bridge, otlp, pricing, selectors, signals, trajectory_json
from tracing.models import (
    LEFT_AFTER_ERROR_SIGNALS,
    UNPRICED_MODELS_KEPT,
    BatchSource,
    BatchStatus,
    IngestBatch,
    ModelPriceOverride,
    PendingScore,
    Score,
    ScoreDataType,
    ScoreSource,
    Span,
    ToolResultShape,
    Trajectory,
)
from tracing.records import RECORD_COLUMNS, json_dumps, span_from_record, span_row, trace_span_rows
from tracing.steps import Totals, TrajectoryView, trajectory_view_build, view_document_json

logger = logging.getLogger("tracing.services")

PREVIEW_LENGTH = 300


# --- Accepting ingest ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class IngestAccepted:
    batch_id: int | None
    accepted_spans: int
    rejected_spans: int
    error_message: str


@dataclass(frozen=True, slots=True)
class BacklogState:
    spans: int  # waiting in unfinished batches
    oldest_age_seconds: float  # how long the oldest of them has waited
    spans_per_second: float  # what the workers stored over the last CAPACITY_WINDOW_SECONDS


CAPACITY_WINDOW_SECONDS = 10


class _Backlog:
    """The ingest queue's state, read at most once a second per process: two small queries on partial
    indexes, not one per request. Until the next read, the spans the process itself let in count as
    waiting: on one stale read, its threads would otherwise let in request after request (at twice the
    workers' capacity, 28,000 spans in six seconds under a limit of 5,000, which then took the workers
    half a minute to store)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._value = BacklogState(0, 0.0, 0.0)
        self._read_at = 0.0
        self._admitted = 0  # spans let in by this process since the last read

    def state(self) -> BacklogState:
        with self._lock:
            return self._current()

    def admit(self, incoming: int) -> str | None:
        """Count `incoming` spans in, or return why they are refused. One step under the lock, so that
        concurrent requests of the process cannot all pass on the same state."""
        with self._lock:
            reason = _backlog_refusal(self._current(), incoming)
            if reason is None:
                self._admitted += incoming
            return reason

    def _current(self) -> BacklogState:
        now = time.monotonic()
        if now - self._read_at >= 1.0:
            self._value, self._read_at, self._admitted = self._read(), now, 0
        return dataclasses.replace(self._value, spans=self._value.spans + self._admitted)

    def _read(self) -> BacklogState:
        waiting = IngestBatch.objects.filter(status__in=(BatchStatus.PENDING, BatchStatus.PROCESSING)).aggregate(
            total=Sum("span_count"), oldest=Min("received_at")
        )
        wall = timezone.now()
        recent = wall - timedelta(seconds=CAPACITY_WINDOW_SECONDS)
        stored = IngestBatch.objects.filter(status=BatchStatus.DONE, processed_at__gt=recent).aggregate(
            total=Sum("span_count")
        )["total"]
        oldest = waiting["oldest"]
        return BacklogState(
            spans=int(waiting["total"] or 0),
            oldest_age_seconds=max(0.0, (wall - oldest).total_seconds()) if oldest is not None else 0.0,
            spans_per_second=int(stored or 0) / CAPACITY_WINDOW_SECONDS,
        )

    def reset(self) -> None:
        with self._lock:
            self._read_at = 0.0


backlog = _Backlog()


def _backlog_refusal(waiting: BacklogState, incoming: int) -> str | None:
    """Why `incoming` more spans are refused, or None. Keel refuses rather than queue more than the
    workers can store within KEEL_INGEST_MAX_QUEUE_SECONDS at the rate they have just shown: that
    bound, not a fixed count, is what keeps time-to-queryable short under overload. A floor lets bursts
    into an idle system (whose recent rate says nothing), and KEEL_INGEST_BACKLOG_SPANS caps everything."""
    max_seconds: float = settings.KEEL_INGEST_MAX_QUEUE_SECONDS
    capacity = max(waiting.spans_per_second * max_seconds, float(settings.KEEL_INGEST_BACKLOG_FLOOR_SPANS))
    limit = min(capacity, float(settings.KEEL_INGEST_BACKLOG_SPANS))
    # An empty queue takes any request the body limit lets through: refusing it could never succeed.
    if waiting.spans and waiting.spans + incoming > limit:
        return (
            f"{waiting.spans} spans are waiting; the workers store about {waiting.spans_per_second:,.0f} spans/s, "
            f"so Keel queues at most {limit:,.0f}"
        )
    if waiting.oldest_age_seconds > max_seconds:
        return f"the oldest waiting batch has waited {waiting.oldest_age_seconds:.1f} s (limit {max_seconds:g} s)"
    return None


def _backlog_check(incoming: int) -> None:
    """Let `incoming` spans into the queue, or raise IngestBacklogFull (429 with Retry-After)."""
    reason = backlog.admit(incoming)
    if reason is not None:
        raise exceptions.IngestBacklogFull(
            f"{reason}; retry shortly", retry_after=settings.KEEL_INGEST_RETRY_AFTER_SECONDS
        )


def _batch_store(
    *, api_key: ApiKey, source: str, content_type: str, content_encoding: str, body: bytes, span_count: int
) -> int:
    """Store a request body as a pending batch; returns its id. The worker is told once it is committed."""
    from tracing import tasks  # tasks import services; import the module here, as STYLE.md says

    with transaction.atomic():
        connection.ensure_connection()
        # A server-side-binding psycopg cursor sends the body as a binary parameter; Django's cursors
        # bind on the client and would spell a megabyte of protobuf out as hex for PostgreSQL to parse.
        with psycopg.Cursor(connection.connection) as cursor:
            cursor.execute(
                "INSERT INTO tracing_ingestbatch (workspace_id, api_key_id, source, content_type, content_encoding,"
                " body, span_count, status, attempts, error) VALUES (%s, %s, %s, %s, %s, %b, %s, 'pending', 0, '')"
                " RETURNING id",
                [api_key.workspace_id, api_key.pk, source, content_type, content_encoding, body, span_count],
            )
            row = cursor.fetchone()
        assert row is not None
        batch_id: int = row[0]
        dispatch.task_send_on_commit(tasks.span_batch_process, batch_id)
    return batch_id


def _spans_per_request_check(count: int) -> None:
    """Refuse (413) a request of more spans than one request may hold. Storing a request (in the web
    process, or a batch in a worker) builds every span of it and of its trajectories at once, so an
    unbounded count is unbounded memory: 16 MB of tiny spans is about 330,000 of them, and one trace of
    that many took 7 GB to store."""
    limit: int = settings.KEEL_INGEST_MAX_SPANS_PER_REQUEST
    if count > limit:
        raise exceptions.IngestPayloadTooLarge(
            f"the request holds {count:,} spans; send at most {limit:,} per request (split the batch)"
        )


class _IngestGate:
    """How many OTLP requests of this process decode and store at once (KEEL_INGEST_CONCURRENCY), and how
    many may wait for a turn (KEEL_INGEST_WAITING), each at most KEEL_INGEST_MAX_QUEUE_SECONDS. A request
    that finds the line full, or waits out its time, is refused: it waits where its client can see it fail
    and retry, not in a queue that grows past what Keel can store. Every request in Keel holds a web
    thread, so the line is short: with gunicorn's 4 threads, 2 storing and 1 waiting leave one for the
    dashboard and the gateway, whose requests would otherwise queue behind ingest in gunicorn. The one
    waiting is ready the moment the turn frees. Two turns per process keep both cores busy: with one, a
    process whose request waits for PostgreSQL (its COPY, its commit) has nothing else to run, and the two
    cores idled 8-10 % of the time, against 4-5 % with two (bench_ingest, one session, taking turns: 8,208
    and 9,245 spans/s stored with 1, 9,433 and 9,761 with 2). A third turn (and a fifth thread) stored
    less, 6,924 against 7,991 with 2 in the run after it (both decoding before the turn): the turns
    contend for the interpreter lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slots: tuple[int, threading.BoundedSemaphore] | None = None
        self._waiting = 0

    def _semaphore(self) -> tuple[int, threading.BoundedSemaphore]:
        concurrency: int = settings.KEEL_INGEST_CONCURRENCY
        with self._lock:
            if self._slots is None or self._slots[0] != concurrency:
                self._slots = (concurrency, threading.BoundedSemaphore(concurrency))
            return self._slots

    @property
    def waiting(self) -> int:
        """Requests of this process waiting for a turn now."""
        with self._lock:
            return self._waiting

    def _refusal(self, reason: str) -> exceptions.IngestBacklogFull:
        return exceptions.IngestBacklogFull(
            f"{reason}; retry shortly", retry_after=settings.KEEL_INGEST_RETRY_AFTER_SECONDS
        )

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """Hold one of the process's turns; raises IngestBacklogFull when the line is full or none came in time."""
        concurrency, semaphore = self._semaphore()
        if not semaphore.acquire(blocking=False):
            with self._lock:
                if self._waiting >= settings.KEEL_INGEST_WAITING:
                    waiting = self._waiting
                    raise self._refusal(
                        f"the line for a turn to store a request is full ({concurrency} storing, {waiting} waiting)"
                    )
                self._waiting += 1
            wait: float = settings.KEEL_INGEST_MAX_QUEUE_SECONDS
            try:
                if not semaphore.acquire(timeout=wait):
                    raise self._refusal(f"every turn to store a request stayed taken for {wait:g} s")
            finally:
                with self._lock:
                    self._waiting -= 1
        try:
            yield
        finally:
            semaphore.release()


ingest_gate = _IngestGate()


@contextlib.contextmanager
def _otlp_errors() -> Iterator[None]:
    """tracing.otlp's errors about a body, as Keel's ingest errors."""
    try:
        yield
    except otlp.UnsupportedContentType as error:
        raise exceptions.IngestContentTypeUnsupported(str(error)) from None
    except otlp.PayloadTooLarge as error:
        raise exceptions.IngestPayloadTooLarge(str(error)) from None
    except otlp.OtlpError as error:
        raise exceptions.IngestPayloadInvalid(str(error)) from None


def _otlp_accepted(summary: otlp.ExportSummary) -> int:
    """How many spans of the request can be stored; raises when none can or too many came at once."""
    accepted = summary.accepted_spans
    if not accepted and summary.rejected_spans:
        # Nothing in the request can be stored: that is a bad request, not a partial success.
        raise exceptions.IngestPayloadInvalid(f"no span can be stored: {summary.error_message}")
    if accepted:
        _spans_per_request_check(accepted)
    return accepted


def ingest_otlp_accept(*, api_key: ApiKey, body: bytes, content_type: str, content_encoding: str) -> IngestAccepted:
    """Decode an OTLP/HTTP export request and store its spans and trajectories before returning what was
    accepted and rejected (`batch_id` is None: no worker is involved).

    Raises IngestContentTypeUnsupported, IngestPayloadInvalid, IngestPayloadTooLarge (a body past the
    decompressed limit, or more than KEEL_INGEST_MAX_SPANS_PER_REQUEST spans) or IngestBacklogFull (no
    turn came in time), having stored nothing, and the database's OperationalError or InterfaceError when
    it went away (nothing is stored: the client retries).
    """
    # The turn comes first: a request refused for want of one costs no decoding (5 ms for a body of 500
    # spans), and under load a fifth to a quarter of the requests are refused and sent again (bench_ingest).
    with ingest_gate.turn():
        with _otlp_errors():
            request = otlp.decode_request(
                body,
                content_type,
                content_encoding or None,
                max_decompressed_bytes=settings.KEEL_MAX_DECOMPRESSED_BYTES,
                max_attribute_length=settings.KEEL_MAX_ATTRIBUTE_LENGTH,
            )
        accepted = _otlp_accepted(request.summary)
        if not accepted:
            return IngestAccepted(None, 0, 0, "")
        if not _spans_stored(api_key, lambda: otlp.map_spans(request.spans), accepted):
            # The request is kept as a batch, and acknowledged as stored, for a worker to try (and, failing,
            # for a person to replay).
            return ingest_otlp_defer(
                api_key=api_key, body=body, content_type=content_type, content_encoding=content_encoding
            )
    return IngestAccepted(None, accepted, request.rejected_spans, request.error_message)


def _spans_stored(api_key: ApiKey, spans: Callable[[], Sequence[otlp.Span]], count: int) -> bool:
    """Map, write and assemble the spans in a savepoint; False (logged, nothing written) after an error in
    mapping or assembly, a bug that a retry would meet again. A database error propagates: nothing is
    written, and the caller's client retries."""
    try:
        with config_free_transaction():
            spans_write(workspace=api_key.workspace, api_key=api_key, spans=spans())
        return True
    except (OperationalError, InterfaceError):
        raise
    except Exception:
        logger.exception("tracing.ingest_deferred", extra={"spans": count})
        return False


def ingest_otlp_defer(*, api_key: ApiKey, body: bytes, content_type: str, content_encoding: str) -> IngestAccepted:
    """Validate an OTLP/HTTP export request and store it as a batch for a worker; returns what was
    accepted and rejected, with the batch's id. Raises as `ingest_otlp_accept` does, the backlog's
    IngestBacklogFull included."""
    with _otlp_errors():
        # Counts and errors exactly as the worker's full decode will see them, at a fraction of its cost.
        summary = otlp.validate_request(
            body, content_type, content_encoding or None, max_decompressed_bytes=settings.KEEL_MAX_DECOMPRESSED_BYTES
        )
    accepted = _otlp_accepted(summary)
    if not accepted:
        return IngestAccepted(None, 0, 0, "")
    _backlog_check(accepted)
    batch_id = _batch_store(
        api_key=api_key,
        source=BatchSource.OTLP,
        content_type=content_type,
        content_encoding=content_encoding,
        body=body,
        span_count=accepted,
    )
    return IngestAccepted(batch_id, accepted, summary.rejected_spans, summary.error_message)


def ingest_trajectories_accept(*, api_key: ApiKey, payload: Any) -> tuple[IngestAccepted, list[str]]:
    """Validate JSON trajectories and store them; returns the acceptance and each trajectory's trace id."""
    try:
        documents = trajectory_json.documents_parse(payload)
    except trajectory_json.TrajectoryJsonError as error:
        raise exceptions.TrajectoryFormatInvalid(str(error), errors=error.errors) from None
    received = timezone.now()
    for document in documents:
        # Fix the id before the time of receipt enters the document: a retry must map to the same trace.
        document.trace_id = trajectory_json.document_trace_id(document)
        if document.started_at is None:
            document.started_at = received
    spans = [span for document in documents for span in trajectory_json.document_spans(document)]
    trace_ids = list(dict.fromkeys(span.trace_id for span in spans))
    _spans_per_request_check(len(spans))
    _backlog_check(len(spans))
    body = orjson.dumps([document.model_dump(mode="json") for document in documents])
    batch_id = _batch_store(
        api_key=api_key,
        source=BatchSource.JSON,
        content_type="application/json",
        content_encoding="",
        body=body,
        span_count=len(spans),
    )
    return IngestAccepted(batch_id, len(spans), 0, ""), trace_ids


def ingest_spans_accept(*, api_key: ApiKey, spans: Sequence[otlp.Span]) -> int | None:
    """Store spans that Keel itself produced (the gateway's) and assemble their trajectories; returns None,
    or the id of the batch they were kept in instead.

    No back-pressure check: the request these spans describe has already been served, and its record
    must not be refused. Runs in the caller's transaction. A database error propagates (nothing is
    written; the caller retries). Any other error is a bug in mapping or assembly, which a retry would
    meet again: the spans are then kept as a pending batch, as durable as any other, for a worker to try.
    """
    if _spans_stored(api_key, lambda: spans, len(spans)):
        return None
    body = orjson.dumps([_span_document(span) for span in spans])
    return _batch_store(
        api_key=api_key,
        source=BatchSource.SPANS,
        content_type="application/json",
        content_encoding="",
        body=body,
        span_count=len(spans),
    )


def _span_document(span: otlp.Span) -> dict[str, Any]:
    *columns, data = span_row(span)
    document = dict(zip(RECORD_COLUMNS, columns, strict=True))
    document["cost_usd"] = None if document["cost_usd"] is None else str(document["cost_usd"])
    document["data"] = data
    return document


def _span_from_document(document: dict[str, Any]) -> otlp.Span:
    data = orjson.loads(document.pop("data"))
    if document.get("cost_usd") is not None:
        document["cost_usd"] = Decimal(document["cost_usd"])
    return span_from_record(document, data)


# --- Processing batches ----------------------------------------------------------------------------


class BatchInterrupted(Exception):
    """The database failed while this worker held the batch. `attempt` names its claim, which the retry
    takes back (`held=`) instead of waiting for the lease to run out and the sweeper to send the batch
    again; meanwhile the batch would count as the oldest waiting one and hold ingest at 429."""

    def __init__(self, batch_id: int, attempt: int, error: Exception) -> None:
        super().__init__(f"batch {batch_id}, attempt {attempt}: {type(error).__name__}: {error}")
        self.attempt = attempt


def _batch_claim(batch_id: int, held: int | None = None) -> IngestBatch | None:
    lease = timezone.now() - timedelta(seconds=settings.KEEL_INGEST_LEASE_SECONDS)
    claimable = Q(status=BatchStatus.PENDING) | Q(status=BatchStatus.PROCESSING, claimed_at__lt=lease)
    if held is not None:
        # The caller's own claim: had anyone claimed the batch since, `attempts` would have moved on.
        claimable |= Q(status=BatchStatus.PROCESSING, attempts=held)
    # One transaction: a claim whose row could not be read back is not left behind.
    with transaction.atomic():
        claimed = IngestBatch.objects.filter(claimable, pk=batch_id).update(
            status=BatchStatus.PROCESSING, claimed_at=timezone.now(), attempts=F("attempts") + 1
        )
        if not claimed:
            return None
        return IngestBatch.objects.select_related("workspace", "api_key").defer("body").get(pk=batch_id)


def _batch_body(batch_id: int) -> bytes:
    # Binary results: Django's text protocol would bring the body back as hex to decode.
    with psycopg.Cursor(connection.connection) as cursor:
        cursor.execute("SELECT body FROM tracing_ingestbatch WHERE id = %s", [batch_id], binary=True)
        row = cursor.fetchone()
    assert row is not None
    return bytes(row[0])


def _batch_spans(batch: IngestBatch) -> list[otlp.Span]:
    body = _batch_body(batch.pk)
    if batch.source == BatchSource.JSON:
        documents = trajectory_json.documents_parse(orjson.loads(body))
        return [span for document in documents for span in trajectory_json.document_spans(document)]
    if batch.source == BatchSource.SPANS:
        return [_span_from_document(document) for document in orjson.loads(body)]
    request = otlp.decode_request(
        body,
        batch.content_type,
        batch.content_encoding or None,
        max_decompressed_bytes=settings.KEEL_MAX_DECOMPRESSED_BYTES,
        max_attribute_length=settings.KEEL_MAX_ATTRIBUTE_LENGTH,
    )
    return otlp.map_spans(request.spans)


def span_batch_process(*, batch_id: int, held: int | None = None) -> int:
    """Turn a stored batch into spans and trajectories; returns how many spans were new.

    Idempotent: a batch that is done, or claimed by a live worker, is skipped; spans already stored
    are not written again. `held` is the attempt of a claim this caller made before the database failed
    (BatchInterrupted), which it may take back.
    """
    batch = _batch_claim(batch_id, held)
    if batch is None:
        return 0
    try:
        try:
            spans = _batch_spans(batch)
        except (otlp.OtlpError, trajectory_json.TrajectoryJsonError, ValueError) as error:
            # Validated when accepted, so this is a bug or a changed parser; keep the body for a replay.
            IngestBatch.objects.filter(pk=batch_id).update(status=BatchStatus.FAILED, error=str(error)[:2000])
            logger.error("tracing.batch_undecodable", extra={"batch_id": batch_id, "error": str(error)})
            return 0
        with config_free_transaction():
            written = spans_write(workspace=batch.workspace, api_key=batch.api_key, spans=spans)
            IngestBatch.objects.filter(pk=batch_id).update(
                status=BatchStatus.DONE, processed_at=timezone.now(), body=b"", error=""
            )
    except (OperationalError, InterfaceError) as error:
        raise BatchInterrupted(batch_id, batch.attempts, error) from error
    return written


def ingest_batch_sweep() -> list[int]:
    """Ids of batches to hand to a worker again: pending ones whose message may be lost, and
    processing ones whose worker's lease ran out. Batches tried too often are marked failed."""
    now = timezone.now()
    lease = now - timedelta(seconds=settings.KEEL_INGEST_LEASE_SECONDS)
    stale_pending = now - timedelta(seconds=settings.KEEL_INGEST_REQUEUE_AFTER_SECONDS)
    IngestBatch.objects.filter(
        status=BatchStatus.PROCESSING, claimed_at__lt=lease, attempts__gte=settings.KEEL_INGEST_MAX_ATTEMPTS
    ).update(status=BatchStatus.FAILED, error="gave up after repeated attempts")
    return list(
        IngestBatch.objects.filter(
            Q(status=BatchStatus.PENDING, received_at__lt=stale_pending)
            | Q(status=BatchStatus.PROCESSING, claimed_at__lt=lease)
        )
        .order_by("received_at")
        .values_list("pk", flat=True)[:1000]
    )


# --- Writing spans and assembling trajectories --------------------------------------------------------

# The span table's columns as spans_write copies them, with their types: COPY in binary format sends each
# value with its length, so PostgreSQL does not scan every character of `data` for escapes as it does with
# text COPY (a fifth of its time per span was that scan).
_SPAN_COLUMNS = (
    ("workspace_id", "int8"),
    ("trajectory_id", "int8"),
    ("trace_id", "varchar"),
    ("span_id", "varchar"),
    ("parent_span_id", "varchar"),
    ("name", "varchar"),
    ("kind", "varchar"),
    ("span_type", "varchar"),
    ("status", "varchar"),
    ("status_message", "text"),
    ("start_time_ns", "int8"),
    ("end_time_ns", "int8"),
    ("model", "varchar"),
    ("tool_name", "varchar"),
    ("input_tokens", "int4"),
    ("output_tokens", "int4"),
    ("total_tokens", "int4"),
    ("cost_usd", "numeric"),
    ("prompt_version_id", "int8"),
    ("data", "text"),
    ("received_at", "timestamptz"),
)
_SPAN_COPY = f"COPY tracing_span ({', '.join(name for name, _ in _SPAN_COLUMNS)}) FROM STDIN (FORMAT BINARY)"
_SPAN_TYPES = [kind for _, kind in _SPAN_COLUMNS]


def _priced(span: otlp.Span, overrides: Mapping[str, pricing.ModelPrice]) -> otlp.Span:
    """A generation span with its cost: the one it reports, else from the workspace's prices or litellm's.

    A reported cost of 0 for a call that used tokens is read as the sender's "no price": SDKs (Langfuse's
    among them) report 0 for a model their own price map lacks (a fine-tune, a self-hosted model). It gives
    way to a price of the workspace's own, which is what such a price is set for; with no price known to Keel
    either, the call is unpriced (no cost, counted in `unpriced_calls`), not free. With litellm's price only,
    the sender's 0 stands: it may be a model served at no charge under a known name."""
    if span.span_type != "generation":
        return span
    if span.cost_usd is not None:
        if span.cost_usd != 0 or not span.model or not (span.usage.input_tokens or span.usage.output_tokens):
            return span
        if pricing.override_find(span.model, overrides) is None:
            return span if pricing.price_find(span.model) is not None else span.with_cost(None)
    usage = span.usage
    cost = pricing.generation_cost(
        span.model,
        usage.input_tokens,
        usage.output_tokens,
        usage.cache_read_tokens,
        overrides,
        cache_write_tokens=usage.cache_write_tokens,
    )
    return span if cost is None else span.with_cost(float(cost))


def _agents_by_name_read(workspace: Workspace) -> dict[str, int]:
    by_name: dict[str, int] = {}
    for agent_id, slug, name in Agent.objects.filter(workspace=workspace).values_list("pk", "slug", "name"):
        by_name.setdefault(slug.lower(), agent_id)
        by_name.setdefault(name.lower(), agent_id)
    return by_name


# What every batch of spans reads, in the transaction that stores them (config_free_transaction: it writes
# none of it, bar a draft agent it creates for a trace and adds to its own copy of the names): kept per
# process until a key, an agent, a prompt or a triage setting changes (config/config_cache.py).
_agents_by_name: NotifiedCache[int, dict[str, int]] = NotifiedCache(size=1024, in_transactions=True)
_prompt_version_rows: NotifiedCache[tuple[int, frozenset[str]], tuple[tuple[int, str, int, str | None], ...]] = (
    NotifiedCache(size=4096, in_transactions=True)
)
_signal_settings: NotifiedCache[int, signals.SignalConfig] = NotifiedCache(size=4096, in_transactions=True)


class _AgentResolver:
    """Finds the agent a trace belongs to: the one its spans name (slug or name), if the key may write
    to it; else the key's only agent; else, for a key of the whole workspace, a new draft agent."""

    def __init__(self, workspace: Workspace, api_key: ApiKey | None) -> None:
        self.workspace = workspace
        self.allowed: frozenset[int] | None = None
        if api_key is not None:
            self.allowed = registry_selectors.apikey_agent_ids_kept(api_key=api_key)
        # A copy: a draft agent created for a trace is added to it.
        self.by_name = dict(_agents_by_name.get(workspace.pk, functools.partial(_agents_by_name_read, workspace)))

    def resolve(self, name: str | None) -> int | None:
        if name:
            found = self.by_name.get(name.strip().lower())
            if found is not None and (self.allowed is None or found in self.allowed):
                return found
        if self.allowed is not None:
            return next(iter(self.allowed)) if len(self.allowed) == 1 else None
        if not name or not slugify(name):
            return None
        return self._create(name.strip())

    def _create(self, name: str) -> int:
        slug = slugify(name)[:64]
        try:
            with transaction.atomic():
                agent = registry_services.agent_create(
                    workspace=self.workspace,
                    slug=slug,
                    name=name[:200],
                    description="Created from telemetry: spans named this agent.",
                    status=AgentStatus.ACTIVE,
                )
            agent_id = agent.pk
        except AgentSlugTaken:
            agent_id = Agent.objects.get(workspace=self.workspace, slug=slug).pk
        self.by_name[slug] = self.by_name[name.lower()] = agent_id
        return agent_id


# --- Triage configuration and the tool result shape history ------------------------------------------

# A shape is history once other trajectories returned it this often: a one-off result (a rare optional
# field, a test call) must not define what the tool normally returns.
TOOL_SHAPE_HISTORY_MIN_COUNT = 5
# Distinct shapes counted per agent and tool. A tool whose result keys are data (ids, dates) has a new
# shape on every call; past this many, only the shapes already counted grow.
TOOL_SHAPE_HISTORY_MAX_SHAPES = 50


def _storable_shape(shape: Mapping[str, str]) -> dict[str, str]:
    """The shape as jsonb can hold it: no NUL characters, no lone surrogates (parsed JSON can have both)."""
    if all(key.isascii() and "\x00" not in key for key in shape):
        return dict(shape)
    return {key.encode("utf-8", "replace").decode().replace("\x00", "\ufffd"): kind for key, kind in shape.items()}


def _shape_key(shape: Mapping[str, str]) -> str:
    return hashlib.sha256(orjson.dumps(shape, option=orjson.OPT_SORT_KEYS)).hexdigest()


@dataclass(frozen=True, slots=True)
class _ShapeHistory:
    """An agent's tool result shapes counted at least TOOL_SHAPE_HISTORY_MIN_COUNT times:
    tool -> shape key -> (shape, count)."""

    shapes: Mapping[str, Mapping[str, tuple[dict[str, str], int]]]

    def for_trajectory(
        self, seen: Sequence[signals.ResultShape], counted: Collection[str] | None
    ) -> dict[str, list[Mapping[str, str]]]:
        """The history a trajectory whose results have the shapes `seen` is judged by.

        Ingest counts a trajectory's results as they arrive, so the results carried by spans of earlier
        batches (`counted`: their span ids; None: all, as on a recompute) are in the counts already. They
        are taken out again, or a trajectory repeating a changed shape would make it its own history.
        """
        tools = {result.tool_name for result in seen if result.tool_name in self.shapes}
        if not tools:
            return {}
        own: Counter[tuple[str, str]] = Counter(
            (result.tool_name, _shape_key(_storable_shape(result.shape)))
            for result in seen
            if result.tool_name in tools and (counted is None or result.span_id in counted)
        )
        history: dict[str, list[Mapping[str, str]]] = {}
        for tool_name in tools:
            shapes: list[Mapping[str, str]] = [
                shape
                for key, (shape, count) in self.shapes[tool_name].items()
                if count - own[tool_name, key] >= TOOL_SHAPE_HISTORY_MIN_COUNT
            ]
            if shapes:
                history[tool_name] = shapes
        return history


def _shape_history(agent_id: int) -> _ShapeHistory:
    return _ShapeHistory(selectors.tool_result_shape_counts(agent_id=agent_id, min_count=TOOL_SHAPE_HISTORY_MIN_COUNT))


class _SignalConfigs:
    """Each agent's triage settings and tool result history, read once per batch (the history only for
    an agent whose trajectories have tool results): the limits its requirements set (the agentic step
    limit, the latency ceiling) make `exhaustion` fire where the agent actually stops. The shapes a batch
    records count from the next batch on."""

    def __init__(self) -> None:
        self.configs: dict[int, signals.SignalConfig] = {}
        self.histories: dict[int, _ShapeHistory] = {}

    def _history(
        self, agent_id: int, seen: Sequence[signals.ResultShape], counted: Collection[str] | None
    ) -> dict[str, list[Mapping[str, str]]]:
        if not seen:
            return {}
        if agent_id not in self.histories:
            self.histories[agent_id] = _shape_history(agent_id)
        return self.histories[agent_id].for_trajectory(seen, counted)

    def report(
        self,
        agent_id: int | None,
        view: TrajectoryView,
        counted: Collection[str] | None,
        *,
        session_continues: bool = False,
    ) -> signals.SignalReport:
        """The trajectory's signals, judged by its agent's configuration and tool result history (see
        `_ShapeHistory.for_trajectory` for `counted`); the report carries the shapes of its results.
        `session_continues`: the trajectory's session has a later trajectory (see `signals_compute`)."""
        if agent_id is None:
            return signals.signals_compute(view, session_continues=session_continues)
        if agent_id not in self.configs:
            self.configs[agent_id] = _signal_settings.get(
                agent_id, functools.partial(_signal_settings_for_agent, agent_id)
            )
        return signals.signals_compute(
            view,
            self.configs[agent_id],
            session_continues=session_continues,
            tool_result_history=lambda seen: self._history(agent_id, seen, counted),
        )


def signal_config_for_agent(agent_id: int) -> signals.SignalConfig:
    """The agent's triage configuration: the limits its requirements set (the agentic step limit, the
    latency ceiling), then what its `TriageSettings` change (phrases, language, weights, thresholds,
    token limits, hand-off tools; merged by tracing.triage_config), and the history of its tools'
    result shapes (each shape counted at least TOOL_SHAPE_HISTORY_MIN_COUNT times)."""
    config = _signal_settings_for_agent(agent_id)
    history = _shape_history(agent_id)
    if not history.shapes:
        return config
    return dataclasses.replace(
        config,
        tool_result_shapes={
            tool_name: [shape for shape, _ in counted.values()] for tool_name, counted in history.shapes.items()
        },
    )


def _signal_settings_for_agent(agent_id: int) -> signals.SignalConfig:
    from tracing import triage_config
    from tracing.models import TriageSettings

    config = signals.DEFAULT_CONFIG
    version_id = Agent.objects.filter(pk=agent_id).values_list("current_requirements_id", flat=True).first()
    # Parsed once per requirements version and process (versions are immutable), not for every batch.
    parsed = None if version_id is None else registry_selectors.requirements_version_parsed(version_id)
    derived = None if version_id is None else registry_selectors.requirements_version_derived(version_id)
    if parsed is not None and derived is not None:
        budgets = {budget["tier"]: budget for budget in derived.tier_budgets.value}
        agentic = budgets.get("agentic")
        config = signals.SignalConfig(
            max_steps=agentic["max_steps"] if agentic else None,
            time_budget_seconds=parsed.constraints.latency.hard_ceiling_ms / 1000,
        )
    settings_row = TriageSettings.objects.filter(agent_id=agent_id).first()
    if settings_row is None:
        return config
    return triage_config.signal_config_build(
        config,
        language=settings_row.language,
        phrases=settings_row.phrases,
        weights=settings_row.weights,
        thresholds=settings_row.thresholds,
        limits=settings_row.limits,
        handoff_tools=settings_row.handoff_tools,
    )


def _prompt_version_rows_read(
    workspace: Workspace, names: frozenset[str]
) -> tuple[tuple[int, str, int, str | None], ...]:
    """(version id, prompt name, version, label or None) of every version of the workspace's prompts named."""
    return tuple(
        PromptVersion.objects.filter(prompt__workspace=workspace, prompt__name__in=names).values_list(
            "pk", "prompt__name", "version", "labels__name"
        )
    )


def _prompt_versions(workspace: Workspace, spans: Iterable[otlp.Span]) -> dict[tuple[str, str], int]:
    """(prompt name, version or label) → PromptVersion id, for the prompts the spans name."""
    wanted = {(span.prompt_name, span.prompt_version or "production") for span in spans if span.prompt_name}
    if not wanted:
        return {}
    names = frozenset(name for name, _ in wanted)
    found: dict[tuple[str, str], int] = {}
    rows = _prompt_version_rows.get(
        (workspace.pk, names), functools.partial(_prompt_version_rows_read, workspace, names)
    )
    for version_id, name, number, label in rows:
        found[(name, str(number))] = version_id
        if label:
            found[(name, label)] = version_id
    return {key: found[key] for key in wanted if key in found}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(_text(part.get("text") or part.get("content")) for part in content if isinstance(part, dict))
    if content is None:
        return ""
    return json_dumps(content)


def _previews(view: TrajectoryView) -> tuple[str, str]:
    first_user = next((m for m in view.conversation if m.get("role") == "user"), None)
    last_assistant = next(
        (m for m in reversed(view.conversation) if m.get("role") == "assistant" and m.get("content")), None
    )
    return (
        _text(first_user.get("content"))[:PREVIEW_LENGTH] if first_user else "",
        _text(last_assistant.get("content"))[:PREVIEW_LENGTH] if last_assistant else "",
    )


def _ns_datetime(ns: int) -> datetime:
    return datetime.fromtimestamp(ns / 1e9, tz=UTC)


def _session_id(view: TrajectoryView) -> str:
    """The trajectory's `session_id` as stored ("" for none)."""
    return (view.session_id or "")[:500]


@dataclass(frozen=True, slots=True)
class _Reassessment:
    """What a trajectory's signals were computed from, kept while its batch is written: to compute them
    again if its session turns out to go on (`_left_after_error_withdraw`)."""

    trace_id: str
    agent_id: int | None
    view: TrajectoryView
    counted: Collection[str]


@dataclass(frozen=True, slots=True)
class _Assembled:
    """A trace as assembled for writing: its trajectory row's values (`_TRAJECTORY_UPDATE_COLUMNS`, the row
    id left as None), its spans not stored yet, and their tool results' shapes (agent, tool, key, shape).
    `session_id` is its session's ("" for none); `reassessment` is set when it has a session and its
    signals say the user left after an error, which a later trajectory of the session would withdraw."""

    values: tuple[Any, ...]
    fresh: Sequence[otlp.Span]
    shapes: list[tuple[int, str, str, dict[str, str]]]
    session_id: str = ""
    reassessment: _Reassessment | None = None


@dataclass
class _BatchWrite:
    """What one batch writes: span rows, trajectory rows, prompt uses and result shapes, collected as its
    traces are assembled (tracing.services.spans_write)."""

    workspace_id: int
    now: datetime
    prompt_versions: Mapping[tuple[str, str], int]
    agents: _AgentResolver
    signal_configs: _SignalConfigs
    span_rows: list[tuple[Any, ...]] = dataclasses.field(default_factory=list)
    new_spans: list[otlp.Span] = dataclasses.field(default_factory=list)
    trajectory_prompts: set[tuple[int, int]] = dataclasses.field(default_factory=set)
    # (agent id, tool name, shape key) -> results of that shape the batch's new spans carry
    shape_counts: Counter[tuple[int, str, str]] = dataclasses.field(default_factory=Counter)
    shapes: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
    # The sessions of the trajectories written, and those of them flagged `left_after_error` (by trace id).
    sessions: set[str] = dataclasses.field(default_factory=set)
    left_after_error: dict[str, _Reassessment] = dataclasses.field(default_factory=dict)

    def trajectory(
        self, trace_id: str, agent_id: int | None, stored: Sequence[otlp.Span], fresh: Sequence[otlp.Span]
    ) -> _Assembled:
        """Assemble the trace from its `stored` and `fresh` spans."""
        trace_spans = [*stored, *fresh]
        view = trajectory_view_build(trace_spans, trace_id=trace_id)
        if agent_id is None:
            agent_id = self.agents.resolve(view.agent_name)
        # Triage as the spans arrive: a trajectory's signals are current whenever it is read. Whether its
        # session goes on is learnt once the batch is written (`_left_after_error_withdraw`).
        counted = {span.span_id for span in stored}
        report = self.signal_configs.report(agent_id, view, counted=counted)
        session_id = _session_id(view)
        reassessment = None
        if session_id and any(instance.kind == "left_after_error" for instance in report.instances):
            reassessment = _Reassessment(trace_id, agent_id, view, counted)
        shapes = []
        if agent_id is not None:
            fresh_ids = {span.span_id for span in fresh}
            for result in report.result_shapes:
                if result.span_id in fresh_ids and len(result.tool_name) <= _TOOL_NAME_LENGTH:
                    shape = _storable_shape(result.shape)
                    shapes.append((agent_id, result.tool_name, _shape_key(shape), shape))
        return _Assembled(
            _trajectory_values(None, agent_id, view, _trajectory_metadata(trace_spans), report, self.now),
            fresh,
            shapes,
            session_id,
            reassessment,
        )

    def written(self, trajectory_id: int, assembled: _Assembled) -> None:
        """The trajectory is written: its fresh spans are to be stored, and their result shapes counted."""
        if assembled.session_id:
            self.sessions.add(assembled.session_id)
        if assembled.reassessment is not None:
            self.left_after_error[assembled.reassessment.trace_id] = assembled.reassessment
        for agent_id, tool_name, key, shape in assembled.shapes:
            self.shapes[key] = shape
            self.shape_counts[agent_id, tool_name, key] += 1
        fresh = assembled.fresh
        self.new_spans.extend(fresh)
        for span, record in zip(fresh, trace_span_rows(fresh), strict=True):
            prompt_version_id = (
                self.prompt_versions.get((span.prompt_name, span.prompt_version or "production"))
                if span.prompt_name
                else None
            )
            if prompt_version_id is not None:
                self.trajectory_prompts.add((trajectory_id, prompt_version_id))
            # The row's columns in _SPAN_COLUMNS' order: the record's (RECORD_COLUMNS, then data) with the
            # workspace, the trajectory, the prompt version and the time around them.
            self.span_rows.append(
                (self.workspace_id, trajectory_id, *record[:-1], prompt_version_id, record[-1], self.now)
            )


def spans_write(*, workspace: Workspace, api_key: ApiKey | None, spans: Sequence[otlp.Span]) -> int:
    """Store the spans not stored yet and re-assemble their trajectories; returns how many were new.

    Precondition: runs inside a transaction (the trajectory row locks are held until it commits).

    A trace new to Keel gets its trajectory row with its final values in one INSERT. A trace that has one
    already is locked and re-assembled from all of its spans. Concurrent batches never wait on each other
    in a cycle: each inserts its new rows first and then locks the existing ones, both in trace-id order,
    and an insert that meets another batch's row waits for that batch to commit, then finds it existing.

    Then, for a batch whose trajectories have sessions, one query finds the trajectories of those sessions,
    the batch's or stored, that say the user left after an error while the session goes on after them, and
    computes their signals again (`_left_after_error_withdraw`).
    """
    if not spans:
        return 0
    overrides = selectors.model_price_overrides_kept(workspace_id=workspace.pk)
    by_trace: dict[str, dict[str, otlp.Span]] = defaultdict(dict)
    for span in spans:
        by_trace[span.trace_id].setdefault(span.span_id, _priced(span, overrides))
    trace_ids = sorted(by_trace)
    batch = _BatchWrite(
        workspace_id=workspace.pk,
        now=timezone.now(),
        prompt_versions=_prompt_versions(workspace, (s for trace in by_trace.values() for s in trace.values())),
        agents=_AgentResolver(workspace, api_key),
        signal_configs=_SignalConfigs(),
    )
    connection.ensure_connection()
    # Server-side binding: Django's cursors would spell the rows' JSON document and the id arrays out into
    # the statement.
    with psycopg.Cursor(connection.connection) as cursor:
        stored_ids = _trajectory_ids(cursor, workspace.pk, trace_ids)
        existing = set(stored_ids)
        new = [trace_id for trace_id in trace_ids if trace_id not in existing]
        if new:
            assembled = {
                trace_id: batch.trajectory(trace_id, None, (), list(by_trace[trace_id].values())) for trace_id in new
            }
            inserted = _trajectories_insert(
                cursor, workspace.pk, new, [assembled[trace_id].values for trace_id in new], batch.now
            )
            # A trace another batch inserted meanwhile is assembled again below, with that batch's spans.
            existing.update(trace_id for trace_id in new if trace_id not in inserted)
            for trace_id, trajectory_id in inserted.items():
                batch.written(trajectory_id, assembled[trace_id])
        if existing:
            _trajectories_reassemble(cursor, workspace.pk, sorted(existing), stored_ids, by_trace, batch)
        if batch.sessions:
            _left_after_error_withdraw(cursor, workspace.pk, batch)
        if batch.span_rows:
            with cursor.copy(_SPAN_COPY) as copy:
                copy.set_types(_SPAN_TYPES)
                for row in batch.span_rows:
                    copy.write_row(row)
        if batch.trajectory_prompts:
            pairs = sorted(batch.trajectory_prompts)
            cursor.execute(
                "INSERT INTO tracing_trajectory_prompt_versions (trajectory_id, promptversion_id) "
                "SELECT * FROM unnest(%s::bigint[], %s::bigint[]) ON CONFLICT DO NOTHING",
                [[t for t, _ in pairs], [p for _, p in pairs]],
            )
        if batch.shape_counts:
            # Last, so the history rows other batches of the agent update stay locked only until the commit.
            _tool_result_shapes_record(cursor, batch.shape_counts, batch.shapes, batch.now)
    langfuse_bridge.langfuse_export_spans(workspace_id=workspace.pk, spans=batch.new_spans)
    return len(batch.span_rows)


# The stored trajectories of a batch's traces: one probe of the (trace id, workspace) unique index per trace
# id, whatever the planner's statistics say. Asked as `workspace_id = %s AND trace_id = ANY(%s)`, it read
# every trajectory of the workspace through one of the five indexes that begin with the workspace, whenever
# the statistics called the workspace small: a table not analyzed yet (a new install's first minute, the
# benchmark), a workspace grown since the last ANALYZE (autoanalyze waits for a tenth of the whole table to
# change), or one that was rare then. So the workspace is compared as `workspace_id + 0`, which no index
# can answer, and each trace id is probed by itself (OFFSET 0 keeps the lateral subquery a per-row lookup;
# as one `ANY`, a table without statistics was read whole).
_TRAJECTORY_IDS = """
    SELECT found.trace_id, found.id FROM unnest(%s::varchar[]) AS wanted (trace_id)
    CROSS JOIN LATERAL (
        SELECT trace_id, id FROM tracing_trajectory
        WHERE trace_id = wanted.trace_id AND workspace_id + 0 = %s
        OFFSET 0
    ) AS found
"""


def _trajectory_ids(cursor: Any, workspace_id: int, trace_ids: list[str]) -> dict[str, int]:
    """The ids of the workspace's stored trajectories of these traces, by trace id."""
    cursor.execute(_TRAJECTORY_IDS, [trace_ids, workspace_id])
    return dict(cursor.fetchall())


def _trajectories_reassemble(
    cursor: Any,
    workspace_id: int,
    trace_ids: list[str],
    trajectory_ids: Mapping[str, int],
    by_trace: Mapping[str, Mapping[str, otlp.Span]],
    batch: _BatchWrite,
) -> None:
    """Lock the trajectories of traces Keel has seen before, in one order, and assemble each again from
    the spans stored before (committed by other batches, which the lock waited for) and this batch's.

    `trajectory_ids` has the ids the batch read before inserting; the ones another batch inserted since
    are looked up. The lock goes by primary key, which the planner estimates right without statistics."""
    unknown = [trace_id for trace_id in trace_ids if trace_id not in trajectory_ids]
    ids = [trajectory_ids[trace_id] for trace_id in trace_ids if trace_id in trajectory_ids]
    if unknown:
        ids.extend(_trajectory_ids(cursor, workspace_id, unknown).values())
    cursor.execute(
        "SELECT id, trace_id, span_count, agent_id FROM tracing_trajectory "
        "WHERE id = ANY(%s::bigint[]) ORDER BY trace_id FOR UPDATE",
        [ids],
    )
    locked = {trace_id: (pk, count, agent_id) for pk, trace_id, count, agent_id in cursor.fetchall()}
    stored = selectors.trace_spans(workspace_id=workspace_id, trace_ids=[t for t in trace_ids if locked[t][1] > 0])
    updates = []
    for trace_id in trace_ids:
        trajectory_id, _, agent_id = locked[trace_id]
        before = stored.get(trace_id, [])
        known = {span.span_id for span in before}
        fresh = [span for span_id, span in by_trace[trace_id].items() if span_id not in known]
        if not fresh:
            continue
        assembled = batch.trajectory(trace_id, agent_id, before, fresh)
        updates.append((trajectory_id, *assembled.values[1:]))
        batch.written(trajectory_id, assembled)
    if updates:
        _trajectories_update(cursor, updates)


# A trajectory flagged `left_after_error` whose session (same workspace, same non-empty session id) has a
# trajectory that started after it: the user came back. Run after the batch wrote its trajectories, so the
# batch's own are among both the flagged and the later ones, whatever order they came in. The flagged rows
# of the batch's sessions are read through the partial index of flagged trajectories
# (`trajectory_left_after_error`; its condition is written here as a constant, which even a generic plan can
# match), whatever the statistics say; the rows found are locked in trace-id order, as the batch locked the
# others.
_LEFT_AFTER_ERROR_CONTINUED = f"""
    SELECT t.id, t.trace_id, t.agent_id FROM tracing_trajectory AS t
    WHERE t.workspace_id = %s AND t.session_id = ANY(%s)
        AND t.signals @> '{json_dumps(LEFT_AFTER_ERROR_SIGNALS)}'::jsonb
        AND EXISTS (
            SELECT 1 FROM tracing_trajectory AS later
            WHERE later.workspace_id = t.workspace_id AND later.session_id = t.session_id
                AND later.started_at > t.started_at
        )
    ORDER BY t.trace_id
    FOR UPDATE OF t
"""

_SIGNAL_UPDATE_COLUMNS = (
    ("id", "bigint"),
    ("signals", "jsonb"),
    ("signal_names", "text[]"),
    ("triage_score", "double precision"),
    ("signal_errors", "jsonb"),
    ("updated_at", "timestamptz"),
)


def _left_after_error_withdraw(cursor: Any, workspace_id: int, batch: _BatchWrite) -> None:
    """Compute again, knowing that their session goes on, the signals of the trajectories of the batch's
    sessions that say the user left after an error while a later trajectory of the session exists: the
    batch's own (from the views they were assembled from) and those stored before (from their spans).

    One query for a batch with sessions, and no more unless it finds such trajectories (a user who came
    back after an error), which are then read in one query and written in one."""
    cursor.execute(_LEFT_AFTER_ERROR_CONTINUED, [workspace_id, sorted(batch.sessions)])
    found: list[tuple[int, str, int | None]] = cursor.fetchall()
    if not found:
        return
    kept = batch.left_after_error
    stored = selectors.trace_spans(
        workspace_id=workspace_id, trace_ids=[trace_id for _, trace_id, _ in found if trace_id not in kept]
    )
    updates = []
    for trajectory_id, trace_id, agent_id in found:
        reassessment = kept.get(trace_id)
        if reassessment is not None:
            report = batch.signal_configs.report(
                reassessment.agent_id, reassessment.view, reassessment.counted, session_continues=True
            )
        else:
            # Ingest has counted every result of a stored trajectory (`counted=None`), as on a recompute.
            view = trajectory_view_build(stored[trace_id], trace_id=trace_id)
            report = batch.signal_configs.report(agent_id, view, None, session_continues=True)
        triage = signal_report_json(report)
        updates.append(
            (
                trajectory_id,
                triage["signals"],
                triage["signal_names"],
                triage["triage_score"],
                triage["signal_errors"],
                batch.now,
            )
        )
    _trajectories_update(cursor, updates, _SIGNAL_UPDATE_COLUMNS)


_TOOL_NAME_LENGTH = ToolResultShape._meta.get_field("tool_name").max_length or 0


def _tool_result_shapes_record(
    cursor: Any, counts: Counter[tuple[int, str, str]], shapes: Mapping[str, dict[str, str]], now: datetime
) -> None:
    """Add a batch's result shapes to the agents' histories, in one statement.

    A shape not counted yet is added only while its tool has fewer than TOOL_SHAPE_HISTORY_MAX_SHAPES;
    the batch itself brings at most that many new ones per tool, its most frequent.
    """
    per_tool: dict[tuple[int, str], list[tuple[int, str]]] = defaultdict(list)
    for (agent_id, tool_name, key), count in counts.items():
        per_tool[agent_id, tool_name].append((count, key))
    # Sorted, so that batches updating the same rows lock them in one order and cannot deadlock.
    rows = sorted(
        (agent_id, tool_name, key, count)
        for (agent_id, tool_name), found in per_tool.items()
        for count, key in sorted(found, reverse=True)[:TOOL_SHAPE_HISTORY_MAX_SHAPES]
    )
    cursor.execute(
        """
        INSERT INTO tracing_toolresultshape AS s (agent_id, tool_name, shape_key, shape, count, first_seen, last_seen)
        SELECT v.agent_id, v.tool_name, v.shape_key, v.shape::jsonb, v.count, %s, %s
        FROM unnest(%s::bigint[], %s::text[], %s::text[], %s::text[], %s::bigint[])
            AS v(agent_id, tool_name, shape_key, shape, count)
        WHERE CASE
            WHEN EXISTS (
                SELECT 1 FROM tracing_toolresultshape AS e
                WHERE e.agent_id = v.agent_id AND e.tool_name = v.tool_name AND e.shape_key = v.shape_key
            ) THEN true
            ELSE (
                SELECT count(*) FROM (
                    SELECT 1 FROM tracing_toolresultshape AS e
                    WHERE e.agent_id = v.agent_id AND e.tool_name = v.tool_name LIMIT %s
                ) AS kept
            ) < %s
        END
        ORDER BY v.agent_id, v.tool_name, v.shape_key
        ON CONFLICT (agent_id, tool_name, shape_key)
        DO UPDATE SET count = s.count + EXCLUDED.count, last_seen = EXCLUDED.last_seen
        """,
        [
            now,
            now,
            [row[0] for row in rows],
            [row[1] for row in rows],
            [row[2] for row in rows],
            [json_dumps(shapes[row[2]]) for row in rows],
            [row[3] for row in rows],
            TOOL_SHAPE_HISTORY_MAX_SHAPES,
            TOOL_SHAPE_HISTORY_MAX_SHAPES,
        ],
    )


_TRAJECTORY_UPDATE_COLUMNS = (
    ("id", "bigint"),
    ("agent_id", "bigint"),
    ("name", "text"),
    ("status", "text"),
    ("started_at", "timestamptz"),
    ("ended_at", "timestamptz"),
    ("latency_ms", "double precision"),
    ("span_count", "integer"),
    ("step_count", "integer"),
    ("llm_call_count", "integer"),
    ("tool_call_count", "integer"),
    ("error_count", "integer"),
    ("input_tokens", "bigint"),
    ("output_tokens", "bigint"),
    ("total_tokens", "bigint"),
    ("cost_usd", "numeric"),
    ("unpriced_call_count", "integer"),
    ("unpriced_models", "text[]"),
    ("session_id", "text"),
    ("user_id", "text"),
    ("tags", "text[]"),
    ("task_id", "text"),
    ("reward", "double precision"),
    ("input_preview", "text"),
    ("output_preview", "text"),
    ("metadata", "jsonb"),
    ("signals", "jsonb"),
    ("signal_names", "text[]"),
    ("triage_score", "double precision"),
    ("signal_errors", "jsonb"),
    ("view_document", "text"),
    ("updated_at", "timestamptz"),
)


def _trajectory_metadata(spans: Iterable[otlp.Span]) -> dict[str, Any]:
    """The trace's metadata: what its spans carry, the root span's winning where keys clash."""
    metadata: dict[str, Any] = {}
    for span in sorted(spans, key=lambda span: span.parent_span_id is None):
        metadata.update(span.metadata)
    return metadata


def signal_report_json(report: signals.SignalReport) -> dict[str, Any]:
    """How a report is stored on the trajectory (and shown by the API)."""
    return {
        "signals": [
            {
                "signal": instance.signal,
                "kind": instance.kind,
                "category": instance.category,
                "severity": round(instance.severity, 4),
                "level": instance.level,
                "steps": list(instance.step_indices),
                "snippets": list(instance.snippets),
                "why": instance.why,
            }
            for instance in report.instances
        ],
        "signal_names": sorted(report.signals),
        "triage_score": round(report.triage_score, 4),
        "signal_errors": [{"detector": error.detector, "message": error.message} for error in report.detector_errors],
    }


_MODEL_LENGTH = Span._meta.get_field("model").max_length or 0


def _trajectory_cost(totals: Totals) -> Decimal | None:
    """What the trajectory cost: the sum of its priced figures; None when nothing priced any of its model calls
    (not 0, which would read as free); 0 for one with no model call, or none that was billed."""
    if totals.cost_usd is not None:
        return Decimal(str(totals.cost_usd)).quantize(Decimal("0.00000001"))
    return None if totals.unpriced_call_count else Decimal(0)


def _trajectory_values(
    trajectory_id: int | None,
    agent_id: int | None,
    view: TrajectoryView,
    metadata: dict[str, Any],
    report: signals.SignalReport,
    now: datetime,
) -> tuple[Any, ...]:
    totals = view.totals
    input_preview, output_preview = _previews(view)
    triage = signal_report_json(report)
    return (
        trajectory_id,
        agent_id,
        (view.name or "")[:500],
        view.status,
        _ns_datetime(view.start_time_ns),
        _ns_datetime(view.end_time_ns),
        max(0.0, (view.end_time_ns - view.start_time_ns) / 1e6),
        totals.span_count,
        totals.step_count,
        totals.llm_call_count,
        totals.tool_call_count,
        totals.error_count,
        totals.input_tokens,
        totals.output_tokens,
        totals.total_tokens,
        _trajectory_cost(totals),
        totals.unpriced_call_count,
        [model[:_MODEL_LENGTH] for model in totals.unpriced_models[:UNPRICED_MODELS_KEPT]],
        _session_id(view),
        (view.user_id or "")[:500],
        sorted({tag[:200] for tag in view.tags}),
        (view.task_id or "")[:500],
        view.reward,
        input_preview,
        output_preview,
        metadata,
        triage["signals"],
        triage["signal_names"],
        triage["triage_score"],
        triage["signal_errors"],
        _stored_view_document(view),
        now,
    )


# From how many spans on a trajectory keeps its assembled view (Trajectory.view_document). Below, the API
# builds it from the spans when asked, in about the time it takes to read it back; storing it would double
# what ingest writes for a short trajectory (its view is about as long as all of its spans' data together).
VIEW_DOCUMENT_MIN_SPANS = 50


def _stored_view_document(view: TrajectoryView) -> str:
    if view.totals.span_count < VIEW_DOCUMENT_MIN_SPANS:
        return ""
    return view_document_json(view).decode()


# A batch's trajectory rows reach PostgreSQL as one JSON document, written by orjson, which
# json_to_recordset reads with each column's type (lists into arrays, objects into jsonb). As one array
# per column, psycopg wrote every value of some 30 columns out in Python: 5.2 ms of the web's CPU for a
# batch of 50 trajectories, against 0.35 ms as a document, with the same time in PostgreSQL. The document
# is read as json, not jsonb: jsonb would first build the whole of it as a tree, keys sorted, only to
# take each value out again (PostgreSQL's CPU per span stored, in process: 45.0 µs against 50.2).
def _rows_document(columns: Sequence[tuple[str, str]], rows: Iterable[Sequence[Any]]) -> str:
    names = [name for name, _ in columns]
    return json_dumps([dict(zip(names, row, strict=True)) for row in rows])


def _recordset(columns: Sequence[tuple[str, str]]) -> str:
    """`FROM` the rows of a `_rows_document` (the `%s` it takes), as `v`, numbered in `v.position`."""
    definitions = ", ".join(f"{name} {kind}" for name, kind in columns)
    names = ", ".join(name for name, _ in columns)
    return f"ROWS FROM (json_to_recordset(%s::json) AS ({definitions})) WITH ORDINALITY AS v({names}, position)"


def _trajectories_insert(
    cursor: Any, workspace_id: int, trace_ids: Sequence[str], rows: Sequence[tuple[Any, ...]], now: datetime
) -> dict[str, int]:
    """Insert the trajectories of new traces with their values (`_trajectory_values`), in trace-id order;
    returns trace id → row id of those inserted. A trace whose row another batch inserted is left out:
    the insert waits until that batch has committed, then does nothing."""
    columns = (("trace_id", "text"), *_TRAJECTORY_UPDATE_COLUMNS[1:])
    names = [name for name, _ in columns[1:]]
    cursor.execute(
        f"INSERT INTO tracing_trajectory (workspace_id, trace_id, created_at, {', '.join(names)}) "
        f"SELECT %s, v.trace_id, %s, {', '.join(f'v.{name}' for name in names)} FROM {_recordset(columns)} "
        "ORDER BY v.position "
        "ON CONFLICT (workspace_id, trace_id) DO NOTHING RETURNING trace_id, id",
        [
            workspace_id,
            now,
            _rows_document(columns, ((trace_id, *row[1:]) for trace_id, row in zip(trace_ids, rows, strict=True))),
        ],
    )
    return dict(cursor.fetchall())


def _trajectories_update(
    cursor: Any, updates: list[tuple[Any, ...]], columns: Sequence[tuple[str, str]] = _TRAJECTORY_UPDATE_COLUMNS
) -> None:
    """Set the `columns` (the row id first) of each trajectory to its values in `updates`."""
    assignments = ", ".join(f"{name} = v.{name}" for name, _ in columns[1:])
    cursor.execute(
        f"UPDATE tracing_trajectory AS t SET {assignments} FROM {_recordset(columns)} WHERE t.id = v.id",
        [_rows_document(columns, updates)],
    )


# --- Scores ------------------------------------------------------------------------------------------


def _score_checked(*, name: str, data_type: str, value: Any, string_value: str) -> tuple[str, float | None]:
    """A score's name (stripped) and its stored number, or ScoreInvalid naming every problem."""
    problems: list[dict[str, str]] = []
    if data_type not in ScoreDataType.values:
        problems.append({"field": "data_type", "message": f"must be one of {', '.join(ScoreDataType.values)}"})
    if not name.strip() or len(name) > 200:
        problems.append({"field": "name", "message": "1 to 200 characters"})
    numeric_value: float | None = None
    if data_type == ScoreDataType.BOOLEAN:
        if not isinstance(value, bool) and value not in (0, 1):
            problems.append({"field": "value", "message": "a boolean score needs true/false (or 1/0)"})
        else:
            numeric_value = float(bool(value))
    elif data_type == ScoreDataType.NUMERIC:
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            problems.append({"field": "value", "message": "a numeric score needs a number"})
        elif value != value or value in (float("inf"), float("-inf")):
            problems.append({"field": "value", "message": "must be finite"})
        else:
            numeric_value = float(value)
    elif data_type in (ScoreDataType.CATEGORICAL, ScoreDataType.CORRECTION):
        if not string_value:
            problems.append({"field": "string_value", "message": f"a {data_type} score needs string_value"})
        if value is not None:  # would be dropped without a word: the category is string_value
            problems.append({"field": "value", "message": f"a {data_type} score takes string_value, not value"})
    if data_type in (ScoreDataType.NUMERIC, ScoreDataType.BOOLEAN) and string_value:
        problems.append({"field": "string_value", "message": f"a {data_type} score takes value, not string_value"})
    if problems:
        raise exceptions.ScoreInvalid(
            "invalid score: " + "; ".join(f"{p['field']}: {p['message']}" for p in problems), errors=problems
        )
    return name.strip(), numeric_value


def _span_exists(*, workspace_id: int, trace_id: str, span_id: str) -> bool:
    return Span.objects.filter(workspace_id=workspace_id, trace_id=trace_id, span_id=span_id).exists()


def score_create(
    *,
    trajectory: Trajectory,
    name: str,
    data_type: str,
    value: float | bool | None = None,
    string_value: str = "",
    span_id: str = "",
    comment: str = "",
    source: str = ScoreSource.API,
    created_by: User | None = None,
    created_via_key: ApiKey | None = None,
    external_id: str = "",
) -> Score:
    """Attach a score to a trajectory (or one of its steps, by span id)."""
    name, numeric_value = _score_checked(name=name, data_type=data_type, value=value, string_value=string_value)
    if span_id and not _span_exists(
        workspace_id=trajectory.workspace_id, trace_id=trajectory.trace_id, span_id=span_id
    ):
        problem = {"field": "span_id", "message": "no such step in this trajectory"}
        raise exceptions.ScoreInvalid(f"invalid score: span_id: {problem['message']}", errors=[problem])
    with transaction.atomic():
        score = Score.objects.create(
            workspace_id=trajectory.workspace_id,
            trajectory=trajectory,
            span_id=span_id,
            name=name,
            data_type=data_type,
            value=numeric_value,
            string_value=string_value,
            source=source,
            comment=comment,
            created_by=created_by,
            created_via_key=created_via_key,
            external_id=external_id,
        )
        langfuse_bridge.langfuse_export_score(score=score)
    return score


# --- Scores from Langfuse clients ----------------------------------------------------------------------

PENDING_SCORE_DAYS = 7
_TRACE_ID = re.compile(r"[0-9a-f]{32}")
_SPAN_ID = re.compile(r"[0-9a-f]{16}")
# Langfuse's data types that have a Keel counterpart; TEXT (free text) has none.
_LANGFUSE_SCORE_TYPES = {
    "NUMERIC": ScoreDataType.NUMERIC,
    "BOOLEAN": ScoreDataType.BOOLEAN,
    "CATEGORICAL": ScoreDataType.CATEGORICAL,
    "CORRECTION": ScoreDataType.CORRECTION,
}


@dataclass(frozen=True, slots=True)
class LangfuseScore:
    """One score of a Langfuse `POST /api/public/scores` body, in Keel's terms."""

    trace_id: str
    span_id: str
    name: str
    data_type: str
    value: float | None
    string_value: str
    comment: str
    external_id: str


# What a pending score hands to score_create (its trajectory and key aside).
_PENDING_SCORE_FIELDS = tuple(field.name for field in dataclasses.fields(LangfuseScore) if field.name != "trace_id")


@dataclass(frozen=True, slots=True)
class ScoresAccepted:
    stored: int  # attached to their trajectories now
    pending: int  # kept until their trajectory (or step) arrives
    errors: list[str]  # one line per score refused, naming it by its position in the body


def _text_field(item: Mapping[str, Any], key: str, limit: int) -> str:
    value = item.get(key)
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > limit:
        raise exceptions.ScoreInvalid(f"{key} must be text of at most {limit} characters")
    return value


def langfuse_score_parse(item: Any) -> LangfuseScore:
    """A Langfuse score body (`traceId`, `observationId`, `name`, `value`, `dataType`, `comment`, `id`) as
    Keel stores it, or ScoreInvalid saying why Keel cannot: it scores traces and their observations, not
    sessions or dataset runs, and has no TEXT scores."""
    if not isinstance(item, dict):
        raise exceptions.ScoreInvalid("a score is a JSON object")
    if item.get("sessionId") or item.get("datasetRunId"):
        raise exceptions.ScoreInvalid("Keel scores traces and their observations, not sessions or dataset runs")
    trace_id = _text_field(item, "traceId", 64).strip().lower()
    if not _TRACE_ID.fullmatch(trace_id):
        raise exceptions.ScoreInvalid("traceId must be a trace id of 32 hex characters")
    span_id = _text_field(item, "observationId", 64).strip().lower()
    if span_id and not _SPAN_ID.fullmatch(span_id):
        raise exceptions.ScoreInvalid("observationId must be a span id of 16 hex characters")
    value = item.get("value")
    declared = item.get("dataType")
    if declared is None:
        declared = "CATEGORICAL" if isinstance(value, str) else "NUMERIC"
    data_type = _LANGFUSE_SCORE_TYPES.get(declared) if isinstance(declared, str) else None
    if data_type is None:
        raise exceptions.ScoreInvalid(
            f"dataType {declared!r} has no Keel counterpart: use NUMERIC, BOOLEAN, CATEGORICAL or CORRECTION"
        )
    numeric = data_type in (ScoreDataType.NUMERIC, ScoreDataType.BOOLEAN)
    if isinstance(value, str) == numeric:
        raise exceptions.ScoreInvalid(f"a {declared} score's value must be {'a number' if numeric else 'text'}")
    number: Any = value if numeric else None
    text = "" if numeric else str(value)
    name, numeric_value = _score_checked(
        name=_text_field(item, "name", 200), data_type=data_type, value=number, string_value=text
    )
    return LangfuseScore(
        trace_id=trace_id,
        span_id=span_id,
        name=name,
        data_type=data_type,
        value=numeric_value,
        string_value=text,
        comment=_text_field(item, "comment", 10_000),
        external_id=_text_field(item, "id", 100).strip(),
    )


def _langfuse_score_store(
    *, workspace: Workspace, api_key: ApiKey, agent_ids: frozenset[int] | None, score: LangfuseScore
) -> bool:
    """Store one parsed score; True when it is attached now, False when it waits for its trajectory. A score
    sent again with its id (a client's retry, or Langfuse's upsert) replaces what that id stored."""
    trajectory = Trajectory.objects.filter(workspace=workspace, trace_id=score.trace_id).first()
    if trajectory is not None and agent_ids is not None and trajectory.agent_id not in agent_ids:
        raise exceptions.ScoreInvalid(f"trace {score.trace_id} belongs to an agent this key may not score")
    if score.external_id:
        Score.objects.filter(workspace=workspace, external_id=score.external_id).delete()
        PendingScore.objects.filter(workspace=workspace, external_id=score.external_id).delete()
    ready = trajectory is not None and (
        not score.span_id or _span_exists(workspace_id=workspace.pk, trace_id=score.trace_id, span_id=score.span_id)
    )
    fields = dataclasses.asdict(score)  # LangfuseScore's fields are PendingScore's and score_create's
    if ready and trajectory is not None:
        del fields["trace_id"]
        score_create(trajectory=trajectory, created_via_key=api_key, **fields)
        return True
    PendingScore.objects.create(workspace=workspace, created_via_key=api_key, **fields)
    return False


def langfuse_scores_accept(*, api_key: ApiKey, items: Sequence[Any]) -> ScoresAccepted:
    """Langfuse's `POST /api/public/scores`. Each score is stored on its trajectory, or kept pending until
    the trajectory (and the scored step) arrives: a Langfuse client flushes scores and spans separately.
    A score Keel cannot take is reported by its position; the others are stored."""
    agent_ids = registry_selectors.apikey_agent_ids_kept(api_key=api_key)
    stored = pending = 0
    errors: list[str] = []
    for index, item in enumerate(items):
        try:
            score = langfuse_score_parse(item)
            with transaction.atomic():
                attached = _langfuse_score_store(
                    workspace=api_key.workspace, api_key=api_key, agent_ids=agent_ids, score=score
                )
        except exceptions.ScoreInvalid as error:
            errors.append(f"score {index}: {error.detail}")
            continue
        stored += attached
        pending += not attached
    return ScoresAccepted(stored=stored, pending=pending, errors=errors)


def pending_scores_attach(*, now: datetime | None = None, limit: int = 1000) -> int:
    """Scheduled by beat: pending scores whose trajectory (and step) now exist become scores; those older
    than PENDING_SCORE_DAYS, whose trace never came, are dropped. Returns how many were attached."""
    now = now or timezone.now()
    dropped, _ = PendingScore.objects.filter(created_at__lt=now - timedelta(days=PENDING_SCORE_DAYS)).delete()
    if dropped:
        logger.warning("dropped %d scores whose trace did not arrive within %d days", dropped, PENDING_SCORE_DAYS)
    # Only those whose trajectory exists: scores whose trace never comes must not crowd out the others.
    arrived = Trajectory.objects.filter(workspace_id=OuterRef("workspace_id"), trace_id=OuterRef("trace_id"))
    waiting = list(
        PendingScore.objects.filter(Exists(arrived)).select_related("created_via_key").order_by("pk")[:limit]
    )
    found = {
        (trajectory.workspace_id, trajectory.trace_id): trajectory
        for trajectory in Trajectory.objects.filter(trace_id__in={pending.trace_id for pending in waiting})
    }
    attached = 0
    for pending in waiting:
        trajectory = found.get((pending.workspace_id, pending.trace_id))
        if trajectory is None or (
            pending.span_id
            and not _span_exists(workspace_id=pending.workspace_id, trace_id=pending.trace_id, span_id=pending.span_id)
        ):
            continue
        with transaction.atomic():
            if not PendingScore.objects.filter(pk=pending.pk).delete()[0]:
                continue  # another sweep took it
            key = pending.created_via_key
            # Kept per process (config/config_cache.py): one key's many scores read its agents once.
            agent_ids = registry_selectors.apikey_agent_ids_kept(api_key=key) if key is not None else None
            if agent_ids is not None and trajectory.agent_id not in agent_ids:
                logger.warning("dropped a score of trace %s: its key may not score that agent", pending.trace_id)
                continue
            score_create(
                trajectory=trajectory,
                created_via_key=key,
                **{name: getattr(pending, name) for name in _PENDING_SCORE_FIELDS},
            )
            attached += 1
    return attached


# --- Model prices ------------------------------------------------------------------------------------


def model_price_set(
    *,
    workspace: Workspace,
    model: str,
    input_usd_per_million: Decimal,
    output_usd_per_million: Decimal,
    cache_read_usd_per_million: Decimal | None = None,
    set_by: User | None = None,
    set_via_key: ApiKey | None = None,
) -> ModelPriceOverride:
    if not model.strip():
        raise exceptions.ModelPriceInvalid("model is required", errors=[{"field": "model", "message": "required"}])
    for field, amount in (
        ("input_usd_per_million", input_usd_per_million),
        ("output_usd_per_million", output_usd_per_million),
    ):
        if amount < 0:
            raise exceptions.ModelPriceInvalid(
                f"{field} must not be negative", errors=[{"field": field, "message": "negative"}]
            )
    with transaction.atomic():
        price, _ = ModelPriceOverride.objects.update_or_create(
            workspace=workspace,
            model=model.strip(),
            defaults={
                "input_usd_per_million": input_usd_per_million,
                "output_usd_per_million": output_usd_per_million,
                "cache_read_usd_per_million": cache_read_usd_per_million,
            },
        )
        audit.record(
            workspace=workspace,
            action=AuditAction.MODEL_PRICE_CHANGED,
            user=set_by,
            api_key=set_via_key,
            target=price,
            target_name=price.model,
            details={
                "input_usd_per_million": str(input_usd_per_million),
                "output_usd_per_million": str(output_usd_per_million),
            },
        )
    return price


def model_price_delete(
    *, workspace: Workspace, model: str, deleted_by: User | None = None, deleted_via_key: ApiKey | None = None
) -> None:
    """Remove the workspace's own price for `model`: new spans of it are priced from litellm's price map
    again (stored spans keep their cost). Raises ModelPriceNotFound when the workspace has none."""
    with transaction.atomic():
        price = ModelPriceOverride.objects.select_for_update().filter(workspace=workspace, model=model.strip()).first()
        if price is None:
            raise exceptions.ModelPriceNotFound(f"this workspace has no price of its own for {model!r}")
        audit.record(
            workspace=workspace,
            action=AuditAction.MODEL_PRICE_DELETED,
            user=deleted_by,
            api_key=deleted_via_key,
            target=price,
            target_name=price.model,
            details={
                "input_usd_per_million": str(price.input_usd_per_million),
                "output_usd_per_million": str(price.output_usd_per_million),
            },
        )
        price.delete()


# --- Retention ---------------------------------------------------------------------------------------


def _retention_batch(*, agent: Agent, cutoff: datetime, batch_size: int) -> int:
    """Delete up to `batch_size` of the agent's trajectories that ended before `cutoff` (and their spans) in
    one short transaction, so that ingest never waits long on these deletes; returns how many."""
    # A trajectory ends after it starts, so `started_at` bounds the scan of the (workspace, agent,
    # started_at) index to the old rows; `ended_at` alone has no index.
    rows = list(
        Trajectory.objects.filter(
            workspace_id=agent.workspace_id, agent=agent, started_at__lt=cutoff, ended_at__lt=cutoff
        ).values_list("pk", "trace_id")[:batch_size]
    )
    if not rows:
        return 0
    with transaction.atomic():
        Span.objects.filter(workspace_id=agent.workspace_id, trace_id__in=[trace for _, trace in rows]).delete()
        Trajectory.objects.filter(pk__in=[pk for pk, _ in rows]).delete()
    return len(rows)


def trajectory_retention_apply(*, agent: Agent, days: int, batch_size: int = 1000) -> int:
    """Delete the agent's trajectories that ended more than `days` ago, `batch_size` at a time."""
    cutoff = timezone.now() - timedelta(days=days)
    deleted = 0
    while count := _retention_batch(agent=agent, cutoff=cutoff, batch_size=batch_size):
        deleted += count
    return deleted


def trajectory_retention_sweep(*, batch_size: int = 1000) -> dict[int, int]:
    """Apply every agent's retention; returns agent id → trajectories deleted. The agents take turns, a
    batch each, so one with a large backlog does not hold the others back until the task's time is up."""
    now = timezone.now()
    agents = list(Agent.objects.filter(trace_retention_days__isnull=False).order_by("pk"))
    cutoffs = {agent.pk: now - timedelta(days=agent.trace_retention_days or 0) for agent in agents}
    deleted = dict.fromkeys(cutoffs, 0)
    while agents:
        for agent in list(agents):
            count = _retention_batch(agent=agent, cutoff=cutoffs[agent.pk], batch_size=batch_size)
            deleted[agent.pk] += count
            if count < batch_size:
                agents.remove(agent)
    return deleted


def trajectory_signals_recompute(*, trajectory_ids: Sequence[int]) -> int:
    """Recompute the signals (and the stored view) of these trajectories from their spans, after the
    detectors, the weights or the step assembly changed; returns how many were updated."""
    updated = 0
    configs = _SignalConfigs()
    # As at ingest (`_LEFT_AFTER_ERROR_CONTINUED`): a later trajectory of the session means the user came back.
    later = Trajectory.objects.filter(
        workspace_id=OuterRef("workspace_id"), session_id=OuterRef("session_id"), started_at__gt=OuterRef("started_at")
    ).exclude(session_id="")
    for trajectory in (
        Trajectory.objects.filter(pk__in=trajectory_ids)
        .only("pk", "trace_id", "agent_id", "workspace_id")
        .annotate(session_continues=Exists(later))
    ):
        view = selectors.trajectory_view(trajectory=trajectory)
        # Ingest has counted every result of the trajectory by now (`counted=None`); the counts stay.
        report = configs.report(trajectory.agent_id, view, counted=None, session_continues=trajectory.session_continues)
        Trajectory.objects.filter(pk=trajectory.pk).update(
            **signal_report_json(report), view_document=_stored_view_document(view)
        )
        updated += 1
    return updated
