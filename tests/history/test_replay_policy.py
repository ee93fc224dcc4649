"""Replays and policy over time (issue 39, "Done when" 2 and 3): decayed usage ranks queues in a replay as the
half-life says, and a replay uses the queue weights in force at each moment (the audit trail's before/after).
Also the door: admins only, bad bodies are 400/422 naming the field."""
from __future__ import annotations

import math
import time
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from claims.models import ClaimHistory
from draservice.models import AuditEvent
from tests.claims.fleet import gpu_claim, load_fleet
from tests.queues.conftest import queue_body
from usage.models import UsageInterval

pytestmark = pytest.mark.django_db

REPLAYS = "/api/v1/replays"
DAY, HOUR = 86400, 3600


def run_replay(client, commits, start, end, configuration=None) -> dict:
    body: dict = {"window": {"start": start.isoformat(), "end": end.isoformat()}}
    if configuration:
        body["configuration"] = configuration
    with commits(execute=True):  # no broker, no runner: it runs after the commit, inline
        resp = client.post(REPLAYS, body, format="json")
    assert resp.status_code == 202, resp.content
    got = client.get(f"{REPLAYS}/{resp.json()['metadata']['name']}").json()
    assert got["status"]["state"] == "Succeeded", got["status"]
    return got["status"]["results"]


def a_day_of_queue_a(t0) -> None:
    """Queue a's claim held all 8 GPUs of the fleet for a day from ``t0``, as the history and the ledger keep it
    (the claim itself is long gone); queue b used nothing."""
    uid = uuid.uuid4()
    spec = gpu_claim("burst", 8)["spec"]
    ClaimHistory.objects.create(claim_uid=uid, namespace="team-a", claim_name="burst", labels={}, spec=spec,
                                created_at=t0)
    UsageInterval.objects.bulk_create([
        UsageInterval(claim_id=1, claim_uid=uid, claim_name="burst", namespace="team-a", queue="a", cluster="c1",
                      node="node-0", driver="gpu.nvidia.com", pool="node-0", device=f"gpu-{i}", sharing="exclusive",
                      weight=1, started_at=t0, ended_at=t0 + timedelta(days=1)) for i in range(8)])


def sample(results: dict, hours: float, start) -> dict:
    """The fair-share sample at ``hours`` after the window's start."""
    wanted = (start + timedelta(hours=hours)).strftime("%Y-%m-%dT%H:%M:%SZ")
    (found,) = [s["queues"] for s in results["fairShare"] if s["time"] == wanted]
    return found


def test_decayed_usage_ranks_queues_as_the_half_life_says(admin_client, django_capture_on_commit_callbacks):
    load_fleet({"c1": [("h100", 1)]})
    for name in ("a", "b"):
        body = queue_body(name, namespaces=[f"team-{name}"], gpus=0, fairSharing={"halfLifeSeconds": DAY})
        assert admin_client.post("/api/v1/queues", body, format="json").status_code == 201
    start = timezone.now().replace(microsecond=0) - timedelta(days=3)
    # The queues existed before the window (a replay replays the configuration of the time: a queue created
    # since would not be there).
    AuditEvent.objects.filter(kind="Queue").update(at=start - timedelta(days=1))
    a_day_of_queue_a(start)
    end = start + timedelta(days=2)

    def with_half_life(seconds: int) -> dict:
        patch = [{"name": q, "spec": {"fairSharing": {"halfLifeSeconds": seconds}}} for q in ("a", "b")]
        return run_replay(admin_client, django_capture_on_commit_callbacks, start, end, {"queues": patch})

    day = with_half_life(DAY)
    assert day["queues"][0]["name"] == "a" and day["queues"][0]["replayed"]["deviceHours"] == pytest.approx(8 * 24)
    during = sample(day, 12, start)
    assert during["b"]["rank"] < during["a"]["rank"]
    after = sample(day, 26, start)  # two hours after the burst: a's past use still counts, b ranks ahead
    assert after["b"]["rank"] < after["a"]["rank"]
    assert after["a"]["decayedUsage"] == pytest.approx(8 * DAY * 2 ** (-2 * HOUR / DAY), rel=1e-6)
    # Nothing runs and neither has a nominal: C is its floor, 1 device, and a's history (8 x 2^(-1/12) x ln 2 =
    # 5.2 times the scale) is clamped to 1.
    assert after["a"]["effectiveShare"] == pytest.approx(0.5, rel=1e-6)

    hour = with_half_life(HOUR)
    later = sample(hour, 48, start)  # 24 h after the burst: 24 half-lives
    assert later["a"]["decayedUsage"] == pytest.approx(8 * DAY * 2 ** (-24), rel=1e-6)
    two_hours = sample(hour, 26, start)  # two hours after, a still ranks behind
    assert two_hours["b"]["rank"] < two_hours["a"]["rank"]

    none = with_half_life(0)
    # Today's order: the current borrowed share only, so once a is idle the two are equal (rank by name).
    assert {q: s["effectiveShare"] for q, s in sample(none, 26, start).items() if q in "ab"} == {"a": 0, "b": 0}
    assert sample(none, 26, start)["a"]["decayedUsage"] is None
    during = sample(none, 12, start)  # while a borrows the fleet, b ranks first
    assert during["b"]["rank"] < during["a"]["rank"]
    idle = sample(none, 26, start)
    assert idle["a"]["rank"] < idle["b"]["rank"]  # equal shares: by name, as today


def test_a_one_hour_half_life_forgets_a_burst_within_a_day(admin_client, django_capture_on_commit_callbacks):
    load_fleet({"c1": [("h100", 1)]})
    for name in ("a", "b"):
        body = queue_body(name, namespaces=[f"team-{name}"], gpus=0, fairSharing={"halfLifeSeconds": HOUR})
        assert admin_client.post("/api/v1/queues", body, format="json").status_code == 201
    start = timezone.now().replace(microsecond=0) - timedelta(days=3)
    AuditEvent.objects.filter(kind="Queue").update(at=start - timedelta(days=1))
    a_day_of_queue_a(start)
    later = sample(run_replay(admin_client, django_capture_on_commit_callbacks, start, start + timedelta(days=2)),
                   48, start)
    assert abs(later["a"]["effectiveShare"] - later["b"]["effectiveShare"]) <= 0.01  # the "equal (±1 %)"
    # 24 half-lives after the burst, against C = 1 device (nothing runs, no nominal): U ln 2 / (C h) of it, half.
    assert later["a"]["effectiveShare"] == pytest.approx(0.5 * 8 * DAY * 2 ** -24 * math.log(2) / HOUR, rel=1e-6)
    assert later["b"]["effectiveShare"] == 0


def test_a_replay_uses_the_weight_in_force_at_each_moment(admin_client, ns_client,
                                                          django_capture_on_commit_callbacks):
    load_fleet({"c1": [("h100", 1)]})
    assert admin_client.post("/api/v1/queues", queue_body("a", namespaces=["team-a"]), format="json").status_code \
        == 201
    price = admin_client.post("/api/v1/prices", {"product": "H100", "currency": "EUR", "pricePerDeviceHour": "2.5"},
                              format="json")
    first_event = AuditEvent.objects.order_by("-id").first().id
    start = timezone.now()
    time.sleep(1.2)
    assert admin_client.patch("/api/v1/queues/a", {"spec": {"weight": 2}}, format="json").status_code == 200
    first_change = timezone.now()
    time.sleep(1.2)
    end = timezone.now()
    assert admin_client.patch("/api/v1/queues/a", {"spec": {"weight": 3}}, format="json").status_code == 200
    pk = price.json()["id"]
    changed = {"product": "H100", "currency": "EUR", "pricePerDeviceHour": "3"}
    assert admin_client.put(f"/api/v1/prices/{pk}", changed, format="json").status_code == 200
    events = [(e["actor"]["name"], e["object"]["kind"], e["changes"])
              for e in admin_client.get("/api/v1/auditevents").json()["items"] if int(e["id"]) > first_event]
    assert events == [
        ("token:test admin", "Queue", [{"path": "spec.weight", "before": 1, "after": 2}]),
        ("token:test admin", "Queue", [{"path": "spec.weight", "before": 2, "after": 3}]),
        ("token:test admin", "Price", [{"path": "spec.pricePerDeviceHour", "before": "2.5", "after": "3"}])]

    results = run_replay(admin_client, django_capture_on_commit_callbacks, start, end)
    # Across the first change only: weight 1 before it, 2 after; the second change (3) came after the window.
    assert [c["queues"]["a"]["weight"] for c in results["configurations"]] == [1, 2]
    moment = AuditEvent.objects.get(id=first_event + 1).at
    assert results["configurations"][1]["from"] == (moment).strftime("%Y-%m-%dT%H:%M:%SZ")
    weights = [(s["time"], s["queues"]["a"]["weight"]) for s in results["fairShare"]]
    stamp = first_change.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert {w for t, w in weights if t < moment.strftime("%Y-%m-%dT%H:%M:%SZ")} == {1}, weights
    assert {w for t, w in weights if t > stamp} <= {2} and weights[-1][1] == 2, weights
    # Today the weight is 3: a replay of the same window with an override uses the override throughout.
    overridden = run_replay(admin_client, django_capture_on_commit_callbacks, start, end,
                            {"queues": [{"name": "a", "spec": {"weight": 5}}]})
    assert [c["queues"]["a"]["weight"] for c in overridden["configurations"]] == [5, 5]

    # The door: namespace tokens may not read or start replays; bad bodies name the field.
    assert ns_client("team-a").get(REPLAYS).status_code == 403
    assert ns_client("team-a").post(REPLAYS, {}, format="json").status_code == 403
    bad = admin_client.post(REPLAYS, {"window": {"start": "yesterday", "end": end.isoformat()},
                                      "configuration": {"queues": [{"name": "a", "spec": {"weight": -1}}]}},
                            format="json")
    assert bad.status_code == 422, bad.content
    fields = {e["field"] for e in bad.json()["errors"]}
    assert fields == {"window.start", "configuration.queues[0].spec.weight"}, bad.json()
    assert admin_client.get(f"{REPLAYS}/nope").status_code == 404
    assert len(admin_client.get(REPLAYS).json()["items"]) == 2
