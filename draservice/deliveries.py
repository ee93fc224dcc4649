"""Webhook deliveries: notices stored with their target, attempted off the allocation path, retried with backoff.

``create`` is called by an owner (e.g. a queue's preemption) inside the transaction that decides the notice;
it captures the URL, the secret and the body, so a retry goes to the captured URL whatever is set later. After
commit ``kick`` hands the new ids on:

* with a broker, one ``draservice.tasks.deliver_webhook`` task each on the ``NOTIFY_QUEUE`` Celery queue, which
  only notify workers consume: a slow receiver holds a notify worker for at most ``WEBHOOK_DEADLINE_SECONDS``
  and never an allocation worker. A failed attempt schedules the next one with backoff (a task with a
  countdown); the beat sweep (``deliver_due``) re-sends what is overdue, should a message be lost;
* without a broker, ``manage.py serve``'s notify runner (a thread of its own, beside the allocation runner)
  is woken and delivers what is due; with no runner at all (shell, tests) the due deliveries run inline.

An attempt first takes a lease on its row (a conditional UPDATE): two workers never call the same receiver
for the same delivery at once, and a delivery already delivered or not yet due is left alone.
"""
from __future__ import annotations

import json
import logging
import uuid
from datetime import timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from draservice import dispatch, webhooks
from draservice.celery import app
from draservice.models import DeliveryStatus, WebhookDelivery, WebhookEvent

log = logging.getLogger(__name__)

DELIVER_TASK = "draservice.tasks.deliver_webhook"
DELIVER_DUE_TASK = "draservice.tasks.deliver_due"
BACKOFF_SECONDS = (2, 10, 60, 300, 1800)  # after attempt 1, 2, ...; the last repeats
# Longer than an attempt can take (its deadline), so a lease outlives the attempt that holds it.
LEASE_SECONDS = 30
# With a broker, the sweep leaves a due delivery this long to the task that a retry scheduled.
SWEEP_GRACE_SECONDS = 30


def create(event: str, owner: str, url: str, secret: str, payload: dict, namespace: str = "") -> WebhookDelivery:
    """A new delivery (call inside the deciding transaction, then ``kick`` after commit)."""
    return WebhookDelivery.objects.create(
        message_id=f"msg_{uuid.uuid4().hex}", event=event, owner=owner, namespace=namespace, url=url,
        secret=secret, payload=payload, next_attempt_at=timezone.now())


def record_event(owner: str, reason: str, message: str) -> None:
    WebhookEvent.objects.create(owner=owner, reason=reason, message=message)


def kick(ids: list[int]) -> None:
    """After commit: get the deliveries going (see the module docstring). Never raises."""
    if not ids:
        return
    try:
        if settings.CELERY_BROKER_URL:
            for delivery_id in ids:
                app.send_task(DELIVER_TASK, args=[delivery_id], queue=settings.NOTIFY_QUEUE)
        else:
            dispatch.request_task(DELIVER_DUE_TASK)
    except Exception:  # a broker hiccup: the beat sweep sends them later
        log.warning("webhook deliveries %s not handed on; the sweep will", ids, exc_info=True)


def body_of(delivery: WebhookDelivery) -> bytes:
    return json.dumps(delivery.payload, separators=(",", ":"), sort_keys=True).encode()


def _lease(delivery_id: int) -> WebhookDelivery | None:
    now = timezone.now()
    taken = (WebhookDelivery.objects.filter(id=delivery_id, status=DeliveryStatus.PENDING, next_attempt_at__lte=now)
             .filter(Q(leased_until__isnull=True) | Q(leased_until__lt=now))
             .update(leased_until=now + timedelta(seconds=LEASE_SECONDS), last_attempt_at=now))
    return WebhookDelivery.objects.filter(id=delivery_id).first() if taken else None


def attempt(delivery_id: int) -> tuple[str, float | None]:
    """One attempt, if the delivery is due and nobody else is at it: ``(outcome, retry in seconds or None)``."""
    delivery = _lease(delivery_id)
    if delivery is None:
        return "not due", None
    number = delivery.attempts + 1
    error, retry = "", False
    try:
        body = body_of(delivery)
        webhooks.post(delivery.url, body, webhooks.signature_headers(delivery.secret, delivery.message_id, body))
    except webhooks.TargetRefused as exc:
        error = f"refused: {exc}"
    except webhooks.AttemptFailed as exc:
        error, retry = str(exc), exc.retry
    except Exception as exc:  # whatever a receiver makes us do, it is this delivery's failure only
        log.exception("webhook delivery %s", delivery.message_id)
        error, retry = f"error: {exc}", True
    return _finish(delivery, number, error, retry)


def _finish(delivery: WebhookDelivery, number: int, error: str, retry: bool) -> tuple[str, float | None]:
    now = timezone.now()
    fields: dict[str, object] = {"attempts": number, "leased_until": None}
    if error:  # kept once delivered: how the earlier attempts went
        fields["last_error"] = f"attempt {number} failed: {error}"[:1000]
    wait = None
    if not error:
        fields.update(status=DeliveryStatus.DELIVERED, finished_at=now, next_attempt_at=None)
    elif retry and number < settings.WEBHOOK_MAX_ATTEMPTS:
        wait = BACKOFF_SECONDS[min(number, len(BACKOFF_SECONDS)) - 1]
        fields.update(next_attempt_at=now + timedelta(seconds=wait))
    else:
        fields.update(status=DeliveryStatus.FAILED, finished_at=now, next_attempt_at=None)
    WebhookDelivery.objects.filter(id=delivery.id).update(**fields)
    outcome = "delivered" if not error else f"failed: {error}"
    log.info("webhook %s (%s) attempt %d: %s", delivery.message_id, delivery.event, number, outcome)
    return outcome, wait


def due(limit: int = 100, grace_seconds: float = 0) -> list[int]:
    cutoff = timezone.now() - timedelta(seconds=grace_seconds)
    return list(WebhookDelivery.objects.filter(status=DeliveryStatus.PENDING, next_attempt_at__lte=cutoff)
                .filter(Q(leased_until__isnull=True) | Q(leased_until__lt=timezone.now()))
                .order_by("next_attempt_at").values_list("id", flat=True)[:limit])


def deliver_due(limit: int = 100) -> int:
    """The sweep. With a broker: re-send overdue deliveries to the notify workers. Without: deliver them here."""
    if settings.CELERY_BROKER_URL:
        ids = due(limit, SWEEP_GRACE_SECONDS)
        for delivery_id in ids:
            app.send_task(DELIVER_TASK, args=[delivery_id], queue=settings.NOTIFY_QUEUE)
        return len(ids)
    done = 0
    for delivery_id in due(limit):
        attempt(delivery_id)
        done += 1
    return done


def rendered(delivery: WebhookDelivery) -> dict:
    def stamp(value):
        return value.strftime("%Y-%m-%dT%H:%M:%SZ") if value else None

    return {"id": delivery.message_id, "event": delivery.event, "url": delivery.url, "attempts": delivery.attempts,
            "status": delivery.status, "lastError": delivery.last_error or None,
            "createdAt": stamp(delivery.created_at), "lastAttemptAt": stamp(delivery.last_attempt_at),
            "nextAttemptAt": stamp(delivery.next_attempt_at), "finishedAt": stamp(delivery.finished_at)}
