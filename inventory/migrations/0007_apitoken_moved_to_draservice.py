"""API tokens now belong to the platform (``draservice.APIToken``, same table): the inventory app forgets the
model without touching the table."""
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("inventory", "0006_pool_event_key"),
        ("draservice", "0006_apitoken"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="APIToken")],
            database_operations=[],
        ),
    ]
