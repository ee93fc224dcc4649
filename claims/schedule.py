"""The periodic tasks of the claims app: Celery beat with a broker, ``manage.py serve``'s runner without one.

Allocation itself is event-driven (claims created, devices released, inventory changed); the periodic
``retry_pending`` is only the safety net for a lost kick.
"""
from datetime import timedelta

SCHEDULE = {
    "claims-expire-leases": {"task": "claims.tasks.expire_leases", "schedule": timedelta(seconds=5)},
    "claims-retry-pending": {"task": "claims.tasks.allocate_pending", "schedule": timedelta(seconds=15)},
    "claims-utilisation-snapshot": {"task": "claims.tasks.record_utilisation", "schedule": timedelta(minutes=1)},
    "claims-purge-idempotency-keys": {"task": "claims.tasks.purge_idempotency_keys", "schedule": timedelta(hours=1)},
    "claims-purge-round-log": {"task": "claims.tasks.purge_round_log", "schedule": timedelta(hours=1)},
}
