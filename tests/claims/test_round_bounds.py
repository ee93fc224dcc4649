"""What one claim can cost the others: attempts, retries, lock scope, and what the API says afterwards."""
from __future__ import annotations

import pytest
from django.db import connection
from django.utils import timezone

from claims.models import ClaimEvent, Namespace, ResourceClaim
from scheduler.services import allocation
from tests.claims.fleet import gpu_claim

pytestmark = pytest.mark.django_db

NS = "/api/v1/namespaces/team-a"


def run_rounds(limit: int = 20) -> int:
    rounds = 0
    while allocation.allocate_round().taken:
        rounds += 1
        assert rounds < limit, "the round keeps taking the same claims"
    return rounds


def status(client, name):
    resp = client.get(f"{NS}/resourceclaims/{name}")
    assert resp.status_code == 200, resp.content
    return resp.json()["status"]


def _stored_claim(name: str, spec: dict) -> ResourceClaim:
    """A claim as an older release stored it, before creation-time checks existed (bypassing the API)."""
    ns, _ = Namespace.objects.get_or_create(name="team-a")
    return ResourceClaim.objects.create(namespace=ns, name=name, spec=spec)


def test_a_claim_over_the_limit_fails_after_one_attempt(admin_client, small_fleet):
    claim = _stored_claim("big-64", gpu_claim("big-64", count=64)["spec"])
    run_rounds()
    claim.refresh_from_db()
    assert claim.phase == "Failed" and claim.attempts == 1, (claim.phase, claim.reason, claim.message)
    assert "64" in claim.message and "32" in claim.message
    assert allocation.allocate_round().taken == 0


def test_a_consumer_claim_waiting_on_a_failed_member_is_not_retried_in_a_loop(admin_client, small_fleet):
    big = _stored_claim("member-big", gpu_claim("member-big", count=64)["spec"])
    resp = admin_client.post(f"{NS}/resourceclaims/batch", {"items": [gpu_claim("member-ok"), {
        "kind": "Consumer", "metadata": {"name": "pod"}, "spec": {"resourceClaims": [
            {"name": "a", "resourceClaimName": "member-big"}, {"name": "b", "resourceClaimName": "member-ok"}]}}]},
        format="json")
    assert resp.status_code == 201, resp.content
    run_rounds()
    big.refresh_from_db()
    ok = ResourceClaim.objects.get(name="member-ok")
    assert big.phase == "Failed" and big.attempts == 1
    assert ok.phase == "Pending" and ok.attempts == 1
    assert "member-big" in ok.message


def test_a_pending_claim_is_tried_once_while_nothing_changes(admin_client, small_fleet):
    assert admin_client.post(f"{NS}/resourceclaims", gpu_claim("too-big", count=32), format="json").status_code == 201
    for _ in range(5):
        run_rounds()
        admin_client.post("/api/v1/clusters/c1/heartbeat", {}, format="json")  # a live, unchanged fleet
    st = status(admin_client, "too-big")
    assert st["phase"] == "Pending" and st["attempts"] == 1
    assert ClaimEvent.objects.filter(claim_name="too-big", type="AllocationAttempt").count() == 1
    # A change to the claim itself is what allows another attempt.
    admin_client.patch(f"{NS}/resourceclaims/too-big", {"metadata": {"labels": {"retry": "1"}}}, format="json")
    run_rounds()
    assert status(admin_client, "too-big")["attempts"] == 2


def test_no_claim_row_is_locked_while_the_engine_decides(admin_client, small_fleet, monkeypatch):
    """The engine runs with no transaction open: another session may update the batch's claims meanwhile,
    and the round then leaves the changed claim as it is now instead of overwriting it."""
    from dra.engine.engine import Engine

    assert admin_client.post(f"{NS}/resourceclaims", gpu_claim("slow"), format="json").status_code == 201
    real = Engine.allocate
    seen = {}

    def allocate(self, group, **kw):
        seen["in_transaction"] = connection.in_atomic_block and not _test_wrapper_only()
        ResourceClaim.objects.filter(name="slow").update(resource_version=99, labels={"edited": "yes"})
        return real(self, group, **kw)

    monkeypatch.setattr(Engine, "allocate", allocate)
    r = allocation.allocate_round()
    assert seen["in_transaction"] is False
    assert r.allocated == 0 and r.lost_race == 1
    claim = ResourceClaim.objects.get(name="slow")
    assert claim.resource_version == 99 and claim.labels == {"edited": "yes"} and claim.taken_until is None
    monkeypatch.setattr(Engine, "allocate", real)
    assert allocation.allocate_round().allocated == 1


def test_devices_decided_for_a_claim_released_mid_round_are_free_for_the_next(admin_client, small_fleet,
                                                                             monkeypatch):
    """Of two 8-GPU nodes one is held; the round's cached engine gives the other to a claim released while the
    engine ran. The round does not write it, and the next 8-GPU claim must still find that node free (its
    devices stayed "in use" in the cached engine before)."""
    from claims.services import claims as claim_services
    from dra.engine.engine import Engine

    assert admin_client.post(f"{NS}/resourceclaims", gpu_claim("hold", count=8), format="json").status_code == 201
    run_rounds()
    assert status(admin_client, "hold")["phase"] == "Allocated"
    assert admin_client.post(f"{NS}/resourceclaims", gpu_claim("gone", count=8), format="json").status_code == 201
    real = Engine.allocate

    def allocate(self, group, **kw):
        outcome = real(self, group, **kw)
        claim_services.release_claim(ResourceClaim.objects.get(name="gone").id)
        return outcome

    monkeypatch.setattr(Engine, "allocate", allocate)
    r = allocation.allocate_round()
    assert r.allocated == 0 and r.lost_race == 1
    monkeypatch.setattr(Engine, "allocate", real)
    assert admin_client.post(f"{NS}/resourceclaims", gpu_claim("next", count=8), format="json").status_code == 201
    run_rounds()
    assert status(admin_client, "next")["phase"] == "Allocated", status(admin_client, "next")


def _test_wrapper_only() -> bool:
    # pytest-django wraps each test in one atomic block (and our savepoints nest inside it): only deeper
    # blocks are the code's own.
    return len(connection.savepoint_ids) == 0


def test_renew_then_edit_keeps_lease_fields_in_agreement(admin_client, small_fleet):
    body = gpu_claim("leased", annotations={"draservice.io/lease-ttl": "30m"})
    created = admin_client.post(f"{NS}/resourceclaims", body, format="json")
    assert created.status_code == 201
    assert created.json()["status"]["lease"] == {"leaseDurationSeconds": 1800, "expireTime": None,
                                                 "renewTime": None}  # the walltime starts at allocation
    run_rounds()
    assert admin_client.post(f"{NS}/resourceclaims/leased/renew", {"ttl": "2h"}, format="json").status_code == 200
    resp = admin_client.patch(f"{NS}/resourceclaims/leased", {"metadata": {"labels": {"team": "x"}}}, format="json")
    assert resp.status_code == 200, resp.content
    lease = resp.json()["status"]["lease"]
    assert lease["leaseDurationSeconds"] == 7200
    assert resp.json()["metadata"]["annotations"]["draservice.io/lease-ttl"] == "2h"
    left = (timezone.datetime.fromisoformat(lease["expireTime"].replace("Z", "+00:00")) - timezone.now())
    assert 7100 < left.total_seconds() <= 7200
    # Changing the TTL by an edit starts a fresh lease of that length: both fields follow.
    resp = admin_client.patch(f"{NS}/resourceclaims/leased",
                              {"metadata": {"annotations": {"draservice.io/lease-ttl": "10m"}}}, format="json")
    lease = resp.json()["status"]["lease"]
    left = (timezone.datetime.fromisoformat(lease["expireTime"].replace("Z", "+00:00")) - timezone.now())
    assert lease["leaseDurationSeconds"] == 600 and 500 < left.total_seconds() <= 600


def test_idempotent_replay_shows_the_claim_as_it_is_now(admin_client, small_fleet):
    headers = {"HTTP_IDEMPOTENCY_KEY": "job-7"}
    first = admin_client.post(f"{NS}/resourceclaims", gpu_claim("job-7"), format="json", **headers)
    assert first.status_code == 201 and first.json()["status"]["phase"] == "Pending"
    run_rounds()
    admin_client.post(f"{NS}/resourceclaims/job-7/release")
    again = admin_client.post(f"{NS}/resourceclaims", gpu_claim("job-7"), format="json", **headers)
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert again.json()["status"]["phase"] == "Released"
    assert ResourceClaim.objects.filter(name="job-7").count() == 1


def test_null_spec_follows_upstream_defaulting_and_says_so(admin_client, small_fleet):
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "empty"}, "spec": None}
    assert admin_client.post(f"{NS}/resourceclaims", body, format="json").status_code == 201
    created = ClaimEvent.objects.get(claim_name="empty", type="Created")
    assert "no device requests" in created.message
    run_rounds()
    st = status(admin_client, "empty")
    assert st["phase"] == "Allocated" and "no devices" in st["message"]


HOSTILE = ("[" + ",".join(str(i) for i in range(1000)) + "].all(x, [" + ",".join(str(i) for i in range(1000)) +
           "].all(y, (has(device.attributes['gpu.nvidia.com'].uuid) ? device.attributes['gpu.nvidia.com'].uuid "
           ": 'z').size() + x + y > 0))")


def test_an_expensive_selector_is_refused_at_creation_and_bounded_when_already_stored(admin_client, small_fleet):
    body = gpu_claim("hostile")
    body["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [{"cel": {"expression": HOSTILE}}]
    resp = admin_client.post(f"{NS}/resourceclaims", body, format="json")
    assert resp.status_code == 422, resp.content
    assert resp.json()["errors"][0]["field"] == "spec.devices.requests[0].exactly.selectors[0].cel.expression"
    # Stored by an older release: the round stops it within its CEL budget and fails it once, for good.
    hostile = _stored_claim("hostile", body["spec"])
    assert admin_client.post(f"{NS}/resourceclaims", gpu_claim("canary"), format="json").status_code == 201
    run_rounds()
    hostile.refresh_from_db()
    assert hostile.phase == "Failed" and hostile.attempts == 1, (hostile.reason, hostile.message)
    assert hostile.reason in ("CELBudgetExceeded", "CELError")
    assert status(admin_client, "canary")["phase"] == "Allocated"


def test_a_bad_pending_timeout_is_refused_naming_the_annotation(admin_client, small_fleet):
    for value, says in (("forever", "invalid duration"), ("31d", "between 5s and 30d"), ("1s", "between 5s")):
        body = gpu_claim("w", annotations={"draservice.io/pending-timeout": value})
        resp = admin_client.post(f"{NS}/resourceclaims", body, format="json")
        assert resp.status_code in (400, 422), resp.content
        text = resp.content.decode()
        assert "metadata.annotations[draservice.io/pending-timeout]" in text and says in text, text
    assert not ResourceClaim.objects.filter(name="w").exists()
    body = gpu_claim("w", annotations={"draservice.io/pending-timeout": "30m"})
    assert admin_client.post(f"{NS}/resourceclaims", body, format="json").status_code == 201
    w = ResourceClaim.objects.get(name="w")
    assert abs(w.pending_deadline - w.created_at - timezone.timedelta(minutes=30)).total_seconds() < 1
    run_rounds()
    assert ResourceClaim.objects.get(name="w").pending_deadline is None  # allocated: the bound is over
