"""The Celery application; every app's tasks.py is discovered from INSTALLED_APPS."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")

app = Celery("keel")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
