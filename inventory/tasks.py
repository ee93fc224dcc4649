"""Periodic inventory work for Celery beat (registered in InventoryConfig.ready).

The stale-cluster sweep marks clusters that went silent (the allocator hears of it through
``inventory_changed``). ``refresh_demo_clusters`` stands in for the agents
of the demo fleet (clusters labelled draservice.io/demo=true): without it the demo would go stale five
minutes after ``make run``. It only heartbeats clusters that carry that label, and only where the demo fleet
was asked for (``settings.DEMO_FLEET``, which ``manage.py serve --demo`` turns on): anywhere else it would
keep fake clusters fresh, and real claims would be allocated on nodes that do not exist.
"""

from celery import shared_task
from django.conf import settings

from inventory.demo import DEMO_LABEL
from inventory.schedule import DEMO_SCHEDULE
from inventory.services import clusters


def enable_demo_fleet() -> None:
    """``serve --demo``: keep the demo fleet fresh in this process (and the web workers forked from it)."""
    settings.DEMO_FLEET = True
    for name, entry in DEMO_SCHEDULE.items():
        settings.CELERY_BEAT_SCHEDULE.setdefault(name, entry)


@shared_task(name="inventory.tasks.sweep_stale_clusters", ignore_result=True)
def sweep_stale_clusters() -> list[str]:
    """Mark silent clusters stale; each newly stale one sends ``inventory_changed`` (the allocator listens)."""
    return clusters.sweep_stale_clusters()


@shared_task(name="inventory.tasks.refresh_demo_clusters", ignore_result=True)
def refresh_demo_clusters() -> int:
    from inventory.models import Cluster
    from inventory.services.clusters import record_heartbeat

    if not settings.DEMO_FLEET:
        return 0  # a beat schedule persisted by an older version, or a hand-sent task: not in production
    if _json_contains_supported():
        demo_clusters = list(Cluster.objects.filter(labels__contains={DEMO_LABEL: "true"}))
    else:
        demo_clusters = [c for c in Cluster.objects.all() if (c.labels or {}).get(DEMO_LABEL) == "true"]
    count = 0
    for cluster in demo_clusters:
        record_heartbeat(cluster, agent_version="demo-fleet", status={"simulated": True})
        count += 1
    return count


def _json_contains_supported() -> bool:
    from django.db import connection

    return connection.features.supports_json_field_contains
