"""Releases count what they freed in insert-only ``FreedCount`` rows, not by updating ``WakeKey`` and
``FleetState`` rows (every release waited for the one before it to commit). ``WakeKey.version`` goes: whether a
release overtook a decision is told by the counters themselves (``claims.services.wake``)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("claims", "0017_walltime"),
    ]

    operations = [
        migrations.CreateModel(
            name="FreedCount",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("key", models.CharField(max_length=100)),
                ("freed", models.IntegerField()),
            ],
            options={"indexes": [models.Index(fields=["key"], name="claims_freedcount_key")]},
        ),
        migrations.RemoveField(model_name="wakekey", name="version"),
    ]
