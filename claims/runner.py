"""The in-process worker of the embedded default (no broker): allocation on demand plus the beat schedule.

``manage.py serve`` starts one ``PeriodicRunner`` thread in its (single) web worker process when no
broker is configured. Writers then wake it (``dispatch.request_allocation``) instead of allocating inside
their request, and it runs every app's periodic tasks (``settings.CELERY_BEAT_SCHEDULE``: claims, inventory,
gangs) on time. With a broker, Celery
workers and ``celery beat`` do this job and no runner is started.
"""
from __future__ import annotations

import logging
import threading
import time

from django.conf import settings
from django.db import close_old_connections

from claims import dispatch

log = logging.getLogger(__name__)


class PeriodicRunner(threading.Thread):
    def __init__(self, schedule: dict | None = None):
        super().__init__(name="claims-runner", daemon=True)
        # The whole beat schedule, as `celery beat` would run it: each app adds its entries in ready().
        self.schedule = schedule if schedule is not None else dict(settings.CELERY_BEAT_SCHEDULE)
        self._kick = threading.Event()
        self._stop = threading.Event()

    def kick(self) -> None:
        self._kick.set()

    def stop(self) -> None:
        self._stop.set()
        self._kick.set()

    def _run_task(self, name: str) -> None:
        from draservice.celery import app

        try:
            app.tasks[name].apply(throw=True)
        except Exception:  # one failing task must not stop the runner; it runs again on schedule
            log.exception("periodic task %s failed", name)
        finally:
            close_old_connections()

    def run(self) -> None:
        dispatch.set_local_runner(self)
        now = time.monotonic()
        due = {name: now for name in self.schedule}
        try:
            while not self._stop.is_set():
                timeout = max(0.0, min(due.values(), default=now + 60) - time.monotonic())
                if self._kick.wait(timeout):
                    self._kick.clear()
                    if self._stop.is_set():
                        break
                    self._run_task("claims.tasks.allocate_pending")
                now = time.monotonic()
                for name, entry in self.schedule.items():
                    if due[name] <= now:
                        self._run_task(entry["task"])
                        every = entry["schedule"]
                        seconds = every.total_seconds() if hasattr(every, "total_seconds") else float(every)
                        due[name] = time.monotonic() + seconds
        finally:
            dispatch.set_local_runner(None)
