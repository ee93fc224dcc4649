"""Asking for an allocation round, after commit, without flooding the queue.

``request_allocation()`` is what every writer calls (from ``transaction.on_commit``) when pending claims may
now be allocatable. Three cases:

* A broker is configured: enqueue ``claims.tasks.allocate_pending``, debounced by a Redis key. The key is
  set with NX when the task is enqueued and deleted by the task when it STARTS, before it reads the queue,
  so a claim committed while a task is queued is picked up by that task, and one committed after it
  started enqueues a new one. At most one allocation task is waiting in the broker at any time.
* No broker, but ``manage.py serve`` runs its in-process runner: wake that thread. The request that
  created the claim returns at once instead of allocating inline.
* No broker and no runner (shell, tests, scripts): run the task eagerly, inline.
"""
from __future__ import annotations

import logging
import threading

from django.conf import settings

from claims import notify
from draservice.celery import app

# Tasks are named, not imported: the task module imports the services that call us (no import cycle).
ALLOCATE_TASK = "claims.tasks.allocate_pending"

log = logging.getLogger(__name__)

KICK_TTL_MS = 30_000  # if a queued task is lost, the key expires and the next kick enqueues again

_local_runner: LocalRunner | None = None
_inline = threading.local()


class LocalRunner:
    """The contract of ``claims.runner.PeriodicRunner`` that dispatch needs."""

    def kick(self) -> None:  # pragma: no cover - interface
        raise NotImplementedError


def kick_key() -> str:
    """The debounce key, per deployment (``notify.key_prefix``)."""
    return f"{notify.key_prefix()}:claims:allocate-queued"


def set_local_runner(runner: LocalRunner | None) -> None:
    global _local_runner
    _local_runner = runner


def request_allocation() -> None:
    if settings.CELERY_BROKER_URL:
        _enqueue()
    elif _local_runner is not None:
        _local_runner.kick()
    else:
        if getattr(_inline, "active", False):
            return  # already inside an inline round: it loops until the queue is empty
        _inline.active = True
        try:
            app.tasks[ALLOCATE_TASK].apply()
        finally:
            _inline.active = False


def _enqueue() -> None:
    client = notify.redis_client()
    if client is not None:
        try:
            if not client.set(kick_key(), "1", nx=True, px=KICK_TTL_MS):
                return  # a task is queued and has not started yet: it will see our claims
        except Exception as exc:  # Redis trouble: enqueue anyway, duplicates are harmless
            log.warning("allocation debounce unavailable: %s", exc)
    app.send_task(ALLOCATE_TASK)


def task_started() -> None:
    """Called by the allocation task before it reads the queue (see the module docstring)."""
    client = notify.redis_client() if settings.CELERY_BROKER_URL else None
    if client is not None:
        try:
            client.delete(kick_key())
        except Exception as exc:
            log.warning("allocation debounce unavailable: %s", exc)
