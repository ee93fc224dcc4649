"""One exception handler: every API error is ``application/problem+json`` (RFC 9457).

Validation errors carry ``errors: [{"field": "spec.devices.requests[0].name", "reason": "..."}]``
so a client sees exactly which field of its object is wrong.
"""
from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import Http404, JsonResponse
from rest_framework import exceptions, status
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from draservice.errors import (
    AlreadyExists,
    BadRequest,
    Conflict,
    Forbidden,
    Invalid,
    NotFound,
    PreconditionFailed,
    QuotaExceeded,
    ServiceError,
    Throttled,
)

log = logging.getLogger(__name__)

PROBLEM_CONTENT_TYPE = "application/problem+json"


class ProblemJSONRenderer(JSONRenderer):
    media_type = PROBLEM_CONTENT_TYPE


class FieldError(exceptions.APIException):
    """A 4xx with a list of (field path, reason), for the doors (views, parsers, pagination): a service raises a
    domain exception (``draservice.errors``) instead, and the doors choose the code."""

    status_code: int = status.HTTP_422_UNPROCESSABLE_ENTITY
    default_detail = "The object is invalid."
    default_code = "invalid"

    def __init__(self, errors: list[tuple[str, str]] | list[dict], detail: str | None = None,
                 status_code: int | None = None, title: str | None = None, extra: dict | None = None):
        # ``extra``: more members of the problem body (the manifest doctor's rewrite, for one).
        self.extra: dict = dict(extra or {})
        self.errors = [e if isinstance(e, dict) else {"field": e[0], "reason": e[1]} for e in errors]
        if detail is None:
            detail = "; ".join(f"{e['field']}: {e['reason']}" if e["field"] else e["reason"] for e in self.errors)
        super().__init__(detail=detail)
        if status_code is not None:
            self.status_code = status_code
        self.title = title


# The status code of each domain exception (draservice.errors), at both doors: the only place they are chosen.
STATUS: dict[type[ServiceError], int] = {
    BadRequest: status.HTTP_400_BAD_REQUEST, QuotaExceeded: status.HTTP_403_FORBIDDEN,
    Forbidden: status.HTTP_403_FORBIDDEN,
    NotFound: status.HTTP_404_NOT_FOUND, AlreadyExists: status.HTTP_409_CONFLICT, Conflict: status.HTTP_409_CONFLICT,
    PreconditionFailed: status.HTTP_412_PRECONDITION_FAILED, Invalid: status.HTTP_422_UNPROCESSABLE_ENTITY,
    Throttled: status.HTTP_429_TOO_MANY_REQUESTS,
}


def status_of(exc: ServiceError) -> int:
    """The HTTP status of a domain exception (the dashboard's forms answer with it too)."""
    return next(STATUS[cls] for cls in type(exc).__mro__ if cls in STATUS)


def api_exception(exc: ServiceError) -> exceptions.APIException:
    """A domain exception as the HTTP error both doors render: field errors keep their fields (title "Invalid
    object" unless the service named one), a message is the detail under the status's own title."""
    code = status_of(exc)
    if isinstance(exc, Throttled):
        return exceptions.Throttled(wait=exc.wait, detail=exc.detail)
    if exc.errors:
        return FieldError(exc.errors, exc.detail, status_code=code, title=exc.title, extra=exc.extra)
    error = exceptions.APIException(exc.detail)
    error.status_code = code
    return error


def flatten_errors(data: Any, prefix: str = "") -> list[dict]:
    """Turn DRF's nested error structure into a flat list of field paths and reasons."""
    out: list[dict] = []
    if isinstance(data, dict):
        for key, value in data.items():
            if key in ("non_field_errors", "__all__"):
                out.extend(flatten_errors(value, prefix))
            else:
                out.extend(flatten_errors(value, f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(data, list):
        if all(not isinstance(v, (dict, list)) for v in data):
            out.extend({"field": prefix, "reason": str(v)} for v in data)
        else:
            for i, value in enumerate(data):
                if value:
                    out.extend(flatten_errors(value, f"{prefix}[{i}]"))
    else:
        out.append({"field": prefix, "reason": str(data)})
    return out


def problem(status_code: int, title: str, detail: str, errors: list[dict] | None = None, **extra) -> dict:
    """The body of every error. ``errors`` is always there (clients iterate it without checking): without
    field errors it holds one entry for the whole request (field "") with the detail."""
    body = {"type": "about:blank", "title": title, "status": status_code, "detail": detail,
            "errors": errors if errors else [{"field": "", "reason": detail}]}
    body.update(extra)
    return body


def _join_reasons(errors: list[dict]) -> str:
    return "; ".join(f"{e['field']}: {e['reason']}" if e["field"] else e["reason"] for e in errors)


def exception_handler(exc, context):
    if isinstance(exc, ServiceError):
        exc = api_exception(exc)
    elif isinstance(exc, Http404):
        exc = exceptions.NotFound(str(exc) or "Not found.")
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied(str(exc) or None)
    response = drf_exception_handler(exc, context)
    if response is None:
        return None  # unexpected: Django logs it and answers 500 (problem+json under /api, see api_handler500)
    title = response.status_text if hasattr(response, "status_text") else "Error"
    if isinstance(exc, FieldError):
        body = problem(response.status_code, exc.title or "Invalid object", str(exc.detail), errors=exc.errors,
                       **exc.extra)
    elif isinstance(exc, exceptions.ValidationError):
        errors = flatten_errors(exc.detail)
        body = problem(response.status_code, "Invalid object", _join_reasons(errors) or "Invalid input.",
                       errors=errors)
    else:
        detail = exc.detail if isinstance(getattr(exc, "detail", None), str) else str(getattr(exc, "detail", exc))
        body = problem(response.status_code, title, str(detail))
    response.data = body
    response.content_type = PROBLEM_CONTENT_TYPE
    # Errors are problem+json whatever the request asked for (YAML, or something we cannot render: 406):
    # one shape for every client, as the README promises. The view's response is finalized with the
    # request's renderer, so that is the one to set.
    request = context.get("request")
    if request is not None:
        request.accepted_renderer, request.accepted_media_type = ProblemJSONRenderer(), PROBLEM_CONTENT_TYPE
    return response


def problem_response(status_code: int, title: str, detail: str, **extra) -> Response:
    return Response(problem(status_code, title, detail, **extra), status=status_code, content_type=PROBLEM_CONTENT_TYPE)


def json_problem(status_code: int, title: str, detail: str, errors: list[dict] | None = None) -> JsonResponse:
    """For plain Django views and middleware (the 400/403/404/500 handlers on API paths)."""
    return JsonResponse(problem(status_code, title, detail, errors), status=status_code,
                        content_type=PROBLEM_CONTENT_TYPE)


def is_api_path(path: str) -> bool:
    return path.startswith("/api/")


K8S_REASONS = {400: "BadRequest", 403: "Forbidden", 404: "NotFound", 500: "InternalError"}


def _door_status(request, code: int, message: str) -> JsonResponse | None:
    """Under the Kubernetes front door (/k8s/) Django's own errors are Kubernetes ``Status`` objects."""
    if not request.path.startswith("/k8s/"):
        return None
    return JsonResponse({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                         "message": message, "reason": K8S_REASONS[code], "code": code}, status=code)


# Django's own error views (a URL no route matches, an unhandled exception, a SuspiciousOperation such as
# an oversized body, a CSRF failure) answer HTML; under /api/ they answer problem+json like the views do.

def api_handler400(request, exception=None):
    door = _door_status(request, 400, str(exception) if exception else "bad request")
    if door is not None:
        return door
    if is_api_path(request.path):
        return json_problem(400, "Bad Request", str(exception) if exception else "Bad request.")
    from django.views.defaults import bad_request

    return bad_request(request, exception)


def api_handler403(request, exception=None):
    door = _door_status(request, 403, str(exception) if exception else "forbidden")
    if door is not None:
        return door
    if is_api_path(request.path):
        return json_problem(403, "Forbidden", str(exception) if exception else "Forbidden.")
    from django.views.defaults import permission_denied

    return permission_denied(request, exception)


def api_handler404(request, exception=None):
    door = _door_status(request, 404, "the server could not find the requested resource")
    if door is not None:
        return door
    if is_api_path(request.path):
        return json_problem(404, "Not Found", f"The path {request.path} does not exist in this API.")
    from django.views.defaults import page_not_found

    return page_not_found(request, exception)


def api_handler500(request):
    door = _door_status(request, 500, "an error on the server has prevented the request from succeeding; "
                                      "it has been logged")
    if door is not None:
        return door
    if is_api_path(request.path):
        return json_problem(500, "Internal Server Error",
                            "The server failed to answer this request; it has been logged.")
    from django.views.defaults import server_error

    return server_error(request)
