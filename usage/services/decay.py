"""Decayed usage per queue, from the ledger: ``U(t) = Σ device-seconds_i × 2^(-(t - t_i) / halfLife)``.

``t_i`` is when an interval closed and its device-seconds ``weight × (end - start)`` (the ledger's own
measure). Kept incrementally as one ``(U, t)`` row per queue with a half-life (``DecayedUsage``): the ledger's
close (``usage.usage_sql.close_intervals_ctes``, in the release's statement) decays the row to the close and
adds what closed; a read decays it to now. Setting or changing a queue's half-life (``configure``, in the queue
write's transaction) computes the row afresh from the ledger's closed intervals, so a queue gets its history at
once, not from the day the half-life was set. Intervals still open count when they close. PostgreSQL only (the
service's database); elsewhere the rows stay as ``configure`` made them.
"""
from __future__ import annotations

from django.utils import timezone

from usage import usage_sql
from usage.models import DecayedUsage


def decayed(value: float, at_seconds: float, half_life: float, now_seconds: float) -> float:
    """``value`` as of ``at`` decayed to ``now`` (no growth for a clock behind ``at``)."""
    if half_life <= 0:
        return 0.0
    return value * 2.0 ** (-max(0.0, now_seconds - at_seconds) / half_life)


def configure(queue: str, half_life: float, now=None) -> None:
    """The queue's half-life is ``half_life`` from now on (0: no row). A new or changed half-life recomputes
    the queue's decayed usage from its closed intervals. Call it inside the queue write's transaction."""
    if half_life <= 0:
        DecayedUsage.objects.filter(queue=queue).delete()
        return
    row = DecayedUsage.objects.select_for_update().filter(queue=queue).first()
    if row is not None and row.half_life_seconds == half_life:
        return
    now = now or timezone.now()
    value = usage_sql.decayed_from_ledger(queue, float(half_life), now)
    DecayedUsage.objects.update_or_create(queue=queue, defaults={"half_life_seconds": float(half_life),
                                                                 "value": value, "at": now})


def read(now=None) -> dict[str, float]:
    """Queue name -> its decayed usage now, in device-seconds (queues with a half-life only)."""
    now = now or timezone.now()
    return {r.queue: decayed(r.value, r.at.timestamp(), r.half_life_seconds, now.timestamp())
            for r in DecayedUsage.objects.all()}
