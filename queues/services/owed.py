"""Quota owed to preemptors: what a reclaim freed belongs to the claim it was freed for until a round tries it.

A victim's requeue deletes its charge (its queue's use drops) in the sweep's transaction; its preemptor is
placed by the next claims round. In between, the freed quota looked idle: a borrower decided in that gap (often
the victim itself, requeued at its original place, older than the preemptor) was admitted on it, the preemptor
found its nominal taken again, and the preemption pass took a second set of victims for it -- a reclaim of 4
preempted 6. Kueue avoids the gap by admitting in one serial cycle; here rounds and passes run on several
workers, so the debt is written down instead: a pending preemptor whose victims were requeued after a round last
tried it (the same test ``scheduler.services.reclaim.preemptors`` uses to leave it out of the pass) counts its
requested devices as its queue's use, for admission (``queues.services.admission``) and for the next pass's
``coming``. Once a round has tried it, placed or not, the debt ends: a preemptor its selectors no longer place
does not keep its queue's nominal from borrowers.

Only whole devices are owed (counters and capacity are known once placed), and only to quota entries without a
``clusterSelector`` (the preemptor's cluster is not known before it is placed).
"""
from __future__ import annotations

from datetime import timedelta
from typing import NamedTuple

from django.db.models import F, Q

from claims.models import Phase, ResourceClaim
from queues.models import Preemption, PreemptionState
from queues.services.resolve import Tree, queue_of
from queues.services.usage import requested_devices

# A preemptor a round has not tried within this long after its victims' requeue (rounds take woken claims
# within a second) stops being owed: the bound keeps the read to the recent notices (an index range).
WINDOW = timedelta(minutes=2)


class Owed(NamedTuple):
    claim_id: int
    queue_id: int
    queue: str
    device_class: str
    devices: int


def preemptor_ids(now) -> set[int]:
    """Pending preemptors whose victims were requeued since a round last tried them (or never tried)."""
    rows = (Preemption.objects.filter(state=PreemptionState.DONE, finished_at__gte=now - WINDOW,
                                      preemptor__phase=Phase.PENDING)
            .filter(Q(preemptor__last_attempt_at__isnull=True) | Q(finished_at__gte=F("preemptor__last_attempt_at")))
            .values_list("preemptor_id", flat=True).distinct())
    return set(rows)


def owed(tree: Tree, now, ids: set[int] | None = None) -> list[Owed]:
    """What each such preemptor (``ids``, default ``preemptor_ids(now)``) is owed, by its leaf queue and class."""
    ids = preemptor_ids(now) if ids is None else ids
    if not ids:
        return []
    out = []
    for claim in (ResourceClaim.objects.filter(id__in=ids).select_related("namespace")
                  .only("id", "spec", "labels", "created_at", "namespace__name")):
        name = queue_of(claim, claim.namespace.name, tree)
        queue = tree.queues.get(name)
        if queue is None:
            continue
        for cls, n in requested_devices(claim.spec):
            out.append(Owed(claim.id, queue.id, name, cls, n))
    return out
