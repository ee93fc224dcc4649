from rest_framework import pagination


class CursorPagination(pagination.CursorPagination):
    """Cursor pagination: stable under concurrent inserts, cheap on big tables."""

    page_size = 100
    page_size_query_param = "limit"
    max_page_size = 5000
    ordering = "id"
