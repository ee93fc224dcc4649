"""Shared pieces of the benchmarks that drive the live service (gunicorn + Celery + PostgreSQL + Redis):
a scratch database, the process stack, a keep-alive HTTP client, percentiles and the claim helpers that read
or release through the service's own code. Used by claims_e2e_bench.py and soak_bench.py.

Nothing happens at import (``make bench`` runs every file of this directory as a script).
"""
from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parents[1]


def bench_database(base_url: str, suffix: str) -> tuple[str, str]:
    """(name, url) of the benchmark's own database: ``<base_url's name>_<suffix>`` on the same server."""
    name = urlparse(base_url).path.lstrip("/") + "_" + suffix
    return name, base_url.rsplit("/", 1)[0] + "/" + name


def recreate_database(base_url: str, name: str) -> None:
    import psycopg

    admin = base_url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Stack:
    """``manage.py serve`` and a ``celery worker`` (optionally ``celery beat`` and a notify worker) started from
    this checkout.
    ``watch_server=False``: gunicorn alone answers on the port, as API clients reach it in a deployment (the
    watch server of ``manage.py serve`` would pass every request on, at its own CPU cost).

    The broker's Redis database is FLUSHED at start: the benchmark owns it. Logs go to bench-results/<prefix><name>.log.
    """

    def __init__(self, broker: str, *, web_workers: int = 2, web_threads: int = 32, concurrency: int = 1,
                 beat: bool = False, prefix: str = "", env: dict | None = None, watch_server: bool = True,
                 notify_worker: bool = False):
        self.broker, self.web_workers, self.web_threads = broker, web_workers, web_threads
        self.notify_worker = notify_worker
        self.watch_server = watch_server
        self.concurrency, self.beat, self.prefix = concurrency, beat, prefix
        self.env = dict(os.environ, **(env or {}))
        self.port = free_port()
        self.procs: dict[str, subprocess.Popen] = {}
        self._logs: set[str] = set()  # logs opened by this stack: appended to (a restarted worker), not replaced
        self.logdir = ROOT / "bench-results"
        self.logdir.mkdir(exist_ok=True)

    def start(self) -> None:
        import redis

        redis.Redis.from_url(self.broker).flushdb()
        self._spawn("web", [sys.executable, "manage.py", "serve", "--port", str(self.port), "--workers",
                            str(self.web_workers), "--threads", str(self.web_threads)]
                    + ([] if self.watch_server else ["--no-watch-server"]))
        self.start_worker(self.concurrency)
        if self.beat:
            self.start_beat()
        if self.notify_worker:
            self.start_notify_worker()  # beat's notify-queue work (the tables' upkeep, webhooks), as compose runs it
        deadline = time.monotonic() + 60
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                conn.request("GET", "/readyz")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"the web server did not come up; see bench-results/{self.prefix}web.log")
            time.sleep(0.2)
        time.sleep(2)  # the worker's first connection to Redis

    def start_worker(self, concurrency: int) -> None:
        self._spawn("worker", [sys.executable, "-m", "celery", "-A", "draservice", "worker", "--pool", "prefork",
                               "-c", str(concurrency), "--without-gossip", "--without-mingle",
                               "--without-heartbeat", "--loglevel", os.environ.get("BENCH_CELERY_LOGLEVEL", "WARNING")])

    def start_notify_worker(self) -> None:
        """A notify worker as compose runs it (fewer threads: nothing here delivers webhooks)."""
        queue = os.environ.get("NOTIFY_QUEUE", "notify")
        self._spawn("notify-worker", [sys.executable, "-m", "celery", "-A", "draservice", "worker", "-Q", queue,
                                      "--pool", "threads", "-c", "2", "-n", f"notify-{self.port}@%h",
                                      "--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel",
                                      os.environ.get("BENCH_CELERY_LOGLEVEL", "WARNING")])

    def start_replay_worker(self, queue: str) -> None:
        """A replay worker as compose runs it: only the replay queue, one process."""
        self._spawn("replay-worker", [sys.executable, "-m", "celery", "-A", "draservice", "worker", "-Q", queue,
                                      "--pool", "solo", "-n", f"replay-{self.port}@%h", "--without-gossip",
                                      "--without-mingle", "--without-heartbeat", "--loglevel",
                                      os.environ.get("BENCH_CELERY_LOGLEVEL", "WARNING")])

    def start_beat(self) -> None:
        schedule = self.logdir / f"{self.prefix}celerybeat-schedule"
        self._spawn("beat", [sys.executable, "-m", "celery", "-A", "draservice", "beat", "--loglevel", "WARNING",
                             "-s", str(schedule)])

    def pid(self, name: str) -> int:
        return self.procs[name].pid

    def _spawn(self, name: str, cmd: list[str]) -> None:
        log = (self.logdir / f"{self.prefix}{name}.log").open("a" if name in self._logs else "w")
        self._logs.add(name)
        self.procs[name] = subprocess.Popen(cmd, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)

    def stop_one(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)

    def stop(self) -> None:
        for name in list(self.procs):
            self.stop_one(name)


class Client:
    """One keep-alive HTTP connection (one per thread)."""

    def __init__(self, port: int, token: str):
        self.port, self.token = port, token
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def call(self, method: str, path: str, body=None) -> tuple[int, dict]:
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body)
            headers["Content-Type"] = "application/json"
        for attempt in range(2):
            try:
                self.conn.request(method, path, body=data, headers=headers)
                resp = self.conn.getresponse()
                raw = resp.read()
                return resp.status, (json.loads(raw) if raw else {})
            except (http.client.HTTPException, OSError):
                self.conn.close()
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
                if attempt:
                    raise
        raise AssertionError("unreachable")


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def wait_all_decided(namespace: str, n: int, timeout: float = 300) -> None:
    """Until ``n`` claims of ``namespace`` have left Pending (Django must be set up)."""
    from claims.models import ResourceClaim

    deadline = time.monotonic() + timeout
    while True:
        done = ResourceClaim.objects.filter(namespace__name=namespace).exclude(phase="Pending").count()
        if done >= n:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"{namespace}: only {done}/{n} claims decided after {timeout}s")
        time.sleep(0.05)


def release_all(namespace: str | None = None) -> int:
    """Free the devices of ``namespace``'s (or every) pending and allocated claim, through the claims service
    (one transaction per chunk of 1,000)."""
    from django.db import transaction
    from django.utils import timezone

    from claims.models import ResourceClaim
    from claims.services.claims import _release_locked

    total = 0
    while True:
        with transaction.atomic():
            qs = ResourceClaim.objects.select_for_update().select_related("namespace")
            if namespace is not None:
                qs = qs.filter(namespace__name=namespace)
            chunk = list(qs.filter(phase__in=["Pending", "Allocated"])[:1000])
            if not chunk:
                return total
            _release_locked(chunk, "Released", "benchmark phase done", timezone.now())
            total += len(chunk)
