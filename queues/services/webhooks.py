"""Preemption notices: a JSON notice per victim to its queue's webhook, as a ``draservice.deliveries`` delivery.

The delivery is created in the transaction that marks the victim, with the URL and secret the queue has then
(a retry goes there, whatever the queue says later), and handed to the notify workers after commit; signing
(Standard Webhooks), target checks and the delivery deadline are ``draservice.webhooks``'. A queue's webhook
always has a ``whsec_`` secret: the server generates one when none is given (``ensure_secret``).
"""
from __future__ import annotations

from django.db import transaction

from draservice import deliveries, webhooks
from queues.models import Preemption, Queue

EVENT = "preemption.pending"
CANCELLED = "preemption.cancelled"


def owner(queue_name: str) -> str:
    return f"queue/{queue_name}"


def webhook_of(queue: Queue | None) -> dict:
    return ((queue.spec.get("preemption") or {}).get("webhook") or {}) if queue else {}


def _ts(at) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def payload(p: Preemption, reason: str = "PreemptionPending") -> dict:
    victim = p.victim
    return {"apiVersion": "draservice.io/v1alpha1", "kind": "PreemptionNotice",
            "queue": p.queue, "reason": reason,
            # stopBy: stop by then; forceAt: the devices go then at the latest (earlier once it is confirmed that
            # the claim stopped). ``deadline``: stopBy, its name before forceAt existed.
            "deadline": _ts(p.stop_by or p.deadline), "stopBy": _ts(p.stop_by or p.deadline),
            "forceAt": _ts(p.deadline),
            "claim": {"namespace": victim.namespace.name, "name": victim.name, "uid": str(victim.uid)},
            "preemptor": ({"namespace": p.preemptor.namespace.name, "name": p.preemptor.name}
                          if p.preemptor is not None else None)}


def notify(made: list[Preemption], queues: dict[str, Queue], event: str = EVENT) -> int:
    """Inside the marking (or cancelling: ``event`` ``CANCELLED``) transaction: one delivery per victim whose
    queue has a webhook (``queues``: by name), handed on after commit. Returns how many."""
    ids = []
    reason = "PreemptionCancelled" if event == CANCELLED else "PreemptionPending"
    for p in made:
        hook = webhook_of(queues.get(p.queue))
        if not hook.get("url"):
            continue
        delivery = deliveries.create(event, owner(p.queue), hook["url"], hook.get("secret") or "",
                                     payload(p, reason), namespace=p.victim.namespace.name)
        said = "cancel" if event == CANCELLED else "notice"
        Preemption.objects.filter(pk=p.pk).update(webhook_status=f"{said} {delivery.message_id}")
        ids.append(delivery.id)
    if ids:
        transaction.on_commit(lambda: deliveries.kick(ids))
    return len(ids)


def ensure_secret(spec: dict) -> str | None:
    """Give a webhook without a secret a generated one; returns it (to be shown once) or None."""
    hook = (spec.get("preemption") or {}).get("webhook")
    if hook and hook.get("url") and not hook.get("secret"):
        hook["secret"] = webhooks.generate_secret()
        return hook["secret"]
    return None
