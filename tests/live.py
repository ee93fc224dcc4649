"""Helpers for tests that run the real service in a subprocess (gunicorn via ``manage.py serve``) on a
PostgreSQL database of its own: schemathesis, keep-alive, kubectl and the Kubernetes client."""
from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.request

from django.conf import settings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
