"""Four real worker processes decide at the same time (no turn lock) for fewer devices than claims.

Only the database stands between them and a double allocation: the partial unique index, and the checks
made under sorted advisory locks at write time (claims.services.locking). See tests/claims/race.py for
the invariants.
"""
from __future__ import annotations

import random
import threading
import time

import pytest
from django.db import connections

from claims.models import ClaimEvent, DeviceAllocation, Phase, ResourceClaim
from tests.claims.race import (
    NS,
    assert_invariants,
    claim_bodies,
    load_race_fleet,
    submit,
    unexplained_idle_gpus,
    wait_settled,
    wake_state,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

WORKERS = 4  # read by the worker_pool fixture
RACE = True  # the workers skip the allocators' turn lock


def test_four_racing_workers_never_allocate_a_device_twice(admin_client, live_broker):
    load_race_fleet()
    bodies = claim_bodies(1500, "c")
    started = time.monotonic()

    def releaser():
        # Churn while the workers race: release some allocated claims, so freed devices are raced for too.
        rng = random.Random(7)
        try:
            released = 0
            while released < 60:
                names = list(ResourceClaim.objects.filter(phase=Phase.ALLOCATED).values_list("name", flat=True)[:300])
                if names:
                    admin_client.post(f"{NS}/resourceclaims/{rng.choice(names)}/release")
                    released += 1
                time.sleep(0.02)
        finally:
            connections.close_all()

    churn = threading.Thread(target=releaser)
    submit(admin_client, bodies[:750])
    churn.start()
    submit(admin_client, bodies[750:])
    churn.join(60)
    wait_settled(live_broker)
    phases = assert_invariants()
    lost = ClaimEvent.objects.filter(reason="LostRace").count()
    print(f"\n1500 claims, 4 racing workers: {phases}, {DeviceAllocation.objects.count()} device rows, "
          f"{lost} lost races, {time.monotonic() - started:.1f}s")
    assert lost > 0, "the workers never collided: this run did not test the race"
    # Demand far exceeds supply: every whole GPU ends up held, or free (one at most) on a node held for a queue
    # head. Until the engine was told to pass over held nodes (issue 14), a 1-GPU claim put first on a held node
    # was undone there and waited for some release while another node had a free GPU: GPUs stayed idle.
    unexplained, held_nodes = unexplained_idle_gpus()
    assert not unexplained, f"GPUs free while claims wait: {unexplained}; held for heads: {held_nodes}; {wake_state()}"
    assert phases[Phase.ALLOCATED] > 300 and phases[Phase.PENDING] > 500
