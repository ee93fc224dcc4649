"""Prometheus metrics: request counters here; domain gauges are registered by the apps.

``/metrics`` names every cluster with its allocation counts, so it needs an admin token
(``Authorization: Bearer …``; a staff user's dashboard session works too) unless ``METRICS_PUBLIC`` is set.
Answers to refused scrapes are problem+json, like the API's.
"""
import time

from django.conf import settings
from django.http import HttpResponse, JsonResponse
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Histogram, generate_latest
from rest_framework import exceptions
from rest_framework.authentication import get_authorization_header

from draservice.problems import PROBLEM_CONTENT_TYPE, problem
from inventory.auth import BearerTokenAuthentication

REQUESTS = Counter("draservice_http_requests_total", "HTTP requests", ["method", "status"])
LATENCY = Histogram("draservice_http_request_seconds", "HTTP request latency", ["method"])


class RequestMetricsMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        start = time.perf_counter()
        response = self.get_response(request)
        LATENCY.labels(request.method).observe(time.perf_counter() - start)
        REQUESTS.labels(request.method, str(response.status_code)).inc()
        return response


def _refused(status_code: int, title: str, reason: str) -> JsonResponse:
    body = problem(status_code, title, reason, errors=[{"field": "Authorization", "reason": reason}])
    response = JsonResponse(body, status=status_code, content_type=PROBLEM_CONTENT_TYPE)
    if status_code == 401:
        response["WWW-Authenticate"] = 'Bearer realm="draservice"'
    return response


def _refusal(request) -> JsonResponse | None:
    """None when the caller may scrape: an admin token (read-only admins too) or a staff session."""
    header = get_authorization_header(request).split()
    if not header:
        user = getattr(request, "user", None)
        if user is not None and user.is_authenticated and user.is_active:
            if user.is_staff:
                return None
            return _refused(403, "Forbidden", "/metrics needs a staff user or an admin token")
        return _refused(401, "Unauthorized", "an admin token is required (Authorization: Bearer <token>), "
                                             "or set METRICS_PUBLIC=true")
    if len(header) != 2 or header[0].lower() != b"bearer":
        return _refused(401, "Unauthorized", "expected 'Authorization: Bearer <token>'")
    try:
        token = BearerTokenAuthentication.authenticate_secret(header[1].decode("ascii"))
    except (exceptions.AuthenticationFailed, UnicodeDecodeError) as exc:
        reason = exc.detail if isinstance(exc, exceptions.AuthenticationFailed) else "Invalid token."
        return _refused(401, "Unauthorized", str(reason))
    if not token.is_admin:
        return _refused(403, "Forbidden", "/metrics needs an admin token")
    return None


def metrics_view(request):
    if not settings.METRICS_PUBLIC:
        refused = _refusal(request)
        if refused is not None:
            return refused
    return HttpResponse(generate_latest(), content_type=CONTENT_TYPE_LATEST)
