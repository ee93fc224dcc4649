"""The processes a chaos run kills and restarts: the Celery workers (``tests.claims.workers.WorkerPool``), Celery
beat and the web process (gunicorn as deployed, ``-c gunicorn.conf.py``), all on the test database and the run's
Redis queue. Kills are SIGKILL (no cleanup of any kind), each followed by a restart; they run in threads of
their own so that the run goes on while the victim is down."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests
from django.db import connection

from tests.claims.workers import ROOT, WorkerPool, test_database_url
from tests.live import free_port


def _env(pool: WorkerPool, app_name: str, **extra: str) -> dict:
    return {**os.environ, "DATABASE_URL": f"{test_database_url()}?application_name={app_name}",
            "CELERY_BROKER_URL": pool.broker_url, "CLAIMS_TEST_QUEUE": pool.queue,
            "DJANGO_SETTINGS_MODULE": "draservice.settings", "PYTHONPATH": str(ROOT), "LOG_LEVEL": "WARNING",
            **extra}


class Beat:
    """``celery beat`` with the product's schedule (``tests.chaos.beat_app``: preemption every ``period`` s). It
    keeps its schedule file across restarts, as a deployed beat does."""

    def __init__(self, pool: WorkerPool, period: float, log: Path):
        self.pool, self.period, self.log = pool, period, log
        self.schedule = log.with_suffix(".schedule")
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        start = self.log.stat().st_size if self.log.exists() else 0
        cmd = [sys.executable, "-m", "celery", "-A", "tests.chaos.beat_app", "beat", "-s", str(self.schedule),
               "--loglevel", "INFO"]
        env = _env(self.pool, f"{self.pool.queue}-beat", CHAOS_BEAT_SECONDS=str(self.period))
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self.log.open("a"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while "beat: Starting" not in self.log.read_text()[start:]:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"celery beat did not start:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.1)

    def kill(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


class Web:
    """gunicorn as deployed (``-c gunicorn.conf.py``), one worker process of a few threads, in a session of its
    own: a kill takes the arbiter and its worker at once, as a node failure would."""

    def __init__(self, pool: WorkerPool, log: Path):
        self.pool, self.log = pool, log
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.metrics = log.with_suffix(".metrics")  # gunicorn.conf.py's multiprocess dir: a SIGKILL leaves it
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        gunicorn = str(Path(sys.executable).with_name("gunicorn"))
        env = _env(self.pool, f"{self.pool.queue}-web", WEB_WORKERS="1", WEB_THREADS="4",
                   PROMETHEUS_MULTIPROC_DIR=str(self.metrics))
        self.proc = subprocess.Popen([gunicorn, "-c", str(ROOT / "gunicorn.conf.py"), "--bind",
                                      f"127.0.0.1:{self.port}", "tests.chaos.wsgi:application"], cwd=ROOT, env=env,
                                     stdout=self.log.open("a"), stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"gunicorn did not start:\n{self.log.read_text()[-3000:]}")
            try:
                if requests.get(self.url + "/livez", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                time.sleep(0.2)

    def kill(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


def sessions_of(app_name: str, busy: bool = False) -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
                    + (" AND xact_start IS NOT NULL AND state <> 'idle'" if busy else ""), [app_name])
        return cur.fetchone()[0]


@dataclass
class Kill:
    what: str  # "worker 0", "beat", "web"
    at: float  # seconds into the run
    in_transaction: bool = False  # the victim had a transaction open when it died
    down: float = 0.0  # seconds until it answered again


@dataclass
class Chaos:
    """Kills in background threads: SIGKILL, wait until PostgreSQL has dropped the victim's sessions (its
    transaction rolled back), restart."""

    pool: WorkerPool
    beat: Beat
    web: Web | None = None
    started: float = field(default_factory=time.monotonic)
    kills: list[Kill] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)

    def kill(self, what: str) -> None:
        thread = threading.Thread(target=self._run, args=(what,), name=f"kill {what}")
        thread.start()
        self.threads.append(thread)

    def join(self) -> None:
        for thread in self.threads:
            thread.join(120)
        assert not any(t.is_alive() for t in self.threads), "a kill-and-restart hangs"
        assert not self.errors, self.errors

    def _run(self, what: str) -> None:
        try:
            self._kill_and_restart(what)
        except BaseException as exc:  # noqa: BLE001 - reported by join()
            self.errors.append(exc)
        finally:
            connection.close()

    def _kill_and_restart(self, what: str) -> None:
        kind, _, index = what.partition(" ")
        app = {"worker": self.pool.app_name(int(index or 0)), "beat": f"{self.pool.queue}-beat",
               "web": f"{self.pool.queue}-web"}[kind]
        deadline = time.monotonic() + 2
        # Worker and web: die inside a transaction if one comes within 2 s (a round's commit, a preemption
        # pass's marks, a release); beat holds no database session at all.
        while kind != "beat" and not sessions_of(app, busy=True) and time.monotonic() < deadline:
            time.sleep(0.005)
        kill = Kill(what, time.monotonic() - self.started, kind != "beat" and sessions_of(app, busy=True) > 0)
        {"worker": lambda: self.pool.kill(int(index)), "beat": self.beat.kill,
         "web": lambda: self.web.kill() if self.web else None}[kind]()
        self.kills.append(kill)
        deadline = time.monotonic() + 15
        while sessions_of(app):
            assert time.monotonic() < deadline, f"the killed {what}'s database session lingers"
            time.sleep(0.05)
        {"worker": lambda: self.pool.restart(int(index)), "beat": self.beat.start,
         "web": lambda: self.web.start() if self.web else None}[kind]()
        kill.down = time.monotonic() - self.started - kill.at
