"""The usage API: the report (JSON and CSV, tenancy, validation), prices and cost, node and device history, and
the dashboard's Usage page."""
from __future__ import annotations

import csv
import io

import pytest
from django.test import Client

from claims.models import ResourceClaim
from claims.services import claims as claim_services
from tests.claims.fleet import gpu_claim
from tests.usage.conftest import run_rounds
from usage.models import UsageInterval

pytestmark = pytest.mark.django_db

H100 = "NVIDIA H100 80GB HBM3"
WINDOW = {"since": "2026-03-01T00:00:00Z", "until": "2026-03-03T00:00:00Z"}


@pytest.fixture
def used(admin_client, fleet, clock):
    """team-a holds 2 GPUs for 2 h (still held); team-b held 1 GPU for 1 h."""
    for ns, name, count in (("team-a", "a", 2), ("team-b", "b", 1)):
        assert admin_client.post(f"/api/v1/namespaces/{ns}/resourceclaims", gpu_claim(name, count=count),
                                 format="json").status_code == 201
    run_rounds()
    clock.advance(hours=1)
    claim_services.release_claim(ResourceClaim.objects.get(name="b").id)
    clock.advance(hours=1)


def hours_by(body, key="namespace"):
    return {i[key]: i["deviceHours"] for i in body["items"]}


def test_the_report_groups_device_hours_and_cuts_until_at_now(admin_client, used, clock):
    body = admin_client.get("/api/v1/usage", {"groupBy": "namespace", **WINDOW}).json()
    assert body["kind"] == "UsageReport" and body["groupBy"] == ["namespace"]
    assert hours_by(body) == {"team-a": 4.0, "team-b": 1.0} and body["total"]["deviceHours"] == 5.0
    assert body["until"] == "2026-03-02T11:00:00Z"  # now, not the future
    only_b = admin_client.get("/api/v1/usage", {"namespace": "team-b, nobody", "cluster": "c1", **WINDOW}).json()
    assert hours_by(only_b) == {"team-b": 1.0}
    two = admin_client.get("/api/v1/usage", {"groupBy": "cluster,product,sharing,queue", **WINDOW}).json()
    assert two["items"] == [{"cluster": "c1", "product": H100, "sharing": "exclusive", "queue": "default",
                             "deviceHours": 5.0, "deviceSeconds": 18000.0, "cost": None, "currency": None,
                             "costs": {}, "unpricedDeviceHours": 5.0}]


def test_a_namespace_token_sees_only_its_namespaces(ns_client, used):
    body = ns_client("team-a").get("/api/v1/usage", WINDOW).json()
    assert hours_by(body) == {"team-a": 4.0} and body["total"]["deviceHours"] == 4.0
    # A filter narrows within what the token may read, never beyond it.
    assert hours_by(ns_client("team-a").get("/api/v1/usage", {"namespace": "team-b", **WINDOW}).json()) == {}
    assert Client().get("/api/v1/usage").status_code in (401, 403)


def _rows(resp):
    assert resp.status_code == 200, resp.content
    assert resp["Content-Type"].startswith("text/csv")
    assert resp["Content-Disposition"].startswith("attachment; filename=")
    return list(csv.reader(io.StringIO(resp.content.decode())))


def test_csv_by_accept_header_or_format_parameter(admin_client, used):
    by_accept = _rows(admin_client.get("/api/v1/usage", {"groupBy": "namespace,product", **WINDOW},
                                       HTTP_ACCEPT="text/csv"))
    assert by_accept == [["namespace", "product", "deviceHours", "deviceSeconds", "cost", "currency",
                          "unpricedDeviceHours"],
                         ["team-a", H100, "4.0", "14400.0", "", "", "4.0"],
                         ["team-b", H100, "1.0", "3600.0", "", "", "1.0"]]
    assert _rows(admin_client.get("/api/v1/usage", {"groupBy": "namespace,product", "format": "csv", **WINDOW})) \
        == by_accept


@pytest.mark.parametrize("params,field", [
    ({"groupBy": "namespace,colour"}, "groupBy"),
    ({"since": "yesterday"}, "since"),
    ({"since": "2026-03-01"}, "since"),  # a date is not an RFC 3339 date-time
    ({"until": "2026-03-01T00:00:00"}, "until"),  # no offset
    ({"since": "0001-01-01T00:00:00+01:00"}, "since"),  # before year 1 in UTC
    ({"until": "2026-02-30T00:00:00Z"}, "until"),
    ({"since": "2026-03-02T00:00:00Z", "until": "2026-03-01T00:00:00+01:00"}, "until"),
])
def test_bad_parameters_are_a_400_naming_the_field(admin_client, db, params, field):
    for extra in ({}, {"format": "csv"}):
        resp = admin_client.get("/api/v1/usage", {**params, **extra})
        assert resp.status_code == 400 and resp["Content-Type"] == "application/problem+json"
        assert [e["field"] for e in resp.json()["errors"]] == [field]


def test_prices_admins_write_everyone_reads_and_reports_carry_cost(admin_client, ns_client, used):
    tenant = ns_client("team-a")
    body = {"product": H100, "currency": "EUR", "pricePerDeviceHour": "2.50"}
    assert tenant.post("/api/v1/prices", body, format="json").status_code == 403
    created = admin_client.post("/api/v1/prices", body, format="json")
    assert created.status_code == 201 and created.json()["pricePerDeviceHour"] == "2.5"
    assert admin_client.post("/api/v1/prices", body, format="json").status_code == 409
    bad = admin_client.post("/api/v1/prices", {"product": H100, "currency": "euro", "pricePerDeviceHour": -1},
                            format="json")
    assert bad.status_code == 422 and {e["field"] for e in bad.json()["errors"]} == {"currency", "pricePerDeviceHour"}
    assert tenant.get("/api/v1/prices").json()["items"][0]["product"] == H100
    report = admin_client.get("/api/v1/usage", WINDOW).json()
    assert {i["namespace"]: (i["cost"], i["currency"]) for i in report["items"]} == {
        "team-a": (10.0, "EUR"), "team-b": (2.5, "EUR")}
    # A cluster-specific price beats the product-wide one.
    on_c1 = admin_client.post("/api/v1/prices", {**body, "cluster": "c1", "pricePerDeviceHour": 3},
                              format="json").json()
    assert tenant.get("/api/v1/usage", WINDOW).json()["items"][0]["cost"] == 12.0
    stale = admin_client.put(f"/api/v1/prices/{on_c1['id']}", {**body, "cluster": "c1", "pricePerDeviceHour": 4},
                             format="json", HTTP_IF_MATCH='"99"')
    assert stale.status_code == 412
    put = admin_client.put(f"/api/v1/prices/{on_c1['id']}", {**body, "cluster": "c1", "pricePerDeviceHour": 4},
                           format="json", HTTP_IF_MATCH=f'"{on_c1["resourceVersion"]}"')
    assert put.status_code == 200 and put.json()["resourceVersion"] == "2"
    assert tenant.get("/api/v1/usage", WINDOW).json()["items"][0]["cost"] == 16.0
    assert tenant.delete(f"/api/v1/prices/{on_c1['id']}").status_code == 403
    assert admin_client.delete(f"/api/v1/prices/{on_c1['id']}").status_code == 204
    assert admin_client.get(f"/api/v1/prices/{on_c1['id']}").status_code == 404
    assert tenant.get("/api/v1/usage", WINDOW).json()["items"][0]["cost"] == 10.0


def test_history_of_a_node_and_of_a_device(admin_client, ns_client, used):
    node = ResourceClaim.objects.get(name="a").node
    body = admin_client.get("/api/v1/usage/history", {"cluster": "c1", "node": node}).json()
    assert body["kind"] == "UsageIntervalList" and len(body["items"]) == 3
    first = body["items"][0]
    assert first["claim"] == "team-a/a" and first["start"] == "2026-03-02T09:00:00Z" and first["end"] is None
    assert first["weight"] == 1.0 and first["sharing"] == "exclusive"
    b = [i for i in body["items"] if i["namespace"] == "team-b"][0]
    assert b["end"] == "2026-03-02T10:00:00Z"
    assert len(ns_client("team-a").get("/api/v1/usage/history", {"cluster": "c1", "node": node}).json()["items"]) == 2
    one = admin_client.get("/api/v1/usage/history", {"cluster": "c1", "device": b["device"]}).json()["items"]
    assert [i["claim"] for i in one] == ["team-b/b"]
    by_name = admin_client.get("/api/v1/usage/history", {"cluster": "c1", "device": b["device"].split("/")[-1]})
    assert [i["claim"] for i in by_name.json()["items"]] == ["team-b/b"]
    # The window: b ended at 10:00, so a window from 10:30 leaves only team-a's (still open) intervals.
    later = admin_client.get("/api/v1/usage/history", {"cluster": "c1", "node": node,
                                                       "since": "2026-03-02T10:30:00Z"}).json()["items"]
    assert {i["namespace"] for i in later} == {"team-a"}
    # RFC 3339 allows offsets up to +/-23:59 (PostgreSQL only +/-15:59): 10:30 UTC written at +23:59.
    far = admin_client.get("/api/v1/usage/history", {"cluster": "c1", "node": node,
                                                     "since": "2026-03-03T10:29:00+23:59"})
    assert far.status_code == 200 and {i["namespace"] for i in far.json()["items"]} == {"team-a"}
    paged = admin_client.get("/api/v1/usage/history", {"cluster": "c1", "node": node, "limit": 2}).json()
    assert len(paged["items"]) == 2 and paged["metadata"]["continue"]
    missing = admin_client.get("/api/v1/usage/history", {"node": node})
    assert missing.status_code == 400 and [e["field"] for e in missing.json()["errors"]] == ["cluster"]
    assert admin_client.get("/api/v1/usage/history", {"cluster": "c1"}).json()["errors"][0]["field"] == "node"


def test_the_ledger_outlives_deleted_claims(admin_client, used, clock):
    claim_services.delete_claim(ResourceClaim.objects.get(name="b").id)
    assert hours_by(admin_client.get("/api/v1/usage", WINDOW).json())["team-b"] == 1.0
    assert UsageInterval.objects.filter(namespace="team-b").count() == 1


def test_the_usage_page_charts_and_exports(django_user_model, used):
    viewer = django_user_model.objects.create_user("viewer", "v@example.com", "pw")
    client = Client()
    assert client.get("/usage/").status_code == 302  # login first
    client.force_login(viewer)
    page = client.get("/usage/", {"group": "namespace", "range": "7d"})
    html = page.content.decode()
    assert page.status_code == 200 and 'data-testid="usage-chart"' in html and 'id="data-usage"' in html
    assert html.count('data-testid="usage-row"') == 2 and "4.00" in html
    assert 'href="/usage/"' in html  # the nav link
    export = page.context["csv_url"]
    assert export.startswith("/api/v1/usage?groupBy=namespace%2Cproduct") and "format=csv" in export
    rows = _rows(client.get(export))
    assert rows[0][:2] == ["namespace", "product"] and len(rows) == 3
    chart = page.context["chart"]
    assert len(chart["labels"]) == 7 and {s["label"] for s in chart["series"]} == {"team-a", "team-b"}
    assert sum(sum(s["data"]) for s in chart["series"]) == pytest.approx(5.0)
    assert client.get("/usage/", {"group": "bogus", "range": "x"}).status_code == 200  # falls back to defaults
