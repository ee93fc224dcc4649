"""Celery tasks of the claims app. They take ids (or nothing) and call services; no domain logic here."""
from __future__ import annotations

import logging
import time

from celery import shared_task
from django.conf import settings
from django.db import transaction

from claims import dispatch, receivers
from claims.services import allocation, device_removed, fleet, idempotency, round_log, utilisation
from claims.services import claims as claim_services

log = logging.getLogger(__name__)

# One task keeps taking batches while there is work, up to this long; then it hands over to a fresh task
# so that a busy queue does not starve the other tasks of the worker.
MAX_TASK_SECONDS = 20.0


@shared_task(name="claims.tasks.allocate_pending", ignore_result=True)
def allocate_pending(batch_size: int = allocation.DEFAULT_BATCH, max_seconds: float = MAX_TASK_SECONDS) -> dict:
    """Allocate eligible pending claims, batch after batch, until none is left."""
    dispatch.task_started()
    deadline = time.monotonic() + max_seconds
    totals = {"rounds": 0, "allocated": 0, "pending": 0, "failed": 0, "lost_race": 0}
    fanned_out = False
    idle_spins = 0
    while True:
        started = time.perf_counter()
        try:
            result = allocation.allocate_round(batch_size)
        except Exception as exc:
            # /metrics counts rounds that raised (the allocation-errors alert); the task still fails as before.
            round_log.record(None, error=exc, seconds=time.perf_counter() - started)
            raise
        if not result.taken:
            break
        round_log.record(result)
        totals["rounds"] += 1
        for key in ("allocated", "pending", "failed", "lost_race"):
            totals[key] += getattr(result, key)
        # A full batch means there is more: ask for a second task, so that another worker joins in.
        if result.taken >= batch_size and not fanned_out and settings.CELERY_BROKER_URL:
            dispatch.request_allocation()
            fanned_out = True
        if not (result.allocated or result.pending or result.failed):
            # Everything we took belongs to groups another worker is busy with: let it finish.
            idle_spins += 1
            if idle_spins > 20:
                break
            time.sleep(0.05)
        if time.monotonic() > deadline:
            dispatch.request_allocation()
            break
    if totals["rounds"]:
        log.info("allocation: %s", totals)
    return totals


@shared_task(name="claims.tasks.expire_leases", ignore_result=True)
def expire_leases() -> int:
    total = 0
    while True:
        n = claim_services.expire_leases()
        total += n
        if n < 500:
            return total


@shared_task(name="claims.tasks.record_utilisation", ignore_result=True)
def record_utilisation() -> int:
    return utilisation.record_snapshot()


@shared_task(name="claims.tasks.purge_idempotency_keys", ignore_result=True)
def purge_idempotency_keys() -> int:
    return idempotency.purge_expired()


@shared_task(name="claims.tasks.purge_round_log", ignore_result=True)
def purge_round_log() -> int:
    return round_log.purge()


@shared_task(name="claims.tasks.check_removed_devices", ignore_result=True)
def check_removed_devices(cluster: str) -> int:
    """Mark allocated claims of ``cluster`` whose devices an inventory push removed (see claims.receivers)."""
    receivers.check_started(cluster)
    return len(device_removed.check_cluster(cluster))


def on_inventory_changed(sender=None, **kwargs) -> None:
    """``inventory.signals.inventory_changed`` (sent after the sync commits): devices may be new or back."""
    fleet.invalidate()
    with transaction.atomic():
        allocation.bump_fleet_version()
    transaction.on_commit(dispatch.request_allocation)
