"""The plan and conservative backfill, decided by in-process rounds (workers add nothing to these decisions):
a node held for a queue's 8-GPU head lends its idle GPUs to claims whose walltime ends before the head's
planned start, never to a claim without a walltime or one that would run past it; a backfilled claim's renewal
past that start is a 409; estimates come from the plan; a plan pass costs the same statements for 10 pending
claims as for 100."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from claims.models import Phase, ResourceClaim
from claims.services import claims as claim_services
from scheduler.models import PlannedStart
from scheduler.services import plan
from scheduler.services.allocation import allocate_round
from tests.claims.fleet import gpu_claim, load_fleet

pytestmark = [pytest.mark.django_db]

NS = "/api/v1/namespaces/a/resourceclaims"
TTL = "draservice.io/lease-ttl"


def submit(client, name: str, count: int = 1, ttl: str | None = None) -> None:
    meta = {"annotations": {TTL: ttl}} if ttl else {}
    resp = client.post(NS, gpu_claim(name, count, **meta), format="json")
    assert resp.status_code == 201, resp.content


def get(name: str) -> ResourceClaim:
    return ResourceClaim.objects.get(namespace__name="a", name=name)


@pytest.fixture
def held_node(admin_client):
    """One node of 8 GPUs: four 1-GPU claims run with a 300 s walltime, an 8-GPU head waits and holds the node
    with 4 GPUs idle; behind it a 60 s claim, a 600 s one and one with no walltime."""
    load_fleet({"c1": [("h100", 1)]})
    for i in range(4):
        submit(admin_client, f"run{i}", 1, "300s")
    allocate_round()
    assert all(get(f"run{i}").phase == Phase.ALLOCATED for i in range(4))
    submit(admin_client, "head", 8)
    for name, ttl in (("short", "60s"), ("long", "600s"), ("forever", None)):
        submit(admin_client, name, 1, ttl)
    allocate_round()
    # No plan yet: the hold keeps every later claim off the node, as before.
    assert {n: get(n).reason for n in ("head", "short", "long", "forever")} == {
        "head": "Unsatisfiable", "short": "HeldForQueueHead", "long": "HeldForQueueHead",
        "forever": "HeldForQueueHead"}
    return admin_client


def test_short_walltimes_backfill_a_held_node_and_end_before_the_heads_planned_start(held_node):
    done = plan.refresh(force=True)
    ends = max(get(f"run{i}").lease_expires_at for i in range(4))
    rows = {r.claim.name: r for r in PlannedStart.objects.select_related("claim")}
    assert set(rows) == {"head", "short", "long", "forever"}
    # The head starts when the last running walltime has ended and been swept, and a round has run.
    assert rows["head"].start_at == ends + plan.margin() and len(rows["head"].devices) == 8
    assert rows["short"].start_at == rows["short"].computed_at  # now: in the gap before the head
    assert rows["long"].start_at == rows["head"].end_at is None  # after the head, which never ends: never
    assert done is not None and done.planned == 2 and done.woken == 1  # "short" is decided again
    allocate_round()
    short, long_, forever = get("short"), get("long"), get("forever")
    assert short.phase == Phase.ALLOCATED and short.node == get("run0").node
    assert short.lease_expires_at + plan.margin() <= rows["head"].start_at
    mark = short.diagnostics["backfill"]
    assert mark["protects"] == "a/head" and mark["plannedStart"] == f"{rows['head'].start_at:%Y-%m-%dT%H:%M:%SZ}"
    assert (long_.phase, long_.reason) == (Phase.PENDING, "HeldForQueueHead")
    assert (forever.phase, forever.reason) == (Phase.PENDING, "HeldForQueueHead")


def test_a_backfilled_claims_renewal_past_the_planned_start_is_409_naming_it(held_node):
    plan.refresh(force=True)
    allocate_round()
    head_start = PlannedStart.objects.get(claim__name="head").start_at
    assert held_node.post(f"{NS}/short/renew", {"ttl": "120s"}, format="json").status_code == 200
    resp = held_node.post(f"{NS}/short/renew", {"ttl": "600s"}, format="json")
    assert resp.status_code == 409, resp.content
    assert f"{head_start:%Y-%m-%dT%H:%M:%SZ}" in resp.json()["detail"] and "a/head" in resp.json()["detail"]
    assert get("short").lease_seconds == 120  # the refused renewal changed nothing


def test_a_planned_claims_estimate_is_its_planned_start(held_node):
    plan.refresh(force=True)
    head_start = PlannedStart.objects.get(claim__name="head").start_at
    status = held_node.get(f"{NS}/head").json()["status"]
    assert status["estimatedStartTime"] == f"{head_start:%Y-%m-%dT%H:%M:%SZ}"
    assert "plan" in status["estimate"]["message"]


def test_the_head_starts_when_its_planned_start_comes(held_node):
    plan.refresh(force=True)
    allocate_round()
    start = PlannedStart.objects.get(claim__name="head").start_at
    # The first sweep after the last running walltime's end (the backfilled claim ended long before).
    sweep = max(get(f"run{i}").lease_expires_at for i in range(4)) + timedelta(seconds=plan.sweep_seconds())
    assert sweep < start
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(timezone, "now", lambda: sweep)
        assert claim_services.expire_leases() == 5
    allocate_round()
    head = get("head")
    # Started in the first round after the walltimes it was planned after: the backfilled claim was gone.
    assert head.phase == Phase.ALLOCATED, (head.reason, head.message)
    assert get("short").reason == "LeaseExpired"


def test_a_plan_pass_costs_the_same_statements_for_10_and_100_pending(admin_client):
    load_fleet({"c1": [("h100", 1)]})
    submit(admin_client, "big", 8, "300s")
    allocate_round()
    counts = []
    for total in (10, 100):
        while ResourceClaim.objects.filter(phase=Phase.PENDING).count() < total:
            n = ResourceClaim.objects.count()
            submit(admin_client, f"w{n}", 1, "60s")
        allocate_round()  # the plan covers claims a round has decided (they wait: "big" holds the node)
        plan.refresh(force=True)  # the engine and the fleet view are warm: count a steady pass
        with CaptureQueriesContext(connection) as ctx:
            done = plan.refresh(force=True)
        # planDepth 10: eight start when "big" has ended, two when the first of those eight have.
        assert done is not None and done.planned == 10
        first = get("big").lease_expires_at + plan.margin()
        starts = sorted(PlannedStart.objects.values_list("start_at", flat=True))
        assert starts == [first] * 8 + [first + timedelta(seconds=60) + plan.margin()] * 2
        counts.append(len(ctx.captured_queries))
    assert counts[0] == counts[1], counts


def test_a_claim_no_round_has_decided_is_not_planned_yet(admin_client):
    """A plan pass must not be the first to pay for a new claim's selectors (a round decides it first, within
    its cost budget): a claim created without a round is left out of the plan until a round has decided it."""
    load_fleet({"c1": [("h100", 1)]})
    submit(admin_client, "big", 8, "300s")
    allocate_round()
    submit(admin_client, "new", 1, "60s")
    ResourceClaim.objects.filter(name="new").update(attempts=0, attempted_version=None)  # as if never taken
    plan.refresh(force=True)
    assert not PlannedStart.objects.filter(claim__name="new").exists()
    allocate_round()
    assert get("new").attempts == 1 and get("new").phase == Phase.PENDING
    plan.refresh(force=True)
    assert PlannedStart.objects.get(claim__name="new").start_at == get("big").lease_expires_at + plan.margin()
