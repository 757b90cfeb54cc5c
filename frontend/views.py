from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponse


class LoginView(auth_views.LoginView):
    template_name = "frontend/login.html"


class LogoutView(auth_views.LogoutView):
    pass


def home(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")
