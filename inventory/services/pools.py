"""Pool state and device rows, computed from normalized v1 slices. Pure functions (no database).

A pool is (driver, pool name) within one cluster. Following the upstream allocator (``GatherPools`` in
k8s.io/dynamic-resource-allocation/structured): only slices of the highest generation count; a pool is
incomplete while it has a different number of such slices than ``resourceSliceCount`` says; a complete
pool is invalid when device names repeat or a device consumes from an unknown counter set or counter.
The reasons use upstream's wording.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

COMPLETE, INCOMPLETE, INVALID = "complete", "incomplete", "invalid"


@dataclass
class PoolState:
    driver: str
    name: str
    generation: int
    resource_slice_count: int
    slice_count: int
    device_count: int
    state: str
    reason: str = ""


def compute_pool_states(slices: Iterable[dict]) -> dict[tuple[str, str], PoolState]:
    """``slices``: normalized v1 ResourceSlice objects of one cluster (or at least whole pools of it)."""
    by_pool: dict[tuple[str, str], list[dict]] = {}
    for obj in slices:
        spec = obj["spec"]
        by_pool.setdefault((spec["driver"], spec["pool"]["name"]), []).append(obj)
    return {key: _pool_state(key, members) for key, members in by_pool.items()}


def _pool_state(key: tuple[str, str], members: list[dict]) -> PoolState:
    generation = max(m["spec"]["pool"].get("generation", 0) for m in members)
    current = sorted((m for m in members if m["spec"]["pool"].get("generation", 0) == generation),
                     key=lambda m: m["metadata"]["name"])
    counts = {m["spec"]["pool"]["resourceSliceCount"] for m in current}
    expected = max(counts)
    devices = sum(len(m["spec"].get("devices") or ()) for m in current)
    state = PoolState(driver=key[0], name=key[1], generation=generation, resource_slice_count=expected,
                      slice_count=len(current), device_count=devices, state=COMPLETE)
    if len(counts) > 1:
        state.state = INVALID
        state.reason = (f"slices of generation {generation} disagree on resourceSliceCount "
                        f"({', '.join(str(c) for c in sorted(counts))})")
        return state
    if len(current) != expected:
        state.state = INCOMPLETE
        state.reason = f"{len(current)} of {expected} slices published for generation {generation}"
        return state
    reason = _invalid_reason(current)
    if reason:
        state.state, state.reason = INVALID, reason
    return state


def generation_regressions(previous: dict[tuple[str, str], int], states: dict[tuple[str, str], PoolState]
                           ) -> list[tuple[tuple[str, str], int, int]]:
    """(pool key, stored generation, new generation) for pools whose generation goes backwards."""
    return [(key, previous[key], st.generation) for key, st in sorted(states.items())
            if key in previous and st.generation < previous[key]]


def mixed_generations(slices: Iterable[tuple[str, dict]]) -> list[tuple[str, str]]:
    """(path, reason) for each slice of ``(path, normalized slice)`` below its pool's highest generation.

    A cluster never publishes two generations of one pool for good: a list holding both was taken mid-way
    through a driver's update, and only the highest generation would count anyway. One push must carry one
    generation per pool; the agent leaves the named slices out and pushes again.
    """
    by_pool: dict[tuple[str, str], list[tuple[str, dict]]] = {}
    for path, obj in slices:
        by_pool.setdefault((obj["spec"]["driver"], obj["spec"]["pool"]["name"]), []).append((path, obj))
    errors = []
    for (driver, pool), members in by_pool.items():
        highest = max(m["spec"]["pool"].get("generation", 0) for _, m in members)
        for path, obj in members:
            generation = obj["spec"]["pool"].get("generation", 0)
            if generation < highest:
                errors.append((f"{path}.spec.pool.generation",
                               f"Invalid value: {generation}: pool {driver}/{pool} has slices of generation "
                               f"{highest} in this push; a push carries one generation per pool"))
    return errors


def _invalid_reason(current: list[dict]) -> str:
    names: set[str] = set()
    counter_sets: dict[str, set[str]] = {}
    for obj in current:
        for device in obj["spec"].get("devices") or ():
            if device["name"] in names:
                return f"duplicate device name {device['name']}"
            names.add(device["name"])
        for counter_set in obj["spec"].get("sharedCounters") or ():
            if counter_set["name"] in counter_sets:
                return f"duplicate counter set name {counter_set['name']}"
            counter_sets[counter_set["name"]] = set(counter_set.get("counters") or ())
    for obj in current:
        for device in obj["spec"].get("devices") or ():
            for consumption in device.get("consumesCounters") or ():
                available = counter_sets.get(consumption["counterSet"])
                if available is None:
                    return f"counter set {consumption['counterSet']} not found"
                for counter in consumption.get("counters") or ():
                    if counter not in available:
                        return f"counter {counter} not found in counter set {consumption['counterSet']}"
    return ""


def _attribute_text(value: dict):
    """A v1 attribute value as the string(s) an ``?attribute=name=value`` filter compares with."""
    for key, item in value.items():
        if key in ("bool", "bools"):
            return [("true" if v else "false") for v in item] if key == "bools" else ("true" if item else "false")
        if key in ("ints", "strings", "versions"):
            return [str(v) for v in item]
        return str(item)
    return None


def attribute_index(driver: str, attributes: dict) -> dict:
    """Fully qualified name -> string value(s); unqualified names belong to the driver's domain."""
    index = {}
    for name, value in attributes.items():
        qualified = name if "/" in name else f"{driver}/{name}"
        text = _attribute_text(value)
        if text is not None:
            index[qualified] = text
    return index


def device_rows(obj: dict) -> list[dict]:
    """The flattened Device columns for every device of one normalized slice (no ids)."""
    spec = obj["spec"]
    driver = spec["driver"]
    slice_node = spec.get("nodeName", "")
    rows = []
    for device in spec.get("devices") or ():
        attributes = device.get("attributes") or {}
        rows.append({
            "name": device["name"],
            "driver": driver,
            "pool_name": spec["pool"]["name"],
            "pool_generation": spec["pool"].get("generation", 0),
            "node_name": device.get("nodeName") or slice_node,
            "attributes": attributes,
            "capacity": device.get("capacity") or {},
            "consumes_counters": device.get("consumesCounters") or [],
            "taints": device.get("taints") or [],
            "allow_multiple_allocations": bool(device.get("allowMultipleAllocations")),
            "binds_to_node": bool(device.get("bindsToNode")),
            "binding_conditions": device.get("bindingConditions") or [],
            "binding_failure_conditions": device.get("bindingFailureConditions") or [],
            "all_nodes": bool(device.get("allNodes") or spec.get("allNodes")),
            "node_selector": device.get("nodeSelector") or spec.get("nodeSelector"),
            "attribute_index": attribute_index(driver, attributes),
        })
    return rows
