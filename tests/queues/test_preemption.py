"""Preemption with notice through the whole safe-release flow (in this process; the webhook is a real HTTP
receiver on a local port, or a dead one)."""
from __future__ import annotations

import base64

import pytest
from django.db import transaction
from django.utils import timezone
from standardwebhooks.webhooks import Webhook

from claims.models import ClaimEvent, DeviceAllocation, Phase, ResourceClaim
from claims.services import preemption as claim_preemption
from claims.services import wake
from draservice.models import DeliveryStatus, WebhookDelivery
from queues.models import Preemption, PreemptionState
from scheduler.services import preemption, reclaim
from scheduler.services.allocation import allocate_round
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


def two_queues(admin_client, *, a: int, b: int, grace: int = 0, a_borrowing: int = 4) -> None:
    """team-a and team-b, nominal 8 each (team-b borrowing 4) on 16 GPUs: ``a`` one-GPU claims of team-a, two
    rounds, then ``b`` of team-b, two rounds."""
    pre = {"graceSeconds": grace, "minRuntimeSeconds": 0}
    make(admin_client, queue_body("team-a", namespaces=["a"], gpus=8, borrowing=a_borrowing, preemption=pre),
         queue_body("team-b", namespaces=["b"], gpus=8, borrowing=4, preemption=pre))
    for i in range(a):
        submit(admin_client, "a", f"a{i}")
    rounds(2)
    for i in range(b):
        submit(admin_client, "b", f"b{i}")
    rounds(2)


def team_b_reclaims_from_team_a(admin_client, grace: int) -> None:
    """team-a holds 12 (4 borrowed), then team-b asks for its nominal 8."""
    two_queues(admin_client, a=14, b=8, grace=grace)


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
    from claims.services import templates as template_services
    from gangs.models import Gang, GangPhase
    from scheduler.services.gang_placement import place_next
    from tests.gangs.fleet import gang_body, template_body

    borrowed_fleet(admin_client, grace=0)
    template_services.create_template("a", template_body("h100x4", 4))
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


def test_what_a_reclaim_frees_goes_to_the_claims_within_nominal_not_back_to_the_borrower(admin_client, h100_fleet):
    """Two queues of nominal 8 (borrowing 4) on 16 GPUs: team-a borrows 4, then team-b asks for its nominal 8
    and reclaims them. Once requeued, team-a is back at its nominal: it and team-b rank alike by fair share, and
    the freed GPUs must go to team-b's claims (within its nominal), not back to team-a's waiting claims -- which
    would borrow again, be reclaimed again, and so on for ever (found by the preemption chaos, tests/chaos: one
    claim of team-a preempted 23 times for the same claim of team-b)."""
    team_b_reclaims_from_team_a(admin_client, grace=0)

    def held():
        return {ns: DeviceAllocation.objects.filter(claim__namespace__name=ns).count() for ns in ("a", "b")}

    assert held() == {"a": 12, "b": 4}
    victims = 0
    for _ in range(3):  # a pass, and the round that gives the freed GPUs out
        victims += reclaim.run()["victims"]
        allocate_round()
    assert held() == {"a": 8, "b": 8} and victims == 4, (held(), victims)
    assert reclaim.run()["victims"] == 0


def test_a_claim_whose_victims_were_just_requeued_preempts_nobody_else(admin_client, h100_fleet):
    """A pass first requeues the victims whose deadline passed, then looks at the claims waiting for room:
    the claims those victims were noticed for are still Pending (the round that places them comes after the
    pass). They fit now, so no further victim may be chosen for them (found by the preemption chaos,
    tests/chaos: 6 victims for 4 devices, and a second claim preempted for one urgent claim)."""
    team_b_reclaims_from_team_a(admin_client, grace=30)
    assert reclaim.run()["victims"] == 4
    due = list(Preemption.objects.values_list("id", flat=True)[:2])
    Preemption.objects.filter(id__in=due).update(deadline=Preemption.objects.first().created_at)
    out = reclaim.run()
    assert (out["requeued"], out["victims"]) == (2, 0), out
    assert Preemption.objects.count() == 4


def test_a_claim_within_nominal_is_not_starved_by_a_borrowing_queues_head(admin_client, h100_fleet):
    """team-a borrows 2 of team-b's nominal and its head, a 2-GPU claim, holds the node with the one free GPU;
    team-b's next claim (6 of its nominal 8) must get a GPU: a borrowing queue's head does not keep its node from
    a claim within its queue's nominal, so it gets the free one in its first round (it waited HeldForQueueHead
    for ever, the GPU idle: in the chaos, 4 borrowed GPUs kept from team-b's burst of its nominal for the whole
    run)."""
    two_queues(admin_client, a=10, b=5)
    submit(admin_client, "a", "a-big", 2)  # no node has 2 free: team-a's head, holding the node with 1 free
    rounds(1)
    submit(admin_client, "b", "b-next", 1)
    rounds(1)
    assert ResourceClaim.objects.get(name="b-next").phase == Phase.ALLOCATED
    assert ResourceClaim.objects.get(name="a-big").phase == Phase.PENDING  # no node has 2 free


def test_a_claim_within_nominal_reclaims_behind_twenty_older_claims_that_may_not(admin_client, h100_fleet):
    """team-a (nominal 8, borrowing 8) holds 12 and has 20 older claims waiting for room, none of which may
    preempt anyone (equal priority, its queue borrows); team-b's claim (5 of its nominal 8) must reclaim one
    of team-a's 4 borrowed GPUs. The pass takes waiting claims per queue, in turns between queues: it reaches
    it (it looked at the fleet's 20 oldest only; in the chaos, a burst of team-b's nominal stayed stuck with 10
    borrowed GPUs unreclaimed for the rest of the run)."""
    two_queues(admin_client, a=12, b=4, a_borrowing=8)
    for i in range(20):
        submit(admin_client, "a", f"wait{i}")
    submit(admin_client, "b", "b-next")
    rounds(2)
    assert ResourceClaim.objects.get(name="b-next").reason == "Unsatisfiable"
    assert ResourceClaim.objects.filter(namespace__name="a", reason="Unsatisfiable").count() == 20
    assert reclaim.run()["victims"] == 1


def test_overlapping_passes_give_a_claim_its_victims_once(admin_client, h100_fleet):
    two_queues(admin_client, a=12, b=5, grace=30)
    waiting = ResourceClaim.objects.select_related("namespace").get(name="b4")
    assert waiting.reason == "Unsatisfiable"
    assert reclaim.run()["victims"] == 1  # the first pass marks b4's victim
    # The overlapping pass read the claims with a pending notice before that: it decides for b4 again.
    tree = preemption.Tree.load()
    second = preemption.choose_victims(waiting, tree, {}, {})
    assert second and second[0].id not in set(Preemption.objects.values_list("victim_id", flat=True))
    assert preemption.mark(waiting, second, tree) == 0  # b4 has its victim: no second one


def test_a_release_by_another_worker_during_a_pass_leaves_the_engine_right(admin_client, h100_fleet, monkeypatch):
    """A pass keeps running preemptors placed in the worker's engine on their victims' devices until it ends.
    Another worker requeues one of those victims meanwhile (its device is free in the database). The pass's
    engine must not take that release in before it puts things back: taken in, the put-back gave the victim its
    device again, and the worker's engine saw a free GPU in use for as long as it lived (the queue scenarios'
    fair share: 15 of 16 GPUs in use for good, claims of both queues waiting). After the pass, the preemptor
    whose victim went is placed on the freed GPU by the next round."""
    team_b_reclaims_from_team_a(admin_client, grace=30)
    assert reclaim.run(limit=3)["victims"] == 3  # b7 has no notice yet: the next pass decides for it
    first = Preemption.objects.select_related("victim", "preemptor").order_by("id").first()
    place_running = reclaim.recheck.place_running

    def then_another_worker_requeues(kept, *args, **kwargs):
        placed = place_running(kept, *args, **kwargs)
        with transaction.atomic():
            victim = ResourceClaim.objects.select_for_update().get(id=first.victim_id)
            claim_preemption.requeue([victim], "requeued by another worker", timezone.now())
        return placed

    monkeypatch.setattr(reclaim.recheck, "place_running", then_another_worker_requeues)
    out = reclaim.run(limit=3)
    assert out["victims"] == 1, out  # b7's
    monkeypatch.undo()
    assert not DeviceAllocation.objects.filter(claim_id=first.victim_id).exists()
    wake.wake_claims([first.preemptor_id])
    allocate_round(batch_size=1)  # the oldest eligible: the requeued victim, held off for its preemptor or not
    rounds(1)
    placed = ResourceClaim.objects.filter(phase=Phase.ALLOCATED).count()
    assert placed == 16, f"{placed} of 16 GPUs in use after the round: the engine saw a free one as used"


def test_charges_live_exactly_as_long_as_allocations_through_releases_deletes_and_requeues(admin_client,
                                                                                          h100_fleet):
    """Two queues competing: team-a borrows, team-b reclaims (4 victims requeued), team-a releases two and
    deletes one. After each step the charge rows are exactly those of allocated claims, and queue usage, read
    from the charges alone (no read of the claims), equals what the allocated claims hold."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from claims.services import claims as claim_services
    from queues.models import Queue, QuotaCharge
    from queues.services import usage

    def check() -> None:
        allocated = set(ResourceClaim.objects.filter(phase=Phase.ALLOCATED).values_list("id", flat=True))
        assert set(QuotaCharge.objects.values_list("claim_id", flat=True)) == allocated
        with CaptureQueriesContext(connection) as queries:
            used = usage.load()
        assert not [q for q in queries if "claims_resourceclaim" in q["sql"]], queries.captured_queries
        by_queue: dict[str, int] = {}
        for (queue_id, _, unit, _, _), amount in used.items():
            if unit == "devices":
                name = Queue.objects.get(id=queue_id).name
                by_queue[name] = by_queue.get(name, 0) + int(amount)
        held = {q: DeviceAllocation.objects.filter(claim__phase=Phase.ALLOCATED, claim__namespace__name=n).count()
                for q, n in (("team-a", "a"), ("team-b", "b"))}
        assert {q: by_queue.get(q, 0) for q in held} == held, (by_queue, held)

    team_b_reclaims_from_team_a(admin_client, grace=0)
    check()
    victims = 0
    for _ in range(3):  # grace 0: the victims are requeued, their charges end with their devices
        victims += reclaim.run()["victims"]
        check()
        allocate_round()
        check()
    assert victims == 4 and ResourceClaim.objects.filter(namespace__name="b", phase=Phase.ALLOCATED).count() == 8
    a_claims = list(ResourceClaim.objects.filter(namespace__name="a", phase=Phase.ALLOCATED).order_by("id"))
    claim_services.release_claim(a_claims[0].id)
    claim_services.release_claim(a_claims[1].id)
    claim_services.delete_claim(a_claims[2].id)
    check()
    assert QuotaCharge.objects.count() == ResourceClaim.objects.filter(phase=Phase.ALLOCATED).count() == 13, \
        "16 GPUs held, 3 given back by team-a"
