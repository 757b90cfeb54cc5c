"""Tracing: ingest limits, back-pressure and the batch lease."""

from config.settings.env import env_bool, env_int, env_list, env_str

# Largest decompressed OTLP body; a gzip bomb stops here with 413.
KEEL_MAX_DECOMPRESSED_BYTES = env_int("KEEL_MAX_DECOMPRESSED_BYTES", 64 * 1024 * 1024)
# Attribute values longer than this are cut (with a marker that keeps the original length).
KEEL_MAX_ATTRIBUTE_LENGTH = env_int("KEEL_MAX_ATTRIBUTE_LENGTH", 256 * 1024)
# Spans in one request (OTLP or JSON trajectories); more gets 413. The web process storing an OTLP request
# (or a worker, a batch) holds its spans in memory, about 20 KB each when they share one trace: 20,000 is
# about 400 MB (the OTel Collector batches 8,192).
KEEL_INGEST_MAX_SPANS_PER_REQUEST = env_int("KEEL_INGEST_MAX_SPANS_PER_REQUEST", 20_000)
# OTLP requests each web process stores at once, and how many more may wait for a turn; past that a request
# is refused at once. Both together stay below the process's threads (KEEL_WEB_THREADS, 4), so that a thread
# is left for the dashboard and the gateway however much is sent.
KEEL_INGEST_CONCURRENCY = env_int("KEEL_INGEST_CONCURRENCY", 2)
KEEL_INGEST_WAITING = env_int("KEEL_INGEST_WAITING", 1)
# Back-pressure: ingest answers 429 with Retry-After when an OTLP request waited this long for its turn,
# and instead of queueing more batches (JSON trajectories) than the workers can store in this time at their
# recent rate (at least the floor, at most the cap), or once the oldest waiting batch has waited that long.
KEEL_INGEST_MAX_QUEUE_SECONDS = env_int("KEEL_INGEST_MAX_QUEUE_SECONDS", 2)
KEEL_INGEST_BACKLOG_FLOOR_SPANS = env_int("KEEL_INGEST_BACKLOG_FLOOR_SPANS", 5_000)
KEEL_INGEST_BACKLOG_SPANS = env_int("KEEL_INGEST_BACKLOG_SPANS", 100_000)
KEEL_INGEST_RETRY_AFTER_SECONDS = env_int("KEEL_INGEST_RETRY_AFTER_SECONDS", 1)
# A worker holds a batch this long; past it, the sweeper gives the batch to another worker.
KEEL_INGEST_LEASE_SECONDS = env_int("KEEL_INGEST_LEASE_SECONDS", 90)
# A pending batch this old may have lost its broker message; the sweeper sends it again.
KEEL_INGEST_REQUEUE_AFTER_SECONDS = env_int("KEEL_INGEST_REQUEUE_AFTER_SECONDS", 60)
KEEL_INGEST_MAX_ATTEMPTS = env_int("KEEL_INGEST_MAX_ATTEMPTS", 5)
# Seconds Keel waits for Langfuse on each mirror delivery.
KEEL_LANGFUSE_TIMEOUT_SECONDS = env_int("KEEL_LANGFUSE_TIMEOUT_SECONDS", 10)
# Where alert webhooks and the Langfuse mirror may send (tracing/outbound.py). By default only to public
# addresses: a workspace member chooses the URL, and the worker must not reach Keel's own network for them
# (loopback, private, link-local, cloud metadata). ALLOW_PRIVATE permits every non-public address but the
# metadata ones; ALLOWED_HOSTS permits named hosts, addresses and networks only (metadata included if named),
# e.g. a self-hosted Langfuse: "langfuse.internal,10.2.0.0/16".
KEEL_OUTBOUND_ALLOW_PRIVATE = env_bool("KEEL_OUTBOUND_ALLOW_PRIVATE", False)
KEEL_OUTBOUND_ALLOWED_HOSTS = env_list("KEEL_OUTBOUND_ALLOWED_HOSTS", [])
# How those hosts are resolved (a dotted path to `(host) -> [address, ...]`); the tests name a fake.
KEEL_OUTBOUND_RESOLVER = env_str("KEEL_OUTBOUND_RESOLVER", "tracing.outbound.system_resolve")
