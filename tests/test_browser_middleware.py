"""draservice.middleware.BrowserMiddleware: the session, CSRF, auth and messages middleware run for every request
but a Bearer token's to a token's door, and their CSRF view check runs with them."""
from __future__ import annotations

from django.http import HttpResponse
from django.test import RequestFactory

from draservice.middleware import BrowserMiddleware

TOKEN = {"HTTP_AUTHORIZATION": "Bearer dra_abc_def"}


def _served(method: str, path: str, **headers) -> tuple[dict, HttpResponse | None]:
    """What the view saw of the request, and the CSRF check's answer (None: passed) for a view it protects."""
    seen: dict = {}

    def view(request):
        seen.update(session=hasattr(request, "session"), messages=hasattr(request, "_messages"),
                    user=request.user, csrf=request.META.get("CSRF_COOKIE"))
        return HttpResponse("ok")

    middleware = BrowserMiddleware(view)
    request = getattr(RequestFactory(), method)(path, **headers)
    middleware(request)
    return seen, middleware.process_view(request, view, (), {})


def test_a_token_request_to_the_api_skips_the_browser_middleware():
    for path in ("/api/v1/namespaces/a/resourceclaims", "/k8s/api/v1/pods", "/metrics", "/livez"):
        seen, csrf = _served("post", path, **TOKEN)
        assert not seen["session"] and not seen["messages"] and not seen["user"].is_authenticated, path
        assert csrf is None  # no session was loaded, nothing to forge


def test_a_browser_request_gets_session_messages_user_and_the_csrf_check():
    seen, csrf = _served("post", "/api/v1/namespaces/a/resourceclaims")
    assert seen["session"] and seen["messages"] and not seen["user"].is_authenticated
    assert csrf is not None and csrf.status_code == 403  # a POST without the CSRF token


def test_the_dashboard_and_admin_get_the_browser_middleware_whatever_the_headers():
    for path in ("/", "/admin/", "/queues/", "/login/"):
        seen, csrf = _served("post", path, **TOKEN)
        assert seen["session"] and seen["messages"], path
        assert csrf is not None and csrf.status_code == 403, path


def test_another_scheme_is_not_a_token():
    seen, _ = _served("get", "/api/v1/namespaces", HTTP_AUTHORIZATION="Basic dXNlcjpwYXNz")
    assert seen["session"]
