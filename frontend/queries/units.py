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

from frontend.queries.sql import (
    T_ALLOC, T_CLUSTER, T_DEVICE, T_POOL, T_RESERVATION, T_TAINTRULE, json_array_nonempty, json_text,
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


def tainted_expr(alias: str = "d", with_rules: bool = True) -> str:
    """1 when the device carries a taint or a DeviceTaintRule selects it (a rule's blank field matches any)."""
    own = json_array_nonempty(f"{alias}.taints")
    if not with_rules:
        return f"(CASE WHEN {own} THEN 1 ELSE 0 END)"
    effects = ", ".join(f"'{e}'" for e in BLOCKING_EFFECTS)
    # A rule without a deviceSelector selects nothing (upstream); blank selector fields match anything.
    has_selector = f"{json_text('t.object', 'spec', 'deviceSelector')} IS NOT NULL"
    rule = (f"EXISTS (SELECT 1 FROM {T_TAINTRULE} t WHERE {has_selector}"
            f" AND (t.cluster_id IS NULL OR t.cluster_id = {alias}.cluster_id)"
            f" AND (t.driver = '' OR t.driver = {alias}.driver) AND (t.pool_name = '' OR t.pool_name = {alias}.pool_name)"
            f" AND (t.device_name = '' OR t.device_name = {alias}.name) AND t.effect IN ({effects}))")
    return f"(CASE WHEN {own} OR {rule} THEN 1 ELSE 0 END)"


def units_sql(where: str = "", *, with_rules: bool = True, extra_group: str = "") -> str:
    """SQL for one row per unit (current pool generation only).

    Columns: cluster_id, cluster, node_name, driver, product, unit (pool/device or pool/counter-set),
    partitioned (0/1), devices (devices in the unit), tainted (0/1), invalid (0/1, pool invalid),
    claims (distinct claims holding any part), consumers (most consumers of one of those claims),
    used_devices (devices of the unit with an allocation).
    ``where`` filters devices (aliases: d device, c cluster, p pool) and may use %s parameters.
    """
    part = partition_expr("d")
    unit = f"(d.pool_name || '/' || CASE WHEN {part} THEN {counter_set_expr('d')} ELSE d.name END)"
    return f"""
        SELECT d.cluster_id AS cluster_id, c.name AS cluster, d.node_name AS node_name, d.driver AS driver,
               {product_expr('d')} AS product, {unit} AS unit{extra_group and ', ' + extra_group},
               MAX(CASE WHEN {part} THEN 1 ELSE 0 END) AS partitioned,
               COUNT(DISTINCT d.id) AS devices,
               MAX({tainted_expr('d', with_rules)}) AS tainted,
               MAX(CASE WHEN p.state = 'invalid' THEN 1 ELSE 0 END) AS invalid,
               COUNT(DISTINCT da.claim_id) AS claims,
               COALESCE(MAX(r.n), 0) AS consumers,
               COUNT(DISTINCT CASE WHEN da.id IS NOT NULL THEN d.id END) AS used_devices
        FROM {T_DEVICE} d
        JOIN {T_CLUSTER} c ON c.id = d.cluster_id
        JOIN {T_POOL} p ON p.cluster_id = d.cluster_id AND p.driver = d.driver AND p.name = d.pool_name
                       AND p.generation = d.pool_generation
        LEFT JOIN {T_ALLOC} da ON da.cluster = c.name AND da.driver = d.driver AND da.pool = d.pool_name
                              AND da.device = d.name AND NOT da.admin_access
        LEFT JOIN (SELECT claim_id, COUNT(*) AS n FROM {T_RESERVATION} GROUP BY claim_id) r ON r.claim_id = da.claim_id
        {('WHERE ' + where) if where else ''}
        GROUP BY d.cluster_id, c.name, d.node_name, d.driver, {product_expr('d')}, {unit}{extra_group and ', ' + extra_group}
    """


# Mutually exclusive states of a unit, in the order the bars stack them.
STATE_SQL = """
    SUM(CASE WHEN u.claims > 1 OR u.consumers > 1 THEN 1 ELSE 0 END) AS shared,
    SUM(CASE WHEN u.claims = 1 AND u.consumers <= 1 THEN 1 ELSE 0 END) AS allocated_only,
    SUM(CASE WHEN u.claims = 0 AND u.tainted = 1 THEN 1 ELSE 0 END) AS tainted,
    SUM(CASE WHEN u.claims = 0 AND u.tainted = 0 AND u.invalid = 1 THEN 1 ELSE 0 END) AS invalid,
    SUM(CASE WHEN u.claims = 0 AND u.tainted = 0 AND u.invalid = 0 THEN 1 ELSE 0 END) AS free,
    SUM(u.partitioned) AS partitioned,
    COUNT(*) AS total
"""


def has_taint_rules() -> bool:
    """Skip the per-device rule probe entirely when no DeviceTaintRule exists (the common case)."""
    from inventory.models import DeviceTaintRule

    return DeviceTaintRule.objects.exists()
