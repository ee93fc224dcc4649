"""Asking for an allocation round after commit (``draservice.dispatch`` does the asking; this names the task).

Every writer that may have made pending claims allocatable calls ``request_allocation()`` from
``transaction.on_commit``. Debounced: at most one allocation task waits in the broker; without a broker the
in-process runner of ``manage.py serve`` is woken, or the round runs inline.
"""
from __future__ import annotations

from draservice import dispatch

# Tasks are named, not imported: the task module imports the services that call us (no import cycle).
ALLOCATE_TASK = "claims.tasks.allocate_pending"


def kick_key() -> str:
    """The debounce key (per deployment and Celery queue)."""
    return dispatch.debounce_key(ALLOCATE_TASK)


def request_allocation() -> None:
    dispatch.request_task(ALLOCATE_TASK, debounce=True)


def task_started() -> None:
    """Called by the allocation task before it reads the queue."""
    dispatch.task_started(ALLOCATE_TASK)
