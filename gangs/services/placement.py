"""The gang worker's step: one gang, one transaction, all or nothing.

``place_next`` takes the oldest eligible gang (``FOR UPDATE SKIP LOCKED``: concurrent workers take different
gangs and never wait on each other) and its member claims (also SKIP LOCKED: a gang whose claim someone is
releasing right now is simply retried later), then:

1. takes the allocators' turn lock (``claims.services.locking.serialize_allocators``, shared with the claims
   round), reads the fleet view and the devices in use, and asks ``dra.gang`` for a placement;
2. if placed: locks what the placement touches and checks that nothing it relies on changed since it was
   read (the claims app's write-time checks: cluster inventory versions, new allocation rows on the same
   devices or counter pools), then inserts every member's ``DeviceAllocation`` rows in ONE statement inside
   a savepoint (the partial unique index is the last line of defence) and marks every claim Allocated;
3. otherwise records why the gang is pending and the fleet version it was tried at.

All of it is one database transaction, so at least ``minMember`` members get all their claims, or nothing
is written. Nothing is ever held while waiting: a pending gang holds no device, a placement computes the
whole answer in memory first, and the device locks are taken at once in ascending order (one statement),
so two gangs wanting the same devices cannot wait on each other in a cycle. The loser of a race writes
nothing, gives its devices back to its engine and is retried.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from claims import notify
from claims.models import DeviceAllocation, Phase, ResourceClaim
from claims.placement import clusters_matching
from claims.services import allocation, fleet, locking
from claims.services import claims as claim_services
from claims.services import events as claim_events
from claims.services.conditions import set_allocated_condition
from dra.gang import Gang as LibGang
from dra.gang import GangMember as LibMember
from dra.gang import GangSpecError, Topology
from gangs.models import Gang, GangMember, GangPhase, MemberPhase
from gangs.services import events as ev
from gangs.services import hold
from gangs.services.engine import placers
from gangs.services.gangs import MemberClaims, finish_locked, member_claims, set_gang_condition

log = logging.getLogger(__name__)

# Engine input errors that are the claims' own fault (as the claims round treats them): the gang fails.
TERMINAL_ERRORS = allocation.TERMINAL_ERRORS


@dataclass
class Attempt:
    gang_id: int | None
    result: str  # none | placed | added | pending | failed | busy | lost_race
    seconds: float = 0.0

    @property
    def retry_soon(self) -> bool:
        return self.result in ("busy", "lost_race")


def eligible(version: int) -> Q:
    not_tried = Q(attempted_version__isnull=True) | Q(attempted_version__lt=version)
    return (Q(phase=GangPhase.PENDING) | Q(phase=GangPhase.PLACED, waiting_count__gt=0)) & not_tried


def place_next(*, gang_id: int | None = None, exclude: set[int] | frozenset = frozenset()) -> Attempt:
    started = time.perf_counter()
    try:
        with transaction.atomic():
            version = allocation.fleet_version()  # read FIRST: anything freed later moves it past `version`
            qs = Gang.objects.select_for_update(skip_locked=True, of=("self",)).select_related("namespace")
            if gang_id is not None:
                qs = qs.filter(pk=gang_id, phase__in=[GangPhase.PENDING, GangPhase.PLACED])
            else:
                qs = qs.filter(eligible(version)).exclude(id__in=list(exclude)).order_by("id")
            gang = qs.first()
            if gang is None:
                return Attempt(None, "none")
            now = timezone.now()
            if gang.phase == GangPhase.PENDING and gang.deadline and gang.deadline <= now:
                mcs, _ = member_claims(gang, lock=True)
                fail_timeout(gang, mcs, now)
                result = "failed"
            else:
                mcs, problem = member_claims(gang, lock=True, skip_locked=True)
                result = "busy" if problem == "busy" else _attempt(gang, mcs, version, now)
    except BaseException:
        placers.reset()  # its in-use state may now disagree with the database
        raise
    return Attempt(gang.id, result, time.perf_counter() - started)


def fail_timeout(gang: Gang, mcs: list[MemberClaims], now) -> None:
    why = f": {gang.message}" if gang.message and gang.reason not in ("WaitingForPlacement", "") else ""
    finish_locked(gang, mcs, GangPhase.FAILED, "ScheduleTimeout",
                  f"not placed within scheduleTimeoutSeconds={gang.schedule_timeout_seconds}{why}", now)


def _attempt(gang: Gang, mcs: list[MemberClaims], version: int, now) -> str:
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
        within, min_member = None, gang.min_member
    else:
        if len(placed) < gang.min_member:
            finish_locked(gang, mcs, GangPhase.FAILED, "MinMemberLost",
                          f"{len(placed)} members still hold their claims; minMember is {gang.min_member}", now)
            return "failed"
        if not pending:
            gang.waiting_count = 0
            gang.save(update_fields=["waiting_count", "updated_at"])
            return "none"
        within, min_member = (gang.cluster, gang.domain), 1

    locking.serialize_allocators()
    view = fleet.current_view()
    rows_seen = fleet.rows_in_use()
    placer = placers.placer_for(view, rows_seen)
    lib_gang = library_gang(gang, pending, view.cluster_labels, min_member)
    try:
        outcome = placer.place(lib_gang, commit=True, within=within)
    except GangSpecError as exc:  # the spec was validated at creation; only a changed validator gets here
        finish_locked(gang, mcs, GangPhase.FAILED, "InvalidGang", str(exc), now)
        return "failed"
    if outcome.placed:
        first = gang.phase == GangPhase.PENDING
        if not _write(gang, outcome, {mc.member.name: mc for mc in pending}, view, rows_seen, placer, version, now):
            return "lost_race"
        return "placed" if first else "added"
    if outcome.error is not None and outcome.error.code in TERMINAL_ERRORS:
        finish_locked(gang, mcs, GangPhase.FAILED, "InvalidGang", outcome.message, now)
        return "failed"
    _record_pending(gang, outcome, pending, version, now)
    return "pending"


def library_gang(gang: Gang, members: list[MemberClaims], cluster_labels: list[tuple[str, dict]],
                 min_member: int) -> LibGang:
    """The ``dra.gang`` input for these members: claims as v1 JSON, cluster restrictions intersected."""
    placement = gang.spec.get("placement") or {}
    allowed = clusters_matching(placement.get("clusterSelector"), cluster_labels)
    allowed = set(allowed) if allowed is not None else None
    preferred = placement.get("preferredCluster")
    lib_members = []
    for mc in members:
        for c in mc.claims:
            names = clusters_matching(c.allowed_cluster_selector, cluster_labels)
            if names is not None:
                allowed = set(names) if allowed is None else allowed & set(names)
            preferred = preferred or c.preferred_cluster or None
        lib_members.append(LibMember(mc.member.name, [allocation.claim_object(c) for c in mc.claims],
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

def _device_rows(claim: ResourceClaim, cluster: str, allocation_result: dict | None) -> list[DeviceAllocation]:
    rows = []
    for res in ((allocation_result or {}).get("devices") or {}).get("results") or []:
        rows.append(DeviceAllocation(
            claim=claim, cluster=cluster, driver=res["driver"], pool=res["pool"], device=res["device"],
            share_id=res.get("shareID") or "", consumed_capacity=res.get("consumedCapacity") or None,
            admin_access=bool(res.get("adminAccess")), request=res.get("request", "")[:127]))
    return rows


def _write(gang: Gang, outcome, by_name: dict[str, MemberClaims], view, rows_seen, placer, version: int,
           now) -> bool:
    """Persist a placement, all of it or nothing; False when it lost a race (the engine gets its devices back)."""
    cluster = outcome.cluster
    keys, pools = set(), set()
    for p in outcome.placements:
        for co in p.outcome.claims:
            for res in ((co.allocation or {}).get("devices") or {}).get("results") or []:
                if res.get("adminAccess"):
                    continue  # admin access does not consume the device
                pool = (cluster, res["driver"], res["pool"])
                keys.add((*pool, res["device"]))
                if pool in view.counter_pools:
                    pools.add(pool)
    cid = view.cluster_versions.get(cluster, (None, None))[0]
    current = locking.cluster_versions_locked([cid] if cid is not None else [])
    changed = cid is None or current.get(cid) != view.cluster_versions[cluster][1]
    locking.lock(keys, pools)  # one statement, ascending ids: no lock cycle with any other writer
    new_devices, new_pools = locking.new_rows({k[:3] for k in keys} | pools, set(rows_seen))
    if changed or keys & new_devices or pools & new_pools:
        placer.release_placements(outcome.placements)
        if changed:
            fleet.invalidate()
        return False
    rows: list[DeviceAllocation] = []
    for p in outcome.placements:
        for claim, co in zip(by_name[p.member].claims, p.outcome.claims):  # the engine answers in input order
            rows.extend(_device_rows(claim, cluster, co.allocation))
    try:
        with transaction.atomic():  # a savepoint: the unique index is the last line of defence
            DeviceAllocation.objects.bulk_create(rows, batch_size=2000)
    except IntegrityError as exc:
        log.warning("gang %s lost a race at the unique index: %s", gang.name, exc)
        placer.release_placements(outcome.placements)
        fleet.invalidate()
        return False
    placers.note_written(rows)

    claims, events = [], []
    members = []
    for p in outcome.placements:
        mc = by_name[p.member]
        node = p.outcome.node or ""
        where = f"{cluster}/{node}" if node else cluster
        for claim, co in zip(mc.claims, p.outcome.claims):
            claim.phase = Phase.ALLOCATED
            claim.allocation = co.allocation
            claim.cluster, claim.node = cluster, node
            claim.allocated_at = claim.last_attempt_at = claim.updated_at = now
            claim.attempts += 1
            claim.resource_version += 1
            claim.reason, claim.message = "Allocated", f"allocated on {where} with gang {gang.name}"
            claim.diagnostics = {"allocated": True, "cluster": cluster, "node": node or None, "gang": gang.name,
                                 "member": p.member}
            claim.conditions = set_allocated_condition(claim.conditions, True, "Allocated", claim.message, now)
            results = ((co.allocation or {}).get("devices") or {}).get("results") or []
            events.append(claim_events.event(claim, claim_events.ALLOCATED, "Allocated", claim.message, {
                "cluster": cluster, "node": node or None, "gang": gang.name, "member": p.member,
                "devices": [{k: r.get(k) for k in ("request", "driver", "pool", "device", "shareID")
                             if r.get(k) is not None} for r in results]}))
            claims.append(claim)
        m = mc.member
        m.phase, m.cluster, m.node, m.labels, m.placed_at = MemberPhase.PLACED, cluster, p.node, p.labels, now
        members.append(m)
    ResourceClaim.objects.bulk_update(claims, ["phase", "allocation", "cluster", "node", "allocated_at",
                                               "last_attempt_at", "updated_at", "attempts", "resource_version",
                                               "reason", "message", "diagnostics", "conditions"], batch_size=500)
    claim_events.record(events)
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
        gang.reason, gang.message = "Placed", outcome.message
        set_gang_condition(gang, True, "Placed", outcome.message, now)
    gang.preferred_domains = _spread(gang.id, Topology.from_dict(gang.topology))
    # Members left over are retried only when the fleet changes (the placement is deterministic).
    gang.attempted_version = version if outcome.unplaced else None
    gang.save()
    ev.record([ev.event(gang, ev.MEMBERS_ADDED if adding else ev.PLACED, "Placed", outcome.message, {
        "cluster": cluster, "domain": outcome.domain, "members": {p.member: p.node for p in outcome.placements}})])
    ids = [c.id for c in claims]
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
    return [{"domain": dict(zip(keep, k)), "members": n} for k, n in sorted(counts.items(), key=lambda kv: (-kv[1],
                                                                                                           kv[0]))]


def _record_pending(gang: Gang, outcome, pending: list[MemberClaims], version: int, now) -> None:
    gang.attempted_version = version
    gang.attempts += 1
    gang.last_attempt_at = now
    if gang.phase == GangPhase.PLACED:  # members beyond minMember that do not fit (yet): nothing else changes
        gang.diagnostics = {**(gang.diagnostics or {}), "waiting": summary(outcome)}
        gang.save(update_fields=["attempted_version", "attempts", "last_attempt_at", "diagnostics", "updated_at"])
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
    message = f"gang {gang.name} is pending: {outcome.message}"
    for c in claims:
        hold.set_waiting(c, hold.WAITING, message, now)
        c.diagnostics = {"gang": gang.name, "reason": outcome.reason, "message": outcome.message}
    ResourceClaim.objects.bulk_update(claims, ["reason", "message", "conditions", "resource_version", "updated_at",
                                               "diagnostics"], batch_size=500)
