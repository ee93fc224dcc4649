"""No statistics for a device's JSON documents (PostgreSQL only): see draservice.upkeep_sql.set_statistics.

The engine matches them; no WHERE compares them by value, and at the default target an ANALYZE of 40,000 devices
spent most of its second on them. ``attribute_index`` keeps its statistics: the device search's containment test
(``@>``, answered by its GIN index) is estimated from them.
"""
from django.db import migrations

from draservice.upkeep_sql import set_statistics

DEVICE_DOCUMENTS = ("attributes", "capacity", "consumes_counters", "taints", "binding_conditions",
                    "binding_failure_conditions", "node_selector")


class Migration(migrations.Migration):

    dependencies = [
        ("inventory", "0007_apitoken_moved_to_draservice"),
    ]

    operations = [set_statistics("inventory_device", {c: 0 for c in DEVICE_DOCUMENTS})]
