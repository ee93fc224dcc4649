"""Celery tasks of the gangs app. They take ids (or nothing) and call services; no domain logic here."""
from __future__ import annotations

import logging
import time

from celery import shared_task

from gangs import dispatch
from gangs.services import lifecycle, placement

log = logging.getLogger(__name__)

MAX_TASK_SECONDS = 20.0



@shared_task(name="gangs.tasks.place_gangs", ignore_result=True)
def place_gangs(max_seconds: float = MAX_TASK_SECONDS) -> dict:
    """Place eligible gangs, oldest first, one transaction each, until none is left."""
    dispatch.task_started()
    deadline = time.monotonic() + max_seconds
    totals: dict[str, int] = {}
    skip: set[int] = set()
    retry = False
    while time.monotonic() < deadline:
        attempt = placement.place_next(exclude=skip)
        if attempt.result == "none":
            break
        totals[attempt.result] = totals.get(attempt.result, 0) + 1
        if attempt.retry_soon:
            skip.add(attempt.gang_id)  # not again in this task: its rows are busy or it just lost a race
            retry = True
    else:
        retry = True
    if retry:
        dispatch.request_placement()
    if totals:
        log.info("gang placement: %s", totals)
    return totals


@shared_task(name="gangs.tasks.place_gang", ignore_result=True)
def place_gang(gang_id: int) -> str:
    """Try one gang now (a new one: it need not wait for the next pass)."""
    attempt = placement.place_next(gang_id=gang_id)
    if attempt.retry_soon:
        dispatch.request_placement()
    return attempt.result


@shared_task(name="gangs.tasks.sweep_gangs", ignore_result=True)
def sweep_gangs() -> dict:
    return lifecycle.sweep()


def on_inventory_changed(sender=None, **kwargs) -> None:
    """``inventory.signals.inventory_changed`` (sent after the sync commits): devices may be new or back."""
    from django.db import transaction

    transaction.on_commit(dispatch.request_placement)
