"""The plan: each queue's first ``planDepth`` pending claims, and when and where each would start.

A pass (``refresh``) reads each queue's first ``spec.planDepth`` pending claims (default 10; those a round decided
at least once) in its order (priority
capped by ``maxPriority``, then age: one windowed query per queue, however long the queue), puts them in the
scheduler's order across queues (``queues.services.order``; the heads holding nodes first), and lets the engine
place each in turn on what the running claims' walltime ends free (``dra.engine.timeline``: Slurm's conservative
backfill plan; a running claim with no walltime never ends for the plan). A walltime end counts from the lease's
expiry plus the expiry sweep's period and a round's latency (``PLAN_ROUND_LATENCY_SECONDS``): the devices are free
for a round only then, so a planned start is a time the claim can in fact start by. The whole plan is rewritten
set-based (one delete, one insert), one row per claim (``scheduler.models.PlannedStart``).

When: at most every ``PLAN_INTERVAL`` seconds, or sooner when the queues' first ``planDepth`` claims are no
longer those planned (an arrival ahead of them, a start, a release); the check costs the per-queue queries.
Read by the start-time estimate (registered with ``queues.services.estimate``) and by the round's backfill
rule (``scheduler.services.backfill``).
"""
from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.db.models.expressions import RawSQL
from django.utils import timezone

from claims import schedule as claims_schedule
from claims.models import DeviceAllocation, PendingWake, Phase, ResourceClaim
from claims.placement import claim_group
from claims.services import fleet, wake
from claims.services.engines import session as engine_session
from dra.cel import MAX_SELECTOR_COST
from dra.engine.timeline import Ending, Planned, Waiting, plan_starts
from draservice.prepared import Prepared, PreparedValues
from queues import spec as queue_spec
from queues.services import order as queue_order
from queues.services.position import PRIORITY_SQL
from queues.services.resolve import Tree, claims_of_queue_q
from scheduler.models import PlannedStart
from scheduler.services.grouping import Group

log = logging.getLogger(__name__)

DEFAULT_DEPTH = queue_spec.DEFAULT_PLAN_DEPTH
HELD = "HeldForQueueHead"
WAITING_FOR_RESERVATION = "WaitingForReservation"  # the claim reason of reservation_tick.WAITING
# What a claim's search may cost the plan, in CEL cost units, over all its candidate times: what one group's
# search may cost a round. A claim with expensive selectors is left unplanned rather than holding up the
# worker (the plan runs after the worker's rounds, before the next).
PLAN_COST_BUDGET = 2 * MAX_SELECTOR_COST
PLAN_LOCK = 0x706C616E  # a transaction advisory lock: one pass at a time, fleet-wide


def depth_of(queue) -> int:
    return int((queue.spec or {}).get("planDepth", DEFAULT_DEPTH)) if queue is not None else DEFAULT_DEPTH


def sweep_seconds() -> float:
    every = claims_schedule.SCHEDULE()["claims-expire-leases"]["schedule"]
    return every.total_seconds() if isinstance(every, timedelta) else 5.0


def margin() -> timedelta:
    """From a walltime's end to the round that can give its devices away: the sweep's period and a round."""
    return timedelta(seconds=sweep_seconds() + float(getattr(settings, "PLAN_ROUND_LATENCY_SECONDS", 1.0)))


def interval() -> float:
    return float(getattr(settings, "PLAN_INTERVAL", 10.0))


def _head_query(name: str, queue, depth: int):
    """The query of queue ``name``'s first ``depth`` pending claims, in its order. Only claims a round has
    decided at least once: a round decides a new claim first (it may fit now), within the round's cost budget,
    and a plan pass must not be the first to pay for a claim whose selectors are expensive (the pass runs on
    the allocation workers)."""
    namespaces = (queue.spec.get("namespaces") or []) if queue else []
    # A claim waiting for its reservation's window is not planned: it cannot start before the window, and its
    # reservation holds and reclaims the capacity itself from the start minus the lead time. Planned now on
    # free devices, it made a claim with no walltime wait for it, or not, by which of them a round saw first.
    return (ResourceClaim.objects.filter(phase=Phase.PENDING, attempts__gt=0)
            .exclude(reason=WAITING_FOR_RESERVATION)
            .filter(claims_of_queue_q(name, namespaces))
            .order_by(RawSQL(PRIORITY_SQL, [queue.max_priority]).desc(), F("created_at").asc(), "id")[:depth])


def _head_rows_query(name: str, queue, depth: int):
    # diagnostics, the largest column, is never read by the plan
    return _head_query(name, queue, depth).select_related("namespace").defer("diagnostics")


def _head_ids_sql(name: str, queue, depth: int) -> tuple[str, tuple]:
    return _head_query(name, queue, depth).values_list("id", flat=True).query.sql_with_params()


def _planning(tree: Tree):
    """(name, queue, depth) of each queue that plans (``planDepth`` above 0)."""
    for name, queue in tree.queues.items():
        depth = depth_of(queue)
        if depth > 0:
            yield name, queue, depth


# The head queries, compiled once per (queue, namespaces, priority cap, depth): the pass runs after every
# allocation task, and compiling its queries cost more CPU than running them.
_COMPILED: dict[tuple, object] = {}
MAX_COMPILED = 512


def _key(name: str, queue, depth: int) -> tuple:
    return (name, tuple((queue.spec.get("namespaces") or []) if queue else ()),
            queue.max_priority if queue else None, depth)


def _compiled(key: tuple, build):
    found = _COMPILED.get(key)
    if found is None:
        if len(_COMPILED) >= MAX_COMPILED:
            _COMPILED.clear()
        found = _COMPILED[key] = build()
    return found


def heads(tree: Tree) -> dict[str, list[ResourceClaim]]:
    """Queue name -> its first ``planDepth`` pending claims, in its order (one query per queue)."""
    out: dict[str, list[ResourceClaim]] = {}
    for name, queue, depth in _planning(tree):
        query = _compiled(("rows", *_key(name, queue, depth)),
                          partial(Prepared, partial(_head_rows_query, name, queue, depth), ()))
        rows = query.rows()
        if rows:
            out[name] = rows
    return out


def _wanted(tree: Tree) -> set[tuple[int, str, int]]:
    """(claim id, queue, position) of every queue's first ``planDepth`` claims: ids only, so that a pass that is
    not due decodes no claim."""
    out: set[tuple[int, str, int]] = set()
    with connection.cursor() as cursor:
        for name, queue, depth in _planning(tree):
            sql = _compiled(("ids", *_key(name, queue, depth)), partial(_head_ids_sql, name, queue, depth))
            cursor.execute(*sql)
            out.update((cid, name, i + 1) for i, (cid,) in enumerate(cursor.fetchall()))
    return out


def _stored() -> list[tuple[int, str, int, datetime]]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT claim_id, queue, position, computed_at FROM {PlannedStart._meta.db_table}")
        return cursor.fetchall()


@dataclass
class Pass:
    planned: int  # claims given a start
    woken: int  # claims held off a head's node that the plan starts now (backfill): decided again


def refresh(force: bool = False, now: datetime | None = None) -> Pass | None:
    """One pass, when due (see the module docstring), or None when skipped."""
    if connection.vendor != "postgresql":
        return None
    now = now or timezone.now()
    tree = Tree.load()
    if not force:
        wanted = _wanted(tree)
        stored = _stored()
        same = {(c, q, p) for c, q, p, _ in stored} == wanted
        last = max((at for *_, at in stored), default=None)
        if same and (not wanted or (last is not None and (now - last).total_seconds() < interval())):
            return None
    first = heads(tree)
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [PLAN_LOCK])
            if not cursor.fetchone()[0]:
                return None  # another worker is planning now
        rows = _compute(tree, first, now)
        _rewrite(rows)
        # Claims held off a head's node that the plan starts now backfill there: decide them again at once
        # (they were tried, and nothing released wakes them).
        woken = wake.wake_claims([r.claim_id for r in rows if r.start_at is not None and r.start_at <= now
                                  and r.claim.reason == HELD and r.claim.lease_seconds])
    return Pass(planned=sum(1 for r in rows if r.start_at is not None), woken=woken)


def _compute(tree: Tree, first: dict[str, list[ResourceClaim]], now: datetime) -> list[PlannedStart]:
    position = {c.id: (name, i + 1) for name, rows in first.items() for i, c in enumerate(rows)}
    groups = [Group(claims=[c]) for rows in first.values() for c in rows]
    if len(groups) > 1:
        groups = queue_order.order(groups)
        # The heads holding nodes first: the round keeps their nodes from the claims behind them unless those
        # end before the heads' planned starts (backfill), which is what planning them after the heads gives.
        holding = set(_HOLDING.rows()) & set(position)
        groups.sort(key=lambda g: g.claims[0].id not in holding)
    if not groups:
        return []
    pad = margin()
    epoch = now.timestamp()
    view = fleet.current_view()
    rows = fleet.rows_in_use()
    with engine_session() as session:
        engine = session.engine_for(view, rows)
        ends = _endings(rows, pad)
        waiting = [Waiting(claim_group(g.claims, view.cluster_labels, key=g.key),
                           (g.claims[0].lease_seconds + pad.total_seconds()) if g.claims[0].lease_seconds else None)
                   for g in groups]
        try:
            planned = plan_starts(engine, ends, waiting, epoch, budget=PLAN_COST_BUDGET)
        except BaseException:
            session.poison()  # its in-use state may be half-moved
            raise
    return [_row(g.claims[0], position[g.claims[0].id], p, now) for g, p in zip(groups, planned, strict=True)]


_COLUMNS = ("claim_id", "queue", "position", "cluster", "node", "devices", "start_at", "end_at", "computed_at")


def _rewrite(rows: list[PlannedStart]) -> None:
    """The whole plan replaced by ``rows``: two statements, written without the ORM's per-pass compile."""
    table = PlannedStart._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {table}")
        if rows:
            one = "(" + ", ".join(["%s"] * len(_COLUMNS)) + ")"
            values = [v for r in rows for v in (r.claim_id, r.queue, r.position, r.cluster, r.node,
                                                json.dumps(r.devices), r.start_at, r.end_at, r.computed_at)]
            cursor.execute(f"INSERT INTO {table} ({', '.join(_COLUMNS)}) VALUES {', '.join([one] * len(rows))}",
                           values)


# The claims holding a node (at most one head per queue and the preemptors', so few): compiled once.
_HOLDING = PreparedValues(lambda: PendingWake.objects.exclude(hold_node="").values_list("claim_id", flat=True),
                          flat=True)
# The running claims with a walltime, and their devices: compiled once (the pass runs after the rounds).
_LEASED = PreparedValues(lambda: DeviceAllocation.objects.filter(claim__phase=Phase.ALLOCATED,
                                                                claim__lease_expires_at__isnull=False)
                         .values_list("id", "claim_id", "claim__lease_expires_at"))


def _endings(rows: Mapping, pad: timedelta) -> list[Ending]:
    """The running claims' walltime ends, with the devices each frees: the engine's own records of them (those
    it counts in use), so that the plan moves exactly what the engine holds."""
    by_claim: dict[int, tuple[datetime, list]] = {}
    for row_id, claim_id, expires in _LEASED.rows():
        device = rows.get(row_id)
        if device is not None and expires is not None:
            by_claim.setdefault(claim_id, (expires, []))[1].append(device)
    return [Ending((expires + pad).timestamp(), tuple(devices)) for expires, devices in by_claim.values()]


def _row(claim: ResourceClaim, where: tuple[str, int], p: Planned | None, now: datetime) -> PlannedStart:
    def at(ts: float | None) -> datetime | None:
        return None if ts is None else datetime.fromtimestamp(ts, tz=now.tzinfo)

    return PlannedStart(claim=claim, queue=where[0], position=where[1], computed_at=now,
                        cluster=(p.cluster or "") if p else "", node=(p.node or "") if p else "",
                        devices=[[d.cluster, d.driver, d.pool, d.device] for d in p.devices] if p else [],
                        start_at=at(p.start) if p else None, end_at=at(p.end) if p else None)


def planned_starts(claim_ids: list[int]) -> dict[int, dict]:
    """claim id -> its planned start (``start``: a datetime or None, ``computed``) for the estimate."""
    return {cid: {"start": start, "computed": computed} for cid, start, computed in
            PlannedStart.objects.filter(claim_id__in=claim_ids).values_list("claim_id", "start_at", "computed_at")}
