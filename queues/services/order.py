"""The order in which pending claims are tried, and a claim's place in its queue.

Inside a queue: claim priority (label ``draservice.io/priority``, capped by the queue's ``maxPriority``), then
age. Among queues: a queue whose next group fits within its nominal quota before one whose next group would
borrow (Kueue's first rule: "request under nominal quota before borrowing"), then dominant-resource fair share
of what each borrows beyond its nominal quota, divided by its ``weight`` (lowest first), then queue
``priority`` (highest first). Without the first rule, what a reclaim freed for a claim within its nominal went
back to the borrower whenever both queues ranked alike (the borrower back at its nominal: share 0 each), the
borrower borrowed again, was reclaimed again, and so on for ever. The round interleaves queues by that rule,
charging each group's requested devices to its queue as it goes, so a heavier-weighted queue gets
proportionally more of the surplus in every round.
"""
from __future__ import annotations

import heapq
from collections import defaultdict
from fractions import Fraction

from claims.models import Phase, ResourceClaim
from queues import fair_share
from queues import spec as queue_spec
from queues.services import estimate, position
from queues.services import usage as u
from queues.services.resolve import Tree, effective_priority, queue_of
from usage.services import decay


class Shares:
    """Each queue's dominant share of what it borrows (use beyond nominal, over the fleet's use or quota)."""

    def __init__(self, tree: Tree, usage: u.Usage, decayed: dict[str, float] | None = None) -> None:
        self.tree = tree
        self.used: dict[tuple[int, str], Fraction] = defaultdict(Fraction)  # (queue, class) -> devices
        for (qid, cls, unit, _res, _cluster), amount in usage.items():
            if unit == "devices":
                self.used[(qid, cls)] += amount
        self.nominal: dict[tuple[int, str], Fraction] = {}
        for q in tree.queues.values():
            for entry in q.spec.get("quotas") or []:
                nominal = (entry.get("devices") or {}).get("nominal")
                if nominal is not None:
                    key = (q.id, entry["deviceClassName"])
                    self.nominal[key] = self.nominal.get(key, Fraction(0)) + Fraction(queue_spec.amount_of(nominal))
        self.total: dict[str, Fraction] = defaultdict(Fraction)
        for (_, cls), amount in list(self.used.items()) + list(self.nominal.items()):
            self.total[cls] += amount
        # Decayed usage (device-seconds) by queue name: read only when a queue remembers its past use (a replay
        # brings its own, kept on its virtual clock).
        remembering = any(queue_spec.half_life(q.spec) for q in tree.queues.values())
        self.decayed: dict[str, float] = decayed if decayed is not None else decay.read() if remembering else {}

    def add(self, qid: int, cls: str, n: int) -> None:
        self.used[(qid, cls)] += n
        self.total[cls] += n

    def borrows(self, qid: int, wants) -> bool:
        """Whether ``wants`` ((class, devices) pairs) takes queue ``qid`` beyond its nominal of a class."""
        return any(self.used[(qid, cls)] + n > self.nominal.get((qid, cls), Fraction(0)) for cls, n in wants)

    def capacity(self) -> float:
        """``C``, what a queue's past use is measured against (``queues.fair_share``): the devices the dominant
        shares are parts of (every class's use and nominal quota), summed over the classes as the decayed usage
        sums device-seconds over them; at least 1."""
        return float(max(sum(self.total.values(), Fraction(0)), Fraction(1)))

    def ranked(self, queue) -> Fraction | float:
        """What the queues are ordered by (lowest first): the dominant share over the weight, or with a
        half-life the effective share that mixes in past use (``queues.fair_share``)."""
        weight = Fraction(queue.weight).limit_denominator(1000)
        half_life = queue_spec.half_life(queue.spec)
        if not half_life:
            return self.dominant(queue.id) / weight
        history = fair_share.history_share([(self.decayed.get(queue.name, 0.0), float(half_life))], self.capacity())
        return fair_share.effective_share(float(self.dominant(queue.id)), history, float(weight))

    def dominant(self, qid: int) -> Fraction:
        best = Fraction(0)
        for (q, cls), used in self.used.items():
            if q != qid:
                continue
            borrowed = used - self.nominal.get((q, cls), Fraction(0))
            if borrowed > 0:
                best = max(best, borrowed / max(self.total[cls], Fraction(1)))
        return best


def order(groups: list) -> list:
    """The claims round's groups in queue order (see the module docstring)."""
    tree = Tree.load()
    fill_labels([c for g in groups for c in g.claims])
    per_queue: dict[str, list] = defaultdict(list)
    by_quota: dict[str, bool] = {}  # per queue name: a round has hundreds of groups and a handful of queues
    for g in groups:
        first = g.claims[0]
        name = queue_of(first, first.namespace.name, tree)
        queue = tree.queues.get(name)
        if name not in by_quota:
            by_quota[name] = any(q.spec.get("quotas") for q in tree.chain(name))
        g.by_quota = by_quota[name]
        prio = max(effective_priority(c, queue) for c in g.claims)
        per_queue[name].append((-prio, min(c.created_at for c in g.claims), first.id, g))
    if len(per_queue) == 1:
        return [item[-1] for item in sorted(next(iter(per_queue.values())), key=lambda t: t[:3])]
    shares = Shares(tree, u.load())
    heap = []
    for name, items in per_queue.items():
        items.sort(key=lambda t: t[:3])
        heap.append(_rank(tree, shares, name, _wants(items[0][-1])) + (name,))
    heapq.heapify(heap)
    out, pos = [], dict.fromkeys(per_queue, 0)
    while heap:
        name = heapq.heappop(heap)[-1]
        group = per_queue[name][pos[name]][-1]
        pos[name] += 1
        out.append(group)
        queue = tree.queues.get(name)
        if queue is not None:
            for cls, n in _wants(group):
                shares.add(queue.id, cls, n)
        if pos[name] < len(per_queue[name]):
            heapq.heappush(heap, _rank(tree, shares, name, _wants(per_queue[name][pos[name]][-1])) + (name,))
    return out


def fill_labels(claims: list) -> None:
    """Claims loaded without ``labels`` (a caller that deferred them) get them in one query for all rather
    than one query each on first access. The same objects go on to admission."""
    missing = [c for c in claims if "labels" in c.get_deferred_fields()]
    if missing:
        labels = dict(ResourceClaim.objects.filter(id__in=[c.id for c in missing]).values_list("id", "labels"))
        for c in missing:
            c.labels = labels.get(c.id) or {}


def _wants(group) -> list[tuple[str, int]]:
    return [r for c in group.claims for r in u.requested_devices(c.spec)]


def _rank(tree: Tree, shares: Shares, name: str, wants=()) -> tuple:
    """A queue's place among queues, for its next group, which asks for ``wants`` ((class, devices) pairs)."""
    queue = tree.queues.get(name)
    if queue is None:
        return (False, Fraction(0), 0)
    return (shares.borrows(queue.id, wants), shares.ranked(queue), -queue.priority)


def fair_share_ranks(queues: list, shares: Shares) -> dict[int, int]:
    """Queue id -> 1-based rank among ``queues`` in the fair-share order (1 = served first): the lowest share
    (``Shares.ranked``), then the highest queue priority, then the name."""
    def key(q):
        return (shares.ranked(q), -q.priority, q.name)

    return {q.id: i for i, q in enumerate(sorted(queues, key=key), start=1)}


def positions(claims: list, with_estimate: bool = False, with_position: bool = True,
              stamp: str | None = None) -> dict[int, dict]:
    """claim id -> queue status fields: ``queue``, and for pending claims, ``with_position``,
    ``positionInQueue`` (1-based) and, ``with_estimate``, the start-time estimate
    (``queues.services.estimate``). ``stamp``: the fleet state's stamp read before (``Tree.at``)."""
    tree = Tree.at(stamp) if stamp else Tree.load()
    out: dict[int, dict] = {}
    wanted: dict[str, list] = defaultdict(list)
    for c in claims:
        name = queue_of(c, c.namespace.name, tree)
        out[c.id] = {"queue": name}
        if c.phase == Phase.PENDING and (with_position or with_estimate):
            wanted[name].append(c)
    ahead: dict[int, int] = {}
    queues_of: dict[int, str] = {}
    for name, mine in wanted.items():
        for claim_id, (place, before) in position.ranked(name, tree, mine, demand=with_estimate).items():
            out[claim_id]["positionInQueue"] = place
            ahead[claim_id] = before
            queues_of[claim_id] = name
    pending = [c for group in wanted.values() for c in group if c.id in ahead] if with_estimate else []
    for claim_id, fields in estimate.estimates(pending, queues_of, ahead, tree).items():
        out[claim_id].update(fields)
    return out
