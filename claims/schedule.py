"""The periodic tasks of the claims app: Celery beat with a broker, ``manage.py serve``'s runner without one.
(The allocation round's entries are the scheduler's: ``scheduler.schedule``.)"""
from datetime import timedelta

from django.conf import settings


def SCHEDULE() -> dict:  # noqa: N802 (the name draservice.beat looks for)
    return {
        "claims-expire-leases": {"task": "claims.tasks.expire_leases", "schedule": timedelta(seconds=5)},
        # A report, on the notify queue: at 40,000 devices a snapshot takes 0.4-1.6 s, and on an allocation worker
        # every claim submitted meanwhile waited for it, once a minute (the soak's slowest percent).
        "claims-utilisation-snapshot": {"task": "claims.tasks.record_utilisation", "schedule": timedelta(minutes=1),
                                        "options": {"queue": settings.NOTIFY_QUEUE}},
        "claims-purge-idempotency-keys": {"task": "claims.tasks.purge_idempotency_keys",
                                          "schedule": timedelta(hours=1)},
        "claims-prune-history": {"task": "claims.tasks.prune_history", "schedule": timedelta(hours=1)},
    }
