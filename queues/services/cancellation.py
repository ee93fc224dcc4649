"""Cancelling preemption notices that are no longer needed (issue 30, "Re-check").

A notice runs from its victim's marking to the move of its devices (``scheduler.services.preemption``). It is
withdrawn when its preemptor no longer needs those devices: the preemptor was allocated (on room freed
elsewhere) or is gone (released or deleted) -- in the transaction that allocates or releases it -- or the
scheduler's re-check found room for it without this victim (``scheduler.services.recheck``). The victim keeps its
devices: ``Preempted=False``, reason ``PreemptionCancelled``, an event, no ``Releasing``
(``claims.services.preemption.unmark``), and its queue's webhook gets a ``preemption.cancelled`` delivery. The
notice row ends ``PreemptionCancelled``, ``finished_at`` set (``draservice_preemption_cancelled``).
"""
from __future__ import annotations

from django.db.models import Q
from django.utils import timezone

from claims.models import Phase, ResourceClaim
from claims.services import preemption as claim_preemption
from queues import queues_sql
from queues.models import Preemption, PreemptionState, Queue
from queues.services import webhooks

# A claim's gang, through its consumer's gang membership (the gangs app's models, read by relation name: queues
# does not import gangs).
GANG_ID = "reservations__consumer__gang_member__gang_id"


def cancel(notices: list[Preemption], victims: dict[int, ResourceClaim], why: str, now) -> list[Preemption]:
    """Cancel pending ``notices`` whose victims the caller has locked (``victims``: by id; a notice whose victim
    is not there is left as it is, and so are the notices of a gang not all of whose running notices can be
    cancelled: a gang is preempted whole or not at all). Returns the notices it cancelled."""
    live = whole_gangs([p for p in notices
                        if p.victim_id in victims and victims[p.victim_id].phase == Phase.ALLOCATED])
    if not live:
        return []
    done = Preemption.objects.filter(id__in=[p.id for p in live], state=PreemptionState.PENDING).update(
        state=PreemptionState.CANCELLED, finished_at=now)
    if done != len(live):  # another transaction finished some meanwhile: cancel only what this one did
        ids = set(Preemption.objects.filter(id__in=[p.id for p in live], state=PreemptionState.CANCELLED,
                                            finished_at=now).values_list("id", flat=True))
        live = [p for p in live if p.id in ids]
    for p in live:
        p.victim = victims[p.victim_id]
    claim_preemption.unmark([p.victim for p in live], f"preemption cancelled: {why}; the claim keeps its devices",
                            now)
    queues = {q.name: q for q in Queue.objects.filter(name__in={p.queue for p in live})}
    webhooks.notify(live, queues, event=webhooks.CANCELLED)
    return live


def gangs_of(claim_ids) -> dict[int, int]:
    """Claim id -> the id of the gang it is a member of, for those that are (``scheduler.services.gang_victims``
    reads membership the same way)."""
    return {cid: g for cid, g in ResourceClaim.objects.filter(id__in=list(claim_ids)).values_list("id", GANG_ID)
            if g is not None}


def whole_gangs(notices: list[Preemption]) -> list[Preemption]:
    """``notices`` without those of a gang that would not be given back whole: one of its members is no longer
    allocated (requeued already: the gang is stopped) or has no notice among them."""
    gang_of = gangs_of(p.victim_id for p in notices)
    if not gang_of:
        return notices
    have = {p.victim_id for p in notices}
    broken = set()
    for cid, phase, g in (ResourceClaim.objects.filter(**{f"{GANG_ID}__in": set(gang_of.values())})
                          .values_list("id", "phase", GANG_ID)):
        if phase != Phase.ALLOCATED or cid not in have:
            broken.add(g)
    return [p for p in notices if gang_of.get(p.victim_id) not in broken]


def pending_of(preemptor_ids) -> list[Preemption]:
    """The running notices of these preemptors whose victims still hold their devices."""
    ids = list(preemptor_ids)
    if not ids or not queues_sql.any_pending_preemption(ids):
        return []
    return list(Preemption.objects.filter(state=PreemptionState.PENDING, preemptor_id__in=ids,
                                          victim__phase=Phase.ALLOCATED)
                .select_related("preemptor__namespace").order_by("id"))


def for_preemptors(claims: list[ResourceClaim], why: str, now=None) -> int:
    """In the caller's transaction (the one that allocates or releases ``claims``): cancel the notices these
    preemptors gave. Victims another transaction holds locked are skipped (no lock-order deadlock with a pass
    marking or moving them); the next pass's re-check cancels them."""
    if not claims:
        return 0
    notices = pending_of(c.id for c in claims)
    if not notices:
        return 0
    now = now or timezone.now()
    ids = sorted({p.victim_id for p in notices})
    locked = {v.id: v for v in ResourceClaim.objects.select_for_update(of=("self",), skip_locked=True)
              .select_related("namespace").filter(id__in=ids).order_by("id")}
    total = 0
    for pid in sorted({p.preemptor_id for p in notices if p.preemptor_id is not None}):
        mine = [p for p in notices if p.preemptor_id == pid]
        who = mine[0].preemptor
        name = f"{who.namespace.name}/{who.name} " if who is not None else ""
        total += len(cancel(mine, locked, f"its preemptor {name}{why}", now))
    return total


def orphans() -> Q:
    """Running notices whose preemptor row was deleted (the foreign key set to null)."""
    return Q(state=PreemptionState.PENDING, preemptor__isnull=True, victim__phase=Phase.ALLOCATED)
