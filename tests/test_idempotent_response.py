"""draservice.idempotent: the one shape of the doors' idempotent creates (headers from the runner's verdict)."""
from __future__ import annotations

from rest_framework.test import APIRequestFactory

from draservice.idempotent import create_response


def _runner(replayed: bool, seen: list):
    def run(scope, key, body, fn, **options):
        seen.append((scope, key, body, options))
        return (*fn(), replayed)
    return run


def test_first_answer_names_the_created_object_and_passes_key_scope_and_options():
    seen: list = []
    request = APIRequestFactory().post("/api/v1/namespaces/a/gangs/", HTTP_IDEMPOTENCY_KEY="k-1")
    resp = create_response(request, "a:gangs", {"x": 1}, lambda: (201, {"metadata": {"name": "g1"}}),
                           _runner(False, seen), location=True, atomic=False)
    assert resp.status_code == 201 and resp.data == {"metadata": {"name": "g1"}}
    assert resp["Location"] == "/api/v1/namespaces/a/gangs/g1"
    assert "Idempotent-Replayed" not in resp
    assert seen == [("a:gangs", "k-1", {"x": 1}, {"atomic": False, "refresh": None})]


def test_a_replay_is_marked_and_without_location_none_is_set():
    seen: list = []
    request = APIRequestFactory().post("/api/v1/namespaces/a/resourceclaims/batch")
    resp = create_response(request, "a:resourceclaims/batch", {}, lambda: (201, {"items": []}), _runner(True, seen))
    assert resp["Idempotent-Replayed"] == "true" and "Location" not in resp
    assert seen[0][1] is None  # no key header: the runner is told so
