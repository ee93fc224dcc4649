"""Prometheus gauges of cluster freshness, read from the database at scrape time (see ``claims.metrics``).

Staleness is the inventory's own live rule, ``Cluster.is_stale`` (silent for longer than
``STALE_CLUSTER_SECONDS``), not the ``stale_since`` mark the periodic sweep sets: the gauge turns the moment
the cluster's devices stop being offered, not at the next sweep. One query over the clusters (a few hundred
rows at most); a series per cluster is bounded by the fleet.
"""
from __future__ import annotations

import logging

from django.conf import settings
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from inventory.models import Cluster

log = logging.getLogger(__name__)


def cluster_families(now) -> list:
    clusters = GaugeMetricFamily("draservice_clusters", "Clusters registered")
    stale = GaugeMetricFamily("draservice_clusters_stale",
                              "Clusters silent for longer than the stale threshold (their devices are not offered)")
    per_cluster = GaugeMetricFamily("draservice_cluster_stale", "1 while the cluster is stale", labels=["cluster"])
    age = GaugeMetricFamily("draservice_cluster_last_seen_age_seconds",
                            "Seconds since the cluster's last sync or heartbeat (absent if never heard from)",
                            labels=["cluster"])
    threshold = GaugeMetricFamily("draservice_cluster_stale_threshold_seconds",
                                  "Silence after which a cluster is stale (STALE_CLUSTER_SECONDS)")
    rows = list(Cluster.objects.only("name", "last_sync_at", "last_heartbeat_at").order_by("name"))
    n_stale = 0
    for cluster in rows:
        is_stale = cluster.is_stale(now)
        n_stale += is_stale
        per_cluster.add_metric([cluster.name], 1 if is_stale else 0)
        if cluster.last_seen_at is not None:
            age.add_metric([cluster.name], max(0.0, (now - cluster.last_seen_at).total_seconds()))
    clusters.add_metric([], len(rows))
    stale.add_metric([], n_stale)
    threshold.add_metric([], settings.STALE_CLUSTER_SECONDS)
    return [clusters, stale, per_cluster, age, threshold]


class ClustersCollector(Collector):
    def collect(self):
        try:
            families = cluster_families(timezone.now())
        except Exception as exc:  # a scrape must not fail because the database is briefly away
            log.warning("cluster metrics unavailable: %s", exc)
            return
        yield from families

    def describe(self):
        return []
