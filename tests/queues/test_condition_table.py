"""The condition table (``claims.services.conditions``) finds no contradiction in real answers of the API after
a real preemption: a requeued claim is Pending with ``QuotaReserved=False`` and ``Preempted=True`` (reason
``Preempted``); once allocated again it shows ``Preempted=False`` (reason ``Readmitted``) beside
``Allocated=True`` (both were contradictions before: ``QuotaReserved=True`` on a Pending claim, and
``Preempted=True`` beside ``Allocated=True`` after the notice)."""
from __future__ import annotations

import pytest

from claims.models import Phase, ResourceClaim
from claims.services.conditions import violations
from scheduler.services import reclaim
from scheduler.services.allocation import allocate_round
from tests.queues.test_admission import ns, submit
from tests.queues.test_preemption import borrowed_fleet

pytestmark = pytest.mark.django_db


def status_of(client, namespace: str, name: str) -> dict:
    return client.get(f"{ns(namespace)}/resourceclaims/{name}").json()["status"]


def test_the_table_finds_no_contradiction_after_a_requeue_and_a_readmission(admin_client, h100_fleet):
    borrowed_fleet(admin_client, grace=0)
    submit(admin_client, "a", "mine", 4)
    allocate_round()
    out = reclaim.run()  # grace 0: marked and requeued in the same pass
    assert out["victims"] == 4 and out["requeued"] == 4, out
    victims = sorted(ResourceClaim.objects.filter(reason="Preempted").values_list("name", flat=True))
    assert len(victims) == 4
    for name in victims:
        status = status_of(admin_client, "ci", name)
        assert status["phase"] == Phase.PENDING
        assert violations(status["phase"], status["conditions"]) == []
        by_type = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
        assert by_type["QuotaReserved"] == ("False", "Preempted") and by_type["Preempted"] == ("True", "Preempted")
    allocate_round()
    assert ResourceClaim.objects.get(name="mine").phase == Phase.ALLOCATED
    resp = admin_client.post(f"{ns('a')}/resourceclaims/mine/release", {}, format="json")
    assert resp.status_code == 200, resp.content
    allocate_round()
    for name in victims:
        status = status_of(admin_client, "ci", name)
        assert status["phase"] == Phase.ALLOCATED
        assert violations(status["phase"], status["conditions"]) == []
        by_type = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
        assert by_type["Preempted"] == ("False", "Readmitted") and by_type["Allocated"][0] == "True"
