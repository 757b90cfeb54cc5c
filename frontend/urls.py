from django.urls import URLPattern, URLResolver, include, path

from frontend import views

app_name = "frontend"

agent_patterns: list[URLPattern | URLResolver] = [
    path("", views.agent_detail_view, name="agent_detail"),
    path("requirements/", views.requirements_edit_view, name="requirements_edit"),
    path("requirements/validate/", views.requirements_validate_view, name="requirements_validate"),
    path("requirements/history/", views.requirements_history_view, name="requirements_history"),
    path("requirements/<int:version>/activate/", views.requirements_activate_view, name="requirements_activate"),
    path("configuration/", views.configuration_view, name="configuration"),
    path("prompts/", views.agent_prompt_list_view, name="agent_prompt_list"),
]

prompt_patterns: list[URLPattern | URLResolver] = [
    path("", views.prompt_detail_view, name="prompt_detail"),
    path("versions/", views.prompt_version_create_view, name="prompt_version_create"),
    path("labels/", views.prompt_label_move_view, name="prompt_label_move"),
    path("render/", views.prompt_render_view, name="prompt_render"),
]

workspace_patterns: list[URLPattern | URLResolver] = [
    path("", views.workspace_home_view, name="workspace_home"),
    path("agents/", views.agent_list_view, name="agent_list"),
    path("agents/<slug:agent_slug>/", include(agent_patterns)),
    path("prompts/", views.prompt_list_view, name="prompt_list"),
    path("prompts/<int:prompt_id>/", include(prompt_patterns)),
    path("keys/", views.apikey_list_view, name="apikey_list"),
    path("keys/<int:key_id>/revoke/", views.apikey_revoke_view, name="apikey_revoke"),
]

urlpatterns: list[URLPattern | URLResolver] = [
    path("login/", views.LoginView.as_view(), name="login"),
    path("logout/", views.LogoutView.as_view(), name="logout"),
    path("", views.home_view, name="home"),
    path("w/<slug:workspace_slug>/", include(workspace_patterns)),
]
