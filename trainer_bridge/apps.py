from django.apps import AppConfig


class TrainerBridgeConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "trainer_bridge"
