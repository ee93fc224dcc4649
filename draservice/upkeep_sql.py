"""Planner statistics and dead rows of the service's own tables, where PostgreSQL's autovacuum is off.

Every allocation round reads the change log past its last seq, and the claims, allocation and quota tables turn
over thousands of rows a minute. Without statistics PostgreSQL plans those reads blind: with none on the change
log it guessed a third of the table for ``seq > n`` and scanned all of it (20 ms a read, several reads a round,
at 170,000 changes), where the index answers in well under a millisecond. Dead rows left unvacuumed make every
scan longer still. Autovacuum keeps both; some servers run without it (a CI machine's PostgreSQL, a cluster
whose operators turned it off to vacuum on their own schedule). There, this pass does what autovacuum would,
with its default thresholds, for the service's tables only: ANALYZE a table once
``ANALYZE_BASE + ANALYZE_SCALE * rows`` of its rows changed since the last, VACUUM it once as many dead rows
(or inserted rows, which keep index-only scans working) piled up.

Bounded: a table at most once per pass, at most ``MAX_TABLES`` a pass (the most overdue first); it never waits
for a lock (``lock_timeout``), and each statement has ``STATEMENT_SECONDS``. It runs on the notify queue, never
on an allocation worker: a VACUUM of a large table takes seconds that no round should wait for.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from django.db import connection, migrations

log = logging.getLogger(__name__)

# autovacuum's own defaults (autovacuum_*_threshold and *_scale_factor)
ANALYZE_BASE, ANALYZE_SCALE = 50, 0.1
VACUUM_BASE, VACUUM_SCALE = 50, 0.2
INSERT_BASE, INSERT_SCALE = 1000, 0.2
MAX_TABLES = 8
LOCK_TIMEOUT = "1s"
STATEMENT_SECONDS = 120
COST_DELAY_MS = 2  # autovacuum_vacuum_cost_delay's default


@dataclass(frozen=True)
class TableStats:
    table: str
    rows: float  # pg_class.reltuples (-1 or 0: never counted)
    changed: int  # n_mod_since_analyze
    dead: int  # n_dead_tup
    inserted: int  # n_ins_since_vacuum


@dataclass(frozen=True)
class Due:
    table: str
    analyze: bool
    vacuum: bool
    overdue: float  # how far past its threshold, as a multiple of it: the order of the pass


def due(stats: list[TableStats]) -> list[Due]:
    """The tables past autovacuum's thresholds, the most overdue first, at most ``MAX_TABLES``."""
    out = []
    for s in stats:
        rows = max(s.rows, 0.0)
        analyze_at = ANALYZE_BASE + ANALYZE_SCALE * rows
        vacuum_at = VACUUM_BASE + VACUUM_SCALE * rows
        insert_at = INSERT_BASE + INSERT_SCALE * rows
        analyze = s.changed > analyze_at
        vacuum = s.dead > vacuum_at or s.inserted > insert_at
        if analyze or vacuum:
            overdue = max(s.changed / analyze_at, s.dead / vacuum_at, s.inserted / insert_at)
            out.append(Due(s.table, analyze, vacuum, overdue))
    out.sort(key=lambda d: (-d.overdue, d.table))
    return out[:MAX_TABLES]


def autovacuum_on() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('autovacuum') = 'on'")
        return bool(cursor.fetchone()[0])


def table_stats() -> list[TableStats]:
    """The cumulative statistics of the service's tables (those of its installed models)."""
    tables = sorted(connection.introspection.django_table_names(only_existing=False))
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")  # this backend's cached view: read them afresh
        cursor.execute(
            "SELECT s.relname, c.reltuples, s.n_mod_since_analyze, s.n_dead_tup, s.n_ins_since_vacuum "
            "FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid "
            "WHERE s.schemaname = current_schema() AND s.relname = ANY(%s)", [tables])
        return [TableStats(name, float(rows), int(changed), int(dead), int(inserted))
                for name, rows, changed, dead, inserted in cursor.fetchall()]


def run(*, force: bool = False) -> list[Due]:
    """One pass (``force``: even where autovacuum is on). Returns what it did."""
    if connection.vendor != "postgresql" or connection.in_atomic_block:
        return []  # VACUUM cannot run in a transaction; SQLite keeps no such statistics
    if not force and autovacuum_on():
        return []
    work = due(table_stats())
    if not work:
        return []
    quote = connection.ops.quote_name
    done = []
    with connection.cursor() as cursor:
        cursor.execute(f"SET lock_timeout = '{LOCK_TIMEOUT}'")
        cursor.execute(f"SET statement_timeout = '{STATEMENT_SECONDS}s'")
        # Throttled as autovacuum is (its cost delay; a manual VACUUM's default is none): unthrottled, a pass
        # took a core for a second every half minute, and the allocation rounds beside it slowed by as much.
        cursor.execute(f"SET vacuum_cost_delay = '{COST_DELAY_MS}ms'")
        try:
            for item in work:
                verb = "VACUUM (ANALYZE)" if item.vacuum and item.analyze else "VACUUM" if item.vacuum else "ANALYZE"
                try:
                    cursor.execute(f"{verb} {quote(item.table)}")
                except Exception as exc:  # a lock it would have waited for, a timeout: the next pass tries again
                    log.warning("upkeep: %s %s: %s", verb, item.table, exc)
                    continue
                done.append(item)
        finally:
            cursor.execute("RESET lock_timeout")
            cursor.execute("RESET statement_timeout")
            cursor.execute("RESET vacuum_cost_delay")
    if done:
        log.info("upkeep: %s", ", ".join(f"{d.table} ({'vacuum' if d.vacuum else ''}"
                                         f"{'+' if d.vacuum and d.analyze else ''}{'analyze' if d.analyze else ''})"
                                         for d in done))
    return done


# Column statistics targets (ALTER TABLE ... ALTER COLUMN ... SET STATISTICS), set by the apps' migrations.
# ANALYZE reads a sample of 300 x the largest target of a table's columns and computes each column's statistics
# from it: for a claim's JSON documents (spec, allocation, conditions: ~1 KB a row) that meant comparing and
# sorting 30,000 of them, a second of a core for the claims table, which churns enough to be analyzed every few
# seconds at a hundred claims a second (by autovacuum or by the pass above: either way the cost is the same).
# Documents and free text are never compared by value in a WHERE: they need no statistics (target 0).
def set_statistics(table: str, targets: dict[str, int]) -> migrations.RunPython:
    """A migration operation: these columns' statistics targets (PostgreSQL only; reversed to the default)."""

    def alter(schema_editor, reverse: bool) -> None:
        if schema_editor.connection.vendor != "postgresql":
            return
        quote = schema_editor.quote_name
        clauses = ", ".join(f"ALTER COLUMN {quote(column)} SET STATISTICS {-1 if reverse else int(target)}"
                            for column, target in sorted(targets.items()))
        schema_editor.execute(f"ALTER TABLE {quote(table)} {clauses}")

    return migrations.RunPython(lambda apps, editor: alter(editor, False),
                                lambda apps, editor: alter(editor, True))
