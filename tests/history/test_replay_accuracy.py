"""Replay accuracy (issue 39, "Done when" 1): three queues recorded through the API and the scheduler's round,
replayed with the live configuration, reproduce each queue's share of device-hours; the what-if (queue a's
weight raised, b's lowered) gives a a larger share than the same trace replayed as it was.

In ``make test`` a 45-second recording (about 300 claims) within ``TOLERANCE``, wider than the issue's 3 pp: so
short a run moves a queue's share by a few points from one recording to the next. The issue's 3 pp is the long
tier's (a ten-minute recording) and ``benchmarks/replay_bench.py``'s."""
from __future__ import annotations

import pytest

from benchmarks._replay_world import Shape, make_queues, record, shares
from scheduler.services.allocation import allocate_round
from tests.claims.fleet import load_fleet

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

SHAPE = Shape(seconds=45.0, sizes=(1, 2), hold=(1.0, 3.0))
TOLERANCE = 0.08


def replay(client, commits, window, configuration=None) -> dict:
    body = {"window": {"start": window[0].isoformat(), "end": window[1].isoformat()}}
    if configuration:
        body["configuration"] = configuration
    with commits(execute=True):  # after the commit, with no broker and no runner: the replay runs inline
        resp = client.post("/api/v1/replays", body, format="json")
    assert resp.status_code == 202, resp.content
    name = resp.json()["metadata"]["name"]
    assert resp["Location"] == f"/api/v1/replays/{name}"
    got = client.get(f"/api/v1/replays/{name}").json()  # no broker: it ran inline
    assert got["status"]["state"] == "Succeeded", got["status"]
    return got["status"]["results"]


def test_a_recorded_run_replays_its_shares_and_a_what_if_differs(admin_client, django_capture_on_commit_callbacks):
    check(admin_client, django_capture_on_commit_callbacks, SHAPE, TOLERANCE)


@pytest.mark.long
def test_a_ten_minute_run_replays_within_3_pp(admin_client, django_capture_on_commit_callbacks):
    check(admin_client, django_capture_on_commit_callbacks, Shape(seconds=600.0, sizes=(1, 2), hold=(1.0, 3.0)), 0.03)


def check(admin_client, commits, shape: Shape, tolerance: float) -> None:
    load_fleet({"c1": [("h100", 2)]})
    make_queues(admin_client, shape)
    window = record(admin_client, shape, allocate_round)
    live = replay(admin_client, commits, window)
    actual, replayed = shares(live, "actual"), shares(live, "replayed")
    print("actual", actual, "replayed", replayed)
    assert set(actual) == {"a", "b", "c"}
    for q in actual:
        assert abs(actual[q] - replayed[q]) <= tolerance, (q, actual, replayed)
    # Queue b's weight (2) was the largest: in the what-if a gets 4 and b 1, so a's share grows.
    what_if = replay(admin_client, commits, window, {"queues": [{"name": "a", "spec": {"weight": 4}},
                                                        {"name": "b", "spec": {"weight": 1}}]})
    changed = shares(what_if, "replayed")
    print("what-if", changed)
    # The direction, not a size: how far a moves depends on how contended the 45-second recording was, which a
    # loaded or slow machine changes (within nominal quotas weights decide nothing). A replay that ignored the
    # configuration gives the same shares again (it is deterministic), and fails here. a gains, and gains on b:
    # b's own share may still move up a little when c, not b, gave up what a took (seen on a slow machine).
    assert changed["a"] > replayed["a"], (changed, replayed)
    assert changed["a"] - changed["b"] > replayed["a"] - replayed["b"], (changed, replayed)
    assert what_if["configurations"][0]["queues"]["a"]["weight"] == 4
