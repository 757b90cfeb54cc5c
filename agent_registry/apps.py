from django.apps import AppConfig


class AgentRegistryConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "agent_registry"
