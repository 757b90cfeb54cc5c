"""The GPU worker: claims a training job from Keel over HTTP, trains a LoRA adapter, reports back, finishes.

    python -m trainer_bridge.worker --api https://keel.example.com --key KEY [--once] [--poll-seconds 10]
        [--work-dir DIR] [--name NAME] [--adapter-store DIR]

It needs torch, transformers and peft (the `trainer` extra) and network access to Keel's API; no Django. The key
may also come from the KEEL_API_KEY environment variable, which keeps it out of the process list.

The protocol. Every request carries `Authorization: Bearer <key>`, a key with the `train` scope (it can claim jobs
and read the data of the job it holds, nothing else); paths are under `{api}/api/v1/training-jobs/`.
- `POST claim` `{"worker": name}` → 200 with the job `{"id", "method", "base_model", "config", "export_url",
  "lease_seconds", "validation_url"?}`, or 204 when no job waits. `base_model` is a local path or a hub id the
  machine has cached; `config` holds TrainingConfig fields (trainer_bridge/training_config.py); `method` overrides any
  `config["method"]`. `export_url` (and `validation_url`) is absolute or relative to `{api}`; the key is sent only
  to Keel's own origin, never to another host (a pre-signed storage URL, say).
- `POST {id}/heartbeat` (no body): once right after the claim, then every `lease_seconds / 3` from a background
  thread, until the job is finished or given up. The server reclaims a job whose heartbeats stop for a lease.
- `GET export_url` (`{id}/data/train`, and `{id}/data/validation`): the export, streamed to the work directory.
- `POST {id}/metrics` `{"step": n, "metrics": {name: number | null}}` after each training step; step 0 carries the
  validation score before training. Non-finite numbers are sent as null.
- `POST {id}/adapter`: the adapter directory (adapter_config.json, adapter_model.safetensors, tokenizer files)
  as a tar.gz body, `Content-Type: application/gzip`, files at the archive's root; or, with `--adapter-store DIR`,
  the adapter is copied to `DIR/<job id>/` and the body is `{"location": "<that path>"}`.
- `POST {id}/finish` `{"status": "succeeded"}` or `{"status": "failed", "error": "<type>: <message>"}`.
A 409 on any call means the job is no longer this worker's (its lease lapsed and it was reclaimed, or it was
cancelled): the worker stops training and drops the job without finishing it. 5xx answers and connection errors
are retried with exponential backoff (4 retries); any other 4xx is an error. An exception while preparing or
training finishes the job as failed with the error's text.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import shutil
import socket
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx

from trainer_bridge.training import train
from trainer_bridge.training_config import TrainingConfig

logger = logging.getLogger("trainer_bridge.worker")

JOBS_PATH = "/api/v1/training-jobs"
MAX_ERROR_LENGTH = 4000


class JobLost(Exception):
    """Keel answered 409: the job is no longer ours."""


class KeelApiError(Exception):
    """Keel answered with an error, or could not be reached after the retries."""


class KeelClient:
    """Keel's training-job API, with retries of what can recover (5xx, connection errors)."""

    def __init__(
        self, api: str, key: str, *, timeout: float = 60.0, retries: int = 4, backoff_seconds: float = 0.5
    ) -> None:
        self.api = api.rstrip("/")
        self.key = key
        self.retries = retries
        self.backoff_seconds = backoff_seconds
        self.http = httpx.Client(base_url=self.api, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def _headers(self, url: str) -> dict[str, str]:
        target, own = urlsplit(url), urlsplit(self.api)
        if target.netloc and (target.scheme, target.netloc) != (own.scheme, own.netloc):
            return {}  # another host: the key is Keel's, not theirs
        return {"Authorization": f"Bearer {self.key}"}

    def _with_retries(self, what: str, call: Callable[[], httpx.Response]) -> httpx.Response:
        for attempt in range(self.retries + 1):
            try:
                response = call()
            except httpx.TransportError as error:
                failure = f"{what}: {type(error).__name__}: {error}"
            else:
                if response.status_code == 409:
                    raise JobLost(f"{what}: 409 {response.text[:200]}")
                if response.status_code < 500:
                    if response.status_code >= 400:
                        raise KeelApiError(f"{what}: {response.status_code} {response.text[:500]}")
                    return response
                failure = f"{what}: {response.status_code} {response.text[:200]}"
            if attempt < self.retries:
                logger.warning("worker.retry %s (attempt %d)", failure, attempt + 1)
                time.sleep(self.backoff_seconds * 2**attempt)
        raise KeelApiError(failure)

    def _post(self, path: str, *, json: object = None, content: bytes | None = None) -> httpx.Response:
        url = f"{JOBS_PATH}/{path}"
        headers = self._headers(url)
        if content is not None:
            headers["Content-Type"] = "application/gzip"
        return self._with_retries(
            f"POST {url}", lambda: self.http.post(url, headers=headers, json=json, content=content)
        )

    def claim(self, worker: str) -> dict[str, Any] | None:
        response = self._post("claim", json={"worker": worker})
        if response.status_code == 204:
            return None
        job = response.json()
        if not isinstance(job, dict):
            raise KeelApiError(f"claim: expected a job object, got {type(job).__name__}")
        return job

    def heartbeat(self, job_id: object) -> None:
        self._post(f"{job_id}/heartbeat")

    def metrics(self, job_id: object, step: int, metrics: dict[str, float]) -> None:
        values = {k: (v if isinstance(v, int | float) and math.isfinite(v) else None) for k, v in metrics.items()}
        self._post(f"{job_id}/metrics", json={"step": step, "metrics": values})

    def adapter_upload(self, job_id: object, archive: Path) -> None:
        self._post(f"{job_id}/adapter", content=archive.read_bytes())

    def adapter_location(self, job_id: object, location: str) -> None:
        self._post(f"{job_id}/adapter", json={"location": location})

    def finish(self, job_id: object, status: str, error: str = "") -> None:
        body = {"status": status, **({"error": error[:MAX_ERROR_LENGTH]} if error else {})}
        self._post(f"{job_id}/finish", json=body)

    def download(self, url: str, destination: Path) -> Path:
        absolute = urljoin(self.api + "/", url)

        def fetch() -> httpx.Response:
            with self.http.stream("GET", absolute, headers=self._headers(absolute)) as response:
                if response.status_code == 200:
                    partial = destination.with_suffix(destination.suffix + ".part")
                    with partial.open("wb") as file:
                        for chunk in response.iter_bytes():
                            file.write(chunk)
                    partial.replace(destination)
                else:
                    response.read()
                return response

        self._with_retries(f"GET {url}", fetch)
        return destination


class Heartbeat(threading.Thread):
    """Renews the job's lease every `interval` seconds; sets `lost` when Keel says the job is gone."""

    def __init__(self, client: KeelClient, job_id: object, interval: float, lost: threading.Event) -> None:
        super().__init__(name=f"heartbeat-{job_id}", daemon=True)
        self.client, self.job_id, self.interval, self.lost = client, job_id, interval, lost
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            try:
                self.client.heartbeat(self.job_id)
            except JobLost:
                logger.warning("worker.job_lost job=%s (heartbeat)", self.job_id)
                self.lost.set()
                return
            except KeelApiError as error:
                # Keep training: the next beat may get through before the lease runs out.
                logger.warning("worker.heartbeat_failed job=%s %s", self.job_id, error)

    def stop(self) -> None:
        self.stopped.set()
        self.join()


def _archive(directory: Path, destination: Path) -> Path:
    with tarfile.open(destination, "w:gz") as archive:
        for path in sorted(directory.iterdir()):
            archive.add(path, arcname=path.name)
    return destination


def job_run(
    client: KeelClient,
    heartbeat_client: KeelClient,
    job: dict[str, Any],
    *,
    work_dir: Path,
    adapter_store: Path | None = None,
) -> str:
    """Train one claimed job; return "succeeded", "failed" or "abandoned" (a 409: someone else has it now)."""
    job_id = job["id"]
    lease_seconds = float(job.get("lease_seconds") or 300)
    job_dir = Path(tempfile.mkdtemp(prefix=f"job-{job_id}-", dir=work_dir))
    lost = threading.Event()
    heartbeat = Heartbeat(heartbeat_client, job_id, lease_seconds / 3, lost)
    try:
        try:
            client.heartbeat(job_id)
            heartbeat.start()
            outcome = _train_and_upload(client, job, job_dir=job_dir, lost=lost, adapter_store=adapter_store)
        except JobLost as error:
            logger.warning("worker.job_lost job=%s %s", job_id, error)
            return "abandoned"
        except Exception as error:  # the job's outer edge: any failure is reported to Keel
            if lost.is_set():
                return "abandoned"
            logger.exception("worker.job_failed job=%s", job_id)
            _finish_quietly(client, job_id, "failed", f"{type(error).__name__}: {error}")
            return "failed"
        if outcome == "abandoned":
            logger.warning("worker.job_lost job=%s (stopped training)", job_id)
            return "abandoned"
        _finish_quietly(client, job_id, "succeeded")
        return "succeeded"
    finally:
        if heartbeat.is_alive():
            heartbeat.stop()
        shutil.rmtree(job_dir, ignore_errors=True)


def _finish_quietly(client: KeelClient, job_id: object, status: str, error: str = "") -> None:
    """Finish the job; when Keel cannot be told, its lease runs out and the job is handed out again."""
    try:
        client.finish(job_id, status, error)
    except (JobLost, KeelApiError) as failure:
        logger.error("worker.finish_failed job=%s %s", job_id, failure)


def _train_and_upload(
    client: KeelClient, job: dict[str, Any], *, job_dir: Path, lost: threading.Event, adapter_store: Path | None
) -> str:
    job_id = job["id"]
    config_data = dict(job.get("config") or {})
    config_data["method"] = job.get("method") or config_data.get("method")
    config = TrainingConfig.from_dict(config_data)
    export_path = client.download(str(job["export_url"]), job_dir / "export.jsonl")
    validation_path = None
    if job.get("validation_url"):
        validation_path = client.download(str(job["validation_url"]), job_dir / "validation.jsonl")

    def on_metrics(metrics: dict[str, float]) -> None:
        if lost.is_set():
            return
        step = int(metrics.pop("step"))
        try:
            client.metrics(job_id, step, metrics)
        except JobLost:
            lost.set()  # training stops at the next step

    logger.info("worker.training job=%s method=%s base_model=%s", job_id, config.method, job["base_model"])
    result = train(
        config,
        base_model_dir=str(job["base_model"]),
        export_path=export_path,
        output_dir=job_dir / "adapter",
        on_metrics=on_metrics,
        should_stop=lost.is_set,
        validation_path=validation_path,
    )
    if result.stopped or lost.is_set() or result.adapter_dir is None:
        return "abandoned"
    if adapter_store is not None:
        location = adapter_store / str(job_id)
        shutil.rmtree(location, ignore_errors=True)
        shutil.copytree(result.adapter_dir, location)
        client.adapter_location(job_id, str(location.resolve()))
    else:
        client.adapter_upload(job_id, _archive(result.adapter_dir, job_dir / "adapter.tar.gz"))
    return "uploaded"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m trainer_bridge.worker", description=__doc__.split("\n")[0])
    parser.add_argument("--api", required=True, help="Keel's base URL, e.g. https://keel.example.com")
    parser.add_argument("--key", default=os.environ.get("KEEL_API_KEY"), help="API key (or KEEL_API_KEY)")
    parser.add_argument("--once", action="store_true", help="claim at most one job, then exit")
    parser.add_argument("--poll-seconds", type=float, default=10.0, help="wait between claims when none waits")
    parser.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "keel-worker")
    parser.add_argument("--name", default=f"{socket.gethostname()}-{os.getpid()}", help="this worker's name")
    parser.add_argument("--adapter-store", type=Path, help="keep adapters here and report the path, not upload")
    args = parser.parse_args(argv)
    if not args.key:
        parser.error("--key (or KEEL_API_KEY) is required")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the worker; with --once, return 0 when the job succeeded or none waited, 1 otherwise."""
    args = parse_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    args.work_dir.mkdir(parents=True, exist_ok=True)
    client, heartbeat_client = KeelClient(args.api, args.key), KeelClient(args.api, args.key)
    try:
        while True:
            try:
                job = client.claim(args.name)
            except KeelApiError as error:
                if args.once:
                    logger.error("worker.claim_failed %s", error)
                    return 1
                logger.warning("worker.claim_failed %s", error)
                job = None
            if job is None:
                if args.once:
                    return 0
                time.sleep(args.poll_seconds)
                continue
            logger.info("worker.claimed job=%s", job.get("id"))
            outcome = job_run(client, heartbeat_client, job, work_dir=args.work_dir, adapter_store=args.adapter_store)
            logger.info("worker.job_done job=%s outcome=%s", job.get("id"), outcome)
            if args.once:
                return 0 if outcome == "succeeded" else 1
    finally:
        client.close()
        heartbeat_client.close()


if __name__ == "__main__":
    sys.exit(main())
