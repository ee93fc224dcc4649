"""Stranded capacity: free devices that no pending claim can use, and nodes whose free GPUs are too few
for the claim sizes people actually ask for."""
from __future__ import annotations

import json
from collections import Counter, defaultdict

from django.urls import reverse

from claims.models import Phase, ResourceClaim
from claims.services.figures.accelerators import accelerator_sql
from claims.services.figures.fleet import cluster_freshness
from claims.services.figures.sql import T_ALLOC, T_CLAIM, fetch_dicts, is_postgres
from claims.services.figures.units import partition_expr, tainted_sql, units_sql
from dra.cel import compile_expression
from dra.cel.errors import CELCompileError
from frontend.queries.claims import claim_size
from inventory.services.selectors import _evaluate_all, class_selectors, device_groups
from scheduler.services.defrag import QUOTA_REASONS

PENDING_SAMPLE = 2000  # distinct shapes come from the oldest pending claims; more adds nothing but time
SIZE_SAMPLE = 5000  # claim sizes are learnt from the most recent claims
COMMON_SHARE = 0.05  # a size is "common" when at least 5% of recent claims ask for it


def pending_shapes() -> list[dict]:
    """Distinct (device class, request selectors) among pending claims that wait for room (not for quota: those
    are the queues' matter), with how many claims want each."""
    shapes: dict[tuple, dict] = {}
    for claim_id, spec in (ResourceClaim.objects.filter(phase=Phase.PENDING).exclude(reason__in=QUOTA_REASONS)
                           .order_by("id")
                           .values_list("id", "spec")[:PENDING_SAMPLE]):
        for req in ((spec or {}).get("devices") or {}).get("requests") or []:
            alternatives = [req["exactly"]] if req.get("exactly") else list(req.get("firstAvailable") or [])
            for body in alternatives:
                exprs = tuple(s["cel"]["expression"] for s in body.get("selectors") or []
                              if (s.get("cel") or {}).get("expression"))
                key = (body.get("deviceClassName", ""), exprs)
                shape = shapes.setdefault(key, {"class": key[0], "selectors": list(exprs), "claims": set()})
                shape["claims"].add(claim_id)
    out = []
    for shape in shapes.values():
        shape["claims"] = len(shape["claims"])
        out.append(shape)
    return sorted(out, key=lambda s: -s["claims"])


def _compiled_shapes(shapes: list[dict]) -> list[tuple[dict, list]]:
    compiled = []
    for shape in shapes:
        exprs = (class_selectors(shape["class"]) or []) + shape["selectors"]
        try:
            compiled.append((shape, [compile_expression(e) for e in exprs]))
        except CELCompileError:
            continue  # a shape that cannot compile matches nothing (the claim fails with that error)
    return compiled


def unusable_free_devices(stale_ids: set[int]) -> dict:
    """Free whole GPUs (accelerators that are no partitions; not tainted, fresh cluster, valid pool) that match
    none of the pending claims' shapes, grouped by cluster and product."""
    shapes = pending_shapes()
    compiled = _compiled_shapes(shapes)
    # Free: no allocation row. Partitions are left out: their free placements overlap and are shown per GPU.
    tainted, params = tainted_sql("d")
    where = (f"NOT {partition_expr('d')} AND {tainted} = 0 AND p.state <> 'invalid' AND NOT EXISTS "
             f"(SELECT 1 FROM {T_ALLOC} da WHERE da.cluster = c.name AND da.driver = d.driver AND da.pool = d.pool_name"
             f" AND da.device = d.name AND NOT da.admin_access)")
    if stale_ids:
        where += f" AND d.cluster_id NOT IN ({', '.join(['%s'] * len(stale_ids))})"
        params += sorted(stale_ids)
    # GPUs only (``claims.services.figures.accelerators``):
    # a helper device nobody asks for is not capacity going to waste.
    predicate, predicate_params = accelerator_sql(where, params)
    where, params = f"{where} AND {predicate}", params + predicate_params
    all_exprs = [c for _, cl in compiled for c in cl]
    groups, state, method = device_groups(all_exprs, where, params)
    unusable: dict[tuple, int] = defaultdict(int)
    usable_by: Counter = Counter()
    free_total = unusable_total = 0
    for g in groups:
        free_total += g.count
        hit = False
        for shape, cl in compiled:
            ok, _ = _evaluate_all(cl, g.device)
            if ok:
                usable_by[(shape["class"], tuple(shape["selectors"]))] += g.count
                hit = True
        if not hit:
            unusable_total += g.count
            unusable[(g.cluster, g.product, g.driver)] += g.count
    for shape in shapes:
        shape["free_matching"] = usable_by.get((shape["class"], tuple(shape["selectors"])), 0)
    return {
        "shapes": shapes,
        "free_total": free_total,
        "unusable_total": unusable_total,
        "unusable": [{"cluster": k[0], "product": k[1], "driver": k[2], "count": v}
                     for k, v in sorted(unusable.items(), key=lambda kv: -kv[1])],
        "exhaustive": state["exhaustive"],
        "method": method,
    }


def common_sizes() -> list[dict]:
    """Device counts per claim among recent claims, the common ones first.

    Grouped by the request list in the database: recent claims come from a handful of templates, so only a few
    distinct request lists are decoded here instead of thousands of specs.
    """
    col = "s.spec -> 'devices' -> 'requests'" if is_postgres() else "json_extract(s.spec, '$.devices.requests')"
    rows = fetch_dicts(f"SELECT {col} AS reqs, COUNT(*) AS n FROM (SELECT spec FROM {T_CLAIM} ORDER BY id DESC "
                       f"LIMIT %s) s GROUP BY {col}", [SIZE_SAMPLE])
    sizes: Counter = Counter()
    for row in rows:
        reqs = json.loads(row["reqs"]) if isinstance(row["reqs"], str) else row["reqs"]
        n = claim_size({"devices": {"requests": reqs or []}})
        if n:
            sizes[n] += row["n"]
    total = sum(sizes.values())
    return [{"size": s, "claims": n, "share": round(100 * n / total)} for s, n in sorted(sizes.items())
            if total and n / total >= COMMON_SHARE]


def fragmented_nodes(stale_ids: set[int], sizes: list[int]) -> dict:
    """Per node, its accelerators and the free ones (``claims.services.figures.accelerators``: a partitioned GPU is
    one, free when no partition of it is in use); nodes with some free but fewer than a common size. Every node
    with an accelerator is a row, once, whatever products it holds; a stale cluster's nodes have nothing free."""
    units, params = units_sql("d.node_name <> %s", [""])
    rows = fetch_dicts(
        f"SELECT u.cluster_id, u.cluster, u.node_name, MAX(u.product) AS product, COUNT(*) AS total, "
        f"SUM(CASE WHEN u.claims = 0 AND u.tainted = 0 AND u.invalid = 0 THEN 1 ELSE 0 END) AS free "
        f"FROM ({units}) u GROUP BY u.cluster_id, u.cluster, u.node_name", params, analytic=True)
    for r in rows:
        if r["cluster_id"] in stale_ids:
            r["free"] = 0
    # A node is fragmented for size s when it is big enough to hold s but has fewer than s free: a node
    # smaller than s never could, which is a fleet-shape question, not fragmentation.
    by_size = []
    for s in sizes:
        if s <= 1:
            continue
        big_enough = [r for r in rows if r["total"] >= s]
        short = [r for r in big_enough if 0 < r["free"] < s]
        by_size.append({"size": s, "nodes_fit": sum(1 for r in big_enough if r["free"] >= s),
                        "nodes_big_enough": len(big_enough), "nodes_short": len(short),
                        "stranded": sum(r["free"] for r in short)})
    multi = [s for s in sizes if s > 1]
    biggest = max(multi, default=0)

    def stranded_for(r) -> int | None:
        """The smallest common size this node could hold but cannot now, if any."""
        return next((s for s in multi if r["total"] >= s and 0 < r["free"] < s), None)

    worst = sorted((dict(r, blocks=stranded_for(r)) for r in rows if stranded_for(r)),
                   key=lambda r: (-r["free"], r["cluster"], r["node_name"]))[:50]
    for r in worst:
        r["url"] = reverse("frontend:node", args=[r["cluster"], r["node_name"]])
    histogram = Counter(r["free"] for r in rows)
    return {"by_size": by_size, "worst": worst, "histogram": sorted(histogram.items()), "nodes": len(rows),
            "biggest": biggest}


def fragmentation() -> dict:
    stale_ids = {c.id for c in cluster_freshness() if c.stale_now}
    sizes = common_sizes()
    return {
        "sizes": sizes,
        "nodes": fragmented_nodes(stale_ids, [s["size"] for s in sizes]),
        "free": unusable_free_devices(stale_ids),
        "waiting_for_quota": ResourceClaim.objects.filter(phase=Phase.PENDING, reason__in=QUOTA_REASONS).count(),
    }
