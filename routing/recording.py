"""The gateway's own trace: every request it serves becomes a trajectory in Keel's store, with no SDK on
the caller's side. A `TraceRecorder` collects spans while the request runs (the router's decision, each
model call, each tool call, chain steps, hand-offs); when the request ends, whatever the outcome, the
gateway stores them and assembles their trajectory as OTLP ingest does (tracing.services.ingest_spans_accept).
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from routing import hooks, providers
from tracing import otlp

SCOPE = "keel.gateway"


# Ids are random as OpenTelemetry's SDKs make them (`random.getrandbits`), not from the operating system:
# `os.urandom` lets go of the interpreter lock for its system call, and the gateway makes an id right
# after each model call, when litellm's logging thread is waiting for the lock (it would then run first,
# for about 0.4 ms, ahead of the answer). The module's generator is seeded again in each forked worker.


def trace_id_new() -> str:
    return f"{random.getrandbits(128):032x}"


def _span_id() -> str:
    return f"{random.getrandbits(64):016x}"


@dataclass(slots=True)
class TraceRecorder:
    """Spans of one gateway request under a root agent span."""

    trace_id: str
    agent_name: str | None
    session_id: str | None
    user_id: str | None
    started_ns: int = field(default_factory=time.time_ns)
    root_span_id: str = field(default_factory=_span_id)
    spans: list[otlp.Span] = field(default_factory=list)
    prompt_name: str | None = None
    prompt_version: str | None = None
    payer: hooks.Payer | None = None  # whose budgets hold this request's model calls

    def _common(self) -> dict[str, Any]:
        return {
            "trace_id": self.trace_id,
            "scope_name": SCOPE,
            "session_id": self.session_id,
            "user_id": self.user_id,
            "agent_name": self.agent_name,
        }

    def span(
        self,
        *,
        name: str,
        span_type: otlp.SpanType,
        start_ns: int,
        end_ns: int | None = None,
        parent: str | None = None,
        **fields: Any,
    ) -> str:
        span_id = _span_id()
        self.spans.append(
            otlp.span_build(
                **self._common(),
                span_id=span_id,
                parent_span_id=parent or self.root_span_id,
                name=name,
                span_type=span_type,
                start_time_ns=start_ns,
                end_time_ns=max(start_ns, end_ns or time.time_ns()),
                **fields,
            )
        )
        return span_id

    def generation(
        self,
        completion: providers.Completion,
        *,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] = (),
        parent: str | None = None,
        name: str = "chat",
        metadata: Mapping[str, Any] | None = None,
    ) -> str:
        return self.span(
            name=f"{name} {completion.model}",
            span_type="generation",
            start_ns=completion.started_ns,
            end_ns=completion.ended_ns,
            parent=parent,
            kind="client",
            request_model=completion.model,
            response_model=completion.model,
            input=[dict(message) for message in messages],
            output=[completion.message],
            tool_definitions=tuple(dict(tool) for tool in tools),
            usage=otlp.Usage(
                input_tokens=completion.input_tokens,
                output_tokens=completion.output_tokens,
                total_tokens=None
                if completion.input_tokens is None and completion.output_tokens is None
                else (completion.input_tokens or 0) + (completion.output_tokens or 0),
            ),
            cost_usd=None if completion.cost_usd is None else float(completion.cost_usd),
            finish_reasons=(completion.finish_reason,),
            prompt_name=self.prompt_name,
            prompt_version=self.prompt_version,
            metadata={"target": completion.alias, "attempts": len(completion.attempts) + 1}
            | ({"failed_attempts": [a.error for a in completion.attempts]} if completion.attempts else {})
            | dict(metadata or {}),
        )

    def failed_generation(
        self, error: providers.ProviderFailed, *, model: str, messages: Sequence[Mapping[str, Any]], start_ns: int
    ) -> str:
        return self.span(
            name=f"chat {model}",
            span_type="generation",
            start_ns=start_ns,
            kind="client",
            request_model=model,
            input=[dict(message) for message in messages],
            status="error",
            status_message=error.detail[:1000],
            error_type="provider_error",
            error_message=error.detail,
            metadata={"attempts": error.extra.get("attempts", [])},
        )

    def finish(
        self,
        *,
        name: str,
        input_messages: Sequence[Mapping[str, Any]],
        output: Any,
        status: otlp.SpanStatus,
        error_type: str | None = None,
        error_message: str | None = None,
        tags: Sequence[str] = (),
        metadata: Mapping[str, Any] | None = None,
    ) -> list[otlp.Span]:
        """Close the root span; returns every span of the request."""
        root = otlp.span_build(
            **self._common(),
            span_id=self.root_span_id,
            parent_span_id=None,
            name=name,
            span_type="agent",
            kind="server",
            start_time_ns=self.started_ns,
            end_time_ns=time.time_ns(),
            trace_name=name,
            input=[dict(message) for message in input_messages],
            output=output,
            status=status,
            status_message=(error_message or "")[:1000],
            error_type=error_type,
            error_message=error_message,
            tags=tuple(tags),
            metadata=dict(metadata or {}),
            prompt_name=self.prompt_name,
            prompt_version=self.prompt_version,
        )
        return [root, *self.spans]
