"""Errors of tracing: ingest, trajectories, scores."""

from config.errors import (
    KeelError,
    NotFound,
    PayloadTooLarge,
    Unavailable,
    UnsupportedMediaType,
    ValidationFailed,
)


class IngestPayloadInvalid(KeelError):
    code = "invalid_payload"


class IngestContentTypeUnsupported(UnsupportedMediaType):
    code = "unsupported_content_type"


class IngestPayloadTooLarge(PayloadTooLarge):
    code = "payload_too_large"


class IngestBacklogFull(Unavailable):
    """More is waiting to be processed than Keel accepts; the client should retry after a pause."""

    code = "ingest_backlog_full"


class TrajectoryNotFound(NotFound):
    code = "trajectory_not_found"


class ScoreInvalid(ValidationFailed):
    code = "score_invalid"


class TrajectoryFormatInvalid(ValidationFailed):
    code = "trajectory_invalid"


class ModelPriceInvalid(ValidationFailed):
    code = "model_price_invalid"


class TrajectoryListInvalid(ValidationFailed):
    code = "invalid_query"


class SessionNotFound(NotFound):
    code = "session_not_found"
