"""Preemption with notice through the whole safe-release flow (in this process; the webhook is a real HTTP
receiver on a local port, or a dead one)."""
from __future__ import annotations

import base64

import pytest
from standardwebhooks.webhooks import Webhook

from claims.models import ClaimEvent, DeviceAllocation, Phase, ResourceClaim
from claims.services.allocation import allocate_round
from draservice.models import DeliveryStatus, WebhookDelivery
from queues.models import Preemption, PreemptionState
from queues.services import preemption, reclaim
from tests.queues.conftest import queue_body
from tests.queues.receivers import Receiver
from tests.queues.test_admission import make, ns, rounds, submit

pytestmark = pytest.mark.django_db

SECRET = "whsec_" + base64.b64encode(b"0123456789abcdef-secret-key-32by").decode()


def borrowed_fleet(admin_client, grace=0, webhook=None, min_runtime=0):
    """team-a: nominal 8, idle. The default queue borrows all 16 GPUs (16 one-GPU claims in "ci")."""
    pre = {"graceSeconds": grace, "minRuntimeSeconds": min_runtime}
    if webhook:
        pre["webhook"] = {"url": webhook, "secret": SECRET}
    assert admin_client.patch("/api/v1/queues/default", {"spec": {"preemption": pre}}, format="json").status_code == 200
    make(admin_client, queue_body("team-a", namespaces=["a"], gpus=8))
    for i in range(16):
        submit(admin_client, "ci", f"ci{i}")
    rounds(1)
    assert ResourceClaim.objects.filter(phase=Phase.ALLOCATED).count() == 16


def test_a_within_quota_claim_reclaims_from_a_borrower(admin_client, h100_fleet):
    borrowed_fleet(admin_client, grace=30)
    submit(admin_client, "a", "mine", 4)
    rounds(1)
    assert ResourceClaim.objects.get(name="mine").reason == "Unsatisfiable"
    out = reclaim.run()
    assert out["preemptions"] == 1 and out["victims"] == 4, out  # fewest: four 1-GPU claims on one node
    victims = ResourceClaim.objects.filter(preemptions__state=PreemptionState.PENDING)
    assert victims.count() == 4 and {v.namespace.name for v in victims} == {"ci"}
    for v in victims:
        cond = next(c for c in v.conditions if c["type"] == "Preempted")
        assert cond["status"] == "True" and cond["reason"] == "PreemptionPending" and "released at" in cond["message"]
        assert v.phase == Phase.ALLOCATED  # notice first: it keeps its devices until the deadline
    got = admin_client.get(f"{ns('ci')}/resourceclaims/{victims[0].name}").json()["status"]
    assert any(c["type"] == "Preempted" and c["reason"] == "PreemptionPending" for c in got["conditions"])
    # Nothing happens before the deadline; a second pass does not pick more victims for the same claim.
    assert reclaim.run()["victims"] == 0 and preemption.sweep() == 0
    Preemption.objects.update(deadline=Preemption.objects.first().created_at)  # the deadline passes
    assert preemption.sweep() == 4
    for v in ResourceClaim.objects.filter(id__in=[v.id for v in victims]):
        assert v.phase == Phase.PENDING and v.reason == "Preempted" and not DeviceAllocation.objects.filter(claim=v)
        assert next(c for c in v.conditions if c["type"] == "Preempted")["reason"] == "Preempted"
    allocate_round()
    assert ResourceClaim.objects.get(name="mine").phase == Phase.ALLOCATED
    assert ClaimEvent.objects.filter(reason="PreemptionPending").count() == 4
    assert ClaimEvent.objects.filter(type="Preempted", reason="Preempted").count() == 4
    # The victims wait at their original place: before any younger claim of their queue.
    submit(admin_client, "ci", "younger")
    allocate_round()
    pos = admin_client.get(f"{ns('ci')}/resourceclaims/younger").json()["status"]["positionInQueue"]
    assert pos == 5


def test_no_victims_when_over_nominal_or_too_young(admin_client, h100_fleet):
    borrowed_fleet(admin_client, min_runtime=3600)
    submit(admin_client, "a", "mine", 4)
    rounds(1)
    assert reclaim.run()["victims"] == 0  # the borrowers are younger than minRuntimeSeconds
    ResourceClaim.objects.filter(namespace__name="ci").update(allocated_at="2020-01-01T00:00:00Z")
    submit(admin_client, "a", "over", 8)  # 4 + 8 > nominal 8: not within quota, reclaims nothing
    rounds(1)
    Preemption.objects.all().delete()
    out = reclaim.run()
    assert out["victims"] == 4 and not Preemption.objects.filter(preemptor__name="over").exists()


def test_webhook_is_signed_and_a_dead_receiver_still_preempts(admin_client, h100_fleet, settings):
    receiver = Receiver()
    settings.WEBHOOK_ALLOWED_TARGETS = [receiver.target]
    try:
        borrowed_fleet(admin_client, webhook=receiver.url())
        submit(admin_client, "a", "mine", 1)
        rounds(1)
        with pytest.MonkeyPatch.context() as mp:  # on_commit runs at once inside this test's transaction
            mp.setattr("django.db.transaction.on_commit", lambda fn, *a, **k: fn())
            assert reclaim.run()["victims"] == 1  # no broker, no runner: the delivery runs inline
    finally:
        receiver.close()
    request = receiver.requests[-1]
    notice = Webhook(SECRET).verify(request.body, request.head)
    assert notice["kind"] == "PreemptionNotice" and notice["preemptor"] == {"namespace": "a", "name": "mine"}
    delivery = WebhookDelivery.objects.get()
    assert (delivery.status, delivery.attempts, delivery.owner) == (DeliveryStatus.DELIVERED, 1, "queue/default")
    assert Preemption.objects.get().webhook_status == f"notice {delivery.message_id}"
    # A dead receiver: the attempt fails (a retry is scheduled), the victim is requeued all the same.
    allocate_round()
    assert ResourceClaim.objects.get(name="mine").phase == Phase.ALLOCATED
    submit(admin_client, "a", "mine2", 1)
    rounds(1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("django.db.transaction.on_commit", lambda fn, *a, **k: fn())
        out = reclaim.run()
    assert out["victims"] == 1 and out["requeued"] == 1
    dead = Preemption.objects.get(preemptor__name="mine2")
    assert dead.state == PreemptionState.DONE
    failed = WebhookDelivery.objects.exclude(pk=delivery.pk).get()
    assert failed.status == DeliveryStatus.PENDING and failed.attempts == 1 and "refused" in failed.last_error
    assert failed.next_attempt_at > failed.last_attempt_at  # backoff
    allocate_round()
    assert ResourceClaim.objects.get(name="mine2").phase == Phase.ALLOCATED


def test_a_gang_within_quota_reclaims_whole_nodes(admin_client, h100_fleet):
    from claims.services import claims as claim_services
    from gangs.models import Gang, GangPhase
    from gangs.services.placement import place_next
    from tests.gangs.fleet import gang_body, template_body

    borrowed_fleet(admin_client, grace=0)
    claim_services.create_template("a", template_body("h100x4", 4))
    resp = admin_client.post(f"{ns('a')}/gangs", gang_body("train", 2, template="h100x4", required=None,
                                                           preferred=None), format="json")
    assert resp.status_code == 201, resp.content
    place_next()
    gang = Gang.objects.get(name="train")
    assert gang.phase == GangPhase.PENDING, gang.reason
    out = reclaim.run()
    # 8 GPUs for a gang of two 4-GPU members on one node or two: the fewest victims are one whole node's 8.
    assert out["preemptions"] == 1 and out["victims"] == 8 and out["requeued"] == 8, out
    victims = ResourceClaim.objects.filter(preemptions__state=PreemptionState.DONE)
    assert {v.namespace.name for v in victims} == {"ci"} and all(v.phase == Phase.PENDING for v in victims)
    assert ClaimEvent.objects.filter(reason="PreemptionPending", message__contains="for gang a/train").count() == 8
    place_next()
    gang.refresh_from_db()
    assert gang.phase == GangPhase.PLACED, (gang.reason, gang.message)


def test_a_pass_decides_the_oldest_waiting_claim_and_defers_the_rest_past_its_time_budget(admin_client, h100_fleet):
    """The pass runs on the allocation workers every 5 s: its time is bounded (``reclaim.PASS_SECONDS``), the
    oldest waiting claim is always decided, the younger ones wait for the next pass."""
    borrowed_fleet(admin_client, grace=30)
    submit(admin_client, "a", "first", 4)
    submit(admin_client, "a", "second", 4)
    rounds(1)
    out = reclaim.run(budget=0.0)
    assert out["preemptions"] == 1 and out["deferred"] == 1, out
    assert {p.preemptor.name for p in Preemption.objects.all()} == {"first"}
    out = reclaim.run()  # the next pass, with time to spare: the younger one's turn
    assert out["preemptions"] == 1 and "deferred" not in out, out
    assert {p.preemptor.name for p in Preemption.objects.all()} == {"first", "second"}


def test_a_queue_of_alike_claims_reads_the_running_claims_once_per_pass(admin_client, h100_fleet, monkeypatch):
    """Thousands of pending claims of one queue and priority, none of which may preempt anyone (equals do not
    give way): a pass looks for candidates once, not once per claim; a higher-priority claim is still looked
    at, and finds its lower-priority victims."""
    resp = admin_client.patch("/api/v1/queues/default", {"spec": {"maxPriority": 10}}, format="json")
    assert resp.status_code == 200, resp.content
    for i in range(16):
        submit(admin_client, "ci", f"run{i}")
    rounds(1)
    for i in range(6):
        submit(admin_client, "ci", f"wait{i}", 2)
    rounds(1)
    looked = []
    rows_read = {}
    real = preemption.candidates

    def spy(claim, *args, **kwargs):
        looked.append(claim.name)
        found = real(claim, *args, **kwargs)
        rows_read[claim.name] = len(found[1]) if found else None
        return found

    monkeypatch.setattr(preemption, "candidates", spy)
    out = reclaim.run()
    assert looked == ["wait0"] and out["victims"] == 0  # wait1..wait5 need as much: no candidate either
    # Usage is summed by the database, and the running equals are not read one by one (at 18,000 allocated
    # claims reading them, and filtering by id arrays, made a pass take seconds).
    assert rows_read == {"wait0": 0}
    submit(admin_client, "ci", "urgent", 2, labels={"draservice.io/priority": "5"})
    rounds(1)
    looked.clear()
    out = reclaim.run()
    assert "urgent" in looked and out["victims"] == 2
