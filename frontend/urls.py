from django.urls import path

from frontend import views

app_name = "frontend"

urlpatterns = [
    path("login/", views.LoginView.as_view(), name="login"),
    path("logout/", views.LogoutView.as_view(), name="logout"),
    path("", views.home, name="home"),
]
