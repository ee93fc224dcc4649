"""Prometheus gauges of fleet capacity, read from the database at scrape time (see ``claims.metrics``).

The counts are the dashboard's, not a second definition: accelerators as
``claims.services.figures.accelerators`` defines them (one partitioned GPU with all its partitions, or a device
of a DeviceClass marked as an accelerator; helper devices are not counted) in the exclusive states of
``claims.services.figures.fleet.Tally`` (allocated includes shared; tainted, stale, invalid and free are units no
claim holds; everything on a stale cluster that no claim holds and no taint blocks counts as stale). So
``allocated + tainted + stale + invalid + free == total`` for every (cluster, driver, product).

Bounded cost: the unit aggregate is the dashboard overview's, maintained per change (``fleet_tally``: one
device scan per inventory version, then only the allocation rows that changed), and the families are rebuilt
only when the fleet state key (``fleet_state_key()``), a cluster's staleness or a cluster's name changes.
Staleness is time-dependent (a silent cluster turns stale without any write), so it is part of the key rather
than of the cached rows.
"""
from __future__ import annotations

import logging

from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from claims.services.figures.fleet import Tally, fleet_state_key, overview_rows
from inventory.models import Cluster

log = logging.getLogger(__name__)

LABELS = ["cluster", "driver", "product"]
# (metric name suffix, help, Tally attribute)
STATES = (
    ("", "Accelerators (a partitioned GPU counts once; helper devices not at all), as the dashboard counts them",
     "total"),
    ("_allocated", "Units held by claims (including shared ones)", "allocated"),
    ("_shared", "Units held by more than one claim or consumer", "shared"),
    ("_tainted", "Units no claim holds that a blocking taint keeps off new claims", "tainted"),
    ("_stale", "Units no claim holds on a stale cluster (not offered)", "stale"),
    ("_invalid", "Units no claim holds in an invalid pool (not offered)", "invalid"),
    ("_free", "Units offered for new claims: total - allocated - tainted - stale - invalid", "free"),
    # The four exclusive states (claims.services.figures.accelerators):
    # free + partial + allocated_full + unavailable == total.
    ("_partial", "Partitioned GPUs some of whose partitions are in use (part of allocated)", "partial"),
    ("_allocated_full", "Accelerators held by claims, not counting partially used ones", "allocated_full"),
    ("_unavailable", "Accelerators no claim holds that are tainted, in an invalid pool or on a stale cluster",
     "unavailable_all"),
)

# One entry: the key it was computed for and the tallies by (cluster, driver, product).
_cache: dict[tuple, dict[tuple[str, str, str], Tally]] = {}


def fleet_tallies() -> dict[tuple[str, str, str], Tally]:
    now = timezone.now()
    clusters = list(Cluster.objects.only("name", "last_sync_at", "last_heartbeat_at"))
    names = {c.id: c.name for c in clusters}
    stale = frozenset(c.id for c in clusters if c.is_stale(now))
    key = (fleet_state_key(), stale, tuple(sorted(names.items())))
    tallies = _cache.get(key)
    if tallies is None:
        tallies = {}
        for row in overview_rows():
            name = names.get(row["cluster_id"])
            if name is None:  # a cluster registered after the list above: the next scrape has it
                continue
            labels = (name, row["driver"], row["product"] or "")
            tallies.setdefault(labels, Tally()).add_row(row, row["cluster_id"] in stale)
        _cache.clear()
        _cache[key] = tallies
    return tallies


def fleet_families() -> list:
    families = [(GaugeMetricFamily(f"draservice_fleet_devices{suffix}", doc, labels=LABELS), attr)
                for suffix, doc, attr in STATES]
    for labels, tally in sorted(fleet_tallies().items()):
        for family, attr in families:
            family.add_metric(list(labels), getattr(tally, attr))
    return [family for family, _ in families]


class FleetCollector(Collector):
    def collect(self):
        try:
            families = fleet_families()
        except Exception as exc:  # a scrape must not fail because the database is briefly away
            log.warning("fleet metrics unavailable: %s", exc)
            return
        yield from families

    def describe(self):
        return []
