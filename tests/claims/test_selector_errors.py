"""One cluster's odd device must not touch other tenants' claims (a CEL runtime error stays with the device).

A new cluster pushes, through the inventory API, one ``gpu.nvidia.com`` device that publishes no attributes:
the class selector (``device.attributes['gpu.nvidia.com'].type == 'gpu'``) fails on it with "no such key:
type". Real Celery workers allocate. Another tenant's claim that only the rogue device could serve waits
(Pending, ``SelectorErrorOnAllCandidates``, never Failed), a satisfiable claim is allocated, the operator gets
exactly one pool warning however many claims met the error, and the waiting claim is retried (and allocated)
when the rogue cluster pushes a fixed device.
"""
from __future__ import annotations

import time

import pytest

from claims.models import ResourceClaim
from inventory.models import PoolEvent
from inventory.services.clusters import create_cluster
from tests.claims.fleet import gpu_claim
from tests.conftest import client_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.live]

B200 = "device.attributes['gpu.nvidia.com'].productName == 'B200'"


def until(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
    return value


def rogue_body(attributes: dict) -> dict:
    return {"nodes": [{"name": "rogue-n0", "labels": {"kubernetes.io/hostname": "rogue-n0"}}],
            "resourceSlices": [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                                "metadata": {"name": "rogue-n0-gpu"},
                                "spec": {"driver": "gpu.nvidia.com", "nodeName": "rogue-n0",
                                         "pool": {"name": "rogue-n0", "generation": 1, "resourceSliceCount": 1},
                                         "devices": [{"name": "gpu-0", "attributes": attributes}]}}]}


def decided(name: str) -> ResourceClaim:
    """The claim once a worker has tried it (its phase may stay Pending)."""
    return until(lambda: ResourceClaim.objects.filter(name=name, attempts__gte=1).first())


def test_a_rogue_device_leaves_other_tenants_claims_pending_and_warns_once(small_fleet, ns_client, live_broker):
    _, secret = create_cluster(name="rogue", labels={"env": "rogue"})
    agent = client_for(secret)
    resp = agent.put("/api/v1/clusters/rogue/inventory", rogue_body({}), format="json")
    assert resp.status_code == 200, resp.content

    tenant_b, tenant_c = ns_client("team-b"), ns_client("team-c")
    waiting = gpu_claim("waiting")
    waiting["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [{"cel": {"expression": B200}}]
    assert tenant_b.post("/api/v1/namespaces/team-b/resourceclaims", waiting, format="json").status_code == 201
    assert tenant_c.post("/api/v1/namespaces/team-c/resourceclaims", waiting, format="json").status_code == 201
    assert tenant_b.post("/api/v1/namespaces/team-b/resourceclaims", gpu_claim("ok"),
                         format="json").status_code == 201

    ok = tenant_b.get("/api/v1/namespaces/team-b/resourceclaims/ok?wait=20s").json()
    assert ok["status"]["phase"] == "Allocated" and ok["status"]["allocation"]["devices"]["results"][0]["pool"] \
        .startswith("c1-")
    for ns in ("team-b", "team-c"):
        claim = until(lambda ns=ns: ResourceClaim.objects.filter(namespace__name=ns, name="waiting",
                                                                 attempts__gte=1).first())
        assert (claim.phase, claim.reason) == ("Pending", "SelectorErrorOnAllCandidates"), claim.message
        request = claim.diagnostics["diagnostics"]["requests"][0]
        assert request["dropped"]["cel_error"] == 1
        assert [(e["origin"], e["deviceClassName"], e["cluster"], e["error"], e["devices"])
                for e in request["selector_errors"]] == [("class", "gpu.nvidia.com", "rogue", "no such key: type", 1)]
    warnings = list(PoolEvent.objects.filter(type="SelectorError").values_list("cluster__name", "pool", "message"))
    assert warnings == [("rogue", "rogue-n0",
                         "class gpu.nvidia.com's selector #0 fails on 1 device of cluster rogue: no such key: type")]
    listed = tenant_b.get("/api/v1/poolevents?cluster=rogue").json()
    assert [e["type"] for e in listed["results"]] == ["SelectorError"]

    # The rogue cluster fixes its device: the waiting claims are tried again and one gets it; no new warning.
    fixed = {"type": {"string": "gpu"}, "productName": {"string": "B200"}}
    assert agent.put("/api/v1/clusters/rogue/inventory", rogue_body(fixed), format="json").status_code == 200
    until(lambda: ResourceClaim.objects.filter(name="waiting", phase="Allocated").count() == 1)
    other = until(lambda: ResourceClaim.objects.filter(name="waiting", phase="Pending", attempts__gte=2).first())
    assert other.reason == "Unsatisfiable"
    assert not ResourceClaim.objects.filter(phase="Failed").exists()
    assert PoolEvent.objects.filter(type="SelectorError").count() == 1
