"""SQL fragments that differ between PostgreSQL (production, tests) and SQLite (the embedded default).

Used by inventory queries that must not load every device into Python (selector match counts) and by the
dashboard's fleet aggregates. Only constant paths chosen here are interpolated; every value is a parameter.
"""
from __future__ import annotations

import re

from django.db import connection, transaction

_SAFE_KEY = re.compile(r"^[A-Za-z0-9_.\-/]+$")


def is_postgres() -> bool:
    return connection.vendor == "postgresql"


def json_text(column: str, *path: str | int) -> str:
    """SQL for the text at ``path`` inside a JSON column (NULL when absent)."""
    for part in path:
        if isinstance(part, str) and not _SAFE_KEY.match(part):
            raise ValueError(f"unsafe JSON key {part!r}")
    if is_postgres():
        steps = [str(p) if isinstance(p, int) else f"'{p}'" for p in path]
        return f"({column} -> " + " -> ".join(steps[:-1]) + f" ->> {steps[-1]})" if len(steps) > 1 \
            else f"({column} ->> {steps[0]})"
    jpath = "$" + "".join(f"[{p}]" if isinstance(p, int) else f'."{p}"' for p in path)
    return f"json_extract({column}, '{jpath}')"


def json_array_nonempty(column: str) -> str:
    """A JSON list column that holds something. The inventory writes these columns as lists (empty by
    default), so comparing with the empty list is enough, and costs far less per row than inspecting the
    JSON (this runs once per device on whole-fleet aggregates)."""
    if is_postgres():
        return f"({column} IS NOT NULL AND {column} <> '[]'::jsonb)"
    return f"({column} IS NOT NULL AND {column} <> '[]')"


def product_expr(alias: str = "d") -> str:
    """A device's product: ``productName`` (NVIDIA, AMD) or ``model`` (Intel, the example driver)."""
    return (f"COALESCE({json_text(alias + '.attributes', 'productName', 'string')}, "
            f"{json_text(alias + '.attributes', 'model', 'string')}, '')")


def fetch_dicts(sql: str, params: list | tuple = (), *, analytic: bool = False) -> list[dict]:
    """Run a query, rows as dicts. ``analytic`` marks a whole-fleet aggregate (tens of thousands of rows in,
    a few out): on PostgreSQL it then runs with hash joins and hash aggregates only, with room to hash in
    memory. A nested loop is never the right plan for these, but the planner picks one when statistics are
    missing or stale (a fleet pushed a minute ago, or a server with autovacuum off), and that turns 100 ms
    into minutes; for the same reason it sorts 40,000 wide rows to group them where hashing is cheaper. JIT goes off
    too: switching nested loops off inflates plan costs past the JIT thresholds, and compiling the plan with
    LLVM would then take seconds for a query that runs in a tenth of one."""
    columns, rows = fetch_rows(sql, params, analytic=analytic)
    return [dict(zip(columns, row, strict=False)) for row in rows]


def fetch_rows(sql: str, params: list | tuple = (), *, analytic: bool = False) -> tuple[list[str], list[tuple]]:
    """``fetch_dicts`` as column names and plain rows: for tens of thousands of rows read in a loop, where
    building a dict per row would cost more than the query."""
    with transaction.atomic(), connection.cursor() as cursor:
        if analytic and is_postgres():
            cursor.execute("SET LOCAL enable_nestloop = off")
            cursor.execute("SET LOCAL jit = off")
            cursor.execute("SET LOCAL enable_sort = off")  # still sorts where ORDER BY needs it
            cursor.execute("SET LOCAL work_mem = '64MB'")
        cursor.execute(sql, params)
        return [c[0] for c in cursor.description], cursor.fetchall()
