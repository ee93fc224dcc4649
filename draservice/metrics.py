"""Prometheus metrics: request counters here; domain gauges are registered by the apps.

Request metrics are labelled by the resolved URL pattern (``request.resolver_match.route``), never by the
raw path: a path carries namespaces and claim names, a series each. A request no pattern matched is
``route="unmatched"``.

The domain collectors (``register_collector``) read the database at scrape time, so every process agrees on
them. The request metrics are counted in each gunicorn worker; under gunicorn they live in
prometheus_client's multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``, set up by gunicorn.conf.py): a scrape,
whichever worker answers it, sums the files of all the workers of that server. (The workers share one host,
which multiprocess mode needs; Celery workers on other hosts observe nothing here, see
``scheduler.services.round_log``.)

``/metrics`` names every cluster with its allocation counts, so it needs an admin token
(``Authorization: Bearer …``; a staff user's dashboard session works too) unless ``METRICS_PUBLIC`` is set.
Answers to refused scrapes are problem+json, like the API's.
"""
import threading
import time

from django.conf import settings
from django.http import HttpResponse, JsonResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
    values,
)
from prometheus_client.registry import Collector
from rest_framework import exceptions
from rest_framework.authentication import get_authorization_header

from draservice.auth import BearerTokenAuthentication
from draservice.problems import PROBLEM_CONTENT_TYPE, problem

REQUESTS = Counter("draservice_http_requests_total", "HTTP requests by method, URL pattern and status",
                   ["method", "route", "status"])
LATENCY = Histogram("draservice_http_request_seconds", "HTTP request latency by method and URL pattern",
                    ["method", "route"])
UNMATCHED = "unmatched"
# Methods outside this set are counted as "other": the method is client-chosen, a label value each.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

# The scrape-time collectors of the apps, by name (an app's ready() may run more than once in tests).
_collectors: dict[str, Collector] = {}
_lock = threading.Lock()
_multiprocess_registry: CollectorRegistry | None = None


def register_collector(name: str, collector: Collector) -> None:
    """Register an app's scrape-time collector once per process, whatever registry a scrape uses."""
    with _lock:
        if name in _collectors:
            return
        _collectors[name] = collector
        REGISTRY.register(collector)


def route_of(request) -> str:
    match = getattr(request, "resolver_match", None)
    return (match.route or match.view_name or UNMATCHED) if match is not None else UNMATCHED


class RequestMetricsMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        start = time.perf_counter()
        response = self.get_response(request)
        method = request.method if request.method in METHODS else "other"
        route = route_of(request)
        LATENCY.labels(method, route).observe(time.perf_counter() - start)
        REQUESTS.labels(method, route, str(response.status_code)).inc()
        return response


def _counting_in_files() -> bool:
    """prometheus_client chose its value store when first imported: if that was before PROMETHEUS_MULTIPROC_DIR
    was set, this process counts in memory, and reading the directory would report no request at all."""
    return bool(getattr(values.ValueClass, "_multiprocess", False))


def registry() -> CollectorRegistry:
    """The default registry in one process; under gunicorn's multiprocess mode, one that sums every worker's
    request metrics and adds the apps' scrape-time collectors (read once, by whichever worker answers)."""
    global _multiprocess_registry
    if not (settings.PROMETHEUS_MULTIPROC_DIR and _counting_in_files()):
        return REGISTRY
    with _lock:
        if _multiprocess_registry is None:
            built = CollectorRegistry()
            multiprocess.MultiProcessCollector(built, path=settings.PROMETHEUS_MULTIPROC_DIR)
            for collector in _collectors.values():
                built.register(collector)
            _multiprocess_registry = built
        return _multiprocess_registry


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
    return HttpResponse(generate_latest(registry()), content_type=CONTENT_TYPE_LATEST)
