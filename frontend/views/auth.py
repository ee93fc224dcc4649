"""Sign in / sign out with Django's own auth views, on our template."""
from django.contrib.auth import views as auth_views


class LoginView(auth_views.LoginView):
    template_name = "frontend/login.html"
    redirect_authenticated_user = True


class LogoutView(auth_views.LogoutView):
    # Django 5 logs out on POST only (a GET link could be triggered by any page); the layout posts a form.
    pass
