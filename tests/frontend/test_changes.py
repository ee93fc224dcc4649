"""Issue 39's audit trail "on each object's dashboard page": a Queue's, a Reservation's, the Prices' (on the Usage
page) and a fleet-wide DeviceClass's page show their changes, newest first (who, when, before → after), to
admins only, read through the audit service; a page's statements do not grow with the changes shown."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from tests.history.cells import rows
from tests.queues.conftest import queue_body

pytestmark = pytest.mark.django_db


def person(name: str, staff: bool) -> Client:
    client = Client()
    client.force_login(User.objects.create_user(name, is_staff=staff))
    return client


def changes(html: str) -> list[list[str]]:
    """The Changes table: per event, its cells after "When" (the time is checked apart)."""
    return [[c["text"] for c in r["cells"][1:]] for r in rows(html, "history-row")]


def reservation(name: str, namespaces: list[str]) -> dict:
    start = datetime.now(UTC).replace(microsecond=0) + timedelta(days=2)
    window = {"start": start.strftime("%Y-%m-%dT%H:%M:%S"), "end": (start + timedelta(hours=4))
              .strftime("%Y-%m-%dT%H:%M:%S"), "timeZone": "UTC"}
    return {"apiVersion": "draservice.io/v1alpha1", "kind": "Reservation", "metadata": {"name": name},
            "spec": {"window": window, "resources": [{"deviceClassName": "gpu.nvidia.com", "devices": 2}],
                     "users": {"namespaces": namespaces}}}


def test_a_reservations_page_shows_its_changes_to_admins(admin_client):
    from tests.claims.fleet import load_fleet

    load_fleet({"c1": [("h100", 1)]})
    assert admin_client.post("/api/v1/reservations", reservation("nightly", ["training"]),
                             format="json").status_code == 201
    ops, viewer = person("ops", staff=True), person("viewer", staff=False)
    patch = {"spec": {"users": {"namespaces": ["training", "eval"]}}}
    assert ops.patch("/api/v1/reservations/nightly", patch, content_type="application/merge-patch+json"
                     ).status_code == 200
    html = ops.get("/queues/reservations/nightly/").content.decode()
    shown = changes(html)
    assert shown[0] == ["user:ops (user)", "Update", 'spec.users.namespaces: ["training"] → ["training", "eval"]']
    assert shown[1][:2] == ["token:test admin (admin)", "Create"] and len(shown) == 2
    assert shown[1][2].startswith('metadata: — → {"annotations": {}, "labels": {}} spec: — → {"leadTimeSeconds": 0')
    assert '"resources": [{"deviceClassName": "gpu.nvidia.com", "devices": 2}]' in shown[1][2]
    assert "0 / 2" in html  # its status: devices in use of those reserved
    # The trail is the API's: /api/v1/auditevents keeps a reservation's events by kind too.
    listed = admin_client.get("/api/v1/auditevents?kind=Reservation&name=nightly")
    assert listed.status_code == 200 and [e["operation"] for e in listed.json()["items"]] == ["Create", "Update"]
    # People who are not admins see the page, not the trail; the timeline links the page.
    page = viewer.get("/queues/reservations/nightly/").content.decode()
    assert "Admins only" in page and 'data-testid="history-row"' not in page
    assert 'href="/queues/reservations/nightly/"' in viewer.get("/queues/reservations/").content.decode()
    assert viewer.get("/queues/reservations/nope/").status_code == 404

    # One statement for the trail, however long it is.
    def statements() -> int:
        with CaptureQueriesContext(connection) as ctx:
            assert ops.get("/queues/reservations/nightly/").status_code == 200
        return len(ctx.captured_queries)

    before = statements()
    for i in range(10):
        users = {"spec": {"users": {"namespaces": ["training", f"eval-{i}"]}}}
        assert ops.patch("/api/v1/reservations/nightly", users, content_type="application/merge-patch+json"
                         ).status_code == 200
    assert statements() == before and len(changes(ops.get("/queues/reservations/nightly/").content.decode())) == 12


def test_a_queues_page_shows_a_changed_list_as_json(admin_client):
    assert admin_client.post("/api/v1/queues", queue_body("team-a", namespaces=["a"]), format="json").status_code \
        == 201
    ops = person("ops", staff=True)
    assert ops.patch("/api/v1/queues/team-a", {"spec": {"namespaces": ["a", "b"], "weight": 2.5}},
                     content_type="application/json").status_code == 200
    update = changes(ops.get("/queues/team-a/").content.decode())[0]
    assert update == ["user:ops (user)", "Update",
                      'spec.namespaces: ["a"] → ["a", "b"] spec.weight: 1 → 2.5'], update


def test_the_usage_page_shows_the_prices_and_their_changes(admin_client):
    made = admin_client.post("/api/v1/prices", {"product": "H100", "currency": "EUR", "pricePerDeviceHour": "2.5"},
                             format="json")
    assert made.status_code == 201
    assert admin_client.post("/api/v1/prices", {"product": "H100", "cluster": "c2", "currency": "EUR",
                                                "pricePerDeviceHour": "100"}, format="json").status_code == 201
    ops = person("ops", staff=True)
    assert ops.put(f"/api/v1/prices/{made.json()['id']}", {"product": "H100", "currency": "EUR",
                                                           "pricePerDeviceHour": "3"},
                   content_type="application/json").status_code == 200
    html = ops.get("/usage/").content.decode()
    assert [[c["text"] for c in r["cells"]] for r in rows(html, "price-row")] == [
        ["H100", "every cluster", "3 EUR"], ["H100", "c2", "100 EUR"]]
    shown = changes(html)
    assert shown[0] == ["H100", "user:ops (user)", "Update", "spec.pricePerDeviceHour: 2.5 → 3"]
    assert [s[:3] for s in shown[1:]] == [["H100@c2", "token:test admin (admin)", "Create"],
                                          ["H100", "token:test admin (admin)", "Create"]]
    viewer_page = person("viewer", staff=False).get("/usage/").content.decode()
    assert len(rows(viewer_page, "price-row")) == 2 and 'data-testid="history-row"' not in viewer_page


def test_a_fleet_device_class_page_shows_its_changes(admin_client):
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "fast"},
            "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.nvidia.com"'}}]}}
    assert admin_client.post("/api/v1/deviceclasses", body, format="json").status_code == 201
    changed = {**body, "metadata": {"name": "fast", "labels": {"tier": "gold"}}}
    assert admin_client.put("/api/v1/deviceclasses/fast", changed, format="json").status_code == 200
    ops = person("ops", staff=True)
    shown = changes(ops.get("/inventory/deviceclasses/fast/").content.decode())
    assert shown[0] == ["token:test admin (admin)", "Update", "metadata.labels.tier: — → gold"], shown
    assert shown[1][:2] == ["token:test admin (admin)", "Create"] and len(shown) == 2
    page = person("viewer", staff=False).get("/inventory/deviceclasses/fast/").content.decode()
    assert "Admins only" in page and 'data-testid="history-row"' not in page
