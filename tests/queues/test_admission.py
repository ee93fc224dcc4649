"""Admission at commit, in this process (the claims round and the gang worker called directly): quota in
devices, borrowing and lending limits, a parent bounding its subtree, NoQuotaForClass, QueueDoesNotExist,
default borrowing idle capacity, a quota-blocked claim blocking no other queue, gangs admitted whole, the
order inside and among queues, positionInQueue, and the claim-side bad inputs."""
from __future__ import annotations

import pytest

from claims.models import DeviceAllocation, Phase, ResourceClaim
from claims.services import claims as claim_services
from claims.services import templates as template_services
from queues.models import QuotaCharge
from scheduler.services.allocation import allocate_round
from tests.claims.fleet import gpu_claim
from tests.queues.conftest import queue_body

pytestmark = pytest.mark.django_db

Q = "/api/v1/queues"


def ns(name: str) -> str:
    return f"/api/v1/namespaces/{name}"


def submit(client, namespace: str, name: str, count: int = 1, labels: dict | None = None, **kw) -> dict:
    meta = {"labels": labels} if labels else {}
    resp = client.post(f"{ns(namespace)}/resourceclaims", gpu_claim(name, count, **meta, **kw), format="json")
    assert resp.status_code == 201, resp.content
    return resp.json()


def rounds(n: int = 3) -> None:
    for _ in range(n):
        allocate_round()


def phases(namespace: str | None = None) -> dict[str, str]:
    qs = ResourceClaim.objects.all() if namespace is None else ResourceClaim.objects.filter(namespace__name=namespace)
    return dict(qs.values_list("name", "phase"))


def condition(claim: ResourceClaim, type_: str) -> dict | None:
    return next((c for c in claim.conditions or [] if c["type"] == type_), None)


def make(client, *bodies) -> None:
    for body in bodies:
        resp = client.post(Q, body, format="json")
        assert resp.status_code == 201, resp.content


def test_nominal_quota_holds_and_a_release_gives_it_back(admin_client, h100_fleet):
    make(admin_client, queue_body("team-a", namespaces=["a"], gpus=4, borrowing=0))
    for i in range(6):
        submit(admin_client, "a", f"c{i}")
    rounds()
    got = phases("a")
    assert sorted(got.values()).count(Phase.ALLOCATED) == 4, got
    waiting = ResourceClaim.objects.filter(namespace__name="a", phase=Phase.PENDING)
    assert {c.reason for c in waiting} == {"WaitingForQuota"}
    for c in waiting:
        cond = condition(c, "QuotaReserved")
        assert cond["status"] == "False" and cond["reason"] == "WaitingForQuota"
        assert "borrowingLimit 0" in c.message
        assert not DeviceAllocation.objects.filter(claim=c).exists()  # holds nothing
    admitted = ResourceClaim.objects.filter(namespace__name="a", phase=Phase.ALLOCATED).first()
    assert condition(admitted, "QuotaReserved")["reason"] == "Admitted"
    assert QuotaCharge.objects.filter(claim=admitted, unit="devices").get().amount == 1
    # A release gives its quota back: one more is admitted.
    claim_services.release_claim(admitted.id)
    rounds()
    assert sorted(phases("a").values()).count(Phase.ALLOCATED) == 4
    assert ResourceClaim.objects.filter(namespace__name="a", phase=Phase.PENDING).count() == 1


def test_default_borrows_idle_capacity_and_a_team_within_nominal_still_fits(admin_client, h100_fleet):
    make(admin_client, queue_body("team-a", namespaces=["a"], gpus=8))
    for i in range(3):
        submit(admin_client, "ci", f"ci{i}", 4)  # unlisted namespace: the default queue, which borrows
    rounds()
    assert sorted(phases("ci").values()) == [Phase.ALLOCATED] * 3
    resp = admin_client.get(f"{ns('ci')}/resourceclaims/ci0")
    assert resp.json()["status"]["queue"] == "default"
    submit(admin_client, "a", "a0", 4)
    rounds()
    assert phases("a") == {"a0": Phase.ALLOCATED}


def test_borrowing_limit_and_lending_limit(admin_client, h100_fleet):
    # team-a keeps 8 - 4 = 4 of its nominal for itself; team-b may borrow at most 10 beyond its nominal 1.
    make(admin_client, queue_body("team-a", namespaces=["a"], gpus=8, lending=4),
         queue_body("team-b", namespaces=["b"], gpus=1, borrowing=10))
    for i in range(16):
        submit(admin_client, "b", f"b{i}")
    rounds(4)
    # 16 GPUs in the fleet, 4 kept for team-a: team-b gets 12? No: its borrowingLimit caps it at 1 + 10 = 11.
    assert sorted(phases("b").values()).count(Phase.ALLOCATED) == 11
    admin_client.patch(f"{Q}/team-b", {"spec": {"quotas": [{"deviceClassName": "gpu.nvidia.com",
                                                             "devices": {"nominal": 1}}]}}, format="json")
    rounds(4)
    # Unlimited borrowing now: everything but the 4 GPUs team-a keeps.
    assert sorted(phases("b").values()).count(Phase.ALLOCATED) == 12
    pending = ResourceClaim.objects.filter(namespace__name="b", phase=Phase.PENDING).first()
    assert pending.reason == "WaitingForQuota" and "keep for themselves" in pending.message
    for i in range(4):
        submit(admin_client, "a", f"a{i}")
    rounds()
    assert sorted(phases("a").values()) == [Phase.ALLOCATED] * 4


def test_a_parent_bounds_its_subtree(admin_client, h100_fleet):
    make(admin_client, queue_body("org", gpus=6, borrowing=0),
         queue_body("team-a", parent="org", namespaces=["a"], gpus=4),
         queue_body("team-b", parent="org", namespaces=["b"], gpus=2))
    for i in range(5):
        submit(admin_client, "a", f"a{i}")
        submit(admin_client, "b", f"b{i}")
    rounds(4)
    assert list(phases().values()).count(Phase.ALLOCATED) == 6
    body = admin_client.get(f"{Q}/org").json()
    assert body["status"]["usage"] == [{"deviceClassName": "gpu.nvidia.com", "unit": "devices", "used": 6}]


def test_no_quota_for_class_and_queue_does_not_exist(admin_client, h100_fleet):
    make(admin_client, queue_body("team-a", namespaces=["a"], quotas=[
        {"deviceClassName": "mig.nvidia.com", "devices": {"nominal": 4}}]))
    submit(admin_client, "a", "gpu")
    # A queue named by label that nobody created yet: the claim waits for it.
    submit(admin_client, "x", "later", labels={"draservice.io/queue": "team-x"})
    rounds()
    gpu = ResourceClaim.objects.get(name="gpu")
    assert gpu.phase == Phase.PENDING and gpu.reason == "NoQuotaForClass"
    assert condition(gpu, "QuotaReserved")["reason"] == "NoQuotaForClass"
    later = ResourceClaim.objects.get(name="later")
    assert later.phase == Phase.PENDING and later.reason == "QueueDoesNotExist"
    make(admin_client, queue_body("team-x", namespaces=["x"], gpus=1))
    rounds()
    assert ResourceClaim.objects.get(name="later").phase == Phase.ALLOCATED


def test_a_quota_blocked_claim_blocks_no_other_queue(admin_client, h100_fleet):
    # team-b borrows everything it holds (nominal 0): a queue whose next claim fits within its nominal goes
    # first, so for "big" (over its quota) to be tried before b-second, b-second must borrow as well.
    make(admin_client, queue_body("team-a", namespaces=["a"], gpus=1, borrowing=0),
         queue_body("team-b", namespaces=["b"], gpus=0))
    submit(admin_client, "b", "b-first", 8)
    rounds(1)  # one node of two is full
    submit(admin_client, "a", "big", 8)  # tried first, placed by the engine on the last node, refused by quota
    submit(admin_client, "b", "b-second", 8)  # needs that node: not there in the round that refused "big"
    allocate_round()
    assert ResourceClaim.objects.get(name="big").reason == "WaitingForQuota"
    assert ResourceClaim.objects.get(name="b-second").phase == Phase.PENDING
    allocate_round()  # the next round: "big" is not retried before the fleet changes; b-second gets the node
    assert ResourceClaim.objects.get(name="b-second").phase == Phase.ALLOCATED
    assert ResourceClaim.objects.get(name="big").phase == Phase.PENDING


def test_priority_then_age_and_position_in_queue(admin_client, h100_fleet):
    make(admin_client, queue_body("team-a", namespaces=["a"], gpus=16, maxPriority=10))
    submit(admin_client, "a", "hog0", 8)
    submit(admin_client, "a", "hog1", 8)
    rounds(1)
    for name, prio in (("low", None), ("high", "5"), ("mid", "1"), ("low2", None)):
        submit(admin_client, "a", name, 4, labels={"draservice.io/priority": prio} if prio else None)
    rounds(1)
    listed = admin_client.get(f"{ns('a')}/resourceclaims").json()["items"]
    pos = {c["metadata"]["name"]: c["status"].get("positionInQueue") for c in listed}
    assert pos == {"hog0": None, "hog1": None, "high": 1, "mid": 2, "low": 3, "low2": 4}
    assert all(c["status"]["queue"] == "team-a" for c in listed)
    claim_services.release_claim(ResourceClaim.objects.get(name="hog0").id)
    rounds(1)  # 8 GPUs free: the two of higher priority, although younger
    got = phases("a")
    assert (got["high"], got["mid"], got["low"], got["low2"]) == (Phase.ALLOCATED, Phase.ALLOCATED,
                                                                  Phase.PENDING, Phase.PENDING)


def test_position_drops_by_exactly_one_when_the_head_is_admitted(admin_client, h100_fleet):
    make(admin_client, queue_body("team-a", namespaces=["a"], gpus=4, borrowing=0))
    for i in range(4):
        submit(admin_client, "a", f"run{i}")
    rounds()
    for i in range(5):
        submit(admin_client, "a", f"wait{i}")
    rounds()
    before = {f"wait{i}": admin_client.get(f"{ns('a')}/resourceclaims/wait{i}").json()["status"]["positionInQueue"]
              for i in range(5)}
    assert before == {f"wait{i}": i + 1 for i in range(5)}
    claim_services.release_claim(ResourceClaim.objects.get(name="run0").id)
    rounds()
    assert phases("a")["wait0"] == Phase.ALLOCATED
    after = {f"wait{i}": admin_client.get(f"{ns('a')}/resourceclaims/wait{i}").json()["status"].get("positionInQueue")
             for i in range(5)}
    assert after == {"wait0": None, **{f"wait{i}": before[f"wait{i}"] - 1 for i in range(1, 5)}}


def test_claim_side_bad_inputs(admin_client, h100_fleet):
    make(admin_client, queue_body("team-a", namespaces=["a"], gpus=4, maxPriority=3),
         queue_body("team-b", namespaces=["b"], gpus=4))
    cases = [
        ("b", {"draservice.io/queue": "team-a"}, "metadata.labels[draservice.io/queue]", "may not use queue"),
        ("b", {"kueue.x-k8s.io/queue-name": "team-a"}, "metadata.labels[kueue.x-k8s.io/queue-name]", "may not use"),
        ("b", {"kai.scheduler/queue": "team-a"}, "metadata.labels[kai.scheduler/queue]", "may not use"),
        ("a", {"draservice.io/priority": "4"}, "metadata.labels[draservice.io/priority]", "over the maxPriority"),
        ("a", {"draservice.io/priority": "high"}, "metadata.labels[draservice.io/priority]", "must be an integer"),
    ]
    for namespace, labels, field, words in cases:
        resp = admin_client.post(f"{ns(namespace)}/resourceclaims", gpu_claim("bad", 1, labels=labels),
                                 format="json")
        assert resp.status_code == 422, (labels, resp.content)
        errors = {e["field"]: e["reason"] for e in resp.json()["errors"]}
        assert words in errors.get(field, ""), errors
    assert not ResourceClaim.objects.filter(name="bad").exists()
    # Its own queue by label, and a priority within the cap, are fine.
    submit(admin_client, "a", "ok", labels={"draservice.io/queue": "team-a", "draservice.io/priority": "3"})


def test_mixed_queues_in_one_consumer_is_422(admin_client, h100_fleet):
    make(admin_client, queue_body("team-a", namespaces=["a"], gpus=4))
    submit(admin_client, "a", "x1")  # team-a, its namespace's queue
    submit(admin_client, "a", "x2", labels={"draservice.io/queue": "default"})  # anyone may name default
    body = {"apiVersion": "draservice.io/v1alpha1", "kind": "Consumer", "metadata": {"name": "pod"},
            "spec": {"resourceClaims": [{"name": "one", "resourceClaimName": "x1"},
                                        {"name": "two", "resourceClaimName": "x2"}]}}
    resp = admin_client.post(f"{ns('a')}/consumers", body, format="json")
    assert resp.status_code == 422, resp.content
    assert "must all belong to one queue" in resp.json()["detail"]
    assert "default, team-a" in resp.json()["detail"]
    body["spec"]["resourceClaims"].pop()
    resp = admin_client.post(f"{ns('a')}/consumers", body, format="json")
    assert resp.status_code == 201
    assert resp.json()["status"]["queue"] == "team-a" and resp.json()["status"]["positionInQueue"] == 1


def test_a_gang_is_admitted_whole_or_not_at_all(admin_client, h100_fleet):
    from gangs.models import Gang, GangPhase
    from scheduler.services.gang_placement import place_next
    from tests.gangs.fleet import gang_body, template_body

    make(admin_client, queue_body("team-a", namespaces=["a"], gpus=6, borrowing=0))
    template_services.create_template("a", template_body("h100x4", 4))
    resp = admin_client.post(f"{ns('a')}/gangs", gang_body("train", 2, template="h100x4", required=None,
                                                           preferred=None), format="json")
    assert resp.status_code == 201, resp.content
    place_next()
    gang = Gang.objects.get(name="train")
    assert gang.phase == GangPhase.PENDING and gang.reason == "WaitingForQuota", (gang.reason, gang.message)
    assert DeviceAllocation.objects.count() == 0 and QuotaCharge.objects.count() == 0  # not one member
    st = admin_client.get(f"{ns('a')}/gangs/train").json()["status"]
    assert st["queue"] == "team-a" and st["positionInQueue"] == 1, st
    admin_client.patch(f"{Q}/team-a", {"spec": {"quotas": [{"deviceClassName": "gpu.nvidia.com",
                                                             "devices": {"nominal": 8, "borrowingLimit": 0}}]}},
                       format="json")
    place_next()
    gang.refresh_from_db()
    assert gang.phase == GangPhase.PLACED, (gang.reason, gang.message)
    assert DeviceAllocation.objects.count() == 8
    assert sum(c.amount for c in QuotaCharge.objects.all()) == 8


def test_an_8_gpu_head_is_not_starved_by_a_stream_of_1_gpu_claims(admin_client, h100_fleet):
    import random

    for i in range(16):
        submit(admin_client, "ci", f"run{i}")
    rounds(1)
    assert list(phases("ci").values()).count(Phase.ALLOCATED) == 16
    where = dict(ResourceClaim.objects.values_list("name", "node"))
    submit(admin_client, "ci", "big", 8)
    rng = random.Random(3)
    running = [f"run{i}" for i in range(16)]
    rng.shuffle(running)
    for i, name in enumerate(running):
        # One GPU frees, a new 1-GPU claim arrives, a round runs: the stream never stops.
        claim_services.release_claim(ResourceClaim.objects.get(name=name).id)
        submit(admin_client, "ci", f"stream{i}")
        rounds(1)
        if ResourceClaim.objects.get(name="big").phase == Phase.ALLOCATED:
            break
    big = ResourceClaim.objects.get(name="big")
    assert big.phase == Phase.ALLOCATED, (big.reason, big.message)
    # Small claims waited for the head (the trail says so) rather than take its node, and the head started in
    # the round its node's last running claim ended -- while the stream kept using the other node's GPUs.
    from claims.models import ClaimEvent

    assert ClaimEvent.objects.filter(reason="HeldForQueueHead").exists()
    assert not ResourceClaim.objects.filter(name__startswith="stream", node=big.node).exists()
    assert i == max(running.index(name) for name in running if where[name] == big.node)
    assert ResourceClaim.objects.filter(name__startswith="stream", phase=Phase.ALLOCATED).count() >= 7


def test_deleting_a_queue_that_holds_claims_is_409_unless_forced(admin_client, h100_fleet):
    make(admin_client, queue_body("team-a", namespaces=["a"], gpus=2, borrowing=0))
    submit(admin_client, "a", "held")
    submit(admin_client, "b", "named", labels={"draservice.io/queue": "default"})
    rounds(1)
    resp = admin_client.delete(f"{Q}/team-a")
    assert resp.status_code == 409 and "?force=true" in resp.json()["detail"]
    assert admin_client.get(f"{Q}/team-a").status_code == 200
    assert admin_client.delete(f"{Q}/team-a?force=true").status_code == 204
    # The claim and its charge moved to default.
    assert admin_client.get(f"{ns('a')}/resourceclaims/held").json()["status"]["queue"] == "default"
    assert QuotaCharge.objects.get(claim__name="held").queue.name == "default"
    usage = admin_client.get(f"{Q}/default").json()["status"]["usage"]
    assert usage == [{"deviceClassName": "gpu.nvidia.com", "unit": "devices", "used": 2}]  # with "named"


def test_start_time_estimates_from_leases(admin_client, h100_fleet):
    from datetime import UTC, datetime, timedelta

    from django.utils import timezone

    submit(admin_client, "ci", "r10", 8, annotations={"draservice.io/lease-ttl": "10m"})
    submit(admin_client, "ci", "r20", 8, annotations={"draservice.io/lease-ttl": "20m"})
    rounds(1)
    for name in ("p1", "p2", "p3"):
        submit(admin_client, "ci", name, 8)
    rounds(1)

    def status(name):
        return admin_client.get(f"{ns('ci')}/resourceclaims/{name}").json()["status"]

    def minutes(st):
        when = datetime.strptime(st["estimatedStartTime"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        return (when - timezone.now()) / timedelta(minutes=1)

    p1, p2, p3 = status("p1"), status("p2"), status("p3")
    assert (p1["positionInQueue"], p2["positionInQueue"], p3["positionInQueue"]) == (1, 2, 3)
    assert 9 <= minutes(p1) <= 10.1 and 19 <= minutes(p2) <= 20.1, (p1, p2)
    assert "free the 8 gpu.nvidia.com devices" in p1["estimate"]["message"]
    assert p3["estimate"]["reason"] == "NotEnoughRunningClaims" and "estimatedStartTime" not in p3


def test_no_estimate_without_leases_or_history(admin_client, h100_fleet):
    submit(admin_client, "ci", "r0", 8)
    submit(admin_client, "ci", "r1", 8)
    rounds(1)
    submit(admin_client, "ci", "p", 8)
    rounds(1)
    st = admin_client.get(f"{ns('ci')}/resourceclaims/p").json()["status"]
    assert st["estimate"]["reason"] == "NoLeaseOrHistory" and "estimatedStartTime" not in st


def test_labels_of_an_existing_claim_follow_the_rules_and_an_admitted_claim_keeps_its_queue(admin_client,
                                                                                             h100_fleet):
    make(admin_client, queue_body("team-a", namespaces=["a"], gpus=4, maxPriority=2),
         queue_body("team-b", namespaces=["b"], gpus=4))
    submit(admin_client, "a", "c")
    url = f"{ns('a')}/resourceclaims/c"

    def put(labels):
        body = admin_client.get(url).json()
        body["metadata"]["labels"] = labels
        return admin_client.put(url, body, format="json")

    assert put({"draservice.io/priority": "3"}).status_code == 422  # over maxPriority
    resp = put({"draservice.io/queue": "team-b"})  # a queue its namespace may not use
    assert resp.status_code == 422 and "may not use" in resp.json()["detail"]
    assert put({"draservice.io/priority": "2"}).status_code == 200
    rounds(1)
    assert phases("a")["c"] == Phase.ALLOCATED
    resp = put({"draservice.io/queue": "default"})  # admitted: its queue is fixed
    assert resp.status_code == 422 and "cannot change until it is released" in resp.json()["detail"]
    assert put({"draservice.io/priority": "2", "team": "x"}).status_code == 200  # other labels may change


def test_mixed_queues_in_one_gang_is_422(admin_client, h100_fleet):
    from gangs.models import Gang

    make(admin_client, queue_body("team-a", namespaces=["a"], gpus=8))
    submit(admin_client, "a", "mine")  # team-a
    submit(admin_client, "a", "elsewhere", labels={"draservice.io/queue": "default"})
    body = {"metadata": {"name": "mixed"}, "spec": {"members": [
        {"name": "m0", "resourceClaims": [{"name": "gpus", "resourceClaimName": "mine"}]},
        {"name": "m1", "resourceClaims": [{"name": "gpus", "resourceClaimName": "elsewhere"}]}]}}
    resp = admin_client.post(f"{ns('a')}/gangs", body, format="json")
    assert resp.status_code == 422, resp.content
    assert "must all belong to one queue" in resp.json()["detail"]
    assert not Gang.objects.exists()


def test_prometheus_per_queue_metrics(admin_client, h100_fleet):
    make(admin_client, queue_body("team-a", namespaces=["a"], gpus=2))
    for i in range(3):
        submit(admin_client, "a", f"c{i}")
    submit(admin_client, "a", "big", 16)  # cannot fit anywhere: stays pending
    rounds(1)
    text = admin_client.get("/metrics").content.decode()
    key = 'device_class="gpu.nvidia.com",queue="team-a",resource="",unit="devices"'
    assert f"draservice_queue_nominal{{{key}}} 2.0" in text
    assert f"draservice_queue_used{{{key}}} 3.0" in text
    assert f"draservice_queue_borrowed{{{key}}} 1.0" in text
    assert 'draservice_queue_pending_claims{queue="team-a"} 1.0' in text
    assert 'draservice_queue_dominant_share{queue="team-a"}' in text


def test_explain_says_the_place_in_the_queue_and_the_estimate(admin_client, h100_fleet):
    make(admin_client, queue_body("team-a", namespaces=["a"], gpus=16))
    submit(admin_client, "a", "r0", 8, annotations={"draservice.io/lease-ttl": "10m"})
    submit(admin_client, "a", "r1", 8, annotations={"draservice.io/lease-ttl": "20m"})
    rounds(1)
    submit(admin_client, "a", "p1", 8)
    submit(admin_client, "a", "p2", 8)
    rounds(1)
    out = admin_client.get(f"{ns('a')}/resourceclaims/p2/explain").json()
    summary = out["queue"]["summary"]
    assert summary.startswith("position 2 in team-a; about ") and "free the 16 gpu.nvidia.com devices" in summary


def test_a_claim_kept_off_a_queue_heads_node_is_placed_on_another_free_node(admin_client, h100_fleet):
    """The liveness gap of the race test (issue 14): a 1-GPU claim that the engine placed first-fit on the
    node held for the queue's head was only undone and left to wait for some release, while another node had
    a free GPU -- which then stayed idle for as long as nothing was released. The claim must go there."""
    for i in range(16):
        submit(admin_client, "ci", f"run{i}")
    rounds(1)
    held = dict(ResourceClaim.objects.values_list("name", "node"))
    nodes = sorted(set(held.values()))
    assert len(nodes) == 2
    # One GPU free on each node: a 2-GPU claim fits nowhere; a 1-GPU claim fits on either.
    for node in nodes:
        name = next(n for n, where in sorted(held.items()) if where == node)
        claim_services.release_claim(ResourceClaim.objects.get(name=name).id)
    submit(admin_client, "ci", "big", 2)
    submit(admin_client, "ci", "small")
    rounds(1)
    big, small = ResourceClaim.objects.get(name="big"), ResourceClaim.objects.get(name="small")
    assert big.phase == Phase.PENDING
    assert small.phase == Phase.ALLOCATED, (small.reason, small.message)
    # The head's node (the first in the engine's order, so the one the small claim was first put on) keeps its
    # free GPU for the head.
    assert small.node == nodes[1], small.node


def test_the_heads_node_stays_held_in_rounds_that_do_not_decide_the_head(admin_client, h100_fleet):
    """Claims arrive between releases, so most rounds decide only new claims, not the waiting head (it is
    woken by releases). Its node must stay held across those rounds, or the stream takes every GPU freed there
    and the 8-GPU head waits for ever."""
    import random

    for i in range(16):
        submit(admin_client, "ci", f"run{i}")
    rounds(1)
    where = dict(ResourceClaim.objects.values_list("name", "node"))
    submit(admin_client, "ci", "big", 8)
    rounds(1)
    running = [f"run{i}" for i in range(16)]
    random.Random(3).shuffle(running)
    for i, name in enumerate(running):
        claim_services.release_claim(ResourceClaim.objects.get(name=name).id)
        rounds(1)  # decides the woken head (and holds its node again)
        submit(admin_client, "ci", f"stream{i}")
        rounds(1)  # decides only the new claim
        if ResourceClaim.objects.get(name="big").phase == Phase.ALLOCATED:
            break
    big = ResourceClaim.objects.get(name="big")
    assert big.phase == Phase.ALLOCATED, (big.reason, big.message)
    assert not ResourceClaim.objects.filter(name__startswith="stream", node=big.node).exists()
    assert i == max(running.index(name) for name in running if where[name] == big.node)


def test_commits_without_quota_share_the_root_lock_and_a_quota_check_excludes_them(admin_client, h100_fleet):
    """Admission takes the root lock shared where no queue of the chains has a quota (it admits what it was
    given): commits of two workers in ``default`` do not wait for each other. One that reads usage (a queue
    with quota) takes it exclusive: it waits for a commit in flight that charges, and is never overtaken."""
    from django.db import OperationalError, connection, connections, transaction

    from queues.services import admission
    from queues.services.resolve import Tree

    make(admin_client, queue_body("team-a", namespaces=["a"], gpus=4, borrowing=0))
    other = connections.create_connection("default")  # another worker, in the middle of a commit in default
    try:
        other.set_autocommit(False)
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock_shared(%s)", [admission.ROOT_LOCK])

        def lock(queue: str) -> bool:
            try:
                with transaction.atomic(), connection.cursor() as cursor:
                    cursor.execute("SET LOCAL lock_timeout = '300ms'")
                    admission._lock(Tree.load(), {queue})
                return True
            except OperationalError:
                return False

        assert lock("default")  # shared with the commit in flight
        assert not lock("team-a")  # exclusive: waits for it
        other.rollback()
        assert lock("team-a")
    finally:
        other.close()


def test_quota_goes_by_priority_across_clusters_decided_in_separate_turns(admin_client, settings):
    """A round decides and commits per cluster (scheduler.services.turns), but a queue's quota must still go in
    queue order: a low-priority claim on one cluster may not take the quota a higher one on another cluster
    needs, because its cluster's part happened to commit first."""
    from tests.claims import fleet as fleet_helpers

    settings.CLAIMS_CLUSTER_TURNS = True
    fleet_helpers.load_fleet({"ca": [("h100", 1)], "cb": [("l4", 1)]})
    make(admin_client, queue_body("team-a", namespaces=["a"], gpus=2, borrowing=0, maxPriority=10))
    hopper = 'device.attributes["gpu.nvidia.com"].architecture == "Hopper"'
    ada = 'device.attributes["gpu.nvidia.com"].architecture == "Ada Lovelace"'
    for name, prio, selector in (("high-ca", "9", hopper), ("mid-cb", "5", ada), ("low-ca", "1", hopper)):
        body = gpu_claim(name, labels={"draservice.io/priority": prio})
        body["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [{"cel": {"expression": selector}}]
        resp = admin_client.post(f"{ns('a')}/resourceclaims", body, format="json")
        assert resp.status_code == 201, resp.content
    result = allocate_round()
    assert result.parts >= 1
    got = phases("a")
    assert (got["high-ca"], got["mid-cb"], got["low-ca"]) == (Phase.ALLOCATED, Phase.ALLOCATED, Phase.PENDING), got
    assert ResourceClaim.objects.get(name="low-ca").reason == "WaitingForQuota"


def test_estimates_read_the_running_claims_again_only_when_allocations_change(admin_client, h100_fleet):
    """A pending claim's estimate is polled: what it needs of the running claims is kept per process and read
    again when a release or a new charge may have changed it (not on every read)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    submit(admin_client, "ci", "r10", 8, annotations={"draservice.io/lease-ttl": "10m"})
    submit(admin_client, "ci", "r20", 8, annotations={"draservice.io/lease-ttl": "20m"})
    rounds(1)
    submit(admin_client, "ci", "p1", 8)
    submit(admin_client, "ci", "p2", 8)
    rounds(1)

    def status(name):
        return admin_client.get(f"{ns('ci')}/resourceclaims/{name}").json()["status"]

    def running_reads(ctx) -> int:
        return sum('FROM "queues_quotacharge"' in q["sql"] and '"amount"' in q["sql"] for q in ctx.captured_queries)

    assert "estimatedStartTime" in status("p2")  # both running claims end before it starts
    with CaptureQueriesContext(connection) as ctx:
        again = status("p2")
    assert "estimatedStartTime" in again and running_reads(ctx) == 0
    claim_services.release_claim(ResourceClaim.objects.get(name="r20").id)  # no round: p1, p2 still wait
    with CaptureQueriesContext(connection) as ctx:
        after = status("p2")
    assert running_reads(ctx) == 1
    assert after["estimate"]["reason"] == "NotEnoughRunningClaims" and "estimatedStartTime" not in after
