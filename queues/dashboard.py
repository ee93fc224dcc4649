"""The dashboard's Queues page: the tree, per class and unit the nominal quota, what is in use (within nominal
and borrowed), pending claims with the oldest wait, the dominant share against the weight, preemptions."""
from __future__ import annotations

from collections import defaultdict
from fractions import Fraction

from django.db.models import Count, Min

from claims.models import Phase, ResourceClaim
from queues import spec as queue_spec
from queues.models import Preemption, Queue
from queues.services import status, usage
from queues.services.order import Shares
from queues.services.resolve import Tree, claims_of_queue_q


def queue_rows() -> list[dict]:
    queues = list(Queue.objects.order_by("id"))
    statuses = status.statuses(queues)
    tree = Tree(queues={q.name: q for q in queues}, by_namespace={}, _redirects={})
    shares = Shares(tree, usage.load())
    preempted = dict(Preemption.objects.values_list("queue").annotate(n=Count("id")).values_list("queue", "n"))
    children: dict[int | None, list[Queue]] = defaultdict(list)
    for q in queues:
        children[q.parent_id].append(q)
    rows: list[dict] = []

    def walk(parent_id: int | None, depth: int) -> None:
        for q in sorted(children.get(parent_id, []), key=lambda q: q.name):
            rows.append(_row(q, depth, statuses[q.id], shares, preempted.get(q.name, 0)))
            walk(q.id, depth + 1)

    walk(None, 0)
    return rows


def _row(q: Queue, depth: int, st: dict, shares: Shares, preempted: int) -> dict:
    nominal: dict[tuple, Fraction] = defaultdict(Fraction)
    for entry in q.spec.get("quotas") or []:
        if entry.get("devices"):
            nominal[(entry["deviceClassName"], "devices", "")] += Fraction(
                queue_spec.amount_of(entry["devices"]["nominal"]))
        for unit in ("counters", "capacity"):
            for res, limits in (entry.get(unit) or {}).items():
                nominal[(entry["deviceClassName"], unit, res)] += Fraction(queue_spec.amount_of(limits["nominal"]))
    used = {(u["deviceClassName"], u["unit"], u.get("name", "")): Fraction(u["used"]) for u in st["usage"]}
    resources = []
    for key in sorted(set(nominal) | set(used)):
        n, u = nominal.get(key, Fraction(0)), used.get(key, Fraction(0))
        within, borrowed = min(n, u), max(Fraction(0), u - n)
        total = max(n, u) or Fraction(1)
        resources.append({"class": key[0], "unit": key[1], "name": key[2], "nominal": _num(n), "used": _num(u),
                          "borrowed": _num(borrowed),
                          "tally": {"total": float(total), "segments": [
                              ("alloc", float(within), "in use within nominal"),
                              ("shared", float(borrowed), "borrowed"),
                              ("free", float(max(Fraction(0), n - u)), "nominal unused (lendable)")]}})
    pending = ResourceClaim.objects.filter(phase=Phase.PENDING).filter(
        claims_of_queue_q(q.name, q.spec.get("namespaces") or []))
    oldest = pending.aggregate(oldest=Min("created_at"))["oldest"]
    return {"queue": q, "depth": depth, "indent": depth * 18, "resources": resources,
            "pending": st["pendingClaims"], "oldest": oldest, "share": float(shares.dominant(q.id)),
            "weight": q.weight, "preempted": preempted}


def _num(value: Fraction):
    return value.numerator if value.denominator == 1 else round(float(value), 2)
