"""Celery tasks of the queues app: they take ids (or nothing) and call services."""
from __future__ import annotations

from celery import shared_task

from queues.services import reclaim


@shared_task(name="queues.tasks.preempt", ignore_result=True)
def preempt() -> dict:
    """Requeue victims past their deadline; choose and mark victims for claims waiting for room."""
    return reclaim.run()
