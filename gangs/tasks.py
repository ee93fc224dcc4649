"""Celery tasks of the gangs app. They take ids (or nothing) and call services; no domain logic here.

Placing gangs is the scheduler's: ``scheduler.tasks`` registers ``gangs.tasks.place_gangs`` and
``gangs.tasks.place_gang`` under these names."""
from __future__ import annotations

from celery import shared_task

from gangs import dispatch
from gangs.services import lifecycle


@shared_task(name="gangs.tasks.sweep_gangs", ignore_result=True)
def sweep_gangs() -> dict:
    return lifecycle.sweep()


def on_inventory_changed(sender=None, **kwargs) -> None:
    """``inventory.signals.inventory_changed`` (sent after the sync commits): devices may be new or back."""
    from django.db import transaction

    transaction.on_commit(dispatch.request_placement)
