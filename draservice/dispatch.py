"""Asking for a background task after commit, without flooding the queue: one mechanism for every app.

``request_task(name)`` is what writers call (from ``transaction.on_commit``) when work may now be possible:

* A broker is configured: ``send_task`` by name (tasks are named, not imported: a task module imports the
  services that call us, and naming them keeps the import graph acyclic). With ``debounce`` a Redis key is set
  with NX when the task is enqueued and deleted by the task when it STARTS (``task_started``), before it reads
  its queue: work committed while a task is queued is picked up by that task, work committed after it started
  enqueues a new one, and at most one such task waits in the broker. The key is per deployment
  (``notify.key_prefix``) and per Celery queue, so deployments and test runs sharing a Redis never silence
  each other. A process sets the key at once for the first request, and for the requests that come within
  ``DISPATCH_COALESCE_SECONDS`` after it once more, from a thread of its own, when that time is up
  (``_Coalescer``): every request is followed by a key set that starts after it, which is all a debounced task
  needs, and a stream of claim POSTs pays the broker's round trip on few of them.
* No broker, but ``manage.py serve`` runs its in-process runners and the task is one a runner serves: wake
  that runner (the allocation runner, or the notify runner that delivers webhooks). The request that wrote
  returns at once instead of running the task inline.
* No broker and no runner (shell, tests, scripts): run the task eagerly, inline, once (a task that asks for
  itself again while it runs is already looping until its queue is empty).
"""
from __future__ import annotations

import atexit
import logging
import os
import threading
import time

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
    return f"{notify.key_prefix()}:{name}:queued:{_default_queue()}"


def _default_queue() -> str:
    """``app.conf.task_default_queue``. Read from the configuration's first map when it is there (what a lookup
    through all of them answers then, without their cost on every claim POST's kick); else what the lookup
    through all of them answered the first time: the other maps are the configuration as loaded, which nothing
    changes later (a change, ``app.conf.update``, goes to the first map), and the lookup costs 15-20 us."""
    queue = app.conf.changes.get("task_default_queue")
    if queue is None:
        if not _loaded_queue:
            _loaded_queue.append(app.conf.task_default_queue or "celery")
        return _loaded_queue[0]
    return queue or "celery"


_loaded_queue: list[str] = []  # app.conf.task_default_queue as configured (see _default_queue)


def request_task(name: str, args: tuple | list = (), *, debounce: bool = False) -> None:
    if settings.CELERY_BROKER_URL:
        if debounce:
            key = debounce_key(name)
            if _coalescer(name, key).request():
                _kick(name, key)
            return
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


def _kick(name: str, key: str) -> None:
    if _claim_debounce(name, key):  # else a task is queued and has not started yet: it will see this work
        app.send_task(name)


class _Coalescer:
    """The debounced requests of one task (one debounce key) in this process: the first kicks at once (in the
    caller's thread); those within ``DISPATCH_COALESCE_SECONDS`` after that kick are served by ONE kick when that
    time is up, made by a thread of this process (``_run``). A request marks ``pending`` before that kick clears
    the mark and starts, so every request is followed by a kick that starts after it."""

    def __init__(self, name: str, key: str) -> None:
        self.name, self.key = name, key
        self.lock = threading.Lock()
        self.last = float("-inf")  # when the last kick started (monotonic)
        self.pending = False
        self.wake = threading.Event()
        self.thread: threading.Thread | None = None

    def request(self) -> bool:
        """True: kick now, in the caller's thread; False: the coalescing thread will."""
        window = settings.DISPATCH_COALESCE_SECONDS
        if window <= 0:
            return True
        with self.lock:
            now = time.monotonic()
            if not self.pending and now - self.last >= window:
                self.last = now
                return True
            self.pending = True
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name=f"dispatch-{self.name}", daemon=True)
                self.thread.start()
        self.wake.set()
        return False

    def _run(self) -> None:
        while True:
            self.wake.wait()
            self.wake.clear()
            with self.lock:
                delay = self.last + settings.DISPATCH_COALESCE_SECONDS - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            self.flush()

    def flush(self) -> None:
        with self.lock:
            if not self.pending:
                return
            self.pending = False
            self.last = time.monotonic()
        try:
            _kick(self.name, self.key)
        except Exception as exc:  # the broker is down: the beat's periodic round picks the work up
            log.warning("coalesced request of %s failed: %s", self.name, exc)


_coalescers: dict[str, _Coalescer] = {}
_coalescers_lock = threading.Lock()


def _coalescer(name: str, key: str) -> _Coalescer:
    found = _coalescers.get(key)
    if found is None:
        with _coalescers_lock:
            found = _coalescers.setdefault(key, _Coalescer(name, key))
    return found


def _forget_coalescers() -> None:
    """In a forked child: its parent's threads and locks are not its own."""
    global _coalescers_lock
    _coalescers.clear()
    _coalescers_lock = threading.Lock()


def _flush_coalescers() -> None:
    """At exit: what a coalescing thread would have asked for."""
    for coalescer in list(_coalescers.values()):
        coalescer.flush()


os.register_at_fork(after_in_child=_forget_coalescers)
atexit.register(_flush_coalescers)


def _claim_debounce(name: str, key: str) -> bool:
    client = notify.redis_client()
    if client is None:
        return True
    try:
        return bool(client.set(key, "1", nx=True, px=KICK_TTL_MS))
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
