"""The gateway's content guardrails, as spans: each check of a message (user input, a tool result, the
answer) asks the installed `hooks.Guard` and records what it decided as a guardrail span of the request.

What a verdict does to the message is decided here, per place:
- user input that is blocked ends the request (400 `guardrail_blocked`); redacted input reaches the
  model redacted;
- a tool result that is blocked is withheld from the model (a notice stands in its place, so the
  conversation can go on); otherwise it goes on as the guard passes it (redacted, or spotlighted:
  delimited and marked as data);
- an answer that is blocked is replaced by a refusal with `finish_reason: "content_filter"`; a redacted
  one goes out redacted.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from agent_registry.models import Agent
from config.errors import ValidationFailed
from routing import hooks
from routing.recording import TraceRecorder

WITHHELD = "[Keel withheld this tool result: {reason}. Do not rely on it; tell the user it could not be used.]"
REFUSAL = "I can't share that answer: it did not pass this assistant's safety checks."


class GuardrailBlocked(ValidationFailed):
    status = 400
    code = "guardrail_blocked"


def reason_of(verdict: hooks.ContentVerdict) -> str:
    checks = sorted({str(item.get("check")) for item in verdict.violations if item.get("action") == verdict.action})
    return ", ".join(checks) or verdict.action


def content_guard(
    recorder: TraceRecorder,
    *,
    agent: Agent,
    layer: str,
    source: str,
    content: str,
    label: str,
    system_prompt: str | None = None,
    prompt_name: str | None = None,
    prompt_version: int | None = None,
    parent: str | None = None,
    history: bool = False,
) -> hooks.ContentVerdict:
    """Run the agent's checks for one layer on one message and record the decision as a span. With
    `history` (an earlier turn sent again) only redaction runs, and there is nothing to record."""
    started = time.time_ns()
    verdict = hooks.guard().content_check(
        hooks.ContentCheck(
            agent=agent,
            layer=layer,
            source=source,
            content=content,
            trace_id=recorder.trace_id,
            system_prompt=system_prompt,
            prompt_name=prompt_name,
            prompt_version=prompt_version,
            history=history,
        )
    )
    if history:
        return verdict
    recorder.span(
        name=f"guardrail {layer}: {label} {verdict.action}",
        span_type="guardrail",
        start_ns=started,
        parent=parent,
        status="error" if verdict.stops else "ok",
        status_message=reason_of(verdict) if verdict.stops else "",
        output={"verdict": verdict.action, "violations": list(verdict.violations)},
        metadata={"layer": layer, "source": source, "latency_ms": verdict.latency_ms},
    )
    return verdict


def tool_result_guarded(
    recorder: TraceRecorder,
    *,
    agent: Agent,
    tool: str,
    content: str,
    pseudonyms: dict[str, str],
    parent: str | None = None,
    history: bool = False,
) -> str:
    """A tool result as the model may see it: withheld when blocked; otherwise what the guard passes on
    (redacted, or spotlighted when it looked suspicious)."""
    verdict = content_guard(
        recorder,
        agent=agent,
        layer="tool",
        source="tool_result",
        content=content,
        label=f"result of {tool}",
        parent=parent,
        history=history,
    )
    pseudonyms.update(verdict.pseudonyms)
    if verdict.stops and not history:
        return WITHHELD.format(reason=reason_of(verdict))
    return verdict.content


def pseudonyms_restored(value: Any, pseudonyms: Mapping[str, str]) -> Any:
    """`value` (text, or JSON such as tool arguments) with each pseudonym replaced by the value it stands
    for: what the caller and the agent's own tools get back, while the model and the trajectory keep the
    pseudonyms."""
    if not pseudonyms:
        return value
    if isinstance(value, str):
        for token, original in pseudonyms.items():
            if token in value:
                value = value.replace(token, original)
        return value
    if isinstance(value, list):
        return [pseudonyms_restored(item, pseudonyms) for item in value]
    if isinstance(value, dict):
        return {key: pseudonyms_restored(item, pseudonyms) for key, item in value.items()}
    return value


def answer_guarded(message: dict[str, Any], verdict: hooks.ContentVerdict) -> tuple[dict[str, Any], str | None]:
    """The answer as the caller may see it, and the finish reason to report instead (None: unchanged)."""
    if verdict.stops:
        return {"role": "assistant", "content": REFUSAL}, "content_filter"
    if verdict.action == "redact" and verdict.content != message.get("content"):
        return {**message, "content": verdict.content}, None
    return message, None
