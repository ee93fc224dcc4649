"""Reservations through both doors: validation, access, conflicts with other reservations and with the queues'
nominal quotas, the 403 for a claim naming a reservation its namespace may not use."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.claims.fleet import gpu_claim, load_fleet

pytestmark = [pytest.mark.django_db]

URL = "/api/v1/reservations"
K8S = "/k8s/apis/draservice.io/v1alpha1/reservations"


def at(delta: timedelta) -> str:
    return (datetime.now(UTC) + delta).strftime("%Y-%m-%dT%H:%M:%S")


def reservation(name: str, devices: int = 8, start: timedelta = timedelta(hours=1), hours: float = 4,
                recurrence: dict | None = None, **spec) -> dict:
    window = {"start": at(start), "end": at(start + timedelta(hours=hours)), "timeZone": "UTC"}
    if recurrence:
        window["recurrence"] = recurrence
    return {"apiVersion": "draservice.io/v1alpha1", "kind": "Reservation", "metadata": {"name": name},
            "spec": {"window": window, "resources": [{"deviceClassName": "gpu.nvidia.com", "devices": devices}],
                     "users": {"namespaces": ["team-r"]}, **spec}}


@pytest.fixture
def fleet(db):
    load_fleet({"c1": [("h100", 2)]})  # two nodes of 8 H100


def test_create_read_and_status(admin_client, fleet):
    resp = admin_client.post(URL, reservation("nightly", 8, recurrence={"frequency": "Daily"}, leadTimeSeconds=600,
                                              reclaimBorrowed=True), format="json")
    assert resp.status_code == 201, resp.content
    body = resp.json()
    assert resp["ETag"] == '"1"' and resp["Location"].endswith("/reservations/nightly")
    assert body["spec"]["leadTimeSeconds"] == 600 and body["spec"]["lendIdle"] is False
    conditions = {c["type"]: c["status"] for c in body["status"]["conditions"]}
    assert conditions == {"Ready": "True", "Degraded": "False"}
    assert body["status"]["held"] == {"devices": 8}
    assert body["status"]["utilisation"] == {"devicesInUse": 0, "devicesReserved": 8, "fraction": 0.0}
    nxt = datetime.strptime(body["status"]["nextWindow"]["start"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert timedelta(minutes=55) < nxt - datetime.now(UTC) <= timedelta(hours=1)
    assert admin_client.get(f"{URL}/nightly").json()["metadata"]["name"] == "nightly"
    resp = admin_client.patch(f"{URL}/nightly", {"spec": {"lendIdle": True}}, format="json",
                              HTTP_IF_MATCH='"1"')
    assert resp.status_code == 200 and resp.json()["spec"]["lendIdle"] is True and resp["ETag"] == '"2"'
    k8s = admin_client.get(f"{K8S}/nightly").json()
    assert k8s["kind"] == "Reservation" and k8s["spec"]["lendIdle"] is True
    assert admin_client.delete(f"{URL}/nightly").status_code == 204
    assert admin_client.get(f"{URL}/nightly").status_code == 404


@pytest.mark.parametrize("change, field", [
    ({"window": {"start": "2026-12-01T06:00:00", "end": "2026-12-01T02:00:00"}}, "spec.window.end"),
    ({"window": {"start": "2026-12-01T02:00:00", "end": "2026-12-01T06:00:00", "timeZone": "Nowhere/Land"}},
     "spec.window.timeZone"),
    ({"resources": [{"deviceClassName": "gpu.nvidia.com"}]}, "spec.resources[0]"),
    ({"resources": [{"deviceClassName": "gpu.nvidia.com", "devices": 0}]}, "spec.resources[0].devices"),
    ({"resources": [{"deviceClassName": "gpu.nvidia.com", "devices": 1, "nodeSelector": "x"}]},
     "spec.resources[0].nodeSelector"),
    ({"users": {"namespaces": ["Team_A"]}}, "spec.users.namespaces[0]"),
    ({"users": {}}, "spec.users"),
    ({"leadTimeSeconds": -1}, "spec.leadTimeSeconds"),
    ({"lendIdle": "yes"}, "spec.lendIdle"),
    ({"colour": "red"}, "spec.colour"),
])
def test_bad_input_is_a_422_naming_the_field_at_both_doors(admin_client, fleet, change, field):
    body = reservation("bad")
    body["spec"].update(change)
    resp = admin_client.post(URL, body, format="json")
    assert resp.status_code == 422, resp.content
    assert field in [e["field"] for e in resp.json()["errors"]]
    resp = admin_client.post(K8S, body, format="json")
    if field == "spec.colour":  # the door's field validation drops an unknown field (Warn), as for every kind
        assert resp.status_code in (201, 422)
        return
    assert resp.status_code == 422, resp.content
    status = resp.json()
    assert status["kind"] == "Status" and field in [c["field"] for c in status["details"]["causes"]]
    assert admin_client.get(f"{URL}/bad").status_code == 404


def test_only_admins_write_and_a_namespace_reads_the_ones_it_may_use(admin_client, ns_client, fleet):
    assert admin_client.post(URL, reservation("mine", 2), format="json").status_code == 201
    other = reservation("theirs", 2, start=timedelta(hours=10))
    other["spec"]["users"] = {"namespaces": ["team-x"]}
    assert admin_client.post(URL, other, format="json").status_code == 201
    tenant = ns_client("team-r", read_only=False)
    assert tenant.post(URL, reservation("sneaky", 1), format="json").status_code == 403
    assert [i["metadata"]["name"] for i in tenant.get(URL).json()["items"]] == ["mine"]
    assert tenant.get(f"{URL}/theirs").status_code == 404
    assert [i["metadata"]["name"] for i in tenant.get(K8S).json()["items"]] == ["mine"]
    assert tenant.delete(f"{URL}/mine").status_code == 403


def test_a_reservation_one_may_not_use_reads_as_a_missing_one_at_each_door(admin_client, ns_client, fleet):
    """/api/v1: 404 for both; /k8s: 403 for both, as kube-apiserver answers a name outside an RBAC rule's
    resourceNames (before any lookup); neither tells whether it exists."""
    theirs = reservation("theirs", 2)
    theirs["spec"]["users"] = {"namespaces": ["team-x"]}
    assert admin_client.post(URL, theirs, format="json").status_code == 201
    assert admin_client.post(URL, reservation("mine", 2, start=timedelta(hours=10)), format="json").status_code == 201
    tenant = ns_client("team-r")
    rest = {name: tenant.get(f"{URL}/{name}") for name in ("theirs", "missing")}
    assert {n: r.status_code for n, r in rest.items()} == {"theirs": 404, "missing": 404}
    assert rest["theirs"].json() == rest["missing"].json()
    k8s = {name: tenant.get(f"{K8S}/{name}") for name in ("theirs", "missing")}
    assert {n: r.status_code for n, r in k8s.items()} == {"theirs": 403, "missing": 403}
    for name, resp in k8s.items():
        status = resp.json()
        assert status["kind"] == "Status" and status["reason"] == "Forbidden"
        assert status["details"] == {"name": name, "kind": "reservations"}
        assert status["message"] == (f'reservations.draservice.io "{name}" is forbidden: this token cannot get '
                                     'resource "reservations" in API group "draservice.io" at the cluster scope')
    assert tenant.get(f"{K8S}/mine").status_code == 200
    # Callers who read every reservation: the one that is missing is a 404 at both doors.
    assert admin_client.get(f"{K8S}/missing").status_code == 404
    assert admin_client.get(f"{URL}/missing").status_code == 404
    assert admin_client.get(f"{K8S}/theirs").status_code == 200


def test_an_overlapping_reservation_that_does_not_fit_is_a_409_naming_the_other_and_the_occurrence(
        admin_client, fleet):
    nightly = reservation("nightly", 12, start=timedelta(hours=2), hours=4, recurrence={"frequency": "Daily"})
    assert admin_client.post(URL, nightly, format="json").status_code == 201
    # Weekly, 3 hours later on the clock: its windows overlap the nightly's last hour; 12 + 8 > 16 GPUs.
    late = reservation("late", 8, start=timedelta(hours=5), hours=2,
                       recurrence={"frequency": "Weekly", "daysOfWeek": ["Mon", "Wed"]})
    resp = admin_client.post(URL, late, format="json")
    assert resp.status_code == 409, resp.content
    detail = resp.json()["detail"]
    assert 'conflicts with reservation "nightly"' in detail and "overlap" in detail
    # The first conflicting occurrence is named: the late window's first Monday or Wednesday.
    assert ".." in detail
    resp = admin_client.post(K8S, late, format="json")
    assert resp.status_code == 409 and resp.json()["kind"] == "Status"
    # 4 fit beside 12 on 16 GPUs; and one that does not overlap fits whole.
    assert admin_client.post(URL, reservation("late", 4, start=timedelta(hours=5), hours=2), format="json") \
        .status_code == 201
    assert admin_client.post(URL, reservation("later", 16, start=timedelta(hours=7), hours=1), format="json") \
        .status_code == 201
    # More than the fleet holds at all.
    resp = admin_client.post(URL, reservation("huge", 17, start=timedelta(days=20)), format="json")
    assert resp.status_code == 409 and "does not fit the fleet" in resp.json()["detail"]


def test_a_reservation_may_not_take_the_queues_nominal_quota(admin_client, fleet):
    queue = {"apiVersion": "draservice.io/v1alpha1", "kind": "Queue", "metadata": {"name": "team-a"},
             "spec": {"namespaces": ["team-a"], "quotas": [{"deviceClassName": "gpu.nvidia.com",
                                                            "devices": {"nominal": 10}}]}}
    assert admin_client.post("/api/v1/queues", queue, format="json").status_code == 201
    resp = admin_client.post(URL, reservation("big", 8), format="json")
    assert resp.status_code == 409, resp.content
    assert '"team-a"' in resp.json()["detail"] and "nominal" in resp.json()["detail"]
    assert admin_client.post(URL, reservation("small", 6), format="json").status_code == 201


def test_a_claim_naming_a_reservation_its_namespace_may_not_use_is_a_403(admin_client, fleet):
    assert admin_client.post(URL, reservation("nightly", 2), format="json").status_code == 201
    labelled = gpu_claim("c", 1, labels={"draservice.io/reservation": "nightly"})
    assert admin_client.post("/api/v1/namespaces/team-r/resourceclaims", labelled, format="json").status_code == 201
    resp = admin_client.post("/api/v1/namespaces/team-a/resourceclaims", labelled, format="json")
    assert resp.status_code == 403, resp.content
    assert resp.json()["errors"][0]["field"] == "metadata.labels[draservice.io/reservation]"
    resp = admin_client.post("/k8s/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims", labelled,
                             format="json")
    assert resp.status_code == 403 and resp.json()["kind"] == "Status"


def test_prometheus_gauges(admin_client, fleet, settings):
    from queues.models import Reservation
    from tests.test_metrics_grafana import scrape, value

    assert admin_client.post(URL, reservation("nightly", 2), format="json").status_code == 201
    Reservation.objects.filter(name="nightly").update(started={"2026-12-01T02:00:00Z": 1.5,
                                                               "2026-12-02T02:00:00Z": 0.25})
    samples = scrape(admin_client)
    assert value(samples, "draservice_reservation_utilisation", reservation="nightly") == 0.0
    assert value(samples, "draservice_reservation_late_start_seconds", reservation="nightly") == 0.25
