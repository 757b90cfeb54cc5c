"""Django system checks of tracing's settings (registered by TracingConfig.ready): a mistake in them is
reported when Keel starts (`migrate`, `check`), not by the first webhook a member saves."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks
from django.utils.module_loading import import_string


def outbound_settings_check(app_configs: Any, **kwargs: Any) -> list[checks.CheckMessage]:
    from tracing import outbound

    problems: list[checks.CheckMessage] = []
    try:
        outbound.parse_allowed(settings.KEEL_OUTBOUND_ALLOWED_HOSTS)
    except ValueError as error:
        problems.append(
            checks.Error(str(error), hint="name hosts, addresses or CIDR networks, comma-separated", id="keel.E001")
        )
    try:
        import_string(settings.KEEL_OUTBOUND_RESOLVER)
    except ImportError as error:
        problems.append(checks.Error(f"KEEL_OUTBOUND_RESOLVER: {error}", id="keel.E002"))
    return problems
