"""Gangs competing for the same devices, decided at the same moment by several real worker processes.

``RACE``: the allocators' turn lock is off, so the workers compute placements concurrently from the same
view, pick the same devices (the engine is deterministic), and only the write-time checks and the unique
index stand between them and a double or partial allocation. Whatever the interleaving: no deadlock (every
step finishes in seconds), never a partial gang (a gang holds all its members' devices or none), never a
device twice, and the losers are retried until each gang has had its turn.
"""
from __future__ import annotations

import time

import pytest
from django.db import connection

from benchmarks._queue_world import queue_body
from claims.models import DeviceAllocation, Phase, ResourceClaim
from gangs.models import Gang, GangPhase
from gangs.services import gangs as gang_services
from tests.gangs import fleet
from tests.gangs.conftest import NS

pytestmark = pytest.mark.django_db(transaction=True)
WORKERS = 3
RACE = True
GANGS = 6
URL = f"/api/v1/namespaces/{NS}/gangs"


def wait_until(fn, timeout: float, workers):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"not settled in {timeout}s: {snapshot()}\n{workers.log_tail()}")


def snapshot() -> list[tuple]:
    return list(Gang.objects.order_by("id").values_list("name", "phase", "reason", "attempts"))


def rows_by_gang() -> dict[str, int]:
    out = {g.name: 0 for g in Gang.objects.all()}
    for name in DeviceAllocation.objects.values_list("claim__reservations__consumer__gang_member__gang__name",
                                                     flat=True):
        if name:
            out[name] += 1
    return out


def settled() -> bool:
    """Every live gang was tried since the fleet last changed: placed, or pending with a recorded attempt."""
    from scheduler.services.allocation import fleet_version

    version = fleet_version()
    return all(phase == GangPhase.PLACED or (phase == GangPhase.PENDING and tried is not None and tried >= version)
               for phase, tried in Gang.objects.filter(phase__in=[GangPhase.PENDING, GangPhase.PLACED])
               .values_list("phase", "attempted_version"))


def check_invariants(expect_placed: int) -> str:
    """Exactly ``expect_placed`` gangs placed, each whole; every other gang holds nothing; no device twice."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT cluster, driver, pool, device FROM claims_deviceallocation WHERE share_id = '' "
                       "AND NOT admin_access GROUP BY 1, 2, 3, 4 HAVING count(*) > 1")
        assert cursor.fetchall() == []
    rows = rows_by_gang()
    placed = [g for g in Gang.objects.all() if g.phase == GangPhase.PLACED]
    assert len(placed) == expect_placed, snapshot()
    for g in Gang.objects.all():
        if g.phase == GangPhase.PLACED:
            assert rows[g.name] == 48 and g.placed_count == 6, (g.name, rows[g.name])
            claims = ResourceClaim.objects.filter(reservations__consumer__gang_member__gang=g)
            assert {c.phase for c in claims} == {Phase.ALLOCATED}
        else:
            assert rows[g.name] == 0, (g.name, g.phase, rows[g.name])  # never a partial hold
    return placed[0].name if placed else ""


def test_competing_gangs_never_deadlock_never_hold_partially_and_all_get_their_turn(admin_client, rack_fleet,
                                                                                   live_broker):
    # Six gangs of 6 x 8 GPUs, no topology: the cluster has 9 nodes, so exactly one fits at a time, and all
    # six want the same (bin-packed) devices. Created back to back: each creation enqueues its own task, so
    # the three workers decide concurrently.
    for i in range(GANGS):
        gang_services.create_gang(NS, fleet.gang_body(f"g{i}", 6, required=None, preferred=None))
    # Small claims keep flowing meanwhile (they fit beside any one gang). Of a queue within its nominal: the
    # oldest pending gang holds the nodes it waits for at the head of ``default``, and a later claim of a queue
    # above its nominal (``default`` itself) would wait there for it (tests/queues/test_gang_head.py).
    resp = admin_client.post("/api/v1/queues", queue_body("side", namespaces=["side"], gpus=3), format="json")
    assert resp.status_code == 201, resp.content
    for i in range(3):
        resp = admin_client.post("/api/v1/namespaces/side/resourceclaims", fleet.claim_body(f"small-{i}", 1, "side"),
                                 format="json")
        assert resp.status_code == 201, resp.content
    small = ResourceClaim.objects.filter(name__startswith="small-")
    wait_until(lambda: settled() and {c.phase for c in small.all()} == {Phase.ALLOCATED}, 30, live_broker)
    holder = check_invariants(expect_placed=1)
    pending = Gang.objects.filter(phase=GangPhase.PENDING)
    assert pending.count() == GANGS - 1 and {g.reason for g in pending} == {"NoDomainFits"}

    # Release the holder, one after the other: each release lets exactly one waiting gang in, the oldest.
    order = [holder]
    for _ in range(GANGS - 1):
        started = time.monotonic()
        assert admin_client.post(f"{URL}/{order[-1]}/release").status_code == 200
        wait_until(lambda: settled() and Gang.objects.filter(phase=GangPhase.PLACED).exists(), 20, live_broker)
        assert time.monotonic() - started < 20
        order.append(check_invariants(expect_placed=1))
    assert sorted(order) == [f"g{i}" for i in range(GANGS)]  # everyone had a turn, nobody twice
    waiting = order[1:]
    assert waiting == sorted(waiting, key=lambda n: int(n[1:]))  # and the waiting ones in arrival order
