from django.contrib import admin
from django.urls import include, path

from config.api import api, langfuse_api

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
    path("api/public/", langfuse_api.urls),
    path("", include("frontend.urls")),
]
