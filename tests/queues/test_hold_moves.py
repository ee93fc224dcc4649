"""A node a queue's head stops holding is offered again: the claims kept off it waited for a release, and its
free devices stayed idle beside them once the head held another node (a racing-workers run ended with a free
GPU on a node nobody held and 650 claims waiting ``HeldForQueueHead``)."""
from __future__ import annotations

import pytest

from claims.models import DeviceAllocation, PendingWake, Phase, ReleasedDevice, ResourceClaim
from claims.services import claims as claim_services
from claims.services import taking
from inventory.models import Device
from tests.claims.fleet import gpu_claim
from tests.queues.test_admission import ns, rounds, submit

pytestmark = pytest.mark.django_db


def held_node(name: str) -> str:
    claim = ResourceClaim.objects.get(name=name)
    return PendingWake.objects.filter(claim_id=claim.id).exclude(hold_node="").values_list(
        "hold_node", flat=True).first() or ""


def release_on(node: str, n: int) -> None:
    ids = list(DeviceAllocation.objects.filter(claim__name__startswith="run", claim__node=node)
               .values_list("claim_id", flat=True).distinct()[:n])
    assert len(ids) == n
    for claim_id in ids:
        claim_services.release_claim(claim_id)


def fill_and_hold(admin_client) -> tuple[str, str, list]:
    """16 one-GPU claims fill both nodes; an 8-GPU head holds node x; two small claims that only x's GPUs
    serve wait. Returns (x, y, the small claims)."""
    for i in range(16):
        submit(admin_client, "ci", f"run{i}")
    rounds(1)
    submit(admin_client, "ci", "big", 8)
    rounds(1)
    x = held_node("big")
    nodes = set(Device.objects.values_list("node_name", flat=True))
    assert x in nodes and len(nodes) == 2, (x, nodes)
    (y,) = nodes - {x}
    gpus = Device.objects.filter(node_name=x, driver="gpu.nvidia.com")
    uuids = [d.attribute_index["gpu.nvidia.com/uuid"] for d in gpus if "gpu.nvidia.com/uuid" in d.attribute_index]
    assert len(uuids) == 8
    selector = "device.attributes[\"gpu.nvidia.com\"].uuid in [" + ", ".join(f'"{u}"' for u in uuids) + "]"
    for i in range(2):
        body = gpu_claim(f"small{i}")
        body["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [{"cel": {"expression": selector}}]
        assert admin_client.post(f"{ns('ci')}/resourceclaims", body, format="json").status_code == 201
    rounds(1)
    # One GPU of x frees while another worker decides the head: the small claims are kept off x.
    release_on(x, 1)
    big = ResourceClaim.objects.get(name="big")
    taking.mark_taken([big.id])
    rounds(1)
    smalls = ResourceClaim.objects.filter(name__startswith="small")
    assert {c.reason for c in smalls} == {"HeldForQueueHead"}, [(c.name, c.reason, c.message) for c in smalls]
    taking.clear_taken([big.id])
    return x, y, smalls


def test_a_node_its_head_no_longer_holds_is_offered_to_the_claims_kept_off_it(admin_client, h100_fleet):
    x, y, smalls = fill_and_hold(admin_client)
    # Two GPUs of y free: the head, decided again, holds y now (more free there).
    release_on(y, 2)
    rounds(1)
    assert held_node("big") == y
    assert ReleasedDevice.objects.filter(cluster="c1").exists()  # x's free GPU, offered again
    rounds(2)
    placed = ResourceClaim.objects.filter(name__startswith="small", phase=Phase.ALLOCATED)
    assert [(c.name, c.node) for c in placed] == [("small0", x)], [(c.name, c.phase, c.reason) for c in smalls]


def test_a_released_head_leaves_its_node_to_the_claims_kept_off_it(admin_client, h100_fleet):
    x, _, smalls = fill_and_hold(admin_client)
    claim_services.release_claim(ResourceClaim.objects.get(name="big").id)
    rounds(2)
    placed = ResourceClaim.objects.filter(name__startswith="small", phase=Phase.ALLOCATED)
    assert [(c.name, c.node) for c in placed] == [("small0", x)], [(c.name, c.phase, c.reason) for c in smalls]
