"""The action boundary: every tool call the gateway is about to run, or hand back to the client, passes
`tool_call_check` first. Until the guardrails app installs its checker this allows everything; the hook
exists so that no path of the agentic tier can reach a tool without passing it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ToolCall:
    agent_id: int
    workspace_id: int
    name: str
    arguments: Any
    conversation_id: str
    trace_id: str
    runs_on: str  # "keel" (a registered endpoint) or "client"


@dataclass(frozen=True, slots=True)
class ToolCallVerdict:
    allowed: bool
    reason: str = ""
    pending_approval_id: int | None = None


ALLOW = ToolCallVerdict(allowed=True)

Checker = Callable[[ToolCall], ToolCallVerdict]


def _allow_all(call: ToolCall) -> ToolCallVerdict:
    return ALLOW


_checker: Checker = _allow_all


def tool_call_checker_install(checker: Checker | None) -> None:
    """Install the action-boundary checker (None restores allow-all)."""
    global _checker
    _checker = checker or _allow_all


def tool_call_check(call: ToolCall) -> ToolCallVerdict:
    return _checker(call)
