"""Quota holds with four real Celery workers on PostgreSQL (the allocators' turn lock on: the default mode)."""
from __future__ import annotations

import pytest

from tests.queues.race import run_race, setup_queues

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

WORKERS = 4  # read by the worker_pool fixture


def test_quota_holds_with_four_workers(admin_client, live_broker):
    setup_queues(admin_client)
    run_race(admin_client, live_broker)
