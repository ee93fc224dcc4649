"""The gang worker's step: one gang, all or nothing, decided outside any lock.

``place_next`` has three steps, as the claims round does:

1. one short transaction: take the oldest eligible gang (``FOR UPDATE SKIP LOCKED`` and ``taken_until``:
   concurrent workers take different gangs and never wait on each other), fail it if its schedule timeout
   passed, tidy its members (claims allocated outside the gang are released, lost members counted) and read
   the member claims still to place;
2. with no transaction and no lock: read the fleet view and the devices in use and ask ``dra.gang`` for a
   placement (the process's one engine, ``claims.services.engines``, through one engine session);
3. one short transaction: the gang and its claims must be as read (else decided afresh), then the claims
   app's commit service (``claims.services.commit``) verifies under locks and writes every member's
   allocation rows and claim status at once, or nothing; the gang and its members record the outcome.

So at least ``minMember`` members get all their claims, or nothing is written; a pending gang holds no
device, and the loser of a race writes nothing, gives its devices back to the engine and is retried.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from claims.placement import claim_object, clusters_matching
from claims.services import claims as claim_services
from claims.services import commit, fleet, taking
from claims.services.engines import EngineSession
from claims.services.engines import session as engine_session
from dra.cel import CostBudgetExhausted, CostMeter, metered
from dra.gang import Gang as LibGang
from dra.gang import GangMember as LibMember
from dra.gang import GangOutcome, GangSpecError, Topology
from draservice import notify
from gangs.models import Gang, GangMember, GangPhase, MemberPhase
from gangs.services import events as ev
from gangs.services import hold
from gangs.services.gangs import MemberClaims, fail_timeout, finish_locked, member_claims, set_gang_condition
from scheduler.services import admit, allocation, gang_holds

log = logging.getLogger(__name__)

# Engine input errors that are the claims' own fault (as the claims round treats them): the gang fails.
TERMINAL_ERRORS = allocation.TERMINAL_ERRORS


@dataclass
class Attempt:
    gang_id: int | None
    result: str  # none | placed | added | pending | failed | busy | lost_race | behind (an older gang first)
    seconds: float = 0.0

    @property
    def retry_soon(self) -> bool:
        return self.result in ("busy", "lost_race")


def eligible(version: int) -> Q:
    not_tried = Q(attempted_version__isnull=True) | Q(attempted_version__lt=version)
    return (Q(phase=GangPhase.PENDING) | Q(phase=GangPhase.PLACED, waiting_count__gt=0)) & not_tried


def place_next(*, gang_id: int | None = None, exclude: set[int] | frozenset = frozenset()) -> Attempt:
    started = time.perf_counter()
    # The session resets the engine if the attempt raises, and settles it after a placement that used it.
    with engine_session() as session:
        prepared = _prepare(gang_id, exclude)
        if isinstance(prepared, Attempt):
            prepared.seconds = time.perf_counter() - started
            return prepared
        result = _decide_and_commit(session, prepared)
    return Attempt(prepared.gang.id, result, time.perf_counter() - started)


@dataclass
class Prepared:
    gang: Gang
    pending: list[MemberClaims]
    version: int
    within: tuple | None
    min_member: int
    now: object


def _prepare(gang_id: int | None, exclude) -> Prepared | Attempt:
    """Step 1 (one short transaction)."""
    with transaction.atomic():
        version = taking.fleet_version()  # read FIRST: anything freed later moves it past `version`
        now = timezone.now()
        qs = Gang.objects.select_for_update(skip_locked=True, of=("self",)).select_related("namespace")
        qs = qs.filter(taking.not_taken(now))
        if gang_id is not None:
            qs = qs.filter(pk=gang_id, phase__in=[GangPhase.PENDING, GangPhase.PLACED])
        else:
            qs = qs.filter(eligible(version)).exclude(id__in=list(exclude)).order_by("id")
        gang = qs.first()
        if gang is None:
            return Attempt(None, "none")
        if _behind(gang, version, exclude):
            return Attempt(gang.id, "behind")
        if gang.phase == GangPhase.PENDING and gang.deadline and gang.deadline <= now:
            mcs, _ = member_claims(gang, lock=True)
            fail_timeout(gang, mcs, now)
            return Attempt(gang.id, "failed")
        mcs, problem = member_claims(gang, lock=True, skip_locked=True)
        if problem == "busy":
            return Attempt(gang.id, "busy")
        prepared = _tidy(gang, mcs, version, now)
        if isinstance(prepared, str):
            return Attempt(gang.id, prepared)
        Gang.objects.filter(pk=gang.pk).update(**taking.taken_mark())
        return prepared


def _behind(gang: Gang, version: int, exclude) -> bool:
    """Whether an older gang is eligible too (another worker has it in hand: taken or being taken; or, for a
    gang asked for by id, it waits for a pass). Gangs are decided oldest first, and not side by side with an
    older one: deciding both at once on the same freed nodes, the younger could commit first and take the room
    the older waited for, since the older holds nodes only after an attempt that finds it short. The worker
    with the older one decides the younger after it (``place_gangs`` goes on; ``place_gang`` asks for a pass)."""
    return Gang.objects.filter(eligible(version), id__lt=gang.id).exclude(id__in=list(exclude)).exists()


def any_free_to_go(ids: set[int]) -> bool:
    """Whether one of the gangs ``ids`` (left behind older ones) is eligible now and behind none any more."""
    if not ids:
        return False
    version = taking.fleet_version()
    return any(not _behind(g, version, ()) for g in Gang.objects.filter(eligible(version), id__in=list(ids)))


def _tidy(gang: Gang, mcs: list[MemberClaims], version: int, now) -> Prepared | str:
    """Bring the members up to date; the members still to place, or the attempt's result when none are."""
    states = {mc.member.id: mc.state for mc in mcs}
    for mc in mcs:
        if states[mc.member.id] == "stray":
            # Allocated on its own by the claims round (see ``hold``): a partial hold the gang did not make.
            # Release it, so it blocks nothing, and count the member as lost.
            for c in mc.claims:
                claim_services.release_claim(c.id, reason="GangMemberAllocatedAlone",
                                             message=f"allocated outside gang {gang.name}; released")
        if states[mc.member.id] in ("stray", "lost") and mc.member.phase != MemberPhase.LOST:
            mc.member.phase = MemberPhase.LOST
            mc.member.save(update_fields=["phase"])
            ev.record([ev.event(gang, ev.MEMBER_LOST, "MemberLost", f"member {mc.member.name} lost its claims")])
    pending = [mc for mc in mcs if states[mc.member.id] == "pending"]
    placed = [mc for mc in mcs if states[mc.member.id] == "placed"]
    hold.reapply([c for mc in pending for c in mc.claims], gang.name)
    if gang.phase == GangPhase.PENDING:
        if len(pending) < gang.min_member:
            finish_locked(gang, mcs, GangPhase.FAILED, "MembersLost",
                          f"only {len(pending)} members still have usable claims; minMember is {gang.min_member}",
                          now)
            return "failed"
        return Prepared(gang, pending, version, None, gang.min_member, now)
    if len(placed) < gang.min_member:
        finish_locked(gang, mcs, GangPhase.FAILED, "MinMemberLost",
                      f"{len(placed)} members still hold their claims; minMember is {gang.min_member}", now)
        return "failed"
    if not pending:
        gang.waiting_count = 0
        gang.save(update_fields=["waiting_count", "updated_at"])
        return "none"
    return Prepared(gang, pending, version, (gang.cluster, gang.domain), 1, now)


def _decide_and_commit(session: EngineSession, p: Prepared) -> str:
    """Steps 2 (no transaction, no lock) and 3 (one short transaction)."""
    gang = p.gang
    view = fleet.current_view()
    rows_seen = fleet.rows_in_use()
    placer = session.placer_for(view, rows_seen)
    lib_gang = library_gang(gang, p.pending, view.cluster_labels, p.min_member)
    outcome: GangOutcome | GangSpecError
    try:
        # All CEL work of this placement shares one budget, a claim round's per member (see allocation).
        with metered(CostMeter(allocation.GROUP_COST_BUDGET * max(1, len(p.pending)))):
            outcome = placer.place(lib_gang, commit=True, within=p.within)
    except GangSpecError as exc:  # the spec was validated at creation; only a changed validator gets here
        outcome = exc
    except CostBudgetExhausted as exc:  # deterministic: the gang fails rather than retrying forever
        session.poison()  # stopped mid-search: the engine may hold tentative picks
        outcome = GangSpecError([("spec.members", f"placement stopped: {exc.reason}; the member claims' "
                                                   "selectors cost too much to evaluate over the fleet")])
    if p.within is None and not isinstance(outcome, GangSpecError) and outcome.placed:
        outcome = _screen(gang, p, outcome, placer)
    try:
        with transaction.atomic():
            commit.begin()
            result = _commit_locked(session, p, outcome, view, rows_seen, placer)
    except IntegrityError as exc:  # the unique index refused a row: nothing written, decide afresh
        log.warning("gang %s lost a race at the unique index: %s", gang.name, exc)
        session.invalidate()
        Gang.objects.filter(pk=gang.pk).update(taken_until=None)
        return "lost_race"
    return result


def _screen(gang: Gang, p: Prepared, outcome: GangOutcome, placer) -> GangOutcome:
    """A placement on nodes an older gang holds at its queue's head is given back: the gang waits its turn
    (``HeldForQueueHead``), as a later claim does in the claims round."""
    why = gang_holds.held_from(gang, [c for mc in p.pending for c in mc.claims], outcome)
    if not why:
        return outcome
    placer.release_placements(outcome.placements)
    return dataclasses.replace(outcome, placed=False, placements=[], unplaced=[mc.member.name for mc in p.pending],
                               reason="HeldForQueueHead", message=why)


def _commit_locked(session: EngineSession, p: Prepared, outcome, view, rows_seen, placer) -> str:
    gang = p.gang
    current = Gang.objects.select_for_update(of=("self",)).filter(pk=gang.pk).values_list("resource_version",
                                                                                          flat=True).first()
    claims = [c for mc in p.pending for c in mc.claims]
    if current != gang.resource_version or commit.changed_claims(claims):
        # Released, deleted or edited while we decided: nothing to write; the next pass decides afresh.
        if not isinstance(outcome, GangSpecError) and outcome.placed:
            placer.release_placements(outcome.placements)
        Gang.objects.filter(pk=gang.pk).update(taken_until=None)
        return "lost_race"
    gang.taken_until = None
    if isinstance(outcome, GangSpecError):
        mcs, _ = member_claims(gang, lock=True)
        finish_locked(gang, mcs, GangPhase.FAILED, "InvalidGang", str(outcome), p.now)
        return "failed"
    if outcome.placed:
        first = gang.phase == GangPhase.PENDING
        written = _write(session, gang, outcome, {mc.member.name: mc for mc in p.pending}, view, rows_seen, placer,
                         p.version, p.now)
        if written is not True:
            return written or "lost_race"
        return "placed" if first else "added"
    if outcome.error is not None and outcome.error.code in TERMINAL_ERRORS:
        mcs, _ = member_claims(gang, lock=True)
        finish_locked(gang, mcs, GangPhase.FAILED, "InvalidGang", outcome.message, p.now)
        return "failed"
    _record_pending(gang, outcome, p.pending, p.version, p.now)
    if gang.phase == GangPhase.PENDING:  # at the head of its queue, it holds the nodes it waits for
        gang_holds.hold_for_gang(gang, [mc.claims for mc in p.pending], placer.engine, outcome)
    return "pending"


def library_gang(gang: Gang, members: list[MemberClaims], cluster_labels: list[tuple[str, dict]],
                 min_member: int) -> LibGang:
    """The ``dra.gang`` input for these members: claims as v1 JSON, cluster restrictions intersected."""
    placement = gang.spec.get("placement") or {}
    selected = clusters_matching(placement.get("clusterSelector"), cluster_labels)
    allowed = set(selected) if selected is not None else None
    preferred = placement.get("preferredCluster")
    lib_members = []
    for mc in members:
        for c in mc.claims:
            names = clusters_matching(c.allowed_cluster_selector, cluster_labels)
            if names is not None:
                allowed = set(names) if allowed is None else allowed & set(names)
            preferred = preferred or c.preferred_cluster or None
        lib_members.append(LibMember(mc.member.name, [claim_object(c) for c in mc.claims],
                                     key=f"gang:{gang.uid}/{mc.member.name}"))
    return LibGang(gang.name, lib_members, min(min_member, len(lib_members)), Topology.from_dict(gang.topology),
                   allowed_clusters=sorted(allowed) if allowed is not None else None, preferred_cluster=preferred,
                   key=f"gang:{gang.uid}")


def summary(outcome) -> dict:
    """What the gang keeps of an outcome: everything but the allocation results (the claims hold those)."""
    out = outcome.to_dict()
    out["placements"] = [{"member": p.member, "node": p.node, "labels": p.labels} for p in outcome.placements]
    return out


# --------------------------------------------------------------------------------------------- writing

def _write(session: EngineSession, gang: Gang, outcome, by_name: dict[str, MemberClaims], view, rows_seen, placer,
           version: int, now) -> bool | str:
    """Persist a placement, all of it or nothing; False when it lost a race, "pending" when its queue refused
    it (either way the engine gets its devices back)."""
    cluster = outcome.cluster
    placements = []
    for pl in outcome.placements:
        node = pl.outcome.node or ""
        where = f"{cluster}/{node}" if node else cluster
        claims = by_name[pl.member].claims
        placements.append(commit.Placement(
            claims=claims, allocations=[co.allocation for co in pl.outcome.claims], cluster=cluster, node=node,
            message=f"allocated on {where} with gang {gang.name}",
            diagnostics={"allocated": True, "cluster": cluster, "node": node or None, "gang": gang.name,
                         "member": pl.member},
            event_data={"gang": gang.name, "member": pl.member}))
    for c in (c for pl in placements for c in pl.claims):
        commit.touch_attempt(c, now)
    committed = admit.commit([commit.Unit(placements)], view, rows_seen, now)
    if committed.refused:  # the whole gang is one unit of admission: its queue's quota said no
        placer.release_placements(outcome.placements)
        verdict = committed.refused[0]
        _record_pending(gang, dataclasses.replace(outcome, reason=verdict.reason, message=verdict.message),
                        list(by_name.values()), version, now)
        return "pending"
    if committed.lost:
        placer.release_placements(outcome.placements)
        Gang.objects.filter(pk=gang.pk).update(taken_until=None)
        return False
    session.note_written(committed.written)

    members = []
    for pl in outcome.placements:
        m = by_name[pl.member].member
        m.phase, m.cluster, m.node, m.labels, m.placed_at = MemberPhase.PLACED, cluster, pl.node, pl.labels, now
        members.append(m)
    GangMember.objects.bulk_update(members, ["phase", "cluster", "node", "labels", "placed_at"])

    adding = gang.phase == GangPhase.PLACED
    gang.placed_count = (gang.placed_count if adding else 0) + len(outcome.placements)
    gang.waiting_count = len(outcome.unplaced)
    gang.attempts += 1
    gang.last_attempt_at = now
    gang.resource_version += 1
    gang.diagnostics = summary(outcome)
    if not adding:
        gang.phase = GangPhase.PLACED
        gang.cluster, gang.domain = cluster, outcome.domain
        gang.placed_at = now
        gang.hold_queue, gang.held_nodes, gang.hold_need = "", [], {}  # its hold ends: it runs
        gang.reason, gang.message = "Placed", outcome.message
        set_gang_condition(gang, True, "Placed", outcome.message, now)
    gang.preferred_domains = _spread(gang.id, Topology.from_dict(gang.topology))
    # Members left over are retried only when the fleet changes (the placement is deterministic).
    gang.attempted_version = version if outcome.unplaced else None
    gang.save()
    ev.record([ev.event(gang, ev.MEMBERS_ADDED if adding else ev.PLACED, "Placed", outcome.message, {
        "cluster": cluster, "domain": outcome.domain, "members": {p.member: p.node for p in outcome.placements}})])
    ids = [c.id for c in committed.allocated]
    transaction.on_commit(lambda: notify.publish(ids))
    return True


def _spread(gang_id: int, topo: Topology) -> list[dict]:
    """Placed members per domain of the preferred level: [{"domain": {...}, "members": n}], largest first."""
    if not topo.preferred:
        return []
    keep = topo.levels[: topo.index(topo.preferred) + 1]
    counts: dict[tuple, int] = {}
    for labels in GangMember.objects.filter(gang_id=gang_id, phase=MemberPhase.PLACED).values_list("labels",
                                                                                                  flat=True):
        key = tuple((labels or {}).get(level, "") for level in keep)
        counts[key] = counts.get(key, 0) + 1
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return [{"domain": dict(zip(keep, k, strict=False)), "members": n} for k, n in ranked]


def _record_pending(gang: Gang, outcome, pending: list[MemberClaims], version: int, now) -> None:
    gang.attempted_version = version
    gang.attempts += 1
    gang.last_attempt_at = now
    if gang.phase == GangPhase.PLACED:  # members beyond minMember that do not fit (yet): nothing else changes
        gang.diagnostics = {**(gang.diagnostics or {}), "waiting": summary(outcome)}
        gang.save(update_fields=["attempted_version", "attempts", "last_attempt_at", "diagnostics", "updated_at",
                                 "taken_until"])
        return
    changed = (gang.reason, gang.message) != (outcome.reason, outcome.message)
    gang.reason, gang.message = outcome.reason or "Pending", outcome.message
    gang.diagnostics = summary(outcome)
    gang.waiting_count = len(pending)
    gang.resource_version += 1
    set_gang_condition(gang, False, gang.reason, gang.message, now)
    gang.save()
    if not changed:
        return
    # Only when the answer changed: the member claims and the event log say why, without a write per attempt.
    ev.record([ev.event(gang, ev.ATTEMPT, gang.reason, gang.message,
                        {"closest": outcome.closest.to_dict() if outcome.closest else None})])
    claims = [c for mc in pending for c in mc.claims]
    commit.record_waiting(claims, hold.WAITING, f"gang {gang.name} is pending: {outcome.message}",
                          {"gang": gang.name, "reason": outcome.reason, "message": outcome.message}, now)
