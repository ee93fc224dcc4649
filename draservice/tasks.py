"""Celery tasks of the platform: keeping the change log settled and within its retention window; webhook
deliveries and the tables' upkeep (on the ``NOTIFY_QUEUE`` queue, which only notify workers consume)."""
from celery import shared_task
from django.conf import settings

from draservice import changes, deliveries, upkeep_sql
from draservice.celery import app


@shared_task(name="draservice.tasks.seal_changes", ignore_result=True)
def seal_changes() -> int:
    return changes.seal()


@shared_task(name="draservice.tasks.compact_changes", ignore_result=True)
def compact_changes() -> int:
    return changes.compact()


@shared_task(name="draservice.tasks.upkeep", ignore_result=True)
def upkeep_tables() -> int:
    """Statistics and vacuum of the service's tables where autovacuum is off (``draservice.upkeep_sql``)."""
    return len(upkeep_sql.run())


@shared_task(name="draservice.tasks.deliver_webhook", ignore_result=True)
def deliver_webhook(delivery_id: int) -> str:
    """One attempt of one delivery; a failure that may pass schedules the next attempt with backoff."""
    outcome, retry_in = deliveries.attempt(delivery_id)
    if retry_in is not None:
        app.send_task(deliveries.DELIVER_TASK, args=[delivery_id], countdown=retry_in, queue=settings.NOTIFY_QUEUE)
    return outcome


@shared_task(name="draservice.tasks.deliver_due", ignore_result=True)
def deliver_due() -> int:
    """The sweep: deliveries whose attempt is overdue (a lost message; no broker: every due one)."""
    return deliveries.deliver_due()
