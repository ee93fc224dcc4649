"""How the claims app reacts to the inventory's ``inventory_changed`` signal (sent after the push commits).

Data flows one way: the inventory says "cluster X changed"; the claims app looks at what its claims hold
there. (Allocation itself is asked for by ``claims.tasks.on_inventory_changed``.)
"""
from __future__ import annotations

import logging

from django.conf import settings

from claims.services import device_removed
from draservice import notify
from draservice.celery import app

log = logging.getLogger(__name__)

# Reasons after which a cluster's set of devices may differ (a label change or a heartbeat cannot remove one).
DEVICE_REASONS = frozenset({"sync", "slice", "cluster-deleted"})
CHECK_DEBOUNCE_MS = 30_000


def mark_removed_devices(sender=None, cluster=None, reason=None, **kwargs) -> None:
    """Mark allocated claims whose devices the change removed (``claims.services.device_removed``).

    With a broker the check runs in a worker (a 5,000-slice rollout should not add a query per slice to the
    agent's pushes), debounced per cluster; without one it runs here, after the push committed.
    """
    if not cluster or reason not in DEVICE_REASONS:
        return
    if settings.CELERY_BROKER_URL:
        _enqueue(cluster)
        return
    try:
        device_removed.check_cluster(cluster)
    except Exception:  # the push is committed; the next change of this cluster checks again
        log.exception("could not check cluster %s for removed devices", cluster)


# Named, not imported: claims.tasks imports this module (no import cycle).
CHECK_TASK = "claims.tasks.check_removed_devices"


def check_key(cluster: str) -> str:
    return f"{notify.key_prefix()}:claims:device-check-queued:{cluster}"


def _enqueue(cluster: str) -> None:
    client = notify.redis_client()
    if client is not None:
        try:
            if not client.set(check_key(cluster), "1", nx=True, px=CHECK_DEBOUNCE_MS):
                return  # a check of this cluster is queued and has not started: it will see this change
        except Exception as exc:  # Redis trouble: enqueue anyway, a duplicate check is harmless
            log.warning("device check debounce unavailable: %s", exc)
    app.send_task(CHECK_TASK, args=[cluster])


def check_started(cluster: str) -> None:
    """Called by the task before it reads the inventory, so a change committed after that enqueues again."""
    client = notify.redis_client()
    if client is not None:
        try:
            client.delete(check_key(cluster))
        except Exception as exc:
            log.warning("device check debounce unavailable: %s", exc)
