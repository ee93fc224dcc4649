"""The periodic tasks of the claims app: Celery beat with a broker, ``manage.py serve``'s runner without one.
(The allocation round's entries are the scheduler's: ``scheduler.schedule``.)"""
from datetime import timedelta

SCHEDULE = {
    "claims-expire-leases": {"task": "claims.tasks.expire_leases", "schedule": timedelta(seconds=5)},
    "claims-utilisation-snapshot": {"task": "claims.tasks.record_utilisation", "schedule": timedelta(minutes=1)},
    "claims-purge-idempotency-keys": {"task": "claims.tasks.purge_idempotency_keys", "schedule": timedelta(hours=1)},
    "claims-prune-history": {"task": "claims.tasks.prune_history", "schedule": timedelta(hours=1)},
}
