"""The round's wake-up step: each freed device wakes the first pending claims it can serve, in the scheduler's order.

A release leaves one ``ReleasedDevice`` row per freed device (``claims.services.wake.offer``; preemption's
device moves free theirs the same way, through ``claims.services.claims.free_devices``). Before taking its
batch, a round (``wake_for_released``) locks a few of those rows (``SKIP LOCKED``: concurrent workers offer
different devices) and, for each device still free:

* reads the candidates: pending claims whose wake counters say a release in the device's cluster could help
  (``claims.services.wake.candidates``; only a bounded window per queue partition leaves the database);
* orders them as the round would (``queues.services.order``: queue fair share, priority, age);
* skips those whose selectors the device fails (its class and request selectors, any alternative; a claim
  whose selectors cannot be evaluated here is not skipped: its decision tells);
* wakes the first ``WAKE_FANOUT`` of the rest, plus the queue head holding the device's node.

The woken claims are taken by the same round. A claim that is not woken is never starved:

* the device's row stays while it is free and the fanout was used up, with the claims it woke: once those
  are decided (placed, or failed and waiting on a fresh mark, which takes them out of the candidates) the
  next round wakes the next ones in order, so a device nobody can use walks the queue ``WAKE_FANOUT`` claims a round;
  the allocation task keeps running rounds while they take claims. The row goes once the device is in use or
  no candidate it serves is left in the window;
* the allocation task ends only after a wake-up step that waited for the rows other workers' steps hold
  (``wait=True``): a step that skipped a row may have been the last to look at it after this task's
  decisions. (Worker B's step locks an offer and reads its woken claims as undecided, so it keeps it for
  later; worker A commits their decisions, its next step skips the row B still holds and takes nothing, and
  both tasks ended: the device stayed free while claims it serves waited, until the beat's round.);
* the periodic backstop (``backstop``, a beat entry in ``scheduler.schedule``) wakes, oldest first, a few
  candidates whose counters were reached but that no device was offered to (beyond the window, or rows
  dropped with their worker), so every such claim is decided again within a bounded time.
"""
from __future__ import annotations

import logging

from django.conf import settings
from django.db import transaction

from claims import claims_sql
from claims.models import ReleasedDevice, ResourceClaim
from claims.placement import claim_group
from claims.services import fleet, wake
from claims.services.engines import session as engine_session
from dra.cel import MAX_SELECTOR_COST, CostBudgetExhausted, CostMeter, metered
from dra.engine.selectors import NO_MATCH
from queues.services import order as queue_order
from queues.services.resolve import PRIORITY_LABEL, QUEUE_LABELS
from scheduler.services.grouping import Group

log = logging.getLogger(__name__)

OFFERS_PER_ROUND = 64  # released devices one batch offers: a round's cost stays bounded after a burst of releases
OFFER_BATCHES = 16  # batches a round reads while none of them wakes anybody
WINDOW_PER_DEVICE = 4  # candidates read per device and fanout slot: room for those its selectors skip
MAX_WINDOW = 512
BACKSTOP_CLAIMS = 100  # candidates the periodic backstop wakes per pass


def fanout() -> int:
    return max(1, int(getattr(settings, "WAKE_FANOUT", 4)))


def wake_for_released(wait: bool = False) -> int:
    """Offer released devices to the claims they can serve (see the module docstring); returns claims woken.
    ``wait``: wait for the offers other workers' wake-up steps hold instead of skipping them (the allocation
    task's last step, so that no offer is left with decisions no step has seen).
    Batches of offers nobody wants are dropped and the next batch read, up to ``OFFER_BATCHES``: a round that
    wakes and takes nothing ends the allocation task, which would leave the offers behind them until the next
    release or the beat's retry. After offers (devices were released since), the releases' counts are folded
    into their counters now and then (``wake.roll_up_soon``), so reading a counter stays cheap."""
    woken, after, offered = 0, 0, False
    for _ in range(OFFER_BATCHES):
        n, last, read = _offer_batch(after, wait)
        woken, offered = woken + n, offered or read
        if woken or last is None:
            break
        after = last
    if offered:
        wake.roll_up_soon()
    return woken


def _offer_batch(after: int, wait: bool = False) -> tuple[int, int | None, bool]:
    """(claims woken, the last offer's id when the batch was full, else None, whether any offer was read) for
    the offers after ``after``. Every step locks in id order, so one that waits deadlocks with no other."""
    with transaction.atomic():
        offers = list(ReleasedDevice.objects.select_for_update(skip_locked=not wait).filter(id__gt=after)
                      .order_by("id")[:OFFERS_PER_ROUND])
        if not offers:
            return 0, None, False
        used = _in_use(offers)
        free = [o for o in offers if (o.cluster, o.driver, o.pool, o.device) not in used]
        # An offer whose last woken claims are not decided yet waits: they may still take the device.
        undecided = wake.undecided([i for o in free for i in o.woken])
        waiting = [o for o in free if undecided.intersection(o.woken)]
        ready = [o for o in free if not undecided.intersection(o.woken)]
        woken, keep = _choose(ready) if ready else ({}, set())
        ReleasedDevice.objects.filter(id__in=[o.id for o in offers if o.id not in keep
                                              and o not in waiting]).delete()
        for o in ready:
            if o.id in keep:
                o.woken = sorted(woken[o.id])
        ReleasedDevice.objects.bulk_update([o for o in ready if o.id in keep], ["woken"])
        n = wake.wake_claims(set().union(*woken.values()) if woken else set())
    return n, (offers[-1].id if len(offers) == OFFERS_PER_ROUND else None), True


def _in_use(offers: list[ReleasedDevice]) -> set[tuple[str, str, str, str]]:
    return claims_sql.allocated_among([(o.cluster, o.driver, o.pool, o.device) for o in offers])


def _choose(free: list[ReleasedDevice]) -> tuple[dict[int, set[int]], set[int]]:
    """(claims to wake per offer, offers to keep: their fanout was used up, so more candidates may want
    them)."""
    n = fanout()
    clusters = sorted({o.cluster for o in free})
    keys = [wake.cluster_key(c) for c in clusters] + [wake.ANY]
    window = min(MAX_WINDOW, WINDOW_PER_DEVICE * n * len(free))
    waiting = wake.candidates(keys, window, QUEUE_LABELS, PRIORITY_LABEL)
    heads = wake.held_heads(clusters)
    wanted = set(waiting) | {h[0] for h in heads}
    if not wanted:
        return {}, set()
    claims = {c.id: c for c in ResourceClaim.objects.filter(id__in=sorted(wanted)).select_related("namespace")
              .defer("diagnostics")}
    groups = [Group(claims=[claims[i]]) for i in sorted(waiting) if i in claims]
    ordered = [g.claims[0] for g in (queue_order.order(groups) if len(groups) > 1 else groups)]
    view = fleet.current_view()
    woken: set[int] = set()
    per_offer: dict[int, set[int]] = {}
    keep: set[int] = set()
    with engine_session() as session:
        engine = session.engine_for(view, fleet.rows_in_use())
        for offer in free:
            device = engine.by_id.get((offer.cluster, offer.driver, offer.pool, offer.device))
            mine: set[int] = set()
            for claim in ordered:
                if len(mine) >= n:
                    break
                if claim.id in woken or not waiting[claim.id] & {wake.cluster_key(offer.cluster), wake.ANY}:
                    continue
                if device is None or _serves(engine, view, claim, device):
                    mine.add(claim.id)
            if len(mine) >= n:
                keep.add(offer.id)
            node = getattr(device, "node_name", None)
            mine |= {cid for cid, cluster, held in heads if cluster == offer.cluster and held == node} - woken
            woken |= mine
            per_offer[offer.id] = mine
    return per_offer, keep


def _serves(engine, view, claim: ResourceClaim, device) -> bool:
    """Whether ``device`` passes the class and request selectors of some request (or alternative) of
    ``claim``, in a cluster it may use. Anything this cannot tell (a CEL error, the cost budget, an unknown
    class) counts as yes: the claim's decision reports it."""
    try:
        cg = claim_group([claim], view.cluster_labels, key=f"claim:{claim.uid}")
        if cg.allowed_clusters is not None and device.cluster not in cg.allowed_clusters:
            return False
        with metered(CostMeter(2 * MAX_SELECTOR_COST)):
            plan = engine.plan_for(cg.claims, device.cluster)
            return any(alt.sel.evaluate(device) is not NO_MATCH
                       for cp in plan.claims for rp in cp.requests for alt in rp.alts)
    except CostBudgetExhausted:
        return True
    except Exception:  # noqa: BLE001 -- an input error: the decision reports it
        return True


def backstop(limit: int = BACKSTOP_CLAIMS) -> int:
    """Wake the oldest candidates of every key (counters reached, never offered a device): the periodic safety
    net for claims beyond a device's window or whose offer was dropped; and folds the releases' counts that
    no round folded (releases whose devices were not offered: admin access). Returns claims woken."""
    wake.roll_up()
    keys = wake.all_keys()
    if not keys:
        return 0
    waiting = wake.candidates(keys, limit, QUEUE_LABELS, PRIORITY_LABEL)
    return wake.wake_claims(sorted(waiting)[:limit])
