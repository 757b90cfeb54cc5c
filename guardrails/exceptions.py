"""Errors of the guardrails: policies, checks, approvals and budgets. Mapped to HTTP once, in config/api.py."""

from __future__ import annotations

from config.errors import Conflict, KeelError, NotFound, PayloadTooLarge, Throttled, ValidationFailed


class GuardrailPolicyInvalid(ValidationFailed):
    code = "guardrail_policy_invalid"


class LayerUnknown(ValidationFailed):
    code = "layer_unknown"


class ContentTooLarge(PayloadTooLarge):
    code = "content_too_large"


class ContentNotText(KeelError):
    """Binary content: NUL or other control bytes, or text that is not valid Unicode."""

    status = 400
    code = "content_not_text"


class ApprovalNotFound(NotFound):
    code = "approval_not_found"


class ApprovalAlreadyDecided(Conflict):
    code = "approval_already_decided"


class ApprovalDeciderMissing(ValidationFailed):
    code = "approval_decider_missing"


class BudgetNotFound(NotFound):
    code = "budget_not_found"


class BudgetInvalid(ValidationFailed):
    code = "budget_invalid"


class BudgetExists(Conflict):
    code = "budget_exists"


class BudgetExceeded(Throttled):
    """A request would take a budget past its limit; nothing was reserved. Fails closed."""

    code = "budget_exceeded"
