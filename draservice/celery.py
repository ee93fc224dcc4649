"""The Celery application.

With no broker configured (``CELERY_BROKER_URL`` empty) tasks run eagerly in the
calling process, so the service works with nothing but Python.
"""
import gc
import os
import time

from celery import Celery
from celery.signals import task_postrun, worker_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "draservice.settings")

app = Celery("draservice")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# Opt-in, for benchmarks (benchmarks/soak_bench.py): a file to which every worker process appends one line
# "<unix time> <pid> <generation> <pause ms> <cpu ms>" per garbage collection of at least 1 ms (wall clock; the
# thread's CPU time beside it tells a long collection from one the scheduler interrupted). Unset: nothing runs.
GC_PAUSE_LOG = "DRASERVICE_GC_PAUSE_LOG"


@worker_init.connect
def _tune_collector(**kwargs) -> None:
    """The worker's collector policy (``dra.engine.memory``): thresholds that keep young collections to a few
    milliseconds, and long-lived objects frozen out of the collector's sight, starting with everything
    imported by now. In the main process before the pool forks: the children inherit both."""
    from dra.engine import memory

    memory.worker_start()


@worker_init.connect
def _log_gc_pauses(**kwargs) -> None:
    """Installed in the worker's main process before the pool forks, so every child inherits the callback.
    os.write on an O_APPEND descriptor: no lock (a collection can start inside logging), lines never interleave."""
    path = os.environ.get(GC_PAUSE_LOG)
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    started = [0.0, 0.0]

    def callback(phase: str, info: dict) -> None:
        if phase == "start":
            started[:] = time.perf_counter(), time.thread_time()
            return
        ms = (time.perf_counter() - started[0]) * 1000
        if ms >= 1:
            cpu = (time.thread_time() - started[1]) * 1000
            os.write(fd, f"{time.time():.3f} {os.getpid()} {info['generation']} {ms:.2f} {cpu:.2f}\n".encode())

    gc.callbacks.append(callback)


@task_postrun.connect
def _close_old_connections(task=None, **kwargs) -> None:
    """After a task, what Django does after a request: close the database connections past ``CONN_MAX_AGE`` or
    unusable (an error left them broken). Celery's own fixup would close every connection before and after every
    task (``CELERY_DB_REUSE_MAX``, settings.py): a new PostgreSQL backend per task, its catalog caches loaded again.
    Not for a task run eagerly, inside the caller's request or transaction."""
    if task is not None and getattr(task.request, "is_eager", False):
        return
    from django.db import close_old_connections, connection

    if not connection.in_atomic_block:
        close_old_connections()
