"""Nominal at every level of the queue tree (issue: every queue promise holds): ``lendingLimit`` under a parent,
and reclaim for claims blocked by a quota of the tree, not only by a full fleet. Real rounds and passes in this
process; the fleet has 16 GPUs, so only the quotas block."""
from __future__ import annotations

import time

import pytest

from claims.models import Phase, ResourceClaim
from queues.models import Preemption
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
