"""Device units: what the dashboard counts as "one GPU".

A DRA device is not always one piece of hardware. A MIG-capable GPU is published as a counter set
(``sharedCounters``) plus one device per possible partition placement (25 on an A100-80GB), and on Hopper also
the whole GPU as a device that consumes every counter. Counting published devices would make one A100 look
like 25 GPUs. So a *unit* is either a device that consumes no counters, or one counter set together with all
devices that consume from it; a unit is in use when any of its devices is allocated, and shared when more than
one claim (or a claim reserved for more than one consumer) holds any part of it.

``units_sql`` returns one row per unit with its allocation facts; callers wrap it in their own GROUP BY.
"""
from __future__ import annotations

from claims.services.figures.accelerators import accelerator_sql
from claims.services.figures.sql import (
    T_ALLOC,
    T_CLUSTER,
    T_DEVICE,
    T_POOL,
    T_RESERVATION,
    is_postgres,
    json_array_nonempty,
    json_text,
    product_expr,
)

# Taint effects that keep new allocations off a device ("None" is informational in v1).
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")


def partition_expr(alias: str = "d") -> str:
    return json_array_nonempty(f"{alias}.consumes_counters")


def counter_set_expr(alias: str = "d") -> str:
    # A partition consumes from one counter set in every real driver (one per physical GPU); if a device
    # consumed from several, its first set names the unit.
    return json_text(f"{alias}.consumes_counters", 0, "counterSet")


def tainted_sql(alias: str = "d", with_rules: bool = True) -> tuple[str, list]:
    """SQL (1/0) and parameters: the device carries a taint, or a DeviceTaintRule with a blocking effect selects it.

    Rules are few (operators write them by hand), so they are read here and inlined as plain comparisons
    instead of a correlated subquery probed once per device. A rule without a deviceSelector selects nothing
    (upstream); a blank selector field matches anything.
    """
    own = json_array_nonempty(f"{alias}.taints")
    if not with_rules:
        return f"(CASE WHEN {own} THEN 1 ELSE 0 END)", []
    from inventory.models import DeviceTaintRule

    terms, params = [], []
    for rule in DeviceTaintRule.objects.filter(effect__in=BLOCKING_EFFECTS).only(
            "cluster_id", "driver", "pool_name", "device_name", "object"):
        if ((rule.object or {}).get("spec") or {}).get("deviceSelector") is None:
            continue
        parts = []
        for column, value in ((f"{alias}.cluster_id", rule.cluster_id), (f"{alias}.driver", rule.driver),
                              (f"{alias}.pool_name", rule.pool_name), (f"{alias}.name", rule.device_name)):
            if value:
                parts.append(f"{column} = %s")
                params.append(value)
        terms.append("(" + " AND ".join(parts or ["1 = 1"]) + ")")
    if not terms:
        return f"(CASE WHEN {own} THEN 1 ELSE 0 END)", []
    return f"(CASE WHEN {own} OR {' OR '.join(terms)} THEN 1 ELSE 0 END)", params


def _alloc_cte() -> str:
    """Allocations per device: the lowest and highest claim holding it, and the most consumers any of them has.

    Aggregated once up front (a few tens of thousands of rows at most) and hash-joined to the devices, so the
    device scan does no per-row work on allocations. MIN/MAX of the claim ids answer "more than one claim?"
    exactly, for a device and for a whole partitioned GPU (MIN of MINs vs MAX of MAXes), without the sort a
    COUNT(DISTINCT) would need.
    """
    return f"""WITH r AS (SELECT claim_id, COUNT(*) AS n FROM {T_RESERVATION} GROUP BY claim_id),
        a AS (
            SELECT da.cluster AS cluster, da.driver AS driver, da.pool AS pool, da.device AS device,
                   MIN(da.claim_id) AS min_claim, MAX(da.claim_id) AS max_claim, COALESCE(MAX(r.n), 0) AS consumers
            FROM {T_ALLOC} da LEFT JOIN r ON r.claim_id = da.claim_id
            WHERE NOT da.admin_access
            GROUP BY da.cluster, da.driver, da.pool, da.device)"""


def _fence() -> str:
    """Keeps the device subquery from being flattened into the join, so its per-row JSON work happens in the
    scan and the join does not carry the wide JSON columns (SQLite only takes OFFSET after a LIMIT)."""
    return "OFFSET 0" if is_postgres() else "LIMIT -1 OFFSET 0"


def device_rows_sql(where: str = "", params: list | tuple = (), *, with_rules: bool = True,
                    accelerators: bool = True) -> tuple[str, list]:
    """SQL and parameters for one row per device of the current pool generations, with its unit's key; only
    the devices of accelerators (``claims.services.figures.accelerators``) unless ``accelerators`` is False.

    Columns: cluster_id, cluster, node_name, driver, pool_name, name, product, tainted (0/1), invalid (0/1,
    pool invalid), partitioned (0/1), unit (pool/device or pool/counter-set). ``where`` as in ``units_sql``.
    The JSON work happens here, once per device; ``units_sql`` groups these rows, and the overview's
    maintained tally (``claims.services.figures.fleet_tally``) reads them per pool, when the pool moves.
    """
    params = list(params)
    if accelerators:
        predicate, predicate_params = accelerator_sql(where, params)
        where, params = (f"({where}) AND {predicate}" if where else predicate), params + predicate_params
    part = partition_expr("d")
    tainted, taint_params = tainted_sql("d", with_rules)
    unit = f"d.pool_name || '/' || COALESCE(CASE WHEN {part} THEN {counter_set_expr('d')} END, d.name)"
    sql = f"""SELECT d.cluster_id AS cluster_id, c.name AS cluster, d.node_name AS node_name, d.driver AS driver,
                     d.pool_name AS pool_name, d.name AS name, {product_expr('d')} AS product, {tainted} AS tainted,
                     CASE WHEN p.state = 'invalid' THEN 1 ELSE 0 END AS invalid,
                     CASE WHEN {part} THEN 1 ELSE 0 END AS partitioned, {unit} AS unit
              FROM {T_DEVICE} d
              JOIN {T_CLUSTER} c ON c.id = d.cluster_id
              JOIN {T_POOL} p ON p.cluster_id = d.cluster_id AND p.driver = d.driver AND p.name = d.pool_name
                             AND p.generation = d.pool_generation
              {('WHERE ' + where) if where else ''}"""
    return sql, taint_params + list(params)


def units_sql(where: str = "", params: list | tuple = (), *, with_rules: bool = True,
              accelerators: bool = True) -> tuple[str, list]:
    """SQL and parameters for one row per unit (current pool generation only).

    Columns: cluster_id, cluster, node_name, driver, product, unit (pool/device or pool/counter-set),
    partitioned (0/1), devices (devices in the unit), tainted (0/1), invalid (0/1, pool invalid),
    claims (0, 1, or 2 meaning "more than one": only that distinction is ever used), consumers (most consumers
    of one of those claims), used_devices (devices of the unit with an allocation).
    ``where`` filters devices (aliases: d device, c cluster, p pool) and may use %s ``params``.

    One pass: devices (with their JSON work done in the scan) left-joined to the per-device allocation
    aggregate, grouped by unit. A whole device is a group of one; a partitioned GPU's group is every device
    consuming its counter set.
    """
    devices, device_params = device_rows_sql(where, params, with_rules=with_rules, accelerators=accelerators)
    sql = f"""{_alloc_cte()}
        SELECT w.cluster_id AS cluster_id, w.cluster AS cluster, w.node_name AS node_name, w.driver AS driver,
               w.product AS product, w.unit AS unit, w.partitioned AS partitioned, COUNT(*) AS devices,
               MAX(w.tainted) AS tainted, MAX(w.invalid) AS invalid,
               CASE WHEN COUNT(a.device) = 0 THEN 0 WHEN MIN(a.min_claim) <> MAX(a.max_claim) THEN 2 ELSE 1 END
                   AS claims,
               COALESCE(MAX(a.consumers), 0) AS consumers, COUNT(a.device) AS used_devices
        FROM ({devices} {_fence()}) w
        LEFT JOIN a ON a.cluster = w.cluster AND a.driver = w.driver AND a.pool = w.pool_name AND a.device = w.name
        GROUP BY w.cluster_id, w.cluster, w.node_name, w.driver, w.product, w.unit, w.partitioned
    """
    return sql, device_params


# Mutually exclusive states of a unit, in the order the bars stack them.
STATE_SQL = """
    SUM(CASE WHEN u.claims > 1 OR u.consumers > 1 THEN 1 ELSE 0 END) AS shared,
    SUM(CASE WHEN u.claims = 1 AND u.consumers <= 1 THEN 1 ELSE 0 END) AS allocated_only,
    SUM(CASE WHEN u.claims = 0 AND u.tainted = 1 THEN 1 ELSE 0 END) AS tainted,
    SUM(CASE WHEN u.claims = 0 AND u.tainted = 0 AND u.invalid = 1 THEN 1 ELSE 0 END) AS invalid,
    SUM(CASE WHEN u.claims = 0 AND u.tainted = 0 AND u.invalid = 0 THEN 1 ELSE 0 END) AS free,
    SUM(u.partitioned) AS partitioned,
    SUM(CASE WHEN u.claims > 0 AND u.partitioned = 1 THEN 1 ELSE 0 END) AS partial,
    COUNT(*) AS total
"""


