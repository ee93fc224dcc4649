"""The claim POST (``POST /api/v1/namespaces/{ns}/resourceclaims``) without DRF's dispatch (issue 32).

A single claim POST is the service's most frequent write, and DRF's per-request machinery - the Request
wrapper, fresh parser, authenticator and negotiator instances, content negotiation, the permission loop, the
response's finalizing - cost as much web CPU as the create's statement. The common request (a Bearer token, a
JSON body, a JSON answer or any, no query string) is answered here by doing what DRF's dispatch does for it,
in its order: authenticate (401), may the token write the namespace (403), parse the body (400), then the
view's own ``create_claim`` (422 before the per-claim 403, Idempotency-Key, Location). An exception is turned
into the answer by DRF itself, on a ``ClaimListView`` (its exception handler, headers and renderer), so errors
are what they were, byte for byte. Every other request - another method, a session, YAML in or out,
``?format=`` or ``?dryRun=All``, a test client's forced authentication - goes to DRF's view unchanged.

The OpenAPI schema still describes the operation: the URL's view carries ``ClaimListView`` as its ``cls``,
which drf-spectacular reads.
"""
from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

from django.http import HttpRequest, HttpResponseBase
from django.utils.cache import patch_vary_headers
from rest_framework import exceptions
from rest_framework.renderers import JSONRenderer

from claims.api.views import ClaimListView, create_claim
from draservice.auth import BearerTokenAuthentication
from draservice.parsers import JSONParser
from draservice.permissions import ClaimAccess

JSON = "application/json"
# What DRF's content negotiation answers with JSONRenderer and ``application/json`` (a missing Accept is "*/*").
_ACCEPTS = frozenset({None, "*/*", JSON})
_RENDERER = JSONRenderer()
_PARSER = JSONParser()
_AUTHENTICATION = BearerTokenAuthentication()


def claim_list_view() -> Callable:
    """The URL's view: ``ClaimListView`` for every request this module does not answer itself."""
    drf_view = ClaimListView.as_view()
    probe = ClaimListView()
    probe.setup(HttpRequest())  # as for a request: a view with GET gets HEAD
    allow = ", ".join(probe.allowed_methods)  # DRF's Allow header of this view

    def view(request: HttpRequest, namespace: str) -> HttpResponseBase:
        if request.method == "POST" and _plain(request):
            return _post(request, namespace, allow, drf_view)
        return drf_view(request, namespace=namespace)

    # What Django, DRF and drf-spectacular read from an as_view() function (the schema comes from ``cls``).
    for attr in ("cls", "initkwargs", "view_class", "view_initkwargs", "csrf_exempt", "__doc__", "__module__",
                 "__name__", "__qualname__"):
        setattr(view, attr, getattr(drf_view, attr))
    return view


def _plain(request: HttpRequest) -> bool:
    """A request whose DRF answer this module gives: Bearer token, JSON body, JSON answer, no query, no
    forced authentication (DRF's test client), a body nobody has read yet."""
    meta = request.META
    return (meta.get("HTTP_AUTHORIZATION", "")[:7].lower() == "bearer "
            and meta.get("CONTENT_TYPE") == JSON and meta.get("HTTP_ACCEPT") in _ACCEPTS
            and not meta.get("QUERY_STRING")
            and getattr(request, "_force_auth_user", None) is None
            and getattr(request, "_force_auth_token", None) is None
            and not getattr(request, "_read_started", False))


def _post(request: HttpRequest, namespace: str, allow: str, drf_view: Callable) -> HttpResponseBase:
    kwargs = {"namespace": namespace}
    try:
        found = _AUTHENTICATION.authenticate(request)
        if found is None:  # not a Bearer token after all: DRF tries the session
            return drf_view(request, namespace=namespace)
        # DRF's Request sets both on the request it wraps; the audit trail and access_for read them there.
        request.user = found[0]
        setattr(request, "auth", found[1])  # noqa: B010 - HttpRequest declares no ``auth``
        view = SimpleNamespace(kwargs=kwargs)  # what ClaimAccess reads of the view
        permission = ClaimAccess()
        if not permission.has_permission(request, view):
            _denied(permission)

        def check_object_permissions(request, obj) -> None:
            permission = ClaimAccess()
            if not permission.has_object_permission(request, view, obj):
                _denied(permission)

        response = create_claim(request, namespace, _body(request), check_object_permissions)
    except Exception as exc:  # noqa: BLE001 - answered as DRF answers it (or raised on, as DRF does)
        return _drf_answer(request, kwargs, exc)
    # DRF's finalize_response for this view and JSON; Django's handler renders it.
    response.accepted_renderer = _RENDERER
    response.accepted_media_type = JSON
    response.renderer_context = {"view": None, "args": (), "kwargs": kwargs,  # type: ignore[attr-defined]
                                 "request": request}
    patch_vary_headers(response, ("Accept",))
    response["Allow"] = allow
    return response


def _denied(permission) -> None:
    # DRF's permission_denied for an authenticated caller.
    raise exceptions.PermissionDenied(detail=getattr(permission, "message", None),
                                      code=getattr(permission, "code", None))


def _body(request: HttpRequest):
    """``request.data`` as DRF parses a JSON body: no body is ``{}``."""
    meta = request.META
    try:
        length = int(meta.get("CONTENT_LENGTH", meta.get("HTTP_CONTENT_LENGTH", 0)))
    except (ValueError, TypeError):
        length = 0
    return {} if length == 0 else _PARSER.parse(request, JSON)


def _drf_answer(request: HttpRequest, kwargs: dict, exc: Exception) -> HttpResponseBase:
    """The error answer of DRF's dispatch: its exception handling and finalizing on a ClaimListView."""
    view = ClaimListView()
    view.setup(request, **kwargs)
    drf_request = view.initialize_request(request, **kwargs)
    view.request = drf_request
    view.headers = view.default_response_headers
    view.format_kwarg = None
    drf_request.accepted_renderer, drf_request.accepted_media_type = view.perform_content_negotiation(drf_request)
    response = view.handle_exception(exc)
    view.response = view.finalize_response(drf_request, response, **kwargs)
    return view.response
