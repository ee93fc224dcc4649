"""GIN indexes for attribute and label filters, on PostgreSQL only.

SQLite (the embedded default) has no GIN; there the filters fall back to JSON key lookups without an index.
"""
from django.db import migrations

INDEXES = [
    ("inventory_device_attr_gin", "inventory_device", "attribute_index jsonb_path_ops"),
    ("inventory_node_labels_gin", "inventory_node", "labels jsonb_path_ops"),
]


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for name, table, column in INDEXES:
        schema_editor.execute(f"CREATE INDEX IF NOT EXISTS {name} ON {table} USING gin ({column})")


def drop(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for name, _, _ in INDEXES:
        schema_editor.execute(f"DROP INDEX IF EXISTS {name}")


class Migration(migrations.Migration):
    dependencies = [("inventory", "0001_initial")]
    operations = [migrations.RunPython(create, drop)]
