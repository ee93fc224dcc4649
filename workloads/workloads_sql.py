"""The workloads app's statements that differ between PostgreSQL and SQLite, one function each: its services
never ask which database runs."""
from __future__ import annotations

from django.db import connection


def lock_until_commit(key: int) -> None:
    """A transaction-scoped advisory lock on ``key`` (a signed 64-bit integer). Nothing on SQLite, the embedded
    default, which serializes every write transaction already."""
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [key])
