"""Kubernetes ``Status`` answers (``metav1.Status``), the /k8s door's error shape.

The messages follow the API server's wording (``k8s.io/apimachinery/pkg/api/errors``), e.g.
``resourceclaims.resource.k8s.io "gpu" not found``, because users and scripts grep for them.
"""
from __future__ import annotations

from django.http import Http404, JsonResponse
from rest_framework import exceptions

from draservice.errors import ServiceError
from draservice.problems import FieldError, api_exception

REASONS = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 405: "MethodNotAllowed",
           406: "NotAcceptable", 409: "Conflict", 410: "Expired", 412: "Conflict", 413: "RequestEntityTooLarge",
           415: "UnsupportedMediaType", 422: "Invalid", 429: "TooManyRequests", 500: "InternalError",
           503: "ServiceUnavailable"}


class KubeError(Exception):
    """Raise from the /k8s views for an answer that is not one of the service's own exceptions."""

    def __init__(self, code: int, message: str, reason: str | None = None, details: dict | None = None,
                 headers: dict | None = None):
        super().__init__(message)
        self.code, self.message = code, message
        self.reason = reason or REASONS.get(code, "Unknown")
        self.details = details or {}
        self.headers = headers or {}


def status_body(code: int, message: str, reason: str | None = None, details: dict | None = None) -> dict:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure" if code >= 400 else "Success",
            "message": message, "reason": reason or REASONS.get(code, "Unknown"), "code": code}
    if details:
        body["details"] = details
    return body


def status_response(code: int, message: str, reason: str | None = None, details: dict | None = None) -> JsonResponse:
    return JsonResponse(status_body(code, message, reason, details), status=code)


def conflict(qualified: str, name: str) -> KubeError:
    """A write from a stale resourceVersion (or a stale If-Match), in the API server's words."""
    return KubeError(409, f'Operation cannot be fulfilled on {qualified} "{name}": the object has been modified; '
                          "please apply your changes to the latest version and try again", "Conflict", {"name": name})


def not_found(qualified: str, name: str, kind: str) -> KubeError:
    return KubeError(404, f'{qualified} "{name}" not found', details={"name": name, "kind": kind})


def translate(exc: Exception, qualified: str = "", kind: str = "", name: str = "") -> KubeError | None:
    """The service's exceptions as Kubernetes would say them; None for what is not ours to translate."""
    if isinstance(exc, KubeError):
        return exc
    if isinstance(exc, ServiceError):
        exc = api_exception(exc)  # the codes both doors answer; the words below are the API server's
    details = {k: v for k, v in (("name", name), ("group", qualified.partition(".")[2]), ("kind", kind)) if v}
    if isinstance(exc, Http404 | exceptions.NotFound):
        return not_found(qualified or "object", name, kind) if name else KubeError(404, "the server could not "
                                                                                   "find the requested resource")
    if isinstance(exc, FieldError):
        code = int(exc.status_code)
        causes = [{"reason": "FieldValueInvalid", "message": e["reason"], "field": e["field"]} for e in exc.errors]
        if code == 409 and "already exists" in str(exc.detail):
            return KubeError(409, f'{qualified} "{name}" already exists', "AlreadyExists", details)
        if code == 422:
            listed = ", ".join(f"{c['field']}: {c['message']}" if c["field"] else c["message"] for c in causes)
            message = f'{kind}.{qualified.partition(".")[2]} "{name}" is invalid: [{listed}]'
            extra = dict(exc.extra)  # the manifest doctor's rewrite or skeleton, as /api/v1 answers it
            return KubeError(422, message, "Invalid", {**details, "causes": causes, **extra})
        return KubeError(code, str(exc.detail), None, {**details, "causes": causes} if causes else details)
    if isinstance(exc, exceptions.APIException):
        code = int(exc.status_code)
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if code == 412:  # our If-Match: Kubernetes says Conflict for a stale resourceVersion
            error = conflict(qualified, name)
            error.details = details
            return error
        if code == 409 and "already exists" in message:
            return KubeError(409, f'{qualified} "{name}" already exists', "AlreadyExists", details)
        headers = {"Retry-After": str(getattr(exc, "wait", "") or "")} if code == 429 else {}
        return KubeError(code, message, None, details, {k: v for k, v in headers.items() if v})
    return None
