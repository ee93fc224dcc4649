"""Committing allocation decisions: the one writer of claim allocation state.

Every allocator (the claims round, the gang worker, and next queue admission and preemption) decides with the
engine OUTSIDE any lock that other workers wait on, then hands its answer here, inside one short
transaction of its own. Nothing slow happens under these locks: no engine search, no CEL evaluation, only
the checks and bulk writes below (a fixed number of statements per round, whatever its size), so a lock is
held briefly (``LOCK_TIMEOUT`` caps how long we ever wait for one).

``changed_claims`` and ``verify`` check, under locks held to commit, that what the decision relied on still
holds:

1. the claims are still as they were read: each is locked (``FOR UPDATE``, ascending id) and must still be
   Pending at the ``resource_version`` the decision started from; a claim deleted, released or edited in
   the meantime voids its unit ("stale": decided afresh by the next round);
2. the inventory of every cluster used is unchanged (``inventory_version`` under ``FOR SHARE``);
3. no allocation row appeared, since the devices in use were read, on a device we use nor in a pool with
   shared counters that we use (``claims.services.locking``); such a unit "lost the race" and is retried.

Then the caller admits the units still live (the scheduler asks the queues' quota, in the same transaction:
``scheduler.services.admit``), and ``write`` inserts, for the units neither lost nor refused, the
``DeviceAllocation`` rows (the partial unique indexes stay the last line of defence: a violation aborts the
caller's transaction), marks the claims Allocated and appends their events. Units are all or nothing: a
claim, a consumer's claims, a whole gang.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from django.db import connection

from claims.models import ClaimEvent, DeviceAllocation, Phase, ResourceClaim
from claims.services import bulk, fleet, locking, queueing, wake
from claims.services import events as ev
from claims.services.conditions import PREEMPTED, READMITTED, set_allocated_condition, set_condition
from usage.services import ledger

LOCK_TIMEOUT = "2s"
ROW_KEY = ("id", "cluster", "driver", "pool", "device", "share_id", "consumed_capacity", "admin_access")
# What a decision writes to a claim (allocated, pending or failed): the fields ``record`` updates.
CLAIM_FIELDS = ["phase", "reason", "message", "conditions", "cluster", "node", "allocation", "diagnostics",
                "attempts", "attempted_version", "last_attempt_at", "allocated_at", "resource_version",
                "updated_at", "taken_until", "lease_expires_at", "pending_deadline"]


@dataclass
class Placement:
    """Claims the engine placed together on one cluster (and node): a consumer's claims, a gang member's."""

    claims: list[ResourceClaim]
    allocations: list[dict | None]  # the engine's v1 AllocationResult per claim, in the same order
    cluster: str
    node: str = ""
    message: str = ""
    diagnostics: dict | None = None
    event_data: dict = field(default_factory=dict)  # extra fields of the Allocated event (gang, member)


@dataclass
class Unit:
    """What is committed all or nothing."""

    placements: list[Placement]

    def touched(self, counter_pools: set) -> tuple[set, set]:
        """(devices, counter pools) the unit consumes; admin access consumes nothing."""
        devices, pools = set(), set()
        for p in self.placements:
            for allocation in p.allocations:
                for res in results_of(allocation):
                    if res.get("adminAccess"):
                        continue
                    pool = (p.cluster, res["driver"], res["pool"])
                    devices.add((*pool, res["device"]))
                    if pool in counter_pools:
                        pools.add(pool)
        return devices, pools


@dataclass
class CommitResult:
    lost: set[int] = field(default_factory=set)  # unit indexes that lost a race: retry soon
    written: list[tuple] = field(default_factory=list)  # ROW_KEY tuples of the inserted rows
    allocated: list[ResourceClaim] = field(default_factory=list)
    refused: dict[int, queueing.Verdict] = field(default_factory=dict)  # unit index -> why quota said no


def results_of(allocation: dict | None) -> list[dict]:
    return ((allocation or {}).get("devices") or {}).get("results") or []


def begin() -> None:
    """First statement of a commit transaction: never wait long for a lock (PostgreSQL)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")


def changed_claims(claims: list[ResourceClaim]) -> set[int]:
    """Lock ``claims`` (ascending id, to commit) and return the ids no longer Pending at the version read."""
    if not claims:
        return set()
    ids = sorted({c.id for c in claims})
    qs = ResourceClaim.objects.filter(id__in=ids).order_by("id")
    if connection.vendor == "postgresql":
        qs = qs.select_for_update(of=("self",))
    with locking.waiting():
        current = dict((i, (phase, rv)) for i, phase, rv in qs.values_list("id", "phase", "resource_version"))
    return {c.id for c in claims if current.get(c.id) != (Phase.PENDING, c.resource_version)}


def verify(units: list[Unit], view, rows_seen) -> set[int]:
    """Indexes of units whose decision no longer holds (steps 2 and 3 of the module docstring)."""
    if not units:
        return set()
    touched = [u.touched(view.counter_pools) for u in units]
    used = {p.cluster for u in units for p in u.placements}
    ids = {view.cluster_versions[c][0]: c for c in used if c in view.cluster_versions}
    current = locking.cluster_versions_locked(ids)
    changed = {name for cid, name in ids.items() if current.get(cid) != view.cluster_versions[name][1]}
    changed |= used - {ids[cid] for cid in current}
    if changed:
        fleet.invalidate()
    all_devices = set().union(*(d for d, _ in touched))
    all_pools = set().union(*(p for _, p in touched))
    locking.lock(all_devices, all_pools)
    new_devices, new_pools = locking.new_rows({d[:3] for d in all_devices} | all_pools, rows_seen)
    lost = set()
    for i, (unit, (devices, pools)) in enumerate(zip(units, touched, strict=True)):
        if {p.cluster for p in unit.placements} & changed or devices & new_devices or pools & new_pools:
            lost.add(i)
    return lost


def write(units: list[Unit], view, now, lost: set[int], verdicts: dict[int, queueing.Verdict]) -> CommitResult:
    """Write ``units`` in the caller's transaction, but those ``verify`` found ``lost`` and those whose verdict
    (the caller's admission, by unit index) is not ``ADMITTED``; claims of won units are updated in memory
    (Allocated) and saved. Claims must have been checked with ``changed_claims`` and the units with ``verify``
    in this transaction."""
    out = CommitResult(lost=lost)
    out.refused = {i: v for i, v in verdicts.items() if v.reason != queueing.ADMITTED}
    rows: list[DeviceAllocation] = []
    held: list[ledger.Held] = []
    events: list[ClaimEvent] = []
    for i, unit in enumerate(units):
        if i in out.lost or i in out.refused:
            continue
        queue = verdicts[i].queue if i in verdicts else ""
        reservation = verdicts[i].reservation if i in verdicts else ""
        for p in unit.placements:
            for claim, allocation in zip(p.claims, p.allocations, strict=True):
                rows.extend(device_rows(claim, p.cluster, allocation))
                held.append(ledger.Held(claim, p.cluster, p.node, results_of(allocation), queue, reservation))
                set_allocated(claim, p, allocation, now, events)
                if i in verdicts:
                    set_quota_condition([claim], verdicts[i], now)
                out.allocated.append(claim)
    out.written = bulk.insert_rows(rows, returning=ROW_KEY)
    # The usage ledger in the same transaction: an interval is open exactly while its allocation row exists.
    ledger.open_intervals(held, view.snapshot, now)
    record(out.allocated, events)
    return out


def device_rows(claim: ResourceClaim, cluster: str, allocation: dict | None) -> list[DeviceAllocation]:
    return [DeviceAllocation(claim=claim, cluster=cluster, driver=res["driver"], pool=res["pool"],
                             device=res["device"], share_id=res.get("shareID") or "",
                             consumed_capacity=res.get("consumedCapacity") or None,
                             admin_access=bool(res.get("adminAccess")), request=res.get("request", "")[:127])
            for res in results_of(allocation)]


def record(claims: list[ResourceClaim], events: list) -> None:
    """Save what a decision changed on ``claims`` (``CLAIM_FIELDS``) and append ``events``, in bulk."""
    for claim in claims:
        claim.taken_until = None
    wake.store(claims)  # before the save: it may clear attempted_version
    bulk.update_rows(claims, CLAIM_FIELDS)
    ev.record(events)


def touch_attempt(claim: ResourceClaim, now) -> None:
    claim.attempts += 1
    claim.last_attempt_at = now
    claim.updated_at = now
    claim.resource_version += 1


# ---------------------------------------------------------------------------------- claim state changes

def set_allocated(claim: ResourceClaim, p: Placement, allocation: dict | None, now, events: list) -> None:
    claim.phase = Phase.ALLOCATED
    claim.allocation = allocation
    claim.cluster, claim.node = p.cluster or "", p.node or ""
    claim.allocated_at = now
    # The walltime runs from here (a requeued victim starts a fresh one, as a requeued Slurm job does); the
    # bound on the first wait is over.
    claim.lease_expires_at = now + timedelta(seconds=claim.lease_seconds) if claim.lease_seconds else None
    claim.pending_deadline = None
    claim.reason = "Allocated"
    where = f"{claim.cluster}/{claim.node}" if claim.node else claim.cluster
    claim.message = p.message or f"allocated on {where}"
    if not results_of(allocation):
        claim.message = "allocated with no devices: the spec has no device requests (upstream defaulting)"
    claim.diagnostics = p.diagnostics or {"allocated": True, "cluster": claim.cluster, "node": claim.node or None}
    claim.conditions = set_allocated_condition(claim.conditions, True, "Allocated", claim.message, now)
    if any(c.get("type") == PREEMPTED and c.get("status") == "True" for c in claim.conditions or []):
        # Requeued by preemption and allocated again: the preemption is over (Preempted=True goes with
        # Allocated only while a notice runs).
        claim.conditions = set_condition(claim.conditions, PREEMPTED, False, READMITTED,
                                         "allocated again after its preemption", now)
    events.append(ev.event(claim, ev.ALLOCATED, "Allocated", claim.message, {
        "cluster": claim.cluster, "node": claim.node or None, **p.event_data,
        "devices": [{k: r.get(k) for k in ("request", "driver", "pool", "device", "shareID") if r.get(k) is not None}
                    for r in results_of(allocation)]}))


def set_pending(claims, reason: str, message: str, diagnostics, version, now, events: list,
                wake_keys=None, head_of: str = "", hold: tuple[str, str] | None = None) -> None:
    """Still pending; ``version``: the claims' version tried at, with the wake counters read with it (a
    ``wake.Version``, as ``take`` returns it; not retried before something that may help them changes), or
    None to retry at once. ``wake_keys``: what a release must free to wake them
    (``claims.services.wake``); None: any release. ``head_of``: the queue whose head holds a node for them,
    ``hold``: that (cluster, node)."""
    wake.mark(claims, version, wake_keys, head_of, hold)
    for claim in claims:
        # The trail records each change of outcome; a repeat of the same "no" is counted in
        # status.attempts but not written again (a long queue is re-tried after every release).
        repeat = claim.reason == reason and claim.attempts > 1
        claim.phase = Phase.PENDING
        claim.reason, claim.message = reason, message or ""
        claim.diagnostics = diagnostics
        claim.attempted_version = version
        claim.conditions = set_allocated_condition(claim.conditions, False, reason, claim.message, now)
        if not repeat:
            events.append(ev.event(claim, ev.ATTEMPT, reason, claim.message,
                                   {"outcome": "pending", "attempt": claim.attempts}))


def set_quota_condition(claims, verdict: queueing.Verdict, now) -> None:
    admitted = verdict.reason == queueing.ADMITTED
    for claim in claims:
        claim.conditions = set_condition(claim.conditions, queueing.QUOTA_RESERVED, admitted, verdict.reason,
                                         verdict.message, now)


def set_waiting_for_quota(claims, verdict: queueing.Verdict, version, now, events: list) -> None:
    """Placed by the engine but refused by its queue's quota: pending, holding nothing; retried after any
    release (it may free quota) or a queue change."""
    set_pending(claims, verdict.reason, verdict.message, {"queue": verdict.queue, "reason": verdict.reason},
                version, now, events)
    set_quota_condition(claims, verdict, now)


def set_failed(claims, error, reason: str, version, now, events: list) -> None:
    """The engine refused the claim named by ``error`` for good: it fails; the other claims of its unit
    cannot be allocated without it and wait, not retried before the fleet or the unit changes."""
    for claim in claims:
        mine = error.claim in (None, "", claim.name, f"claim {claim.namespace.name}/{claim.name}",
                               f"claim {claim.name}") or len(claims) == 1
        claim.phase = Phase.FAILED if mine else Phase.PENDING
        claim.reason = reason if mine else "ConsumerClaimFailed"
        claim.message = error.message if mine else f"{error.claim} of the same consumer failed"
        claim.diagnostics = {"error": error.to_dict()}
        claim.attempted_version = None if mine else version
        claim.conditions = set_allocated_condition(claim.conditions, False, claim.reason, claim.message, now)
        events.append(ev.event(claim, ev.FAILED if mine else ev.ATTEMPT, claim.reason, claim.message,
                               {"error": error.to_dict()}))


def record_waiting(claims: list[ResourceClaim], reason: str, message: str, diagnostics: dict, now) -> None:
    """Claims another allocator holds back say why (a gang member waiting for its gang); saved in bulk."""
    for claim in claims:
        claim.reason, claim.message = reason, message
        claim.conditions = set_allocated_condition(claim.conditions, False, reason, message, now)
        claim.resource_version += 1
        claim.updated_at = now
        claim.diagnostics = diagnostics
    bulk.update_rows(claims, ["reason", "message", "conditions", "resource_version", "updated_at", "diagnostics"])
