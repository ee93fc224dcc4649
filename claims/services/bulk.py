"""Fast bulk UPDATE and INSERT of many rows, for the worker's write step (hundreds of rows per round).

Django's ``bulk_update`` builds one ``CASE WHEN id = … THEN …`` per field, and both it and ``bulk_create``
send their parameters through psycopg's client-side binding, which quotes every value into the SQL text
in Python: for a 500-claim round with JSON columns that costs most of a second. On PostgreSQL these
helpers send ONE statement per table with one array parameter per column (``unnest``), bound on the
server, so nothing is quoted in Python. Elsewhere (SQLite, the embedded default) they fall back to
``executemany`` / ``bulk_create``. The statements run through ``draservice.bulk.pg_execute``.
"""
from __future__ import annotations

import json
from collections.abc import Container
from datetime import datetime

import orjson
from django.db import connection, models
from django.utils import timezone

from draservice.bulk import pg_execute

# PostgreSQL array types by field class (first match wins); JSON travels as text and is cast back.
_PG_TYPES = [
    (models.JSONField, "text[]", "jsonb"),
    (models.DateTimeField, "timestamptz[]", None),
    (models.UUIDField, "uuid[]", None),
    (models.BigIntegerField, "bigint[]", None),
    (models.BigAutoField, "bigint[]", None),
    (models.ForeignKey, "bigint[]", None),
    (models.IntegerField, "integer[]", None),
    (models.BooleanField, "boolean[]", None),
    (models.CharField, "text[]", None),
    (models.TextField, "text[]", None),
]


def _pg_type(field) -> tuple[str, str | None]:
    for cls, array, cast in _PG_TYPES:
        if isinstance(field, cls):
            return array, cast
    raise TypeError(f"claims.services.bulk: no PostgreSQL array type for {field!r}")


def _encoder(field):
    """What ``_column_values`` does to one non-null value of ``field`` (None: nothing)."""
    if isinstance(field, models.JSONField):
        encoder = field.encoder
        return _dumps if encoder is None else (lambda v: json.dumps(v, cls=encoder))
    if isinstance(field, (models.CharField, models.TextField)) and not isinstance(field, models.UUIDField):
        return str
    return None


def _column_values(field, objs) -> list:
    values = [getattr(obj, field.attname) for obj in objs]
    if isinstance(field, models.JSONField):
        if field.encoder is None:  # orjson: a round's conditions, allocations and diagnostics, cheaper than json
            return [None if v is None else _dumps(v) for v in values]
        return [None if v is None else json.dumps(v, cls=field.encoder) for v in values]
    if isinstance(field, (models.CharField, models.TextField)) and not isinstance(field, models.UUIDField):
        return [None if v is None else str(v) for v in values]  # TextChoices members -> plain str
    return values


def _dumps(value) -> str:
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    except (orjson.JSONEncodeError, TypeError):  # what only the standard library writes (an int over 64 bits)
        return json.dumps(value)


def update_rows(objs: list, fields: list[str]) -> None:
    """``UPDATE`` each object's row with its own values of ``fields``."""
    if not objs:
        return
    model = type(objs[0])
    model_fields = [model._meta.get_field(name) for name in fields]
    qn = connection.ops.quote_name
    table, pk = qn(model._meta.db_table), qn(model._meta.pk.column)
    if connection.vendor == "postgresql":
        pg_execute(*_update_sql(objs, fields)).close()
        return
    sql = f"UPDATE {table} SET " + ", ".join(f"{qn(f.column)} = %s" for f in model_fields) + f" WHERE {pk} = %s"
    rows = [[f.get_db_prep_save(getattr(obj, f.attname), connection) for f in model_fields] + [obj.pk]
            for obj in objs]
    with connection.cursor() as cursor:
        cursor.executemany(sql, rows)


def _update_sql(objs: list, fields: list[str]) -> tuple[str, list]:
    """PostgreSQL: the statement and parameters of ``update_rows``. One row (a release from the API): scalar
    parameters, as ``insert_select`` binds one row. psycopg looks every list parameter over to choose its
    array type, per execution: a release's ten one-element arrays cost it more than its statement's text."""
    single = len(objs) == 1
    sql, model_fields = _update_plan(type(objs[0]), tuple(fields), single)
    if single:
        obj = objs[0]
        return sql, [*(_column_values(f, objs)[0] for f in model_fields), obj.pk]
    return sql, [[obj.pk for obj in objs], *(_column_values(f, objs) for f in model_fields)]


_update_plans: dict[tuple, tuple[str, list]] = {}


def _update_plan(model, fields: tuple[str, ...], single: bool) -> tuple[str, list]:
    """(statement, fields) of ``update_rows`` on ``model``'s ``fields``, of one row or of several: the same
    text for every release (built per call before it was kept here)."""
    plan = _update_plans.get((model, fields, single))
    if plan is None:
        qn = connection.ops.quote_name
        table, pk = qn(model._meta.db_table), qn(model._meta.pk.column)
        model_fields = [model._meta.get_field(name) for name in fields]
        sets, selects = [], []
        for i, f in enumerate(model_fields):
            array, cast = _pg_type(f)
            if single:
                sets.append(f"{qn(f.column)} = %b::{array[:-2]}" + (f"::{cast}" if cast else ""))
            else:
                selects.append(f"unnest(%b::{array}) AS c{i}")
                sets.append(f"{qn(f.column)} = v.c{i}" + (f"::{cast}" if cast else ""))
        if single:  # the key last: the parameters follow the text's order
            sql = f"UPDATE {table} AS t SET {', '.join(sets)} WHERE t.{pk} = %b::bigint"
        else:
            sql = (f"UPDATE {table} AS t SET {', '.join(sets)} FROM (SELECT unnest(%b::bigint[]) AS id, "
                   f"{', '.join(selects)}) AS v WHERE t.{pk} = v.id")
        plan = _update_plans[(model, fields, single)] = (sql, model_fields)
    return plan


def update_and_insert(objs: list, fields: list[str], new: list) -> None:
    """``update_rows(objs, fields)`` and ``insert_rows(new)``; on PostgreSQL in one statement (the update as
    a data-modifying WITH query, the tables distinct): a release writes its claim and its event so, one
    round trip and one statement's driver CPU fewer on every release."""
    if connection.vendor != "postgresql" or not objs or not new:
        update_rows(objs, fields)
        insert_rows(new)
        return
    set_auto_times(new)
    update_sql, update_params = _update_sql(objs, fields)
    insert_sql, insert_params = _insert_sql(new)
    pg_execute(f"WITH updated AS ({update_sql}) {insert_sql}", update_params + insert_params).close()


def update_and_insert_ctes(objs: list, fields: list[str], new: list) -> tuple[str, dict]:
    """PostgreSQL: ``update_and_insert`` as two data-modifying WITH queries (``updated``, ``inserted``) for a
    caller's statement of named parameters (``pg_execute`` with a dict): (the CTEs' text, their parameters
    ``bulk_<n>``). A release so writes its claim, its event and frees its devices in one statement."""
    set_auto_times(new)
    update_sql, update_params = _update_sql(objs, fields)
    insert_sql, insert_params = _insert_sql(new)
    key = (update_sql, insert_sql)
    text = _named_ctes.get(key)
    if text is None:
        parts = f"updated AS ({update_sql}), inserted AS ({insert_sql})".split("%b")
        text = _named_ctes[key] = "".join(part + (f"%(bulk_{i})b" if i < len(parts) - 1 else "")
                                          for i, part in enumerate(parts))
    return text, {f"bulk_{i}": value for i, value in enumerate(update_params + insert_params)}


_named_ctes: dict[tuple[str, str], str] = {}  # (update, insert) statement -> the CTEs with named parameters


def set_auto_times(objs: list, now=None) -> None:
    """Fill ``auto_now_add`` / ``auto_now`` fields that are not set yet (what ``save()`` would do)."""
    if not objs:
        return
    now = now or timezone.now()
    for f in type(objs[0])._meta.concrete_fields:
        if getattr(f, "auto_now_add", False) or getattr(f, "auto_now", False):
            for obj in objs:
                if not isinstance(getattr(obj, f.attname), datetime):
                    setattr(obj, f.attname, now)


def insert_select(objs: list, replace: dict[str, str] | None = None) -> tuple[list[str], list[str], list]:
    """PostgreSQL: the (quoted columns, select expressions, parameters) that insert ``objs`` (every concrete
    field but the auto primary key) with ``INSERT INTO t (columns) SELECT expressions``.

    One row: plain scalar parameters (no array to build and unnest); several: one array per column.
    ``replace``: attname -> SQL expression used instead of a parameter (e.g. a value from a CTE).
    The columns and expressions are the same for any one-row insert and for any insert of several rows:
    a caller that keeps its statement asks ``insert_params`` for the parameters alone.
    """
    replace = replace or {}
    columns, selects = [], []
    single = len(objs) == 1
    for f, column, scalar_sql, array_sql, _ in _insert_plan(type(objs[0])):
        columns.append(column)
        selects.append(replace.get(f.attname, scalar_sql if single else array_sql))
    return columns, selects, insert_params(objs, replace)


def insert_params(objs: list, replaced: Container[str] = ()) -> list:
    """The parameters of ``insert_select(objs, replace)``, ``replaced``: its keys."""
    params = []
    single = objs[0] if len(objs) == 1 else None
    for f, _, _, _, encode in _insert_plan(type(objs[0])):
        if f.attname in replaced:
            continue
        if single is not None:  # every claim POST: the field's encoder, no per-field type tests
            value = getattr(single, f.attname)
            params.append(value if encode is None or value is None else encode(value))
        else:
            params.append(_column_values(f, objs))
    return params


_insert_plans: dict[type, list[tuple]] = {}


def _insert_plan(model) -> list[tuple]:
    """(field, quoted column, one-row expression, many-rows expression, encoder of one non-null value or None)
    per inserted field of ``model``: the same for every insert, and worked out per field on every claim POST
    before it was kept here. The encoders are ``_column_values``'s."""
    plan = _insert_plans.get(model)
    if plan is None:
        qn = connection.ops.quote_name
        plan = []
        for f in model._meta.concrete_fields:
            if f.primary_key:
                continue
            array, cast = _pg_type(f)
            suffix = f"::{cast}" if cast else ""
            plan.append((f, qn(f.column), f"%b::{array[:-2]}{suffix}", f"unnest(%b::{array}){suffix}",
                         _encoder(f)))
        _insert_plans[model] = plan
    return plan


def _insert_sql(objs: list) -> tuple[str, list]:
    """PostgreSQL: ``INSERT INTO t (columns) SELECT expressions`` of ``objs`` and its parameters."""
    columns, selects, params = insert_select(objs)
    table = connection.ops.quote_name(type(objs[0])._meta.db_table)
    return f"INSERT INTO {table} ({', '.join(columns)}) SELECT {', '.join(selects)}", params


def insert_rows(objs: list, returning: tuple[str, ...] = (), skip_conflicts: bool = False) -> list[tuple]:
    """Insert unsaved objects (every concrete field but the auto primary key); ``auto_now_add`` fields are
    set here. Returns the ``returning`` columns of the inserted rows (PostgreSQL: in no promised order, so
    ask for whatever identifies a row); elsewhere objects get their pks and the tuples are read from them.

    ``skip_conflicts`` (PostgreSQL only): rows that would violate a unique constraint are left out instead
    of failing the transaction; compare what came back with what was sent.
    """
    if not objs:
        return []
    model = type(objs[0])
    set_auto_times(objs)
    if connection.vendor != "postgresql":
        if skip_conflicts:
            raise NotImplementedError("skip_conflicts is for PostgreSQL")
        model.objects.bulk_create(objs, batch_size=500)
        return [tuple(getattr(obj, name) for name in returning) for obj in objs] if returning else []
    qn = connection.ops.quote_name
    sql, params = _insert_sql(objs)
    if skip_conflicts:
        sql += " ON CONFLICT DO NOTHING"
    if returning:
        sql += " RETURNING " + ", ".join(qn(model._meta.get_field(n).column) for n in returning)
    cursor = pg_execute(sql, params)
    try:
        return cursor.fetchall() if returning else []
    finally:
        cursor.close()
