"""Load runs shared by the load tests (tests/load) and `make bench` (bench/bench_load.py).

Both run against a Keel that the caller started with `bench.stack.keel_running` (gunicorn 2 × 4 threads
and a Celery worker, as `make run` starts them), on the database this process's Django is configured
for: the tests' database (pytest-django) or a benchmark's own (bench/stack.py). They create what they
need through Keel's services, send their load over HTTP from threads of this process, and read the
database afterwards to check what Keel stored.

**Ingest at twice capacity** (`ingest_load`):
1. A seed request, waited for until stored: its first trajectory is the one the dashboard prober opens.
2. `capacity` (unless given): `capacity_seconds` of closed-loop OTLP/protobuf sends (`senders` threads,
   each sending its next request as soon as the last one is answered, and after a refusal waiting out
   its Retry-After, as an exporter does), then a drain of anything left to the worker (a request Keel
   failed to store in the web process). Keel stored spans from the first request (about a second in)
   to the end, so the rate at which it stored them over that time is the sustained capacity.
3. `overload`: requests offered at `factor` × capacity (open loop: a fixed schedule of send times shared
   by `overload_senders` threads, whatever the answers) for `seconds`, then a drain. A refused request (429 or
   503) is sent again, with the same body, in the first free slot after its Retry-After, at most
   `max_attempts` times in all; a retry takes a slot in the schedule, so the offered rate stays the
   factor × capacity. A connection error is retried at once on a new connection, with the same body.
4. Meanwhile: the RSS of every process of Keel's web and worker process trees twice a second (psutil,
   else /proc), and a signed-in dashboard session fetching the overview, the trajectory list and one
   trajectory every second, timed.
5. Then the (trace id, span id) pairs stored for the workspace (counted, so a duplicate shows) are
   compared with the pairs of every request Keel acknowledged. Refused requests that were never
   acknowledged must have left nothing behind.
Every request body is a real OTel SDK export (bench/workload.py: 50 trajectories × 10 spans, ~0.85 MB)
with 8 fresh random bytes in every trace id, so every span sent has a (trace id, span id) never sent
before, except a refused body's retry, which repeats it on purpose.

**Gateway under concurrent clients** (`gateway_load`): `clients` threads, each with its own keep-alive
connection, POST `/v1/chat/completions` (`agent/<slug>`, a single-level agent whose single call goes to
the stub model server, bench/stub_model_server.py) back to back for `seconds`, after a warm-up. Each
request's last message carries a marker; the stub reports its own receive-to-answer time per marker,
so each request's overhead is its time at the client less the stub's time for it. A request whose
connection fails is sent again on a new one (`CONNECTION_ATTEMPTS` in all), as HTTP clients do; each
such failure is reported by its exception. Errors are counted by origin: the stub's (a provider error
whose attempt carries a status the stub can send; it sends none unless asked a bad request) and Keel's
(every other failed request). Afterwards the worker's backlog is drained and every answered request's
trace is looked for in the trajectory table.
"""

from __future__ import annotations

import contextlib
import http.client
import importlib
import math
import os
import re
import signal
import ssl
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import stack
from bench.harness import Report, percentile
from bench.workload import Template, templates_build

# Statuses of a refusal the client may retry; Keel must send Retry-After with each.
REFUSED = (429, 503)
# Tries of a request whose connection fails (reset, closed before the answer, refused), each on a new
# connection, as HTTP clients do (the `openai` client, by default, three): the OTLP senders and the gateway's clients.
CONNECTION_ATTEMPTS = 3
STUB_LATENCY_MS = 20.0
PAGES = ("overview", "trajectory list", "trajectory")


# --- The Keel under load -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Keel:
    """A running Keel: its web port, the processes `stack.keel_running` started, and their environment."""

    port: int
    processes: stack.Processes
    environment: dict[str, str]

    def process_trees(self) -> dict[str, list[int]]:
        return {name: stack.process_tree(self.processes.pid(name)) for name in ("web", "worker")}

    def stop(self) -> None:
        """Kill both process groups. The load runs drain the worker's backlog before they end (and check
        that they did), nothing is in flight, and the database holds every unit of work; a graceful stop
        takes about ten seconds (gunicorn's workers outlive their "exiting" by its graceful timeout)."""
        started = time.monotonic()
        for name in ("worker", "web"):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.processes.pid(name), signal.SIGKILL)
        self.processes.stop(timeout=15)
        _progress(f"Keel stopped in {time.monotonic() - started:.1f} s")


def keel_environment_for_current_database(broker_dir: Path) -> dict[str, str]:
    """The environment of Keel's processes, on the database this process's Django uses (the tests')."""
    from django.conf import settings
    from django.db import connection

    database = connection.settings_dict
    environment = stack.keel_environment(stack.Database("", 0, database["NAME"]), broker_dir)
    if settings.DATABASE_EMBEDDED:
        environment["KEEL_PGDATA"] = str(settings.EMBEDDED_DATA_DIR)
    else:
        environment["DATABASE_URL"] = (
            f"postgres://{database['USER']}:{database['PASSWORD']}@{database['HOST']}:{database['PORT']}"
            f"/{database['NAME']}"
        )
    return environment


# --- Memory --------------------------------------------------------------------------------------------


def _rss_bytes(pid: int) -> int:
    """Resident set size of one process (0 if it is gone): psutil when it is installed, else /proc."""
    try:
        # Not a dependency of Keel's: imported by name, so that its absence (and its missing type
        # stubs) cost nothing.
        psutil: Any = importlib.import_module("psutil")
    except ImportError:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return 0
        found = re.search(r"^VmRSS:\s*(\d+) kB", status, re.MULTILINE)
        return int(found.group(1)) * 1024 if found else 0
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return 0


@dataclass
class MemorySample:
    seconds: float  # since the sampler started
    total: dict[str, int]  # process tree -> sum of its processes' RSS
    largest: dict[str, int]  # process tree -> RSS of its largest process
    processes: dict[str, int]  # process tree -> how many processes it had


class MemorySampler:
    """Samples the RSS of Keel's process trees every `interval` seconds in a thread of its own."""

    def __init__(self, trees: Callable[[], dict[str, list[int]]], interval: float = 0.5) -> None:
        self.trees = trees
        self.interval = interval
        self.samples: list[MemorySample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss sampler", daemon=True)
        self._started = 0.0

    def _run(self) -> None:
        while not self._stop.is_set():
            sizes = {name: [_rss_bytes(pid) for pid in pids] for name, pids in self.trees().items()}
            self.samples.append(
                MemorySample(
                    time.monotonic() - self._started,
                    {name: sum(values) for name, values in sizes.items()},
                    {name: max(values, default=0) for name, values in sizes.items()},
                    {name: len(values) for name, values in sizes.items()},
                )
            )
            self._stop.wait(self.interval)

    def __enter__(self) -> MemorySampler:
        self._started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def peak(self, tree: str, largest: bool = False) -> int:
        """The peak RSS of a tree: of all its processes together, or of its largest process."""
        return max(((sample.largest if largest else sample.total)[tree] for sample in self.samples), default=0)

    def peak_in(self, tree: str, start: float, end: float) -> int:
        """The peak total RSS of a tree among the samples taken between `start` and `end` (shares of the run)."""
        if not self.samples:
            return 0
        last = self.samples[-1].seconds or 1.0
        chosen = [s.total[tree] for s in self.samples if start * last <= s.seconds <= end * last]
        return max(chosen, default=0)


# --- The dashboard, signed in ----------------------------------------------------------------------------


@dataclass
class PageTime:
    page: str
    status: int
    seconds: float


class DashboardProber:
    """A signed-in user opening the overview, the trajectory list and one trajectory every `interval` s."""

    def __init__(self, port: int, username: str, password: str, workspace_slug: str, trace_id: str) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.username = username
        self.password = password
        self.paths = {
            "overview": f"/w/{workspace_slug}/",
            "trajectory list": f"/w/{workspace_slug}/trajectories/",
            "trajectory": f"/w/{workspace_slug}/trajectories/{trace_id}/",
        }
        self.times: list[PageTime] = []
        self.errors: list[str] = []
        self.interval = 1.0
        self._stop = threading.Event()
        self._thread: threading.Thread

    def sign_in(self) -> Any:
        """A client holding a signed-in session: the sign-in form, posted with its CSRF token."""
        import httpx

        client = httpx.Client(base_url=self.base, timeout=120.0, follow_redirects=False)
        try:
            page = client.get("/login/")
            token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
            if page.status_code != 200 or token is None:
                raise RuntimeError(f"the sign-in page answered {page.status_code} without a CSRF token")
            answer = client.post(
                "/login/",
                data={"username": self.username, "password": self.password, "csrfmiddlewaretoken": token.group(1)},
                headers={"Referer": f"{self.base}/login/"},
            )
            if answer.status_code != 302 or "sessionid" not in client.cookies:
                raise RuntimeError(f"signing in answered {answer.status_code}: {answer.text[:500]}")
        except BaseException:
            client.close()
            raise
        return client

    def _run(self, client: Any) -> None:
        import httpx

        try:
            while not self._stop.is_set():
                round_started = time.monotonic()
                for page, path in self.paths.items():
                    started = time.perf_counter()
                    try:
                        response = client.get(path)
                        status = response.status_code
                    except httpx.HTTPError as error:
                        status = -1
                        self.errors.append(f"{page}: {type(error).__name__}: {error}")
                    self.times.append(PageTime(page, status, time.perf_counter() - started))
                self._stop.wait(max(0.0, self.interval - (time.monotonic() - round_started)))
        finally:
            client.close()

    def __enter__(self) -> DashboardProber:
        self._thread = threading.Thread(target=self._run, args=(self.sign_in(),), name="dashboard prober", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=180)

    def statuses(self) -> Counter[int]:
        return Counter(time.status for time in self.times)

    def seconds(self, page: str | None = None) -> list[float]:
        return [t.seconds for t in self.times if t.status == 200 and (page is None or t.page == page)]


# --- Ingest ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IngestWorld:
    workspace_id: int
    workspace_slug: str
    username: str
    password: str
    key: str


def ingest_world_create(slug: str = "load") -> IngestWorld:
    """A workspace with an owner who can sign in to the dashboard, and an ingest key."""
    from django.contrib.auth.hashers import PBKDF2PasswordHasher

    from agent_registry import services
    from agent_registry.models import Scope, User

    password = f"{slug}-{os.urandom(8).hex()}"
    owner = User.objects.create_user(username=f"{slug}-owner", password=None)
    # Hashed with the production settings' hasher, which Keel's processes check it with (the tests' own
    # settings hash with MD5, which those processes do not accept).
    owner.password = PBKDF2PasswordHasher().encode(password, os.urandom(12).hex())
    owner.save(update_fields=["password"])
    workspace = services.workspace_create(slug=slug, name=f"Load {slug}", owner=owner)
    _, key = services.apikey_create(workspace=workspace, name="load ingest", scopes=[Scope.INGEST])
    return IngestWorld(workspace.pk, workspace.slug, owner.username, password, key)


@dataclass(frozen=True)
class SpanKeys:
    """A template's span ids per trajectory, in the order of `Template.suffixes`."""

    template: Template
    span_ids: tuple[tuple[str, ...], ...]

    def keys(self, trace_ids: Sequence[str]) -> Iterator[tuple[str, str]]:
        for trace_id, span_ids in zip(trace_ids, self.span_ids, strict=True):
            for span_id in span_ids:
                yield trace_id, span_id


def span_keys_read(template: Template) -> SpanKeys:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest.FromString(template.body)
    by_suffix: dict[bytes, list[str]] = {}
    for resource in request.resource_spans:
        for scope in resource.scope_spans:
            for span in scope.spans:
                by_suffix.setdefault(span.trace_id[8:], []).append(span.span_id.hex())
    span_ids = tuple(tuple(by_suffix[suffix]) for suffix in template.suffixes)
    if sum(len(ids) for ids in span_ids) != template.spans or any(len(set(ids)) != len(ids) for ids in span_ids):
        raise RuntimeError("a template's span ids are not what bench/workload.py promises")
    return SpanKeys(template, span_ids)


@dataclass
class Batch:
    """One request body as the client sees it: every attempt's answer, and how it ended."""

    number: int
    phase: str
    keys: SpanKeys
    trace_ids: list[str]
    body: bytes
    statuses: list[int] = field(default_factory=list)
    # Refusals (429/503) that came without a Retry-After header.
    without_retry_after: int = 0
    connection_errors: int = 0
    rejected_spans: int = 0
    outcome: str = "pending"  # acknowledged | refused | failed | pending
    acknowledged_at: float = 0.0
    due: float = 0.0  # when a refused batch may be sent again
    request_seconds: list[float] = field(default_factory=list)

    def finish(self, outcome: str) -> None:
        """The batch's last answer is in: its body is not needed any more (a long run sends gigabytes)."""
        self.outcome = outcome
        self.body = b""


@dataclass
class Phase:
    name: str
    seconds: float
    offered_spans_per_second: float  # the schedule; 0 for closed loop
    started: float = 0.0
    # (seconds since the phase started, spans stored for the workspace), through the phase and its drain
    stored: list[tuple[float, int]] = field(default_factory=list)
    drained: bool = False
    drain_seconds: float = math.nan
    unfinished_batches: int = 0

    def stored_rate(self, start: float = 0.0, end: float | None = None) -> float:
        """Spans stored per second between `start` and `end` seconds after the phase started (its end)."""
        end = self.seconds if end is None else end
        window = [point for point in self.stored if start <= point[0] <= end + 0.5]
        if len(window) < 2:
            return math.nan
        (first_at, first), (last_at, last) = window[0], window[-1]
        return (last - first) / (last_at - first_at) if last_at > first_at else math.nan


@dataclass
class IngestResult:
    capacity: float  # spans/s; measured unless given
    capacity_measured: bool
    factor: float
    phases: list[Phase]
    batches: list[Batch]
    spans_per_request: int
    failed_batches: int
    stored_pairs: int
    duplicates: int  # (trace id, span id) pairs stored more than once
    lost: int  # acknowledged pairs not stored
    unexpected: int  # stored pairs never acknowledged (refused, or never sent)
    memory: MemorySampler
    dashboard: DashboardProber
    senders: int

    @property
    def drained(self) -> bool:
        return all(phase.drained for phase in self.phases)

    @property
    def unfinished_batches(self) -> int:
        return sum(phase.unfinished_batches for phase in self.phases)

    def of(self, phase: str | None = None) -> list[Batch]:
        return [batch for batch in self.batches if phase is None or batch.phase == phase]

    def statuses(self, phase: str | None = None) -> Counter[int]:
        return Counter(status for batch in self.of(phase) for status in batch.statuses)

    def outcomes(self, phase: str | None = None) -> Counter[str]:
        return Counter(batch.outcome for batch in self.of(phase))

    def refusals_without_retry_after(self) -> int:
        return sum(batch.without_retry_after for batch in self.batches)

    def unexpected_statuses(self) -> Counter[int]:
        """Answers that are neither an acknowledgement nor a refusal to retry: each one is Keel's error
        (-1: no answer after three connection attempts)."""
        return Counter(
            {status: n for status, n in self.statuses().items() if not (200 <= status < 300 or status in REFUSED)}
        )

    def acknowledged_spans(self, phase: str | None = None) -> int:
        return sum(
            batch.keys.template.spans - batch.rejected_spans
            for batch in self.of(phase)
            if batch.outcome == "acknowledged"
        )


class _Ledger:
    """The batches of a run, the retry queue, and each sender's schedule of send times."""

    def __init__(self, span_keys: Sequence[SpanKeys], max_attempts: int) -> None:
        self.span_keys = span_keys
        self.max_attempts = max_attempts
        self.batches: list[Batch] = []
        self.retry: list[Batch] = []
        self.lock = threading.Lock()
        self._slot = 0

    def fresh(self, phase: str) -> Batch:
        with self.lock:
            number = len(self.batches)
            keys = self.span_keys[number % len(self.span_keys)]
            body, trace_ids = keys.template.fresh()
            batch = Batch(number, phase, keys, trace_ids, body)
            self.batches.append(batch)
            return batch

    def next_batch(self, phase: str) -> Batch:
        """A refused batch whose Retry-After has passed, else a new one."""
        now = time.monotonic()
        with self.lock:
            for position, batch in enumerate(self.retry):
                if batch.due <= now:
                    return self.retry.pop(position)
        return self.fresh(phase)

    def slot(self, start: float, interval: float, end: float) -> float | None:
        """The next send time of an open-loop schedule (None past its end)."""
        with self.lock:
            when = start + self._slot * interval
            self._slot += 1
        return when if when < end else None

    def schedule_reset(self) -> None:
        with self.lock:
            self._slot = 0

    def refused(self, batch: Batch, retry_after: float, end: float) -> None:
        due = time.monotonic() + retry_after
        with self.lock:
            if len(batch.statuses) < self.max_attempts and due < end:
                batch.due = due
                self.retry.append(batch)
            else:
                batch.finish("refused")

    def abandon_retries(self) -> None:
        with self.lock:
            for batch in self.retry:
                batch.finish("refused")
            self.retry.clear()


def _progress(message: str) -> None:
    print(f"[load {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _retry_after_seconds(value: str | None) -> float:
    if value is None:
        return 1.0
    try:
        return max(0.0, float(value.strip()))
    except ValueError:
        return 1.0


def _rejected_spans(body: bytes) -> int:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    from tracing.otlp import DecodeError

    try:
        return int(ExportTraceServiceResponse.FromString(body).partial_success.rejected_spans)
    except DecodeError:  # an answer that is not a response counts as nothing rejected
        return 0


class _Sender:
    """One client thread's keep-alive connection to Keel's OTLP endpoint."""

    # gunicorn closes a keep-alive connection idle for 2 s (its default); one idle for longer than this
    # is not reused, so that the race between that close and a new request never looks like an error.
    IDLE_SECONDS = 1.5

    def __init__(self, port: int, key: str) -> None:
        self.port = port
        self.headers = {"Content-Type": "application/x-protobuf", "Authorization": f"Bearer {key}"}
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        self.used_at = time.monotonic()

    def send(self, batch: Batch) -> tuple[int, str | None]:
        """POST the batch; a broken connection is retried at once on a new one with the same body:
        spans are keyed on their ids, so a request that did reach Keel and is sent again changes nothing."""
        for _ in range(CONNECTION_ATTEMPTS):
            if time.monotonic() - self.used_at > self.IDLE_SECONDS:
                self.connection.close()
            started = time.perf_counter()
            try:
                self.connection.request("POST", "/v1/traces", body=batch.body, headers=self.headers)
                response = self.connection.getresponse()
                answer = response.read()
            except (OSError, http.client.HTTPException):
                self.connection.close()
                self.connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
                batch.connection_errors += 1
                continue
            finally:
                self.used_at = time.monotonic()
            batch.request_seconds.append(time.perf_counter() - started)
            batch.statuses.append(response.status)
            if 200 <= response.status < 300:
                batch.rejected_spans = _rejected_spans(answer)
            return response.status, response.getheader("Retry-After")
        batch.statuses.append(-1)
        return -1, None

    def close(self) -> None:
        self.connection.close()


def _send_one(sender: _Sender, ledger: _Ledger, batch: Batch, end: float) -> None:
    status, retry_after = sender.send(batch)
    if 200 <= status < 300:
        batch.acknowledged_at = time.monotonic()
        batch.finish("acknowledged")
    elif status in REFUSED:
        if retry_after is None:
            batch.without_retry_after += 1
        ledger.refused(batch, _retry_after_seconds(retry_after), end)
    else:
        batch.finish("failed")


def _phase_run(
    world: IngestWorld,
    port: int,
    ledger: _Ledger,
    phase: Phase,
    senders: int,
    spans_per_request: int,
    drain_timeout: float,
) -> None:
    """Send for the phase's length from `senders` threads, sampling the stored count in this thread; then
    give up the refused batches still waiting for a retry, and wait for the worker to drain the queue."""
    start = time.monotonic() + 0.2
    end = start + phase.seconds
    interval = spans_per_request / phase.offered_spans_per_second if phase.offered_spans_per_second else 0.0
    ledger.schedule_reset()

    def sender_thread() -> None:
        sender = _Sender(port, world.key)
        try:
            while True:
                if interval:
                    when = ledger.slot(start, interval, end)
                    if when is None:
                        return
                    delay = when - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                elif time.monotonic() >= end:
                    return
                batch = ledger.next_batch(phase.name)
                _send_one(sender, ledger, batch, end)
                if not interval and batch.outcome == "pending":
                    # Closed loop: like an exporter, the thread waits out the Retry-After of its refused
                    # batch (and then sends it again, unless another thread took it first).
                    time.sleep(max(0.0, min(batch.due, end) - time.monotonic()))
        finally:
            sender.close()

    threads = [threading.Thread(target=sender_thread, name=f"sender {n}", daemon=True) for n in range(senders)]
    time.sleep(max(0.0, start - time.monotonic()))
    phase.started = time.monotonic()
    for thread in threads:
        thread.start()
    while time.monotonic() < end:
        phase.stored.append((time.monotonic() - phase.started, _stored_spans(world.workspace_id)))
        time.sleep(min(0.5, max(0.0, end - time.monotonic())))
    phase.stored.append((time.monotonic() - phase.started, _stored_spans(world.workspace_id)))
    for thread in threads:
        thread.join(timeout=300)
    ledger.abandon_retries()
    phase.drained, phase.drain_seconds, phase.unfinished_batches = ingest_drain(world.workspace_id, drain_timeout)
    phase.stored.append((time.monotonic() - phase.started, _stored_spans(world.workspace_id)))


def _stored_spans(workspace_id: int) -> int:
    """Spans Keel has stored for the workspace: the span counts of its trajectories, which are written in the
    same transaction as their spans, by the web (OTLP) or a worker (a batch). One query on the trajectory
    table, a tenth of the span table's rows, rather than counting a growing span table twice a second."""
    from django.db.models import Sum

    from tracing.models import Trajectory

    stored = Trajectory.objects.filter(workspace_id=workspace_id).aggregate(total=Sum("span_count"))["total"]
    return int(stored or 0)


def ingest_drain(workspace_id: int, timeout: float, stalled_after: float = 30.0) -> tuple[bool, float, int]:
    """Wait until the workspace has no pending or processing batch; returns (drained, seconds, unfinished).

    Gives up after `timeout`, or when nothing finished for `stalled_after` seconds."""
    from tracing.models import BatchStatus, IngestBatch

    started = time.monotonic()
    unfinished = IngestBatch.objects.filter(
        workspace_id=workspace_id, status__in=(BatchStatus.PENDING, BatchStatus.PROCESSING)
    )
    last, last_change = -1, started
    while True:
        count = unfinished.count()
        now = time.monotonic()
        if count == 0:
            return True, now - started, 0
        if count != last:
            last, last_change = count, now
        if now - started > timeout or now - last_change > stalled_after:
            return False, now - started, count
        time.sleep(0.2)


def _stored_pairs(workspace_id: int) -> Counter[tuple[str, str]]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT trace_id, span_id, count(*) FROM tracing_span WHERE workspace_id = %s GROUP BY trace_id, span_id",
            [workspace_id],
        )
        return Counter({(trace_id, span_id): count for trace_id, span_id, count in cursor.fetchall()})


def _seed(world: IngestWorld, port: int, ledger: _Ledger, timeout: float) -> str:
    """Send one batch and wait until it is stored; returns a trace id the dashboard can open."""
    sender = _Sender(port, world.key)
    batch = ledger.fresh("seed")
    deadline = time.monotonic() + timeout
    try:
        while batch.outcome != "acknowledged":
            _send_one(sender, ledger, batch, deadline)
            if batch.outcome == "pending":  # refused: the retry queue holds it; send it here instead
                with ledger.lock:
                    ledger.retry.remove(batch)
                time.sleep(max(0.0, batch.due - time.monotonic()))
            elif batch.outcome != "acknowledged":
                raise RuntimeError(f"the seed batch was answered {batch.statuses}")
    finally:
        sender.close()
    drained, _, _ = ingest_drain(world.workspace_id, timeout)
    if not drained:
        raise RuntimeError("the seed batch was not processed; is the worker running?")
    return batch.trace_ids[0]


@dataclass(frozen=True)
class IngestOptions:
    seconds: float  # of the overload phase
    capacity: float | None = None  # spans/s; measured first when None
    capacity_seconds: float = 20.0
    factor: float = 2.0
    senders: int = 8
    # The overload phase's senders: Keel answers a request once it has stored it, about half a second for
    # 500 spans when it is at capacity, so 8 senders could not keep to a schedule of twice that.
    overload_senders: int = 32
    max_attempts: int = 3
    templates: int = 8
    drain_timeout: float = 600.0


def ingest_load(keel: Keel, world: IngestWorld, options: IngestOptions) -> IngestResult:
    span_keys = [span_keys_read(template) for template in templates_build(options.templates)]
    spans_per_request = span_keys[0].template.spans
    ledger = _Ledger(span_keys, options.max_attempts)
    trace_id = _seed(world, keel.port, ledger, timeout=120)
    _progress(f"ingest: seeded; {len(span_keys)} request bodies of {spans_per_request} spans")
    phases: list[Phase] = []
    dashboard = DashboardProber(keel.port, world.username, world.password, world.workspace_slug, trace_id)
    with MemorySampler(keel.process_trees) as memory, dashboard:
        capacity = options.capacity
        if capacity is None:
            measuring = Phase("capacity", options.capacity_seconds, 0.0)
            _phase_run(world, keel.port, ledger, measuring, options.senders, spans_per_request, options.drain_timeout)
            phases.append(measuring)
            # Keel stored spans from the first request (about a second in) to the end of the drain.
            capacity = measuring.stored_rate(1.0, math.inf)
            if not capacity > 0:
                raise RuntimeError(f"no spans were stored while measuring capacity: {measuring.stored}")
            _progress(f"ingest: capacity {capacity:,.0f} spans/s")
        overload = Phase("overload", options.seconds, options.factor * capacity)
        _phase_run(
            world, keel.port, ledger, overload, options.overload_senders, spans_per_request, options.drain_timeout
        )
        phases.append(overload)
        _progress(
            f"ingest: {options.factor:g} × capacity for {options.seconds:g} s; "
            f"drained in {overload.drain_seconds:.1f} s"
        )

    from tracing.models import BatchStatus, IngestBatch

    stored = _stored_pairs(world.workspace_id)
    acknowledged: set[tuple[str, str]] = set()
    for batch in ledger.batches:
        if batch.outcome == "acknowledged":
            acknowledged.update(batch.keys.keys(batch.trace_ids))
    return IngestResult(
        capacity=capacity,
        capacity_measured=options.capacity is None,
        factor=options.factor,
        phases=phases,
        batches=ledger.batches,
        spans_per_request=spans_per_request,
        failed_batches=IngestBatch.objects.filter(workspace_id=world.workspace_id, status=BatchStatus.FAILED).count(),
        stored_pairs=len(stored),
        duplicates=sum(1 for count in stored.values() if count > 1),
        lost=len(acknowledged - stored.keys()),
        unexpected=len(stored.keys() - acknowledged),
        memory=memory,
        dashboard=dashboard,
        senders=options.overload_senders,
    )


# --- Gateway -----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def stub_running(environment: Mapping[str, str], latency_ms: float = STUB_LATENCY_MS) -> Iterator[int]:
    """bench/stub_model_server.py in a process of its own; yields its port."""
    port = stack.free_port()
    stub = stack.Processes()
    stub.start(
        "stub",
        [sys.executable, "-m", "bench.stub_model_server", "--port", str(port), "--latency-ms", f"{latency_ms:g}"],
        environment,
        stack.LOG_DIR / "load-stub.log",
    )
    try:
        if not stack.wait_for_http(port, "/health", timeout=30):
            raise RuntimeError(f"the stub model server did not start; see {stack.LOG_DIR / 'load-stub.log'}")
        yield port
    finally:
        stub.stop()


@dataclass(frozen=True)
class GatewayWorld:
    workspace_id: int
    key: str
    model: str  # what the clients ask for: agent/<slug>


def gateway_world_create(stub_port: int) -> GatewayWorld:
    """bench_gateway's fixtures (a workspace, a model target on the stub, agents with a production prompt,
    a gateway key); the clients call its single-level agent, whose single call goes to the stub."""
    from bench.bench_gateway import _fixtures

    fixtures = _fixtures(f"http://127.0.0.1:{stub_port}/v1")
    return GatewayWorld(fixtures.workspace.pk, fixtures.raw_key, f"agent/{fixtures.single_level.slug}")


@dataclass
class Call:
    marker: str
    status: int
    seconds: float
    code: str = ""
    origin: str = ""  # of an error: keel | stub
    trace_id: str = ""
    provider_seconds: float | None = None
    retried: list[str] = field(default_factory=list)  # the transport failures that made the client send it again

    @property
    def overhead(self) -> float | None:
        return None if self.provider_seconds is None else self.seconds - self.provider_seconds


@dataclass
class GatewayResult:
    clients: int
    seconds: float
    stub_latency_ms: float
    calls: list[Call]
    drained: bool
    drain_seconds: float
    traces_missing: int  # answered requests whose trace is not in the trajectory table once the records caught up
    memory: MemorySampler

    def answered(self) -> list[Call]:
        return [call for call in self.calls if call.status == 200]

    def errors(self, origin: str) -> Counter[str]:
        return Counter(f"{call.status} {call.code}".strip() for call in self.calls if call.origin == origin)

    def retried(self) -> Counter[str]:
        """Transport failures the clients retried on a new connection, by exception (and its message)."""
        return Counter(failure for call in self.calls for failure in call.retried)

    def overheads(self) -> list[float]:
        return [overhead for call in self.answered() if (overhead := call.overhead) is not None]


# The only error statuses bench/stub_model_server.py ever answers (to a malformed or misrouted request).
STUB_ERROR_STATUSES = (400, 404, 405, 413)


def _error_origin(status: int, body: Any) -> tuple[str, str]:
    """(code, origin) of a failed gateway answer. The stub is the origin only when Keel says the provider
    failed and an attempt carries a status the stub itself can send; everything else is Keel's, a failed
    connection to the stub or a timeout waiting for it included (neither carries a status the stub sends:
    litellm gives them one of its own, Keel's own client for OpenAI-compatible servers none; and the stub,
    one asyncio loop with a listen backlog of 1,024, refuses nothing)."""
    error = body.get("error") if isinstance(body, dict) else None
    code = str(error.get("code") or "") if isinstance(error, dict) else ""
    attempts = body.get("attempts") if isinstance(body, dict) else None
    if (
        status == 502
        and code == "provider_error"
        and isinstance(attempts, list)
        and any(isinstance(attempt, dict) and attempt.get("status_code") in STUB_ERROR_STATUSES for attempt in attempts)
    ):
        return code, "stub"
    return code or ("connection" if status < 0 else ""), "keel"


def _gateway_clients(port: int, world: GatewayWorld, clients: int, seconds: float, prefix: str) -> list[Call]:
    """`clients` threads with a keep-alive connection each, calling back to back for `seconds`."""
    import httpx

    calls: list[Call] = []
    lock = threading.Lock()
    window: list[float] = []
    # The window opens once every client is ready (making a hundred clients takes seconds on a busy machine).
    barrier = threading.Barrier(clients, action=lambda: window.append(time.monotonic() + seconds))
    # One TLS context for all (each client would load the CA bundle for it; the connections are plain HTTP).
    tls = ssl.create_default_context()

    def client(number: int) -> None:
        connection = httpx.Client(
            base_url=f"http://127.0.0.1:{port}",
            headers={"Authorization": f"Bearer {world.key}"},
            timeout=120.0,
            verify=tls,
        )
        count = 0
        barrier.wait()
        try:
            while time.monotonic() < window[0]:
                count += 1
                marker = f"{prefix}{number}x{count}"
                body = {
                    "model": world.model,
                    "messages": [{"role": "user", "content": f"Where is my driver? [bench:{marker}]"}],
                    "variables": {"company": "Acme Rides"},
                }
                started = time.perf_counter()
                failures: list[str] = []  # each transport failure, named by its exception (how it failed)
                response = None
                while response is None and len(failures) < CONNECTION_ATTEMPTS:
                    try:
                        response = connection.post("/v1/chat/completions", json=body)
                    except httpx.TransportError as error:  # the client drops the connection; the next try opens one
                        failures.append(f"{type(error).__name__}: {error}")
                if response is None:  # the last failure ended the tries; every one before it was retried
                    status, trace_id, answer = -1, "", None
                    retried, failure = failures[:-1], failures[-1]
                else:
                    retried, failure = failures, ""
                    status = response.status_code
                    trace_id = response.headers.get("X-Keel-Trace-Id", "")
                    try:
                        answer = response.json() if status != 200 else None
                    except ValueError:  # an error answer that is not JSON (gunicorn's own, say)
                        answer, failure = None, f"not JSON: {response.text[:80]!r}"
                call = Call(marker, status, time.perf_counter() - started, trace_id=trace_id, retried=retried)
                if status != 200:
                    call.code, call.origin = _error_origin(status, answer)
                    call.code = f"{call.code} ({failure})" if failure else call.code
                with lock:
                    calls.append(call)
        finally:
            connection.close()

    threads = [threading.Thread(target=client, args=(n,), name=f"client {n}", daemon=True) for n in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=seconds + 300)
    return calls


def _stub_timings(stub_port: int) -> dict[str, tuple[int, int]]:
    import httpx

    data = httpx.get(f"http://127.0.0.1:{stub_port}/_timings", timeout=30).json()
    return {key: (value[0], value[1]) for key, value in data.items()}


@dataclass(frozen=True)
class GatewayOptions:
    seconds: float
    clients: int = 100
    warmup_seconds: float = 3.0
    warmup_clients: int = 8
    stub_latency_ms: float = STUB_LATENCY_MS
    drain_timeout: float = 600.0


def gateway_load(keel: Keel, world: GatewayWorld, stub_port: int, options: GatewayOptions) -> GatewayResult:
    from tracing.models import Trajectory

    if options.warmup_seconds:
        # Each gunicorn worker's first gateway request pays for first reads (litellm's price file, the config
        # caches) and connection pools: a few clients first, not counted.
        _gateway_clients(keel.port, world, options.warmup_clients, options.warmup_seconds, "w")
        _stub_timings(stub_port)
        _progress("gateway: warmed up")
    with MemorySampler(keel.process_trees) as memory:
        calls = _gateway_clients(keel.port, world, options.clients, options.seconds, "c")
        _progress(f"gateway: {len(calls)} requests from {options.clients} clients; waiting for their records")
        timings = _stub_timings(stub_port)
        answered = {call.trace_id for call in calls if call.status == 200 and call.trace_id}
        # The web processes write each request's record after answering (and leave a span batch for the
        # worker when assembly fails): wait until both have caught up, while either still makes progress.
        started = progressed = time.monotonic()
        stored: set[str] = set()
        drained = False
        while time.monotonic() - started < options.drain_timeout and time.monotonic() - progressed < 10.0:
            drained, _, _ = ingest_drain(world.workspace_id, options.drain_timeout)
            now_stored = set(
                Trajectory.objects.filter(workspace_id=world.workspace_id, trace_id__in=answered).values_list(
                    "trace_id", flat=True
                )
            )
            if now_stored != stored:
                stored, progressed = now_stored, time.monotonic()
            if stored == answered:
                break
            time.sleep(0.2)
        drain_seconds = time.monotonic() - started
        _progress(f"gateway: drained={drained} in {drain_seconds:.1f} s")
    for call in calls:
        seen = timings.get(call.marker)
        if seen is not None:
            call.provider_seconds = (seen[1] - seen[0]) / 1e9
    return GatewayResult(
        clients=options.clients,
        seconds=options.seconds,
        stub_latency_ms=options.stub_latency_ms,
        calls=calls,
        drained=drained,
        drain_seconds=drain_seconds,
        traces_missing=len(answered - stored),
        memory=memory,
    )


# --- Reports -------------------------------------------------------------------------------------------------


def _ms(values: Sequence[float], share: float) -> str:
    value = percentile(values, share)
    return "—" if math.isnan(value) else f"{value * 1000:,.0f}"


def _mib(value: int) -> str:
    return f"{value / 2**20:,.0f}"


def _counts(counter: Counter[Any]) -> str:
    return ", ".join(f"{key}: {count:,}" for key, count in sorted(counter.items(), key=str)) or "none"


def memory_table(report: Report, memory: MemorySampler) -> None:
    report.table(
        [
            "process tree",
            "processes",
            "RSS peak MiB (all processes)",
            "largest process peak MiB",
            "peak, first third MiB",
            "peak, last third MiB",
        ],
        [
            [
                tree,
                max((sample.processes[tree] for sample in memory.samples), default=0),
                _mib(memory.peak(tree)),
                _mib(memory.peak(tree, largest=True)),
                _mib(memory.peak_in(tree, 0.0, 1 / 3)),
                _mib(memory.peak_in(tree, 2 / 3, 1.0)),
            ]
            for tree in ("web", "worker")
        ],
    )


def _timeline(result: IngestResult, phase: Phase, step: float) -> str:
    """Acknowledged and stored spans in each `step` seconds of the phase."""
    acknowledged: Counter[int] = Counter()
    for batch in result.of():
        if batch.outcome == "acknowledged" and batch.acknowledged_at >= phase.started:
            acknowledged[int((batch.acknowledged_at - phase.started) // step)] += batch.keys.template.spans
    parts = []
    for bucket in range(math.ceil(phase.seconds / step)):
        start, end = bucket * step, min((bucket + 1) * step, phase.seconds)
        stored = phase.stored_rate(start, end) * (end - start)
        parts.append(f"{start:.0f}–{end:.0f} s: {acknowledged[bucket]:,} / {0 if math.isnan(stored) else stored:,.0f}")
    return "; ".join(parts)


def ingest_report(report: Report, result: IngestResult) -> None:
    capacity = (
        f"measured: {result.capacity:,.0f} spans/s, the rate at which Keel stored spans from about a second "
        f"into {result.phases[0].seconds:.0f} s of closed-loop sending (each sender thread sends its next request "
        "when the last is answered, and waits out a refusal's Retry-After) to the end of the backlog's drain"
        if result.capacity_measured
        else f"given: {result.capacity:,.0f} spans/s"
    )
    overload = result.phases[-1]
    report.line(
        f"Sustained capacity {capacity}. Overload: {result.factor:g} × that, "
        f"{overload.offered_spans_per_second:,.0f} spans/s offered for {overload.seconds:.0f} s on a fixed schedule "
        f"shared by {result.senders} sender threads ({result.spans_per_request} spans, ~0.85 MB, per request; a "
        "refused request is sent again after its Retry-After, at most 3 times in all, in a slot of the same "
        "schedule, so retries are part of the offered rate). Each phase ends with a drain of anything left to the "
        "worker."
    )
    report.line()
    rows = []
    for phase in result.phases:
        batches = result.of(phase.name)
        attempts = sum(len(batch.statuses) for batch in batches)
        seconds = [s for batch in batches for s in batch.request_seconds]
        rows.append(
            [
                phase.name,
                f"{phase.seconds:.0f}",
                f"{attempts * result.spans_per_request / phase.seconds:,.0f}",
                f"{len(batches) * result.spans_per_request / phase.seconds:,.0f}",
                f"{result.acknowledged_spans(phase.name) / phase.seconds:,.0f}",
                f"{phase.stored_rate():,.0f}",
                f"{phase.drain_seconds:.1f} s" if phase.drained else f"NOT ({phase.unfinished_batches} batches left)",
                _counts(result.statuses(phase.name)),
                _counts(result.outcomes(phase.name)),
                f"{_ms(seconds, 0.5)} / {_ms(seconds, 0.99)}",
            ]
        )
    report.table(
        [
            "phase",
            "s",
            "spans/s sent (with retries)",
            "new spans/s",
            "acknowledged spans/s",
            "stored spans/s",
            "then drained in",
            "answers",
            "requests ended",
            "request ms p50 / p99",
        ],
        rows,
    )
    step = 10.0 if overload.seconds >= 60 else 3.0
    report.line(f"Overload phase, acknowledged / stored spans per {step:g} s: {_timeline(result, overload, step)}.")
    report.line()
    report.line(
        f"**Exactly once**: {result.acknowledged_spans():,} spans acknowledged, {result.stored_pairs:,} distinct "
        f"(trace id, span id) pairs stored; lost {result.lost:,}, stored twice {result.duplicates:,}, stored but "
        f"never acknowledged {result.unexpected:,}. Refusals without Retry-After: "
        f"{result.refusals_without_retry_after()}; answers other than 2xx/429/503: "
        f"{_counts(result.unexpected_statuses())}; connection errors (retried with the same body): "
        f"{sum(b.connection_errors for b in result.batches)}; spans rejected in acknowledged requests: "
        f"{sum(b.rejected_spans for b in result.batches)}; failed batches: {result.failed_batches}."
    )
    report.line()
    dashboard = result.dashboard
    report.line(
        "Dashboard, signed in, each page once a second during both phases (server time + loopback; "
        f"answers: {_counts(dashboard.statuses())}):"
    )
    report.line()
    report.table(
        ["page", "n", "p50 ms", "p95 ms", "max ms"],
        [
            [
                "**all pages**" if page is None else page,
                len(dashboard.seconds(page)),
                _ms(dashboard.seconds(page), 0.5),
                f"**{_ms(dashboard.seconds(page), 0.95)}**" if page is None else _ms(dashboard.seconds(page), 0.95),
                _ms(dashboard.seconds(page), 1.0),
            ]
            for page in (*PAGES, None)
        ],
    )
    report.line("Memory (RSS, sampled twice a second from the first request to the end of the drain):")
    report.line()
    memory_table(report, result.memory)


def gateway_report(report: Report, result: GatewayResult) -> None:
    answered = result.answered()
    overheads = result.overheads()
    seconds = [call.seconds for call in answered]
    report.line(
        f"{result.clients} client threads (one keep-alive connection each, in the benchmark's process) calling "
        f"`POST /v1/chat/completions` back to back for {result.seconds:.0f} s, a single-level agent whose single "
        f"call goes to the stub model server ({result.stub_latency_ms:g} ms fixed latency, no errors). Overhead = "
        "each request's time at the client less the stub's receive-to-answer time for it: Keel's work, "
        "waiting for one of gunicorn's 8 threads (2 workers × 4), the model call's HTTP client (Keel's own for "
        "an OpenAI-compatible server such as the stub), both loopback hops and the client's "
        "own share of the 2 cores."
    )
    report.line()
    report.table(
        [
            "requests",
            "answered/s",
            "errors, Keel's",
            "errors, the stub's",
            "connection failures retried",
            "latency p50 / p99 ms",
            "**overhead p50 ms**",
            "**p95**",
            "**p99**",
            "traces not stored",
        ],
        [
            [
                f"{len(result.calls):,}",
                f"{len(answered) / result.seconds:,.1f}",
                _counts(result.errors("keel")),
                _counts(result.errors("stub")),
                _counts(result.retried()),
                f"{_ms(seconds, 0.5)} / {_ms(seconds, 0.99)}",
                f"**{_ms(overheads, 0.5)}**",
                f"**{_ms(overheads, 0.95)}**",
                f"**{_ms(overheads, 0.99)}**",
                f"{result.traces_missing} (records caught up in {result.drain_seconds:.1f} s)"
                if result.drained
                else f"{result.traces_missing} (span batches NOT drained)",
            ]
        ],
    )
    if answered:
        report.line(
            f"With {result.clients} clients always waiting, a request's time is mostly its wait for a free "
            f"gunicorn thread: by Little's law {result.clients} / {len(answered) / result.seconds:,.1f} answered/s = "
            f"{result.clients / (len(answered) / result.seconds):,.2f} s per request. Keel's own time per request, "
            "one at a time, is bench_gateway's overhead."
        )
        report.line()
    report.line("Memory (RSS, sampled twice a second during the load and the drain):")
    report.line()
    memory_table(report, result.memory)
