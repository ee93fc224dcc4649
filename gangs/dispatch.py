"""Asking for gang placement after commit (``draservice.dispatch`` does the asking; this names the tasks).

``request_placement()`` asks for a debounced pass over the eligible gangs; ``request_placement(gang_id)``
for one new gang (not debounced: it carries the gang's id).
"""
from __future__ import annotations

from draservice import dispatch

# Tasks are named, not imported: the task module imports the services that call us (no import cycle).
PLACE_GANGS_TASK = "gangs.tasks.place_gangs"
PLACE_GANG_TASK = "gangs.tasks.place_gang"


def kick_key() -> str:
    return dispatch.debounce_key(PLACE_GANGS_TASK)


def request_placement(gang_id: int | None = None) -> None:
    if gang_id is not None:
        dispatch.request_task(PLACE_GANG_TASK, [gang_id])
    else:
        dispatch.request_task(PLACE_GANGS_TASK, debounce=True)


def task_started() -> None:
    dispatch.task_started(PLACE_GANGS_TASK)
