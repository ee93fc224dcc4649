"""Real Celery worker processes for integration tests, against the test database and the test Redis."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from django.db import connection

ROOT = Path(__file__).resolve().parents[2]


def test_database_url() -> str:
    s = connection.settings_dict
    auth = s["USER"] or ""
    if s.get("PASSWORD"):
        auth += f":{s['PASSWORD']}"
    return f"postgresql://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


test_database_url.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test, wherever it is imported


class WorkerPool:
    """``n`` single-process Celery workers (``--pool solo``: a SIGKILL kills the task it is running)."""

    def __init__(self, broker_url: str, queue: str | None = None, race: bool = False):
        self.broker_url = broker_url
        self.race = race
        self.queue = queue or f"claims-test-{uuid.uuid4().hex[:8]}"
        self.procs: list[subprocess.Popen] = []
        self.logs: list[Path] = []

    def env(self, i: int) -> dict:
        env = dict(os.environ)
        # application_name tells this worker's database sessions apart (see pg_stat_activity).
        env.update(DATABASE_URL=f"{test_database_url()}?application_name={self.app_name(i)}",
                   CELERY_BROKER_URL=self.broker_url, CLAIMS_TEST_RACE="1" if self.race else "0",
                   CLAIMS_TEST_QUEUE=self.queue, DJANGO_SETTINGS_MODULE="draservice.settings",
                   DB_CONN_MAX_AGE="600", PYTHONPATH=str(ROOT), LOG_LEVEL="WARNING")
        return env

    def start(self, n: int) -> None:
        for _ in range(n):
            i = len(self.procs)
            log = Path(f"/tmp/claims-worker-{self.queue}-{i}.log")
            self.procs.append(self._spawn(i, log.open("w")))
            self.logs.append(log)
        for i in range(len(self.procs)):
            self._wait_ready(i)

    def restart(self, i: int) -> None:
        """Start worker ``i`` again (after ``kill``), under the same name and database application_name; its
        log goes on in the same file."""
        assert self.procs[i].poll() is not None, "restart a worker that was killed"
        start = self.logs[i].stat().st_size
        self.procs[i] = self._spawn(i, self.logs[i].open("a"))
        self._wait_ready(i, start)

    def _spawn(self, i: int, log) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "celery", "-A", "tests.claims.celery_test_app", "worker", "--pool", "solo",
               "-Q", self.queue, "-n", f"w{i}-{self.queue}@%h", "--without-gossip", "--without-mingle",
               "--without-heartbeat", "--loglevel", "INFO"]
        return subprocess.Popen(cmd, cwd=ROOT, env=self.env(i), stdout=log, stderr=subprocess.STDOUT)

    def _wait_ready(self, i: int, start: int = 0, timeout: float = 60) -> None:
        proc, log = self.procs[i], self.logs[i]
        deadline = time.monotonic() + timeout
        while "ready." not in log.read_text()[start:]:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"celery worker did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.1)

    def app_name(self, i: int) -> str:
        return f"{self.queue}-w{i}"

    def kill(self, i: int) -> None:
        os.kill(self.procs[i].pid, signal.SIGKILL)
        self.procs[i].wait(10)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    def log_tail(self, n: int = 4000) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text()[-n:]}" for log in self.logs if log.exists())


def wait_until_idle(broker_url: str, queue: str, timeout: float = 20.0) -> None:
    """The workers outlive a test (module scope), but the test's teardown TRUNCATEs every table: a task still
    running then (e.g. the round a release asked for) holds table locks, and the flush deadlocks with it. Wait
    for the queue to drain and the workers' database sessions to go quiet first."""
    import time

    import redis
    from django.db import connection

    r = redis.Redis.from_url(broker_url)
    deadline = time.monotonic() + timeout
    quiet_since = None
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s "
                           "AND state <> 'idle'", [f"{queue}-w%"])
            busy = cursor.fetchone()[0]
        if busy == 0 and r.llen(queue) == 0:
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since > 0.3:  # a task just taken off the queue shows up as a session
                return
        else:
            quiet_since = None
        time.sleep(0.05)


def reset_dispatch_state(broker_url: str) -> None:
    """Forget the allocation debounce key (``claims.dispatch.kick_key()``). A kick enqueued to the previous test
    module's queue, whose workers are gone, would otherwise suppress this test's kicks for up to 30 s."""
    import redis

    from claims.dispatch import kick_key

    redis.Redis.from_url(broker_url).delete(kick_key())
