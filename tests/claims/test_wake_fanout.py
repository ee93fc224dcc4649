"""Targeted wake-ups that are really targeted (scheduler.services.wakeups), against real PostgreSQL and the real
engine: a freed device wakes the first ``WAKE_FANOUT`` pending claims in the scheduler's order that it can
serve, skipping those whose selectors it fails; the next ones are woken while it stays free; a release with
many pending claims costs a bounded number of decisions (counted as ``attempts``, never timed)."""
from __future__ import annotations

import pytest
from django.db import transaction
from django.db.models import Sum
from django.test import override_settings
from django.utils import timezone

from claims.models import Phase, ReleasedDevice, ResourceClaim
from claims.services import claims as claim_services
from claims.services import commit, preemption, wake
from scheduler.services import allocation, wakeups
from scheduler.tasks import wake_backstop
from tests.claims.fleet import gpu_claim, load_fleet
from tests.queues.conftest import queue_body

pytestmark = [pytest.mark.django_db, pytest.mark.live]

HOPPER = 'device.attributes["gpu.nvidia.com"].architecture == "Hopper"'
ADA = 'device.attributes["gpu.nvidia.com"].architecture == "Ada Lovelace"'


def arch_claim(name: str, arch: str) -> dict:
    body = gpu_claim(name)
    body["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [{"cel": {"expression": arch}}]
    return body


def run_rounds() -> None:
    while allocation.allocate_round().taken:
        pass


def decisions() -> int:
    return ResourceClaim.objects.aggregate(n=Sum("attempts"))["n"] or 0


def names(qs) -> set[str]:
    return set(qs.values_list("name", flat=True))


def woken() -> set[str]:
    wakeups.wake_for_released()
    return names(allocation.eligible_pending())


def full_fleet_with_waiters(waiters: list[dict]) -> None:
    """Cluster c1: one H100 node (8 GPUs) and one L4 node (4), all in use; then ``waiters`` tried once."""
    load_fleet({"c1": [("h100", 1), ("l4", 1)]})
    claim_services.create_claims("team-a", [arch_claim(f"h-{i}", HOPPER) for i in range(8)]
                                 + [arch_claim(f"l-{i}", ADA) for i in range(4)])
    run_rounds()
    assert ResourceClaim.objects.filter(phase=Phase.ALLOCATED).count() == 12
    claim_services.create_claims("team-a", waiters)
    run_rounds()
    assert not allocation.eligible_pending().exists()


@override_settings(WAKE_FANOUT=4)
def test_a_freed_h100_wakes_the_first_four_it_serves_skipping_older_claims_its_selectors_fail():
    full_fleet_with_waiters([arch_claim(f"ada-{i}", ADA) for i in range(3)]
                            + [gpu_claim(f"any-{i}") for i in range(10)])
    before = decisions()
    claim_services.release_claim(ResourceClaim.objects.get(name="h-0").id)
    assert woken() == {"any-0", "any-1", "any-2", "any-3"}  # the older L4-only claims are skipped
    run_rounds()
    assert ResourceClaim.objects.get(name="any-0").phase == Phase.ALLOCATED
    assert decisions() - before == 4
    assert not ReleasedDevice.objects.exists()  # in use again: offered no more
    assert {c.attempts for c in ResourceClaim.objects.filter(name__startswith="ada-")} == {1}


@override_settings(WAKE_FANOUT=2)
def test_while_the_device_stays_free_the_next_claims_in_order_are_woken_until_none_is_left():
    full_fleet_with_waiters([gpu_claim(f"any-{i}") for i in range(5)])
    claim_services.release_claim(ResourceClaim.objects.get(name="h-0").id)
    seen = []
    while batch := woken():
        seen.append(batch)
        # The woken claims fail to use it (decided again at the current version): the device stays free.
        with transaction.atomic():
            claims = list(ResourceClaim.objects.filter(name__in=batch).select_related("namespace"))
            commit.set_pending(claims, "Unsatisfiable", "no", None, allocation.read_version(), timezone.now(),
                               [], wake_keys=((wake.cluster_key("c1"), 1),))
            commit.record(claims, [])
    assert seen == [{"any-0", "any-1"}, {"any-2", "any-3"}, {"any-4"}]  # the scheduler's order: oldest first
    assert not ReleasedDevice.objects.exists()  # nobody left to offer it to


@override_settings(WAKE_FANOUT=4)
def test_a_higher_priority_claim_is_woken_before_older_ones(admin_client):
    resp = admin_client.post("/api/v1/queues", queue_body("team", namespaces=["team-a"], gpus=100, maxPriority=100),
                             format="json")
    assert resp.status_code == 201, resp.content
    full_fleet_with_waiters([gpu_claim(f"any-{i}") for i in range(6)]
                            + [gpu_claim("urgent", labels={"draservice.io/priority": "10"})])
    claim_services.release_claim(ResourceClaim.objects.get(name="h-0").id)
    assert woken() == {"urgent", "any-0", "any-1", "any-2"}
    run_rounds()
    assert ResourceClaim.objects.get(name="urgent").phase == Phase.ALLOCATED


@override_settings(WAKE_FANOUT=4)
def test_a_preemption_requeue_frees_its_devices_the_same_targeted_way():
    full_fleet_with_waiters([gpu_claim(f"any-{i}") for i in range(10)])
    victim = ResourceClaim.objects.get(name="h-0")
    with transaction.atomic():
        preemption.requeue(preemption.locked([victim.id]), "preempted by a test", timezone.now())
    assert ReleasedDevice.objects.count() == 1
    # The victim is pending again and eligible (never tried since); its GPU wakes four claims, not ten.
    assert woken() == {"h-0", "any-0", "any-1", "any-2", "any-3"}


@override_settings(WAKE_FANOUT=4)
def test_a_release_with_1000_pending_redecides_at_most_ten_claims():
    load_fleet({"c1": [("h100", 1)]})
    claim_services.create_claims("team-a", [gpu_claim(f"f-{i}") for i in range(8)])
    run_rounds()
    claim_services.create_claims("team-a", [gpu_claim(f"p-{i:04d}") for i in range(1000)])
    run_rounds()
    assert ResourceClaim.objects.filter(phase=Phase.PENDING).count() == 1000
    before = decisions()
    claim_services.release_claim(ResourceClaim.objects.get(name="f-0").id)
    run_rounds()
    assert 1 <= decisions() - before <= 10
    assert ResourceClaim.objects.get(name="p-0000").phase == Phase.ALLOCATED  # the first in order got it


@override_settings(WAKE_FANOUT=1)
def test_the_backstop_wakes_candidates_no_device_was_offered_to():
    full_fleet_with_waiters([gpu_claim(f"any-{i}") for i in range(3)])
    claim_services.release_claim(ResourceClaim.objects.get(name="h-0").id)
    ReleasedDevice.objects.all().delete()  # as if its offer was lost
    assert woken() == set()
    assert wake_backstop() == 3  # and asks for a round (run inline here: no broker)
    assert {n: c.attempts for n, c in ((c.name, c) for c in ResourceClaim.objects.filter(name__startswith="any-"))} \
        == {"any-0": 2, "any-1": 2, "any-2": 2}
    assert ResourceClaim.objects.get(name="any-0").phase == Phase.ALLOCATED


def test_offers_nobody_wants_are_dropped_batch_after_batch_in_one_round(monkeypatch):
    full_fleet_with_waiters([arch_claim("ada-0", ADA)])  # waits for an L4; H100s are freed below
    monkeypatch.setattr(wakeups, "OFFERS_PER_ROUND", 2)
    for i in range(5):
        claim_services.release_claim(ResourceClaim.objects.get(name=f"h-{i}").id)
    assert ReleasedDevice.objects.count() == 5
    assert wakeups.wake_for_released() == 0
    assert not ReleasedDevice.objects.exists()  # three batches read by one call
    claim_services.release_claim(ResourceClaim.objects.get(name="l-0").id)
    assert woken() == {"ada-0"}
