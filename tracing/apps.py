from django.apps import AppConfig


class TracingConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "tracing"

    def ready(self) -> None:
        from tracing import checks  # noqa: F401  (registers the settings checks)
