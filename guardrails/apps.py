from django.apps import AppConfig


class GuardrailsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "guardrails"

    def ready(self) -> None:
        # From here on every tool call of the gateway passes the action boundary, and every request its
        # content checks and budgets (routing/hooks.py).
        from guardrails import boundary, gateway_guard
        from routing import hooks

        hooks.tool_call_checker_install(boundary.tool_call_authorize)
        hooks.guard_install(gateway_guard.GatewayGuard())
