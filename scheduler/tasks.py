"""Celery tasks of the scheduler: the allocation round, gang placement and preemption passes. They take ids (or
nothing) and call services; no domain logic here.

The tasks keep the names they were registered under before the scheduler app owned them (``claims.tasks.*``,
``gangs.tasks.*``, ``queues.tasks.*``): messages already queued in a broker and beat schedules name them so.
"""
from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta

from celery import current_app, shared_task
from django.conf import settings
from django.utils import timezone

from claims import dispatch
from draservice import dispatch as draservice_dispatch
from draservice import notify
from gangs import dispatch as gang_dispatch
from scheduler.services import (
    allocation,
    gang_placement,
    plan,
    reclaim,
    replays,
    reservation_tick,
    round_log,
    wakeups,
)

log = logging.getLogger(__name__)

# One task keeps taking batches while there is work, up to this long; then it hands over to a fresh task
# so that a busy queue does not starve the other tasks of the worker.
MAX_TASK_SECONDS = 20.0
PLAN_TASK = "scheduler.tasks.plan"


@shared_task(name="claims.tasks.allocate_pending", ignore_result=True)
def allocate_pending(batch_size: int = allocation.DEFAULT_BATCH, max_seconds: float = MAX_TASK_SECONDS) -> dict:
    """Allocate eligible pending claims, batch after batch, until none is left."""
    dispatch.task_started()
    deadline = time.monotonic() + max_seconds
    totals = {"rounds": 0, "allocated": 0, "pending": 0, "failed": 0, "lost_race": 0}
    fanned_out = False
    idle_spins = 0
    while True:
        started = time.perf_counter()
        try:
            result = allocation.allocate_round(batch_size)
        except Exception as exc:
            # /metrics counts rounds that raised (the allocation-errors alert); the task still fails as before.
            round_log.record(None, error=exc, seconds=time.perf_counter() - started)
            raise
        if not result.taken:
            if _woke_before_ending(deadline):
                continue
            break
        round_log.record(result)
        totals["rounds"] += 1
        for key in ("allocated", "pending", "failed", "lost_race"):
            totals[key] += getattr(result, key)
        # A full batch means there is more: ask for a second task, so that another worker joins in.
        if result.taken >= batch_size and not fanned_out and settings.CELERY_BROKER_URL:
            dispatch.request_allocation()
            fanned_out = True
        if not (result.allocated or result.pending or result.failed):
            # Everything we took belongs to groups another worker is busy with: let it finish.
            idle_spins += 1
            if idle_spins > 20:
                if _woke_before_ending(deadline):
                    continue
                break
            time.sleep(0.05)
        if time.monotonic() > deadline:
            dispatch.request_allocation()
            break
    if totals["rounds"]:
        log.info("allocation: %s", totals)
        # The rounds started or held claims: the queues' first planDepth may have moved. The plan is advice and
        # its own task, so that a release's placement does not wait for it, and many releases in a row share one
        # pass (debounced: at most one waits in the broker).
        draservice_dispatch.request_task(PLAN_TASK, debounce=True)
    if totals["pending"]:
        request_pass()  # a claim short of room or quota may reclaim: not only at the beat's next period
    return totals


def _woke_before_ending(deadline: float) -> bool:
    """The task's last wake-up step, before it ends: True when it woke claims and there is time to take them.

    The rounds' wake-up steps skip the freed devices other workers' steps hold, and such a step may have read this
    task's claims as undecided and kept the device for later: this one waits for those rows and offers them
    again (``scheduler.services.wakeups``). Past the deadline, the claims it woke go to the next task."""
    if not wakeups.wake_for_released(wait=True):
        return False
    if time.monotonic() < deadline:
        return True
    dispatch.request_allocation()
    return False


@shared_task(name=PLAN_TASK, ignore_result=True)
def plan_pass() -> int:
    """The plan (``scheduler.services.plan``), when due: at most every ``PLAN_INTERVAL`` unless the queues'
    first ``planDepth`` claims changed. Claims it starts now by backfill get a round."""
    draservice_dispatch.task_started(PLAN_TASK)
    done = plan.refresh()
    if done is not None and done.woken:
        dispatch.request_allocation()
    return done.planned if done is not None else 0


@shared_task(name="scheduler.tasks.reservations", ignore_result=True)
def reservations_pass() -> dict:
    """The reservations' pass (``scheduler.services.reservation_tick``): hold capacity from start minus the lead
    time, reclaim borrowed capacity there with notice, start the labelled claims at the start."""
    return reservation_tick.run()


@shared_task(name="scheduler.tasks.wake_backstop", ignore_result=True)
def wake_backstop() -> int:
    """The safety net of targeted wake-ups (``scheduler.services.wakeups``): wake a few claims a release could
    help that no freed device was offered to, and start a round for them."""
    woken = wakeups.backstop()
    if woken:
        dispatch.request_allocation()
    return woken


@shared_task(name="claims.tasks.purge_round_log", ignore_result=True)
def purge_round_log() -> int:
    return round_log.purge()


@shared_task(name="gangs.tasks.place_gangs", ignore_result=True)
def place_gangs(max_seconds: float = MAX_TASK_SECONDS) -> dict:
    """Place eligible gangs, oldest first, one transaction each, until none is left."""
    gang_dispatch.task_started()
    deadline = time.monotonic() + max_seconds
    totals: dict[str, int] = {}
    skip: set[int] = set()
    behind: set[int] = set()
    retry = False
    while time.monotonic() < deadline:
        attempt = gang_placement.place_next(exclude=skip)
        if attempt.result == "none":
            break
        totals[attempt.result] = totals.get(attempt.result, 0) + 1
        if attempt.result == "behind" and attempt.gang_id is not None:
            skip.add(attempt.gang_id)  # after the older gang, by the worker deciding that one
            behind.add(attempt.gang_id)
        if attempt.retry_soon:
            if attempt.gang_id is not None:  # always, for these results
                skip.add(attempt.gang_id)  # not again in this task: its rows are busy or it just lost a race
            retry = True
    else:
        retry = True
    # Two passes can each leave a gang behind an older one the other has in hand, and each end: whichever
    # ends last finds it no longer behind and asks for the pass that decides it.
    if retry or gang_placement.any_free_to_go(behind):
        gang_dispatch.request_placement()
    if totals:
        log.info("gang placement: %s", totals)
    return totals


@shared_task(name="gangs.tasks.place_gang", ignore_result=True)
def place_gang(gang_id: int) -> str:
    """Try one gang now (a new one: it need not wait for the next pass)."""
    attempt = gang_placement.place_next(gang_id=gang_id)
    if attempt.result != "none":
        # Retried soon; or it waits behind older gangs, which a pass decides first; or it was decided, and
        # the younger gangs that waited behind it (``gang_placement._behind``) get their turn now.
        gang_dispatch.request_placement()
    return attempt.result


@shared_task(name="queues.tasks.preempt", ignore_result=True)
def preempt() -> dict:
    """Requeue victims past their deadline; choose and mark victims for claims waiting for room. Asks for the
    pass that requeues the next victims at their deadline."""
    draservice_dispatch.task_started(PREEMPT_TASK)
    out = reclaim.run()
    due = reclaim.next_deadline()
    if due is not None:
        request_pass(at=due)
    return out


PREEMPT_TASK = "queues.tasks.preempt"
DEADLINE_HORIZON = timedelta(minutes=10)  # farther deadlines are left to the beat's passes


def request_pass(at: datetime | None = None) -> None:
    """Ask for a preemption pass now (debounced: at most one waits in the broker, and one asked for while a pass
    runs is queued), or at ``at`` (once per deadline). A round that left claims pending asks for one: a claim
    within its nominal waited for the beat's next period (5 s), then for the one after to requeue its victims.
    Only with a broker: without one, the in-process runners of ``manage.py serve`` run the periodic pass."""
    if not settings.CELERY_BROKER_URL:
        return
    if at is None:
        draservice_dispatch.request_task(PREEMPT_TASK, debounce=True)
        return
    now = timezone.now()
    if at - now > DEADLINE_HORIZON:
        return
    client = notify.redis_client()
    try:
        ttl_ms = int(max((at - now).total_seconds(), 0) * 1000) + 5000
        if client is not None and not client.set(f"{notify.key_prefix()}:{PREEMPT_TASK}:at:{at.timestamp():.3f}",
                                                 "1", nx=True, px=ttl_ms):
            return  # asked for already
    except Exception as exc:  # Redis trouble: ask anyway, a duplicate pass is harmless
        log.warning("debounce of %s unavailable: %s", PREEMPT_TASK, exc)
    # A few ms past the deadline: the pass requeues the victims whose deadline is <= its clock.
    current_app.send_task(PREEMPT_TASK, eta=at + timedelta(milliseconds=50))


@shared_task(name="scheduler.tasks.run_replays", ignore_result=True)
def run_replays() -> int:
    """The replays waiting, one after another (on ``REPLAY_QUEUE``: a replay worker, never an allocation one)."""
    return replays.run_pending()
