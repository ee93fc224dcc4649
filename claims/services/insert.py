"""The claims' create on PostgreSQL: the claims, their Created events and history rows in ONE statement, the
namespace's id looked up and its pending claims counted against the ``pending-claims`` cap in it
(``claims.services.claims.create_claims`` calls it; elsewhere that function writes them with the ORM).
"""
from __future__ import annotations

import json

from django.db import connection
from django.utils import timezone

from claims import claims_sql
from claims.models import ClaimEvent, Namespace, Phase, ResourceClaim
from claims.services import bulk, history
from draservice.bulk import pg_execute


def claims_and_events(ns_name: str, claims: list[ResourceClaim], events: list,
                      limit: int) -> tuple[dict[str, int], Namespace | None, int, str | None]:
    """PostgreSQL: the claims AND their Created events in ONE statement, the namespace's id looked up in it, its
    pending claims counted in it against the ``pending-claims`` cap ``limit`` (``claims.services.caps``).

    Returns ({name: id} of the claims inserted, the namespace row or None when it does not exist (then nothing
    was inserted), the namespace's pending claims before the insert (counted up to ``limit + 1``; past the cap
    nothing was inserted), the fleet state's stamp the statement read (``queues.services.resolve.Tree.at``:
    ``FleetState.version`` and the transaction that wrote it; None without the row)). Names already taken
    are skipped (ON CONFLICT DO NOTHING); compare what came back.
    """
    now = timezone.now()
    bulk.set_auto_times(claims, now)
    bulk.set_auto_times(events, now)
    single = len(claims) == 1
    sql = _INSERT_SQL.get(single)  # the same text for every one-claim POST, and for every batch
    if sql is None:
        sql = _INSERT_SQL[single] = _statement(claims, events)
    params = [ns_name, limit + 1, len(claims), limit, *bulk.insert_params(claims, _CLAIM_FROM_CTE),
              *bulk.insert_params(events, _EVENT_FROM_CTE)]
    cursor = pg_execute(sql, params)
    try:
        rows = cursor.fetchall()
    finally:
        cursor.close()
    if not rows:
        return {}, None, 0, None
    ns_id, labels, created_at, used, stamp = rows[0][:5]
    ns_row = Namespace.from_db(connection.alias, ["id", "name", "labels", "created_at"],
                               [ns_id, ns_name, json.loads(labels) if labels else {}, created_at])
    return {name: pk for *_, pk, name in rows if pk is not None}, ns_row, used, stamp


_CLAIM_FROM_CTE = {"namespace_id": "ok.id"}
_EVENT_FROM_CTE = {"claim_id": "NULL"}
_INSERT_SQL: dict[bool, str] = {}  # one claim or several -> the statement of _insert_pg


def _statement(claims: list[ResourceClaim], events: list) -> str:
    """The statement of ``claims_and_events`` (its parameters: the namespace name, the cap's count limit, the claims
    added, the cap, ``bulk.insert_params`` of the claims, then of the events).

    ``used`` counts the namespace's pending claims over their partial index, no further than past the cap;
    ``ok`` is the namespace row only when the new claims fit under the cap, so past it nothing is inserted."""
    qn = connection.ops.quote_name
    c_cols, c_sel, _ = bulk.insert_select(claims, replace=_CLAIM_FROM_CTE)
    e_cols, e_sel, _ = bulk.insert_select(events, replace=_EVENT_FROM_CTE)
    claim_uid = e_cols.index(qn("claim_uid"))
    e_names = [f"e{i}" for i in range(len(e_cols))]
    e_values = ", ".join(f"{sel} AS {n}" for sel, n in zip(e_sel, e_names, strict=False))
    e_out = ", ".join("c.id" if col == qn("claim_id") else f"v.{n}" for col, n in zip(e_cols, e_names, strict=False))
    claims_table = qn(ResourceClaim._meta.db_table)
    sql = (f"WITH ns AS (SELECT id, name, labels::text AS labels, created_at FROM {qn(Namespace._meta.db_table)} "
           f"WHERE name = %b::text), "
           f"used AS (SELECT count(*) AS n FROM (SELECT 1 FROM {claims_table} WHERE namespace_id = (SELECT id FROM ns) "
           f"AND phase = '{Phase.PENDING.value}' LIMIT %b::bigint) AS p), "
           "ok AS (SELECT ns.id FROM ns, used WHERE used.n + %b::bigint <= %b::bigint), "
           f"c AS (INSERT INTO {claims_table} ({', '.join(c_cols)}) "
           f"SELECT {', '.join(c_sel)} FROM ok ON CONFLICT DO NOTHING "
           "RETURNING id, name, uid, labels, spec, lease_seconds, created_at), "
           f"e AS (INSERT INTO {qn(ClaimEvent._meta.db_table)} ({', '.join(e_cols)}) "
           f"SELECT {e_out} FROM (SELECT {e_values}) AS v JOIN c ON c.uid = v.{e_names[claim_uid]}), "
           f"{history.insert_cte('c', 'ns')} "
           f"SELECT ns.id, ns.labels, ns.created_at, used.n, "
           f"({claims_sql.fleet_stamp_sql()}), "
           "c.id, c.name "
           "FROM ns CROSS JOIN used LEFT JOIN c ON true")
    return sql
