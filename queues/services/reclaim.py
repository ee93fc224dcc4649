"""One preemption pass (``queues.tasks.preempt``): requeue victims whose deadline passed, then choose and mark
victims for claims and gangs waiting for room (``queues.services.preemption``, ``gang_preemption``)."""
from __future__ import annotations

import time
from collections import defaultdict

from claims.models import Phase, ResourceClaim
from queues.models import Preemption, PreemptionState
from queues.services import gang_preemption, preemption
from queues.services.preemption import CAPACITY_REASONS
from queues.services.resolve import Tree, queue_of
from queues.services.usage import requested_devices

# Deciding for one waiting claim reads the allocated claims of its class (at 40,000 devices, tens of thousands
# of rows) and runs the engine; the pass runs every 5 s on the allocation workers. Past this much time the rest
# waits for the next pass (oldest first, so the queue order holds): a busy fleet once kept the only worker in
# preemption passes for minutes, with no allocation round in between (benchmarks/soak_bench.py).
PASS_SECONDS = 1.0


def run(limit: int = 20, budget: float = PASS_SECONDS) -> dict:
    """One pass: requeue victims whose deadline passed; decide for up to ``limit`` waiting claims, for at
    most ``budget`` seconds."""
    out = {"requeued": preemption.sweep(), "preemptions": 0, "victims": 0, "seconds": 0.0}
    started = time.perf_counter()
    waiting = set(Preemption.objects.filter(state=PreemptionState.PENDING).values_list("preemptor_id", flat=True))
    candidates = (ResourceClaim.objects.filter(phase=Phase.PENDING, reason__in=CAPACITY_REASONS)
                  .exclude(id__in=waiting).select_related("namespace").order_by("created_at")[:limit])
    tree = Tree.load()
    # Devices already being reclaimed for a queue count as its use: two waiting claims of one queue do not
    # both reclaim against the same idle nominal.
    coming: dict[tuple[str, str], int] = defaultdict(int)
    for p in (ResourceClaim.objects.filter(id__in=waiting - {None}, phase=Phase.PENDING)
              .select_related("namespace")):
        for cls, n in requested_devices(p.spec):
            coming[(queue_of(p, p.namespace.name, tree), cls)] += n
    decided = 0
    hopeless: dict = {}  # see preemption.choose_victims
    for claim in candidates:
        if decided and time.perf_counter() - started > budget:  # at least one per pass: the oldest moves on
            out["deferred"] = out.get("deferred", 0) + 1
            continue
        decided += 1
        victims = preemption.choose_victims(claim, tree, coming, hopeless)
        if victims:
            out["preemptions"] += 1
            out["victims"] += preemption.mark(claim, victims, tree)
            for cls, n in requested_devices(claim.spec):
                coming[(queue_of(claim, claim.namespace.name, tree), cls)] += n
    for gang, first, victims in gang_preemption.choose_for_waiting_gangs(tree, waiting, coming):
        out["preemptions"] += 1
        out["victims"] += preemption.mark(first, victims, tree, label=f"gang {gang.namespace.name}/{gang.name}")
    out["seconds"] = time.perf_counter() - started
    if out["victims"]:
        out["requeued"] += preemption.sweep()  # grace 0: released at once
    return out
