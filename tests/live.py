"""Helpers for tests that run the real service in a subprocess (gunicorn via ``manage.py serve``) on a
PostgreSQL database of its own: schemathesis, keep-alive, kubectl and the Kubernetes client."""
from __future__ import annotations

import os
import random
import signal
import socket
import ssl
import subprocess
import time
import urllib.request

from django.conf import settings

# Ports for live services come from below the kernel's ephemeral range (32768-60999 by default), one block per
# xdist worker: a port asked of the kernel (bind to 0) is an ephemeral one, which any outgoing connection on
# this busy machine (PostgreSQL, Redis, HTTP clients) may take in the seconds before the service binds it.
PORT_BASE = 20000
PORTS_PER_WORKER = 1000


def free_port() -> int:
    """A port free now on 127.0.0.1, from this xdist worker's block (worker gwN: PORT_BASE + N * 1000...)."""
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    first = PORT_BASE + (worker % 12) * PORTS_PER_WORKER
    # A random start: several pytest processes (other checkouts) may share a block.
    start = random.randrange(PORTS_PER_WORKER)
    for offset in range(PORTS_PER_WORKER):
        port = first + (start + offset) % PORTS_PER_WORKER
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {first}-{first + PORTS_PER_WORKER - 1}")


def admin_sql(sql: str) -> None:
    import psycopg

    db = settings.DATABASES["default"]
    with psycopg.connect(host=db["HOST"] or "127.0.0.1", port=db["PORT"] or 5432, user=db["USER"],
                         password=db["PASSWORD"] or None, dbname="postgres", autocommit=True) as conn:
        conn.execute(sql)


def database_url(name: str) -> str:
    db = settings.DATABASES["default"]
    auth = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    return f"postgresql://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{name}"


def wait_for(url: str, proc: subprocess.Popen, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the service exited with {proc.returncode}")
        try:
            # A live service under test may serve TLS with its own self-signed certificate.
            context = ssl._create_unverified_context() if url.startswith("https") else None
            with urllib.request.urlopen(url, timeout=2, context=context):
                return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"the service did not answer {url} within {seconds} s")


def stop_service(proc: subprocess.Popen | None) -> None:
    """Stop a service started in its own session (gunicorn's arbiter and its workers): TERM, then KILL."""
    if proc is None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
