"""Celery tasks of the claims app. They take ids (or nothing) and call services; no domain logic here.

The allocation round's tasks (``claims.tasks.allocate_pending``, ``claims.tasks.purge_round_log``) are the
scheduler's: ``scheduler.tasks`` registers them under these names."""
from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings
from django.db import transaction

from claims import dispatch, receivers
from claims.services import claims as claim_services
from claims.services import device_removed, fleet, history, idempotency, taking, utilisation
from draservice.dispatch import request_task, task_started

log = logging.getLogger(__name__)


EXPIRE_LEASES = "claims.tasks.expire_leases"
LEASE_SWEEP_SECONDS = 1.0
LEASE_SWEEP_BATCH = 500


@shared_task(name=EXPIRE_LEASES, ignore_result=True)
def expire_leases() -> int:
    """The beat's lease sweep, every 5 s. It runs on the allocation workers (a release there wakes the claims it
    serves at once) for at most ``LEASE_SWEEP_SECONDS``, so that the rounds of claims submitted meanwhile do not
    wait behind a long sweep; where more is due it asks for itself again (debounced, behind the rounds queued)."""
    task_started(EXPIRE_LEASES)
    released, more = claim_services.sweep_leases(LEASE_SWEEP_BATCH, seconds=LEASE_SWEEP_SECONDS)
    if more and settings.CELERY_BROKER_URL:  # without a broker the runner's next tick goes on
        request_task(EXPIRE_LEASES, debounce=True)
    return released


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
