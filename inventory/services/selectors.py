""""Try this selector": validate a CEL expression and count the fleet's devices it matches.

Counting without evaluating 40,000 times: ``dra.cel`` tells us an expression's *footprint* (which attributes
and capacities of ``device`` it can read). Devices that agree on those values give the same answer, so the
database groups devices by exactly those values (plus driver) and each distinct group is evaluated once.
Typically that is a handful of groups (one per GPU model). When the footprint cannot be determined (the
expression reads a whole attribute map), every device is evaluated, up to ``FULL_SCAN_LIMIT``.

Bounded work per request: an expression whose estimated cost exceeds what a claim or DeviceClass may store
is not evaluated at all (``valid`` is False, with the estimate and the budget); otherwise all evaluations of
one request share ``REQUEST_COST_BUDGET`` cost units and ``TIME_BUDGET_S`` of wall clock (a ``CostMeter``),
on both paths. When either runs out the answer covers the devices evaluated so far: ``truncated`` is True,
``truncated_reason`` says which budget, and ``exhaustive`` is False.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from django.db import connection

from dra.cel import (
    MAX_SELECTOR_COST,
    REQUEST_COST_BUDGET,
    CELCompileError,
    CELDevice,
    CELError,
    CostBudgetExhausted,
    CostMeter,
    compile_expression,
    validate_expression,
)
from dra.cel.cost import COST_HINT, budget_reason
from inventory.models import Cluster, Device, DeviceClass, Pool
from inventory.sql import fetch_dicts, is_postgres, product_expr

T_DEVICE = Device._meta.db_table
T_CLUSTER = Cluster._meta.db_table
T_POOL = Pool._meta.db_table

FULL_SCAN_LIMIT = 50_000
TIME_BUDGET_S = 5.0


@dataclass
class SelectorResult:
    expression: str
    device_class: str = ""
    valid: bool = True
    error: str = ""
    error_position: int | None = None
    hint: str = ""
    class_selectors: list[str] = field(default_factory=list)
    class_matches: int | None = None
    matches: int = 0
    evaluated_devices: int = 0
    groups: int = 0
    runtime_errors: int = 0
    runtime_error_sample: str = ""
    issues: list[dict] = field(default_factory=list)  # validate_expression's errors and warnings, with a pointer
    breakdown: list[dict] = field(default_factory=list)  # {cluster, product, driver, count}
    exhaustive: bool = True
    truncated: bool = False  # a budget of the request ran out: the counts cover the devices evaluated so far
    truncated_reason: str = ""
    estimated_cost: int | None = None  # the expression's worst-case cost per evaluation (dra.cel estimate)
    cost_units: int = 0  # cost units the request's evaluations used
    method: str = ""
    elapsed_ms: int = 0


def _json_member(column: str) -> str:
    """SQL for the JSON text of one top-level member whose key is a parameter."""
    return f"(({column}) -> %s)::text" if is_postgres() else f"json_extract({column}, %s)"


def _member_param(key: str) -> str:
    return key if is_postgres() else '$."' + key.replace('"', '') + '"'


def _grouped(compiled_list) -> tuple[list[str], list, list] | None:
    """GROUP BY columns (SQL, params, path) for the union of the expressions' footprints, or None if any
    footprint is unknown (then every device must be evaluated)."""
    columns, params, paths = [], [], []
    multi = False
    for compiled in compiled_list:
        fp = compiled.footprint
        # "<kind>#names" entries only feed the wording of a failed lookup's hint (the names a domain has);
        # whether a lookup fails is already decided by the looked-up value being absent, which we group by.
        whole_maps = [d for d in (fp.domains if fp else ()) if not d[0].endswith("#names")]
        if fp is None or whole_maps or fp.domain_sets:
            return None
        multi = multi or fp.multi
        for path in fp.paths:
            if path not in paths:
                paths.append(path)
    for kind, domain, name in paths:
        column = "d.attributes" if kind == "a" else "d.capacity"
        # v1 stores the driver's own domain unqualified ("productName"), other domains qualified.
        columns.append(f"CASE WHEN d.driver = %s THEN {_json_member(column)} ELSE {_json_member(column)} END")
        params += [domain, _member_param(name), _member_param(f"{domain}/{name}")]
    if multi:
        columns.append("d.allow_multiple_allocations")
        paths.append(("m", "", ""))
    return columns, params, paths


def _device_from_row(row: dict, paths: list) -> CELDevice:
    attrs: dict[str, Any] = {}
    caps: dict[str, Any] = {}
    multi = None
    for i, (kind, domain, name) in enumerate(paths):
        value = row.get(f"v{i}")
        if kind == "m":
            multi = bool(value)
            continue
        if value is None:
            continue
        value = json.loads(value) if isinstance(value, str) else value
        key = name if domain == row["driver"] else f"{domain}/{name}"
        (attrs if kind == "a" else caps)[key] = value
    return CELDevice(row["driver"], attrs, caps, multi)


def _evaluate_all(compiled_list, device: CELDevice, meter: CostMeter | None = None) -> tuple[bool, str]:
    """(matches, runtime error reason); raises CostBudgetExhausted when ``meter`` runs out."""
    for compiled in compiled_list:
        try:
            if not compiled.evaluate(device, meter=meter):
                return False, ""
        except CELError as exc:
            return False, exc.reason
    return True, ""


BASE_FROM = (f"FROM {T_DEVICE} d JOIN {T_CLUSTER} c ON c.id = d.cluster_id JOIN {T_POOL} p ON "
             f"p.cluster_id = d.cluster_id AND p.driver = d.driver AND p.name = d.pool_name "
             f"AND p.generation = d.pool_generation")


@dataclass
class DeviceGroup:
    """Devices that look the same to the expressions at hand: one CEL evaluation answers for all ``count``."""

    device: CELDevice
    key: tuple
    cluster: str
    product: str
    driver: str
    count: int


def device_groups(compiled_list, where: str = "", params: list | None = None):
    """Yield DeviceGroups for current-generation devices (``where`` filters; aliases d, c, p).

    Returns (iterator, exhaustive-flag holder, method text). Grouped in SQL by the values the expressions
    read when their footprints are known; one group per device otherwise (bounded by FULL_SCAN_LIMIT and
    TIME_BUDGET_S, after which ``state["exhaustive"]`` turns False).
    """
    params = list(params or [])
    where_sql = f" WHERE {where}" if where else ""
    grouped = _grouped(compiled_list)
    state = {"exhaustive": True}

    def run_grouped(cols, col_params, paths):
        select = "".join(f", {col} AS v{i}" for i, col in enumerate(cols))
        # GROUP BY ordinals: PostgreSQL would not match a parameterised expression repeated in GROUP BY.
        group = ", ".join(str(i) for i in range(1, 4 + len(cols)))
        sql = (f"SELECT d.driver AS driver, c.name AS cluster, {product_expr('d')} AS product{select}, "
               f"COUNT(*) AS n {BASE_FROM}{where_sql} GROUP BY {group}")
        for row in fetch_dicts(sql, col_params + params, analytic=True):
            key = (row["driver"],) + tuple(row.get(f"v{i}") for i in range(len(paths)))
            yield DeviceGroup(_device_from_row(row, paths), key, row["cluster"], row["product"] or "",
                              row["driver"], row["n"])

    def run_full():
        started = time.monotonic()
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT d.driver, c.name, {product_expr('d')}, d.attributes, d.capacity, "
                           f"d.allow_multiple_allocations {BASE_FROM}{where_sql} ORDER BY d.id LIMIT %s",
                           params + [FULL_SCAN_LIMIT + 1])
            for n, (driver, cluster, product, attrs, caps, multi) in enumerate(cursor):
                if n >= FULL_SCAN_LIMIT or time.monotonic() - started > TIME_BUDGET_S:
                    state["exhaustive"] = False
                    return
                attrs = json.loads(attrs) if isinstance(attrs, str) else attrs
                caps = json.loads(caps) if isinstance(caps, str) else caps
                dev = CELDevice(driver, attrs or {}, caps or {}, bool(multi))
                yield DeviceGroup(dev, dev.key(), cluster, product or "", driver, 1)

    if grouped is not None:
        return run_grouped(*grouped), state, "grouped by the values the expressions read"
    return run_full(), state, "every device evaluated (an expression reads whole attribute maps)"


def _count(compiled_list, result: SelectorResult, record_breakdown: bool, meter: CostMeter | None = None) -> int:
    """Devices (current pool generation) matching every expression; fills the breakdown when asked. Stops
    early, marking ``result`` truncated, when ``meter`` runs out."""
    groups, state, method = device_groups(compiled_list)
    breakdown: dict[tuple, int] = {}
    cache: dict[tuple, tuple[bool, str]] = {}
    matched = errors = evaluated = 0
    for g in groups:
        if g.key not in cache:
            try:
                cache[g.key] = _evaluate_all(compiled_list, g.device, meter)
            except CostBudgetExhausted as exc:
                result.truncated, result.truncated_reason = True, exc.reason
                state["exhaustive"] = False
                break
        ok, err = cache[g.key]
        evaluated += g.count
        if err:
            errors += g.count
            result.runtime_error_sample = result.runtime_error_sample or err
        if ok:
            matched += g.count
            bkey = (g.cluster, g.product, g.driver)
            breakdown[bkey] = breakdown.get(bkey, 0) + g.count
    result.groups = len(cache)
    result.method = f"{len(cache)} distinct device shapes evaluated ({method})"
    result.exhaustive = state["exhaustive"]
    result.evaluated_devices = evaluated
    result.runtime_errors = errors
    if record_breakdown:
        result.breakdown = [{"cluster": k[0], "product": k[1], "driver": k[2], "count": v}
                            for k, v in sorted(breakdown.items(), key=lambda kv: (-kv[1], kv[0]))]
    return matched


def _pointer(expression: str, position: int | None) -> str:
    """The line of the expression holding ``position`` and a caret under it, for a monospace block."""
    if position is None or not 0 <= position <= len(expression):
        return ""
    start = expression.rfind("\n", 0, position) + 1
    end = expression.find("\n", position)
    line = expression[start:end if end >= 0 else len(expression)]
    return f"{line}\n{' ' * (position - start)}^"


def class_selectors(name: str) -> list[str] | None:
    dc = DeviceClass.objects.filter(name=name, cluster__isnull=True).first() or \
        DeviceClass.objects.filter(name=name).first()
    if dc is None:
        return None
    return [s["cel"]["expression"] for s in ((dc.object or {}).get("spec") or {}).get("selectors") or []
            if (s.get("cel") or {}).get("expression")]


def try_selector(expression: str, *, device_class: str = "", meter: CostMeter | None = None) -> SelectorResult:
    """Validate ``expression`` and count what it matches; ``meter`` bounds the request's evaluations
    (default: ``REQUEST_COST_BUDGET`` units and ``TIME_BUDGET_S``)."""
    started = time.monotonic()
    meter = meter or CostMeter(REQUEST_COST_BUDGET, TIME_BUDGET_S)
    result = SelectorResult(expression=expression, device_class=device_class)
    result.issues = [dict(i, pointer=_pointer(expression, i.get("position"))) for i in validate_expression(expression)]
    try:
        compiled = compile_expression(expression)
    except CELCompileError as exc:
        result.valid, result.error, result.error_position, result.hint = False, exc.reason, exc.position, exc.hint or ""
        if not any(i["severity"] == "error" for i in result.issues):
            result.issues.insert(0, {"severity": "error", "message": exc.reason, "position": exc.position,
                                     "hint": exc.hint, "pointer": _pointer(expression, exc.position)})
        return result
    result.estimated_cost = compiled.max_cost
    if compiled.max_cost > MAX_SELECTOR_COST:
        # What no claim or DeviceClass may store is not worth running against the fleet.
        result.valid, result.error, result.hint = False, budget_reason(compiled.max_cost), COST_HINT
        return result
    compiled_list = [compiled]
    if device_class:
        selectors = class_selectors(device_class) or []
        result.class_selectors = selectors
        try:
            class_compiled = [compile_expression(s) for s in selectors]
        except CELCompileError as exc:  # a class that cannot compile matches nothing, as in the allocator
            result.error = f"the class's own selector does not compile: {exc.reason}"
            class_compiled = None
        if class_compiled:
            scratch = SelectorResult(expression)
            result.class_matches = _count(class_compiled, scratch, False, meter)
            result.truncated, result.truncated_reason = scratch.truncated, scratch.truncated_reason
            result.exhaustive = not scratch.truncated
        if class_compiled is not None:
            compiled_list = class_compiled + [compiled]
    if not result.truncated:
        result.matches = _count(compiled_list, result, True, meter)
    result.cost_units = meter.used
    result.elapsed_ms = int(1000 * (time.monotonic() - started))
    return result
