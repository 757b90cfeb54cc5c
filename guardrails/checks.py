"""The guardrail check layer: the built-in checks, their registry, and `run_checks`.

Every built-in check runs offline in a few milliseconds with no model: regexes compiled at import,
bounded quantifiers, and a scan window for the classifying checks (`interface.SCAN_HEAD`/`SCAN_TAIL`),
so time grows linearly with the content. Model-based checks (an LLM judge or a guard model through
litellm) implement the same `Check` protocol elsewhere and can be passed to `run_checks` by name once
registered. A check reports; the agent's policy decides the `Action`. Pure: no Django.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from guardrails.injection import IndirectInjectionCheck, PromptInjectionCheck
from guardrails.interface import (
    SCAN_HEAD,
    SCAN_TAIL,
    Action,
    Check,
    CheckContext,
    CheckResult,
    Finding,
    Layer,
)
from guardrails.leakage import SystemPromptLeakageCheck, canary_token
from guardrails.output import OutputHandlingCheck, TopicCheck, ToxicityCheck
from guardrails.pii import PiiCheck, SecretsCheck, pii_pseudonymize, pseudonyms_restore
from guardrails.spotlight import SPOTLIGHT_NOTE, spotlight

BUILTIN_CHECKS: dict[str, Check] = {
    check.name: check
    for check in (
        PromptInjectionCheck(),
        IndirectInjectionCheck(),
        PiiCheck(),
        SecretsCheck(),
        SystemPromptLeakageCheck(),
        OutputHandlingCheck(),
        ToxicityCheck(),
        TopicCheck(),
    )
}

# What each layer runs when a policy names no checks.
DEFAULT_CHECKS: Mapping[Layer, tuple[str, ...]] = {
    Layer.INPUT: ("prompt_injection", "pii", "secrets", "toxicity", "topic"),
    Layer.TOOL: ("indirect_injection", "pii", "secrets"),
    Layer.OUTPUT: ("system_prompt_leakage", "pii", "secrets", "output_handling", "toxicity"),
    Layer.SYSTEM: ("secrets",),
}


def run_checks(
    content: str, context: CheckContext, names: Iterable[str], registry: Mapping[str, Check] | None = None
) -> list[CheckResult]:
    """Run the named checks on `content`, in order. Never raises: an unknown name or a check that
    raises gives a result with `error=True`, `triggered=False` and the error as evidence, and the
    policy decides whether an errored check fails open or closed."""
    checks = BUILTIN_CHECKS if registry is None else registry
    results: list[CheckResult] = []
    for name in names:
        check = checks.get(name)
        if check is None:
            results.append(CheckResult(name, False, 0.0, f"error: unknown check {name!r}", 0.0, error=True))
            continue
        try:
            results.append(check.check(content, context))
        except Exception as error:  # noqa: BLE001 - one broken check must not take the request path down
            results.append(
                CheckResult(name, False, 0.0, f"error: {type(error).__name__}: {error}"[:500], 0.0, error=True)
            )
    return results


__all__ = [
    "BUILTIN_CHECKS",
    "DEFAULT_CHECKS",
    "SCAN_HEAD",
    "SCAN_TAIL",
    "SPOTLIGHT_NOTE",
    "Action",
    "Check",
    "CheckContext",
    "CheckResult",
    "Finding",
    "Layer",
    "canary_token",
    "pii_pseudonymize",
    "pseudonyms_restore",
    "run_checks",
    "spotlight",
]
