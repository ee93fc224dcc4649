"""A queue's status: what it uses per class and unit (beyond nominal: borrowed), and its pending claims."""
from __future__ import annotations

from collections import defaultdict
from fractions import Fraction

from claims.models import Phase, ResourceClaim
from queues import spec as queue_spec
from queues.models import Queue
from queues.services import usage as u
from queues.services.order import Shares, fair_share_ranks
from queues.services.resolve import Tree, claims_of_queue_q


def statuses(queues: list[Queue]) -> dict[int, dict]:
    usage = u.load()
    tree = Tree.load()
    shares = Shares(tree, usage)
    ranks = fair_share_ranks(list(tree.queues.values()), shares)
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
                     "pendingClaims": _pending(q), "fairSharing": _fair_sharing(q, shares, ranks)}
    return out


def _fair_sharing(q: Queue, shares: Shares, ranks: dict[int, int]) -> dict:
    """Decayed usage in device-hours (0 without a half-life) and the queue's rank in the fair-share order."""
    remembered = shares.decayed.get(q.name, 0.0) if queue_spec.half_life(q.spec) else 0.0
    return {"decayedUsage": round(remembered / 3600, 6), "rank": ranks.get(q.id)}


def queue_status(queue: Queue) -> dict:
    return statuses(list(Queue.objects.order_by("id")))[queue.id]


def _pending(queue: Queue) -> int:
    return ResourceClaim.objects.filter(phase=Phase.PENDING).filter(
        claims_of_queue_q(queue.name, queue.spec.get("namespaces") or [])).count()


def _fmt(value: Fraction):
    return value.numerator if value.denominator == 1 else str(float(value))
