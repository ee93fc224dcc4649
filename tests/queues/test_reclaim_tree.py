"""Nominal at every level of the queue tree (issue: every queue promise holds): ``lendingLimit`` under a parent,
and reclaim for claims blocked by a quota of the tree, not only by a full fleet. Real rounds and passes in this
process; the fleet has 16 GPUs, so only the quotas block."""
from __future__ import annotations

import time

import pytest
from django.utils import timezone

from claims.models import Phase, ResourceClaim
from claims.services import taking
from queues.models import Preemption
from queues.services import owed
from scheduler.services import reclaim
from scheduler.services.allocation import allocate_round
from tests.queues.conftest import queue_body
from tests.queues.test_admission import make, submit

pytestmark = pytest.mark.django_db
GRACE = 1


def org_tree(admin_client, c2_lending=None) -> None:
    """``org`` {nominal 8, borrowingLimit 0} with children ``c1`` {4} and ``c2`` {4, lendingLimit}."""
    pre = {"preemption": {"graceSeconds": GRACE}}
    make(admin_client, queue_body("org", gpus=8, borrowing=0),
         queue_body("c1", namespaces=["c1"], parent="org", gpus=4, **pre),
         queue_body("c2", namespaces=["c2"], parent="org", gpus=4, lending=c2_lending, **pre))


def allocated(namespace: str) -> int:
    return ResourceClaim.objects.filter(namespace__name=namespace, phase=Phase.ALLOCATED).count()


def test_lending_limit_under_a_parent_keeps_the_childs_nominal(admin_client, h100_fleet):
    org_tree(admin_client, c2_lending=0)
    for i in range(8):
        submit(admin_client, "c1", f"c1-{i}")
    allocate_round()
    assert allocated("c1") == 4  # c2 lends nothing: c1 never goes above its own 4
    waiting = ResourceClaim.objects.filter(namespace__name="c1", phase=Phase.PENDING)
    assert {c.reason for c in waiting} == {"WaitingForQuota"} and waiting.count() == 4
    assert 'its sibling queues under "org" keep for themselves' in waiting[0].message, waiting[0].message
    for i in range(4):
        submit(admin_client, "c2", f"c2-{i}")
    allocate_round()
    assert allocated("c2") == 4 and allocated("c1") == 4 and not Preemption.objects.exists()


def test_a_claim_blocked_by_its_parents_quota_reclaims_within_grace(admin_client, h100_fleet):
    """c2 lends: c1 takes all 8 of org. c2's 4 claims, within c2's nominal, are blocked by org's quota (the
    fleet has 8 idle GPUs): exactly 4 of c1's claims are preempted, and c2's claims run within the grace
    period + 3 s, while c1 is back at 4."""
    org_tree(admin_client)
    for i in range(10):
        submit(admin_client, "c1", f"c1-{i}")
    allocate_round()
    assert allocated("c1") == 8
    started = time.monotonic()
    for i in range(4):
        submit(admin_client, "c2", f"c2-{i}")
    allocate_round()
    assert {c.reason for c in ResourceClaim.objects.filter(namespace__name="c2")} == {"WaitingForQuota"}
    while allocated("c2") < 4 and time.monotonic() - started < GRACE + 10:
        reclaim.run()
        allocate_round()
        time.sleep(0.2)
    took = time.monotonic() - started
    assert allocated("c2") == 4, [(c.name, c.reason, c.message) for c in ResourceClaim.objects.filter(
        namespace__name="c2")]
    assert took <= GRACE + 3, took
    assert allocated("c1") == 4
    assert Preemption.objects.count() == 4
    assert set(Preemption.objects.values_list("victim__namespace__name", flat=True)) == {"c1"}


def test_quota_a_reclaim_freed_waits_for_its_preemptor(admin_client, h100_fleet):
    """The victims requeued, a round that decides them before their preemptors (another worker holds those)
    must not give them back the quota freed for the preemptors: they stay WaitingForQuota, the preemptors are
    placed by the next round, and the next pass takes no second set of victims (4 notices for 2 claims, before)."""
    org_tree(admin_client)
    for i in range(8):
        submit(admin_client, "c1", f"c1-{i}")
    allocate_round()
    assert allocated("c1") == 8
    for i in range(2):
        submit(admin_client, "c2", f"c2-{i}")
    allocate_round()
    reclaim.run()
    assert Preemption.objects.count() == 2
    time.sleep(GRACE + 0.1)
    reclaim.run()  # requeues the two victims
    victims = ResourceClaim.objects.filter(namespace__name="c1", phase=Phase.PENDING)
    assert victims.count() == 2
    preemptors = list(ResourceClaim.objects.filter(namespace__name="c2").values_list("id", flat=True))
    taking.mark_taken(preemptors)  # another worker's round holds them
    allocate_round()
    assert allocated("c1") == 6, [(c.name, c.phase, c.reason) for c in ResourceClaim.objects.filter(
        namespace__name="c1")]
    assert {c.reason for c in victims} == {"WaitingForQuota"}
    assert all("would borrow" in c.message for c in victims), [c.message for c in victims]
    taking.clear_taken(preemptors)
    allocate_round()
    assert allocated("c2") == 2 and allocated("c1") == 6
    reclaim.run()
    assert Preemption.objects.count() == 2


def test_a_preemptor_tried_since_owes_nothing(admin_client, h100_fleet):
    """The debt ends once a round has tried the preemptor, placed or not: one whose devices are gone (its class
    now selects nothing) does not keep its queue's nominal from the borrower."""
    org_tree(admin_client)
    for i in range(8):
        submit(admin_client, "c1", f"c1-{i}")
    allocate_round()
    submit(admin_client, "c2", "c2-0")
    allocate_round()
    reclaim.run()
    time.sleep(GRACE + 0.1)
    reclaim.run()
    preemptor = ResourceClaim.objects.get(namespace__name="c2", name="c2-0")
    assert owed.preemptor_ids(timezone.now()) == {preemptor.id}
    ResourceClaim.objects.filter(id=preemptor.id).update(last_attempt_at=timezone.now())  # a round tried it
    assert owed.preemptor_ids(timezone.now()) == set()
    taking.mark_taken([preemptor.id])
    allocate_round()
    assert allocated("c1") == 8  # the victim took its quota back: nothing was owed any more
