"""``spec.preemption.reclaimBorrowed`` (Never | Always) becomes Kueue's ``reclaimWithinCohort`` (Never | Any, and
now LowerPriority), and ``borrowWithinCohort`` gets its default, in every stored queue. Backwards: Any and
LowerPriority are Always (the old field had no narrower value)."""
from django.db import migrations

FORWARD = {"Never": "Never", "Always": "Any"}


def forward(apps, schema_editor):
    Queue = apps.get_model("queues", "Queue")
    for queue in Queue.objects.all():
        policy = dict((queue.spec or {}).get("preemption") or {})
        old = policy.pop("reclaimBorrowed", "Always")
        policy.setdefault("reclaimWithinCohort", FORWARD.get(old, "Any"))
        policy.setdefault("borrowWithinCohort", {"policy": "Never"})
        queue.spec = {**(queue.spec or {}), "preemption": policy}
        queue.save(update_fields=["spec"])


def backward(apps, schema_editor):
    Queue = apps.get_model("queues", "Queue")
    for queue in Queue.objects.all():
        policy = dict((queue.spec or {}).get("preemption") or {})
        new = policy.pop("reclaimWithinCohort", "Any")
        policy.pop("borrowWithinCohort", None)
        policy["reclaimBorrowed"] = "Never" if new == "Never" else "Always"
        queue.spec = {**(queue.spec or {}), "preemption": policy}
        queue.save(update_fields=["spec"])


class Migration(migrations.Migration):
    dependencies = [("queues", "0007_preemption_reservation")]
    operations = [migrations.RunPython(forward, backward)]
