"""Processes SIGKILLed mid-transaction leave the ledger consistent with the allocation rows: every open interval
has its allocation row and every allocation row its open interval.

Two deterministic kills, at the worst moment (a process that has written the ledger and the rows but not yet
committed: an allocation round, and a web process's release), and a Celery worker killed at a random moment
while two workers allocate 600 claims (the claims suite's harness, tests/claims/race.py).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from django.db import connection

from claims import dispatch
from claims.models import DeviceAllocation, Phase, ResourceClaim
from scheduler.tasks import allocate_pending
from tests.claims import workers
from tests.claims.fleet import gpu_claim, load_fleet
from tests.claims.race import assert_invariants, claim_bodies, load_race_fleet, submit, wait_settled
from tests.usage.conftest import assert_ledger_matches_allocations
from usage.models import UsageInterval

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

WORKERS = 2  # read by the worker_pool fixture

# Runs the real service code, then holds the transaction open (after the ledger and the rows are written)
# until it is killed.
HANG_IN_COMMIT = """
import sys, time, django
django.setup()
from claims.services import commit
from scheduler.services import allocation
original = commit.record
def record(*args, **kwargs):
    original(*args, **kwargs)
    print("written", flush=True)
    time.sleep(120)
commit.record = record
allocation.allocate_round()
"""
HANG_IN_RELEASE = """
import sys, time, django
django.setup()
from django.db import transaction
from claims.services import claims
with transaction.atomic():
    for claim_id in sys.argv[1].split(","):
        claims.release_claim(int(claim_id))
    print("written", flush=True)
    time.sleep(120)
"""


def sessions_of(app_name: str) -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [app_name])
        return cur.fetchone()[0]


def run_and_kill(script: str, *args: str) -> None:
    """Run ``script`` against the test database, SIGKILL it once it says it wrote, wait for PostgreSQL to
    roll its transaction back."""
    app = f"usage-kill-{os.getpid()}"
    env = {**os.environ, "DATABASE_URL": f"{workers.test_database_url()}?application_name={app}",
           "DJANGO_SETTINGS_MODULE": "draservice.settings", "PYTHONPATH": str(workers.ROOT), "CELERY_BROKER_URL": "",
           "LOG_LEVEL": "WARNING"}
    proc = subprocess.Popen([sys.executable, "-c", script, *args], cwd=workers.ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.strip() == "written", proc.stderr.read() if proc.stderr else ""
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    deadline = time.monotonic() + 10
    while sessions_of(app):
        assert time.monotonic() < deadline, "the killed process's session lingers"
        time.sleep(0.05)


def test_killed_before_the_commit_or_the_release_commits_leaves_nothing_half_written(admin_client, monkeypatch):
    load_fleet({"c1": [("h100", 1)]})
    monkeypatch.setattr(dispatch, "request_allocation", lambda: None)  # the killed process is to allocate
    for name in ("a", "b"):
        admin_client.post("/api/v1/namespaces/team-a/resourceclaims", gpu_claim(name, count=2), format="json")
    run_and_kill(HANG_IN_COMMIT)
    assert UsageInterval.objects.count() == 0 and DeviceAllocation.objects.count() == 0
    assert set(ResourceClaim.objects.values_list("phase", flat=True)) == {Phase.PENDING}

    allocate_pending.apply()
    assert UsageInterval.objects.filter(ended_at__isnull=True).count() == 4
    ids = ",".join(str(i) for i in ResourceClaim.objects.values_list("id", flat=True))
    run_and_kill(HANG_IN_RELEASE, ids)
    assert UsageInterval.objects.filter(ended_at__isnull=True).count() == 4
    assert set(ResourceClaim.objects.values_list("phase", flat=True)) == {Phase.ALLOCATED}
    assert_ledger_matches_allocations()


def test_worker_sigkilled_mid_run_leaves_the_ledger_consistent(admin_client, live_broker):
    load_race_fleet()
    submit(admin_client, claim_bodies(600, "u"))
    deadline = time.monotonic() + 60
    while ResourceClaim.objects.filter(phase=Phase.ALLOCATED).count() < 30:
        assert time.monotonic() < deadline, live_broker.log_tail()
        time.sleep(0.01)
    victim = live_broker.app_name(0)
    deadline = time.monotonic() + 30
    while True:  # kill it inside a transaction
        with connection.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND xact_start IS NOT "
                        "NULL AND state <> 'idle'", [victim])
            if cur.fetchone()[0] or time.monotonic() > deadline:
                break
        time.sleep(0.005)
    live_broker.kill(0)
    deadline = time.monotonic() + 10
    while sessions_of(victim):
        assert time.monotonic() < deadline, "the killed worker's session lingers"
        time.sleep(0.05)
    allocate_pending.delay()
    wait_settled(live_broker)
    phases = assert_invariants()
    assert_ledger_matches_allocations()
    assert UsageInterval.objects.filter(ended_at__isnull=False).count() == 0  # nothing was released
    print(f"\n600 claims, one of 2 workers SIGKILLed: {phases}, "
          f"{UsageInterval.objects.count()} open intervals = {DeviceAllocation.objects.count()} allocation rows")
