"""The periodic tasks of the inventory (collected by ``draservice.beat``): the stale-cluster sweep, and the demo
fleet's stand-in heartbeat only where the demo fleet was asked for (``settings.DEMO_FLEET``)."""
from datetime import timedelta

from django.conf import settings

DEMO_SCHEDULE = {
    "inventory-refresh-demo-clusters": {
        "task": "inventory.tasks.refresh_demo_clusters",
        "schedule": timedelta(seconds=max(10.0, settings.STALE_CLUSTER_SECONDS / 3)),
    },
}


def SCHEDULE() -> dict:  # noqa: N802 - the name every app's schedule module uses
    entries = {"inventory-sweep-stale-clusters": {"task": "inventory.tasks.sweep_stale_clusters",
                                                  "schedule": timedelta(seconds=30)}}
    if settings.DEMO_FLEET:
        entries.update(DEMO_SCHEDULE)
    return entries
