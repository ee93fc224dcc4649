"""One preemption pass (``queues.tasks.preempt``): requeue victims whose deadline passed, then one decision for
all the claims and gangs waiting for room (``scheduler.services.preemption``, ``gang_preemption``).

The preemptors are found per queue, heads first, taken in turns between queues (never a fixed window of the
fleet's oldest claims: another tenant's old claims that nothing can satisfy once took every place of it and
switched preemption off for everyone). They are decided one after the other on one engine: the victims of the
earlier ones stay freed and their preemptors placed, so each victim serves one preemptor. A claim is not decided
again while its notices run, nor after its victims were requeued until a claims round has tried it again (it
was decided again before that, and took as many victims a second time).
"""
from __future__ import annotations

import time
from collections import defaultdict
from itertools import zip_longest

from django.db import connection
from django.db.models import Exists, F, Min, OuterRef
from django.db.models.expressions import RawSQL
from django.utils import timezone

from claims.models import Phase, ResourceClaim
from claims.services import fleet, wake
from gangs.services import preempted as gang_requeue
from queues.models import Preemption, PreemptionState
from queues.services import owed as debts
from queues.services.position import PRIORITY_SQL
from queues.services.resolve import Tree, claims_of_queue_q, effective_priority, queue_of
from queues.services.usage import requested_devices
from scheduler.services import gang_preemption, preemption, queue_holds, recheck
from scheduler.services.preemption import CAPACITY_REASONS

# Deciding for one waiting claim reads the allocated claims of its class (on a large fleet, many rows) and runs
# the engine; the pass runs periodically on the allocation workers. Past this much time the rest waits for the
# next pass (heads first, so the queue order holds): without the bound a busy fleet can keep the only worker in
# preemption passes with no allocation round in between (benchmarks/soak_bench.py shows it).
PASS_SECONDS = 1.0


def run(limit: int = 20, budget: float = PASS_SECONDS) -> dict:
    """One pass: requeue victims whose deadline passed; decide for up to ``limit`` waiting claims of each
    queue, for at most ``budget`` seconds."""
    out = {"requeued": preemption.sweep(), "preemptions": 0, "victims": 0, "seconds": 0.0,
           "cancelled": recheck.run()}
    started = time.perf_counter()
    waiting = set(Preemption.objects.filter(state=PreemptionState.PENDING).values_list("preemptor_id", flat=True))
    tree = Tree.load()
    decided = 0
    hopeless: dict = {}  # see preemption.choose_victims
    kept: list = []  # see preemption.confirm_with_engine
    # One engine for the whole pass, not brought up to date again before ``restore``: a release another worker
    # committed meanwhile, applied to it while a preemptor is kept on the released device, was undone by the
    # restore (it gives the victim its device back), and the worker's engine then saw that device in use for
    # as long as it lived: a free GPU nobody was placed on, claims of both queues waiting beside it.
    engine = recheck.cached_engine(fleet.current_view())
    try:
        # The room notices free is their preemptors', not this pass's, nor the room requeued victims freed
        # for preemptors no round has tried since (``queues.services.owed``).
        promised = recheck.place_running(kept, engine=engine)
        coming = _coming(tree, (waiting - {None}) | promised | debts.preemptor_ids(timezone.now()))
        for claim in preemptors(tree, waiting, limit):
            if claim.id in promised:
                continue
            if decided and time.perf_counter() - started > budget:  # at least one per pass: a head moves on
                out["deferred"] = out.get("deferred", 0) + 1
                continue
            decided += 1
            before = len(kept)
            victims = preemption.choose_victims(claim, tree, coming, hopeless, kept, engine)
            if victims:
                out["preemptions"] += 1
                marked = preemption.mark(claim, victims, tree)
                out["victims"] += marked
                if marked and len(kept) > before:
                    queue_holds.hold_for_preemptor(claim, queue_of(claim, claim.namespace.name, tree),
                                                   kept[-1].where)
            elif len(kept) > before:  # it fits on what this pass frees for others: the next round tries it
                wake.wake_claims([claim.id])
            if len(kept) > before or victims:
                for cls, n in requested_devices(claim.spec):
                    coming[(queue_of(claim, claim.namespace.name, tree), cls)] += n
    finally:
        preemption.restore(kept)
    for gang, first, victims in gang_preemption.choose_for_waiting_gangs(tree, waiting, coming):
        out["preemptions"] += 1
        out["victims"] += preemption.mark(first, victims, tree, label=f"gang {gang.namespace.name}/{gang.name}")
    out["seconds"] = time.perf_counter() - started
    if out["victims"]:
        out["requeued"] += preemption.sweep()  # grace 0: released at once
    if out["requeued"]:
        out["gangs_requeued"] = gang_requeue.requeue_preempted()  # a gang all of whose members were requeued
    return out


def _coming(tree: Tree, ids: set) -> dict[tuple[str, str], int]:
    """(queue, class) -> devices being reclaimed for the pending claims ``ids`` (notices running, or victims
    requeued and the claim not placed yet): counted as their queues' use, so two waiting claims of one queue
    do not both reclaim against the same idle nominal, and a queue's share counts what it is about to get."""
    coming: dict[tuple[str, str], int] = defaultdict(int)
    for p in ResourceClaim.objects.filter(id__in=ids, phase=Phase.PENDING).select_related("namespace"):
        for cls, n in requested_devices(p.spec):
            coming[(queue_of(p, p.namespace.name, tree), cls)] += n
    return coming


def next_deadline():
    """The earliest deadline of the notices that run, or None."""
    return Preemption.objects.filter(state=PreemptionState.PENDING).aggregate(at=Min("deadline"))["at"]


def preemptors(tree: Tree, waiting: set, limit: int) -> list[ResourceClaim]:
    """Up to ``limit`` waiting claims of each leaf queue in its order (priority, then age), in turns between the
    queues: every queue's head first, then every queue's second, and so on. Left out: claims whose notices run
    (``waiting``) and claims whose victims were requeued after the claims round last tried them."""
    requeued_since = Preemption.objects.filter(preemptor_id=OuterRef("pk"), state=PreemptionState.DONE,
                                               finished_at__gte=OuterRef("last_attempt_at"))
    pending = (ResourceClaim.objects.filter(phase=Phase.PENDING, reason__in=CAPACITY_REASONS)
               .exclude(id__in=waiting - {None}).exclude(Exists(requeued_since)).select_related("namespace"))
    per_queue = []
    for name, queue in sorted(tree.queues.items()):
        if not tree.is_leaf(name):
            continue
        mine = pending.filter(claims_of_queue_q(name, queue.spec.get("namespaces") or []))
        if connection.vendor == "postgresql":
            ordered = mine.order_by(RawSQL(PRIORITY_SQL, [queue.max_priority]).desc(), F("created_at").asc(), "id")
            rows = list(ordered[:limit])
        else:  # the priority label read in Python (the SQL above is PostgreSQL's)
            rows = sorted(mine, key=lambda c: (-effective_priority(c, queue), c.created_at, c.id))[:limit]
        rows = [c for c in rows if queue_of(c, c.namespace.name, tree) == name]
        if rows:
            per_queue.append(rows)
    return [c for turn in zip_longest(*per_queue) for c in turn if c is not None]
