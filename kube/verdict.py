"""What a dry-run claim would meet once stored: its queue, its place there, the quota it would need and when it
may start (``draservice.dryrun`` runs this before rolling the write back, at both doors, and sends the
words as a ``Warning`` header, which kubectl prints).

A forecast from the queue's quota and what its claims hold now, not an allocation: whether devices are free
is the allocator's to find out (``POST /api/v1/simulate`` answers that without writing)."""
from __future__ import annotations

from fractions import Fraction

from claims.models import Phase, ResourceClaim
from queues.models import Queue
from queues.services import order as queue_order
from queues.services import status as queue_status

DEVICES = "devices"


def demand(spec: dict | None) -> dict[str, int]:
    """Devices asked for per DeviceClass (``exactly`` requests and the first choice of ``firstAvailable``;
    ``allocationMode: All`` counts one, the least it can take)."""
    out: dict[str, int] = {}
    for request in ((spec or {}).get("devices") or {}).get("requests") or []:
        if not isinstance(request, dict):
            continue
        choice = request.get("exactly") or next(iter(request.get("firstAvailable") or []), None) or {}
        cls = choice.get("deviceClassName")
        if isinstance(cls, str) and cls:
            count = choice.get("count") if choice.get("allocationMode", "ExactCount") == "ExactCount" else 1
            out[cls] = out.get(cls, 0) + (count if isinstance(count, int) and count > 0 else 1)
    return out


def _amount(value) -> Fraction | None:
    try:
        return Fraction(str(value)) if value is not None else None
    except (ValueError, ZeroDivisionError):
        return None


def quota_words(queue: Queue | None, name: str, asked: dict[str, int]) -> str:
    """"would wait for quota in team-c: ..." or "fits the quota of team-c: ..." (devices only: counters and
    capacity depend on which devices the allocator picks)."""
    if queue is None:
        return f"would wait: queue {name} does not exist yet (an admin creates it)"
    used = {u["deviceClassName"]: _amount(u["used"]) or Fraction(0)
            for u in queue_status.statuses([queue])[queue.id]["usage"] if u.get("unit") == DEVICES}
    short: list[str] = []
    fits: list[str] = []
    for cls, count in sorted(asked.items()):
        entry = next((q for q in queue.spec.get("quotas") or [] if q.get("deviceClassName") == cls), None)
        limits = (entry or {}).get(DEVICES)
        if not isinstance(limits, dict):
            fits.append(f"{cls}: no device quota")
            continue
        nominal = _amount(limits.get("nominal")) or Fraction(0)
        borrow = _amount(limits.get("borrowingLimit"))
        now = used.get(cls, Fraction(0))
        ceiling = None if borrow is None else nominal + borrow
        words = (f"{cls}: {now} of {nominal} nominal in use"
                 f"{'' if borrow is None else f', may borrow {borrow}'}, the claim asks {count}")
        (short if ceiling is not None and now + count > ceiling else fits).append(words)
    if short:
        return f"would wait for quota in {name}: " + "; ".join(short)
    return f"fits the quota of {name}: " + "; ".join(fits) if fits else f"queue {name}"


def claim_verdict(obj: dict) -> list[str]:
    meta = obj.get("metadata") or {}
    claim = (ResourceClaim.objects.select_related("namespace")
             .filter(namespace__name=meta.get("namespace"), name=meta.get("name")).first())
    if claim is None or claim.phase != Phase.PENDING:
        return []
    fields = queue_order.positions([claim], True).get(claim.id) or {}
    name = str(fields.get("queue") or "default")
    words = quota_words(Queue.objects.filter(name=name).first(), name, demand(claim.spec))
    place = fields.get("positionInQueue")
    start = fields.get("estimatedStartTime")
    extra = "".join((f"; position {place} in queue {name}" if place else "",
                     f"; estimated start {start}" if start else ""))
    return [f"{words}{extra} (dry run: nothing was stored)"]
