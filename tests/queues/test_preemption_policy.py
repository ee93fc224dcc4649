"""Kueue's preemption policy fields on a Queue (issue 30): ``withinQueue: LowerOrNewerEqualPriority``,
``reclaimWithinCohort`` (and the old ``reclaimBorrowed`` it replaces), ``borrowWithinCohort`` and fair-share
preemption (``fairSharing.preemptionStrategies``). Real rounds and passes in this process; grace 0, so a pass
marks and requeues at once."""
from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest
from django.apps import apps
from django.utils import timezone

from claims.models import Phase, ResourceClaim
from queues.models import Preemption, Queue
from scheduler.services import reclaim
from tests.queues.conftest import queue_body
from tests.queues.test_admission import Q, make, rounds, submit

pytestmark = pytest.mark.django_db
GRACE0 = {"graceSeconds": 0, "minRuntimeSeconds": 0}


def allocated(namespace: str) -> int:
    return ResourceClaim.objects.filter(namespace__name=namespace, phase=Phase.ALLOCATED).count()


def preempted(namespace: str) -> set[str]:
    return set(Preemption.objects.filter(victim__namespace__name=namespace).values_list("victim__name", flat=True))


def prio(p: int) -> dict:
    return {"draservice.io/priority": str(p)}


# --- the fields ------------------------------------------------------------------------------------------------

def test_reclaim_borrowed_is_read_as_reclaim_within_cohort_and_not_returned(admin_client, db):
    make(admin_client, queue_body("old", namespaces=["o"], gpus=4, preemption={"reclaimBorrowed": "Never"}))
    got = admin_client.get(f"{Q}/old").json()["spec"]["preemption"]
    assert got["reclaimWithinCohort"] == "Never" and "reclaimBorrowed" not in got
    assert got["borrowWithinCohort"] == {"policy": "Never"} and got["withinQueue"] == "LowerPriority"
    make(admin_client, queue_body("new", namespaces=["n"], gpus=4))
    assert admin_client.get(f"{Q}/new").json()["spec"]["preemption"]["reclaimWithinCohort"] == "Any"


@pytest.mark.parametrize(("preemption", "fair", "field"), [
    ({"reclaimBorrowed": "Always", "reclaimWithinCohort": "Never"}, None, "spec.preemption.reclaimBorrowed"),
    ({"reclaimBorrowed": "Sometimes"}, None, "spec.preemption.reclaimBorrowed"),
    ({"reclaimWithinCohort": "Always"}, None, "spec.preemption.reclaimWithinCohort"),
    ({"withinQueue": "Newer"}, None, "spec.preemption.withinQueue"),
    ({"borrowWithinCohort": {"policy": "Any"}}, None, "spec.preemption.borrowWithinCohort.policy"),
    ({"borrowWithinCohort": {"policy": "Never", "maxPriorityThreshold": 3}}, None,
     "spec.preemption.borrowWithinCohort.maxPriorityThreshold"),
    ({"borrowWithinCohort": {"policy": "LowerPriority", "maxPriorityThreshold": "3"}}, None,
     "spec.preemption.borrowWithinCohort.maxPriorityThreshold"),
    (None, {"preemptionStrategies": ["LessThanFinalShare"]}, "spec.fairSharing.preemptionStrategies[0]"),
    (None, {"preemptionStrategies": ["LessThanInitialShare", "LessThanInitialShare"]},
     "spec.fairSharing.preemptionStrategies[1]"),
    (None, {"weight": 0}, "spec.fairSharing.weight"),
])
def test_a_bad_policy_field_is_a_422_naming_it(admin_client, db, preemption, fair, field):
    spec = {**({"preemption": preemption} if preemption else {}), **({"fairSharing": fair} if fair else {})}
    resp = admin_client.post(Q, queue_body("bad", namespaces=["x"], gpus=4, **spec), format="json")
    assert resp.status_code == 422, resp.content
    assert field in [e.get("field") for e in resp.json().get("errors", [])] or field in resp.content.decode()
    assert not Queue.objects.filter(name="bad").exists()


def test_fair_sharing_weight_is_the_queue_weight(admin_client, db):
    make(admin_client, queue_body("w", namespaces=["w"], gpus=0, fairSharing={
        "weight": 3, "preemptionStrategies": ["LessThanOrEqualToFinalShare", "LessThanInitialShare"]}))
    spec = admin_client.get(f"{Q}/w").json()["spec"]
    assert spec["weight"] == 3 and spec["fairSharing"]["weight"] == 3
    assert spec["fairSharing"]["preemptionStrategies"] == ["LessThanOrEqualToFinalShare", "LessThanInitialShare"]


def test_the_migration_converts_stored_queues(db):
    from importlib import import_module

    forward = import_module("queues.migrations.0008_reclaim_within_cohort").forward
    Queue.objects.create(name="legacy", spec={"preemption": {"withinQueue": "Never", "reclaimBorrowed": "Never"}})
    Queue.objects.create(name="legacy2", spec={"preemption": {"reclaimBorrowed": "Always", "graceSeconds": 5}})
    forward(apps, None)
    assert Queue.objects.get(name="legacy").spec["preemption"] == {
        "withinQueue": "Never", "reclaimWithinCohort": "Never", "borrowWithinCohort": {"policy": "Never"}}
    assert Queue.objects.get(name="legacy2").spec["preemption"] == {
        "graceSeconds": 5, "reclaimWithinCohort": "Any", "borrowWithinCohort": {"policy": "Never"}}


# --- what they let a pass do -------------------------------------------------------------------------------------

def test_reclaim_lower_priority_spares_the_borrowers_equal_or_higher_priorities(admin_client, h100_fleet):
    """default borrows all 16 GPUs: 8 claims of priority 5, then 8 of priority 0. team-a (nominal 8, priority
    1 claims, reclaimWithinCohort LowerPriority) asks for 8 one-GPU claims: exactly the 8 priority-0 claims
    go, none of priority 5."""
    assert admin_client.patch("/api/v1/queues/default", {"spec": {"maxPriority": 10, "preemption": GRACE0}},
                              format="json").status_code == 200
    make(admin_client, queue_body("team-a", namespaces=["a"], gpus=8, maxPriority=10,
                                  preemption={**GRACE0, "reclaimWithinCohort": "LowerPriority"}))
    for i in range(8):
        submit(admin_client, "ci", f"high{i}", labels=prio(5))
    for i in range(8):
        submit(admin_client, "ci", f"low{i}", labels=prio(0))
    rounds(2)
    for i in range(8):
        submit(admin_client, "a", f"a{i}", labels=prio(1))
    rounds(1)
    assert reclaim.run()["victims"] == 8
    rounds(2)
    assert allocated("a") == 8 and preempted("ci") == {f"low{i}" for i in range(8)}


def test_reclaim_never_leaves_a_borrower_alone(admin_client, h100_fleet):
    assert admin_client.patch("/api/v1/queues/default", {"spec": {"preemption": GRACE0}},
                              format="json").status_code == 200
    make(admin_client, queue_body("team-a", namespaces=["a"], gpus=8,
                                  preemption={**GRACE0, "reclaimWithinCohort": "Never", "withinQueue": "Never"}))
    for i in range(16):
        submit(admin_client, "ci", f"ci{i}")
    rounds(1)
    submit(admin_client, "a", "mine", 2)
    rounds(1)
    assert reclaim.run()["victims"] == 0 and ResourceClaim.objects.get(name="mine").phase == Phase.PENDING


def fill_then_newer(admin_client, within: str) -> set[str]:
    """team-a (nominal 16) runs 16 one-GPU claims of priority 0; "big" (8, priority 0) waits. The claims on one
    node are then made newer than big (their creation time moved past big's: the API cannot place a newer claim
    while an older head waits for room). Returns their names."""
    make(admin_client, queue_body("team-a", namespaces=["a"], gpus=16, preemption={**GRACE0, "withinQueue": within}))
    for i in range(16):
        submit(admin_client, "a", f"c{i}")
    rounds(1)
    submit(admin_client, "a", "big", 8)
    rounds(1)
    big = ResourceClaim.objects.get(name="big")
    assert big.phase == Phase.PENDING and allocated("a") == 16
    node = ResourceClaim.objects.filter(namespace__name="a", phase=Phase.ALLOCATED).values_list("node", flat=True)[0]
    newer = ResourceClaim.objects.filter(namespace__name="a", phase=Phase.ALLOCATED, node=node)
    names = set(newer.values_list("name", flat=True))
    newer.update(created_at=big.created_at + timedelta(seconds=1))
    return names


def test_lower_or_newer_equal_priority_preempts_only_newer_equals(admin_client, h100_fleet):
    newer = fill_then_newer(admin_client, "LowerOrNewerEqualPriority")
    out = reclaim.run()
    assert out["victims"] == 8, out
    assert preempted("a") == newer
    rounds(1)
    assert ResourceClaim.objects.get(name="big").phase == Phase.ALLOCATED


def test_lower_priority_within_queue_takes_no_equal(admin_client, h100_fleet):
    fill_then_newer(admin_client, "LowerPriority")
    assert reclaim.run()["victims"] == 0


def test_borrow_within_cohort_takes_lower_priorities_up_to_the_threshold(admin_client, h100_fleet):
    """team-b (nominal 0: every claim borrows) with borrowWithinCohort LowerPriority, threshold 2; default
    borrows all 16 GPUs: 8 claims of priority 3, 4 of priority 2, 4 of priority 0. team-b's claims of priority
    5 take exactly the 8 of priority <= 2 and no more."""
    assert admin_client.patch("/api/v1/queues/default", {"spec": {"maxPriority": 10, "preemption": GRACE0}},
                              format="json").status_code == 200
    make(admin_client, queue_body("team-b", namespaces=["b"], gpus=0, maxPriority=10, preemption={
        **GRACE0, "borrowWithinCohort": {"policy": "LowerPriority", "maxPriorityThreshold": 2}}))
    for p, n in ((3, 8), (2, 4), (0, 4)):
        for i in range(n):
            submit(admin_client, "ci", f"p{p}-{i}", labels=prio(p))
    rounds(2)
    for i in range(12):
        submit(admin_client, "b", f"b{i}", labels=prio(5))
    rounds(1)
    for _ in range(3):
        reclaim.run()
        rounds(2)
    assert allocated("b") == 8
    assert preempted("ci") == {f"p2-{i}" for i in range(4)} | {f"p0-{i}" for i in range(4)}


def converge(admin_client, weights: tuple[int, int], past: float | None = None) -> tuple[int, int, Counter]:
    """fa and fb, nominal 0 each (both borrow everything), with both strategies and ``weights``: fa fills the
    16 GPUs with 16 one-GPU claims, then fb submits 16. Passes and rounds until nothing moves. ``past``: both
    remember their use (half-life a day), and fa has used ``past`` device-seconds before."""
    fair: dict = {"preemptionStrategies": ["LessThanOrEqualToFinalShare", "LessThanInitialShare"]}
    if past is not None:
        fair["halfLifeSeconds"] = 86400
    make(admin_client,
         queue_body("fa", namespaces=["fa"], gpus=0, weight=weights[0], fairSharing=fair, preemption=GRACE0),
         queue_body("fb", namespaces=["fb"], gpus=0, weight=weights[1], fairSharing=fair, preemption=GRACE0))
    if past is not None:
        from usage.models import DecayedUsage

        assert DecayedUsage.objects.filter(queue="fa").update(value=past, at=timezone.now()) == 1
    for i in range(16):
        submit(admin_client, "fa", f"a{i}")
    rounds(2)
    assert allocated("fa") == 16
    for i in range(16):
        submit(admin_client, "fb", f"b{i}")
    rounds(1)
    quiet = 0
    for _ in range(16):  # until two passes in a row move nothing (a pass may find none while rounds catch up)
        out = reclaim.run()
        rounds(2)
        quiet = 0 if out["victims"] or out["requeued"] else quiet + 1
        if quiet == 2:
            break
    noticed = Counter(Preemption.objects.values_list("victim_id", flat=True))
    return allocated("fa"), allocated("fb"), noticed


def test_fair_share_preemption_converges_to_an_equal_split_at_weights_1_to_1(admin_client, h100_fleet):
    a, b, noticed = converge(admin_client, (1, 1))
    assert (a, b) == (8, 8)
    assert max(noticed.values()) == 1 and sum(noticed.values()) == 8  # nobody preempted twice, none in vain
    assert reclaim.run()["victims"] == 0  # stable: fa's requeued claims take nothing back


def test_fair_share_preemption_converges_to_3_to_1_at_weights_1_to_3(admin_client, h100_fleet):
    a, b, noticed = converge(admin_client, (1, 3))
    assert (a, b) == (4, 12)
    assert max(noticed.values()) == 1 and sum(noticed.values()) == 12
    assert reclaim.run()["victims"] == 0


@pytest.mark.parametrize(("days", "split"), [(1, (2, 14)), (2, (0, 16))])
def test_a_queue_that_used_the_fleet_before_gives_way_further(admin_client, h100_fleet, days, split):
    """Both remember their use (half-life a day); fa used the whole fleet (C = 16 running, no nominal) for
    ``days`` days before. One day: fa's history is 16 x 86400 ln 2 / (16 x 86400) = ln 2, so with x GPUs of fb's
    running fa's share is (16 - x) / 32 + ln 2 / 2 and fb's x / 32: fb takes while (x + 1) / 32 <= (15 - x) / 32 +
    0.35 (to 13), then while strictly below fa's before (to 14), and fa takes nothing back. Two days: the history
    is more than the scale, clamped to 1, and fb takes all 16 (with no memory they meet at 8 and 8, above)."""
    a, b, noticed = converge(admin_client, (1, 1), past=days * 16 * 86400.0)
    assert (a, b) == split
    assert max(noticed.values()) == 1
    assert reclaim.run()["victims"] == 0


def test_without_strategies_a_borrowing_claim_preempts_nobody(admin_client, h100_fleet):
    make(admin_client, queue_body("fa", namespaces=["fa"], gpus=0, preemption=GRACE0),
         queue_body("fb", namespaces=["fb"], gpus=0, preemption=GRACE0))
    for i in range(16):
        submit(admin_client, "fa", f"a{i}")
    rounds(2)
    submit(admin_client, "fb", "b0")
    rounds(1)
    assert reclaim.run()["victims"] == 0
