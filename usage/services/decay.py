"""Decayed usage per queue, from the ledger: ``U(t) = Σ device-seconds_i × 2^(-(t - t_i) / halfLife)``.

``t_i`` is when an interval closed and its device-seconds ``weight × (end - start)`` (the ledger's own
measure). Kept incrementally as one ``(U, t)`` row per queue with a half-life (``DecayedUsage``) and the
insert-only deltas the ledger's close writes (``usage.usage_sql.close_intervals_ctes``, in the release's
statement: no release waits on another for the queue's row). A read decays both to now; ``fold`` moves the
deltas into the row every few seconds, so a read sums a few seconds of releases at most. Setting or changing a
queue's half-life (``configure``, in the queue write's transaction) computes the row afresh from the ledger's
closed intervals, so a queue gets its history at once, not from the day the half-life was set. Intervals still
open count when they close. PostgreSQL only (the service's database); elsewhere the rows stay as
``configure`` made them.
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
        DecayedUsage.objects.filter(queue=queue).delete()  # its deltas go at the next fold
        return
    row = DecayedUsage.objects.select_for_update().filter(queue=queue).first()
    if row is not None and row.half_life_seconds == half_life:
        return
    usage_sql.reset_decayed(queue, float(half_life), now or timezone.now())


def read(now=None) -> dict[str, float]:
    """Queue name -> its decayed usage now, in device-seconds (queues with a half-life only)."""
    return usage_sql.read_decayed(now or timezone.now())


def fold(now=None) -> int:
    """Fold the releases' insert-only deltas into their queues' rows (periodic: ``usage.schedule``); the
    number folded. Between folds a read adds them itself, so folding changes no figure, only the rows read."""
    return usage_sql.fold(now or timezone.now())
