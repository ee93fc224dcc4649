"""Celery tasks of the queues app: they take ids (or nothing) and call services."""
from __future__ import annotations

from celery import shared_task

# The preemption pass (``queues.tasks.preempt``) is the scheduler's: ``scheduler.tasks`` registers it.


@shared_task(name="queues.tasks.notify_preemption", ignore_result=True)
def notify_preemption(preemption_id: int, *args) -> int:
    """What the previous version enqueued per notice (it delivered inline, here on the allocation worker): such
    messages still in the broker after an upgrade become deliveries for the notify worker. Nothing sends it now."""
    from django.db import transaction

    from queues.models import Preemption, Queue
    from queues.services import webhooks

    with transaction.atomic():
        made = list(Preemption.objects.select_related("victim__namespace", "preemptor__namespace")
                    .filter(pk=preemption_id, webhook_status=""))
        queues = {q.name: q for q in Queue.objects.filter(name__in=[p.queue for p in made])}
        return webhooks.notify(made, queues)
