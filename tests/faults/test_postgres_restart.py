"""PostgreSQL stops under load and starts again: requests fail cleanly while it is away, and Keel carries on
without a restart of its own processes.

The test runs a PostgreSQL of its own (a second pgserver data directory; stopping the shared test server
would disturb every other test), loaded with the test database's schema and a small world (an agent on the
stub model server, a key). Keel's web app runs in gunicorn and a Celery worker beside it, both as they run
in production (persistent connections, health checks). Client threads post OTLP batches and gateway
requests, retrying a 503 as a client should. PostgreSQL is stopped (`pg_ctl stop -m immediate`, a crash
as far as Keel can tell), and started again once both kinds of request have been refused.

Asserted: every answer was 200 or a 503 `database_unavailable` with Retry-After (no 500, no request left
hanging); requests succeed again after the restart with the same web and worker processes; every trace of an
OTLP request answered 200 is stored when the load stops, each span once (a request refused with 503 is sent
again with the same spans), written by the request itself: no OTLP request was left to the worker as a batch;
and once the worker (and the sweep beat would send) caught up, the trace of every answered gateway request is
stored too, the gateway's spans going through the batch queue."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from agent_registry import services as registry_services
from agent_registry.tests.factories import WorkspaceFactory
from config import embedded_postgres
from tests.celery.processes import BASE_DIR, PROCESS_TESTS, celery_producer, celery_start, celery_stop
from tests.celery.test_eval_runs import _agent_on_stub, _stub
from tests.faults.traffic import SPANS_PER_TRACE, free_port, otlp_json, record_facts, trace_ids_new, wait_for
from tracing import services as tracing_services
from tracing.models import BatchStatus, IngestBatch, Span

pytestmark = [pytest.mark.django_db(transaction=True), PROCESS_TESTS]

DATABASE = "keel_faults"
REQUEST_TIMEOUT_SECONDS = 30.0  # a request without an answer by then counts as hung
INGEST_THREADS = 2
GATEWAY_THREADS = 1
# Between a client's acknowledged requests. Steady concurrent traffic a small shared machine keeps up with: an
# OTLP request that waits KEEL_INGEST_MAX_QUEUE_SECONDS for its turn to be stored is answered 429 (back-pressure,
# not this test's subject), and every gateway request is a batch for the worker.
PAUSE_SECONDS = 0.3
KINDS = ("ingest", "gateway", "read")  # OTLP requests, gateway requests, and API reads (/api/v1, django-ninja)


def _pg_bin(name: str) -> str:
    import pgserver

    return str(Path(pgserver.__file__).parent / "pginstall" / "bin" / name)


class SeparatePostgres:
    """A pgserver PostgreSQL in a data directory of its own, stopped and started with pg_ctl."""

    def __init__(self) -> None:
        self.data_dir = Path(tempfile.mkdtemp(prefix="keel-faults-pg-"))
        self.system_user = "pgserver" if os.geteuid() == 0 else None
        self.socket_dir = ""

    def start_new(self) -> None:
        server = embedded_postgres.server_start(self.data_dir)
        self.socket_dir = server.socket_dir
        # A test server: no fsync (a crash of the machine, not of PostgreSQL, is what loses unsynced writes);
        # commits still wait for their WAL to be written, so what was acknowledged survives a stop.
        self.psql("postgres", "ALTER SYSTEM SET fsync = off")
        self.psql("postgres", "SELECT pg_reload_conf()")
        self.psql("postgres", f"CREATE DATABASE {DATABASE}")

    def psql(self, dbname: str, command: str | None = None, script: bytes | None = None) -> None:
        argv = [_pg_bin("psql"), "-h", self.socket_dir, "-U", "postgres", "-d", dbname, "-q", "-v", "ON_ERROR_STOP=1"]
        if command is not None:
            argv += ["-c", command]
        subprocess.run(argv, input=script, check=True, capture_output=True, timeout=120)

    def stop(self) -> None:
        import pgserver

        pgserver.pg_ctl(["-w", "stop", "-m", "immediate"], pgdata=self.data_dir, user=self.system_user)

    def start(self) -> None:
        import pgserver

        pgserver.pg_ctl(
            ["-w", "-o", '-h ""', "-o", f"-k {self.socket_dir}", "-l", str(self.data_dir / "faults.log"), "start"],
            pgdata=self.data_dir,
            user=self.system_user,
            timeout=60,
        )

    def url(self) -> str:
        return f"postgres://postgres@{quote(self.socket_dir, safe='')}:5432/{DATABASE}"

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(host=self.socket_dir, port=5432, user="postgres", dbname=DATABASE) as db:
            return db.execute(sql, params).fetchall()

    def remove(self) -> None:
        if (self.data_dir / "postmaster.pid").exists():
            self.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)


def _copy_test_database(target: SeparatePostgres) -> None:
    """The test database's schema and rows (the world the test made, committed) into the separate server:
    seconds, where migrating a new database takes most of a minute."""
    source = connection.settings_dict
    env = {**os.environ, "PGPASSWORD": str(source["PASSWORD"] or "")}
    dump = subprocess.run(
        [
            _pg_bin("pg_dump"),
            "--no-owner",
            "--no-privileges",
            "-h",
            str(source["HOST"]),
            "-p",
            str(source["PORT"] or 5432),
            "-U",
            str(source["USER"]),
            "-d",
            str(source["NAME"]),
        ],
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    ).stdout
    target.psql(DATABASE, script=dump)


@contextmanager
def _separate_postgres() -> Iterator[SeparatePostgres]:
    server = SeparatePostgres()
    try:
        server.start_new()
        yield server
    finally:
        server.remove()


def _keel_env(server: SeparatePostgres, tmp_path: Path) -> dict[str, str]:
    """Production-like settings: persistent connections with health checks, DEBUG off."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("CELERY_", "KEEL_", "DATABASE_"))}
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings.local",
            "DJANGO_DEBUG": "false",
            "DATABASE_URL": server.url(),
            "KEEL_BROKER_DIR": str(tmp_path / "broker"),
            "KEEL_MEDIA_ROOT": str(tmp_path / "media"),
            # The sweep hands out a batch whose worker lost the database mid-batch after this lease.
            "KEEL_INGEST_LEASE_SECONDS": "3",
            "KEEL_INGEST_REQUEUE_AFTER_SECONDS": "2",
        }
    )
    return env


@contextmanager
def _web(env: dict[str, str], log: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    with log.open("wb") as output:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "config.wsgi:application",
                "--bind",
                f"127.0.0.1:{port}",
                "--workers",
                "1",
                "--threads",
                str(2 * (INGEST_THREADS + GATEWAY_THREADS + 1)),
                "--timeout",
                "120",
                "--graceful-timeout",
                "5",
            ],
            cwd=BASE_DIR,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        yield f"http://127.0.0.1:{port}", process
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@dataclass
class Answer:
    kind: str  # one of KINDS
    phase: str  # when the request was sent: "before", "outage" or "after" the restart
    status: int | None  # None: no answer within REQUEST_TIMEOUT_SECONDS, or the connection failed
    retry_after: str | None = None
    body: Any = None
    error: str = ""


@dataclass
class Load:
    """Client threads that post OTLP requests and gateway requests until told to stop, retrying each 503 (or 429)
    with the same body, as an OpenTelemetry exporter does."""

    base_url: str
    key: str
    phase: str = "before"
    answers: list[Answer] = field(default_factory=list)
    acknowledged: dict[str, list[str]] = field(default_factory=lambda: {"ingest": [], "gateway": []})
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, kind: str, phase: str, status: int) -> int:
        with self.lock:
            return sum(1 for a in self.answers if (a.kind, a.phase, a.status) == (kind, phase, status))

    def summary(self) -> str:
        with self.lock:
            counts: dict[tuple[str, str, int | None], int] = {}
            for answer in self.answers:
                key = (answer.kind, answer.phase, answer.status)
                counts[key] = counts.get(key, 0) + 1
            refusals = {str(answer.body)[:200] for answer in self.answers if answer.status != 200}
        return f"answers: {counts}; refusals: {sorted(refusals)[:6]}"

    def unexpected(self) -> list[Answer]:
        """Answers that are neither a success nor a clean refusal (and stop their thread)."""
        with self.lock:
            return [answer for answer in self.answers if answer.status not in (200, 429, 503)]

    def _send(self, client: httpx.Client, kind: str, request: dict[str, Any], method: str) -> Answer:
        phase = self.phase
        try:
            response = client.request(method, **request)
        except httpx.HTTPError as error:
            return Answer(kind, phase, None, error=f"{type(error).__name__}: {error}")
        try:
            body = response.json()
        except ValueError:
            body = response.text[:500]
        answer = Answer(kind, phase, response.status_code, response.headers.get("Retry-After"), body)
        answer.error = response.headers.get("X-Keel-Trace-Id", "")  # the gateway's trace, kept for the check
        return answer

    def _until_acknowledged(
        self, client: httpx.Client, kind: str, request: dict[str, Any], method: str = "POST"
    ) -> Answer:
        deadline = time.monotonic() + 120
        while True:
            answer = self._send(client, kind, request, method)
            with self.lock:
                self.answers.append(answer)
            if answer.status not in (429, 503) or time.monotonic() > deadline:
                return answer
            time.sleep(0.2)  # the answer says when (Retry-After); the test keeps the outage busy instead

    def ingest(self) -> None:
        with httpx.Client(base_url=self.base_url, timeout=REQUEST_TIMEOUT_SECONDS) as client:
            while not self.stop.wait(PAUSE_SECONDS):
                trace_ids = trace_ids_new(2)
                request = {
                    "url": "/v1/traces",
                    "content": otlp_json(trace_ids),
                    "headers": {"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"},
                }
                if self._until_acknowledged(client, "ingest", request).status != 200:
                    return
                with self.lock:
                    self.acknowledged["ingest"].extend(trace_ids)

    def read(self) -> None:
        with httpx.Client(base_url=self.base_url, timeout=REQUEST_TIMEOUT_SECONDS) as client:
            while not self.stop.wait(PAUSE_SECONDS):
                request = {"url": "/api/v1/trajectories", "params": {"limit": 5}}
                request["headers"] = {"Authorization": f"Bearer {self.key}"}
                if self._until_acknowledged(client, "read", request, method="GET").status != 200:
                    return

    def gateway(self) -> None:
        with httpx.Client(base_url=self.base_url, timeout=REQUEST_TIMEOUT_SECONDS) as client:
            number = 0
            while not self.stop.wait(PAUSE_SECONDS):
                number += 1
                request = {
                    "url": "/v1/chat/completions",
                    "json": {
                        "model": "agent/ride-faq",
                        "messages": [{"role": "user", "content": f"Where is my refund? ({number})"}],
                        "variables": {"company": "Acme"},
                    },
                    "headers": {"Authorization": f"Bearer {self.key}"},
                }
                answer = self._until_acknowledged(client, "gateway", request)
                if answer.status != 200:
                    return
                with self.lock:
                    self.acknowledged["gateway"].append(answer.error)


def _unfinished(server: SeparatePostgres) -> str:
    rows = server.query(
        "SELECT id, status, attempts, claimed_at, received_at FROM tracing_ingestbatch WHERE status <> 'done'"
    )
    return f"batches not done (id, status, attempts, claimed_at, received_at): {rows[:10]}"


def _children(process: subprocess.Popen[bytes]) -> set[int]:
    """The process's children (gunicorn's worker, Celery's pool): the same set later means none restarted."""
    return {int(pid) for pid in Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()}


def test_a_postgres_restart_under_load_is_503_with_retry_after_and_keel_recovers_by_itself(tmp_path):
    workspace = WorkspaceFactory.create(slug="faults")
    _, key = registry_services.apikey_create(workspace=workspace, name="agent", scopes=["ingest", "gateway", "read"])
    with _stub(20, tmp_path / "stub.log") as stub, _separate_postgres() as server:
        _agent_on_stub(workspace, stub.api_base)
        _copy_test_database(server)
        env = _keel_env(server, tmp_path)
        worker_log, web_log = tmp_path / "worker.log", tmp_path / "web.log"
        worker = celery_start(
            ["worker", "-l", "info", "-c", "2", "--without-mingle", "--without-gossip"], env, worker_log
        )
        try:
            with _web(env, web_log) as (base_url, web):

                def web_answers() -> bool:
                    try:
                        return httpx.get(f"{base_url}/v1/models", headers={"Authorization": f"Bearer {key}"}).is_success
                    except httpx.HTTPError:
                        return False

                wait_for(web_answers, 90, "the web app did not start", web_log)
                # The worker's pool (-c 2) is forked once it is up: the set of its processes is compared
                # after the outage, so it is taken only when complete.
                wait_for(lambda: len(_children(worker)) == 2, 90, "the worker's pool did not start", worker_log)
                load = Load(base_url, key)
                threads = [threading.Thread(target=load.ingest) for _ in range(INGEST_THREADS)]
                threads += [threading.Thread(target=load.gateway) for _ in range(GATEWAY_THREADS)]
                threads.append(threading.Thread(target=load.read))
                for thread in threads:
                    thread.start()
                try:
                    wait_for(
                        lambda: all(load.count(kind, "before", 200) >= 1 for kind in KINDS),
                        90,
                        lambda: f"no load before the outage: {load.summary()}",
                        web_log,
                    )
                    web_processes, worker_processes = _children(web), _children(worker)
                    load.phase = "outage"
                    server.stop()
                    wait_for(
                        lambda: bool(load.unexpected()) or all(load.count(kind, "outage", 503) >= 2 for kind in KINDS),
                        60,
                        lambda: f"requests were not refused with 503 while PostgreSQL was stopped: {load.summary()}",
                        web_log,
                    )
                    assert not load.unexpected(), load.unexpected()[:3]
                    server.start()
                    load.phase = "after"
                    wait_for(
                        lambda: all(load.count(kind, "after", 200) >= 3 for kind in KINDS),
                        90,
                        lambda: (
                            f"Keel did not recover after PostgreSQL came back: {load.summary()}; {_unfinished(server)}"
                        ),
                        web_log,
                    )
                finally:
                    load.stop.set()
                    for thread in threads:
                        thread.join(timeout=REQUEST_TIMEOUT_SECONDS * 5)
                assert web.poll() is None
                assert _children(web) == web_processes  # the same gunicorn worker: no restart
            # Read before the worker has caught up with the gateway's batches: an OTLP request answered 200 has
            # stored its spans itself.
            ingested = load.acknowledged["ingest"]
            stored = dict(
                server.query(
                    "SELECT trace_id, count(*) FROM tracing_span WHERE trace_id = ANY(%s) GROUP BY trace_id", ingested
                )
            )
            ingested_spans = server.query(
                "SELECT count(*), count(DISTINCT (trace_id, span_id)) FROM tracing_span WHERE trace_id = ANY(%s)",
                ingested,
            )[0]
            # The worker catches up; beat would send the sweep every minute, the test every second.
            producer = celery_producer(None, tmp_path / "broker")

            swept = [0.0]

            def caught_up() -> bool:
                if time.monotonic() - swept[0] >= 1:
                    producer.send_task("tracing.ingest_batch_sweep")
                    swept[0] = time.monotonic()
                waiting = server.query("SELECT count(*) FROM tracing_ingestbatch WHERE status <> 'done'")[0][0]
                return bool(waiting == 0)

            wait_for(caught_up, 120, lambda: f"the worker did not store every batch: {_unfinished(server)}", worker_log)
            assert worker.poll() is None
            assert _children(worker) == worker_processes  # the same pool process: it carried on
        finally:
            celery_stop(worker)

        # Only a bug while writing in the request leaves an OTLP request to the worker, as a batch.
        otlp_batches = server.query("SELECT count(*) FROM tracing_ingestbatch WHERE source = 'otlp'")[0][0]
        record_facts(
            "PostgreSQL stopped (immediate) and started under load",
            requests_sent=len(load.answers),
            requests_acknowledged=sum(1 for answer in load.answers if answer.status == 200),
            refused_503_with_retry_after=sum(
                1 for answer in load.answers if answer.status == 503 and answer.retry_after is not None
            ),
            refused_503_in_the_outage={
                kind: sum(1 for a in load.answers if (a.kind, a.phase, a.status) == (kind, "outage", 503))
                for kind in KINDS
            },
            throttled_429=sum(1 for answer in load.answers if answer.status == 429),
            other_5xx=sum(1 for answer in load.answers if (answer.status or 0) >= 500 and answer.status != 503),
            unanswered=sum(1 for answer in load.answers if answer.status is None),
            spans_acknowledged=len(ingested) * SPANS_PER_TRACE,
            # Counted when the load stopped, before the worker caught up.
            spans_stored=ingested_spans[1],
            spans_stored_twice=ingested_spans[0] - ingested_spans[1],
            otlp_requests_left_to_the_worker=otlp_batches,
            gateway_requests_answered=len(load.acknowledged["gateway"]),
            gateway_traces_stored=server.query(
                "SELECT count(DISTINCT trace_id) FROM tracing_trajectory WHERE trace_id = ANY(%s)",
                load.acknowledged["gateway"],
            )[0][0],
            failed_batches=server.query("SELECT count(*) FROM tracing_ingestbatch WHERE status = 'failed'")[0][0],
        )
        by_status: dict[int | None, int] = {}
        for answer in load.answers:
            by_status[answer.status] = by_status.get(answer.status, 0) + 1
        assert set(by_status) <= {200, 429, 503}, load.unexpected()[:5]
        refused = [answer for answer in load.answers if answer.status == 503]
        assert refused
        assert {answer.body["code"] for answer in refused} == {"database_unavailable"}
        assert all(answer.body["detail"] for answer in refused)
        # Back-pressure (no turn to store an OTLP request came in time) is the other clean refusal; it also says
        # when to come back.
        throttled = [answer for answer in load.answers if answer.status == 429]
        assert {answer.body["code"] for answer in throttled} <= {"ingest_backlog_full"}
        assert all(answer.retry_after is not None and answer.retry_after.isdigit() for answer in refused + throttled)

        # Every acknowledged trace, each span once, stored in its request and not by the worker.
        assert stored == dict.fromkeys(ingested, SPANS_PER_TRACE)
        assert otlp_batches == 0
        answered = load.acknowledged["gateway"]
        recorded = {
            row[0] for row in server.query("SELECT trace_id FROM tracing_trajectory WHERE trace_id = ANY(%s)", answered)
        }
        assert recorded == set(answered)
        assert server.query("SELECT count(*) FROM tracing_ingestbatch WHERE status = 'failed'")[0][0] == 0


def test_a_retry_after_the_database_failed_mid_batch_takes_back_its_own_claim_and_no_one_elses():
    """What the worker's retry does in the test above when PostgreSQL went away with a batch (there, the gateway's)
    in hand."""
    workspace = WorkspaceFactory.create(slug="faults-claim")
    api_key, _ = registry_services.apikey_create(workspace=workspace, name="agent", scopes=["ingest"])
    trace_ids = trace_ids_new(2)
    accepted = tracing_services.ingest_otlp_defer(
        api_key=api_key, body=otlp_json(trace_ids), content_type="application/json", content_encoding=""
    )
    assert accepted.batch_id is not None
    # Claimed (attempt 1), then the database failed before the batch was stored: the claim stays behind.
    IngestBatch.objects.filter(pk=accepted.batch_id).update(
        status=BatchStatus.PROCESSING, attempts=1, claimed_at=timezone.now()
    )

    assert tracing_services.span_batch_process(batch_id=accepted.batch_id) == 0  # the lease holds it
    assert tracing_services.span_batch_process(batch_id=accepted.batch_id, held=2) == 0  # not that claim
    assert not Span.objects.filter(workspace=workspace).exists()

    assert tracing_services.span_batch_process(batch_id=accepted.batch_id, held=1) == len(trace_ids) * SPANS_PER_TRACE

    batch = IngestBatch.objects.get(pk=accepted.batch_id)
    assert (batch.status, batch.attempts) == (BatchStatus.DONE, 2)
    assert tracing_services.span_batch_process(batch_id=accepted.batch_id, held=2) == 0  # done stays done
    record_facts(
        "a retry after the database failed mid-batch",
        spans_acknowledged=len(trace_ids) * SPANS_PER_TRACE,
        spans_stored=Span.objects.filter(workspace=workspace).count(),
        batch_attempts=IngestBatch.objects.get(pk=accepted.batch_id).attempts,
    )
