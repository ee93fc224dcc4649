from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("usage", "0002_backfill_open_intervals")]

    operations = [
        migrations.CreateModel(
            name="DecayedUsage",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("queue", models.CharField(max_length=253, unique=True)),
                ("half_life_seconds", models.FloatField()),
                ("value", models.FloatField(default=0.0)),
                ("at", models.DateTimeField()),
            ],
            options={"ordering": ["id"]},
        ),
    ]
