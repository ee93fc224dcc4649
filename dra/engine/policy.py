"""The placement policy: ``BinPack``, the one named, tested place where the engine prefers one answer over another.

Correctness never depends on it (the search is exact); it only orders what the search tries first.

Nodes (across the fleet):
  1. the preferred cluster of the group, if any;
  2. nodes already partly used before empty ones (keep whole nodes free for big claims);
  3. fewer free matching devices first (best fit: fill nodes up);
  4. cluster name, node name (determinism).

Devices (within a node, for one request):
  1. partly used parents first: partitions of a GPU whose counters are already partly consumed, and shares of a
     multi-allocatable device that already has shares (keep whole GPUs free);
  2. for a request of several devices, devices close together: candidates grouped by
     ``resource.kubernetes.io/pcieRoot`` (or the parent GPU of a partition); the group with the fewest free
     devices that still holds the whole request first (best fit), then larger groups;
  3. allocation order (pool, slice, device), which is also upstream's order.
"""
from __future__ import annotations

from .model import Device

POLICY_NAME = "BinPack"


def node_score(partly_used: bool, free: int) -> tuple[int, int]:
    """Lower is better. ``free`` is the number of free devices matching the group's first request."""
    return (0 if partly_used else 1, free)


def order_candidates(search, alt, cands: list[Device], need: int) -> list[Device]:
    """Candidates of ``alt`` in the order the search should try them (see module docstring)."""
    if not cands:
        return cands
    shared_state = False
    locality = False
    for d in cands:
        if d.consumes or d.allow_multiple:
            shared_state = True
        if d.locality is not None:
            locality = True
    if not shared_state and (need <= 1 or not locality):
        return cands

    engine = search.e
    touched: dict[tuple, bool] = {}  # (pool uid, counter set) -> partly used

    def partly_used(d: Device) -> int:
        if d.allow_multiple:
            return 0 if (engine.active.get(d.idx) or search.loc_active.get(d.idx)) else 1
        if d.consumes:
            uid = d.pool_ref.uid
            for set_name, _ in d.consumes:
                key = (uid, set_name)
                t = touched.get(key)
                if t is None:
                    used = engine.counters_used.get(key)
                    local = search.loc_counters.get(key)
                    t = touched[key] = bool((used and any(used.values())) or (local and any(local.values())))
                if t:
                    return 0
        return 1

    group_rank: dict[object, int] = {}
    if need > 1 and locality:
        free_by_group: dict[object, int] = {}
        first_seen: dict[object, int] = {}
        for pos, d in enumerate(cands):
            key = d.locality
            first_seen.setdefault(key, pos)
            if search.is_available(d, alt):
                free_by_group[key] = free_by_group.get(key, 0) + 1
        groups = sorted(first_seen, key=lambda g: (
            0 if free_by_group.get(g, 0) >= need else 1,
            free_by_group.get(g, 0) if free_by_group.get(g, 0) >= need else -free_by_group.get(g, 0),
            first_seen[g]))
        group_rank = {g: i for i, g in enumerate(groups)}

    decorated = [(partly_used(d) if shared_state else 1, group_rank.get(d.locality, 0), pos, d)
                 for pos, d in enumerate(cands)]
    decorated.sort()  # positions differ: the device itself is never compared
    return [t[3] for t in decorated]
