"""Re-check of running preemption notices: a victim keeps its devices when its preemptor no longer needs them.

A notice runs for ``graceSeconds`` or more, and the fleet changes meanwhile: an unrelated release may free
room for the preemptor, the preemptor may be allocated elsewhere or deleted. Every preemption pass
(``reclaim.run``, before it decides anything) and just before a victim's devices move (the sweep at ``stopBy``
or ``forceAt``; a confirmation, through ``claims.services.preemption.register_recheck``) the notices are
looked at again:

- a preemptor that is allocated, released or deleted cancels all its notices (the allocating or releasing
  transaction does so itself, ``queues.services.cancellation.for_preemptors``; this catches the rest);
- otherwise, for a claim placed by the claims round (not a gang's, not one waiting for a quota rather than for
  room), the engine is run again against the current free capacity, preemptors in notice order on one engine
  (each placed, on what it still needs, before the next is looked at: two preemptors never both count the same
  freed devices): its victims' devices released, it must fit; then each victim, last noticed first, is given
  back when the preemptor still fits without it. Those victims' notices are cancelled
  (``PreemptionCancelled``); the others' devices move as planned. A preemptor whose notices were cancelled
  that way and that is not placed yet is placed first, on no victims (``promised``): the room it was promised
  is not counted again for another.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from claims.models import Phase, ResourceClaim
from claims.services import fleet, queueing, wake
from claims.services.engines import engines
from claims.services.external import managed_elsewhere
from queues.models import Preemption, PreemptionState
from queues.services import cancellation
from scheduler.services import allocation, preemption
from scheduler.services.grouping import Group

NOT_NEEDED = "its preemptor fits without this claim's devices now (room was freed elsewhere)"
# How long a cancellation's promise of room to its preemptor is honoured by later re-checks (``promised``): the
# next claims round places it well within this.
PROMISE = timedelta(minutes=5)


def run(limit: int = 2000) -> int:
    """One pass's re-check of every running notice whose victim still holds its devices (see the module
    docstring), with the worker's cached engine. Returns how many notices it cancelled."""
    notices = list(Preemption.objects.filter(state=PreemptionState.PENDING, victim__phase=Phase.ALLOCATED)
                   .order_by("id")[:limit])
    if not notices:
        return 0
    decided = decide(notices, cached_engine)
    if not decided:
        return 0
    with transaction.atomic():
        ids = sorted({p.victim_id for p in notices if p.id in decided})
        # Skip rows another transaction holds (a confirmation, a release): the next pass looks again.
        locked = {v.id: v for v in ResourceClaim.objects.select_for_update(of=("self",), skip_locked=True)
                  .select_related("namespace").filter(id__in=ids).order_by("id")}
        return len(_cancel(notices, decided, locked))


def place_running(kept: list, limit: int = 2000, engine=None) -> set[int]:
    """Before a pass decides anything: every pending preemptor whose notices run is placed in the worker's
    cached engine on its victims' devices (released), kept in ``kept`` until ``preemption.restore``, as the
    round will place it once they move. A preemptor decided in this pass then counts only the room left over:
    two claims that one victim's devices serve both (two MIG partitions of one freed GPU) arriving in two
    passes took a victim each. A preemptor that does not fit there, or that a gang or a quota (not room) holds
    back, keeps its victims' devices counted as used: nobody else is given that room. Before them, the claims
    whose victims were requeued lately and that no round has placed yet (``promised``). Returns the ids of the
    claims it placed: the pass does not decide for them (their room is there). ``engine``: the pass's (default:
    the worker's cached one)."""
    notices = list(Preemption.objects.filter(state=PreemptionState.PENDING, victim__phase=Phase.ALLOCATED)
                   .exclude(preemptor_id=None).order_by("id")[:limit])
    by_preemptor: dict[int, list[int]] = defaultdict(list)
    for p in notices:
        if p.preemptor_id is not None:
            by_preemptor[p.preemptor_id].append(p.victim_id)
    view = fleet.current_view()
    engine = engine or cached_engine(view)
    devices = preemption.victim_devices([ResourceClaim(id=v) for ids in by_preemptor.values() for v in ids])
    placed: set[int] = set()
    for claim, _ in promised(set(by_preemptor)):  # their room is free already: theirs first
        if preemption.keep(engine, allocation.engine_group(Group(claims=[claim]), view), None, kept, []):
            placed.add(claim.id)
    for claim in (ResourceClaim.objects.filter(id__in=list(by_preemptor), phase=Phase.PENDING)
                  .select_related("namespace").order_by("id")):
        if managed_elsewhere(claim) or claim.reason == queueing.WAITING_FOR_QUOTA:
            continue
        freed = [d for v in by_preemptor[claim.id] for d in devices.get(v, [])]
        engine.release(freed)
        group = allocation.engine_group(Group(claims=[claim]), view)
        if preemption.keep(engine, group, None, kept, freed):
            placed.add(claim.id)
        else:
            engine.commit(freed)
    return placed


def still_needed(victims: list[ResourceClaim], now, *, in_worker: bool = False) -> list[ResourceClaim]:
    """The hook run just before locked ``victims`` give their devices up (``claims.services.preemption``): the
    notices of their preemptors are re-checked (with the worker's cached engine ``in_worker``, else a throw-away
    one: a confirmation runs in a web process); those of ``victims`` no longer needed are cancelled in the
    caller's transaction. Returns the victims still needed."""
    if not victims:
        return victims
    by_id = {v.id: v for v in victims}
    notices = list(Preemption.objects.filter(state=PreemptionState.PENDING, victim_id__in=list(by_id))
                   .order_by("id"))
    others = list(Preemption.objects.filter(state=PreemptionState.PENDING, victim__phase=Phase.ALLOCATED,
                                            preemptor_id__in={p.preemptor_id for p in notices} - {None})
                  .exclude(victim_id__in=list(by_id)).order_by("id"))
    decided = decide(sorted([*notices, *others], key=lambda p: p.id), cached_engine if in_worker else throwaway_engine)
    mine = [p for p in notices if p.id in decided]
    gone = {p.victim_id for p in _cancel(mine, decided, by_id, now)} if mine else set()
    return [v for v in victims if v.id not in gone]


def decide(notices: list[Preemption], engine_of: Callable) -> dict[int, str]:
    """Notice id -> why it is cancelled, for the ``notices`` (running, ``victim`` still allocated) no longer
    needed. Nothing is written."""
    by_preemptor: dict[int | None, list[Preemption]] = defaultdict(list)
    for p in notices:
        if not p.reservation:  # a reservation's reclaim stands: its capacity is booked, not asked for by a claim
            by_preemptor[p.preemptor_id].append(p)
    claims = {c.id: c for c in ResourceClaim.objects.filter(id__in=[i for i in by_preemptor if i is not None])
              .select_related("namespace")}
    out: dict[int, str] = {}
    engine_work = []
    for pid, mine in by_preemptor.items():
        claim = claims.get(pid) if pid is not None else None
        if claim is None or claim.phase in (Phase.RELEASED, Phase.FAILED):
            who = f"{claim.namespace.name}/{claim.name} " if claim is not None else ""
            out.update((p.id, f"its preemptor {who}is gone") for p in mine)
        elif claim.phase == Phase.ALLOCATED:
            out.update((p.id, f"its preemptor {claim.namespace.name}/{claim.name} was allocated") for p in mine)
        elif not managed_elsewhere(claim) and claim.reason != queueing.WAITING_FOR_QUOTA:
            engine_work.append((claim, mine))
    if engine_work:
        out.update(_engine_check([*promised(set(by_preemptor)), *engine_work], engine_of))
    return out


def promised(deciding: set) -> list[tuple[ResourceClaim, list]]:
    """Pending claims whose notices ended recently -- their victims requeued (the devices are free now, for
    them) or cancelled by a re-check because they fit as things are: placed first, on no victims, so that the
    room they were promised is not counted again for another preemptor before the round places them (it was:
    the other's notices were cancelled, the two then raced for one device, and the loser took a victim again).
    One whose room went elsewhere does not fit, and holds nothing."""
    since = timezone.now() - PROMISE
    ids = (Preemption.objects.filter(state__in=(PreemptionState.CANCELLED, PreemptionState.DONE),
                                     finished_at__gte=since)
           .exclude(preemptor_id__in=deciding - {None}).values("preemptor_id"))
    return [(c, []) for c in ResourceClaim.objects.filter(id__in=ids, phase=Phase.PENDING)
            .select_related("namespace").order_by("id")
            if not managed_elsewhere(c) and c.reason != queueing.WAITING_FOR_QUOTA]


def cached_engine(view):
    return engines.engine_for(view, fleet.rows_in_use())


def throwaway_engine(view):
    from dra.engine import Engine

    return Engine(view.snapshot, list(fleet.rows_in_use().values()))


def _engine_check(work: list[tuple[ResourceClaim, list[Preemption]]], engine_of: Callable) -> dict[int, str]:
    """The engine part of ``decide``: preemptors in order on one engine, left as it was. A gang's members are
    one unit: given back (cancelled) all together or not at all."""
    view = fleet.current_view()
    engine = engine_of(view)
    devices = preemption.victim_devices([ResourceClaim(id=p.victim_id) for _, mine in work for p in mine])
    gang_of = cancellation.gangs_of(p.victim_id for _, mine in work for p in mine)
    out: dict[int, str] = {}
    kept: list = []
    try:
        for claim, mine in work:
            units = _units([p for p in mine if devices.get(p.victim_id)], gang_of)
            held = {key: [d for p in unit for d in devices[p.victim_id]] for key, unit in units.items()}
            group = allocation.engine_group(Group(claims=[claim]), view)
            placed = preemption.placer(engine, group, None)
            for key in units:
                engine.release(held[key])
            if not placed():  # not even with all its victims: left to the round and the next pass
                for key in units:
                    engine.commit(held[key])
                continue
            needed = []
            for key in reversed(list(units)):
                engine.commit(held[key])
                if placed():
                    out.update((p.id, NOT_NEEDED) for p in units[key])
                else:
                    engine.release(held[key])
                    needed.append(key)
            if not preemption.keep(engine, group, None, kept, [d for key in needed for d in held[key]]):
                for key in needed:
                    engine.commit(held[key])
    finally:
        preemption.restore(kept)
    return out


def _units(notices: list[Preemption], gang_of: dict[int, int]) -> dict:
    """Notices in order, grouped: a gang's members under ("gang", id), any other victim alone."""
    units: dict = {}
    for p in notices:
        key = ("gang", gang_of[p.victim_id]) if p.victim_id in gang_of else ("claim", p.victim_id)
        units.setdefault(key, []).append(p)
    return units


def _cancel(notices: list[Preemption], decided: dict[int, str], locked: dict[int, ResourceClaim],
            now=None) -> list[Preemption]:
    """Cancel the ``decided`` notices (grouped by why) whose victims are ``locked``; wake their preemptors (a
    preemptor that fits without its victims is tried by the next round). Returns the notices cancelled."""
    now = now or timezone.now()
    by_why: dict[str, list[Preemption]] = defaultdict(list)
    for p in notices:
        if p.id in decided:
            by_why[decided[p.id]].append(p)
    done = [p for why, mine in by_why.items() for p in cancellation.cancel(mine, locked, why, now)]
    woken = {p.preemptor_id for p in done if p.preemptor_id is not None}
    if woken:
        wake.wake_claims(woken)
    return done
