"""A queue's status: what it uses per class and unit (beyond nominal: borrowed), and its pending claims."""
from __future__ import annotations

from collections import defaultdict
from fractions import Fraction

from claims.models import Phase, ResourceClaim
from queues.models import Queue
from queues.services import usage as u
from queues.services.resolve import claims_of_queue_q


def statuses(queues: list[Queue]) -> dict[int, dict]:
    usage = u.load()
    by_queue: dict[int, dict] = defaultdict(lambda: defaultdict(Fraction))
    children: dict[int | None, list[int]] = defaultdict(list)
    for q in queues:
        children[q.parent_id].append(q.id)
    for (qid, cls, unit, res, _cluster), amount in usage.items():
        by_queue[qid][(cls, unit, res)] += amount
    out = {}
    for q in queues:
        ids, todo = set(), [q.id]
        while todo:
            i = todo.pop()
            ids.add(i)
            todo.extend(children.get(i, ()))
        used: dict = defaultdict(Fraction)
        for i in ids:
            for key, amount in by_queue.get(i, {}).items():
                used[key] += amount
        out[q.id] = {"usage": [{"deviceClassName": cls, "unit": unit, **({"name": res} if res else {}),
                                "used": _fmt(amount)} for (cls, unit, res), amount in sorted(used.items())],
                     "pendingClaims": _pending(q)}
    return out


def queue_status(queue: Queue) -> dict:
    return statuses(list(Queue.objects.order_by("id")))[queue.id]


def _pending(queue: Queue) -> int:
    return ResourceClaim.objects.filter(phase=Phase.PENDING).filter(
        claims_of_queue_q(queue.name, queue.spec.get("namespaces") or [])).count()


def _fmt(value: Fraction):
    return value.numerator if value.denominator == 1 else str(float(value))
