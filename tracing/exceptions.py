"""Errors of tracing: ingest, trajectories, scores."""

from config.errors import (
    Conflict,
    KeelError,
    NotFound,
    PayloadTooLarge,
    Throttled,
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


class IngestBacklogFull(Throttled):
    """More is waiting to be processed than Keel accepts; the client should retry after a pause (OTLP
    exporters retry 429 with Retry-After)."""

    code = "ingest_backlog_full"


class TrajectoryNotFound(NotFound):
    code = "trajectory_not_found"


class ScoreInvalid(ValidationFailed):
    code = "score_invalid"


class TrajectoryFormatInvalid(ValidationFailed):
    code = "trajectory_invalid"


class ModelPriceInvalid(ValidationFailed):
    code = "model_price_invalid"


class ModelPriceNotFound(NotFound):
    code = "model_price_not_found"


class TrajectoryListInvalid(ValidationFailed):
    code = "invalid_query"


class SessionNotFound(NotFound):
    code = "session_not_found"


class ReplayNotFound(NotFound):
    code = "replay_not_found"


class ReplayInvalid(ValidationFailed):
    """A replay that cannot run as asked: no such step, no model call to re-make, no model, ..."""

    code = "replay_invalid"


class ReplayConflict(Conflict):
    """The trajectory or the replay is not in a state that allows this yet (still running, not finished)."""

    code = "replay_conflict"


class ReplayProviderUnavailable(Unavailable):
    """The model provider failed in a way that may pass (rate limit, timeout, outage): the task retries."""

    code = "provider_unavailable"


class LangfuseMirrorInvalid(ValidationFailed):
    code = "langfuse_settings_invalid"


class LangfuseMirrorNotFound(NotFound):
    code = "langfuse_mirror_not_found"


class TriageSettingsInvalid(ValidationFailed):
    code = "triage_settings_invalid"


class ReviewSampleInvalid(ValidationFailed):
    code = "review_sample_invalid"


class ReviewSampleNotFound(NotFound):
    code = "review_sample_not_found"


class ReviewItemNotFound(NotFound):
    code = "review_item_not_found"


class ReviewDecisionInvalid(ValidationFailed):
    code = "review_decision_invalid"


class AlertRuleInvalid(ValidationFailed):
    code = "alert_rule_invalid"


class AlertRuleNotFound(NotFound):
    code = "alert_rule_not_found"


class AlertNotFound(NotFound):
    code = "alert_not_found"
