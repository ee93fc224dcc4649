"""List paging with Kubernetes' rules for the list parameters (k8s.io/apiserver's ListOptions):

* ``limit``: an integer; missing, zero or negative means "no limit", which here is the server's maximum
  (``max_page_size``); above the maximum it is the maximum (the client pages on with the token). Anything
  that is not an integer is a 400.
* the continue token (``continue`` on the Kubernetes-shaped lists, ``cursor`` on the inventory's): one we
  cannot decode is a 400 ("invalid continue token"); one that decodes but no longer fits the list (its
  position cannot be compared with the current ordering, as when the list's order changed since) is a
  410 Gone, as an expired token is upstream: start the list again.
"""
from __future__ import annotations

import time
from urllib.parse import parse_qs, urlparse

from django.core.exceptions import FieldDoesNotExist
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import connection
from rest_framework import pagination, status
from rest_framework.exceptions import NotFound
from rest_framework.response import Response

from draservice.problems import FieldError

# Upstream's words for an expired continue token (k8s.io/apiserver/pkg/storage/errors.go), shortened.
EXPIRED = ("The provided continue parameter is too old to display a consistent list result. You can start a "
           "new list without the continue parameter.")


class CursorPagination(pagination.CursorPagination):
    """Cursor pagination: stable under concurrent inserts, cheap on big tables."""

    page_size = 100
    page_size_query_param = "limit"
    max_page_size = 5000
    ordering = "id"

    def get_page_size(self, request):
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None or raw == "":
            return self.page_size
        try:
            limit = int(raw.strip())
        except ValueError:
            raise FieldError([(self.page_size_query_param, f"Invalid value: {raw!r}: must be an integer")],
                             status_code=status.HTTP_400_BAD_REQUEST, title="Bad Request") from None
        return self.max_page_size if limit <= 0 else min(limit, self.max_page_size)

    def decode_cursor(self, request):
        try:
            return super().decode_cursor(request)
        except NotFound:  # DRF's answer to a token it cannot decode
            raw = request.query_params.get(self.cursor_query_param)
            raise FieldError([(self.cursor_query_param, f"invalid continue token: {raw!r}")],
                             status_code=status.HTTP_400_BAD_REQUEST, title="Bad Request") from None

    def paginate_queryset(self, queryset, request, view=None):
        cursor = self.decode_cursor(request)
        if cursor is not None and cursor.position is not None:
            self._check_position(cursor.position, self.get_ordering(request, queryset, view), queryset.model)
        return super().paginate_queryset(queryset, request, view)

    def _check_position(self, position: str, ordering: tuple, model) -> None:
        """410 when the token's position is not a value of the field the list is ordered by (the query would
        otherwise fail on it: a 500)."""
        try:
            field = model._meta.get_field(ordering[0].lstrip("-"))
        except FieldDoesNotExist:
            return  # an annotation: nothing to check it against
        try:
            field.get_prep_value(field.to_python(position))
        except (DjangoValidationError, ValueError, TypeError, OverflowError):
            raise FieldError([(self.cursor_query_param, EXPIRED)], detail=EXPIRED, title="Gone",
                             status_code=status.HTTP_410_GONE) from None


def list_resource_version() -> str:
    """The list-level ``metadata.resourceVersion``: a consistency point no later than the rows a list shows.

    On PostgreSQL, the current snapshot's xmin: every transaction below it has finished, and the list's rows
    (read after this) include all of them. It only grows, which is what Kubernetes clients rely on (they
    compare it opaquely, and hand it back to ``watch``). Elsewhere (the embedded SQLite default, which has one
    writer at a time) a timestamp in microseconds."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text")
            return cursor.fetchone()[0]
    return str(time.time_ns() // 1000)


class ListPagination(CursorPagination):
    """One list pagination for every list endpoint: Kubernetes' ``?limit=`` and opaque ``?continue=`` token,
    ``metadata.continue`` and a list-level ``metadata.resourceVersion``.

    Kubernetes-shaped lists (claims, templates, consumers, gangs, queues) render their own ``kind``/``items``
    with ``list_metadata()``. The inventory's lists answer ``get_paginated_response``: ``metadata`` and
    ``items``, plus their old ``results``, ``next`` and ``previous`` and the ``?cursor=`` parameter, kept as a
    deprecated alias for existing agents and scripts (a ``Warning`` header says so)."""

    cursor_query_param = "continue"
    legacy_cursor_param = "cursor"
    DEPRECATION = ('299 - "results, next, previous and ?cursor= are deprecated and will be removed: use items, '
                   'metadata.continue and ?continue="')

    def decode_cursor(self, request):
        if self.cursor_query_param not in request.query_params and \
                self.legacy_cursor_param in request.query_params:
            self.cursor_query_param = self.legacy_cursor_param  # this instance serves one request
        return super().decode_cursor(request)

    def paginate_queryset(self, queryset, request, view=None):
        self.resource_version = list_resource_version()
        page = super().paginate_queryset(queryset, request, view)
        self.cursor_query_param = type(self).cursor_query_param  # links carry ?continue=
        return page

    def continue_token(self) -> str | None:
        link = self.get_next_link()
        if not link:
            return None
        tokens = parse_qs(urlparse(link).query).get(self.cursor_query_param)
        return tokens[0] if tokens else None

    def get_schema_operation_parameters(self, view):
        params = super().get_schema_operation_parameters(view)
        params.append({"name": self.legacy_cursor_param, "required": False, "in": "query", "deprecated": True,
                       "description": "deprecated alias of continue", "schema": {"type": "string"}})
        return params

    def list_metadata(self) -> dict:
        meta = {"resourceVersion": getattr(self, "resource_version", None) or list_resource_version()}
        token = self.continue_token()
        if token:
            meta["continue"] = token
        return meta

    def get_paginated_response(self, data):
        response = Response({"metadata": self.list_metadata(), "items": data,
                             "next": self.get_next_link(), "previous": self.get_previous_link(), "results": data})
        response["Warning"] = self.DEPRECATION
        return response

    def get_paginated_response_schema(self, schema):
        link = {"type": "string", "nullable": True, "format": "uri", "deprecated": True}
        return {"type": "object", "required": ["metadata", "items"], "properties": {
            "metadata": LIST_METADATA_SCHEMA, "items": schema,
            "results": dict(schema, deprecated=True, description="deprecated alias of items"),
            "next": dict(link, description="deprecated: use metadata.continue"),
            "previous": dict(link, description="deprecated")}}


LIST_METADATA_SCHEMA = {"type": "object", "properties": {"resourceVersion": {"type": "string"},
                                                         "continue": {"type": "string"}}}


class KubeListPagination(ListPagination):
    """For the Kubernetes-shaped lists: the schema of what those views answer (``kind``, ``metadata``, ``items``)."""

    def get_paginated_response_schema(self, schema):
        return {"type": "object", "required": ["apiVersion", "kind", "metadata", "items"], "properties": {
            "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": LIST_METADATA_SCHEMA,
            "items": schema}}
