"""One beat schedule, collected from the apps: each app that has periodic work declares it in
``<app>/schedule.py`` as ``SCHEDULE`` (a dict, or a function returning one, for entries that depend on
settings). Celery beat (with a broker) and ``manage.py serve``'s runner (without one) run the same dict."""
from __future__ import annotations

import importlib

from django.apps import apps
from django.conf import settings


def collect() -> dict:
    schedule: dict = {}
    for config in apps.get_app_configs():
        try:
            module = importlib.import_module(f"{config.name}.schedule")
        except ModuleNotFoundError as exc:
            if exc.name != f"{config.name}.schedule":
                raise
            continue
        entries = module.SCHEDULE() if callable(module.SCHEDULE) else module.SCHEDULE
        for name, entry in entries.items():
            if name in schedule:
                raise ValueError(f"beat entry {name!r} is declared by two apps")
            schedule[name] = entry
    return schedule


def install() -> None:
    """Fill ``settings.CELERY_BEAT_SCHEDULE`` (Celery reads settings lazily, so this reaches beat)."""
    for name, entry in collect().items():
        settings.CELERY_BEAT_SCHEDULE.setdefault(name, entry)
