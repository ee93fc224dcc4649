"""The periodic tasks of the scheduler (collected by ``draservice.beat``). The entries and task names are the
ones they had under the claims app, so a deployed beat schedule keeps working.

Allocation itself is event-driven (claims created, devices released, inventory changed); the periodic
``retry_pending`` is only the safety net for a lost kick.
"""
from datetime import timedelta

from django.conf import settings

SCHEDULE = {
    "claims-retry-pending": {"task": "claims.tasks.allocate_pending", "schedule": timedelta(seconds=15)},
    # Targeted wake-ups wake a few claims per freed device; this wakes, oldest first, claims whose counters say
    # a release could help but that no device was offered to (scheduler.services.wakeups).
    "claims-wake-backstop": {"task": "scheduler.tasks.wake_backstop", "schedule": timedelta(seconds=60)},
    "claims-purge-round-log": {"task": "claims.tasks.purge_round_log", "schedule": timedelta(hours=1)},
    # The safety net that notices devices freed by the claims app (it has no hook to tell the gang worker, but
    # it moves the fleet version (taking.fleet_version), which makes the pending gangs eligible again: a pass
    # costs one query when nothing changed).
    "gangs-retry-pending": {"task": "gangs.tasks.place_gangs", "schedule": timedelta(seconds=5)},
    "queues-preempt": {"task": "queues.tasks.preempt", "schedule": timedelta(seconds=5)},
    # The plan (scheduler.services.plan): a pass costs the per-queue queries when it is not due.
    # Reservations (scheduler.services.reservation_tick): a pass is one query when none is near its window.
    "scheduler-reservations": {"task": "scheduler.tasks.reservations", "schedule": timedelta(seconds=2)},
    "scheduler-plan": {"task": "scheduler.tasks.plan", "schedule": timedelta(seconds=settings.PLAN_INTERVAL)},
    # Replays waiting whose message was lost: on the replay queue (a replay worker, or serve's replay runner).
    "scheduler-replays": {"task": "scheduler.tasks.run_replays", "schedule": timedelta(minutes=1),
                          "options": {"queue": settings.REPLAY_QUEUE}},
}
