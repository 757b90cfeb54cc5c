from django.apps import AppConfig
from django.core import checks


class TracingConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "tracing"

    def ready(self) -> None:
        from tracing.checks import outbound_settings_check

        checks.register(outbound_settings_check, checks.Tags.security)
