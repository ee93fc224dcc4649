"""Asking for gang placement after commit, the way ``claims.dispatch`` asks for claim allocation.

* A broker is configured: enqueue ``gangs.tasks.place_gangs`` (debounced by a Redis key that the task
  deletes when it starts, so work committed while a task is queued is seen by that task), or
  ``gangs.tasks.place_gang`` for one new gang (not debounced: it carries the gang's id).
* No broker (the embedded default, tests that run tasks eagerly): run the task inline, after commit.
"""
from __future__ import annotations

import logging
import threading

from django.conf import settings

from claims import notify
from draservice.celery import app

# Tasks are named, not imported: the task module imports the services that call us (no import cycle).
PLACE_GANGS_TASK = "gangs.tasks.place_gangs"
PLACE_GANG_TASK = "gangs.tasks.place_gang"

log = logging.getLogger(__name__)

KICK_TTL_MS = 30_000


def _kick_key() -> str:
    """One debounce key per deployment (``notify.key_prefix``) and task queue: deployments (and test runs)
    sharing a Redis do not silence each other."""
    return f"{notify.key_prefix()}:gangs:place-queued:{app.conf.task_default_queue or 'celery'}"


_inline = threading.local()


def request_placement(gang_id: int | None = None) -> None:
    if settings.CELERY_BROKER_URL:
        if gang_id is not None:
            app.send_task(PLACE_GANG_TASK, args=[gang_id])
            return
        client = notify.redis_client()
        if client is not None:
            try:
                if not client.set(_kick_key(), "1", nx=True, px=KICK_TTL_MS):
                    return  # a task is queued and has not started: it will see this work
            except Exception as exc:  # Redis trouble: enqueue anyway, a duplicate is harmless
                log.warning("gang placement debounce unavailable: %s", exc)
        app.send_task(PLACE_GANGS_TASK)
        return
    if getattr(_inline, "active", False):
        return  # already inside an inline placement loop, which runs until nothing is eligible
    _inline.active = True
    try:
        if gang_id is not None:
            app.tasks[PLACE_GANG_TASK].apply(args=[gang_id])
        else:
            app.tasks[PLACE_GANGS_TASK].apply()
    finally:
        _inline.active = False


def task_started() -> None:
    client = notify.redis_client() if settings.CELERY_BROKER_URL else None
    if client is not None:
        try:
            client.delete(_kick_key())
        except Exception as exc:
            log.warning("gang placement debounce unavailable: %s", exc)
