"""A pending claim's place in its queue, and the devices its queue asks for up to it, in one SQL query per
queue (a window over the queue's pending claims: priority capped by the queue's ``maxPriority``, then age).

Renderings call this for every claim they show, so it must not load a long queue into Python: the window
runs in PostgreSQL and only the rows asked about come back. Other databases take the Python path.
"""
from __future__ import annotations

from django.db import connection
from django.db.models import Count, F, Sum, Value, Window
from django.db.models.expressions import RawSQL
from django.db.models.functions import RowNumber

from claims.models import Phase, ResourceClaim
from queues.services.resolve import PRIORITY_LABEL, Tree, claims_of_queue_q, effective_priority, queue_of
from queues.services.usage import requested_devices

_T = '"claims_resourceclaim"'
# The priority label as an integer (a value that is not one counts 0: creation refuses such labels), capped.
PRIORITY_SQL = (f"LEAST(CASE WHEN ({_T}.labels->>'{PRIORITY_LABEL}') ~ '^-?[0-9]{{1,9}}$' "
                f"THEN ({_T}.labels->>'{PRIORITY_LABEL}')::int ELSE 0 END, %s)")
# Devices the claim asks for: each request's exactly.count (All and firstAvailable count 1).
DEVICES_SQL = (f"(SELECT COALESCE(SUM(CASE WHEN COALESCE(r->'exactly'->>'allocationMode', 'ExactCount') = "
               f"'ExactCount' THEN COALESCE((r->'exactly'->>'count')::int, 1) ELSE 1 END), 0) "
               f"FROM jsonb_array_elements(COALESCE({_T}.spec->'devices'->'requests', '[]'::jsonb)) r)")


def ranked(name: str, tree: Tree, claims: list, demand: bool = True) -> dict[int, tuple[int, int]]:
    """claim id -> (1-based position, devices asked for by the claims before it -- 0 unless ``demand``)
    among ``name``'s pending claims; ``claims``: pending claims of that queue."""
    queue = tree.queues.get(name)
    namespaces = (queue.spec.get("namespaces") or []) if queue else []
    cap = queue.max_priority if queue else 2**31 - 1
    if connection.vendor != "postgresql":
        qs = ResourceClaim.objects.filter(phase=Phase.PENDING).filter(claims_of_queue_q(name, namespaces))
        return _ranked_python(qs, name, tree, claims)
    sql, params = _window_sql(name, tuple(namespaces), cap, demand)
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, [c.id for c in claims]])
        rows = cursor.fetchall()
    return {row[0]: (int(row[1]), int(row[2] or 0) - int(row[3] or 0)) for row in rows}


# (queue, its namespaces, cap, demand) -> (SQL, params). Every create answer and every list renders positions:
# compiling this window through the ORM cost more CPU than PostgreSQL spends running it, and the text only
# depends on the key (the ids asked about are the last parameter).
_compiled: dict[tuple, tuple[str, tuple]] = {}


def _window_sql(name: str, namespaces: tuple[str, ...], cap: int, demand: bool) -> tuple[str, tuple]:
    key = (name, namespaces, cap, demand)
    hit = _compiled.get(key)
    if hit is not None:
        return hit
    qs = ResourceClaim.objects.filter(phase=Phase.PENDING).filter(claims_of_queue_q(name, list(namespaces)))
    order = [RawSQL(PRIORITY_SQL, [cap]).desc(), F("created_at").asc(), F("id").asc()]
    devices = RawSQL(DEVICES_SQL, []) if demand else Value(0)
    inner = qs.annotate(position=Window(RowNumber(), order_by=order),
                        through=Window(Sum(devices), order_by=order) if demand else Value(0),
                        own=devices).values("id", "position", "through", "own")
    sql, params = inner.query.sql_with_params()
    if len(_compiled) > 256:  # queues come and go: keep the cache bounded
        _compiled.clear()
    hit = _compiled[key] = (f"SELECT id, position, through, own FROM ({sql}) ranked WHERE id = ANY(%s)",
                            tuple(params))
    return hit


def _ranked_python(qs, name: str, tree: Tree, claims: list) -> dict[int, tuple[int, int]]:
    queue = tree.queues.get(name)
    rows = [r for r in qs.select_related("namespace") if queue_of(r, r.namespace.name, tree) == name]
    rows.sort(key=lambda r: (-effective_priority(r, queue), r.created_at, r.id))
    out, through = {}, 0
    wanted = {c.id for c in claims}
    for i, r in enumerate(rows):
        if r.id in wanted:
            out[r.id] = (i + 1, through)
        through += sum(n for _, n in requested_devices(r.spec))
    return out


def place_of_new(name: str, tree: Tree, priority: int) -> tuple[int, int]:
    """(position, devices asked for before it) a claim of ``priority`` submitted now would take in ``name``'s
    pending claims: behind every one of no lower priority (they are all older). ``POST /api/v1/simulate``."""
    queue = tree.queues.get(name)
    namespaces = (queue.spec.get("namespaces") or []) if queue else []
    cap = queue.max_priority if queue else 2**31 - 1
    qs = ResourceClaim.objects.filter(phase=Phase.PENDING).filter(claims_of_queue_q(name, namespaces))
    if connection.vendor != "postgresql":
        rows = [r for r in qs.select_related("namespace") if queue_of(r, r.namespace.name, tree) == name
                and effective_priority(r, queue) >= priority]
        return len(rows) + 1, sum(n for r in rows for _, n in requested_devices(r.spec))
    got = qs.extra(where=[f"{PRIORITY_SQL} >= %s"], params=[cap, priority]).aggregate(
        n=Count("id"), devices=Sum(RawSQL(DEVICES_SQL, [])))
    return (got["n"] or 0) + 1, int(got["devices"] or 0)
