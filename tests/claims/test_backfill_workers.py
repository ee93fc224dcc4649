"""Conservative backfill with real Celery workers on PostgreSQL: a node held for an 8-GPU head lends its idle
GPUs to a claim whose walltime ends before the head's planned start (the plan pass after a round starts it),
not to a claim without a walltime; the backfilled claim's renewal past the planned start is a 409; the head
starts by its planned start. The lease sweep is sent as the beat sends it (more often, to keep it short)."""
from __future__ import annotations

import pytest

from claims.models import Phase
from scheduler.models import PlannedStart
from tests.claims.fleet import load_fleet
from tests.claims.test_walltime import NS, claim, post, wait_for

pytestmark = [pytest.mark.django_db(transaction=True)]
TTL = "draservice.io/lease-ttl"


def test_a_short_walltime_backfills_a_held_node_and_the_head_starts_on_plan(admin_client, live_broker):
    load_fleet({"c1": [("h100", 1)]})  # one node, 8 GPUs
    post(admin_client, "run", 4, **{TTL: "20s"})
    wait_for(lambda: claim("run").phase == Phase.ALLOCATED, 20)
    post(admin_client, "head", 8)
    wait_for(lambda: claim("head").reason == "Unsatisfiable", 20)
    post(admin_client, "forever", 1)
    post(admin_client, "short", 1, **{TTL: "5s"})

    wait_for(lambda: claim("short").phase == Phase.ALLOCATED, 20)
    planned = PlannedStart.objects.get(claim__name="head").start_at
    short = claim("short")
    assert short.diagnostics["backfill"]["protects"] == "team-a/head"
    assert short.lease_expires_at < planned
    # Its renewal past the head's planned start is refused, naming it; a renewal within it is fine.
    resp = admin_client.post(f"{NS}/short/renew", {"ttl": "60s"}, format="json")
    assert resp.status_code == 409 and f"{planned:%Y-%m-%dT%H:%M:%SZ}" in resp.json()["detail"], resp.content
    assert admin_client.post(f"{NS}/short/renew", {"ttl": "6s"}, format="json").status_code == 200
    forever = claim("forever")
    assert (forever.phase, forever.reason) == (Phase.PENDING, "HeldForQueueHead")

    wait_for(lambda: claim("head").phase == Phase.ALLOCATED, 40)
    head, short = claim("head"), claim("short")
    assert short.reason == "LeaseExpired" and short.released_at < head.allocated_at
    assert head.allocated_at <= planned  # 0 heads delayed
    assert claim("forever").phase == Phase.PENDING


def test_planned_devices_off_the_held_nodes_go_only_to_claims_that_end_before_the_planned_start(admin_client,
                                                                                                live_broker):
    load_fleet({"c1": [("h100", 2)]})  # two nodes, 8 GPUs each
    post(admin_client, "a", 4, **{TTL: "90s"})
    wait_for(lambda: claim("a").phase == Phase.ALLOCATED, 20)
    post(admin_client, "b", 6, **{TTL: "30s"})  # the other node: 2 GPUs left there
    wait_for(lambda: claim("b").phase == Phase.ALLOCATED, 20)
    x, y = claim("a").node, claim("b").node
    assert x != y
    # The 8-GPU head holds the node with the most free GPUs (a's), but is planned on b's, free first.
    post(admin_client, "head", 8)
    wait_for(lambda: PlannedStart.objects.filter(claim__name="head", node=y).exists(), 30)
    planned = PlannedStart.objects.get(claim__name="head").start_at
    post(admin_client, "fill", 4, **{TTL: "60s"})  # backfills the held node: nothing is planned there
    wait_for(lambda: claim("fill").phase == Phase.ALLOCATED, 20)
    assert claim("fill").node == x

    # Now only the planned node has room: a claim running past the head's planned start may not take it...
    post(admin_client, "long", 1, **{TTL: "120s"})
    wait_for(lambda: claim("long").reason == "HeldForQueueHead", 20)
    assert "planned for a claim" in claim("long").message
    # ...one that ends before it may, and its renewal past that start is refused.
    post(admin_client, "short", 1, **{TTL: "5s"})
    wait_for(lambda: claim("short").phase == Phase.ALLOCATED, 20)
    short = claim("short")
    assert short.node == y and short.diagnostics["backfill"]["protects"] == "team-a/head"
    assert admin_client.post(f"{NS}/short/renew", {"ttl": "120s"}, format="json").status_code == 409
    assert claim("long").phase == Phase.PENDING

    wait_for(lambda: claim("head").phase == Phase.ALLOCATED, 60)
    head = claim("head")
    assert head.node == y and head.allocated_at <= planned  # not delayed
    assert claim("short").released_at < head.allocated_at
    assert claim("long").phase == Phase.PENDING  # no room left anywhere: a and fill still run
