"""The allocation rounds' log (``AllocationRound``), written by the worker task after each round and read by
``/metrics`` at scrape time.

Why the database and not prometheus_client's multiprocess mode: rounds run in Celery workers, which in every
real deployment are other containers or hosts than the gunicorn workers serving ``/metrics`` (a shared
PROMETHEUS_MULTIPROC_DIR cannot span them), and a worker's in-memory histogram dies with it. One insert per
round is small next to the round's own queries, and every web process then reports the same histogram.
"""
from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import Error as DatabaseError
from django.utils import timezone

from claims.models import AllocationRound

log = logging.getLogger(__name__)

# Rows are kept a while past the metrics window, so a longer window set later has some history to show.
MIN_RETENTION = timedelta(hours=1)


def record(result, *, error: BaseException | None = None, seconds: float | None = None) -> None:
    """Log one round (``result``: an ``allocation.RoundResult``, or None for a round that raised).

    Never raises: losing a metrics row must not stop allocation (e.g. during a rolling deploy, before the
    migration that creates the table)."""
    row = AllocationRound(finished_at=timezone.now(),
                          seconds=result.seconds if seconds is None else seconds,
                          taken=getattr(result, "taken", 0), allocated=getattr(result, "allocated", 0),
                          pending=getattr(result, "pending", 0), failed=getattr(result, "failed", 0),
                          lost_race=getattr(result, "lost_race", 0), rows_read=getattr(result, "rows_read", 0),
                          lock_seconds=getattr(result, "lock_seconds", 0.0),
                          error=f"{type(error).__name__}: {error}"[:200] if error is not None else "")
    try:
        row.save(force_insert=True)
    except DatabaseError as exc:
        log.warning("allocation round not logged for /metrics: %s", exc)


def retention() -> timedelta:
    return max(MIN_RETENTION, timedelta(seconds=2 * settings.METRICS_WINDOW_SECONDS))


def purge(now=None) -> int:
    return AllocationRound.objects.filter(finished_at__lt=(now or timezone.now()) - retention()).delete()[0]
