"""The platform's periodic work: the change log's watermark and retention; the webhook delivery sweep; the
tables' statistics where autovacuum is off (``draservice.upkeep_sql``; ``DB_UPKEEP_SECONDS`` 0: none)."""
from datetime import timedelta

from django.conf import settings


def SCHEDULE() -> dict:  # noqa: N802 (the name draservice.beat looks for)
    schedule = {
        "draservice-seal-changes": {"task": "draservice.tasks.seal_changes", "schedule": timedelta(seconds=5)},
        # On the notify queue: a minute's changes are tens of thousands of rows at 100 claims/s, and deleting them
        # on an allocation worker held every claim submitted meanwhile.
        "draservice-compact-changes": {"task": "draservice.tasks.compact_changes", "schedule": timedelta(minutes=1),
                                       "options": {"queue": settings.NOTIFY_QUEUE}},
        # On the notify queue: a notify worker runs it (and, without a broker, serve's notify runner).
        "draservice-deliver-webhooks": {"task": "draservice.tasks.deliver_due", "schedule": timedelta(seconds=5),
                                        "options": {"queue": settings.NOTIFY_QUEUE}},
    }
    if settings.DB_UPKEEP_SECONDS > 0:  # on the notify queue too: a VACUUM takes seconds no round should wait for
        schedule["draservice-upkeep"] = {"task": "draservice.tasks.upkeep",
                                         "schedule": timedelta(seconds=settings.DB_UPKEEP_SECONDS),
                                         "options": {"queue": settings.NOTIFY_QUEUE}}
    return schedule
