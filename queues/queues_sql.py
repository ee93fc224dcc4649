"""The queues app's statements that differ between PostgreSQL and SQLite, one function each: its services
never ask which database runs."""
from __future__ import annotations

from django.db import connection

from queues.models import Preemption, PreemptionState, Queue, QuotaCharge


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


def delete_charges(claim_ids: list[int]) -> None:
    """Delete the quota charges of these claims. On PostgreSQL one array parameter: a round's hundreds of ids
    compiled into a placeholder each and bound in Python cost more than the delete, which mostly finds none."""
    if connection.vendor != "postgresql":
        QuotaCharge.objects.filter(claim_id__in=claim_ids).delete()
        return
    table = connection.ops.quote_name(QuotaCharge._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {table} WHERE claim_id = ANY(%s)", [claim_ids])


def uncharge_cte() -> str:
    """PostgreSQL: ``delete_charges`` of the claims ``%(ids)s`` as a data-modifying WITH query (``uncharged``) of
    the statement that frees their devices."""
    table = connection.ops.quote_name(QuotaCharge._meta.db_table)
    return f"uncharged AS (DELETE FROM {table} WHERE claim_id = ANY(%(ids)s))"


def any_pending_preemption(preemptor_ids: list[int]) -> bool:
    """Whether a running notice names one of these preemptors (True on SQLite: the caller then reads them). On
    PostgreSQL one array parameter, as ``delete_charges``: every claims round asks it for the claims it allocated,
    and the answer is almost always no."""
    if connection.vendor != "postgresql":
        return True
    table = connection.ops.quote_name(Preemption._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {table} WHERE state = %s AND preemptor_id = ANY(%s))",
                       [PreemptionState.PENDING.value, preemptor_ids])
        return bool(cursor.fetchone()[0])
