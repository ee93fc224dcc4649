"""Fair share that remembers: a queue's past use (the usage ledger, decayed by spec.fairSharing.halfLifeSeconds)
ranks it behind a queue that used nothing; with a half-life of 0 the order is today's. Also: the (U, t) row
kept by the ledger's close, validation of the field, and the queue status at both doors."""
from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from claims.models import Phase, ResourceClaim
from claims.services import claims as claim_services
from tests.queues.conftest import queue_body
from tests.queues.test_admission import make, rounds, submit
from usage.models import DecayedUsage, DecayedUsageDelta, UsageInterval
from usage.services import decay

pytestmark = pytest.mark.django_db

DAY = 86400


def past_use(queue: str, devices: int, start, end) -> None:
    """Ledger rows of a claim long gone: ``devices`` whole GPUs of ``queue`` from ``start`` to ``end``."""
    uid = uuid.uuid4()
    UsageInterval.objects.bulk_create([UsageInterval(
        claim_id=10**9, claim_uid=uid, claim_name="old", namespace="a", queue=queue, cluster="c1", node="n",
        driver="gpu.nvidia.com", pool="p", device=f"gpu-{i}", product="H100", sharing="exclusive", weight=1,
        started_at=start, ended_at=end) for i in range(devices)])


@pytest.mark.parametrize("half_life, first", [(DAY, "b"), (0, "a")])
def test_a_queue_that_used_the_fleet_waits_behind_one_that_did_not(admin_client, h100_fleet, half_life, first):
    now = timezone.now()
    past_use("team-a", 16, now - timedelta(days=2), now - timedelta(days=1))  # the whole fleet, for a day
    fair = {"fairSharing": {"halfLifeSeconds": half_life}, "gpus": 0}  # both borrow all they use
    make(admin_client, queue_body("team-a", namespaces=["a"], **fair), queue_body("team-b", namespaces=["b"], **fair))
    submit(admin_client, "c", "fill0", 8)
    submit(admin_client, "c", "fill1", 8)
    rounds(1)
    assert set(ResourceClaim.objects.filter(phase=Phase.ALLOCATED).values_list("name", flat=True)) == {"fill0",
                                                                                                        "fill1"}
    submit(admin_client, "a", "wants-a", 8)  # older than B's: within one queue age decides, not between queues
    submit(admin_client, "b", "wants-b", 8)
    rounds(1)
    assert not ResourceClaim.objects.filter(name__startswith="wants", phase=Phase.ALLOCATED).exists()
    claim_services.release_claim(ResourceClaim.objects.get(name="fill0").id)  # room for one of them
    rounds(1)
    allocated = set(ResourceClaim.objects.filter(name__startswith="wants", phase=Phase.ALLOCATED)
                    .values_list("name", flat=True))
    assert allocated == {f"wants-{first}"}
    status = {q: admin_client.get(f"/api/v1/queues/team-{q}").json()["status"]["fairSharing"] for q in "ab"}
    if half_life:
        # 16 devices x 1 day, closed a day (one half-life) ago: 384 device-hours / 2, then decayed since. When
        # the round chose, 8 GPUs ran (fill1) and nobody had a nominal: C = 8, a's history 192 ln 2 / (8 x 24)
        # = 0.69, E = 0.35 against b's 0. Now b borrows 8 of the 16 running (E = 0.5 x 0.5 = 0.25) and a's
        # history is 192 ln 2 / (16 x 24) = 0.35 (E = 0.17): a ranks first.
        assert status["a"]["decayedUsage"] == pytest.approx(192, rel=1e-3)
        assert status["b"]["decayedUsage"] == 0
        assert (status["a"]["rank"], status["b"]["rank"]) == (1, 2)
    else:
        assert status["a"]["decayedUsage"] == status["b"]["decayedUsage"] == 0
        assert not DecayedUsage.objects.exists()
    k8s = admin_client.get("/k8s/apis/draservice.io/v1alpha1/queues/team-a").json()["status"]["fairSharing"]
    assert k8s["rank"] == status["a"]["rank"]


def test_the_row_follows_the_ledger_close(admin_client, h100_fleet):
    make(admin_client, queue_body("team-b", namespaces=["b"], gpus=0, fairSharing={"halfLifeSeconds": 3600}))
    row = DecayedUsage.objects.get(queue="team-b")
    assert (row.value, row.half_life_seconds) == (0.0, 3600.0)
    submit(admin_client, "b", "job", 2)
    rounds(1)
    claim_services.release_claim(ResourceClaim.objects.get(name="job").id)
    closed = list(UsageInterval.objects.filter(queue="team-b"))
    assert len(closed) == 2 and all(i.ended_at for i in closed)
    held = sum(float(i.weight) * (i.ended_at - i.started_at).total_seconds() for i in closed)
    # The release inserted a delta and left the row alone (no release waits on another for it); a read adds it.
    delta = DecayedUsageDelta.objects.get()
    assert (delta.queue, delta.at) == ("team-b", closed[0].ended_at)
    assert delta.value == pytest.approx(held, rel=1e-9, abs=1e-9)
    assert DecayedUsage.objects.get(queue="team-b").value == 0.0
    assert decay.read(closed[0].ended_at)["team-b"] == pytest.approx(held, rel=1e-9, abs=1e-9)
    later = closed[0].ended_at + timedelta(hours=1)  # one half-life
    assert decay.read(later)["team-b"] == pytest.approx(held / 2, rel=1e-9, abs=1e-9)
    # The fold moves it into the row, decayed to the fold: the figure read does not change.
    assert decay.fold(later) == 1 and not DecayedUsageDelta.objects.exists()
    row.refresh_from_db()
    assert row.at == later and row.value == pytest.approx(held / 2, rel=1e-9, abs=1e-9)
    assert decay.read(later)["team-b"] == pytest.approx(held / 2, rel=1e-9, abs=1e-9)
    # Half-life back to 0: the row goes; set again: computed afresh from the ledger.
    assert admin_client.patch("/api/v1/queues/team-b", {"spec": {"fairSharing": {"halfLifeSeconds": 0}}},
                              format="json").status_code == 200
    assert not DecayedUsage.objects.exists()
    assert admin_client.patch("/api/v1/queues/team-b", {"spec": {"fairSharing": {"halfLifeSeconds": 7200}}},
                              format="json").status_code == 200
    # Decayed to now: a second of a loaded machine between the release and this read is 1e-4 of it at 7200 s.
    assert DecayedUsage.objects.get(queue="team-b").value == pytest.approx(held, rel=1e-3)
    # A delta the fold had not yet moved when the half-life changed is in the ledger read: dropped, not counted
    # twice.
    submit(admin_client, "b", "job2", 1)
    rounds(1)
    claim_services.release_claim(ResourceClaim.objects.get(name="job2").id)
    assert DecayedUsageDelta.objects.count() == 1
    assert admin_client.patch("/api/v1/queues/team-b", {"spec": {"fairSharing": {"halfLifeSeconds": 3600}}},
                              format="json").status_code == 200
    assert not DecayedUsageDelta.objects.exists()
    every = sum(float(i.weight) * (i.ended_at - i.started_at).total_seconds()
                for i in UsageInterval.objects.filter(queue="team-b"))
    assert DecayedUsage.objects.get(queue="team-b").value == pytest.approx(every, rel=1e-3)


@pytest.mark.parametrize("value", [-1, 1.5, "1h", True, 10**9])
def test_half_life_is_validated(admin_client, value):
    resp = admin_client.post("/api/v1/queues", queue_body("q", fairSharing={"halfLifeSeconds": value}), format="json")
    assert resp.status_code == 422 and [e["field"] for e in resp.json()["errors"]] == [
        "spec.fairSharing.halfLifeSeconds"]
    other = admin_client.post("/api/v1/queues", queue_body("q", fairSharing={"decay": 1}), format="json")
    assert other.status_code == 422 and [e["field"] for e in other.json()["errors"]] == ["spec.fairSharing.decay"]



def test_the_fold_runs_on_the_notify_queue_every_few_seconds(settings):
    from draservice import beat
    from usage.schedule import FOLD_SECONDS

    entry = beat.collect()["usage-fold-decay"]
    assert entry["task"] == "usage.tasks.fold_decay" and entry["options"]["queue"] == settings.NOTIFY_QUEUE
    assert entry["schedule"].total_seconds() == FOLD_SECONDS <= 10
