"""Inserts and deletes of allocation rows land in the change log too: a worker keeps its devices in use
current from it (``claims.services.fleet``) instead of reading the whole table every round."""

from django.db import migrations

from draservice import changelog_sql


def install(apps, schema_editor):
    changelog_sql.install_rows(schema_editor, "claims_deviceallocation", "deviceallocations")


def uninstall(apps, schema_editor):
    changelog_sql.uninstall_rows(schema_editor, "claims_deviceallocation")


class Migration(migrations.Migration):

    dependencies = [
        ('claims', '0007_allocation_round'),
        ('draservice', '0001_change_log'),
    ]

    operations = [
        migrations.RunPython(install, uninstall),
    ]
