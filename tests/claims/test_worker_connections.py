"""A Celery worker keeps its database connection from one task to the next (``CELERY_DB_REUSE_MAX``, and
``draservice.celery`` closing after a task only what Django closes after a request): Celery's Django fixup
closed it around every task, so every task opened a connection and PostgreSQL started a backend for it. Real
worker process, real PostgreSQL and Redis."""
from __future__ import annotations

import time

import pytest
from django.db import connection

from tests.claims.fleet import gpu_claim

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

NS = "/api/v1/namespaces/ci"


def worker_backends(app_name: str) -> set[tuple[int, object]]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid, backend_start FROM pg_stat_activity WHERE application_name = %s", [app_name])
        return set(cursor.fetchall())


def test_the_worker_keeps_its_backend_across_tasks(admin_client, small_fleet, live_broker):
    app_name = live_broker.app_name(0)
    seen: set[tuple[int, object]] = set()
    for i in range(4):  # an allocation task each, one after the other
        assert admin_client.post(f"{NS}/resourceclaims", gpu_claim(f"c{i}"), format="json").status_code == 201
        claim = admin_client.get(f"{NS}/resourceclaims/c{i}?wait=20s").json()
        assert claim["status"]["phase"] == "Allocated", claim["status"]
        time.sleep(0.3)  # the task has ended (a closing fixup would have closed the connection by now)
        seen |= worker_backends(app_name)
    # The pool's child and, at most, the main process: the same backends after every task.
    assert 1 <= len(seen) <= 2, seen
