"""The ``default`` queue always exists: nominal 0 for every class, unlimited borrowing, under the root."""
from django.db import migrations

SPEC = {"namespaces": [], "quotas": [], "weight": 1, "priority": 0, "maxPriority": 0,
        "preemption": {"withinQueue": "LowerPriority", "reclaimBorrowed": "Always", "minRuntimeSeconds": 0,
                       "graceSeconds": 30}}


def create_default(apps, schema_editor):
    Queue = apps.get_model("queues", "Queue")
    Queue.objects.get_or_create(name="default", defaults={"spec": SPEC})


class Migration(migrations.Migration):
    dependencies = [("queues", "0001_initial")]
    operations = [migrations.RunPython(create_default, migrations.RunPython.noop)]
