"""``POST /api/v1/simulate`` against the stored fleet runs the cycle's queue admission on a copy (issue 30): it
answers ``WaitingForQuota`` for a claim the worker leaves waiting, with its position, estimate and the claims the
preemption pass would notice for it -- and writes nothing."""
from __future__ import annotations

import pytest

from claims.models import DeviceAllocation, Phase, ResourceClaim
from queues.models import Preemption, PreemptionState, QuotaCharge
from scheduler.services import reclaim
from tests.claims.fleet import gpu_claim
from tests.queues.conftest import queue_body
from tests.queues.test_admission import make, rounds, submit
from tests.queues.test_preemption import borrowed_fleet

pytestmark = pytest.mark.django_db


def simulate(client, namespace: str, name: str, count: int = 1) -> dict:
    body = gpu_claim(name, count)
    body["metadata"]["namespace"] = namespace
    resp = client.post("/api/v1/simulate", {"claims": [body]}, format="json")
    assert resp.status_code == 200, resp.content
    return resp.json()


def test_simulate_answers_waiting_for_quota_with_its_position_as_the_worker_then_does(admin_client, h100_fleet):
    make(admin_client, queue_body("team-q", namespaces=["q"], gpus=2, borrowing=0))
    said = []
    for i in range(4):
        sim = simulate(admin_client, "q", f"c{i}")
        said.append((sim["allocated"], sim["reason"] if not sim["allocated"] else "", sim["queue"].get("position")))
        submit(admin_client, "q", f"c{i}")
        rounds(1)
    assert said == [(True, "", None), (True, "", None), (False, "WaitingForQuota", 1), (False, "WaitingForQuota", 2)]
    assert {c.name: (c.phase, c.reason) for c in ResourceClaim.objects.filter(phase=Phase.PENDING)} == {
        "c2": (Phase.PENDING, "WaitingForQuota"), "c3": (Phase.PENDING, "WaitingForQuota")}
    sim = simulate(admin_client, "q", "c4")
    assert sim["allocated"] is False and sim["cluster"] is None and sim["claims"][0]["allocation"] is None
    assert sim["queue"]["name"] == "team-q" and sim["queue"]["position"] == 3 and sim["queue"]["preemptions"] == []
    assert "estimate" in sim["queue"] or "estimatedStartTime" in sim["queue"]
    assert QuotaCharge.objects.count() == 2  # nothing charged by the simulations


def test_simulate_names_the_victims_the_pass_then_notices_and_marks_none(admin_client, h100_fleet):
    borrowed_fleet(admin_client, grace=30)
    sim = simulate(admin_client, "a", "mine", 4)
    assert sim["allocated"] is False and sim["reason"] == "unsatisfiable"  # the engine's word, as before
    named = {(v["namespace"], v["name"]) for v in sim["queue"]["preemptions"]}
    assert len(named) == 4 and {ns for ns, _ in named} == {"ci"}
    assert Preemption.objects.count() == 0 and DeviceAllocation.objects.count() == 16  # nothing written
    submit(admin_client, "a", "mine", 4)
    rounds(1)
    assert reclaim.run()["victims"] == 4
    noticed = {(v.namespace.name, v.name) for v in ResourceClaim.objects.filter(
        preemptions__state=PreemptionState.PENDING).select_related("namespace")}
    assert noticed == named
