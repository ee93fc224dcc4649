"""Celery tasks of the claims app. They take ids (or nothing) and call services; no domain logic here.

The allocation round's tasks (``claims.tasks.allocate_pending``, ``claims.tasks.purge_round_log``) are the
scheduler's: ``scheduler.tasks`` registers them under these names."""
from __future__ import annotations

import logging

from celery import shared_task
from django.db import transaction

from claims import dispatch, receivers
from claims.services import claims as claim_services
from claims.services import device_removed, fleet, history, idempotency, taking, utilisation

log = logging.getLogger(__name__)


@shared_task(name="claims.tasks.expire_leases", ignore_result=True)
def expire_leases() -> int:
    return claim_services.expire_leases()


@shared_task(name="claims.tasks.record_utilisation", ignore_result=True)
def record_utilisation() -> int:
    return utilisation.record_snapshot()


@shared_task(name="claims.tasks.purge_idempotency_keys", ignore_result=True)
def purge_idempotency_keys() -> int:
    return idempotency.purge_expired()


@shared_task(name="claims.tasks.prune_history", ignore_result=True)
def prune_history() -> int:
    """Claims' history older than ``HISTORY_DAYS`` (``claims.services.history``)."""
    return history.prune()


@shared_task(name="claims.tasks.check_removed_devices", ignore_result=True)
def check_removed_devices(cluster: str) -> int:
    """Mark allocated claims of ``cluster`` whose devices an inventory push removed (see claims.receivers)."""
    receivers.check_started(cluster)
    return len(device_removed.check_cluster(cluster))


def on_inventory_changed(sender=None, **kwargs) -> None:
    """``inventory.signals.inventory_changed`` (sent after the sync commits): devices may be new or back."""
    fleet.invalidate()
    with transaction.atomic():
        taking.bump_fleet_version()
    transaction.on_commit(dispatch.request_allocation)
