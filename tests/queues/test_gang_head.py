"""A gang at the head of its queue holds every node its members need (issue 30, "heads, single claims and gangs
alike"): no later claim of a queue above its nominal takes a device there, the gang is placed in the round its
last device frees, and a head that borrows does not block another queue's within-nominal claims. Real rounds
and gang placements in this process."""
from __future__ import annotations

import random

import pytest

from claims.models import ClaimEvent, Phase, ResourceClaim
from claims.services import claims as claim_services
from gangs.models import Gang, GangPhase
from tests.queues.conftest import queue_body
from tests.queues.test_admission import make, rounds, submit
from tests.queues.test_gang_victims import gang, place_gangs

pytestmark = pytest.mark.django_db

NODES = [["c1", "c1-h100-000"], ["c1", "c1-h100-001"]]
NO_RECLAIM = {"reclaimBorrowed": "Never", "withinQueue": "Never"}


def fleet_full_then_gang(client, g_nominal: int) -> list[str]:
    """``default`` (nominal 0) runs 16 one-GPU claims; team-g asks for a 2x8 gang (reclaim off: it waits for
    releases), then a second one. Returns the running claims' names, shuffled (the release order)."""
    make(client, queue_body("team-g", namespaces=["g"], gpus=g_nominal, preemption=NO_RECLAIM))
    for i in range(16):
        submit(client, "ci", f"run{i}")
    rounds(1)
    assert ResourceClaim.objects.filter(phase=Phase.ALLOCATED).count() == 16
    gang(client, "g", "big", 2, 8)
    gang(client, "g", "later", 2, 8)
    place_gangs()
    running = [f"run{i}" for i in range(16)]
    random.Random(5).shuffle(running)
    return running


def test_a_gang_head_holds_both_nodes_and_is_placed_when_the_last_device_frees(admin_client, h100_fleet):
    running = fleet_full_then_gang(admin_client, 16)
    big, later = Gang.objects.get(name="big"), Gang.objects.get(name="later")
    assert (big.phase, big.reason, big.hold_queue, sorted(big.held_nodes)) == (
        GangPhase.PENDING, "NoDomainFits", "team-g", NODES)
    assert (later.hold_queue, later.held_nodes) == ("", [])  # one gang head per queue: the older
    for i, name in enumerate(running):
        # One GPU frees, a new one-GPU claim of default (above its nominal) arrives, a round runs.
        claim_services.release_claim(ResourceClaim.objects.get(name=name).id)
        submit(admin_client, "ci", f"stream{i}")
        rounds(1)
        place_gangs()
        if Gang.objects.get(name="big").phase == GangPhase.PLACED:
            break
        # Every later claim waits, held off the gang's nodes (the only nodes there are).
        assert set(ResourceClaim.objects.filter(name__startswith="stream").values_list("phase", "reason")) == {
            (Phase.PENDING, "HeldForQueueHead")}
    assert i == 15 and Gang.objects.get(name="big").phase == GangPhase.PLACED
    assert ResourceClaim.objects.filter(namespace__name="g", phase=Phase.ALLOCATED).count() == 2
    # Not one of the 16 later claims took a device: each waited for the head.
    assert not ResourceClaim.objects.filter(name__startswith="stream", phase=Phase.ALLOCATED).exists()
    assert ClaimEvent.objects.filter(reason="HeldForQueueHead").count() >= 15
    placed = Gang.objects.get(name="big")
    assert (placed.hold_queue, placed.held_nodes) == ("", [])
    # The gang behind it takes over the hold at its next attempt (the fleet is full: it waits).
    assert Gang.objects.get(name="later").phase == GangPhase.PENDING


def test_a_borrowing_gang_head_does_not_block_a_within_nominal_claim(admin_client, h100_fleet):
    """team-g has nominal 0 (its gang would borrow all 16): its hold still keeps default's later claims off
    the freed devices, but team-b's claim within its nominal of 2 takes one."""
    running = fleet_full_then_gang(admin_client, 0)
    make(admin_client, queue_body("team-b", namespaces=["b"], gpus=2))
    assert sorted(Gang.objects.get(name="big").held_nodes) == NODES
    for i, name in enumerate(running[:2]):
        claim_services.release_claim(ResourceClaim.objects.get(name=name).id)
        submit(admin_client, "ci", f"stream{i}")
    submit(admin_client, "b", "within")
    rounds(1)
    within = ResourceClaim.objects.get(name="within")
    assert within.phase == Phase.ALLOCATED, (within.reason, within.message, Gang.objects.get(name="big").hold_queue,
                                             list(ResourceClaim.objects.filter(name__startswith="stream")
                                                  .values_list("phase", "reason")))
    assert {c.reason for c in ResourceClaim.objects.filter(name__startswith="stream")} == {"HeldForQueueHead"}


def test_a_later_gang_waits_behind_the_gang_head_of_its_queue(admin_client, h100_fleet):
    """The head (2 x 8) holds both nodes; a later 1 x 8 gang of the same queue fits on the first node emptied but
    waits its turn (``HeldForQueueHead``); the head is placed when the second node empties."""
    make(admin_client, queue_body("team-g", namespaces=["g"], gpus=16, preemption=NO_RECLAIM))
    for i in range(16):
        submit(admin_client, "ci", f"run{i}")
    rounds(1)
    gang(admin_client, "g", "big", 2, 8)
    gang(admin_client, "g", "small", 1, 8)
    place_gangs()
    assert sorted(Gang.objects.get(name="big").held_nodes) == NODES
    first_node = ResourceClaim.objects.filter(name__startswith="run", node=NODES[0][1])
    for c in first_node:
        claim_services.release_claim(c.id)
    place_gangs()
    small = Gang.objects.get(name="small")
    assert (small.phase, small.reason) == (GangPhase.PENDING, "HeldForQueueHead"), small.message
    assert not ResourceClaim.objects.filter(namespace__name="g", phase=Phase.ALLOCATED).exists()
    for c in ResourceClaim.objects.filter(name__startswith="run", phase=Phase.ALLOCATED):
        claim_services.release_claim(c.id)
    place_gangs()
    assert {g.name: g.phase for g in Gang.objects.all()} == {"big": GangPhase.PLACED, "small": GangPhase.PENDING}
