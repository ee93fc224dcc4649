"""Prometheus families of preemption's safe release (``scheduler.services.preemption``), read from the database
at scrape time like the rest of ``queues.metrics``:

* ``draservice_preemption_releasing_seconds{outcome}``: time from the notice to the requeue of the victims whose
  notice ended within ``METRICS_WINDOW_SECONDS``, by outcome: ``confirmed`` (it stopped, or was released) or
  ``forced`` (nobody confirmed before ``forceAt``: its pods may still have run when its devices moved). A gauge
  histogram of the window, read without ``rate()``, as the allocation histograms are;
* ``draservice_preemption_releasing``: victims being released now; ``draservice_preemption_releasing_overdue``:
  those still releasing past their ``forceAt`` (the sweep has not run: no preemption pass is happening);
* ``draservice_preemption_cancelled_total{queue}``: notices withdrawn before the devices moved (the preemptor
  was allocated elsewhere, deleted, or found room without them: ``queues.services.cancellation``), by the
  victim's queue. Counted from the notice rows, as ``draservice_queue_preemptions`` is.
"""
from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db.models import Count
from prometheus_client.core import CounterMetricFamily, GaugeHistogramMetricFamily, GaugeMetricFamily

from queues.models import Preemption, PreemptionState

BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
OUTCOMES = ("confirmed", "forced")


def releasing_families(now) -> list:
    window = now - timedelta(seconds=settings.METRICS_WINDOW_SECONDS)
    rows = (Preemption.objects.filter(state=PreemptionState.DONE, finished_at__gte=window)
            .order_by("-finished_at").values_list("created_at", "finished_at", "confirmed_at")
            [:settings.METRICS_WINDOW_ROWS])
    seen: dict[str, list[float]] = {o: [] for o in OUTCOMES}
    for created, finished, confirmed in rows:
        if finished is not None:  # the filter on finished_at guarantees it; the type does not say so
            seen["confirmed" if confirmed else "forced"].append(max(0.0, (finished - created).total_seconds()))
    hist = GaugeHistogramMetricFamily("draservice_preemption_releasing_seconds",
                                      "Notice to requeue of preemption victims in the window, by outcome",
                                      labels=["outcome"])
    for outcome, values in seen.items():
        buckets = [(repr(b), sum(1 for v in values if v <= b)) for b in BUCKETS] + [("+Inf", len(values))]
        hist.add_metric([outcome], buckets, gsum_value=sum(values))
    pending = Preemption.objects.filter(state=PreemptionState.PENDING)
    now_releasing = GaugeMetricFamily("draservice_preemption_releasing", "Preemption victims being released now")
    now_releasing.add_metric([], pending.count())
    overdue = GaugeMetricFamily("draservice_preemption_releasing_overdue",
                                "Preemption victims still releasing past their forceAt")
    overdue.add_metric([], pending.filter(deadline__lt=now).count())
    cancelled = CounterMetricFamily("draservice_preemption_cancelled",
                                    "Preemption notices cancelled before the devices moved, by the victim's queue",
                                    labels=["queue"])
    for name, n in (Preemption.objects.filter(state=PreemptionState.CANCELLED).values_list("queue")
                    .annotate(n=Count("id")).values_list("queue", "n")):
        cancelled.add_metric([name], n)
    return [hist, now_releasing, overdue, cancelled]
