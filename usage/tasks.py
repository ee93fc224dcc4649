"""Celery tasks of the usage app."""
from celery import shared_task

from usage.services import decay


@shared_task(name="usage.tasks.fold_decay", ignore_result=True)
def fold_decay() -> int:
    """The releases' decayed-usage deltas into their queues' rows (``usage.services.decay.fold``)."""
    return decay.fold()
