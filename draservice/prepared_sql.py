"""The cursor ``draservice.prepared`` runs its compiled querysets on.

On PostgreSQL (``DB_PREPARED_STATEMENTS`` on) it binds on the server, so psycopg prepares each compiled
queryset on the connection once it has run a few times: its SQL never changes (the queryset is compiled once,
only the values move), which is what makes it preparable where Django's querysets in general are not (Django
ticket 20516). The lookups behind it run on every release, read and round -- PostgreSQL parsed and planned
each of them every time. Wrapped as Django wraps its own cursors, so query logging and counting (tests,
``CaptureQueriesContext``) still see them. Elsewhere: Django's own cursor.
"""
from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.postgresql.base import ServerBindingCursor
from django.db.backends.utils import CursorDebugWrapper


class _LoggedCursor(CursorDebugWrapper):
    """Django's debug wrapper, logging the statement as sent (its values travel apart, bound on the server):
    Django reads the text back from psycopg, which keeps none for a run of a prepared statement."""

    def execute(self, sql, params=None):
        with self.debug_sql(sql, params, use_last_executed_query=False):
            return super(CursorDebugWrapper, self).execute(sql, params)


def cursor(connection: BaseDatabaseWrapper):
    if connection.vendor != "postgresql" or not settings.DB_PREPARED_STATEMENTS:
        return connection.cursor()
    connection.ensure_connection()
    connection.validate_thread_sharing()
    raw: Any = ServerBindingCursor(connection.connection)  # type: ignore[call-arg]  # psycopg's Cursor(connection)
    # Wrapped as connection.cursor() wraps its own (a debug wrapper while queries are logged).
    return _LoggedCursor(raw, connection) if connection.queries_logged else connection.make_cursor(raw)
