"""``celery -A tests.chaos.beat_app beat``: the product's beat schedule (``draservice.beat.collect``), sending to
the test run's queue (``tests.claims.celery_test_app``), with the preemption pass and the pending retry every
``CHAOS_BEAT_SECONDS`` (default 1) instead of 5 s and 15 s, so that a chaos run of tens of seconds goes through
several notice-grace-requeue cycles. Entries routed to a queue of their own (webhook deliveries: the notify
queue) are left out: the chaos runs have no webhooks and no notify worker."""
import os
from datetime import timedelta

import django

from tests.claims.celery_test_app import app

django.setup()

from draservice.beat import collect  # noqa: E402 - needs the apps loaded

FAST = ("queues-preempt", "claims-retry-pending")
period = timedelta(seconds=float(os.environ.get("CHAOS_BEAT_SECONDS", "1")))
app.conf.beat_schedule = {name: {**entry, "schedule": period} if name in FAST else entry
                          for name, entry in collect().items() if not (entry.get("options") or {}).get("queue")}

__all__ = ["app"]
