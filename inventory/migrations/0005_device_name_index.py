from django.db import migrations, models


class Migration(migrations.Migration):
    """The dashboard's global search looks devices up by name alone (``inventory_device_key`` starts with the
    cluster, so it cannot serve that)."""

    dependencies = [("inventory", "0004_pool_events")]

    operations = [
        migrations.AddIndex(model_name="device", index=models.Index(fields=["name"], name="inventory_device_name")),
    ]
