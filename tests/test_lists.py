"""One list pagination for every list endpoint: ``?limit=``, an opaque ``?continue=`` token in
``metadata.continue``, a list-level ``metadata.resourceVersion`` (monotonic), and the inventory's old
``results``/``next``/``?cursor=`` kept as a deprecated alias (with a Warning header)."""
from __future__ import annotations

import pytest

from tests.claims.fleet import gpu_claim, load_fleet

pytestmark = pytest.mark.django_db

LISTS = [
    "/api/v1/clusters", "/api/v1/nodes", "/api/v1/resourceslices", "/api/v1/pools", "/api/v1/poolevents",
    "/api/v1/devices", "/api/v1/deviceclasses", "/api/v1/devicetainterules", "/api/v1/utilisation",
    "/api/v1/namespaces", "/api/v1/resourceclaims", "/api/v1/namespaces/ci/resourceclaims",
    "/api/v1/namespaces/ci/resourceclaimtemplates", "/api/v1/namespaces/ci/consumers", "/api/v1/gangs",
    "/api/v1/namespaces/ci/gangs", "/api/v1/namespaces/ci/resourceclaims/c0/events", "/api/v1/queues",
]


@pytest.fixture
def fleet(admin_client):
    load_fleet({"c1": [("h100", 2)], "c2": [("h100", 1)]})
    for i in range(3):
        assert admin_client.post("/api/v1/namespaces/ci/resourceclaims", gpu_claim(f"c{i}"),
                                 format="json").status_code == 201


def _page(client, url, **params):
    resp = client.get(url, params)
    assert resp.status_code == 200, (url, resp.content[:300])
    return resp, resp.json()


@pytest.mark.parametrize("url", LISTS)
def test_every_list_pages_with_limit_and_continue(admin_client, fleet, url):
    _, whole = _page(admin_client, url)
    meta = whole["metadata"]
    assert int(meta["resourceVersion"]) > 0 and "continue" not in meta
    everything = whole["items"]
    seen, token, pages = [], None, 0
    while True:
        resp, body = _page(admin_client, url, limit=1, **({"continue": token} if token else {}))
        assert len(body["items"]) <= 1
        seen += body["items"]
        pages += 1
        token = body["metadata"].get("continue")
        if not token:
            break
        assert pages <= len(everything) + 1, "the continue token does not move on"
    assert seen == everything
    if len(everything) > 1:
        assert pages >= len(everything)


@pytest.mark.parametrize("url", [u for u in LISTS if "namespaces" not in u and "claims" not in u
                                 and "gangs" not in u and "queues" not in u])
def test_the_inventory_keeps_results_next_and_cursor_as_a_deprecated_alias(admin_client, fleet, url):
    resp, body = _page(admin_client, url, limit=1)
    assert body["results"] == body["items"] and "deprecated" in resp["Warning"]
    if body["next"]:
        cursor = body["metadata"]["continue"]
        _, by_cursor = _page(admin_client, url, limit=1, cursor=cursor)  # the old parameter still works
        _, by_continue = _page(admin_client, url, limit=1, **{"continue": cursor})
        assert by_cursor["items"] == by_continue["items"]
        follow = admin_client.get(body["next"])  # and so does following next
        assert follow.status_code == 200 and follow.json()["items"] == by_continue["items"]


def test_the_list_resource_version_only_grows(admin_client, fleet):
    before = int(_page(admin_client, "/api/v1/namespaces/ci/resourceclaims")[1]["metadata"]["resourceVersion"])
    admin_client.post("/api/v1/namespaces/ci/resourceclaims", gpu_claim("later"), format="json")
    after = int(_page(admin_client, "/api/v1/namespaces/ci/resourceclaims")[1]["metadata"]["resourceVersion"])
    assert after >= before


@pytest.mark.parametrize("url", LISTS)
def test_an_ordering_parameter_never_breaks_a_list(admin_client, fleet, url):
    resp = admin_client.get(url, {"ordering": "-id"})
    assert resp.status_code in (200, 400), (url, resp.status_code, resp.content[:200])
