"""Langfuse's score endpoint, `POST /api/public/scores`, so an application instrumented with the Langfuse SDK
keeps its `create_score` calls when it points LANGFUSE_BASE_URL at Keel. The SDK (v3 and later) sends a list
and reads 202 `{"message": "Accepted"}`, or 207 with counts and one error per refused score (it does not
send a 207 batch again); older clients send one score and read its id.

The key needs the `ingest` scope: scores come from the application that sends its spans."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Router, Status

from agent_registry.auth import langfuse_auth, request_api_key
from agent_registry.models import Scope
from agent_registry.schemas import error_responses
from config.json_body import json_body_loads
from tracing import exceptions, services

router = Router(tags=["langfuse"])
ERRORS = error_responses()


@router.post("/scores", auth=langfuse_auth(Scope.INGEST), response={200: Any, 202: Any, 207: Any, **ERRORS})
def langfuse_scores_create_api(request: HttpRequest) -> Any:
    """Scores of traces (and of their observations) as a Langfuse client sends them. A score whose trace
    Keel has not stored yet is kept and attached when the trace arrives."""
    body = json_body_loads(request.body)
    api_key = request_api_key(request)
    if isinstance(body, dict):
        result = services.langfuse_scores_accept(api_key=api_key, items=[body])
        if result.errors:
            raise exceptions.ScoreInvalid(result.errors[0].removeprefix("score 0: "))
        return Status(200, {"id": body.get("id") or ""})
    if not isinstance(body, list):
        raise exceptions.ScoreInvalid("the body is a score (a JSON object) or a list of them")
    result = services.langfuse_scores_accept(api_key=api_key, items=body)
    if not result.errors:
        return Status(202, {"message": "Accepted"})
    accepted = result.stored + result.pending
    return Status(
        207,
        {"accepted": accepted, "rejected": len(result.errors), "errors": [{"message": e} for e in result.errors]},
    )
