"""Prometheus gauges of the claims app, read from the database at scrape time.

A collector (not process-local gauges) because the numbers change in worker processes, not in the web
process that serves ``/metrics``. Three cheap aggregate queries per scrape.
"""
from __future__ import annotations

import logging

from prometheus_client.core import GaugeMetricFamily

log = logging.getLogger(__name__)


class ClaimsCollector:
    def collect(self):
        from django.db.models import Count

        from claims.models import DeviceAllocation, Phase, ResourceClaim

        claims = GaugeMetricFamily("draservice_claims", "ResourceClaims by phase", labels=["phase"])
        allocations = GaugeMetricFamily("draservice_device_allocations",
                                        "Devices (and device shares) held by claims, by cluster", labels=["cluster"])
        removed = GaugeMetricFamily("draservice_claims_device_removed",
                                    "Allocated claims holding a device that a later inventory push removed "
                                    "(condition DeviceRemoved)")
        try:
            counts = dict(ResourceClaim.objects.values_list("phase").annotate(n=Count("id")).values_list("phase", "n"))
            for phase in Phase.values:
                claims.add_metric([phase], counts.get(phase, 0))
            for cluster, n in (DeviceAllocation.objects.filter(admin_access=False).values_list("cluster")
                               .annotate(n=Count("id")).values_list("cluster", "n")):
                allocations.add_metric([cluster], n)
            removed.add_metric([], ResourceClaim.objects.filter(phase=Phase.ALLOCATED,
                                                                device_removed_at__isnull=False).count())
        except Exception as exc:  # a scrape must not fail because the database is briefly away
            log.warning("claims metrics unavailable: %s", exc)
            return
        yield claims
        yield allocations
        yield removed

    def describe(self):
        return []  # no eager collection at registration time (the database may not be ready)
