"""The GPU worker against a fake Keel API (an HTTP server in the test), training the tiny model on the CPU."""

from __future__ import annotations

import io
import json
import tarfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from trainer_bridge import worker
from trainer_bridge.tiny import tiny_model_dir, toy_art_export, toy_corpus

KEY = "test-worker-key"


@dataclass
class FakeKeel:
    """Keel's training-job API as the worker sees it: one job, its export, and a record of every call."""

    job: dict[str, Any]
    export: bytes
    claim_failures: int = 0  # 503s before the claim succeeds
    heartbeats_before_conflict: int | None = None  # then 409 on every heartbeat
    calls: list[tuple[str, str]] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    adapter: bytes = b""
    adapter_content_type: str = ""
    finish: list[dict[str, Any]] = field(default_factory=list)
    claimed: bool = False
    heartbeats: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def handle(self, method: str, path: str, authorization: str, body: bytes, content_type: str) -> tuple[int, bytes]:
        with self.lock:
            self.calls.append((method, path))
            if authorization != f"Bearer {KEY}":
                return 401, b'{"detail": "unauthorized", "code": "unauthorized"}'
            prefix = f"/api/v1/training-jobs/{self.job['id']}"
            if (method, path) == ("POST", "/api/v1/training-jobs/claim"):
                if self.claim_failures:
                    self.claim_failures -= 1
                    return 503, b"busy"
                assert json.loads(body) == {"worker": "gpu-1"}
                if self.claimed:
                    return 204, b""
                self.claimed = True
                return 200, json.dumps(self.job).encode()
            if (method, path) == ("GET", "/exports/7.jsonl"):
                return 200, self.export
            if (method, path) == ("POST", f"{prefix}/heartbeat"):
                self.heartbeats += 1
                conflict = self.heartbeats_before_conflict
                if conflict is not None and self.heartbeats > conflict:
                    return 409, b'{"detail": "job reclaimed", "code": "conflict"}'
                return 200, b"{}"
            if (method, path) == ("POST", f"{prefix}/metrics"):
                self.metrics.append(json.loads(body))
                return 200, b"{}"
            if (method, path) == ("POST", f"{prefix}/adapter"):
                self.adapter, self.adapter_content_type = body, content_type
                return 200, b"{}"
            if (method, path) == ("POST", f"{prefix}/finish"):
                self.finish.append(json.loads(body))
                return 200, b"{}"
            return 404, b"not found"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_dir(tmp_path_factory.mktemp("tiny"), vocab_corpus=toy_corpus())


@pytest.fixture
def export(tmp_path: Path) -> bytes:
    return toy_art_export(tmp_path / "export.jsonl").read_bytes()


@contextmanager
def fake_keel_serve(fake: FakeKeel) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            status, payload = fake.handle(
                self.command,
                self.path,
                self.headers.get("Authorization", ""),
                body,
                self.headers.get("Content-Type", ""),
            )
            self.send_response(status)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = _answer
        do_POST = _answer

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _job(model_dir: Path, **config: object) -> dict[str, Any]:
    return {
        "id": 7,
        "method": "grpo",
        "base_model": str(model_dir),
        "config": {
            "steps": 6,
            "learning_rate": 3e-3,
            "batch_size": 2,
            "kl_coef": 0.05,
            "validation_every": 3,
            **config,
        },
        "export_url": "/exports/7.jsonl",
        "lease_seconds": 300,
    }


def _worker_run(api: str, work_dir: Path) -> int:
    return worker.main(["--api", api, "--key", KEY, "--once", "--name", "gpu-1", "--work-dir", str(work_dir)])


def test_the_worker_claims_trains_reports_uploads_and_finishes(model_dir: Path, export: bytes, tmp_path: Path) -> None:
    fake = FakeKeel(job=_job(model_dir), export=export, claim_failures=1)

    with fake_keel_serve(fake) as api:
        exit_code = _worker_run(api, tmp_path / "work")

    assert exit_code == 0
    jobs = "/api/v1/training-jobs"
    assert fake.calls == [
        ("POST", f"{jobs}/claim"),  # a 503, retried
        ("POST", f"{jobs}/claim"),
        ("POST", f"{jobs}/7/heartbeat"),
        ("GET", "/exports/7.jsonl"),
        *[("POST", f"{jobs}/7/metrics")] * 7,
        ("POST", f"{jobs}/7/adapter"),
        ("POST", f"{jobs}/7/finish"),
    ]
    assert [m["step"] for m in fake.metrics] == [0, 1, 2, 3, 4, 5, 6]
    assert set(fake.metrics[0]["metrics"]) == {
        "validation_score",
        "validation_pairwise_accuracy",
        "train_policy_reward",
    }
    assert set(fake.metrics[3]["metrics"]) >= {
        "loss", "reward_mean", "reward_std", "advantage_mean", "advantage_std", "advantage_min", "advantage_max",
        "zero_advantage_groups_skipped", "kl", "policy_reward", "validation_score",
    }  # fmt: skip
    assert "validation_score" not in fake.metrics[1]["metrics"]
    assert all(isinstance(value, float) for m in fake.metrics for value in m["metrics"].values())
    assert fake.adapter_content_type == "application/gzip"
    with tarfile.open(fileobj=io.BytesIO(fake.adapter), mode="r:gz") as archive:
        names = set(archive.getnames())
        adapter_config = json.load(archive.extractfile("adapter_config.json"))  # type: ignore[arg-type]
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= names
    assert adapter_config["r"] == 8
    assert fake.finish == [{"status": "succeeded"}]
    assert list((tmp_path / "work").iterdir()) == []  # the job's files are cleaned up


def test_a_409_on_heartbeat_stops_training_without_finishing(model_dir: Path, export: bytes, tmp_path: Path) -> None:
    # Beats every 10 ms; the second is refused. Without the stop, 5000 steps would run and then finish.
    job = {**_job(model_dir, steps=5000, validation_every=0), "lease_seconds": 0.03}
    fake = FakeKeel(job=job, export=export, heartbeats_before_conflict=1)

    with fake_keel_serve(fake) as api:
        exit_code = _worker_run(api, tmp_path / "work")

    assert exit_code == 1
    assert fake.heartbeats >= 2
    assert fake.finish == []
    assert fake.adapter == b""
    assert ("POST", "/api/v1/training-jobs/7/finish") not in fake.calls
    assert len(fake.metrics) < 5000


def test_a_training_error_finishes_the_job_as_failed_with_its_text(
    model_dir: Path, export: bytes, tmp_path: Path
) -> None:
    fake = FakeKeel(job=_job(model_dir, lora_r=0), export=export)

    with fake_keel_serve(fake) as api:
        exit_code = _worker_run(api, tmp_path / "work")

    assert exit_code == 1
    assert fake.finish == [{"status": "failed", "error": "TrainingConfigError: lora_r: must be at least 1, not 0"}]
    assert fake.metrics == []
    assert fake.adapter == b""


def test_no_waiting_job_exits_cleanly(model_dir: Path, export: bytes, tmp_path: Path) -> None:
    fake = FakeKeel(job=_job(model_dir), export=export, claimed=True)

    with fake_keel_serve(fake) as api:
        exit_code = _worker_run(api, tmp_path / "work")

    assert exit_code == 0
    assert fake.calls == [("POST", "/api/v1/training-jobs/claim")]


def test_the_key_is_not_sent_to_another_host() -> None:
    client = worker.KeelClient("http://keel.example.com", KEY)
    try:
        assert client._headers("/exports/1.jsonl") == {"Authorization": f"Bearer {KEY}"}
        assert client._headers("http://keel.example.com/exports/1.jsonl") == {"Authorization": f"Bearer {KEY}"}
        assert client._headers("https://bucket.example.net/exports/1.jsonl?signature=x") == {}
    finally:
        client.close()
