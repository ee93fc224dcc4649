"""Celery tasks of the platform: keeping the change log settled and within its retention window."""
from celery import shared_task

from draservice import changes


@shared_task(name="draservice.tasks.seal_changes", ignore_result=True)
def seal_changes() -> int:
    return changes.seal()


@shared_task(name="draservice.tasks.compact_changes", ignore_result=True)
def compact_changes() -> int:
    return changes.compact()
