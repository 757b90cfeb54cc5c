"""Staff use the Django admin; the interactive API docs load without a CDN."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib import admin
from django.test import Client
from django.urls import reverse
from ninja import NinjaAPI

from agent_registry.tests.factories import UserFactory, agent_with_requirements

pytestmark = pytest.mark.django_db


def test_every_admin_page_opens_for_staff():
    staff = UserFactory.create(is_staff=True, is_superuser=True)
    agent_with_requirements()
    client = Client()
    client.force_login(staff)

    for model in admin.site._registry:
        url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
        assert client.get(url).status_code == 200, url


def test_admin_is_closed_to_people_who_are_not_staff():
    client = Client()
    client.force_login(UserFactory.create())

    response = client.get("/admin/agent_registry/agent/")

    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")


def test_the_api_docs_use_keels_own_static_files():
    response = Client().get("/api/v1/docs")

    assert response.status_code == 200
    page = response.content.decode()
    assert "/static/ninja/swagger-ui-bundle.js" in page
    assert "cdn." not in page


def test_the_openapi_schema_is_built_once_per_process(monkeypatch):
    from ninja.openapi import get_schema

    from config.api import api, langfuse_api

    builds: list[str] = []

    def counting_get_schema(*, api: NinjaAPI, path_prefix: str) -> Any:
        builds.append(api.urls_namespace)
        return get_schema(api=api, path_prefix=path_prefix)

    monkeypatch.setattr("ninja.main.get_schema", counting_get_schema)
    monkeypatch.setattr(api, "_openapi_schemas", {}, raising=False)
    monkeypatch.setattr(langfuse_api, "_openapi_schemas", {}, raising=False)

    first = Client().get("/api/v1/openapi.json")
    second = Client().get("/api/v1/openapi.json")
    Client().get("/api/public/openapi.json")

    assert first.status_code == second.status_code == 200
    assert first.json() == second.json()
    assert first.json()["paths"]
    assert builds == ["api", "langfuse"]
