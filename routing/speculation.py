"""The speculative single call: the single-call tier's model call starts before the learned router has
decided, and runs while it decides.

An agent's router settings switch it on (`RouterConfig.speculative_single_call`). For a request whose tier
the learned estimate will choose (no rule or earlier turn decided it, and the request looks simple enough
for the single call without its neighbours), the gateway starts the single call as soon as the messages
are known, then embeds the request, searches its nearest past requests and estimates. When the router
chooses the single call, the gateway takes that call's answer: the router's time (and a remote embedder's
round trip) was spent while the model worked, not before it started. When the router chooses another
tier, the call is waited for once that tier is done, counted against the budgets and in the request's cost
(the routing decision's, which the router learns from), recorded on the trajectory as a generation marked
`speculative: not used`, and its answer dropped. The setting trades
money for latency: each request the router sends past the single call pays for one single call it does
not use.

Never with the semantic cache on (a hit would leave the call unused), for a pinned (eval) request, for a
streamed one, or when the process already has `POOL_SIZE` such calls under way (then the request is
served as without the setting, never queued behind them).

The call runs in a thread of the process's pool and touches no database (`providers.attempt`); what
follows from its outcome (the target's health, retries and fallbacks) happens in the request's thread,
where the answer is taken, as for a call made there.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

from agent_registry.models import Agent
from config.errors import KeelError
from routing import hooks, providers, tiers
from routing.models import ModelTarget, RouterConfig, TierChoice
from routing.recording import TraceRecorder

POOL_SIZE: Final = 8
HANDOVER_SECONDS: Final = 0.05
NOT_USED: Final = "not used"


class _Pool:
    """The process's threads for speculative calls, made on first use in each process (a gunicorn worker
    forks after import), with a count of the calls under way."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._running = 0

    def submit(self, call: Callable[[], Any]) -> Future[Any] | None:
        """Run `call` in the pool; None when `size` calls are under way already."""
        with self._lock:
            if self._pid != os.getpid():
                self._executor = ThreadPoolExecutor(max_workers=self.size, thread_name_prefix="keel-speculative")
                self._pid, self._running = os.getpid(), 0
            if self._running >= self.size:
                return None
            self._running += 1
            executor = self._executor
        assert executor is not None
        future = executor.submit(call)
        future.add_done_callback(self._done)
        return future

    def _done(self, _future: Future[Any]) -> None:
        with self._lock:
            self._running -= 1


_pool = _Pool(POOL_SIZE)


@dataclass(slots=True)
class Speculation:
    """A single call started before the router decided."""

    target: ModelTarget
    messages: list[dict[str, Any]]
    parameters: dict[str, Any]
    tools: list[dict[str, Any]]
    hold: Any  # what the call reserved against the budgets (hooks.Guard.spend_reserve)
    started: providers.Started


def speculation_start(
    *,
    recorder: TraceRecorder,
    agent: Agent,
    config: RouterConfig | None,
    messages: Sequence[Mapping[str, Any]],
    request_parameters: Mapping[str, Any],
    tools: Sequence[Mapping[str, Any]],
) -> Speculation | None:
    """Start the agent's single call on `messages`; None when it cannot start now (no single-call target,
    a budget that refuses it, a full pool), and the request goes on as without the setting."""
    try:
        target = tiers.target_for_tier(agent=agent, config=config, tier=TierChoice.SINGLE_CALL)
    except tiers.TierUnavailable:
        return None
    sent = [dict(message) for message in messages]
    offered = [dict(tool) for tool in tools]
    parameters = tiers.parameters_with_tools(request_parameters, offered)
    try:
        hold = tiers.spend_reserve(recorder, target, sent, parameters)
    except KeelError:
        return None  # over a budget: whichever tier the router chooses meets the same refusal, and says so
    order = providers.targets_in_order(target)
    first = order[0]
    running = threading.Event()

    def call() -> providers.Answered:
        running.set()
        return providers.attempt(first, sent, parameters)

    future = _pool.submit(call)
    if future is None:
        hooks.guard().spend_settle(hold, cost_usd=0, tokens=0)
        return None
    # The request's thread waits until the call's thread runs: that thread then holds the interpreter lock
    # while it builds and sends the request (until it waits on the network, or for the lock's switch
    # interval), and the router's work runs while the model works, not before the request leaves.
    running.wait(HANDOVER_SECONDS)
    return Speculation(
        target=target,
        messages=sent,
        parameters=parameters,
        tools=offered,
        hold=hold,
        started=providers.Started(order=order, outcome=future.result),
    )


def speculation_unused(speculation: Speculation, *, recorder: TraceRecorder | None, tier: str) -> Decimal | None:
    """Once the request is served by `tier`: wait for a call the single-call tier did not take, count what it
    cost against the budgets, and record it on the trajectory (`recorder`; None when the request is not
    recorded). Returns its cost (None: unpriced or failed). A call the tier took is the tier's; nothing is
    done."""
    if speculation.started.taken:
        return None
    try:
        completion = providers.completion(
            target=speculation.target,
            messages=speculation.messages,
            parameters=speculation.parameters,
            single_attempt=True,
            started=speculation.started,
        )
    except providers.ProviderFailed as error:
        hooks.guard().spend_settle(speculation.hold, cost_usd=0, tokens=0)
        if recorder is not None:
            recorder.span(
                name=f"speculative single call {speculation.target.model}: failed, not used",
                span_type="other",
                start_ns=recorder.started_ns,
                output={"error": error.detail},
                metadata={"speculative": NOT_USED, "tier": tier},
            )
        return None
    tiers.spend_settle(speculation.hold, completion)
    if recorder is not None:
        recorder.generation(
            completion,
            messages=speculation.messages,
            tools=speculation.tools,
            name="speculative single call",
            metadata={"speculative": NOT_USED, "tier": tier},
        )
    return completion.cost_usd
