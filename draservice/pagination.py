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

from django.core.exceptions import FieldDoesNotExist
from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import pagination, status
from rest_framework.exceptions import NotFound

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
