"""The in-process worker of the embedded default (no broker): tasks on demand plus the beat schedule.

``manage.py serve`` starts one ``PeriodicRunner`` thread in its (single) web worker process when no broker is
configured. Writers then wake it (``draservice.dispatch.request_task``) instead of running a task inside their
request, and it runs every app's periodic tasks (``draservice.beat.collect``: each app's ``schedule.py``) on
time. With a broker, Celery workers and ``celery beat`` do this job and no runner is started.
"""
from __future__ import annotations

import logging
import threading
import time

from django.conf import settings
from django.db import close_old_connections, connections

from draservice import dispatch
from draservice.celery import app

log = logging.getLogger(__name__)

# Tasks the runner runs when woken (the others run inline, as without a runner). Allocation is the one a
# request must not wait for: a round may take a while, and many requests ask for one. The plan follows the
# rounds, after them, so that a release's placement does not wait for it.
ON_DEMAND = ("claims.tasks.allocate_pending", "scheduler.tasks.plan")
# The notify runner's: webhook deliveries, in a thread of their own so that a slow receiver (up to the delivery
# deadline per attempt) never delays allocation -- what the notify Celery queue and its worker do with a broker.
NOTIFY_ON_DEMAND = ("draservice.tasks.deliver_due",)
# The replay runner's: replays of recorded windows (POST /api/v1/replays), in a thread of their own, so that a
# replay (up to its CPU budget) never holds the allocation runner -- what the replay Celery queue does with one.
REPLAY_ON_DEMAND = ("scheduler.tasks.run_replays",)


def split_schedule(schedule: dict) -> tuple[dict, dict]:
    """(the allocation runner's entries, the notify runner's): beat entries routed to ``NOTIFY_QUEUE`` go to
    the notify runner, as with a broker they go to the notify workers (and those routed to ``REPLAY_QUEUE`` to
    neither: ``replay_entries``)."""
    def queue(e: dict) -> str | None:
        return (e.get("options") or {}).get("queue")

    notify = {k: e for k, e in schedule.items() if queue(e) == settings.NOTIFY_QUEUE}
    return {k: e for k, e in schedule.items() if k not in notify and queue(e) != settings.REPLAY_QUEUE}, notify


def replay_entries(schedule: dict) -> dict:
    return {k: e for k, e in schedule.items() if (e.get("options") or {}).get("queue") == settings.REPLAY_QUEUE}


def start_runners() -> tuple[PeriodicRunner, ...]:
    """``manage.py serve``'s in-process workers (no broker): the allocation, notify and replay runners."""
    schedule = dict(settings.CELERY_BEAT_SCHEDULE)
    main, notify = split_schedule(schedule)
    runners = (PeriodicRunner(main), PeriodicRunner(notify, NOTIFY_ON_DEMAND, name="draservice-notify-runner"),
               PeriodicRunner(replay_entries(schedule), REPLAY_ON_DEMAND, name="draservice-replay-runner"))
    for runner in runners:
        runner.start()
    return runners


class PeriodicRunner(threading.Thread, dispatch.LocalRunner):
    def __init__(self, schedule: dict | None = None, on_demand: tuple[str, ...] = ON_DEMAND,
                 name: str = "draservice-runner"):
        super().__init__(name=name, daemon=True)
        self.schedule = schedule if schedule is not None else dict(settings.CELERY_BEAT_SCHEDULE)
        self.on_demand = on_demand
        self._wake = threading.Event()
        self._wanted: set[str] = set()
        self._lock = threading.Lock()
        # Not ``_stop``: threading.Thread has a method of that name, which join() calls.
        self._stopping = threading.Event()

    def serves(self, name: str) -> bool:
        return name in self.on_demand

    def kick(self, name: str = ON_DEMAND[0]) -> None:
        with self._lock:
            self._wanted.add(name)
        self._wake.set()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    def _run_task(self, name: str) -> None:
        try:
            app.tasks[name].apply(throw=True)
        except Exception:  # one failing task must not stop the runner; it runs again on schedule
            log.exception("task %s failed", name)
        finally:
            close_old_connections()

    def run(self) -> None:
        dispatch.add_local_runner(self)
        now = time.monotonic()
        due = {name: now for name in self.schedule}
        try:
            while not self._stopping.is_set():
                timeout = max(0.0, min(due.values(), default=now + 60) - time.monotonic())
                if self._wake.wait(timeout):
                    self._wake.clear()
                    if self._stopping.is_set():
                        break
                    with self._lock:
                        wanted, self._wanted = self._wanted, set()
                    for name in sorted(wanted):
                        self._run_task(name)
                now = time.monotonic()
                for name, entry in self.schedule.items():
                    if due[name] <= now:
                        self._run_task(entry["task"])
                        every = entry["schedule"]
                        seconds = every.total_seconds() if hasattr(every, "total_seconds") else float(every)
                        due[name] = time.monotonic() + seconds
        finally:
            dispatch.remove_local_runner(self)
            connections.close_all()  # this thread's connections: a stopped runner holds none
