from django.contrib import admin
from django.urls import include, path

from config.api import api, langfuse_api
from tracing.otlp_api import traces_ingest_api

urlpatterns = [
    path("admin/", admin.site.urls),
    path("v1/traces", traces_ingest_api, name="otlp-traces"),
    path("api/public/otel/v1/traces", traces_ingest_api, name="langfuse-otlp-traces"),
    path("api/v1/", api.urls),
    path("api/public/", langfuse_api.urls),
    path("", include("frontend.urls")),
]

handler404 = "config.views.page_not_found"
handler500 = "config.views.server_error"
