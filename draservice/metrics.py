"""Prometheus metrics: request counters here; domain gauges are registered by the apps."""
import time

from prometheus_client import CONTENT_TYPE_LATEST, Counter, Histogram, generate_latest
from django.http import HttpResponse

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


def metrics_view(request):
    return HttpResponse(generate_latest(), content_type=CONTENT_TYPE_LATEST)
