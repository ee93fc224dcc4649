"""Writing the ledger: intervals open in the claims commit's transaction and close in the release's.

The claims app calls ``open_intervals`` from ``claims.services.commit`` (the one writer of allocation rows) and
``close_intervals`` wherever it deletes allocation rows (release, delete, lease expiry, preemption), inside the
same transaction: an allocation row exists exactly while its interval is open, whatever crashes when. Both are
one bulk statement; nothing here takes a lock or reads the inventory from the database.

Weights come from the fleet snapshot the commit's decision was made on (its inventory version is re-checked
under lock by the commit, so the snapshot is what the database holds). The snapshot is indexed lazily, per
pool touched, so the first commit after an inventory change does not walk the whole fleet under the commit's
locks.
"""
from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any

from dra.engine.quantity import QuantityError, parse_quantity
from dra.k8s.inventory import product_name
from usage import usage_sql
from usage.models import Sharing, UsageInterval

# The same rule as the utilisation snapshots (claims.services.utilisation): productName for GPUs, else model
# or type. Repeated here because the ledger may not import the claims services (they import it).
# What a partition's or share's weight is measured in when the device says: the parent's memory.
MEMORY = "memory"
WEIGHT_PLACES = Decimal("1e-12")
COLUMNS = [f.attname for f in UsageInterval._meta.concrete_fields if not f.primary_key]  # = columns: no FKs


@dataclass
class Held:
    """What one claim was given by one commit: the engine's ``AllocationResult.devices.results``."""

    claim: Any  # claims.models.ResourceClaim with its namespace loaded
    cluster: str
    node: str
    results: list[dict]
    queue: str = ""
    reservation: str = ""


def open_intervals(held: list[Held], snapshot, now) -> int:
    """Insert one open interval per device or share in ``held`` (admin access consumes nothing: no row)."""
    index = _index_for(snapshot)
    rows = []
    for h in held:
        for res in h.results:
            if res.get("adminAccess"):
                continue
            device, counter_sets, slice_node = index.device(h.cluster, res["driver"], res["pool"], res["device"])
            share_id = res.get("shareID") or ""
            weight, sharing = weight_of(device, counter_sets, share_id, res.get("consumedCapacity"))
            rows.append({
                "claim_id": h.claim.id, "claim_uid": h.claim.uid, "claim_name": h.claim.name,
                "namespace": h.claim.namespace.name, "queue": h.queue or "", "cluster": h.cluster,
                "reservation": h.reservation,
                "node": h.node or slice_node, "driver": res["driver"], "pool": res["pool"], "device": res["device"],
                "share_id": share_id, "product": product_name(device), "sharing": str(sharing),
                "weight": to_decimal(weight), "started_at": now, "ended_at": None})
    usage_sql.insert_intervals(rows, COLUMNS)
    return len(rows)


def close_intervals(claim_ids: list[int], now) -> int:
    """End the open intervals of ``claim_ids`` at ``now`` (never before they started: the release may run on
    a host whose clock is a little behind the committing worker's)."""
    if not claim_ids:
        return 0
    return usage_sql.close_intervals(claim_ids, now)


# ------------------------------------------------------------------------------------------------ weights

def weight_of(device: dict | None, counter_sets: dict[str, dict], share_id: str,
              consumed: dict | None) -> tuple[Fraction, str]:
    """(weight, sharing mode) of one allocated device or share. A device the snapshot does not know (it
    cannot happen through the commit, which checks the inventory version) counts as a whole device."""
    if share_id:
        capacity = {n: (c or {}).get("value") for n, c in ((device or {}).get("capacity") or {}).items()}
        return _ratio(consumed or {}, capacity), Sharing.SHARED
    consumes = (device or {}).get("consumesCounters") or []
    if consumes:
        used: dict[str, Fraction] = defaultdict(Fraction)
        total: dict[str, Fraction] = defaultdict(Fraction)
        for cc in consumes:
            available = counter_sets.get(cc.get("counterSet"), {})
            for name, c in (cc.get("counters") or {}).items():
                used[name] += _quantity((c or {}).get("value"))
                total[name] += _quantity((available.get(name) or {}).get("value"))
        weight = _fraction_of(used, total)
        return weight, Sharing.EXCLUSIVE if weight >= 1 else Sharing.PARTITION
    return Fraction(1), Sharing.EXCLUSIVE


def _ratio(consumed: dict, capacity: dict) -> Fraction:
    used = {n: _quantity(v) for n, v in consumed.items()}
    total = {n: _quantity(capacity.get(n)) for n in used}
    return _fraction_of(used, total)


def _fraction_of(used: dict[str, Fraction], total: dict[str, Fraction]) -> Fraction:
    """Memory's share when memory is counted, else the largest share of anything counted, within [0, 1];
    1 when nothing is counted (a share that states no consumption is charged as the whole device)."""
    shares = {n: Fraction(used[n]) / total[n] for n in used if total.get(n)}
    if not shares:
        return Fraction(1)
    value = shares[MEMORY] if MEMORY in shares else max(shares.values())
    return min(Fraction(1), max(Fraction(0), value))


def _quantity(text) -> Fraction:
    try:
        return Fraction(parse_quantity(text)) if text is not None else Fraction(0)
    except QuantityError:
        return Fraction(0)


def to_decimal(value: Fraction) -> Decimal:
    return (Decimal(value.numerator) / Decimal(value.denominator)).quantize(WEIGHT_PLACES)





# ------------------------------------------------------------------------------------------ snapshot index

class _Index:
    """Devices and counter sets of one fleet snapshot, indexed per pool on first use."""

    def __init__(self, snapshot) -> None:
        self.clusters = {c.name: c for c in getattr(snapshot, "clusters", None) or ()}
        self.slices: dict[str, dict[tuple[str, str], list[dict]]] = {}
        self.pools: dict[tuple[str, str, str], tuple[dict[str, tuple[dict, str]], dict[str, dict]]] = {}
        self.lock = threading.Lock()

    def device(self, cluster: str, driver: str, pool: str, name: str) -> tuple[dict | None, dict[str, dict], str]:
        """(raw v1 device, counter sets of its pool by name, its slice's nodeName)."""
        key = (cluster, driver, pool)
        with self.lock:
            if key not in self.pools:
                self.pools[key] = self._pool(cluster, driver, pool)
            devices, counters = self.pools[key]
        device, node = devices.get(name, (None, ""))
        return device, counters, node

    def _pool(self, cluster: str, driver: str, pool: str):
        if cluster not in self.slices:
            grouped: dict[tuple[str, str], list[dict]] = defaultdict(list)
            inv = self.clusters.get(cluster)
            for s in (inv.resource_slices if inv is not None else ()):
                spec = s.get("spec") or {}
                grouped[(spec.get("driver", ""), (spec.get("pool") or {}).get("name", ""))].append(spec)
            self.slices[cluster] = grouped
        slices = self.slices[cluster].get((driver, pool), [])
        # Only the pool's newest generation counts, as for the engine.
        top = max(((s.get("pool") or {}).get("generation", 0) for s in slices), default=0)
        devices: dict[str, tuple[dict, str]] = {}
        counters: dict[str, dict] = {}
        for spec in slices:
            if (spec.get("pool") or {}).get("generation", 0) != top:
                continue
            for cs in spec.get("sharedCounters") or ():
                counters[cs.get("name")] = cs.get("counters") or {}
            for d in spec.get("devices") or ():
                devices[d.get("name", "")] = (d, d.get("nodeName") or spec.get("nodeName") or "")
        return devices, counters


_last: tuple[object, _Index] | None = None
_last_lock = threading.Lock()


def _index_for(snapshot) -> _Index:
    """The index of ``snapshot``: the last one is kept (the claims worker reuses one snapshot per fleet
    state across many commits)."""
    global _last
    with _last_lock:
        if _last is None or _last[0] is not snapshot:
            _last = (snapshot, _Index(snapshot))
        return _last[1]
