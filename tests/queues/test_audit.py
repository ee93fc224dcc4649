"""The policy audit trail: queue, price and DeviceClass changes through every door, recorded with their author
and difference in the change's transaction; listed at /api/v1/auditevents for admins only."""
from __future__ import annotations

import pytest

from draservice.models import AuditEvent
from tests.claims import fleet
from tests.queues.conftest import queue_body

pytestmark = pytest.mark.django_db

EVENTS = "/api/v1/auditevents"
K8S_QUEUES = "/k8s/apis/draservice.io/v1alpha1/queues"


def trail(client, **params) -> list[tuple]:
    resp = client.get(EVENTS, params)
    assert resp.status_code == 200, resp.content
    return [(e["actor"]["name"], e["actor"]["kind"], e["object"]["kind"], e["object"]["name"], e["operation"],
             e["changes"]) for e in resp.json()["items"]]


def test_two_weight_changes_and_a_price_change_are_three_events(admin_client, ns_client):
    assert admin_client.post("/api/v1/queues", queue_body("team-a", namespaces=["a"]), format="json").status_code == 201
    price = admin_client.post("/api/v1/prices", {"product": "H100", "currency": "EUR", "pricePerDeviceHour": "2.5"},
                              format="json")
    assert price.status_code == 201, price.content
    start = AuditEvent.objects.order_by("-id").first().id
    # Weight 1 -> 2 at the REST door, 2 -> 3 at the /k8s door (a merge patch, as kubectl patch sends), the price
    # 2.5 -> 3 at REST; an unchanged PUT of the price and a dry run record nothing.
    assert admin_client.patch("/api/v1/queues/team-a", {"spec": {"weight": 2}}, format="json").status_code == 200
    k8s = admin_client.generic("PATCH", f"{K8S_QUEUES}/team-a", '{"spec": {"weight": 3}}',
                               content_type="application/merge-patch+json")
    assert k8s.status_code == 200, k8s.content
    dry = admin_client.generic("PATCH", f"{K8S_QUEUES}/team-a?dryRun=All", '{"spec": {"weight": 7}}',
                               content_type="application/merge-patch+json")
    assert dry.status_code == 200 and dry.json()["spec"]["weight"] == 7
    assert admin_client.patch("/api/v1/queues/team-a?dryRun=All", {"spec": {"weight": 9}},
                              format="json").status_code == 200
    changed = {"product": "H100", "currency": "EUR", "pricePerDeviceHour": "3"}
    pk = price.json()["id"]
    assert admin_client.put(f"/api/v1/prices/{pk}", changed, format="json").status_code == 200
    assert admin_client.put(f"/api/v1/prices/{pk}", changed, format="json").status_code == 200
    new = [e for e, row in zip(trail(admin_client), AuditEvent.objects.order_by("id"), strict=True) if row.id > start]
    who = ("token:test admin", "admin")
    assert new == [
        (*who, "Queue", "team-a", "Update", [{"path": "spec.weight", "before": 1, "after": 2}]),
        (*who, "Queue", "team-a", "Update", [{"path": "spec.weight", "before": 2, "after": 3}]),
        (*who, "Price", "H100", "Update", [{"path": "spec.pricePerDeviceHour", "before": "2.5", "after": "3"}]),
    ]
    # Filters: one object's events; a bad kind is a 400 naming the parameter; a namespace token gets 403.
    assert [e[4] for e in trail(admin_client, kind="Queue", name="team-a")] == ["Create", "Update", "Update"]
    assert [e[4] for e in trail(admin_client, kind="Price")] == ["Create", "Update"]
    bad = admin_client.get(EVENTS, {"kind": "Pod"})
    assert bad.status_code == 400 and bad["Content-Type"].startswith("application/problem+json")
    assert [e["field"] for e in bad.json()["errors"]] == ["kind"]
    assert ns_client("a").get(EVENTS).status_code == 403
    paged = admin_client.get(EVENTS, {"limit": 2})
    assert len(paged.json()["items"]) == 2 and paged.json()["metadata"]["continue"]


def test_deletes_and_device_classes(admin_client):
    fleet.load_fleet({"c1": [("h100", 1)]})  # its DeviceClasses are written by no request: author "system"
    made = {(e.actor, e.actor_kind, e.operation) for e in AuditEvent.objects.all()}
    assert made == {("system", "system", "Create")}
    AuditEvent.objects.all().delete()
    body = queue_body("team-b", namespaces=["b"])
    dc = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "big.example.com"},
          "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]}}
    assert admin_client.post("/api/v1/deviceclasses", dc, format="json").status_code == 201
    assert admin_client.post("/api/v1/queues", body, format="json").status_code == 201
    assert admin_client.delete("/api/v1/queues/team-b").status_code == 204
    assert admin_client.delete("/api/v1/deviceclasses/big.example.com").status_code == 204
    rows = trail(admin_client)
    assert [(e[2], e[3], e[4]) for e in rows] == [
        ("DeviceClass", "big.example.com", "Create"), ("Queue", "team-b", "Create"), ("Queue", "team-b", "Delete"),
        ("DeviceClass", "big.example.com", "Delete")]
    # A create or delete shows the object's recorded fields whole on one side.
    assert [c["path"] for c in rows[2][5]] == ["metadata", "spec"] and rows[2][5][1]["after"] is None
    assert rows[2][5][1]["before"]["weight"] == 1 and rows[2][5][1]["before"]["namespaces"] == ["b"]
    assert rows[0][5][-1]["path"] == "spec" and rows[0][5][-1]["before"] is None


def test_queue_page_shows_its_history_to_staff(admin_client):
    from django.contrib.auth.models import User
    from django.test import Client

    assert admin_client.post("/api/v1/queues", queue_body("team-c", namespaces=["c"]), format="json").status_code == 201
    staff = Client()
    staff.force_login(User.objects.create_user("boss", is_staff=True))
    assert staff.patch("/api/v1/queues/team-c", {"spec": {"weight": 4}}, content_type="application/json"
                       ).status_code == 200  # a staff session: the author is the user
    html = staff.get("/queues/team-c/").content.decode()
    rows = html.split('data-testid="history-row"')[1:]
    assert len(rows) == 2  # newest first: the patch, then the create
    assert "user:boss" in rows[0] and "spec.weight: 1 → 4" in rows[0] and "token:test admin" in rows[1]
    viewer = Client()
    viewer.force_login(User.objects.create_user("viewer"))
    page = viewer.get("/queues/team-c/").content.decode()
    assert 'data-testid="queue-rank"' in page and 'data-testid="history-row"' not in page
    assert viewer.get("/queues/nope/").status_code == 404
