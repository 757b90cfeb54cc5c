"""Where the guardrails app plugs into the gateway (routing does not import guardrails).

The action boundary: every tool call the gateway is about to run, or hand back to the client, passes
`tool_call_check` first. Until the guardrails app installs its checker this allows everything; the hook
exists so that no path of the agentic tier can reach a tool without passing it. The content checks and
budgets plug in the same way, as a `Guard`."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from agent_registry.models import Agent


T = TypeVar("T")

# --- Request scope -----------------------------------------------------------------------------------
#
# Within one gateway request, what a hook reads about the agent (its guardrail policy, say) cannot change
# in a way the request should see half of; `request_memo` lets a hook read it once per request instead of
# once per check. Outside a request scope it reads every time.

_request_memo: contextvars.ContextVar[dict[Hashable, Any] | None] = contextvars.ContextVar(
    "keel_gateway_request_memo", default=None
)


@contextlib.contextmanager
def request_scope() -> Iterator[None]:
    """One gateway request: values memoised with `request_memo` live until it ends."""
    token = _request_memo.set({})
    try:
        yield
    finally:
        _request_memo.reset(token)


def request_memo(key: Hashable, read: Callable[[], T]) -> T:
    """`read()`, once per request scope for `key` (every time outside a scope)."""
    memo = _request_memo.get()
    if memo is None:
        return read()
    if key not in memo:
        memo[key] = read()
    value: T = memo[key]
    return value


@dataclass(frozen=True, slots=True)
class ToolCall:
    agent_id: int
    workspace_id: int
    name: str
    arguments: Any
    conversation_id: str
    trace_id: str
    runs_on: str  # "keel" (a registered endpoint) or "client"
    # Made by Keel itself (an eval run): a call that needs a person's approval is held without asking anyone.
    rehearsal: bool = False


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


# --- Content guardrails and budgets -----------------------------------------------------------------
#
# The gateway also runs the agent's content checks (input, tool results, output) and holds each model
# call against the budgets. Both live in the guardrails app, which installs a `Guard`; until then
# `NoGuard` lets everything through and holds nothing.


@dataclass(frozen=True, slots=True)
class ContentCheck:
    agent: Agent
    layer: str  # "input" | "tool" | "output"
    source: str  # "user" | "tool_result" | "agent" | "model"
    content: str
    trace_id: str
    system_prompt: str | None = None
    prompt_name: str | None = None
    prompt_version: int | None = None
    # An earlier turn sent again: it passed its checks when new, so only redaction runs and nothing is recorded.
    history: bool = False


@dataclass(frozen=True, slots=True)
class ContentVerdict:
    action: str  # "allow" | "flag" | "redact" | "block" | "require_approval"
    content: str  # what may go on: the content as given, or its redacted text
    violations: tuple[dict[str, Any], ...] = ()  # {"check", "score", "evidence", "action", "failure"}
    latency_ms: float = 0.0
    pseudonyms: Mapping[str, str] = field(default_factory=dict)  # pseudonym -> the value it stands for

    @property
    def stops(self) -> bool:
        return self.action in ("block", "require_approval")


@dataclass(frozen=True, slots=True)
class Payer:
    """Who a request's model calls are charged to: the budgets that match it hold each call."""

    workspace_id: int
    agent_id: int | None
    api_key_id: int | None
    end_user: str


class Guard:
    """The gateway's guardrails, as the guardrails app fills them in. This base allows and holds nothing."""

    def content_check(self, check: ContentCheck) -> ContentVerdict:
        return ContentVerdict(action="allow", content=check.content)

    def system_addendum(self, *, agent: Agent, prompt_name: str, prompt_version: int) -> str | None:
        """Text to end the system prompt of this prompt version with (a canary token whose appearance in
        an output shows the prompt leaked, what marked untrusted data means); None for nothing."""
        return None

    def output_checked(self, *, agent: Agent) -> bool:
        """Whether the agent's answers pass an output check that can change them (then they are not
        streamed before the check has run)."""
        return False

    def spend_reserve(
        self, payer: Payer, *, target: Any, messages: Sequence[Mapping[str, Any]], max_tokens: int | None
    ) -> Any:
        """Hold one model call's most it can cost; raises a KeelError (429) when a budget would overshoot.
        Returns a hold for `spend_settle`."""
        return None

    def spend_settle(self, hold: Any, *, cost_usd: Any, tokens: int | None) -> None:
        """Count what the call spent (None: the estimate) and release the rest of the hold."""


NO_GUARD = Guard()
_guard: Guard = NO_GUARD


def guard_install(guard: Guard | None) -> None:
    """Install the gateway's guardrails (None restores `NO_GUARD`)."""
    global _guard
    _guard = guard or NO_GUARD


def guard() -> Guard:
    return _guard
