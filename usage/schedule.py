"""The periodic tasks of the usage app (collected by ``draservice.beat``)."""
from datetime import timedelta

from django.conf import settings

# How often the releases' decayed-usage deltas are folded: what a fair-share read sums between folds.
FOLD_SECONDS = 10


def SCHEDULE() -> dict:  # noqa: N802 (the name draservice.beat looks for)
    # On the notify queue, off the allocation workers: one statement, but no round should wait for it.
    return {"usage-fold-decay": {"task": "usage.tasks.fold_decay", "schedule": timedelta(seconds=FOLD_SECONDS),
                                 "options": {"queue": settings.NOTIFY_QUEUE}}}
