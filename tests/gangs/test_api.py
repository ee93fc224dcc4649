"""The gangs API and services, in process (no broker: tasks run inline after commit, as in the embedded
default). The real-worker tests are in test_worker.py and test_race.py."""
from __future__ import annotations

import json

import pytest

from claims.models import DeviceAllocation, Phase, ResourceClaim
from gangs.models import Gang, GangEvent, GangMember, GangPhase, MemberPhase
from gangs.services import hold
from tests.gangs import fleet
from tests.gangs.conftest import NS
from tests.gangs.fleet import BLOCK, RACK, ZONE

pytestmark = pytest.mark.django_db(transaction=True)  # on_commit work (placement) runs as in production
URL = f"/api/v1/namespaces/{NS}/gangs"


def gang_claims(name: str) -> list[ResourceClaim]:
    return list(ResourceClaim.objects.filter(reservations__consumer__gang_member__gang__name=name).order_by("id"))


def rows_of(name: str) -> list[DeviceAllocation]:
    return list(DeviceAllocation.objects.filter(claim__in=gang_claims(name)))


def test_gang_that_fits_only_in_one_rack_lands_there(admin_client, rack_fleet):
    resp = admin_client.post(URL, fleet.gang_body("train", 4), format="json")
    assert resp.status_code == 201, resp.content
    body = admin_client.get(f"{URL}/train").json()
    st = body["status"]
    assert st["phase"] == "Placed", st
    assert st["placed"] == 4 and st["minMember"] == 4
    assert st["placement"]["domain"] == {ZONE: "zone-a", RACK: "rack-a1"}
    assert sorted(d["members"] for d in st["placement"]["preferredDomains"]) == [2, 2]  # blocks 1 and 2
    members = st["memberStatuses"]
    assert {m["labels"][RACK] for m in members} == {"rack-a1"} and len({m["node"] for m in members}) == 4
    claims = gang_claims("train")
    assert len(claims) == 4 and {c.phase for c in claims} == {Phase.ALLOCATED}
    for c in claims:
        assert len(c.allocation["devices"]["results"]) == 8
        assert c.node and c.diagnostics["gang"] == "train"
    devices = {(r.pool, r.device) for r in rows_of("train")}
    assert len(devices) == 32
    assert [e.type for e in GangEvent.objects.filter(gang_name="train")] == ["Created", "Placed"]


def test_gang_that_fits_in_no_single_rack_stays_pending_while_small_claims_flow(admin_client, rack_fleet):
    resp = admin_client.post(URL, fleet.gang_body("big", 5), format="json")
    assert resp.status_code == 201
    st = admin_client.get(f"{URL}/big").json()["status"]
    assert st["phase"] == "Pending" and st["reason"] == "NoDomainFits"
    assert st["pending"]["closest"]["domain"] == {ZONE: "zone-a", RACK: "rack-a1"}
    assert st["pending"]["closest"]["capacity"] == 4
    assert st["pending"]["fleetCapacity"] == 9
    assert "rack-a1" in st["message"] and "room for 4" in st["message"]
    claims = gang_claims("big")
    assert {c.phase for c in claims} == {Phase.PENDING}
    assert {c.annotations[hold.GANG_ANNOTATION] for c in claims} == {"big"}  # the claims round's hook
    assert all(c.reason == hold.WAITING and "NoDomainFits" not in c.message and "rack-a1" in c.message
               for c in claims)
    assert not rows_of("big")  # nothing held while pending

    # Smaller work keeps flowing: claims through the claims API are allocated at once, the gang's are not.
    for i in range(3):
        r = admin_client.post(f"/api/v1/namespaces/{NS}/resourceclaims", fleet.claim_body(f"small-{i}", 4),
                              format="json")
        assert r.status_code == 201
    small = ResourceClaim.objects.filter(name__startswith="small-")
    assert {c.phase for c in small} == {Phase.ALLOCATED}
    assert {c.phase for c in gang_claims("big")} == {Phase.PENDING} and not rows_of("big")


def test_members_beyond_min_member_are_added_when_room_frees_in_the_domain(admin_client, rack_fleet):
    from claims.services import claims as claim_services
    from gangs import tasks
    from scheduler import tasks as scheduler_tasks

    assert admin_client.post(URL, fleet.gang_body("elastic", 5, min_member=3), format="json").status_code == 201
    gang = Gang.objects.get(name="elastic")
    assert gang.phase == GangPhase.PLACED and gang.placed_count == 4 and gang.waiting_count == 1
    assert gang.domain[RACK] == "rack-a1"
    # One member's claim is released: 3 members still hold theirs (minMember 3), and the freed node is in the
    # gang's rack, so the waiting member is placed there, and only there.
    placed = GangMember.objects.filter(gang=gang, phase=MemberPhase.PLACED).order_by("index").first()
    claim = ResourceClaim.objects.get(reservations__consumer=placed.consumer)
    claim_services.release_claim(claim.id)
    tasks.sweep_gangs.apply()
    scheduler_tasks.place_gangs.apply()
    gang.refresh_from_db()
    assert gang.phase == GangPhase.PLACED and gang.placed_count == 4 and gang.waiting_count == 0
    assert GangMember.objects.get(pk=placed.pk).phase == MemberPhase.LOST
    last = GangMember.objects.get(gang=gang, name="member-4")
    assert last.phase == MemberPhase.PLACED and last.node == placed.node and last.labels[RACK] == "rack-a1"


def test_invalid_gangs_are_refused_and_leave_nothing_behind(admin_client, rack_fleet):
    bad_topology = fleet.gang_body("t1", 2)
    bad_topology["spec"]["topology"]["required"] = "no/such-level"
    resp = admin_client.post(URL, bad_topology, format="json")
    assert resp.status_code == 422
    assert "spec.topology.required" in [e["field"] for e in resp.json()["errors"]]
    resp = admin_client.post(URL, fleet.gang_body("t2", 2, min_member=3), format="json")
    assert resp.status_code == 422 and resp.json()["errors"][0]["field"] == "spec.minMember"
    resp = admin_client.post(URL, fleet.gang_body("t3", 2, template="missing"), format="json")
    assert resp.status_code == 422
    assert resp.json()["errors"][0]["field"] == "spec.members[0].resourceClaims[0].resourceClaimTemplateName"
    from claims.models import Consumer

    assert not Gang.objects.exists() and not Consumer.objects.exists() and not ResourceClaim.objects.exists()


def test_named_member_claims_must_be_pending_and_unshared(admin_client, rack_fleet):
    for name in ("mine", "taken"):
        admin_client.post(f"/api/v1/namespaces/{NS}/resourceclaims", fleet.claim_body(name, 8), format="json")
    assert ResourceClaim.objects.get(name="taken").phase == Phase.ALLOCATED
    body = {"metadata": {"name": "named"}, "spec": {"members": [
        {"name": "a", "resourceClaims": [{"name": "gpus", "resourceClaimName": "taken"}]}]}}
    resp = admin_client.post(URL, body, format="json")
    assert resp.status_code == 422 and "Allocated" in resp.json()["detail"]
    ResourceClaim.objects.filter(name="mine").update(phase=Phase.PENDING)  # as if it were still waiting
    DeviceAllocation.objects.filter(claim__name="mine").delete()
    body["spec"]["members"][0]["resourceClaims"][0]["resourceClaimName"] = "mine"
    assert admin_client.post(URL, body, format="json").status_code == 201
    claim = ResourceClaim.objects.get(name="mine")
    assert claim.phase == Phase.ALLOCATED and claim.annotations[hold.GANG_ANNOTATION] == "named"


def test_namespace_tokens_see_only_their_gangs(ns_client, admin_client, rack_fleet):
    team, other = ns_client(NS), ns_client("other")
    assert team.post(URL, fleet.gang_body("mine", 1), format="json").status_code == 201
    assert other.get(f"{URL}/mine").status_code == 403
    assert other.post(URL, fleet.gang_body("theirs", 1), format="json").status_code == 403
    assert other.post(f"{URL}/mine/release").status_code == 403
    assert [g["metadata"]["name"] for g in other.get("/api/v1/gangs").json()["items"]] == []
    assert [g["metadata"]["name"] for g in team.get("/api/v1/gangs").json()["items"]] == ["mine"]
    assert ns_client(NS, read_only=True).delete(f"{URL}/mine").status_code == 403


def test_release_then_delete_frees_and_removes_everything(admin_client, rack_fleet):
    from claims.models import Consumer

    admin_client.post(URL, fleet.gang_body("job", 3, timeout=600), format="json")
    assert Gang.objects.get(name="job").phase == GangPhase.PLACED and len(rows_of("job")) == 24
    resp = admin_client.post(f"{URL}/job/release")
    assert resp.status_code == 200 and resp.json()["status"]["phase"] == "Released"
    assert not rows_of("job") and {c.phase for c in gang_claims("job")} == {Phase.RELEASED}
    assert admin_client.post(f"{URL}/job/release").status_code == 200  # idempotent
    assert admin_client.delete(f"{URL}/job").status_code == 200
    assert not Gang.objects.exists() and not Consumer.objects.exists() and not ResourceClaim.objects.exists()
    assert admin_client.get(f"{URL}/job").status_code == 404
    assert GangEvent.objects.filter(gang_name="job").last().type == "Deleted"


def test_round_never_takes_member_claims_and_a_stray_is_contained(admin_client, rack_fleet):
    """Member claims carry the annotation the claims round's hook skips (``gangs.services.hold``).

    A label PATCH kicks the round and changes nothing; the API refuses a PATCH that removes the annotation;
    an annotation lost behind the API's back is put back by the sweep, and if the round allocated that claim
    on its own first, the gang worker finds the stray, releases it (it must block nothing) and loses the member.
    """
    from gangs import tasks
    from scheduler.tasks import allocate_pending, place_gangs

    def patch(name, body):
        resp = admin_client.patch(f"/api/v1/namespaces/{NS}/resourceclaims/{name}", json.dumps(body),
                                  content_type="application/merge-patch+json")
        assert resp.status_code == 200, resp.content

    admin_client.post(URL, fleet.gang_body("held", 5), format="json")  # pending: no rack holds 5
    claims = gang_claims("held")
    patch(claims[0].name, {"metadata": {"labels": {"x": "y"}}})  # kicks the round (inline here)
    allocate_pending.apply()
    assert {c.phase for c in gang_claims("held")} == {Phase.PENDING}

    ResourceClaim.objects.filter(pk=claims[1].pk).update(annotations={})  # lost, without a kick
    tasks.sweep_gangs.apply()
    claims[1].refresh_from_db()
    assert claims[1].annotations == {hold.GANG_ANNOTATION: "held"}
    allocate_pending.apply()
    claims[1].refresh_from_db()
    assert claims[1].phase == Phase.PENDING

    resp = admin_client.patch(f"/api/v1/namespaces/{NS}/resourceclaims/{claims[0].name}",
                              json.dumps({"metadata": {"annotations": {hold.GANG_ANNOTATION: None}}}),
                              content_type="application/merge-patch+json")
    assert resp.status_code == 422 and hold.GANG_ANNOTATION in resp.json()["errors"][0]["field"]
    claims[0].refresh_from_db()
    assert claims[0].annotations == {hold.GANG_ANNOTATION: "held"} and claims[0].phase == Phase.PENDING

    ResourceClaim.objects.filter(pk=claims[0].pk).update(annotations={})  # behind the API's back
    allocate_pending.apply()  # before any sweep: the round takes it alone
    claims[0].refresh_from_db()
    assert claims[0].phase == Phase.ALLOCATED
    Gang.objects.filter(name="held").update(attempted_version=None)  # as after any change to the fleet
    place_gangs.apply()
    claims[0].refresh_from_db()
    gang = Gang.objects.get(name="held")
    assert claims[0].phase == Phase.RELEASED and claims[0].reason == "GangMemberAllocatedAlone"
    assert not rows_of("held")  # contained: nothing is held for a gang that cannot start
    assert gang.phase == GangPhase.FAILED and gang.reason == "MembersLost"


def test_simulate_gang_against_the_stored_fleet_writes_nothing(admin_client, rack_fleet):
    topology = {"levels": fleet.LEVELS, "required": RACK, "preferred": BLOCK}
    claim = fleet.claim_body("w", 8)
    resp = admin_client.post("/api/v1/simulate/gang", {"replicas": 4, "claims": [claim], "topology": topology},
                             format="json")
    assert resp.status_code == 200, resp.content
    out = resp.json()
    assert out["placed"] and out["domain"] == {ZONE: "zone-a", RACK: "rack-a1"}
    assert len(out["members"]) == 4 and all(len(m["claims"][0]["allocation"]["devices"]["results"]) == 8
                                            for m in out["members"])
    assert not DeviceAllocation.objects.exists() and not Gang.objects.exists()
    again = admin_client.post("/api/v1/simulate/gang", {"replicas": 5, "claims": [claim], "topology": topology},
                              format="json").json()
    assert not again["placed"] and again["reason"] == "NoDomainFits"
    assert again["closest"]["capacity"] == 4 and again["diagnostics"]["fleetCapacity"] == 9
    bad = admin_client.post("/api/v1/simulate/gang", {"replicas": 2, "claims": [claim], "minMember": 3},
                            format="json")
    assert bad.status_code == 422


def test_simulate_gang_with_an_inline_inventory(admin_client, db):
    from inventory import demo

    node_list = fleet.nodes("x", {"z": {"r1": {"b1": 1}, "r2": {"b2": 2}}})
    body = {"replicas": 2, "claims": [fleet.claim_body("w", 8)], "nodes": node_list,
            "resourceSlices": fleet.gpu_slices(node_list), "deviceClasses": demo.standard_device_classes(),
            "topology": {"levels": fleet.LEVELS, "required": RACK},
            "allocatedDevices": [{"driver": "gpu.nvidia.com", "pool": "x-b2-n0", "device": "gpu-0"}]}
    out = admin_client.post("/api/v1/simulate/gang", body, format="json").json()
    # r2 has two nodes but one GPU of one of them is in use: no rack holds two 8-GPU members.
    assert not out["placed"] and out["closest"]["capacity"] == 1
    body["allocatedDevices"] = []
    out = admin_client.post("/api/v1/simulate/gang", body, format="json").json()
    assert out["placed"] and out["domain"][RACK] == "r2"


def test_idempotency_key_gives_one_gang_and_names_it(admin_client, rack_fleet):
    body = fleet.gang_body("once", 2)
    first = admin_client.post(URL, body, format="json", HTTP_IDEMPOTENCY_KEY="gang-7")
    again = admin_client.post(URL, body, format="json", HTTP_IDEMPOTENCY_KEY="gang-7")
    assert first.status_code == again.status_code == 201, again.content
    assert first["Location"] == again["Location"] == f"{URL}/once"
    assert again["Idempotent-Replayed"] == "true" and "Idempotent-Replayed" not in first
    assert Gang.objects.filter(name="once").count() == 1


def test_member_names_are_labels_unique_in_the_list_and_a_list_as_a_name_is_a_field_error(admin_client, rack_fleet):
    claims = [{"name": "gpus", "resourceClaimTemplateName": "h100x8"}]
    body = fleet.gang_body("named", 2)
    body["spec"] = {"members": [{"name": n, "resourceClaims": claims} for n in ("a", "a", "B_", ["x"])]}
    resp = admin_client.post(URL, body, format="json")
    assert resp.status_code == 422, resp.content
    fields = [e["field"] for e in resp.json()["errors"]]
    assert fields == ["spec.members[1].name", "spec.members[2].name", "spec.members[3].name"], resp.json()
    assert resp.json()["errors"][0]["reason"] == 'Duplicate value: "a"'
