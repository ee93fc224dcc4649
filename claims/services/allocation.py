"""The allocation round: take pending claims, run the engine once, write every result in one transaction.

One round (``allocate_round``) is one database transaction:

1. take up to ``batch_size`` eligible pending claims, oldest first, ``FOR UPDATE SKIP LOCKED`` (concurrent
   workers get disjoint batches and never wait on each other here);
2. group them by consumer (``grouping``), read the fleet view (cached snapshot) and the devices in use;
3. one ``Engine`` over that snapshot allocates the groups one after the other (each success is seen by the
   next group);
4. lock what the successes touch and check that nothing they rely on changed (``locking``); groups that lost
   a race are not written and stay eligible;
5. insert the ``DeviceAllocation`` rows, update the claims and append their events, all in bulk; commit.

Claims the engine could not place keep ``phase=Pending`` with a reason and the engine's diagnostics, and are
not retried until ``FleetState.version`` moves past the version they were tried at (devices were released or
the inventory changed): the engine is deterministic, so retrying earlier would only repeat the "no".
"""
from __future__ import annotations

import dataclasses
import json
import logging
import re
import time
from dataclasses import dataclass, field

from django.db import IntegrityError, transaction
from django.db.models import Q, Subquery, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from claims import k8s
from claims.models import DeviceAllocation, FleetState, Phase, ResourceClaim
from claims.placement import clusters_matching
from claims.services import events as ev
from claims.services import bulk, fleet, locking
from claims.services.conditions import set_allocated_condition
from claims.services.grouping import Group, build_groups

log = logging.getLogger(__name__)

DEFAULT_BATCH = 500

# Engine input errors that are the claim's own fault: the claim fails for good. The others (a class not
# known yet, a pool being updated) can heal when the fleet changes, so the claim stays pending.
TERMINAL_ERRORS = {"cel_error", "limit_exceeded", "feature_disabled", "invalid_claim"}
REASONS = {
    "unsatisfiable": "Unsatisfiable",
    "search_budget_exceeded": "SearchBudgetExceeded",
    "no_eligible_cluster": "NoEligibleCluster",
    "invalid_pools": "InvalidPools",
    "unknown_device_class": "UnknownDeviceClass",
    "cel_error": "CELError",
    "limit_exceeded": "LimitExceeded",
    "pool_being_updated": "PoolBeingUpdated",
    "feature_disabled": "FeatureDisabled",
    "invalid_claim": "InvalidClaim",
    "engine_error": "EngineError",
}
LOST_RACE = "LostRace"
DEFERRED = "deferred"  # an outcome placeholder: not decided this round, retry at once


@dataclass
class RoundResult:
    taken: int = 0
    allocated: int = 0
    pending: int = 0
    failed: int = 0
    lost_race: int = 0
    left_out: int = 0
    seconds: float = 0.0
    changed_ids: list[int] = field(default_factory=list)

    @property
    def should_retry_soon(self) -> bool:
        return bool(self.lost_race or self.left_out)


def fleet_version() -> int:
    state = FleetState.objects.filter(pk=1).values_list("version", flat=True).first()
    if state is None:
        FleetState.objects.get_or_create(pk=1)
        return 1
    return state


def bump_fleet_version() -> None:
    """Devices may have become free: pending claims become eligible again. Call inside the writer's txn."""
    from django.db.models import F

    if not FleetState.objects.filter(pk=1).update(version=F("version") + 1):
        FleetState.objects.get_or_create(pk=1, defaults={"version": 2})


# Annotation keys marking claims that another allocator places (e.g. gangs: all-or-nothing over many
# consumers). The round never takes such claims, nor groups containing one. Apps register theirs in ready().
EXTERNAL_ALLOCATOR_ANNOTATIONS: set[str] = set()


def register_external_allocator(annotation: str) -> None:
    EXTERNAL_ALLOCATOR_ANNOTATIONS.add(annotation)


def managed_elsewhere(claim: ResourceClaim) -> str | None:
    return next((a for a in EXTERNAL_ALLOCATOR_ANNOTATIONS if a in (claim.annotations or {})), None)


def eligible_pending(version):
    """Pending claims not tried since the fleet last changed. ``version``: an int or an expression."""
    qs = (ResourceClaim.objects.filter(phase=Phase.PENDING)
          .filter(Q(attempted_version__isnull=True) | Q(attempted_version__lt=version)))
    for annotation in sorted(EXTERNAL_ALLOCATOR_ANNOTATIONS):
        qs = qs.exclude(annotations__has_key=annotation)
    return qs


def allocate_round(batch_size: int = DEFAULT_BATCH) -> RoundResult:
    started = time.perf_counter()
    result = RoundResult()
    try:
        with transaction.atomic():
            # The fleet version comes with the claims, from the same statement snapshot: anything freed after
            # it bumps the version past what we record, so nothing freed is ever missed.
            current = Subquery(FleetState.objects.filter(pk=1).values("version")[:1])
            # diagnostics (the largest column) is rewritten by every outcome and never read here.
            claims = list(eligible_pending(Coalesce(current, Value(1))).select_related("namespace")
                          .defer("diagnostics", "labels")
                          .annotate(fleet_version=Coalesce(current, Value(1))).order_by("id")
                          .select_for_update(skip_locked=True, of=("self",))[:batch_size])
            if not claims:
                return result
            version = claims[0].fleet_version
            result.taken = len(claims)
            groups, left_out = build_groups(claims)
            result.left_out = len(left_out)
            serialized = locking.serialize_allocators()
            view = fleet.current_view()
            rows = fleet.rows_in_use()
            engine = _engines.engine_for(view, rows)
            outcomes = _run_engine(engine, view, groups)
            _write(engine, view, rows, groups, outcomes, version, result, serialized)
            changed = result.changed_ids
            transaction.on_commit(lambda: _after_commit(changed, result.should_retry_soon))
    except IntegrityError as exc:
        # The unique index refused a row: something slipped past the checks. Nothing of the round was
        # written; its claims are untouched and eligible, so the next round decides them afresh.
        _engines.reset()
        fleet.invalidate()
        log.warning("allocation round rolled back by the unique index, retrying: %s", exc)
        return RoundResult(taken=result.taken, lost_race=result.taken, seconds=time.perf_counter() - started)
    except BaseException:
        _engines.reset()  # its in-use state may now disagree with the database
        raise
    result.seconds = time.perf_counter() - started
    return result


class _EngineCache:
    """One long-lived ``Engine`` per process and fleet snapshot.

    Building an engine (device models, CEL selector memos) costs far more than a round, so it is kept and
    its in-use state is brought up to date from the allocation rows at the start of every round: rows that
    disappeared are released, rows that appeared (other workers) are committed. ``rows`` is what the
    engine currently counts, by row id.
    """

    def __init__(self):
        self.key = None
        self.engine = None
        self.rows: dict[int, object] = {}
        self.poisoned = False

    def reset(self) -> None:
        self.key, self.engine, self.rows, self.poisoned = None, None, {}, False

    def engine_for(self, view: fleet.FleetView, rows: dict[int, object]):
        from dra.engine import Engine

        if self.engine is None or self.key != view.key or self.poisoned:
            self.poisoned = False
            self.engine, self.key = Engine(view.snapshot, list(rows.values())), view.key
        else:
            gone = [self.rows[i] for i in self.rows.keys() - rows.keys()]
            new = [rows[i] for i in rows.keys() - self.rows.keys()]
            if gone:
                self.engine.release(gone)
            if new:
                self.engine.commit(new)
        self.rows = dict(rows)
        return self.engine

    def note_written(self, written: list[tuple]) -> None:
        """``written``: (id, cluster, driver, pool, device, share_id, consumed_capacity, admin_access) rows."""
        from dra.engine import AllocatedDevice

        for row_id, cluster, driver, pool, device, share_id, consumed, admin in written:
            if row_id is None:  # a backend that did not tell: the next round re-reads and resyncs
                self.reset()
                return
            self.rows[row_id] = AllocatedDevice(cluster, driver, pool, device, share_id or None, consumed or None,
                                                admin)


_engines = _EngineCache()


def _after_commit(changed_ids: list[int], retry: bool) -> None:
    from claims import dispatch, notify

    notify.publish(changed_ids)
    if retry:
        dispatch.request_allocation()


def claim_object(claim: ResourceClaim) -> dict:
    return {"apiVersion": k8s.V1, "kind": "ResourceClaim",
            "metadata": {"name": claim.name, "namespace": claim.namespace.name, "uid": str(claim.uid)},
            "spec": claim.spec}


def engine_group(group: Group, view: fleet.FleetView):
    from dra.engine import ClaimGroup

    allowed: set[str] | None = None
    for claim in group.claims:
        names = clusters_matching(claim.allowed_cluster_selector, view.cluster_labels)
        if names is not None:
            allowed = set(names) if allowed is None else allowed & set(names)
    if group.pin_cluster:
        allowed = {group.pin_cluster} if allowed is None else allowed & {group.pin_cluster}
    preferred = next((c.preferred_cluster for c in group.claims if c.preferred_cluster), None)
    return ClaimGroup(claims=[claim_object(c) for c in group.claims],
                      allowed_clusters=sorted(allowed) if allowed is not None else None,
                      preferred_cluster=preferred, node=group.pin_node, key=group.key)


def _run_engine(engine, view: fleet.FleetView, groups: list[Group]) -> list:
    """One outcome per group (None for blocked groups), in order.

    A queue often holds many claims with the same spec ("one GPU", over and over). When one of them fails,
    the next with the same spec and hints fails too unless something was allocated in between (the engine is
    deterministic and only successes change its state during a round), so its outcome is reused instead of
    searching again. This is what keeps re-running a long pending queue after every release cheap.
    """
    outcomes = []
    failed: dict[str, tuple[int, object, ResourceClaim]] = {}  # shape -> (successes then, outcome, claim)
    successes = 0
    for group in groups:
        if group.blocked:
            outcomes.append(None)
            continue
        if _engines.poisoned:
            outcomes.append(DEFERRED)  # decided by a possibly inconsistent engine: retry next round
            continue
        cg = engine_group(group, view)
        shape = _shape(cg) if len(group.claims) == 1 else None
        hit = failed.get(shape) if shape else None
        if hit is not None and hit[0] == successes:
            outcomes.append(_same_failure(hit[1], hit[2], group.claims[0]))
            continue
        try:
            outcome = engine.allocate(cg, raise_errors=False)
        except Exception as exc:  # an engine bug must not wedge the queue: park this group, go on
            log.exception("engine failed on group %s", cg.key)
            from dra.engine import GroupOutcome

            outcome = GroupOutcome(allocated=False, key=cg.key, reason="engine_error",
                                   message=f"internal error in the allocation engine: {exc!r}")
            _engines.poisoned = True  # its in-use state may be half-updated: rebuild after this round
        if outcome.allocated:
            successes += 1
        elif shape and outcome.error is None:
            failed[shape] = (successes, outcome, group.claims[0])
        outcomes.append(outcome)
    return outcomes


def _shape(cg) -> str:
    return json.dumps([cg.claims[0]["spec"], cg.allowed_clusters, cg.preferred_cluster, cg.node], sort_keys=True)


def _same_failure(outcome, like: ResourceClaim, claim: ResourceClaim):
    """``outcome`` (the failure of ``like``) retold for ``claim``: same account, this claim's name in it."""
    pattern = re.compile(re.escape(f"{like.namespace.name}/{like.name}") + r"(?![A-Za-z0-9.-])")
    mine = f"{claim.namespace.name}/{claim.name}"
    message = pattern.sub(mine, outcome.message or "")
    diagnostics = json.loads(pattern.sub(mine, json.dumps(outcome.diagnostics))) if outcome.diagnostics else {}
    return dataclasses.replace(outcome, key=f"claim:{claim.uid}", message=message, diagnostics=diagnostics)


def _rows_for(claim: ResourceClaim, cluster: str, allocation: dict) -> list[DeviceAllocation]:
    rows = []
    for res in ((allocation or {}).get("devices") or {}).get("results") or []:
        rows.append(DeviceAllocation(
            claim=claim, cluster=cluster, driver=res["driver"], pool=res["pool"], device=res["device"],
            share_id=res.get("shareID") or "", consumed_capacity=res.get("consumedCapacity") or None,
            admin_access=bool(res.get("adminAccess")), request=res.get("request", "")[:127]))
    return rows


def _write(engine, view, rows_seen, groups, outcomes, version, result: RoundResult, serialized: bool) -> None:
    now = timezone.now()
    successes = [(g, o) for g, o in zip(groups, outcomes) if o is not None and o is not DEFERRED and o.allocated]

    # Step 4: lock and verify what the successes touch.
    lost: set[int] = set()  # indexes into successes
    if successes:
        devices_by_group: list[set] = []
        pools_by_group: list[set] = []
        for group, outcome in successes:
            keys, pools = set(), set()
            for claim_out in outcome.claims:
                for res in ((claim_out.allocation or {}).get("devices") or {}).get("results") or []:
                    if res.get("adminAccess"):
                        continue  # admin access does not consume the device
                    pool = (outcome.cluster, res["driver"], res["pool"])
                    keys.add((*pool, res["device"]))
                    if pool in view.counter_pools:
                        pools.add(pool)
            devices_by_group.append(keys)
            pools_by_group.append(pools)
        used_clusters = {o.cluster for _, o in successes}
        ids = {view.cluster_versions[c][0]: c for c in used_clusters if c in view.cluster_versions}
        current = locking.cluster_versions_locked(ids)
        changed_clusters = {name for cid, name in ids.items() if current.get(cid) != view.cluster_versions[name][1]}
        changed_clusters |= used_clusters - {ids[cid] for cid in current}
        all_devices = set().union(*devices_by_group)
        all_pools = set().union(*pools_by_group)
        new_devices, new_pools = set(), set()
        if not serialized:  # under the allocators' turn lock nobody else can have added rows (see locking)
            locking.lock(all_devices, all_pools)
            new_devices, new_pools = locking.new_rows({d[:3] for d in all_devices} | all_pools, rows_seen.keys())
        for i, (group, outcome) in enumerate(successes):
            if (outcome.cluster in changed_clusters or devices_by_group[i] & new_devices
                    or pools_by_group[i] & new_pools):
                lost.add(i)
        if changed_clusters:
            fleet.invalidate()

    rows: list[DeviceAllocation] = []
    for i, (group, outcome) in enumerate(successes):
        if i in lost:
            continue
        for claim, co in zip(group.claims, outcome.claims):  # the engine answers in input order
            rows.extend(_rows_for(claim, outcome.cluster, co.allocation if co else None))
    # The unique index is the last line of defence: a violation aborts the whole round (allocate_round).
    written = bulk.insert_rows(rows, returning=ROW_KEY)
    # Keep the cached engine in step: lost groups give their devices back; written rows are now counted.
    for i in lost:
        engine.release(successes[i][1].devices)
    _engines.note_written(written)

    # Step 5: claims and events.
    lost_groups = {id(successes[i][0]) for i in lost}
    updated: list[ResourceClaim] = []
    events = []
    for group, outcome in zip(groups, outcomes):
        for claim in group.claims:
            claim.attempts += 1
            claim.last_attempt_at = now
            claim.updated_at = now
            claim.resource_version += 1
            updated.append(claim)
        if group.blocked:
            _set_pending(group.claims, group.blocked, group.blocked_message, None, version, now, events)
            result.pending += len(group.claims)
        elif outcome is DEFERRED:
            _set_pending(group.claims, "Deferred", "not decided in this round; retrying", None, None, now, events)
            result.lost_race += len(group.claims)
        elif id(group) in lost_groups:
            _set_pending(group.claims, LOST_RACE, "another allocation took a device first; retrying", None,
                         None, now, events)
            result.lost_race += len(group.claims)
        elif outcome.allocated:
            _set_allocated(group, outcome, now, events)
            result.allocated += len(group.claims)
        elif outcome.error is not None:
            code = outcome.error.code
            reason = REASONS.get(code, "AllocationError")
            diag = {"error": outcome.error.to_dict()}
            if code in TERMINAL_ERRORS:
                _set_failed(group, outcome.error, reason, now, events)
                result.failed += len(group.claims)
            else:
                _set_pending(group.claims, reason, outcome.error.message, diag, version, now, events)
                result.pending += len(group.claims)
        else:
            diag = {"reason": outcome.reason, "message": outcome.message, "diagnostics": outcome.diagnostics}
            _set_pending(group.claims, REASONS.get(outcome.reason, "Unsatisfiable"), outcome.message, diag,
                         version, now, events)
            result.pending += len(group.claims)
    bulk.update_rows(updated, UPDATE_FIELDS)
    ev.record(events)
    result.changed_ids = [c.id for c in updated]


ROW_KEY = ("id", "cluster", "driver", "pool", "device", "share_id", "consumed_capacity", "admin_access")
UPDATE_FIELDS = ["phase", "reason", "message", "conditions", "cluster", "node", "allocation", "diagnostics",
                 "attempts", "attempted_version", "last_attempt_at", "allocated_at", "resource_version",
                 "updated_at"]


def _set_pending(claims, reason, message, diagnostics, version, now, events) -> None:
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


def _set_failed(group, error, reason, now, events) -> None:
    for claim in group.claims:
        mine = error.claim in (None, "", claim.name)
        claim.phase = Phase.FAILED if mine else Phase.PENDING
        claim.reason = reason if mine else "ConsumerClaimFailed"
        claim.message = error.message if mine else f"claim {error.claim} of the same consumer failed"
        claim.diagnostics = {"error": error.to_dict()}
        claim.conditions = set_allocated_condition(claim.conditions, False, claim.reason, claim.message, now)
        events.append(ev.event(claim, ev.FAILED if mine else ev.ATTEMPT, claim.reason, claim.message,
                               {"error": error.to_dict()}))


def _set_allocated(group, outcome, now, events) -> None:
    for claim, co in zip(group.claims, outcome.claims):  # the engine answers in input order
        claim.phase = Phase.ALLOCATED
        claim.allocation = co.allocation if co else None
        claim.cluster = outcome.cluster or ""
        claim.node = outcome.node or ""
        claim.allocated_at = now
        claim.reason = "Allocated"
        where = f"{claim.cluster}/{claim.node}" if claim.node else claim.cluster
        claim.message = f"allocated on {where}"
        claim.diagnostics = {"allocated": True, "cluster": claim.cluster, "node": claim.node or None,
                             "group": group.key if group.consumers else None}
        claim.conditions = set_allocated_condition(claim.conditions, True, "Allocated", claim.message, now)
        results = ((claim.allocation or {}).get("devices") or {}).get("results") or []
        events.append(ev.event(claim, ev.ALLOCATED, "Allocated", claim.message,
                               {"cluster": claim.cluster, "node": claim.node or None,
                                "devices": [{k: r.get(k) for k in ("request", "driver", "pool", "device", "shareID")
                                             if r.get(k) is not None} for r in results]}))
