"""The platform's periodic work: the change log's watermark and retention; the webhook delivery sweep."""
from datetime import timedelta

from django.conf import settings


def SCHEDULE() -> dict:  # noqa: N802 (the name draservice.beat looks for)
    return {
        "draservice-seal-changes": {"task": "draservice.tasks.seal_changes", "schedule": timedelta(seconds=5)},
        "draservice-compact-changes": {"task": "draservice.tasks.compact_changes", "schedule": timedelta(minutes=1)},
        # On the notify queue: a notify worker runs it (and, without a broker, serve's notify runner).
        "draservice-deliver-webhooks": {"task": "draservice.tasks.deliver_due", "schedule": timedelta(seconds=5),
                                        "options": {"queue": settings.NOTIFY_QUEUE}},
    }
