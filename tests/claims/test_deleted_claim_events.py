"""A deleted claim's audit trail stays reachable at the same URL (the README's promise), tenancy unchanged."""
from __future__ import annotations

import pytest

from claims.models import ClaimEvent
from tests.claims.fleet import gpu_claim

pytestmark = pytest.mark.django_db

URL = "/api/v1/namespaces/team-a/resourceclaims"


def types(resp) -> list[str]:
    assert resp.status_code == 200, resp.content
    return [e["type"] for e in resp.json()["items"]]


def test_events_of_a_deleted_claim_and_of_each_incarnation(admin_client, classes):
    first = admin_client.post(URL, gpu_claim("job"), format="json").json()["metadata"]["uid"]
    assert admin_client.delete(f"{URL}/job").status_code == 200
    assert ClaimEvent.objects.filter(claim_uid=first, claim__isnull=True).count() == 3  # the FK let go, rows stay
    gone = admin_client.get(f"{URL}/job/events")
    assert types(gone) == ["Created", "Released", "Deleted"]
    assert {e["claim"]["uid"] for e in gone.json()["items"]} == {first}
    # The name is taken again: the URL shows the current claim; ?uid= reaches the deleted one.
    second = admin_client.post(URL, gpu_claim("job"), format="json").json()["metadata"]["uid"]
    assert types(admin_client.get(f"{URL}/job/events")) == ["Created"]
    assert types(admin_client.get(f"{URL}/job/events", {"uid": first})) == ["Created", "Released", "Deleted"]
    assert types(admin_client.get(f"{URL}/job/events", {"uid": second})) == ["Created"]
    # Both deleted: the last one's trail.
    admin_client.delete(f"{URL}/job")
    assert {e["claim"]["uid"] for e in admin_client.get(f"{URL}/job/events").json()["items"]} == {second}
    assert types(admin_client.get(f"{URL}/job/events", {"type": "Deleted"})) == ["Deleted"]


def test_unknown_names_and_bad_uids(admin_client, classes):
    missing = admin_client.get(f"{URL}/never/events")
    assert missing.status_code == 404 and missing["Content-Type"] == "application/problem+json"
    admin_client.post(URL, gpu_claim("job"), format="json")
    bad = admin_client.get(f"{URL}/job/events", {"uid": "not-a-uuid"})
    assert bad.status_code == 400 and bad.json()["errors"][0]["field"] == "uid"
    other = "00000000-0000-0000-0000-000000000000"
    assert admin_client.get(f"{URL}/job/events", {"uid": other}).status_code == 404


def test_tenancy_still_applies_to_a_deleted_claims_events(admin_client, ns_client, classes):
    admin_client.post(URL, gpu_claim("private"), format="json")
    admin_client.delete(f"{URL}/private")
    assert types(ns_client("team-a").get(f"{URL}/private/events")) == ["Created", "Released", "Deleted"]
    for path in (f"{URL}/private/events", f"{URL}/never/events"):
        refused = ns_client("team-b").get(path)
        assert refused.status_code == 403  # the same answer whether or not there is a trail
