"""Low-level bulk writes on PostgreSQL, shared by the inventory and claims apps.

Why here, in ``draservice``: both apps write thousands of rows at a time (a cluster's push, a worker's round),
and the inventory app must not import the claims app, so the plumbing lives below both. It is mechanism only:
statements bound on the server, COPY, telling Django that rows exist. Which rows to write stays with each app:
``inventory.services.sync`` COPYs slices and devices, ``claims.services.bulk`` builds its
``UPDATE/INSERT ... unnest`` statements on ``pg_execute``.
"""
from __future__ import annotations

from collections.abc import Iterable

import orjson
import psycopg
from django.db import connection, models
from django.utils import timezone


def pg_execute(sql: str, params: list | dict) -> psycopg.Cursor:
    """Run on Django's connection (inside its transaction) with server-side binding; the caller closes the
    cursor.

    The statements use ``%b`` placeholders: binary parameters, so arrays go over the wire as they are, with
    no text escaping of every element. Their text does not change with the number of rows (arrays, not lists
    of placeholders), so psycopg prepares each on the connection once it has run a few times
    (``DB_PREPARED_STATEMENTS``, settings): PostgreSQL no longer parses and plans the release's and the
    submission's many CTEs at every run. Django's own cursors bind on the client and are never prepared.
    """
    connection.ensure_connection()
    cursor = psycopg.Cursor(connection.connection)
    with connection.wrap_database_errors:  # psycopg errors as django.db ones (IntegrityError, ...)
        cursor.execute(sql, params)
    return cursor


def copy_rows(model: type[models.Model], columns: list[str], rows: Iterable[dict], json_columns: set[str]) -> None:
    """PostgreSQL COPY ... FROM STDIN: the fastest way in, one round trip per buffer, not per row.

    ``rows`` are dicts by column name; ``json_columns`` are encoded here (orjson)."""
    dumps = orjson.dumps

    def encode(value):
        # Most JSON columns of most devices are empty: skip the encoder for those.
        if value is None:
            return None
        if not value:
            return "[]" if type(value) is list else "{}"
        return dumps(value).decode()

    with (connection.cursor() as cursor,
          cursor.cursor.copy(f"COPY {model._meta.db_table} ({', '.join(columns)}) FROM STDIN") as copy):
        for row in rows:
            copy.write_row([encode(row[c]) if c in json_columns else row[c] for c in columns])


def bulk_insert(model: type[models.Model], columns: list[str], objs: list, json_columns: set[str]) -> None:
    """Insert unsaved model instances without reading ids back: COPY on PostgreSQL, bulk_create elsewhere.
    (Django's bulk_create on PostgreSQL adapts JSON through arrays, which is slow for thousands of rows.)
    ``updated_at``, when it is one of ``columns``, is set to now, as ``auto_now`` would."""
    if not objs:
        return
    if connection.vendor != "postgresql":
        model._default_manager.bulk_create(objs, batch_size=2000)
        return
    if "updated_at" in columns:
        now = timezone.now()
        for obj in objs:
            obj.updated_at = now
    copy_rows(model, columns, ({c: getattr(obj, c) for c in columns} for obj in objs), json_columns)


def mark_saved(objs: Iterable[models.Model], alias: str | None = None) -> None:
    """Tell Django that instances inserted by a statement of ours are rows now, as ``bulk_create`` does for
    the ones it inserts: a later ``save()`` updates them instead of inserting again."""
    for obj in objs:
        obj._state.adding = False
        obj._state.db = alias or connection.alias
