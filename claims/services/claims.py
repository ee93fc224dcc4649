"""Creating, changing, releasing and deleting ResourceClaims (and their templates).

Every public function is one transaction. Work for the allocator is requested only after commit
(``transaction.on_commit``), so a worker never looks for a claim that is not visible yet.
"""
from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from django.db import IntegrityError, connection, transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from claims import claims_sql, dispatch, k8s
from claims.models import (
    DeviceAllocation,
    Namespace,
    Phase,
    Reservation,
    ResourceClaim,
)
from claims.placement import LEASE_TTL, MAX_LEASE, MIN_LEASE, parse_annotations, parse_duration
from claims.services import bulk, caps, external, history, insert, queueing, renewal, wake, walltime
from claims.services import events as ev
from claims.services.conditions import RELEASED, RELEASING, is_true, set_allocated_condition, set_condition
from draservice import notify
from draservice.bulk import mark_saved, pg_execute
from draservice.errors import AlreadyExists, Conflict, Invalid
from draservice.etag import check_precondition
from draservice.prepared import Prepared
from usage import usage_sql
from usage.services import ledger

MAX_BATCH = 1000
LEASE_EXPIRED = "LeaseExpired"
RELEASE_DEADLINE = "ReleaseDeadlinePassed"
PENDING_TIMEOUT = "PendingTimeout"


_known_classes: tuple[float, frozenset[str]] = (0.0, frozenset())
CLASS_CACHE_SECONDS = 5.0


def get_namespace_for_write(name: str) -> Namespace:
    """Namespaces come into being with their first object (a namespace token names them in advance)."""
    errors = k8s.check_dns_label(name, "metadata.namespace")
    if errors:
        raise Invalid(errors)
    ns, _ = Namespace.objects.get_or_create(name=name)
    return ns


def _known_device_classes(wanted: set[str]) -> frozenset[str]:
    """DeviceClass names, cached for a few seconds; a name not in the cache is looked up before refusing."""
    global _known_classes
    from inventory.models import DeviceClass

    at, names = _known_classes
    if time.monotonic() - at > CLASS_CACHE_SECONDS or not wanted <= names:
        names = frozenset(DeviceClass.objects.values_list("name", flat=True).distinct())
        _known_classes = (time.monotonic(), names)
    return names


# --------------------------------------------------------------------------------------------- parsing

def build_claim(ns: Namespace, obj: dict, path: str = "", now=None) -> ResourceClaim:
    """An unsaved claim from a request object (any supported apiVersion). Raises Invalid."""
    prefix = f"{path}." if path else ""
    api_version = k8s.check_kind(obj, "ResourceClaim", path)
    meta = k8s.parse_metadata(obj, f"{prefix}metadata", namespace=ns.name)
    spec = k8s.claim_spec_to_v1(obj.get("spec"), api_version, f"{prefix}spec")
    placement = parse_annotations(meta["annotations"], f"{prefix}metadata.annotations")
    now = now or timezone.now()
    claim = ResourceClaim(namespace=ns, name=meta["name"], labels=meta["labels"], annotations=meta["annotations"],
                          spec=spec, source_api_version=api_version,
                          allowed_cluster_selector=placement.allowed_cluster_selector,
                          preferred_cluster=placement.preferred_cluster,
                          reason="WaitingForAllocation", message="waiting for the allocator",
                          conditions=set_allocated_condition([], False, "WaitingForAllocation",
                                                             "waiting for the allocator", now))
    if placement.lease is not None:  # the walltime: its clock starts at allocation (``commit.set_allocated``)
        claim.lease_seconds = int(placement.lease.total_seconds())
    if placement.pending_timeout is not None:
        claim.pending_deadline = now + placement.pending_timeout
    return claim


def check_device_classes(items: list[tuple[str, dict]]) -> None:
    """Refuse requests naming a DeviceClass that exists nowhere in the fleet (a typo would wait forever).

    ``items``: (path of the spec in the request body, v1 spec).
    """
    wanted = {(f"{path}.{sub}", name) for path, spec in items for sub, name in k8s.device_class_names(spec)}
    if not wanted:
        return
    known = _known_device_classes({n for _, n in wanted})
    errors = sorted((p, f'DeviceClass "{n}" not found') for p, n in wanted if n not in known)
    if errors:
        raise Invalid(errors)


# --------------------------------------------------------------------------------------------- create

def create_claims(ns_name: str, objects: list[dict], *, paths: list[str] | None = None) -> list[ResourceClaim]:
    """Create claims in one transaction: all or none. ``paths`` locate each object in the request body."""
    if len(objects) > MAX_BATCH:
        raise Invalid([("items", f"must have at most {MAX_BATCH} items")])
    # 403 past the namespace's pending-claims cap: more claims than it allows at all, at once; the pending ones
    # counted, on PostgreSQL by the INSERT statement itself (``claims.services.insert``), else before any write
    # (either way refused outside the transaction block below, so that a caller's transaction stays usable).
    limit = caps.pending_claims_limit(ns_name)
    if len(objects) > limit:
        caps.refuse_pending_claims(limit, caps.pending_claims_used(ns_name, limit), len(objects))
    paths = paths or [""] * len(objects)
    if connection.vendor == "postgresql" and len(objects) == 1 and not connection.in_atomic_block:
        # One claim on PostgreSQL: ONE statement writes the claim and its event (see claims.services.insert), and a
        # statement is atomic by itself, so no BEGIN/COMMIT round trips. A name already taken inserts nothing;
        # the namespace's first claim creates the namespace in a transaction of its own (below).
        made = _create_claims(ns_name, objects, paths)
    else:
        with transaction.atomic(savepoint=False):  # inside a caller's transaction, no savepoint round trips
            made = _create_claims(ns_name, objects, paths)
    if isinstance(made, _OverCap):
        # Raised out here: through the block above it would leave a caller's transaction unusable (it wrote
        # nothing to undo).
        caps.refuse_pending_claims(made.limit, made.used, made.adding)
    assert isinstance(made, list)
    return made


@dataclass(frozen=True)
class _OverCap:
    """The INSERT found the namespace's pending claims at their cap and inserted nothing."""

    limit: int
    used: int
    adding: int


def _create_claims(ns_name: str, objects: list[dict], paths: list[str]) -> list[ResourceClaim] | _OverCap:
    if connection.vendor == "postgresql":
        errors = k8s.check_dns_label(ns_name, "metadata.namespace")
        if errors:
            raise Invalid(errors)
        # The namespace row is looked up by the INSERT itself (one statement, see claims.services.insert); a stand-in
        # carries the name until then.
        ns = Namespace(name=ns_name)
    else:
        limit = caps.pending_claims_limit(ns_name)
        used = caps.pending_claims_used(ns_name, limit)
        if used + len(objects) > limit:
            return _OverCap(limit, used, len(objects))
        ns = get_namespace_for_write(ns_name)
    now = timezone.now()
    claims: list[ResourceClaim] = []
    problems: list[dict] = []
    for obj, path in zip(objects, paths, strict=False):
        try:
            claims.append(build_claim(ns, obj, path, now))
        except Invalid as exc:
            problems.extend(exc.errors)
    if problems:
        raise Invalid(problems)
    check_device_classes([(f"{p}.spec" if p else "spec", c.spec) for c, p in zip(claims, paths, strict=False)])
    errors = queueing.check_new_claims(ns_name, [(p, c) for c, p in zip(claims, paths, strict=False)])
    if errors:  # a queue the namespace may not use, a priority over the queue's maxPriority
        raise Invalid(errors)
    names = [(c.name, p) for c, p in zip(claims, paths, strict=False)]
    _check_duplicates(names)
    # Insert first: the unique (namespace, name) index answers "is the name free" without a query of its
    # own; only when a row was refused is the culprit named.
    if connection.vendor == "postgresql":  # ON CONFLICT DO NOTHING: no savepoint, no aborted transaction
        events = _created_events(claims)
        limit = caps.pending_claims_limit(ns_name)
        ids, ns_row, used, stamp = insert.claims_and_events(ns_name, claims, events, limit)
        if ns_row is None:  # the namespace's first object: create the namespace, then insert again
            with transaction.atomic(savepoint=False):
                get_namespace_for_write(ns_name)
                ids, ns_row, used, stamp = insert.claims_and_events(ns_name, claims, events, limit)
            if ns_row is None:
                raise Conflict(f'namespace "{ns_name}" was deleted concurrently')
        if used + len(claims) > limit:  # nothing was inserted: 403, as a ResourceQuota refuses
            return _OverCap(limit, used, len(claims))
        ns = ns_row
        for c in claims:
            c.fleet_stamp = stamp  # type: ignore[attr-defined]  # what the answer's queue is resolved at
        if len(ids) != len(claims):
            taken = [(n, p) for n, p in names if n not in ids]
            _check_names_free(ns, taken)  # raises 409 naming them
            raise Conflict("a claim with one of these names was created concurrently")
        for c in claims:
            c.namespace = ns
    else:
        try:
            with transaction.atomic():  # a savepoint, so that the culprit can be looked up after a failure
                ids = {name: pk for pk, name in bulk.insert_rows(claims, returning=("id", "name"))}
                history.record(claims)
        except IntegrityError as exc:
            _check_names_free(ns, names)
            raise Conflict("a claim with one of these names was created concurrently") from exc
    for c in claims:
        c.pk = c.id = ids[c.name]
    mark_saved(claims)
    if connection.vendor != "postgresql":
        ev.record(_created_events(claims))
    transaction.on_commit(dispatch.request_allocation)
    return claims


# Upstream defaulting: a ResourceClaim whose spec is null or has no device requests is valid, and the
# allocator allocates it at once with no devices. We do the same, but say so, because it is almost always a
# manifest mistake (a wrong indentation, a v1beta1 field in a v1 object) rather than intent.
EMPTY_SPEC_NOTE = ("spec has no device requests (null or empty spec.devices): as upstream defaults it, the claim "
                   "is allocated with no devices")


def _created_events(claims: list[ResourceClaim]) -> list:
    out = []
    for c in claims:
        message = f"submitted as {c.source_api_version}"
        if not ((c.spec or {}).get("devices") or {}).get("requests"):
            message += f"; {EMPTY_SPEC_NOTE}"
        out.append(ev.event(c, ev.CREATED, "Created", message,
                            {"lease": c.lease_seconds} if c.lease_seconds else None))
    return out


def _check_duplicates(names: list[tuple[str, str]]) -> dict[str, str]:
    seen: dict[str, str] = {}
    errors = []
    for name, path in names:
        field = f"{path}.metadata.name" if path else "metadata.name"
        if name in seen:
            errors.append((field, f'Duplicate value: "{name}" (also at {seen[name] or "the first item"})'))
        seen.setdefault(name, path)
    if errors:
        raise Invalid(errors)
    return seen


def _check_names_free(ns: Namespace, names: list[tuple[str, str]]) -> None:
    seen = _check_duplicates(names)
    taken = set(ResourceClaim.objects.filter(namespace=ns, name__in=list(seen)).values_list("name", flat=True))
    if taken:
        errors = [(f"{seen[n]}.metadata.name" if seen[n] else "metadata.name",
                   f'resourceclaims "{n}" already exists') for n in sorted(taken)]
        raise AlreadyExists(errors)


# --------------------------------------------------------------------------------------------- update

def update_claim(claim_id: int, obj: dict, *, if_match: str | None = None) -> ResourceClaim:
    """PUT of a whole claim: only metadata.labels and metadata.annotations may change; spec is immutable."""
    with transaction.atomic():
        claim = _locked(claim_id)
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        check_precondition(claim, if_match, (meta or {}).get("resourceVersion") if isinstance(meta, dict) else None)
        api_version = k8s.check_kind(obj, "ResourceClaim")
        parsed = k8s.parse_metadata({"metadata": {**(meta or {}), "name": claim.name}}, namespace=claim.namespace.name)
        if (meta or {}).get("name") not in (None, claim.name):
            raise Invalid([("metadata.name", "field is immutable")])
        if obj.get("spec") is not None and k8s.claim_spec_to_v1(obj.get("spec"), api_version, "spec") != claim.spec:
            raise Invalid([("spec", "field is immutable")])
        # Annotations of another allocator (a gang's member marker) belong to that allocator: letting a user
        # drop one would make the claims round allocate a gang member on its own, outside the gang's all-or-nothing.
        for key in sorted(external.EXTERNAL_ALLOCATOR_ANNOTATIONS):
            if (claim.annotations or {}).get(key) != parsed["annotations"].get(key):
                raise Invalid([(f"metadata.annotations[{key}]", "field is managed by draservice and immutable")])
        placement = parse_annotations(parsed["annotations"])
        # New labels may name another queue or priority: the same rules as at creation; and an admitted claim's
        # queue cannot change (its quota is charged there).
        errors = queueing.check_label_change(claim, parsed["labels"])
        if errors:
            raise Invalid(errors)
        _apply_lease_change(claim, placement.lease, timezone.now())
        _apply_pending_timeout(claim, placement.pending_timeout)
        claim.labels, claim.annotations = parsed["labels"], parsed["annotations"]
        claim.allowed_cluster_selector = placement.allowed_cluster_selector
        claim.preferred_cluster = placement.preferred_cluster
        claim.resource_version += 1
        # A placement change can make a pending claim placeable: try it again.
        claim.attempted_version = None
        claim.save(update_fields=["labels", "annotations", "allowed_cluster_selector", "preferred_cluster",
                                  "lease_seconds", "lease_expires_at", "pending_deadline", "resource_version",
                                  "attempted_version", "updated_at"])
        if claim.phase == Phase.PENDING:
            transaction.on_commit(dispatch.request_allocation)
    return claim


def _apply_lease_change(claim: ResourceClaim, lease: timedelta | None, now) -> None:
    """The lease annotation is the lease's one source: ``leaseDurationSeconds`` and ``expireTime`` always agree
    with it. On an allocated claim a changed (or new) TTL starts a fresh lease from now, as a renewal with that
    TTL would; an unchanged one leaves the lease alone; a removed one ends the lease (the claim is kept until
    released). A pending claim's lease has not started: only its length changes."""
    if claim.phase not in (Phase.PENDING, Phase.ALLOCATED):
        return
    seconds = int(lease.total_seconds()) if lease is not None else None
    if seconds == claim.lease_seconds:
        return
    claim.lease_seconds = seconds
    claim.lease_expires_at = now + lease if lease is not None and claim.phase == Phase.ALLOCATED else None


def _apply_pending_timeout(claim: ResourceClaim, timeout: timedelta | None) -> None:
    """The pending-timeout annotation bounds the first wait, counted from creation: set, changed or removed
    on a claim that was never allocated, it moves the deadline; on any other claim it no longer applies."""
    if claim.phase != Phase.PENDING or claim.allocated_at is not None or claim.reason == "Preempted":
        return
    claim.pending_deadline = claim.created_at + timeout if timeout is not None else None


# --------------------------------------------------------------------------------------------- release

# The row lock every single-claim write starts with, compiled once (draservice.prepared): compiling it cost more
# CPU than running it. Stand-in: no claim id is negative.
_LOCKED = Prepared(lambda pk: ResourceClaim.objects.select_for_update(of=("self",)).select_related("namespace")
                   .filter(pk=pk).order_by(), (-7_000_000_001,))


# The same lock by name, with the owner and whether anything reserves the claim (what the API's answer renders:
# most claims have no reservation, and their read is then skipped), and the fleet stamp its queue is resolved
# at. Stand-ins: no name holds a NUL.
_LOCKED_BY_NAME = Prepared(lambda ns, name: ResourceClaim.objects.select_for_update(of=("self",))
                           .select_related("namespace", "owner")
                           .annotate(reserved=Exists(Reservation.objects.filter(claim_id=OuterRef("pk"))),
                                     fleet_stamp=claims_sql.fleet_stamp_expression())
                           .filter(namespace__name=ns, name=name).order_by(),
                           ("\x00ns", "\x00name"))


def _locked(claim_id: int) -> ResourceClaim:
    """The claim, its row locked (inside the caller's transaction); DoesNotExist as ``get`` raises it."""
    claim = _LOCKED.first(claim_id)
    if claim is None:
        raise ResourceClaim.DoesNotExist("ResourceClaim matching query does not exist.")
    return claim


def _release_locked(claims: list[ResourceClaim], reason: str, message: str, now) -> list[ResourceClaim]:
    """Release claims whose rows the caller has locked. Returns those that changed."""
    live = [c for c in claims if c.phase in (Phase.PENDING, Phase.ALLOCATED)]
    if not live:
        return []
    events = []
    pending = [c for c in live if c.phase == Phase.PENDING]
    queueing.preemptors_gone(pending, reason)
    held = wake.held_nodes([c.id for c in pending]) if pending else set()  # a head's hold ends with it
    for c in live:
        had = c.phase == Phase.ALLOCATED
        c.phase = Phase.RELEASED
        c.reason, c.message = reason, message
        c.allocation = None
        c.released_at = now
        c.lease_expires_at = None
        c.resource_version += 1
        c.updated_at = now
        c.conditions = set_condition(set_allocated_condition(c.conditions, False, reason, message, now),
                                     RELEASED, True, reason, message, now)
        if is_true(c.conditions, RELEASING):
            c.conditions = set_condition(c.conditions, RELEASING, False, reason, message, now)
        events.append(ev.event(c, ev.LEASE_EXPIRED if reason == LEASE_EXPIRED else ev.RELEASED, reason, message,
                               {"wasAllocated": had, "cluster": c.cluster or None, "node": c.node or None}))
    # The rows, their events (as ev.record writes them) and the freeing of their devices: one statement on
    # PostgreSQL (a round trip, and the driver's and PostgreSQL's per-statement CPU, fewer on every release).
    ids = [c.id for c in live]
    freed = free_devices(ids, now, written=(live, _RELEASED_FIELDS, events))
    if held:
        freed.update(wake.offer_again(wake.devices_on(held)))
    if freed:  # counted for the wake-ups: only claims they could serve wake
        transaction.on_commit(dispatch.request_allocation)
    transaction.on_commit(lambda: notify.publish(ids))
    return live


_RELEASED_FIELDS = ["phase", "reason", "message", "allocation", "released_at", "lease_expires_at", "resource_version",
                    "updated_at", "conditions"]


def free_devices(claim_ids: list[int], now, written: tuple[list, list[str], list] | None = None) -> Counter:
    """Free the devices of claims whose rows the caller has locked, for every way a claim gives its devices
    back (a release, a preemption's requeue): delete their DeviceAllocation rows and their wake rows
    (``wake.forget``), end their quota charges (``queueing.uncharge``), close their usage intervals
    (``ledger.close_intervals``; same transaction: the ledger matches the rows), and count the freed devices
    for the wake-ups (``wake.released``) and offer each to the first few pending claims it can serve
    (``wake.offer``: insert-only ``ReleasedDevice`` rows the round's wake-up step reads,
    ``scheduler.services.wakeups``). Returns the devices freed per cluster. It updates no row another release
    or move writes (on PostgreSQL: the counts are insert-only ``FreedCount`` rows), so concurrent releases never
    wait on each other here. On PostgreSQL one statement (the others as data-modifying WITH queries, which run
    whether or not the main query reads them): every release runs it, and each statement costs the web a round
    trip and the driver's and Django's per-statement CPU. ``written``: (claims, their fields, events) that the
    caller changed, written first (``bulk.update_and_insert``; on PostgreSQL in that same statement)."""
    if connection.vendor != "postgresql":
        if written is not None:
            bulk.update_and_insert(*written)
        rows = DeviceAllocation.objects.filter(claim_id__in=claim_ids)
        devices = list(rows.filter(admin_access=False).values_list("cluster", "driver", "pool", "device"))
        freed = Counter(rows.values_list("cluster", flat=True))
        rows.delete()
        wake.forget(claim_ids)
        queueing.uncharge(claim_ids)
        ledger.close_intervals(claim_ids, now)
        wake.released(freed)
        wake.offer(devices)
        return freed
    table = connection.ops.quote_name(DeviceAllocation._meta.db_table)
    more, params = bulk.update_and_insert_ctes(*written) if written is not None else ("", {})
    uncharged = queueing.uncharge_sql()
    if uncharged:
        more = f"{more}, {uncharged}" if more else uncharged
    sql = (f"WITH {more + ', ' if more else ''}forgotten AS ({wake.forget_sql()}), "
           f"{usage_sql.close_intervals_ctes()}, "
           f"freed AS (DELETE FROM {table} WHERE claim_id = ANY(%(ids)s) "
           "RETURNING cluster, driver, pool, device, admin_access), "
           f"{wake.released_sql('freed')}, {wake.offer_sql('freed')} "
           "SELECT cluster, count(*) FROM freed GROUP BY cluster")
    ids: list[int] | int = claim_ids
    if len(claim_ids) == 1:
        # One claim (every release): an array of one built in the statement. The statement is prepared on the
        # connection after a few runs (pg_execute), but PostgreSQL kept planning it anew at every run: a plan
        # for any array parameter assumes ten ids, and its estimate lost to the custom plan's for one (half a
        # millisecond of the server's CPU per release, as much as running it). For ARRAY[id] both are the same.
        sql, ids = sql.replace("ANY(%(ids)s)", "ANY(ARRAY[%(ids)s::bigint])"), claim_ids[0]
    cursor = pg_execute(sql, {"ids": ids, "now": now, **wake.wake_params(), **params})
    try:
        return Counter(dict(cursor.fetchall()))
    finally:
        cursor.close()


def release_claim(claim_id: int, *, if_match: str | None = None, reason: str = "Released",
                  message: str = "released by its holder") -> ResourceClaim:
    """Free the claim's devices at once. Releasing a released claim is a no-op (retries are safe)."""
    with transaction.atomic():
        return _release_one(_locked(claim_id), if_match, reason, message)


def release_named_claim(namespace: str, name: str, check: Callable[[ResourceClaim], None], *,
                        if_match: str | None = None) -> ResourceClaim | None:
    """``release_claim`` of the claim ``namespace``/``name`` (None: there is none), read once: its row is
    locked and read by name, ``check(claim)`` (the caller's permission check) may refuse by raising, and
    the claim is released. The API's release read the claim for its check and then locked it by id: two
    reads (and its reservations) for one. The claim carries ``reserved`` (whether a reservation existed under
    the lock; a released claim gains none)."""
    with transaction.atomic():
        claim = _LOCKED_BY_NAME.first(namespace, name)
        if claim is None:
            return None
        check(claim)
        return _release_one(claim, if_match, "Released", "released by its holder")


def _release_one(claim: ResourceClaim, if_match: str | None, reason: str, message: str) -> ResourceClaim:
    check_precondition(claim, if_match)
    if claim.phase != Phase.FAILED:
        _release_locked([claim], reason, message, timezone.now())
    return claim


def begin_release(claim_id: int, *, grace: timedelta, reason: str, message: str) -> ResourceClaim:
    """Release later, safely: the claim keeps its devices (nothing else can take them) until whoever runs the
    workload confirms that no pod uses them any more by releasing the claim (``release_claim``: the cluster's
    agent with its cluster token, or an admin), or until ``grace`` has passed, when ``expire_leases`` releases
    it. Marked by the ``Releasing`` condition; the deadline is the claim's lease expiry, which cannot be
    renewed while it is releasing."""
    with transaction.atomic():
        claim = _locked(claim_id)
        if claim.phase != Phase.ALLOCATED:
            raise Conflict(f"the claim is {claim.phase}; only an allocated claim can be released later")
        now = timezone.now()
        deadline = now + grace
        if claim.lease_expires_at is None or claim.lease_expires_at > deadline:
            claim.lease_expires_at = deadline
        claim.conditions = set_condition(claim.conditions, RELEASING, True, reason, message, now)
        claim.resource_version += 1
        claim.save(update_fields=["lease_expires_at", "conditions", "resource_version", "updated_at"])
        ev.record([ev.event(claim, ev.RELEASING, reason, message,
                            {"deadline": claim.lease_expires_at.strftime("%Y-%m-%dT%H:%M:%SZ")})])
    return claim


def delete_claim(claim_id: int, *, if_match: str | None = None) -> None:
    with transaction.atomic():
        claim = _locked(claim_id)
        check_precondition(claim, if_match)
        now = timezone.now()
        _release_locked([claim], "Deleted", "deleted", now)
        ev.record([ev.event(claim, ev.DELETED, "Deleted", "claim deleted")])
        claim.delete()


def renew_lease(claim_id: int, *, ttl: str | None = None, if_match: str | None = None) -> ResourceClaim:
    with transaction.atomic():
        claim = _locked(claim_id)
        check_precondition(claim, if_match)
        if claim.phase not in (Phase.PENDING, Phase.ALLOCATED):
            raise Conflict(f"the claim is {claim.phase}; only a pending or allocated claim's lease can be renewed")
        if is_true(claim.conditions, RELEASING):
            raise Conflict("the claim is being released (condition Releasing): its deadline cannot be renewed")
        if ttl is not None:
            duration = parse_duration(ttl, "ttl")
            if not MIN_LEASE <= duration <= MAX_LEASE:
                raise Invalid([("ttl", "must be between 5s and 7d")])
            claim.lease_seconds = int(duration.total_seconds())
            # Keep the annotation (the lease's source, see ``_apply_lease_change``) in step with the new TTL.
            claim.annotations = {**(claim.annotations or {}), LEASE_TTL: ttl.strip()}
        if not claim.lease_seconds:
            raise Invalid([("ttl", "the claim has no lease; give a ttl to start one")])
        now = timezone.now()
        # A pending claim's lease starts at its allocation: a renewal sets only its length.
        claim.lease_expires_at = (now + timedelta(seconds=claim.lease_seconds)
                                  if claim.phase == Phase.ALLOCATED else None)
        renewal.check_backfill(claim)
        claim.lease_renewed_at = now
        claim.resource_version += 1
        claim.save(update_fields=["lease_seconds", "lease_expires_at", "lease_renewed_at", "resource_version",
                                  "annotations", "updated_at"])
        said = (f"lease renewed until {claim.lease_expires_at:%Y-%m-%dT%H:%M:%SZ}" if claim.lease_expires_at
                else f"lease of {claim.lease_seconds}s set: it starts when the claim is allocated")
        ev.record([ev.event(claim, ev.LEASE_RENEWED, "LeaseRenewed", said)])
    return claim


def expire_leases(limit: int = 500, batches: int = 40) -> int:
    """Release claims whose lease ran out, and pending claims past their ``pending-timeout`` (``sweep_leases``
    with no time bound). Returns the number released."""
    return sweep_leases(limit, batches)[0]


def sweep_leases(limit: int = 500, batches: int = 40, seconds: float | None = None) -> tuple[int, bool]:
    """``expire_leases``: ``limit`` rows a transaction until a batch takes fewer, at most ``batches`` of them and,
    with ``seconds``, no new batch once that time has passed. Returns (released, whether more may be due). A
    batch is full by the rows it took, not those it released: a watched claim's lapsed lease gets only its
    notice, so under load no batch released ``limit``, and a sweep that stopped there fell behind."""
    released = 0
    deadline = time.monotonic() + seconds if seconds is not None else None
    for _ in range(batches):
        count, full = _expire_batch(limit)
        released += count
        if not full:
            return released, False
        if deadline is not None and time.monotonic() >= deadline:
            break
    return released, True


def _expire_batch(limit: int) -> tuple[int, bool]:
    """One transaction of ``expire_leases``: (claims released, whether either query found ``limit`` rows).
    Skips rows another transaction holds (they are retried later)."""
    now = timezone.now()
    with transaction.atomic():
        due = list(ResourceClaim.objects.select_for_update(skip_locked=True, of=("self",))
                   .select_related("namespace")
                   .filter(lease_expires_at__lte=now, phase__in=[Phase.PENDING, Phase.ALLOCATED])
                   .order_by("lease_expires_at")[:limit])
        waited = list(ResourceClaim.objects.select_for_update(skip_locked=True, of=("self",))
                      .select_related("namespace").filter(pending_deadline__lte=now, phase=Phase.PENDING)
                      .order_by("pending_deadline")[:limit])
        ended, releasing = walltime.forced([c for c in due if is_true(c.conditions, RELEASING)])
        lapsed = [c for c in due if not is_true(c.conditions, RELEASING)]
        # A walltime's end is a notice first (``walltime``): released now are those nothing can be using.
        lapsed = [c for c in lapsed if c.phase != Phase.ALLOCATED] + walltime.notice(
            [c for c in lapsed if c.phase == Phase.ALLOCATED], now)
        released = _release_locked(lapsed, LEASE_EXPIRED, "the lease was not renewed in time", now)
        released += _release_locked(ended, LEASE_EXPIRED, "its walltime ended and nobody confirmed before its "
                                    "queue's forceAfterSeconds that its devices were no longer used", now)
        # A release nobody confirmed before its deadline happens now (see ``begin_release``).
        released += _release_locked(releasing, RELEASE_DEADLINE, "released at the end of its grace period: "
                                    "nobody confirmed earlier that its devices were no longer used", now)
        released += _release_locked(waited, PENDING_TIMEOUT, "not allocated within its "
                                    "draservice.io/pending-timeout", now)
    return len(released), max(len(due), len(waited)) >= limit
