"""Prometheus gauges per queue, read from the database at scrape time (as ``claims.metrics``): quota
(nominal), use and borrowing per class and unit, pending claims and the oldest one's age, dominant share,
preemptions, and how preemption victims were released (``queues.release_metrics``)."""
from __future__ import annotations

import logging
from collections import defaultdict
from fractions import Fraction

from django.db.models import Min
from django.utils import timezone
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from claims.models import Phase, ResourceClaim
from queues.services.resolve import claims_of_queue_q

log = logging.getLogger(__name__)
LABELS = ["queue", "device_class", "unit", "resource"]


def oldest_pending_seconds(queue, now) -> float:
    """The queue's own claims, by the same rule as its ``pendingClaims`` (``queues.services.status``): one
    aggregate per queue on the pending claims' partial index."""
    first = (ResourceClaim.objects.filter(phase=Phase.PENDING)
             .filter(claims_of_queue_q(queue.name, queue.spec.get("namespaces") or []))
             .aggregate(at=Min("created_at"))["at"])
    return (now - first).total_seconds() if first else 0.0


def reservation_families(now):
    """Per reservation: the fraction of its reserved devices its claims hold (0 outside its windows), and how
    late its last occurrences' first claim started (``Reservation.started``; the last one's)."""
    from queues.models import Reservation
    from queues.services import reservations

    utilisation = GaugeMetricFamily("draservice_reservation_utilisation", "Fraction of a reservation's reserved "
                                    "devices its claims hold (0 outside its windows)", labels=["reservation"])
    late = GaugeMetricFamily("draservice_reservation_late_start_seconds", "Seconds from the start of the "
                             "reservation's last started occurrence to its first claim's start",
                             labels=["reservation"])
    items = list(Reservation.objects.order_by("id"))
    used = reservations.in_use([r.name for r in items])
    for r in items:
        utilisation.add_metric([r.name], reservations.status(r, now, used)["utilisation"]["fraction"])
        if r.started:
            late.add_metric([r.name], float(r.started[max(r.started)]))
    return [utilisation, late]


class QueuesCollector(Collector):
    def collect(self):
        from django.db.models import Count

        from queues import release_metrics
        from queues import spec as queue_spec
        from queues.models import Preemption, PreemptionState, Queue
        from queues.services import status, usage
        from queues.services.order import Shares
        from queues.services.resolve import Tree

        nominal = GaugeMetricFamily("draservice_queue_nominal", "Nominal quota per queue, class and unit",
                                    labels=LABELS)
        used = GaugeMetricFamily("draservice_queue_used", "In use by the queue's admitted claims (its subtree)",
                                 labels=LABELS)
        borrowed = GaugeMetricFamily("draservice_queue_borrowed", "In use beyond the nominal quota", labels=LABELS)
        pending = GaugeMetricFamily("draservice_queue_pending_claims", "Pending claims of the queue", labels=["queue"])
        oldest = GaugeMetricFamily("draservice_queue_oldest_pending_seconds",
                                   "Age of the queue's oldest pending claim (0 when none is pending)", labels=["queue"])
        share = GaugeMetricFamily("draservice_queue_dominant_share", "Dominant share of what the queue borrows, "
                                  "over its weight (the fair-share order's key)", labels=["queue"])
        preempted = CounterMetricFamily("draservice_queue_preemptions", "Claims of the queue preempted (notices "
                                        "cancelled before the devices moved not counted)",
                                        labels=["queue"])
        now = timezone.now()
        try:
            queues = list(Queue.objects.order_by("id"))
            statuses = status.statuses(queues)
            tree = Tree(queues={q.name: q for q in queues}, by_namespace={}, _redirects={})
            shares = Shares(tree, usage.load())
            for q in queues:
                quota: dict[tuple, Fraction] = defaultdict(Fraction)
                for entry in q.spec.get("quotas") or []:
                    if entry.get("devices"):
                        quota[(entry["deviceClassName"], "devices", "")] += Fraction(
                            queue_spec.amount_of(entry["devices"]["nominal"]))
                    for unit in ("counters", "capacity"):
                        for res, limits in (entry.get(unit) or {}).items():
                            quota[(entry["deviceClassName"], unit, res)] += Fraction(
                                queue_spec.amount_of(limits["nominal"]))
                for key, amount in quota.items():
                    nominal.add_metric([q.name, *key], float(amount))
                for row in statuses[q.id]["usage"]:
                    key = (row["deviceClassName"], row["unit"], row.get("name", ""))
                    value = float(row["used"])
                    used.add_metric([q.name, *key], value)
                    borrowed.add_metric([q.name, *key], max(0.0, value - float(quota.get(key, 0))))
                pending.add_metric([q.name], statuses[q.id]["pendingClaims"])
                oldest.add_metric([q.name], oldest_pending_seconds(q, now))
                share.add_metric([q.name], float(shares.dominant(q.id)) / max(q.weight, 1e-9))
            for name, n in (Preemption.objects.exclude(state=PreemptionState.CANCELLED).values_list("queue")
                            .annotate(n=Count("id")).values_list("queue", "n")):
                preempted.add_metric([name], n)
        except Exception as exc:  # a scrape must not fail because the database is briefly away
            log.warning("queue metrics unavailable: %s", exc)
            return
        yield from (nominal, used, borrowed, pending, oldest, share, preempted)
        try:
            yield from reservation_families(now)
        except Exception as exc:  # as above
            log.warning("reservation metrics unavailable: %s", exc)
        try:
            yield from release_metrics.releasing_families(now)
        except Exception as exc:  # as above
            log.warning("preemption release metrics unavailable: %s", exc)

    def describe(self):
        return []
