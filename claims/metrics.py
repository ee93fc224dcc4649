"""Prometheus metrics of the claims app, read from the database at scrape time.

A collector (not process-local gauges) because the numbers change in worker processes, not in the web
process that serves ``/metrics``; every gunicorn worker answers a scrape with the same values. Each part is a
few aggregate queries, bounded whatever the table sizes:

* claims by phase, devices held per cluster, claims holding a removed device;
* pending claims: the oldest one's age, and count and oldest age per namespace for the
  ``METRICS_TOP_NAMESPACES`` namespaces with the most pending claims (bounded cardinality);
* the allocation histograms over the trailing ``METRICS_WINDOW_SECONDS``: submit->allocated latency (from the
  claims' audit trail: each ``Allocated`` event against the claim's ``Created`` event) and round duration
  (from ``AllocationRound``, see ``scheduler.services.round_log`` for why the database), plus what those rounds
  did and how many raised.

The histograms describe a window, not a lifetime: they are exposed as gauge histograms (``_bucket``,
``_gcount``, ``_gsum``) and are read without ``rate()``, e.g.
``histogram_quantile(0.99, sum by (le) (draservice_claim_submit_to_allocated_seconds_bucket))``.
A cumulative histogram cannot be rebuilt from rows that are purged (or claims that are deleted).
"""
from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import timedelta

from django.conf import settings
from django.db.models import Count, DurationField, ExpressionWrapper, F, Min, OuterRef, Q, Subquery, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone
from prometheus_client.core import GaugeHistogramMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from claims.models import AllocationRound, ClaimEvent, DeviceAllocation, Phase, ResourceClaim
from claims.services import events as ev

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
ROUND_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
ROUND_OUTCOMES = ("allocated", "pending", "failed", "lost_race")


def _buckets(field: str, bounds: Iterable[float], as_value) -> dict:
    """Aggregates (for one ``aggregate()`` with the totals): the cumulative count at each bound."""
    return {f"le_{i}": Count("id", filter=Q(**{f"{field}__lte": as_value(b)})) for i, b in enumerate(bounds)}


def _histogram(name: str, doc: str, bounds: tuple[float, ...], counts: dict, n: int, total: float):
    family = GaugeHistogramMetricFamily(name, doc)
    buckets = [(_le(b), counts[f"le_{i}"]) for i, b in enumerate(bounds)] + [("+Inf", n)]
    family.add_metric([], buckets, gsum_value=total)
    return family


def _le(bound: float) -> str:
    return repr(float(bound))


def phase_families() -> list:
    claims = GaugeMetricFamily("draservice_claims", "ResourceClaims by phase", labels=["phase"])
    allocations = GaugeMetricFamily("draservice_device_allocations",
                                    "Devices (and device shares) held by claims, by cluster", labels=["cluster"])
    removed = GaugeMetricFamily("draservice_claims_device_removed",
                                "Allocated claims holding a device that a later inventory push removed "
                                "(condition DeviceRemoved)")
    counts = dict(ResourceClaim.objects.values_list("phase").annotate(n=Count("id")).values_list("phase", "n"))
    for phase in Phase.values:
        claims.add_metric([phase], counts.get(phase, 0))
    for cluster, n in (DeviceAllocation.objects.filter(admin_access=False).values_list("cluster")
                       .annotate(n=Count("id")).values_list("cluster", "n")):
        allocations.add_metric([cluster], n)
    removed.add_metric([], ResourceClaim.objects.filter(phase=Phase.ALLOCATED, device_removed_at__isnull=False)
                       .count())
    return [claims, allocations, removed]


def pending_families(now) -> list:
    oldest = GaugeMetricFamily("draservice_claims_oldest_pending_seconds",
                               "Age of the oldest pending claim (0 when none is pending)")
    by_ns = GaugeMetricFamily("draservice_namespace_pending_claims",
                              "Pending claims, for the METRICS_TOP_NAMESPACES namespaces with the most",
                              labels=["namespace"])
    ns_oldest = GaugeMetricFamily("draservice_namespace_oldest_pending_seconds",
                                  "Age of the namespace's oldest pending claim (the same top namespaces)",
                                  labels=["namespace"])
    pending = ResourceClaim.objects.filter(phase=Phase.PENDING)
    first = pending.aggregate(at=Min("created_at"))["at"]
    oldest.add_metric([], (now - first).total_seconds() if first else 0.0)
    top = (pending.order_by().values("namespace__name").annotate(n=Count("id"), at=Min("created_at"))
           .order_by("-n", "at", "namespace__name")[:max(settings.METRICS_TOP_NAMESPACES, 0)])
    for row in top:
        by_ns.add_metric([row["namespace__name"]], row["n"])
        ns_oldest.add_metric([row["namespace__name"]], (now - row["at"]).total_seconds())
    return [oldest, by_ns, ns_oldest]


def latency_family(since) -> GaugeHistogramMetricFamily:
    """Submit->allocated latency of the claims allocated within the window (newest ``METRICS_WINDOW_ROWS``).

    Submitted: the claim's ``Created`` event (found by the events' (claim_uid, id) index; it outlives a
    deleted claim), else the claim's own ``created_at``. A claim allocated again after a preemption counts
    again, from its original submission."""
    created = (ClaimEvent.objects.filter(claim_uid=OuterRef("claim_uid"), type=ev.CREATED).order_by("id")
               .values("created_at")[:1])
    latency = ExpressionWrapper(F("created_at") - Coalesce(Subquery(created), F("claim__created_at")),
                                output_field=DurationField())
    rows = (ClaimEvent.objects.filter(type=ev.ALLOCATED, created_at__gte=since).order_by("-created_at")
            .annotate(latency=latency)[:settings.METRICS_WINDOW_ROWS])
    agg = rows.aggregate(n=Count("id", filter=Q(latency__isnull=False)), total=Sum("latency"),
                         **_buckets("latency", LATENCY_BUCKETS, lambda b: timedelta(seconds=b)))
    total = agg["total"].total_seconds() if agg["total"] else 0.0
    return _histogram("draservice_claim_submit_to_allocated_seconds",
                      "Submit->allocated latency of the claims allocated in the last METRICS_WINDOW_SECONDS "
                      "(a gauge histogram over that window: no rate())", LATENCY_BUCKETS, agg, agg["n"], total)


def round_families(since) -> list:
    rows = AllocationRound.objects.filter(finished_at__gte=since).order_by("-finished_at")[
        :settings.METRICS_WINDOW_ROWS]
    totals = rows.aggregate(n=Count("id"), total=Sum("seconds"), errors=Count("id", filter=~Q(error="")),
                            **{k: Sum(k) for k in ROUND_OUTCOMES}, **_buckets("seconds", ROUND_BUCKETS, float))
    histogram = _histogram("draservice_allocation_round_seconds",
                           "Duration of the allocation rounds of the last METRICS_WINDOW_SECONDS (a gauge histogram "
                           "over that window: no rate())", ROUND_BUCKETS, totals, totals["n"], totals["total"] or 0.0)
    errors = GaugeMetricFamily("draservice_allocation_round_errors",
                               "Allocation rounds that raised in the last METRICS_WINDOW_SECONDS")
    errors.add_metric([], totals["errors"])
    outcomes = GaugeMetricFamily("draservice_allocation_round_claims",
                                 "Claims decided by the allocation rounds of the last METRICS_WINDOW_SECONDS, by "
                                 "outcome (failed: refused for good; lost_race: retried)", labels=["outcome"])
    for key in ROUND_OUTCOMES:
        outcomes.add_metric([key], totals[key] or 0)
    window = GaugeMetricFamily("draservice_metrics_window_seconds",
                               "The window the allocation histograms and round counts describe")
    window.add_metric([], settings.METRICS_WINDOW_SECONDS)
    return [histogram, errors, outcomes, window]


class ClaimsCollector(Collector):
    def collect(self):
        now = timezone.now()
        since = now - timedelta(seconds=settings.METRICS_WINDOW_SECONDS)
        parts = (("claims", phase_families), ("pending claims", lambda: pending_families(now)),
                 ("allocation latency", lambda: [latency_family(since)]),
                 ("allocation rounds", lambda: round_families(since)))
        for what, build in parts:
            try:
                families = build()
            except Exception as exc:  # a scrape must not fail because the database is briefly away
                log.warning("%s metrics unavailable: %s", what, exc)
                continue
            yield from families

    def describe(self):
        return []  # no eager collection at registration time (the database may not be ready)
