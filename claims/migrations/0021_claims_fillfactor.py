"""Room on each page of the claims table for HOT updates (PostgreSQL only).

A claim is taken by a round (``taken_until``, ``taken_by``: no index covers them) moments after its insert. On
full pages that update had to go to another page and add an entry to each of the table's indexes; with a fifth
of each page kept free it stays on the page (a heap-only tuple) and touches no index.
"""
from django.db import migrations

FILLFACTOR = 80


def _set(fillfactor: int):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(f"ALTER TABLE claims_resourceclaim SET (fillfactor = {fillfactor})")
    return run


class Migration(migrations.Migration):

    dependencies = [
        ("claims", "0020_fk_index_covered"),
    ]

    operations = [migrations.RunPython(_set(FILLFACTOR), _set(100))]
