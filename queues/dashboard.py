"""The dashboard's Queues page: the tree, per class the nominal quota, what is in use (within nominal and
borrowed), what is lent to siblings, pending claims per class, the fair-share rank and the head's start estimate.

Amounts are shown in people's units: devices as counts, memory as binary quantities (``70Gi``). Usage the
queue has no quota for beyond its device count (a MIG partition's ``memory-slice-N`` placement counters, for
one) is summed up in one line instead of a row per counter.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from fractions import Fraction

import yaml
from django.db.models import Count, Min
from django.utils import timezone

from claims.models import Phase, ResourceClaim
from dra import windows
from draservice import audit
from queues import reservation_spec
from queues import spec as queue_spec
from queues.models import Preemption, Queue, Reservation
from queues.quantities import quantity
from queues.services import order as queue_order
from queues.services import reservations, status, usage
from queues.services.order import Shares
from queues.services.resolve import Tree, claims_of_queue_q

PENDING_SAMPLE = 500  # pending claims read per queue for the per-class counts
HEAD_SAMPLE = 20  # the oldest pending claims a queue's head is looked for among


def queue_rows() -> list[dict]:
    queues = list(Queue.objects.order_by("id"))
    statuses = status.statuses(queues)
    tree = Tree(queues={q.name: q for q in queues}, by_namespace={}, _redirects={})
    shares = Shares(tree, usage.load())
    preempted = dict(Preemption.objects.values_list("queue").annotate(n=Count("id")).values_list("queue", "n"))
    children: dict[int | None, list[Queue]] = defaultdict(list)
    for q in queues:
        children[q.parent_id].append(q)
    ranks = queue_order.fair_share_ranks(queues, shares)
    rows: list[dict] = []

    def walk(parent_id: int | None, depth: int) -> None:
        siblings = sorted(children.get(parent_id, []), key=lambda q: q.name)
        amounts = {q.id: _amounts(q, statuses[q.id]) for q in siblings}
        lent = _lent(amounts)
        for q in siblings:
            rows.append(_row(q, depth, statuses[q.id], amounts[q.id], lent.get(q.id, {}), shares, ranks,
                             preempted.get(q.name, 0)))
            walk(q.id, depth + 1)

    walk(None, 0)
    return rows


def queue_page(name: str, show_history: bool) -> dict | None:
    """A queue's page: its row of the tree (None: no such queue) and, for admins, its newest policy changes."""
    row = next((r for r in queue_rows() if r["queue"].name == name), None)
    if row is None:
        return None
    return {"row": row, "changes": audit.events(queue_spec.KIND, name) if show_history else []}


def _amounts(q: Queue, st: dict) -> dict[tuple, tuple[Fraction, Fraction]]:
    """(class, unit, resource) -> (nominal, in use)."""
    nominal: dict[tuple, Fraction] = defaultdict(Fraction)
    for entry in q.spec.get("quotas") or []:
        if entry.get("devices"):
            nominal[(entry["deviceClassName"], "devices", "")] += Fraction(
                queue_spec.amount_of(entry["devices"]["nominal"]))
        for unit in ("counters", "capacity"):
            for res, limits in (entry.get(unit) or {}).items():
                nominal[(entry["deviceClassName"], unit, res)] += Fraction(queue_spec.amount_of(limits["nominal"]))
    used = {(u["deviceClassName"], u["unit"], u.get("name", "")): Fraction(u["used"]) for u in st["usage"]}
    return {key: (nominal.get(key, Fraction(0)), used.get(key, Fraction(0))) for key in set(nominal) | set(used)}


def _lent(amounts: dict[int, dict[tuple, tuple[Fraction, Fraction]]]) -> dict[int, dict[tuple, Fraction]]:
    """What each sibling lends: the siblings' borrowing, covered by the unused nominal of the others in name
    order (the queues of one parent share their unused quota)."""
    out: dict[int, dict[tuple, Fraction]] = defaultdict(dict)
    keys = {key for per in amounts.values() for key in per}
    for key in keys:
        zero = (Fraction(0), Fraction(0))
        borrowed = sum((max(Fraction(0), u - n) for n, u in (per.get(key, zero) for per in amounts.values())),
                       Fraction(0))
        for qid, per in amounts.items():
            if borrowed <= 0:
                break
            n, u = per.get(key, (Fraction(0), Fraction(0)))
            give = min(borrowed, max(Fraction(0), n - u))
            if give:
                out[qid][key] = give
                borrowed -= give
    return out


def _resource(key: tuple, nominal: Fraction, used: Fraction, lent: Fraction) -> dict:
    cls, unit, name = key
    within, borrowed = min(nominal, used), max(Fraction(0), used - nominal)
    total = max(nominal, used) or Fraction(1)

    def show(value: Fraction) -> str:
        return quantity(value, name, exact=False)

    return {"class": cls, "unit": "devices" if unit == "devices" else name, "kind": unit,
            "nominal": show(nominal), "used": show(used), "borrowed": show(borrowed), "lent": show(lent),
            "tally": {"total": float(total), "segments": [
                ("alloc", float(within), "in use within nominal"),
                ("shared", float(borrowed), "borrowed"),
                ("free", float(max(Fraction(0), nominal - used)), "nominal unused (lendable)")]}}


def _row(q: Queue, depth: int, st: dict, amounts: dict, lent: dict, shares: Shares, ranks: dict,
         preempted: int) -> dict:
    pending = ResourceClaim.objects.filter(phase=Phase.PENDING).filter(
        claims_of_queue_q(q.name, q.spec.get("namespaces") or []))
    per_class = _pending_per_class(pending)
    resources, hidden = [], 0
    for key in sorted(amounts, key=lambda k: (k[0], k[1] != "devices", k[1], k[2])):
        nominal, used = amounts[key]
        if key[1] != "devices" and not nominal:
            hidden += 1  # usage of a counter or capacity the queue has no quota for: summed up below
            continue
        res = _resource(key, nominal, used, lent.get(key, Fraction(0)))
        res["pending"] = per_class.pop(key[0], 0) if key[1] == "devices" else None
        resources.append(res)
    for cls, n in sorted(per_class.items()):  # classes with claims waiting but no quota or use yet
        resources.append({**_resource((cls, "devices", ""), Fraction(0), Fraction(0), Fraction(0)), "pending": n})
    oldest = pending.aggregate(oldest=Min("created_at"))["oldest"]
    return {"queue": q, "depth": depth, "indent": depth * 18, "resources": resources, "hidden": hidden,
            "pending": st["pendingClaims"], "oldest": oldest, "share": float(shares.dominant(q.id)),
            "weight": q.weight, "rank": ranks.get(q.id), "preempted": preempted,
            "head": _head(pending, q.name) if st["pendingClaims"] else None}


def _pending_per_class(pending) -> dict[str, int]:
    counts: Counter = Counter()
    for spec in pending.order_by("id").values_list("spec", flat=True)[:PENDING_SAMPLE]:
        classes = set()
        for req in ((spec or {}).get("devices") or {}).get("requests") or []:
            body: dict = req.get("exactly") or next(iter(req.get("firstAvailable") or []), {})
            if body.get("deviceClassName"):
                classes.add(body["deviceClassName"])
        counts.update(classes)
    return dict(counts)


def _head(pending, queue: str) -> dict | None:
    """The claim first in the queue's order, with its start estimate (the claim page's figures)."""
    claims = list(pending.select_related("namespace").order_by("created_at", "id")[:HEAD_SAMPLE])
    fields = queue_fields(claims)
    mine = [c for c in claims if (fields.get(c.id) or {}).get("name") == queue]
    if not mine:
        return None
    claim = min(mine, key=lambda c: (fields[c.id]["position"] or 10**9, c.id))
    return {"claim": claim, **fields[claim.id]}


def queue_fields(claims: list[ResourceClaim]) -> dict[int, dict]:
    """claim id -> its queue (``name``), and for a pending claim its ``position`` in the queue and the
    start-time estimate (``eta``: seconds from now, ``when``, ``message``), as the claim's REST status says."""
    now = timezone.now()
    out = {}
    for claim_id, found in (queue_order.positions(claims, True) if claims else {}).items():
        estimate = found.get("estimate") or {}
        when = (datetime.strptime(found["estimatedStartTime"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
                if found.get("estimatedStartTime") else None)
        out[claim_id] = {"name": found.get("queue"), "position": found.get("positionInQueue"), "when": when,
                         "eta": max(0.0, (when - now).total_seconds()) if when else None,
                         "message": estimate.get("message", ""), "reason": estimate.get("reason", "")}
    return out


def reservation_page(name: str, show_history: bool) -> dict | None:
    """A reservation's page: the object as the API renders it (its status: conditions, what it holds, its use)
    and, for admins, its newest changes. None: no such reservation."""
    r = Reservation.objects.filter(name=name).first()
    if r is None:
        return None
    obj = reservations.rendered(r)
    return {"r": r, "status": obj["status"], "yaml": yaml.safe_dump(obj, sort_keys=False, width=120),
            "changes": audit.events(reservation_spec.KIND, name) if show_history else []}


def reservation_timeline(days: int) -> dict:
    """Each reservation's occurrences from now to ``days`` ahead as bars (left and width in % of the span),
    with its held nodes and utilisation; the hour ticks of the axis."""
    now = timezone.now().replace(second=0, microsecond=0)
    until = now + timedelta(days=days)
    span = (until - now).total_seconds()
    items = list(Reservation.objects.order_by("name"))
    used = reservations.in_use([r.name for r in items])
    rows = []
    for r in items:
        bars = []
        for occ in windows.occurrences(reservation_spec.parsed_window(r.spec), now, until):
            left = max(0.0, (occ.start - now).total_seconds() / span * 100)
            right = min(100.0, (occ.end - now).total_seconds() / span * 100)
            bars.append({"left": round(left, 3), "width": round(max(0.2, right - left), 3),
                         "start": occ.start, "end": occ.end, "now": occ.start <= now < occ.end})
        rows.append({"r": r, "bars": bars, "status": reservations.status(r, now, used)})
    ticks = [{"left": round(d * 100 / days, 3), "at": now + timedelta(days=d)} for d in range(days)]
    return {"rows": rows, "days": days, "ticks": ticks, "since": now, "until": until}
