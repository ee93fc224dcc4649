"""Real Celery worker processes for the gang integration tests: the test database, the test Redis."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from tests.claims.workers import test_database_url

ROOT = Path(__file__).resolve().parents[2]


class Workers:
    """``n`` single-process workers (``--pool solo``) on a queue of their own."""

    def __init__(self, broker_url: str, race: bool = False):
        self.broker_url = broker_url
        self.race = race
        self.queue = f"gangs-test-{uuid.uuid4().hex[:8]}"
        self.procs: list[subprocess.Popen] = []
        self.logs: list[Path] = []

    def start(self, n: int) -> None:
        env = dict(os.environ)
        env.update(CELERY_BROKER_URL=self.broker_url,
                   GANGS_TEST_QUEUE=self.queue, GANGS_TEST_RACE="1" if self.race else "0",
                   DJANGO_SETTINGS_MODULE="draservice.settings", PYTHONPATH=str(ROOT), LOG_LEVEL="WARNING",
                   DB_CONN_MAX_AGE="600")
        for i in range(n):
            log = Path(f"/tmp/{self.queue}-{i}.log")
            # application_name tells this worker's sessions apart (tests.claims.workers.wait_until_idle).
            env["DATABASE_URL"] = f"{test_database_url()}?application_name={self.queue}-w{i}"
            cmd = [sys.executable, "-m", "celery", "-A", "tests.gangs.celery_app", "worker", "--pool", "solo",
                   "-Q", self.queue, "-n", f"w{i}-{self.queue}@%h", "--without-gossip", "--without-mingle",
                   "--without-heartbeat", "--loglevel", "INFO"]
            self.procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log.open("w"),
                                               stderr=subprocess.STDOUT))
            self.logs.append(log)
        deadline = time.monotonic() + 60
        for proc, log in zip(self.procs, self.logs):
            while "ready." not in log.read_text():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"celery worker did not start:\n{log.read_text()[-3000:]}")
                time.sleep(0.1)

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

    def log_tail(self, n: int = 3000) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text()[-n:]}" for log in self.logs if log.exists())
