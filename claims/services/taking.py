"""Taking pending claims for a decision: which are eligible, and the ``taken_until`` marks that keep concurrent
workers off each other's claims (the scheduler's round asks; the claims app owns the rows and their marks).

``take`` reads up to a batch of eligible pending claims, oldest first, ``FOR UPDATE SKIP LOCKED`` and marks
them ``taken_until`` in one short transaction: concurrent workers get disjoint batches and never wait on each
other, and a worker that dies leaves its marks to expire. A claim is eligible when it was never tried, every
pending claim was woken since it was tried (``FleetState.wake_all_version``), or a freed device woke it
(``scheduler.services.wakeups`` clears its ``attempted_version``: a release alone wakes nobody).
"""
from __future__ import annotations

import functools
import logging
from datetime import timedelta

from django.db import connection, transaction
from django.db.models import BooleanField, F, Func, Q, Subquery, Value
from django.db.models.expressions import RawSQL
from django.db.models.functions import Coalesce
from django.utils import timezone

from claims.models import FleetState, Phase, ResourceClaim
from claims.services import external, wake
from draservice.prepared import Prepared

log = logging.getLogger(__name__)

# How long a worker holds the claims it took while it decides (``taken_until``). A worker that dies (SIGKILL)
# mid-round leaves them taken this long; after that any worker takes them again.
TAKE_SECONDS = 30


def fleet_version() -> int:
    """A version that moves with every change that may free devices or wake claims (releases and preemption
    moves, inventory, classes, queues): whatever is committed after one read makes every later read larger.
    Gangs are stamped with it. Pending claims are stamped with ``claims_version`` instead."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {wake.clock_sql()}, EXISTS (SELECT 1 FROM "
                       f"{connection.ops.quote_name(FleetState._meta.db_table)} WHERE id = 1)")
        version, exists = cursor.fetchone()
    if not exists:
        FleetState.objects.get_or_create(pk=1)
    return int(version)


def claims_version() -> int:
    """The version pending claims are stamped with (``attempted_version``): moved only by the changes that
    wake every pending claim (``bump_fleet_version``); a release wakes claims by their counters instead."""
    state = FleetState.objects.filter(pk=1).values_list("version", flat=True).first()
    if state is None:
        FleetState.objects.get_or_create(pk=1)
        return 1
    return state


def read_version() -> wake.Version:
    """``claims_version`` with the wake counters read after it (as ``take`` returns it)."""
    return wake.read_version(claims_version())


def bump_fleet_version() -> None:
    """The fleet changed in a way that may help any pending claim (inventory, classes, queues): every one
    becomes eligible again. Call inside the writer's txn. A release counts what it freed instead
    (``wake.released``) and wakes only the claims that could use it."""
    wake.bump_version()


def undecided_pending(version=None):
    """Pending claims a round would decide now, taken ones included. ``version`` is not needed (kept for
    callers that pass the fleet version): a claim is eligible if it was never tried (or a freed device woke
    it: ``scheduler.services.wakeups``) or every pending claim was woken since it was tried
    (``FleetState.wake_all_version``)."""
    pending = ResourceClaim.objects.filter(phase=Phase.PENDING)
    if connection.vendor == "postgresql":
        # The eligible ids first, each part from an index (never tried / tried before the last wake-all by
        # claims_claim_attempted, woken by the wake rows), then only those rows. Asked as one OR over the
        # pending claims, the planner reads and filters every pending row to find the few a release woke, in
        # every round, the empty ones too: the work must grow with the eligible claims, not the pending ones.
        qs = pending.filter(_InArray(F("id"), RawSQL(_candidates(), [Phase.PENDING, Phase.PENDING])))
    else:
        wake_all = Coalesce(Subquery(FleetState.objects.filter(pk=1).values("wake_all_version")[:1]), Value(1))
        qs = pending.filter(Q(attempted_version__isnull=True) | Q(attempted_version__lt=wake_all))
    for annotation in sorted(external.EXTERNAL_ALLOCATOR_ANNOTATIONS):
        qs = qs.exclude(annotations__has_key=annotation)
    return qs


@functools.cache
def _candidates() -> str:
    """The same two parts as the ORM's OR below, as one fixed text: compiled from querysets (a union of
    three) it cost the worker more CPU than the rest of the take query."""
    table = {name: connection.ops.quote_name(model._meta.db_table) for name, model in (
        ("claim", ResourceClaim), ("fleet", FleetState))}
    return ("SELECT id FROM {claim} WHERE phase = %s AND attempted_version IS NULL UNION ALL "
            "SELECT id FROM {claim} WHERE phase = %s AND attempted_version < "
            "COALESCE((SELECT wake_all_version FROM {fleet} WHERE id = 1), 1)").format(**table)


class _InArray(Func):
    """``expr = ANY(ARRAY(subquery))`` (PostgreSQL): the subquery runs once, and the outer rows are found by
    index lookups of its values (an ``IN (subquery)`` may be planned as a scan of the outer table)."""

    arg_joiner = " = ANY(ARRAY"
    template = "(%(expressions)s))"
    output_field = BooleanField()


def eligible_pending(version=None):
    """Pending claims not tried since something that may help them changed, and not taken by a worker."""
    return undecided_pending(version).filter(_not_taken())


def take(batch_size: int) -> tuple[list[ResourceClaim], int]:
    """The oldest eligible pending claims, marked taken by this worker (one short transaction), and the
    version to stamp them with (a ``wake.Version``: with the wake counters).

    ``FOR UPDATE SKIP LOCKED`` plus ``taken_until``: concurrent workers get disjoint batches and never wait on
    each other, and no row lock is held while the engine runs. The claims' version comes with the claims, from
    the same statement snapshot (a wake-all committed after it moves ``wake_all_version`` past what we
    record), and the wake counters right after, before the caller reads the devices in use: a release they
    do not include is counted towards the marks of the claims it may help (``wake.store``), so nothing freed
    is ever missed.
    """
    with transaction.atomic():
        claims = _take_query(batch_size, frozenset(external.EXTERNAL_ALLOCATOR_ANNOTATIONS)).rows()
        if not claims:
            return claims, 0
        mark_taken([c.id for c in claims])
    return claims, wake.read_version(claims[0].claims_version)


@functools.lru_cache(maxsize=8)
def _take_query(batch_size: int, external_annotations: frozenset[str]) -> Prepared:
    """``take``'s statement, compiled once per batch size (and per thread and connection, by ``Prepared``):
    building and compiling this queryset is CPU every round would spend again, the empty ones too."""

    def build():
        current = Subquery(FleetState.objects.filter(pk=1).values("version")[:1])
        # diagnostics (the largest column) is rewritten by every outcome and never read here. Labels are read
        # (queue resolution orders the round and admits its units): deferring them cost a second query.
        qs = (eligible_pending(Coalesce(current, Value(1))).select_related("namespace").defer("diagnostics")
              .annotate(claims_version=Coalesce(current, Value(1))))
        if connection.vendor == "postgresql":
            # _no_flush_wait() without its own statement: evaluated for each row taken, so the transaction
            # commits without the WAL flush whenever it locked something (with no row it writes nothing).
            qs = qs.annotate(no_flush_wait=RawSQL("set_config('synchronous_commit', 'off', true)", []))
        return qs.order_by("id").select_for_update(skip_locked=True, of=("self",))[:batch_size]

    return Prepared(build, ())


def take_members(ids: list[int]) -> set[int]:
    """Mark pending claims outside the batch (members of a batch claim's group) taken; returns those taken.
    A member another worker holds is not returned: its group is left for a later round."""
    if not ids:
        return set()
    with transaction.atomic():
        _no_flush_wait()
        got = list(ResourceClaim.objects.select_for_update(skip_locked=True, of=("self",))
                   .filter(id__in=ids, phase=Phase.PENDING).filter(_not_taken()).values_list("id", flat=True))
        mark_taken(got)
    return set(got)


def _no_flush_wait() -> None:
    """A ``taken_until`` mark need not survive a crash (lost, the claim is simply not taken): do not wait for
    the WAL flush. Halves the durable commits per round (a few hundred per second is all this disk does)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL synchronous_commit TO OFF")


def not_taken(now=None) -> Q:
    """Not taken by a live worker: never taken, the mark expired, or (PostgreSQL) the database session that
    took it is gone -- a worker killed mid-round frees its claims as soon as PostgreSQL drops its session,
    not only when ``TAKE_SECONDS`` have passed (a reused backend pid only delays that to the expiry)."""
    q = Q(taken_until__isnull=True) | Q(taken_until__lt=now or timezone.now())
    if connection.vendor == "postgresql":
        q |= ~Q(taken_by__in=RawSQL("SELECT pid FROM pg_stat_activity WHERE pid IS NOT NULL", []))
    return q


def taken_mark() -> dict:
    """The field values that mark a row taken by this worker's database session."""
    return {"taken_until": timezone.now() + timedelta(seconds=TAKE_SECONDS), "taken_by": _backend_pid()}


def _backend_pid() -> int | None:
    if connection.vendor != "postgresql":
        return None
    connection.ensure_connection()
    return connection.connection.info.backend_pid  # known to the driver: no round trip (one per round before)


def _not_taken() -> Q:
    return not_taken()


def mark_taken(ids: list[int]) -> None:
    ResourceClaim.objects.filter(id__in=ids).update(**taken_mark())


def clear_taken(ids) -> None:
    try:
        ResourceClaim.objects.filter(id__in=list(ids), taken_until__isnull=False).update(taken_until=None)
    except Exception:  # the connection is gone (the caller re-raises): the marks expire by themselves
        log.warning("could not clear taken_until of %d claims; it expires in %ss", len(ids), TAKE_SECONDS)


def hand_back(ids) -> None:
    """Clear the marks of taken claims that no outcome is recorded for (decided afresh by a later round)."""
    ResourceClaim.objects.filter(id__in=sorted(ids)).update(taken_until=None)
