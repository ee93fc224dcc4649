"""``POST /api/v1/simulate`` against the stored fleet, the cycle's way: after the engine, queue admission.

The claims round places a claim with the engine and then admits it to its queue's quota at commit
(``scheduler.services.admit``); simulate did only the first half and answered "allocated on g2" for a claim the
worker then left ``WaitingForQuota``. Here the same admission runs on a copy (``queues.services.admission
.dry_admit``: no lock, nothing charged), and for a claim that would wait -- refused by quota, or no room --
the answer says where it would wait: its queue, its position (behind every pending claim of its queue of no
lower priority), the estimated start (``queues.services.estimate``) and the claims the preemption pass would
notice for it (the reclaim victim selection on a throw-away engine, nothing marked).
"""
from __future__ import annotations

from django.utils import timezone

from claims.models import Namespace, Phase, ResourceClaim
from claims.services import commit, fleet, queueing
from queues.services import admission, estimate, position
from queues.services.resolve import Tree, effective_priority, queue_of
from scheduler.services import preemption

# The answer's reasons for a claim that would wait (the engine's for no room is lower case), and the reason the
# round would give it (the pass reclaims for these).
WAITING = {"unsatisfiable": "Unsatisfiable", queueing.WAITING_FOR_QUOTA.lower(): queueing.WAITING_FOR_QUOTA}


def with_queues(claims: list[dict], answer: dict) -> dict:
    """``answer`` (simulate's body for the normalized ``claims``, engine only) with the queue's verdict:
    ``allocated`` false and the verdict's reason when quota refuses, and a ``queue`` object."""
    if not claims:
        return answer
    view = fleet.current_view()
    tree = Tree.load()
    rows = [_row(c) for c in claims]
    name = queue_of(rows[0], rows[0].namespace.name, tree)
    queue: dict = {"name": name}
    answer = {**answer, "queue": queue}
    if answer.get("allocated"):
        allocations = [c.get("allocation") for c in answer.get("claims") or []]
        unit = commit.Unit([commit.Placement(rows, allocations, answer.get("cluster") or "", answer.get("node") or "")])
        verdict = admission.dry_admit(unit, view, timezone.now(), tree)
        queue["admitted"] = verdict.reason == queueing.ADMITTED
        if queue["admitted"]:
            return answer
        answer.update(allocated=False, cluster=None, node=None, reason=verdict.reason, message=verdict.message,
                      claims=[{**c, "allocation": None} for c in answer.get("claims") or []])
    reason = WAITING.get(str(answer.get("reason") or "").lower())
    if reason is None or name not in tree.queues:
        return answer
    for row in rows:
        row.reason = reason
    queue.update(_waiting(rows[0], name, tree, view))
    return answer


def _waiting(claim: ResourceClaim, name: str, tree: Tree, view) -> dict:
    """Position, estimate and would-be preemptions of one claim that would wait in queue ``name``."""
    from dra.engine import Engine

    place, ahead = position.place_of_new(name, tree, effective_priority(claim, tree.queues.get(name)))
    out: dict = {"position": place}
    out.update(estimate.estimates([claim], {claim.id: name}, {claim.id: ahead}, tree).get(claim.id, {}))
    engine = Engine(view.snapshot, list(fleet.rows_in_use().values()))  # a copy: web threads share nothing
    victims = preemption.choose_victims(claim, tree, engine=engine)
    out["preemptions"] = [{"namespace": v.namespace.name, "name": v.name}
                          for v in ResourceClaim.objects.filter(id__in=[v.id for v in victims])
                          .select_related("namespace").order_by("id")]
    return out


def _row(obj: dict) -> ResourceClaim:
    """An unsaved claim for a simulated one (id 0): what queue resolution, admission and the engine read."""
    meta = obj.get("metadata") or {}
    ns_name = meta.get("namespace") or "default"
    namespace = Namespace.objects.filter(name=ns_name).first() or Namespace(name=ns_name)
    return ResourceClaim(id=0, namespace=namespace, name=meta.get("name") or "", labels=meta.get("labels") or {},
                         annotations=meta.get("annotations") or {}, spec=obj.get("spec") or {},
                         phase=Phase.PENDING, created_at=timezone.now())
