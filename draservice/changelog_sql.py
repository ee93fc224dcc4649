"""The database side of the change log (``draservice.models.Change``): trigger DDL for PostgreSQL and SQLite.

Migrations call ``install(schema_editor, table, resource)`` for each watched table; the table needs a
nullable ``change_seq`` bigint column, which the trigger keeps equal to the seq of the row's last change (it
is the object's ``metadata.resourceVersion`` at the Kubernetes front door).

PostgreSQL: one plpgsql function for every table. It takes the transaction id BEFORE the sequence value, so
that any transaction holding a seq already has an id below the horizon a reader records (see
``draservice.changes``: that is how a reader tells an in-flight seq from one lost to a rollback, without
serializing writers). An UPDATE that leaves ``resource_version`` alone (bookkeeping such as ``taken_until``)
is not a change and keeps ``change_seq`` as it was, even when the writer saved a stale copy.

SQLite (the embedded demo): one writer at a time, so the change table's own rowid is already commit-ordered.
"""
from __future__ import annotations

PG_FUNCTION = r"""
CREATE OR REPLACE FUNCTION draservice_record_change() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  tx bigint;
  s bigint;
  rec record;
  ns text := '';
BEGIN
  IF TG_OP = 'UPDATE' AND OLD.resource_version IS NOT DISTINCT FROM NEW.resource_version THEN
    NEW.change_seq := OLD.change_seq;
    RETURN NEW;
  END IF;
  tx := pg_current_xact_id()::text::bigint;
  s := nextval(pg_get_serial_sequence('draservice_change', 'seq'));
  IF TG_OP = 'DELETE' THEN rec := OLD; ELSE rec := NEW; END IF;
  IF TG_ARGV[1] = 'namespaced' THEN
    SELECT name INTO ns FROM claims_namespace WHERE id = rec.namespace_id;
  END IF;
  INSERT INTO draservice_change (seq, txid, resource, namespace, name, uid, row_id, type, tombstone, at)
  VALUES (s, tx, TG_ARGV[0], coalesce(ns, ''), rec.name, rec.uid::text, rec.id,
          CASE TG_OP WHEN 'INSERT' THEN 'ADDED' WHEN 'UPDATE' THEN 'MODIFIED' ELSE 'DELETED' END,
          CASE WHEN TG_OP = 'DELETE' THEN to_jsonb(OLD) END, clock_timestamp());
  IF TG_OP = 'DELETE' THEN
    RETURN OLD;
  END IF;
  NEW.change_seq := s;
  RETURN NEW;
END $$;
"""

# The columns a SQLite tombstone keeps (enough to render the deleted object).
SQLITE_TOMBSTONE = ("id", "name", "uid", "resource_version", "change_seq", "created_at")
SQLITE_JSON_TOMBSTONE = ("labels", "annotations", "spec")


def install(schema_editor, table: str, resource: str, *, namespaced: bool = True) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_FUNCTION)
        args = f"'{resource}', '{'namespaced' if namespaced else 'cluster'}'"
        schema_editor.execute(f"CREATE TRIGGER {table}_change BEFORE INSERT OR UPDATE OR DELETE ON {table} "
                              f"FOR EACH ROW EXECUTE FUNCTION draservice_record_change({args})")
    elif schema_editor.connection.vendor == "sqlite":
        for statement in _sqlite_triggers(table, resource, namespaced):
            schema_editor.execute(statement)


def uninstall(schema_editor, table: str) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_change ON {table}")
    elif schema_editor.connection.vendor == "sqlite":
        for suffix in ("ins", "upd", "del"):
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_change_{suffix}")


def _sqlite_triggers(table: str, resource: str, namespaced: bool) -> list[str]:
    def values(row: str, kind: str, tombstone: str) -> str:
        ns = (f"coalesce((SELECT name FROM claims_namespace WHERE id = {row}.namespace_id), '')"
              if namespaced else "''")
        return (f"INSERT INTO draservice_change (txid, resource, namespace, name, uid, row_id, type, tombstone, at) "
                f"VALUES (0, '{resource}', {ns}, {row}.name, {row}.uid, {row}.id, '{kind}', {tombstone}, "
                f"strftime('%Y-%m-%d %H:%M:%f', 'now'));")

    pairs = [f"'{c}', OLD.{c}" for c in SQLITE_TOMBSTONE] + [f"'{c}', json(OLD.{c})" for c in SQLITE_JSON_TOMBSTONE]
    tombstone = f"json_object({', '.join(pairs)})"
    stamp = f"UPDATE {table} SET change_seq = last_insert_rowid() WHERE id = NEW.id;"
    return [
        f"CREATE TRIGGER {table}_change_ins AFTER INSERT ON {table} BEGIN {values('NEW', 'ADDED', 'NULL')} "
        f"{stamp} END",
        f"CREATE TRIGGER {table}_change_upd AFTER UPDATE ON {table} "
        f"WHEN OLD.resource_version IS NOT NEW.resource_version BEGIN {values('NEW', 'MODIFIED', 'NULL')} "
        f"{stamp} END",
        f"CREATE TRIGGER {table}_change_del AFTER DELETE ON {table} BEGIN "
        f"{values('OLD', 'DELETED', tombstone)} END",
    ]


# Rows that are only inserted and deleted, never updated, and have no name of their own (DeviceAllocation):
# a lean entry (resource, row id, ADDED or DELETED) is all a follower needs, and it reads the row itself.
# PostgreSQL: statement-level triggers over the statement's transition table, so a round's bulk insert of
# hundreds of rows runs one INSERT ... SELECT instead of one plpgsql call per row. The transaction id is
# taken before the seqs (the gap rule); it was assigned by the statement's own write anyway.
PG_ROWS_FUNCTION = r"""
CREATE OR REPLACE FUNCTION draservice_record_row_changes() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  tx bigint := pg_current_xact_id()::text::bigint;
BEGIN
  INSERT INTO draservice_change (seq, txid, resource, namespace, name, uid, row_id, type, at)
  SELECT nextval(pg_get_serial_sequence('draservice_change', 'seq')), tx, TG_ARGV[0], '', '', '', id,
         CASE TG_OP WHEN 'INSERT' THEN 'ADDED' ELSE 'DELETED' END, clock_timestamp()
  FROM changed_rows;
  RETURN NULL;
END $$;
"""


def install_rows(schema_editor, table: str, resource: str) -> None:
    """Log inserts and deletes of ``table`` (which has no ``change_seq``: its rows never change)."""
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_ROWS_FUNCTION)
        for suffix, event, transition in (("ins", "INSERT", "NEW"), ("del", "DELETE", "OLD")):
            schema_editor.execute(f"CREATE TRIGGER {table}_change_{suffix} AFTER {event} ON {table} "
                                  f"REFERENCING {transition} TABLE AS changed_rows FOR EACH STATEMENT "
                                  f"EXECUTE FUNCTION draservice_record_row_changes('{resource}')")
    elif schema_editor.connection.vendor == "sqlite":
        for suffix, event, row, kind in (("ins", "INSERT", "NEW", "ADDED"), ("del", "DELETE", "OLD", "DELETED")):
            schema_editor.execute(
                f"CREATE TRIGGER {table}_change_{suffix} AFTER {event} ON {table} BEGIN "
                f"INSERT INTO draservice_change (txid, resource, namespace, name, uid, row_id, type, tombstone, at) "
                f"VALUES (0, '{resource}', '', '', '', {row}.id, '{kind}', NULL, "
                f"strftime('%Y-%m-%d %H:%M:%f', 'now')); END")


def uninstall_rows(schema_editor, table: str) -> None:
    for suffix in ("ins", "del"):
        on = f" ON {table}" if schema_editor.connection.vendor == "postgresql" else ""
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_change_{suffix}{on}")
