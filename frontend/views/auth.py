"""Sign in / sign out with Django's own auth views, on our template."""
from pathlib import Path

from django.contrib.auth import views as auth_views
from django.http import HttpResponse
from django.views.decorators.cache import cache_control
from django.views.decorators.http import require_GET


class LoginView(auth_views.LoginView):
    template_name = "frontend/login.html"
    redirect_authenticated_user = True


class LogoutView(auth_views.LogoutView):
    # Django 5 logs out on POST only (a GET link could be triggered by any page); the layout posts a form.
    pass


_FAVICON = (Path(__file__).resolve().parents[1] / "static" / "frontend" / "favicon.svg").read_bytes()


@require_GET
@cache_control(max_age=86400, public=True)
def favicon(request):
    """The dashboard's icon at the address browsers ask for by themselves (no login, no static route)."""
    return HttpResponse(_FAVICON, content_type="image/svg+xml")
