"""Asking for a background task after commit, without flooding the queue: one mechanism for every app.

``request_task(name)`` is what writers call (from ``transaction.on_commit``) when work may now be possible:

* A broker is configured: ``send_task`` by name (tasks are named, not imported: a task module imports the
  services that call us, and naming them keeps the import graph acyclic). With ``debounce`` a Redis key is set
  with NX when the task is enqueued and deleted by the task when it STARTS (``task_started``), before it reads
  its queue: work committed while a task is queued is picked up by that task, work committed after it started
  enqueues a new one, and at most one such task waits in the broker. The key is per deployment
  (``notify.key_prefix``) and per Celery queue, so deployments and test runs sharing a Redis never silence
  each other.
* No broker, but ``manage.py serve`` runs its in-process runners and the task is one a runner serves: wake
  that runner (the allocation runner, or the notify runner that delivers webhooks). The request that wrote
  returns at once instead of running the task inline.
* No broker and no runner (shell, tests, scripts): run the task eagerly, inline, once (a task that asks for
  itself again while it runs is already looping until its queue is empty).
"""
from __future__ import annotations

import logging
import threading

from django.conf import settings

from draservice import notify
from draservice.celery import app

log = logging.getLogger(__name__)

KICK_TTL_MS = 30_000  # if a queued task is lost, the key expires and the next kick enqueues again

_runners: list[LocalRunner] = []
_inline = threading.local()


class LocalRunner:
    """What dispatch needs of ``draservice.runner.PeriodicRunner``."""

    def serves(self, name: str) -> bool:  # pragma: no cover - interface
        raise NotImplementedError

    def kick(self, name: str) -> None:  # pragma: no cover - interface
        raise NotImplementedError


def add_local_runner(runner: LocalRunner) -> None:
    _runners.append(runner)


def remove_local_runner(runner: LocalRunner) -> None:
    if runner in _runners:
        _runners.remove(runner)


def debounce_key(name: str) -> str:
    return f"{notify.key_prefix()}:{name}:queued:{app.conf.task_default_queue or 'celery'}"


def request_task(name: str, args: tuple | list = (), *, debounce: bool = False) -> None:
    if settings.CELERY_BROKER_URL:
        if debounce and not _claim_debounce(name):
            return  # a task is queued and has not started yet: it will see this work
        app.send_task(name, args=list(args))
        return
    runner = next((r for r in list(_runners) if r.serves(name)), None) if not args else None
    if runner is not None:
        runner.kick(name)
        return
    running = getattr(_inline, "running", None)
    if running is None:
        running = _inline.running = set()
    if name in running:
        return  # already inside this task inline: it loops until its queue is empty
    running.add(name)
    try:
        app.tasks[name].apply(args=list(args))
    finally:
        running.discard(name)


def _claim_debounce(name: str) -> bool:
    client = notify.redis_client()
    if client is None:
        return True
    try:
        return bool(client.set(debounce_key(name), "1", nx=True, px=KICK_TTL_MS))
    except Exception as exc:  # Redis trouble: enqueue anyway, duplicates are harmless
        log.warning("debounce of %s unavailable: %s", name, exc)
        return True


def task_started(name: str) -> None:
    """Called by a debounced task before it reads its queue (see the module docstring)."""
    client = notify.redis_client() if settings.CELERY_BROKER_URL else None
    if client is not None:
        try:
            client.delete(debounce_key(name))
        except Exception as exc:
            log.warning("debounce of %s unavailable: %s", name, exc)
