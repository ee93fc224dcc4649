"""What the dashboard, ``/metrics`` and ``/api/v1/devices/summary/`` count as an accelerator: one definition.

An *accelerator* is one physical device:

* a partitionable device's counter set (one per physical GPU): the full device and all its MIG partitions,
  which consume from that set, count once;
* a standalone device (it consumes no counters) that a DeviceClass marked as an accelerator selects. A class
  is marked by the annotation ``draservice.io/accelerator: "true"`` (the demo marks its GPU, MIG and shared-GPU
  classes). Helper devices (compute-domain channels and daemons, NICs) match no marked class and are not
  counted.

Each accelerator is in exactly one of four states (``STATES``): free, partially used (a partitioned GPU some
of whose partitions are in use), allocated (held by claims), unavailable (tainted, in an invalid pool, or on a
stale cluster whose inventory may be gone). The unit tally itself (``claims.services.figures.units``) keeps finer
states; ``four_states`` folds them.

Which standalone devices a marked class selects is decided without evaluating CEL per device: the devices of
the scope are grouped in SQL by the values the classes' selectors read (``dra.cel`` footprints, as "try a
selector" does), each distinct group is evaluated once (remembered per class content), and the matching groups
become a plain SQL predicate (``accelerator_sql``) that the unit queries filter on. One grouped statement over
the scope, whatever its size.
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from dra.cel import CELCompileError, CELDevice, compile_expression
from inventory.models import DeviceClass
from inventory.services.selectors import BASE_FROM, _device_from_row, _evaluate_all, _grouped
from inventory.sql import fetch_dicts, fetch_rows, is_postgres, json_array_nonempty

ANNOTATION = "draservice.io/accelerator"
STATES = ("free", "partial", "allocated", "unavailable")
STATE_LABELS = {"free": "free", "partial": "partially used", "allocated": "allocated", "unavailable": "unavailable"}
# Beyond this many matching groups the predicate lists device ids instead (a class whose selector reads a
# per-device value, such as a UUID, would otherwise make one term per device).
MAX_TERMS = 400
MAX_IDS = 50_000


@dataclass(frozen=True)
class MarkedClass:
    cluster_id: int | None  # None: fleet-wide
    name: str
    compiled: tuple
    excluded: frozenset  # clusters with their own class of this name (it overrides the fleet-wide one)

    def applies_to(self, cluster_id: int) -> bool:
        if self.cluster_id is not None:
            return self.cluster_id == cluster_id
        return cluster_id not in self.excluded


def is_marked(obj: dict | None) -> bool:
    annotations = ((obj or {}).get("metadata") or {}).get("annotations") or {}
    return str(annotations.get(ANNOTATION, "")).lower() == "true"


def marked_classes() -> list[MarkedClass]:
    """The DeviceClasses marked as accelerators, with where each applies. A class whose selector does not
    compile selects nothing (as in the allocator)."""
    rows = list(DeviceClass.objects.order_by("name", "cluster_id").values_list("cluster_id", "name", "object"))
    overridden: dict[str, set[int]] = {}
    for cluster_id, name, _ in rows:
        if cluster_id is not None:
            overridden.setdefault(name, set()).add(cluster_id)
    out = []
    for cluster_id, name, obj in rows:
        if not is_marked(obj):
            continue
        exprs = [s["cel"]["expression"] for s in ((obj or {}).get("spec") or {}).get("selectors") or []
                 if (s.get("cel") or {}).get("expression")]
        try:
            compiled = tuple(compile_expression(e) for e in exprs)
        except CELCompileError:
            continue
        out.append(MarkedClass(cluster_id, name, compiled, frozenset(overridden.get(name, ()))))
    return out


# (class content, group key) -> matches: CEL is deterministic, so a shape is evaluated once per class content.
_verdicts: dict[tuple, bool] = {}


def _matches(klass: MarkedClass, key: tuple, device) -> bool:
    cache_key = (tuple(c.expression for c in klass.compiled), key)
    verdict = _verdicts.get(cache_key)
    if verdict is None:
        if len(_verdicts) > 100_000:
            _verdicts.clear()
        verdict = _verdicts[cache_key] = _evaluate_all(list(klass.compiled), device)[0]
    return verdict


def _and(where: str, extra: str) -> str:
    return f"({where}) AND {extra}" if where else extra


def class_match_sql(where: str = "", params: Iterable = ()) -> tuple[str, list]:
    """A SQL predicate (aliases d, c, p) true for the standalone devices of the scope ``where`` that a marked
    class selects, and its parameters."""
    params = list(params)
    classes = marked_classes()
    if not classes:
        return "1 = 0", []
    grouped = _grouped([c for k in classes for c in k.compiled])
    scope = _and(where, f"NOT {json_array_nonempty('d.consumes_counters')}")
    if grouped is None:
        return _ids_predicate(classes, scope, params)
    columns, col_params, paths = grouped
    select = "".join(f", {col} AS v{i}" for i, col in enumerate(columns))
    group = ", ".join(str(i) for i in range(1, 3 + len(columns)))
    rows = fetch_dicts(f"SELECT d.cluster_id AS cluster_id, d.driver AS driver{select} {BASE_FROM} WHERE {scope} "
                       f"GROUP BY {group}", col_params + params, analytic=True)
    terms: list[str] = []
    term_params: list = []
    for row in rows:
        key = (row["driver"],) + tuple(row.get(f"v{i}") for i in range(len(paths)))
        device = _device_from_row(row, paths)
        if not any(k.applies_to(row["cluster_id"]) and _matches(k, key, device) for k in classes):
            continue
        parts, part_params = ["d.cluster_id = %s", "d.driver = %s"], [row["cluster_id"], row["driver"]]
        for i, (column, (kind, _, _)) in enumerate(zip(columns, paths, strict=True)):
            value = row.get(f"v{i}")
            own = col_params[3 * i:3 * i + 3] if kind != "m" else []
            if value is None:
                parts.append(f"{column} IS NULL")
                part_params += own
            else:
                parts.append(f"{column} = %s")
                part_params += own + [_same_type(value)]
        terms.append("(" + " AND ".join(parts) + ")")
        term_params += part_params
    if len(terms) > MAX_TERMS:
        return _ids_predicate(classes, scope, params)
    if not terms:
        return "1 = 0", []
    return "(" + " OR ".join(terms) + ")", term_params


def _same_type(value):
    """A grouped value as a parameter compared with the same expression again (PostgreSQL: its text)."""
    if is_postgres() and not isinstance(value, (str, bool)):
        return json.dumps(value)
    return value


def _ids_predicate(classes: list[MarkedClass], scope: str, params: list) -> tuple[str, list]:
    """The slow path: every standalone device of the scope evaluated (bounded by ``MAX_IDS``)."""
    _, rows = fetch_rows(f"SELECT d.id, d.cluster_id, d.driver, d.attributes, d.capacity, d.allow_multiple_allocations "
                         f"{BASE_FROM} WHERE {scope} ORDER BY d.id LIMIT %s", params + [MAX_IDS], analytic=True)
    ids = []
    for device_id, cluster_id, driver, attrs, caps, multi in rows:
        attrs = json.loads(attrs) if isinstance(attrs, str) else attrs
        caps = json.loads(caps) if isinstance(caps, str) else caps
        device = CELDevice(driver, attrs or {}, caps or {}, bool(multi))
        if any(k.applies_to(cluster_id) and _matches(k, device.key(), device) for k in classes):
            ids.append(device_id)
    if not ids:
        return "1 = 0", []
    return f"d.id IN ({', '.join(['%s'] * len(ids))})", ids


def accelerator_sql(where: str = "", params: Iterable = ()) -> tuple[str, list]:
    """A SQL predicate (aliases d, c, p) true for the devices of the scope ``where`` that belong to an
    accelerator: every device consuming a counter set, and the standalone devices a marked class selects."""
    match, match_params = class_match_sql(where, params)
    return f"({json_array_nonempty('d.consumes_counters')} OR {match})", match_params


def classes_signature() -> tuple:
    """Moves whenever a DeviceClass is written (what ``accelerator_sql`` answers may change)."""
    row = fetch_dicts(f"SELECT COUNT(*) AS n, COALESCE(MAX(id), 0) AS m, COALESCE(SUM(resource_version), 0) AS rv "
                      f"FROM {DeviceClass._meta.db_table}", [])[0]
    return (row["n"], row["m"], row["rv"])


def four_states(tally) -> dict[str, int]:
    """The four exclusive states of a ``claims.services.figures.fleet.Tally``: free, partially used, allocated,
    unavailable. They sum to ``tally.total``."""
    return {"free": tally.free, "partial": tally.partial, "allocated": tally.allocated - tally.partial,
            "unavailable": tally.tainted + tally.stale + tally.invalid}
