"""The REST doors' ``Idempotency-Key`` create: one shape for every POST that creates objects.

The record-keeping itself (which table, which transaction) belongs to the app that owns the records and is
passed in as ``run`` (``claims.services.idempotency.run``): the platform imports no domain app.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from rest_framework.response import Response

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
META_KEY = "HTTP_IDEMPOTENCY_KEY"  # HEADER as read from request.META (request.headers builds a map of them all)


Refresh = Callable[[dict], dict]


class Runner(Protocol):
    def __call__(self, scope: str, key: str | None, body, fn: Callable[[], tuple[int, dict]], *,
                 atomic: bool = ..., refresh: Refresh | None = ...) -> tuple[int, dict, bool]: ...


def create_response(request, scope: str, body, create: Callable[[], tuple[int, dict]], run: Runner, *,
                    location: bool = False, atomic: bool = True, refresh: Refresh | None = None) -> Response:
    """Run ``create`` (which returns (status, body)) at most once per ``scope`` and the request's key, and answer
    as the first time did; a replay is marked ``Idempotent-Replayed: true``. ``location``: the answer names the
    object it created under the request's path. ``atomic`` and ``refresh`` go to ``run``."""
    code, payload, replayed = run(scope, request.META.get(META_KEY), body, create, atomic=atomic,
                                  refresh=refresh)
    response = Response(payload, status=code)
    if replayed:
        response[REPLAYED_HEADER] = "true"
    if location:
        response["Location"] = f"{request.path.rstrip('/')}/{(payload.get('metadata') or {}).get('name')}"
    return response
