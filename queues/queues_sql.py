"""The queues app's statements that differ between PostgreSQL and SQLite, one function each: its services
never ask which database runs."""
from __future__ import annotations

from django.db import connection

from queues.models import Queue


def lock_until_commit(key: int) -> None:
    """A transaction-scoped advisory lock on ``key``. Nothing on SQLite, which serializes every writer."""
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [key])


def all_queues() -> list[Queue]:
    """Every queue row, by id. On PostgreSQL the rows are made into models directly, without a queryset
    (compiling a queryset costs more than running this one: every claims round loads the tree)."""
    if connection.vendor != "postgresql":
        return list(Queue.objects.order_by("id"))
    fields = Queue._meta.concrete_fields
    qn = connection.ops.quote_name
    with connection.cursor() as cursor:
        # django-stubs types Field.column as optional for every field; a concrete field always has one.
        cursor.execute(f"SELECT {', '.join(qn(f.column) for f in fields)} FROM {qn(Queue._meta.db_table)} "  # type: ignore[arg-type]
                       f"ORDER BY {qn('id')}")
        rows = cursor.fetchall()
    names = [f.attname for f in fields]
    converters = [(i, f.from_db_value) for i, f in enumerate(fields) if hasattr(f, "from_db_value")]
    out = []
    for row in rows:
        values = list(row)
        for i, convert in converters:  # the JSON columns come back as text
            values[i] = convert(values[i], None, connection)
        out.append(Queue.from_db(connection.alias, names, values))
    return out
