from django.contrib import admin
from django.urls import include, path

from config.api import api, langfuse_api
from routing.gateway_api import chat_completions_api, model_api, models_api
from tracing.otlp_api import traces_ingest_api

urlpatterns = [
    path("admin/", admin.site.urls),
    path("v1/traces", traces_ingest_api, name="otlp-traces"),
    path("api/public/otel/v1/traces", traces_ingest_api, name="langfuse-otlp-traces"),
    path("v1/chat/completions", chat_completions_api, name="gateway-chat-completions"),
    path("v1/models", models_api, name="gateway-models"),
    path("v1/models/<path:model>", model_api, name="gateway-model"),  # agent ids hold a '/'
    path("api/v1/", api.urls),
    path("api/public/", langfuse_api.urls),
    path("", include("frontend.urls")),
]

handler404 = "config.views.page_not_found"
handler500 = "config.views.server_error"
