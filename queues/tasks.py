"""Celery tasks of the queues app: they take ids (or nothing) and call services."""
from __future__ import annotations

from celery import shared_task

from queues.services import reclaim, webhooks


@shared_task(name="queues.tasks.preempt", ignore_result=True)
def preempt() -> dict:
    """Requeue victims past their deadline; choose and mark victims for claims waiting for room."""
    return reclaim.run()


@shared_task(name="queues.tasks.notify_preemption", bind=True, ignore_result=True, max_retries=5)
def notify_preemption(self, preemption_id: int) -> str:
    """POST the signed notice to the victim queue's webhook; retried with backoff, never blocking anything."""
    try:
        return webhooks.deliver(preemption_id, attempt=self.request.retries + 1)
    except webhooks.DeliveryFailed as exc:
        if self.request.retries >= self.max_retries:
            return "gave up"
        raise self.retry(exc=exc, countdown=min(60, 2 ** self.request.retries)) from exc
