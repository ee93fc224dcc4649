"""Quota holds with four real Celery workers deciding at once (``CLAIMS_CLUSTER_TURNS=False``) and a
delay injected between the quota check and the write: only the queue row locks stand between them and an
over-admission."""
from __future__ import annotations

import os

import pytest

from tests.queues.race import run_race, setup_queues

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

WORKERS = 4  # read by the worker_pool fixture
RACE = True  # the workers skip the allocators' turn lock


@pytest.fixture(scope="module")
def worker_pool(request, django_db_setup, django_db_blocker):
    """The suite's worker pool, started with a 50 ms sleep between quota check and write (the workers read
    ``QUEUES_TEST_ADMIT_DELAY`` in tests/claims/celery_test_app.py and install the seam of
    tests/queues/seams.py); only these workers see it."""
    from tests.claims.workers import WorkerPool

    pool = WorkerPool(os.environ["TEST_BROKER_URL"], race=RACE)
    os.environ["QUEUES_TEST_ADMIT_DELAY"] = "0.05"
    try:
        with django_db_blocker.unblock():
            pool.start(WORKERS)
    finally:
        del os.environ["QUEUES_TEST_ADMIT_DELAY"]
    yield pool
    pool.stop()


def test_quota_holds_with_four_racing_workers_and_a_delay(admin_client, live_broker):
    setup_queues(admin_client)
    run_race(admin_client, live_broker)
