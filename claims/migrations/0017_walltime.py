"""Leases run from allocation (the walltime): a pending claim's lease has not started. Claims allocated now
keep their ``expireTime``; pending ones have theirs cleared, and it is set when they are allocated."""

from django.db import migrations, models


def clear_pending_leases(apps, schema_editor):
    claim = apps.get_model("claims", "ResourceClaim")
    claim.objects.filter(phase="Pending", lease_expires_at__isnull=False).update(lease_expires_at=None)


class Migration(migrations.Migration):

    dependencies = [
        ("claims", "0016_safe_release"),
    ]

    operations = [
        migrations.AddField(
            model_name="resourceclaim",
            name="pending_deadline",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name="resourceclaim",
            index=models.Index(condition=models.Q(("pending_deadline__isnull", False)), fields=["pending_deadline"],
                               name="claims_claim_pending_deadline"),
        ),
        migrations.RunPython(clear_pending_leases, migrations.RunPython.noop),
    ]
