"""Quota charges of claims no longer Allocated are deleted: from now on a charge lives exactly as long as its
claim's allocation (deleted where the claim's devices are freed), and queue usage sums the charges without
reading the claims. Charges left by releases before this change would otherwise count again."""
from django.db import migrations


def forward(apps, schema_editor):
    QuotaCharge = apps.get_model("queues", "QuotaCharge")
    QuotaCharge.objects.exclude(claim__phase="Allocated").delete()


class Migration(migrations.Migration):
    dependencies = [("queues", "0008_reclaim_within_cohort")]

    operations = [migrations.RunPython(forward, migrations.RunPython.noop)]
