"""Preemption webhooks: a JSON notice signed with the queue's secret (HMAC-SHA256), delivered with a timeout.

Header ``X-Draservice-Signature: sha256=<hex HMAC of the body>``; receivers recompute it with the secret they
share with the queue. Only URLs on the admin allow-list (``QUEUE_WEBHOOK_ALLOWED_PREFIXES``) were accepted in
the queue spec, and the list is checked again here (it may have shrunk since).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import urllib.request

from django.conf import settings

from queues.models import Preemption, Queue

TIMEOUT_SECONDS = 5
SIGNATURE_HEADER = "X-Draservice-Signature"


class DeliveryFailed(Exception):
    pass


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def payload(p: Preemption) -> dict:
    victim = p.victim
    return {"apiVersion": "draservice.io/v1alpha1", "kind": "PreemptionNotice",
            "queue": p.queue, "reason": "PreemptionPending", "deadline": p.deadline.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "claim": {"namespace": victim.namespace.name, "name": victim.name, "uid": str(victim.uid)},
            "preemptor": ({"namespace": p.preemptor.namespace.name, "name": p.preemptor.name}
                          if p.preemptor_id else None)}


def deliver(preemption_id: int, attempt: int = 1) -> str:
    p = Preemption.objects.select_related("victim__namespace", "preemptor__namespace").filter(pk=preemption_id).first()
    queue = Queue.objects.filter(name=p.queue).first() if p else None
    hook = ((queue.spec.get("preemption") or {}).get("webhook") or {}) if queue else {}
    url = hook.get("url")
    if p is None or not url:
        return "no webhook"
    if not any(url.startswith(prefix) for prefix in settings.QUEUE_WEBHOOK_ALLOWED_PREFIXES):
        _record(p, "refused: URL no longer on the allow-list")
        return "refused"
    body = json.dumps(payload(p)).encode()
    request = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": "application/json", SIGNATURE_HEADER: sign(hook.get("secret") or "", body)})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as response:  # noqa: S310 (allow-listed)
            status = response.status
    except Exception as exc:
        _record(p, f"attempt {attempt} failed: {exc}"[:255])
        raise DeliveryFailed(str(exc)) from exc
    _record(p, f"delivered (HTTP {status}, attempt {attempt})")
    return "delivered"


def _record(p: Preemption, status: str) -> None:
    Preemption.objects.filter(pk=p.pk).update(webhook_status=status)
