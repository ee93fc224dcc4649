"""A worker is SIGKILLed while four workers allocate: nothing is lost, nothing is allocated twice.

The killed worker's transaction dies with its connection (PostgreSQL rolls it back and drops its locks);
its claims become eligible again and the others (after beat's periodic retry) allocate them.
"""
from __future__ import annotations

import time

import pytest
from django.db import connection

from claims.models import Phase, ResourceClaim
from scheduler.tasks import allocate_pending
from tests.claims.race import (
    H100_NODES,
    assert_invariants,
    claim_bodies,
    load_race_fleet,
    submit,
    wait_settled,
    whole_gpus_held,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

WORKERS = 4  # read by the worker_pool fixture


def sessions_of(app_name: str) -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [app_name])
        return cur.fetchone()[0]


def test_worker_sigkilled_mid_run(admin_client, live_broker):
    load_race_fleet()
    bodies = claim_bodies(1500, "k")
    submit(admin_client, bodies[:500])
    deadline = time.monotonic() + 60
    while ResourceClaim.objects.filter(phase=Phase.ALLOCATED).count() < 50:
        assert time.monotonic() < deadline, live_broker.log_tail()
        time.sleep(0.01)
    submit(admin_client, bodies[500:])
    deadline = time.monotonic() + 30
    victim = live_broker.app_name(0)
    while True:  # kill it inside a transaction (it holds claims and locks then)
        with connection.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND xact_start IS NOT "
                        "NULL AND state <> 'idle'", [victim])
            if cur.fetchone()[0] or time.monotonic() > deadline:
                break
        time.sleep(0.005)
    live_broker.kill(0)
    deadline = time.monotonic() + 10
    while sessions_of(victim):  # PostgreSQL notices the dead client, rolls back, releases its locks
        assert time.monotonic() < deadline, "the killed worker's session lingers"
        time.sleep(0.05)
    allocate_pending.delay()  # what beat's periodic retry does
    wait_settled(live_broker)
    phases = assert_invariants()
    print(f"\n1500 claims, one of 4 workers SIGKILLed: {phases}")
    assert whole_gpus_held() == H100_NODES * 8
