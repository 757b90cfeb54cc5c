from django.apps import AppConfig


class GuardrailsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "guardrails"

    def ready(self) -> None:
        # Every tool call of the gateway passes the action boundary from here on (routing/hooks.py).
        from guardrails import boundary
        from routing import hooks

        hooks.tool_call_checker_install(boundary.tool_call_authorize)
