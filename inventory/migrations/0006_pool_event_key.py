from django.db import migrations, models


class Migration(migrations.Migration):
    """Pool warnings raised by the allocation round (a selector failing on a pool's devices) are stored once per
    push: a key, unique per cluster where set."""

    dependencies = [("inventory", "0005_device_name_index")]

    operations = [
        migrations.AddField(model_name="poolevent", name="key",
                            field=models.CharField(blank=True, max_length=64, null=True)),
        migrations.AddConstraint(
            model_name="poolevent",
            constraint=models.UniqueConstraint(condition=models.Q(key__isnull=False), fields=("cluster", "key"),
                                               name="inventory_poolevent_key")),
    ]
